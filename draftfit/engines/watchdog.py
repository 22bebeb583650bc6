"""A watchdog that ends the engine processes draftfit started when draftfit itself ends, however it ends.

vLLM's engine core and workers are children of draftfit. A clean exit or Ctrl-C shuts them down
through the engine's close, but after ``kill -9`` (or an OOM kill) nothing runs in draftfit to do
it, and vLLM 0.32's engine core does not notice its client's death for tens of seconds. So the
first engine start launches this small process in a session of its own (a terminal's Ctrl-C does
not reach it). It holds the read end of a pipe whose write end only draftfit has; it notes
draftfit's descendants twice a second, and when the pipe closes (draftfit is gone) it sends SIGTERM
to draftfit's own children — vLLM's engine core then stops its workers and frees its shared
memory — and SIGKILL to any noted process still alive after ``GRACE_S``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

POLL_S = 0.5
GRACE_S = 3.0
MODULE = "draftfit.engines.watchdog"

_started: subprocess.Popen | None = None


def ensure_watchdog() -> None:
    """Start the watchdog for this process once (a no-op when it runs already)."""
    global _started
    if _started is not None and _started.poll() is None:
        return
    _started = subprocess.Popen(
        [sys.executable, "-m", MODULE, str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )


def is_watchdog(cmdline: list[str]) -> bool:
    return MODULE in cmdline


def is_resource_tracker(cmdline: list[str]) -> bool:
    """multiprocessing's resource tracker: it exits by itself and unlinks what its users left."""
    return any("resource_tracker" in part for part in cmdline)


@dataclass(frozen=True)
class Noted:
    created: float
    direct: bool  # a child of draftfit itself (an engine core), not one of its workers


def _descendants(pid: int) -> dict[int, Noted]:
    """draftfit's descendants, less multiprocessing's resource trackers: a tracker exits by itself
    once every process using it is gone, and unlinks the shared memory they left — killing it
    would leak that memory."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    found = {}
    for child in children:
        try:
            if is_resource_tracker(child.cmdline()):
                continue
            found[child.pid] = Noted(child.create_time(), child.ppid() == pid)
        except psutil.Error:
            continue
    return found


def _end(known: dict[int, Noted]) -> None:
    """SIGTERM to draftfit's own children (vLLM's engine core then stops its workers and frees
    their shared memory), then SIGKILL after the grace to every noted process still alive."""
    import psutil

    procs = []
    for pid, noted in known.items():
        try:
            proc = psutil.Process(pid)
            # the same process, not a new one with a reused pid (create times read apart may differ by a tick)
            if abs(proc.create_time() - noted.created) < 1.0 and pid != os.getpid():
                procs.append((proc, noted))
        except psutil.Error:
            continue
    for proc, noted in procs:
        if noted.direct:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
    _, alive = psutil.wait_procs([proc for proc, _ in procs], timeout=GRACE_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


def watch(parent: int, pipe=None) -> None:
    """Note ``parent``'s descendants until ``pipe`` (stdin) reaches end of file, then end them."""
    pipe = pipe if pipe is not None else sys.stdin.buffer
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe's end ends the watch
    known: dict[int, Noted] = {}
    while True:
        known.update(_descendants(parent))
        known.pop(os.getpid(), None)
        ready, _, _ = select.select([pipe], [], [], POLL_S)
        if ready and not os.read(pipe.fileno(), 4096):
            break
    _end(known)


if __name__ == "__main__":
    watch(int(sys.argv[1]))


# ---- Ctrl-C that reaches a main thread blocked in C ------------------------------------------

RELAY_AFTER_S = 2.0
_handled = threading.Event()


def interrupt_handled() -> None:
    """The CLI caught the KeyboardInterrupt: stop relaying it."""
    _handled.set()


def relay_interrupts() -> None:
    """Make sure a Ctrl-C ends draftfit within seconds, wherever the main thread waits.

    A terminal's SIGINT reaches vLLM's engine processes too; one that dies while it starts never
    reports ready, and vLLM's client then waits for it in a C-level poll (up to
    ``VLLM_ENGINE_READY_TIMEOUT_S``) where the KeyboardInterrupt may never be raised. Python writes
    each signal's number to its wakeup fd from the C handler; this thread reads it, and if the CLI
    has not handled the interrupt ``RELAY_AFTER_S`` later, it ends the engine processes and sends
    SIGINT to the main thread itself, which interrupts the wait.
    """
    import socket

    reader, writer = socket.socketpair()
    reader.setblocking(True)
    writer.setblocking(False)
    try:
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread (an embedding program): leave Ctrl-C to it
        return
    main = threading.main_thread().ident

    def relay() -> None:
        while True:
            data = reader.recv(64)
            if not data:
                return
            if signal.SIGINT not in data or _handled.is_set():
                continue
            for _ in range(5):
                if _handled.wait(RELAY_AFTER_S):
                    break
                _end(_descendants(os.getpid()))
                signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=relay, name="draftfit-interrupt-relay", daemon=True).start()
    _keep.extend((reader, writer))


_keep: list = []  # the socket pair lives as long as the process

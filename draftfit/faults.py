"""Faults: injected ones, to prove that an interrupted run resumes, and engine failures as data.

**Injection.** ``DRAFTFIT_FAULT=<stage>[:<mode>][@<n>]`` makes the ``n``-th (default first)
:func:`fault_point` call for ``stage`` fail. Fault points sit at the boundaries of the pipeline's
stages, right after a stage's output is saved (see :data:`STAGES`), so a fault there is the worst
moment to lose a run: the work is done, the next stage has not started. Modes:

* ``raise`` (default): :class:`InjectedFault`, a ``BaseException`` like ``KeyboardInterrupt``, so
  no ``except Exception`` treats it as a handled failure; ``finally`` blocks still close engines.
* ``kill``: SIGKILL to the engine processes this process started, then to itself — what
  ``kill -9`` of the process group does: no ``finally``, no clean-up, nothing flushed. Spared are
  multiprocessing's resource trackers (a tracker unlinks the shared memory the killed engine left;
  killed with it, vLLM's shared-memory segments would stay in /dev/shm until reboot) and the
  watchdog, which runs in a session of its own that a group's kill does not reach.
* ``error``: :class:`InjectedError`, an ordinary ``RuntimeError``, as a failing engine raises;
  the run handles it like a real failure (e.g. ``engine``: a draft whose engine does not start).

Unset, a fault point costs one environment lookup.

**Engine failures.** :func:`engine_failure` turns an engine's exception into the entry `rank`
records in ``results.failed``: the engine's first meaningful line and the knobs that change the
outcome (gpu_memory_utilization, max_model_len, concurrency, draft dtype) with their values.
"""

from __future__ import annotations

import os
import re
import signal
from typing import Any

ENV = "DRAFTFIT_FAULT"
MODES = ("raise", "kill", "error")
# stage -> where its fault point is (each fires after the stage's output is saved)
STAGES = {
    "derive": "draftfit.derive.first_layers: derived draft written, before its manifest",
    "engine": "draftfit.pipeline.EngineSession.get: before an engine is built",
    "trajectories": "draftfit.pipeline.RankRun.run: target trajectories generated or loaded",
    "profile": "draftfit.pipeline.measured_profile: a model's step profile measured or loaded",
    "scoring": "draftfit.pipeline.RankRun._score: a draft's scores computed or loaded",
    "spec_steps": "draftfit.pipeline.spec_step_timings: a candidate's speculative steps timed or loaded",
    "predict": "draftfit.pipeline.RankRun.run: predictions made, nothing written yet",
    "results": "draftfit.pipeline.RankRun.run: results.json and results.csv written, no report yet",
    "report": "draftfit.pipeline.RankRun.run: report.html written",
    "verify-group": "draftfit.verify.run.VerifyRun.run: one group (its baseline and configurations) measured and saved",
}
_reached: dict[str, int] = {}


class InjectedFault(BaseException):
    """An interruption injected by DRAFTFIT_FAULT (mode ``raise``)."""


class InjectedError(RuntimeError):
    """A failure injected by DRAFTFIT_FAULT (mode ``error``)."""


def parse(spec: str) -> tuple[str, str, int]:
    """``"scoring:kill@2"`` -> ``("scoring", "kill", 2)``; ValueError for anything else."""
    head, _, count = spec.strip().partition("@")
    stage, _, mode = head.partition(":")
    mode = mode or "raise"
    if stage not in STAGES or mode not in MODES or (count and not count.isdigit()) or count == "0":
        raise ValueError(
            f"{ENV}={spec!r}: expected <stage>[:<mode>][@<n>] with stage one of {', '.join(STAGES)} "
            f"and mode one of {', '.join(MODES)}"
        )
    return stage, mode, int(count or 1)


def fault_point(stage: str) -> None:
    """Fail here if DRAFTFIT_FAULT names this stage (and this is the occurrence it names)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    wanted, mode, nth = parse(spec)
    if stage != wanted:
        return
    _reached[stage] = _reached.get(stage, 0) + 1
    if _reached[stage] != nth:
        return
    message = f"fault injected at stage {stage!r} ({ENV}={spec})"
    if mode == "kill":
        _kill_process_tree()
    if mode == "error":
        raise InjectedError(message)
    raise InjectedFault(message)


def reset() -> None:
    """Forget how often each fault point was reached (for several runs in one process)."""
    _reached.clear()


def _kill_process_tree() -> None:
    from draftfit.engines.watchdog import is_resource_tracker, is_watchdog

    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001 - without psutil only this process is killed
        children = []
    for child in children:
        try:
            cmdline = child.cmdline()
            if not (is_resource_tracker(cmdline) or is_watchdog(cmdline)):
                child.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
    os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# engine failures, recorded as data

_GENERIC = (
    "engine core initialization failed",
    "see root cause above",
    "see stack trace",
    "traceback (most recent call last)",
    "the above exception was the direct cause",
    "validation error for",
)
MESSAGE_CHARS = 240
_OOM = ("out of memory", "outofmemory", "no available memory", "cannot allocate", "memoryerror", "insufficient memory",
        "kv cache", "cache blocks")


def engine_message(exc: BaseException) -> str:
    """The first meaningful line of an engine's error: the innermost cause that says something."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    for error in reversed(chain):  # the root cause first
        for line in str(error).splitlines():
            text = _shorten(" ".join(line.split()))
            if text and not any(generic in text.lower() for generic in _GENERIC):
                return f"{type(error).__name__}: {text}" if error is not exc else text
    return type(exc).__name__


def _shorten(text: str, limit: int = MESSAGE_CHARS) -> str:
    """One line without pydantic's wrapping, cut after the last whole sentence within ``limit``."""
    text = re.sub(r"\s*\[type=[^\]]*\]?.*$", "", re.sub(r"^Value error, ", "", text))
    if len(text) <= limit:
        return text
    end = text.rfind(". ", 0, limit)
    return text[: end + 1] if end > 0 else text[:limit].rstrip() + "…"


def engine_failure(exc: BaseException, *, candidate: str, draft: str, stage: str,
                   gpu_memory_utilization: float, max_model_len: int, concurrency: list[int], dtype: str) -> dict[str, Any]:
    """The ``results.failed`` entry for a draft whose engine failed to start, ran out of memory or died."""
    message = engine_message(exc)
    if isinstance(exc, InjectedError):
        kind = "injected"
    elif isinstance(exc, MemoryError) or any(word in message.lower() for word in _OOM) or "OutOfMemory" in type(exc).__name__:
        kind = "out of memory"
    elif stage == "engine start":
        kind = "did not start"
    else:
        kind = "died"
    knobs = {
        "gpu_memory_utilization": {"value": gpu_memory_utilization,
                                   "hint": "raise it for a bigger KV cache, lower it if the machine itself runs out of memory"},
        "max_model_len": {"value": max_model_len,
                          "hint": "lower it: fewer KV slots per sequence (it must stay within the draft's max_position_embeddings)"},
        "concurrency": {"value": max(concurrency) if concurrency else None,
                        "hint": "lower the highest level: fewer sequences need KV slots at once"},
        "draft_dtype": {"value": dtype, "hint": "a smaller dtype (bfloat16 / float16, or a quantized draft) halves the draft's weights"},
    }
    turn = "; ".join(f"{name} (now {knob['value']}): {knob['hint']}" for name, knob in knobs.items())
    return {
        "candidate": candidate, "draft": draft, "stage": stage, "kind": kind, "error": message,
        "knobs": knobs,
        "reason": f"the draft's engine {kind} during {stage}: {message}. Knobs to turn — {turn}",
    }

"""vLLM's ``AsyncLLM`` as draftfit runs it for served-style measurements (`verify`): started with
the offline engine's arguments, its processes reaped on close, its spec-decode counters read live,
and the memory of its processes sampled while it runs."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from draftfit.engines import EngineConfig
from draftfit.errors import DraftfitError
from draftfit.metrics import SpecCounts

log = logging.getLogger(__name__)

SHUTDOWN_WAIT_S = 60.0
MEMORY_SAMPLE_S = 0.2


class MemorySampler:
    """Peak RSS of this process and of the engine's processes, and device memory used (GPU), sampled in a thread."""

    def __init__(self, pids: Callable[[], set[int]], interval: float = MEMORY_SAMPLE_S):
        self._pids = pids
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_engine_rss = 0
        self.peak_total_rss = 0
        self.peak_device_used: int | None = None
        self._nvml = _nvml_handles()

    def sample(self) -> None:
        import psutil

        engine = 0
        for pid in self._pids():
            try:
                engine += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                continue
        try:
            own = psutil.Process(os.getpid()).memory_info().rss
        except psutil.Error:
            own = 0
        self.peak_engine_rss = max(self.peak_engine_rss, engine)
        self.peak_total_rss = max(self.peak_total_rss, engine + own)
        if self._nvml:
            used = _device_used(self._nvml)
            if used is not None:
                self.peak_device_used = max(self.peak_device_used or 0, used)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="draftfit-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()

    def to_dict(self) -> dict[str, Any]:
        gib = 1024.0**3
        return {
            "kind": "measured",
            "peak_engine_rss_gib": self.peak_engine_rss / gib,
            "peak_total_rss_gib": self.peak_total_rss / gib,
            "peak_device_used_gib": None if self.peak_device_used is None else self.peak_device_used / gib,
            "how": f"RSS summed over the engine's processes (and with this process: total), sampled every {self.interval:g} s"
                   + ("; device memory used on the GPUs (NVML), all processes" if self._nvml else "; no GPU"),
        }


def _nvml_handles():
    """NVML device handles when vLLM runs on an NVIDIA GPU, else None."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            return None
        from vllm.third_party import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # noqa: BLE001 - no NVML: device memory is not measured
        return None


def _device_used(handles) -> int | None:
    try:
        from vllm.third_party import pynvml

        return int(sum(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles))
    except Exception:  # noqa: BLE001
        return None


def read_counts() -> SpecCounts | None:
    """vLLM's spec-decode counters of the live engine (cumulative), or None when it reports none."""
    from vllm.v1.metrics.reader import get_metrics_snapshot

    from draftfit.metrics import counts_from_vllm_metrics

    try:
        return counts_from_vllm_metrics(get_metrics_snapshot())
    except DraftfitError:
        return None


async def settled_counts(wait_s: float = 2.0) -> SpecCounts | None:
    """Counters after the last output was processed: read until two reads agree (bounded)."""
    counts = read_counts()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        again = read_counts()
        if again == counts:
            return again
        counts = again
    return counts


def counts_delta(after: SpecCounts | None, before: SpecCounts | None) -> SpecCounts | None:
    """What a run added to the counters (None when the engine reports none)."""
    if after is None:
        return None
    return after - before if before is not None else after


def run_async(factory: Callable[[], Any]) -> None:
    """Run a coroutine to completion, also from a thread that already runs an event loop (notebooks)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(factory())
        return
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(factory())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="draftfit-async-engine")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


class AsyncVLLMEngine:
    """One model (with or without speculation) in vLLM's ``AsyncLLM``, for ``async with``.

    Started with :func:`~draftfit.engines.vllm_engine.engine_kwargs` — the arguments of the
    offline engine — and the spec-decode stats on; on exit it is shut down and every process it
    started is reaped (:class:`~draftfit.engines.vllm_engine.EngineProcesses`), whatever happened.
    A start that fails raises DraftfitError with vLLM's first line.
    """

    def __init__(self, model_dir: str | Path, options: EngineConfig, speculative_config: dict[str, Any] | None = None):
        self.model_dir = Path(model_dir)
        self.options = options
        self.speculative_config = speculative_config
        self.startup_s = 0.0
        self.shutdown_s = 0.0
        self._engine = None
        self._processes = None

    @property
    def pids(self) -> set[int]:
        """The engine's processes (engine core, workers) while it runs."""
        return set(self._processes.pids) if self._processes is not None else set()

    async def __aenter__(self) -> AsyncVLLMEngine:
        from draftfit.engines.vllm_engine import (
            EngineProcesses,
            config_options,
            engine_kwargs,
            import_vllm,
        )

        import_vllm(self.options.debug)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = engine_kwargs(self.model_dir, **config_options(self.options), speculative_config=self.speculative_config,
                               disable_log_stats=False, offline=False)
        self._processes = EngineProcesses()
        start = time.perf_counter()
        try:
            self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        except KeyboardInterrupt:
            self._processes.interrupted()
            raise
        except Exception as exc:
            self._processes.reap(SHUTDOWN_WAIT_S, started_since=True)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise DraftfitError(f"vLLM could not start ({type(exc).__name__}: {first})", where=str(self.model_dir),
                                fix="Run again with --debug for vLLM's log") from exc
        finally:
            self.startup_s = time.perf_counter() - start
        self._processes.started()
        return self

    async def __aexit__(self, *exc) -> None:
        start = time.perf_counter()
        if exc and exc[0] is not None and issubclass(exc[0], (KeyboardInterrupt, asyncio.CancelledError)):
            self._processes.interrupted()  # Ctrl-C: do not wait for vLLM's orderly shutdown
        if self._engine is not None:
            try:
                self._engine.shutdown()
            except Exception:  # noqa: BLE001 - the processes are reaped below either way
                log.debug("AsyncLLM.shutdown failed", exc_info=True)
            self._engine = None
            gc.collect()
        survivors = self._processes.reap(SHUTDOWN_WAIT_S, started_since=True) if self._processes is not None else []
        self.shutdown_s = time.perf_counter() - start
        if survivors:
            log.warning("vLLM engine processes %s did not exit", survivors)

    def generate(self, prompt_token_ids, params, request_id: str) -> AsyncIterator[Any]:
        """vLLM's streamed outputs of one request."""
        return self._engine.generate({"prompt_token_ids": list(map(int, prompt_token_ids))}, params, request_id=request_id)

    async def stream(self, plan, prompt_index: int, request_id: str, max_tokens: int | None = None):
        """The load generator's view of :meth:`generate`: per output, the tokens it carried."""
        from draftfit.engines.vllm_server import StreamChunk

        params = plan.params(prompt_index, max_tokens)
        async for out in self.generate(plan.prompts[prompt_index], params, request_id):
            completion = out.outputs[0]
            yield StreamChunk(len(completion.token_ids), str(completion.finish_reason) if out.finished else None)

    async def reset_prefix_cache(self) -> None:
        await self._engine.reset_prefix_cache()

    async def counts(self) -> SpecCounts | None:
        """The engine's cumulative spec-decode counters once they settle (None: it reports none)."""
        return await settled_counts()

    def memory(self, interval: float = MEMORY_SAMPLE_S) -> MemorySampler:
        """A sampler of the memory of this engine's processes (``with engine.memory() as m: ...``)."""
        return MemorySampler(lambda: self.pids, interval)

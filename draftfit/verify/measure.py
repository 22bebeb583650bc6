"""How verify reaches each configuration and measures it in rounds.

Three ways (``--engine``): ``serve`` (default) starts the configuration's own ``vllm serve``
command on localhost and talks to it through the OpenAI-compatible API, as users run it;
``inprocess`` runs vLLM's ``AsyncLLM`` inside draftfit; ``--server URL`` measures servers that
are already running (the user names their configurations). Rounds interleave the baseline and
the configurations of a group (A B C A B C …) with every server of the group up at once when
they fit in memory, else one server at a time, started and stopped for each round.

A method that drafts from earlier requests' responses (suffix decoding's global tree) is measured
on a fresh server every run: every round sends the same prompts, and a server that answered them
before drafts its own earlier answers (measured here: suffix k=4 at concurrency 1, AL 1.99 in the
first run against 4.45 and 4.54 in the next two, where the prediction was 1.96). A running server
(``--server``) cannot be restarted: its entries say the state was carried over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from draftfit.engines import EngineConfig
from draftfit.errors import DraftfitError
from draftfit.verify.load import RunPlan, send_load
from draftfit.verify.rounds import MachineLoad, RoundRun
from draftfit.verify.selection import BASELINE, VerifyConfig

log = logging.getLogger(__name__)
Progress = Callable[[str], None]

Mode = Literal["serve", "inprocess", "url"]
WARMUP_TOKENS = 4
# beside weights and KV: the API server (0.9 GB RSS here) and the engine worker's runtime (0.8 GB)
SERVER_OVERHEAD_BYTES = int(2.0 * 1024**3)
MEMORY_HEADROOM = 0.85  # of the memory available now


@dataclass
class ConfigRuns:
    """Everything measured of one configuration in one group: its runs, start/stop times, errors."""

    config: VerifyConfig
    runs: list[RoundRun] = field(default_factory=list)
    startup_s: list[float] = field(default_factory=list)
    shutdown_s: list[float] = field(default_factory=list)
    error: str | None = None
    serve_argv: list[str] | None = None
    url: str | None = None
    server_state: str | None = None  # "fresh every run" | "carried over" (methods with state across requests)


class _NoSampler:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "measured", "how": "not measured: the server runs outside draftfit"}


class Live:
    """One configuration while it runs: what the load generator streams to, its counters, its memory."""

    def __init__(self, target, *, pids: Callable[[], set[int]] | None = None):
        self.target = target
        self._pids = pids

    def memory(self):
        from draftfit.engines.vllm_async import MemorySampler

        return MemorySampler(self._pids) if self._pids is not None else _NoSampler()


@dataclass
class Endpoints:
    """How each configuration is reached (see the module docstring)."""

    mode: Mode
    target_dir: Path
    options: EngineConfig
    log_path: Path
    urls: dict[str | None, str] = field(default_factory=dict)  # mode "url": candidate name (None: baseline) → URL

    @contextlib.asynccontextmanager
    async def open(self, config: VerifyConfig, runs: ConfigRuns) -> AsyncIterator[Live]:
        if self.mode == "url":
            from draftfit.engines.vllm_server import ServerClient

            url = self.urls[config.candidate]
            runs.url = url
            async with ServerClient(url) as client:
                yield Live(client)
            return
        if self.mode == "inprocess":
            from draftfit.engines.vllm_async import AsyncVLLMEngine

            engine = AsyncVLLMEngine(served_dir(self.target_dir, config), self.options, config.speculative_config)
            try:
                async with engine:
                    yield Live(engine, pids=lambda: engine.pids)
            finally:
                runs.startup_s.append(engine.startup_s)
                runs.shutdown_s.append(engine.shutdown_s)
            return
        from draftfit.engines.vllm_server import ServerClient, VLLMServer

        server = VLLMServer(served_dir(self.target_dir, config), self.options, config.speculative_config, log_path=self.log_path,
                            label=config.label)
        runs.serve_argv = list(server.argv)
        runs.url = server.url
        try:
            async with server, ServerClient(server.url) as client:
                yield Live(client, pids=lambda: server.pids)
        finally:
            runs.startup_s.append(server.startup_s)
            runs.shutdown_s.append(server.shutdown_s)


def served_dir(target_dir: Path, config: VerifyConfig) -> Path:
    """What the configuration's server loads as its model: the target, or the checkpoint that
    replaces it (the target with its MTP layer)."""
    return Path(config.target) if config.target else target_dir


def server_bytes(target_dir: Path, options: EngineConfig, config: VerifyConfig) -> int:
    """What one server of ``config`` holds in host memory: weights, KV cache, runtime (an estimate)."""
    from draftfit.engines.vllm_engine import memory_kwargs

    def weights(directory: str | Path | None) -> int:
        if not directory or not Path(directory).is_dir():
            return 0
        return sum(p.stat().st_size for p in Path(directory).glob("*.safetensors"))

    kv = int(memory_kwargs(options.gpu_memory_utilization).get("kv_cache_memory_bytes") or 0)
    return weights(served_dir(target_dir, config)) + weights(config.draft) + kv + SERVER_OVERHEAD_BYTES


def servers_at_once(target_dir: Path, options: EngineConfig, configs: Sequence[VerifyConfig], mode: Mode) -> int:
    """How many servers can run side by side now (1: one at a time). On a GPU the memory fractions
    must add up to at most 1; on the CPU the estimate of each must fit in the memory available."""
    if mode == "url":
        return len(configs) + 1
    if mode == "inprocess":
        return 1
    from draftfit.parallelism import on_gpu

    if on_gpu():
        return max(1, int(0.95 // float(options.gpu_memory_utilization)))
    import psutil

    return_freed_memory()
    need = max(server_bytes(target_dir, options, c) for c in configs) if configs else SERVER_OVERHEAD_BYTES
    return max(1, int(MEMORY_HEADROOM * psutil.virtual_memory().available // need))


def return_freed_memory() -> None:
    """Hand the heap this process has freed back to the system before memory is counted.

    glibc keeps freed heap in its arenas, and torch's mid-sized CPU tensors live there: after
    rank trained the demo's two heads in its own process, 2.8 GiB freed stayed resident (4.5 GiB,
    1.7 after the trim), so the target's served engine no longer counted as fitting beside any
    candidate's, and every candidate was timed without the baseline beside it. Elsewhere than glibc
    there is nothing to trim.
    """
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def groups_of(configs: Sequence[VerifyConfig], at_once: int) -> list[list[VerifyConfig]]:
    """The configurations in groups measured with one baseline each: as many as fit beside the baseline."""
    size = max(1, at_once - 1)
    return [list(configs[i:i + size]) for i in range(0, len(configs), size)] if configs else [[]]


async def _measure_once(live: Live, plan: RunPlan, level: int, round_index: int, tag: str) -> RoundRun:
    await live.target.reset_prefix_cache()
    before = await live.target.counts()
    load = MachineLoad().start()
    with live.memory() as memory:
        t0 = time.perf_counter()
        records = await send_load(live.target, plan, level, tag=tag)
        wall = time.perf_counter() - t0
    load.stop()
    after = await live.target.counts()
    from draftfit.engines.vllm_async import counts_delta

    return RoundRun(round_index, level, records, counts_delta(after, before), memory.to_dict(), wall, load.to_dict())


async def _warm(live: Live, plan: RunPlan) -> None:
    """One short request, so that first-call costs are not measured."""
    async for _ in live.target.stream(plan, 0, "warmup", WARMUP_TOKENS):
        pass


def _failed(runs: ConfigRuns, exc: BaseException) -> None:
    if isinstance(exc, DraftfitError):
        runs.error = exc.message
    else:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        runs.error = f"vLLM failed during the runs ({type(exc).__name__}: {first})"
    log.debug("configuration failed", exc_info=True)


async def measure_group(group: Sequence[VerifyConfig], endpoints: Endpoints, plan: RunPlan, rounds: int, *,
                        together: bool, progress: Progress) -> dict[str, ConfigRuns]:
    """The baseline and ``group`` in ``rounds`` interleaved rounds at every level of ``plan``.

    ``together``: every server up for the whole group; otherwise each is started and stopped in
    every round. A configuration that fails is not tried again; the others go on.
    """
    order = [BASELINE, *group]
    runs = {c.label: ConfigRuns(c) for c in order}

    def say(config: VerifyConfig, r: int, text: str) -> None:
        progress(f"round {r + 1}/{rounds} · {config.label}: {text}")

    async def measure(live: Live, config: VerifyConfig, r: int, level: int) -> None:
        say(config, r, f"{plan.requests} requests at concurrency {level}")
        runs[config.label].runs.append(await _measure_once(live, plan, level, r, f"r{r}-c{level}"))

    stateful = [c.label for c in order if keeps_state(c)]
    fresh = set(stateful) if endpoints.mode != "url" else set()  # a server of its own for every run
    for label in stateful:
        runs[label].server_state = "fresh every run" if label in fresh else "carried over"
    if together:
        async with contextlib.AsyncExitStack() as stack:
            live: dict[str, Live] = {}
            own: dict[str, contextlib.AsyncExitStack] = {}

            async def bring_up(config: VerifyConfig) -> None:
                progress(f"{config.label}: starting vLLM")
                try:
                    if config.label not in own:
                        own[config.label] = await stack.enter_async_context(contextlib.AsyncExitStack())
                    live[config.label] = await own[config.label].enter_async_context(endpoints.open(config, runs[config.label]))
                    await _warm(live[config.label], plan)
                except Exception as exc:  # noqa: BLE001 - a configuration that does not start is data
                    live.pop(config.label, None)
                    _failed(runs[config.label], exc)

            # started side by side: each start is mostly one process at a time importing and
            # loading, so starts overlap (three servers took 126 s on 2 cores, against about 54 s
            # each one after another); an interruption cancels every start, and each stops its
            # own server before the stack closes the others
            await asyncio.gather(*(bring_up(config) for config in order))
            for r in range(rounds):
                for level in plan.levels:
                    for config in order:
                        if config.label not in live or runs[config.label].error:
                            continue
                        try:
                            if config.label in fresh and runs[config.label].runs:
                                await own[config.label].aclose()  # its cache holds the earlier runs' answers
                                await bring_up(config)
                                if config.label not in live:
                                    continue
                            await measure(live[config.label], config, r, level)
                        except Exception as exc:  # noqa: BLE001
                            _failed(runs[config.label], exc)
        return runs
    for r in range(rounds):
        for config in order:
            if runs[config.label].error:
                continue
            # one server per round, or per run for a method with state across requests
            for levels in ([[level] for level in plan.levels] if config.label in fresh else [plan.levels]):
                say(config, r, "starting vLLM")
                try:
                    async with endpoints.open(config, runs[config.label]) as live_one:
                        await _warm(live_one, plan)
                        for level in levels:
                            await measure(live_one, config, r, level)
                except Exception as exc:  # noqa: BLE001
                    _failed(runs[config.label], exc)
                    break
    return runs


def keeps_state(config: VerifyConfig) -> bool:
    """Whether ``config``'s method drafts from what earlier requests produced (see the module doc)."""
    from draftfit.methods import get_method

    return bool(config.method) and get_method(config.method).state_across_requests

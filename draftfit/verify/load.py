"""Load generation: C streaming requests in flight against one engine, bounded in requests and
time, the first wave staggered."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from draftfit.engines.vllm_async import AsyncVLLMEngine
from draftfit.verify.latency import RequestRecord

log = logging.getLogger(__name__)
Progress = Callable[[str], None]

DEFAULT_TIMEOUT_S = 900.0  # per (configuration, concurrency) run


@dataclass
class RunPlan:
    """What every engine runs: prompts (token ids), sampling, levels and bounds."""

    prompts: list[list[int]]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    levels: tuple[int, ...]
    requests: int
    timeout_s: float = DEFAULT_TIMEOUT_S

    def params(self, prompt_index: int, max_tokens: int | None = None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        greedy = self.temperature < 1e-5
        return SamplingParams(
            temperature=0.0 if greedy else float(self.temperature),
            top_p=1.0 if greedy else float(self.top_p),
            max_tokens=int(max_tokens or self.max_tokens),
            seed=int(self.seed) + int(prompt_index),
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )


def stagger_tokens(index: int, concurrency: int, max_tokens: int) -> int:
    """Output tokens the run must have produced before request ``index`` of the first wave starts."""
    return 0 if index >= concurrency else (index * int(max_tokens)) // int(concurrency)


async def send_load(engine: AsyncVLLMEngine, plan: RunPlan, concurrency: int, tag: str) -> list[RequestRecord]:
    """``plan.requests`` streaming requests, at most ``concurrency`` in flight, bounded by ``plan.timeout_s``.

    The first wave is staggered: its j-th request starts once the run has produced
    ``j · max_tokens / concurrency`` tokens, so requests are spread over their lifetimes as in a
    live service and each new prompt arrives while the others decode. Started together, equal
    responses would advance in lock-step without speculation — every prefill then lands in a step
    where nobody decodes — while speculative runs drift apart and pay for every arrival: a
    comparison biased toward the baseline at concurrency > 1.
    """
    semaphore = asyncio.Semaphore(concurrency)
    n_prompts = len(plan.prompts)
    records = [RequestRecord(j, j % n_prompts) for j in range(plan.requests)]
    produced = {"tokens": 0}
    progress = asyncio.Condition()

    async def one(record: RequestRecord) -> None:
        needed = stagger_tokens(record.index, concurrency, plan.max_tokens)
        if needed:
            async with progress:
                await progress.wait_for(lambda: produced["tokens"] >= needed or all(r.end is not None for r in records[: record.index]))
        async with semaphore:
            params = plan.params(record.prompt_index)
            record.start = time.perf_counter()
            try:
                async for out in engine.generate(plan.prompts[record.prompt_index], params, f"{tag}-{record.index}"):
                    now = time.perf_counter()
                    completion = out.outputs[0]
                    if completion.token_ids:
                        record.chunk_times.append(now)
                        record.chunk_tokens.append(len(completion.token_ids))
                        async with progress:
                            produced["tokens"] += len(completion.token_ids)
                            progress.notify_all()
                    if out.finished:
                        record.finish_reason = str(completion.finish_reason)
            except asyncio.CancelledError:
                record.error = f"timeout: unfinished after {plan.timeout_s:g} s"
                raise
            except Exception as exc:  # noqa: BLE001 - a failed request is data (an error), not a crash
                record.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            finally:
                record.end = time.perf_counter()
                async with progress:
                    progress.notify_all()

    tasks = [asyncio.create_task(one(r)) for r in records]
    try:
        _, pending = await asyncio.wait(tasks, timeout=plan.timeout_s)
    except BaseException:  # interrupted: abort every request before the engine is shut down
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=10)
        raise
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=30)
    for record in records:
        if record.start is None:
            record.error = f"timeout: not sent within {plan.timeout_s:g} s"
        elif record.error is None and record.finish_reason is None:
            record.error = "the stream ended without a finished output"
    return records

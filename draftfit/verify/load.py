"""Load generation: C streaming requests in flight against one engine, bounded in requests and
time, the first wave staggered."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from draftfit.engines.vllm_server import StreamChunk
from draftfit.errors import error_line
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
    texts: list[str] = field(default_factory=list)  # the prompts as text (what a completions request sends)
    chats: list[list[dict[str, str]] | None] = field(default_factory=list)  # the chat of templated prompts

    def api_request(self, prompt_index: int, max_tokens: int | None = None) -> tuple[dict[str, Any], bool]:
        """The OpenAI-API body for one prompt, and whether it goes to the chat endpoint: a prompt
        draftfit rendered through the chat template is sent as its messages (the server renders
        them), any other as its text; sampling as :meth:`params`."""
        greedy = self.temperature < 1e-5
        body: dict[str, Any] = {
            "temperature": 0.0 if greedy else float(self.temperature), "top_p": 1.0 if greedy else float(self.top_p),
            "seed": int(self.seed) + int(prompt_index),
        }
        tokens = int(max_tokens or self.max_tokens)
        chat = self.chats[prompt_index] if prompt_index < len(self.chats) else None
        if chat is not None:
            return {**body, "messages": chat, "max_completion_tokens": tokens}, True
        if prompt_index < len(self.texts):
            return {**body, "prompt": self.texts[prompt_index], "max_tokens": tokens}, False
        return {**body, "prompt": list(self.prompts[prompt_index]), "max_tokens": tokens}, False

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


class LoadTarget(Protocol):
    """What the load generator sends to: an in-process engine or a server's client."""

    def stream(self, plan: RunPlan, prompt_index: int, request_id: str,
               max_tokens: int | None = None) -> AsyncIterator[StreamChunk]: ...


def stagger_tokens(index: int, concurrency: int, max_tokens: int) -> int:
    """Output tokens the run must have produced before request ``index`` of the first wave starts."""
    return 0 if index >= concurrency else (index * int(max_tokens)) // int(concurrency)


async def send_load(engine: LoadTarget, plan: RunPlan, concurrency: int, tag: str) -> list[RequestRecord]:
    """``plan.requests`` streaming requests, at most ``concurrency`` in flight, bounded by ``plan.timeout_s``.

    The first wave is staggered: its j-th request starts once the run has produced
    ``j · max_tokens / concurrency`` tokens, so requests are spread over their lifetimes as in a
    live service and each new prompt arrives while the others decode. Started together, equal
    responses would advance in lock-step without speculation — every prefill then lands in a step
    where nobody decodes — while speculative runs drift apart and pay for every arrival: a
    comparison biased toward the baseline at concurrency > 1. Requests start in their order: a later
    one queues for a slot only once the one before it has started, so the first wave is requests
    0 … c−1, not the first c to reach the slot while 1 … c−1 wait out their stagger.
    """
    semaphore = asyncio.Semaphore(concurrency)
    n_prompts = len(plan.prompts)
    records = [RequestRecord(j, j % n_prompts) for j in range(plan.requests)]
    produced = {"tokens": 0}
    progress = asyncio.Condition()

    async def one(record: RequestRecord) -> None:
        needed = stagger_tokens(record.index, concurrency, plan.max_tokens)
        previous = records[record.index - 1] if record.index else None

        def may_queue() -> bool:
            staggered = not needed or produced["tokens"] >= needed or all(r.end is not None for r in records[: record.index])
            return staggered and (previous is None or previous.start is not None)

        async with progress:
            await progress.wait_for(may_queue)
        async with semaphore:
            record.start = time.perf_counter()
            async with progress:
                progress.notify_all()
            try:
                async for chunk in engine.stream(plan, record.prompt_index, f"{tag}-{record.index}"):
                    now = time.perf_counter()
                    if chunk.prompt_tokens is not None:
                        record.prompt_tokens = int(chunk.prompt_tokens)
                    if chunk.tokens:
                        record.chunk_times.append(now)
                        record.chunk_tokens.append(int(chunk.tokens))
                        async with progress:
                            produced["tokens"] += int(chunk.tokens)
                            progress.notify_all()
                    if chunk.finish_reason is not None:
                        record.finish_reason = str(chunk.finish_reason)
            except asyncio.CancelledError:
                record.error = f"timeout: unfinished after {plan.timeout_s:g} s"
                raise
            except Exception as exc:  # noqa: BLE001 - a failed request is data (an error), not a crash
                record.error = error_line(exc)
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

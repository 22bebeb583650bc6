"""Predicted spec-decode counters for a candidate: target trajectories + draft scores → walk.

The glue between the pipeline's stage outputs and :mod:`draftfit.acceptance` /
:mod:`draftfit.ngram`: per-position acceptance for every response, then the walk for every k at
once. Everything returned is *predicted* (expected counters with lower/upper bounds, see
:class:`~draftfit.acceptance.WalkBounds`); nothing here runs a model.

* :func:`predict_model_draft` — a draft model scored over the trajectories
  (:mod:`draftfit.draft_scoring`). Exact acceptance inputs (transformers backend,
  :class:`~draftfit.engines.base.ExactInputs`) are used when present, the top-K bounds otherwise.
* :func:`predict_ngram` — vLLM's ngram prompt lookup, simulated exactly on the token sequences.
* :func:`summarize` — one k: AL bounds, point value and a bootstrap CI over prompts.

Step structure (``engine``)
---------------------------
``"vllm"`` (default) walks as vLLM V1 runs (see :mod:`draftfit.acceptance`): the first response
token comes from the prefill, steps start at position 1, every step drafts k, and the last step
counts its drafts and accepted tokens past the stop.

``"transformers"`` walks as transformers' assisted generation runs
(``GenerationMixin._assisted_decoding``, transformers 5.x) with a constant
``num_assistant_tokens = k``: the first step drafts straight from the prompt (position 0); a
step at position s drafts ``min(k, max_tokens - s - 1)`` tokens (none at the last position:
such a step is not counted); an EOS ends its step as the step's emitted token and is never
counted as accepted (transformers crops ``n_matches`` at EOS). No data past the stop is needed.
Used to compare the probabilistic rule with transformers, the exact reference at temperature > 0.

Stops and look-ahead
--------------------
``max_tokens``: the study's ``max_tokens`` when the trajectories were generated longer than it
(e.g. ``max_tokens + max(k)``): a response then stops at ``min(len, max_tokens)`` and the tokens
past it tell the walk whether the last step's drafts there would have been accepted (exact
instead of bounded). Without it every response stops at its own length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from draftfit.acceptance import (
    Estimator,
    Interval,
    Rule,
    TopLogprobs,
    WalkBounds,
    WalkCounts,
    _as_ks,
    bootstrap,
    expected_walk,
    position_acceptance,
    select_rule,
    walk,
)
from draftfit.engines.base import DraftScore, Trajectory
from draftfit.errors import DraftfitError
from draftfit.metrics import SpecCounts
from draftfit.ngram import ngram_walk

EngineKind = Literal["vllm", "transformers"]
ENGINES = ("vllm", "transformers")


def _trajectories(trajset) -> list[Trajectory]:
    return list(getattr(trajset, "trajectories", trajset))


def _temperature(trajset, temperature: float | None) -> float:
    if temperature is not None:
        return float(temperature)
    sampling = getattr(trajset, "sampling", None)
    if sampling is None:
        raise ValueError("pass temperature= with a plain list of trajectories")
    return 0.0 if sampling.greedy else float(sampling.temperature)


def stop_positions(trajset, max_tokens: int | None = None) -> np.ndarray:
    """Where each response stopped: its length, or ``max_tokens`` for look-ahead trajectories."""
    lengths = np.array([len(t) for t in _trajectories(trajset)], dtype=np.int64)
    return lengths if max_tokens is None else np.minimum(lengths, int(max_tokens))


def _eos_stopped(trajs: Sequence[Trajectory], n: np.ndarray) -> np.ndarray:
    """The response ended with EOS at its stop (finish reason "stop" and not cut by max_tokens)."""
    return np.array([t.finish_reason == "stop" and len(t) == int(m) for t, m in zip(trajs, n, strict=True)])


def target_top_logprobs(trajectory: Trajectory, vocab_size: int | None = None) -> TopLogprobs:
    """The target's processed top-K along its own response (the distribution it sampled from)."""
    return TopLogprobs(trajectory.top_ids, trajectory.top_logprobs, trajectory.token_logprobs, vocab_size)


def draft_top_logprobs(score: DraftScore, temperature: float = 1.0, vocab_size: int | None = None) -> TopLogprobs:
    """A draft's raw top-K, read at ``temperature`` (vLLM's probabilistic draft: logits / T)."""
    return TopLogprobs(score.top_ids, score.top_logprobs, score.token_logprobs, vocab_size, temperature)


def _exact_acceptance(rule: Rule, estimator: Estimator, tokens: np.ndarray, score: DraftScore) -> Interval | None:
    """Per-position acceptance from full-vocabulary inputs (same definitions as
    :func:`draftfit.acceptance.position_acceptance`), or ``None`` when they do not cover it."""
    ex = score.exact
    if ex is None:
        return None
    if rule in ("greedy", "greedy-draft") and (estimator == "conditional" or rule == "greedy"):
        return Interval.point((np.asarray(ex.draft_argmax) == tokens).astype(np.float64))
    if estimator == "marginal":
        values = ex.p_draft_argmax if rule == "greedy-draft" else ex.overlap
        return Interval.point(np.asarray(values, dtype=np.float64))
    draft_lp = getattr(ex, "draft_token_logprobs", None)
    if draft_lp is None:  # scores saved before the field existed: fall back to the top-K bounds
        return None
    ratio = np.exp(np.asarray(draft_lp, np.float64) - np.asarray(ex.target_token_logprobs, np.float64))
    return Interval.point(np.minimum(1.0, ratio))


def model_draft_acceptance(
    trajset,
    scores,
    rule: Rule,
    estimator: Estimator = "conditional",
    *,
    temperature: float | None = None,
    vocab_size: int | None = None,
) -> list[Interval]:
    """Per-position acceptance of every response (positions 0..T-1), exact or top-K bounds.

    ``scores``: a :class:`~draftfit.draft_scoring.DraftScores` or its list of
    :class:`~draftfit.engines.base.DraftScore` (index i scores trajectory i). Exact inputs are
    used when every score carries them; they were computed for the trajectories' own sampling
    parameters (see :meth:`draftfit.engines.hf_engine.HFEngine.score_exact`).
    """
    trajs = _trajectories(trajset)
    score_list = list(getattr(scores, "scores", scores))
    if len(score_list) != len(trajs):
        raise DraftfitError(
            f"{len(score_list)} draft scores for {len(trajs)} trajectories",
            fix="Score the draft over the same trajectory set (draftfit.draft_scoring.score_draft)",
        )
    t_draft = _temperature(trajset, temperature) if rule == "probabilistic" else 1.0
    if rule == "probabilistic" and t_draft <= 0:
        raise DraftfitError(
            "the probabilistic rule needs a temperature > 0", fix="Use the greedy rule at temperature 0"
        )
    out = []
    for i, (traj, score) in enumerate(zip(trajs, score_list, strict=True)):
        if len(score) != len(traj):
            raise DraftfitError(
                f"draft scores of response {i} cover {len(score)} positions, the response has {len(traj)}",
                fix="Re-score the draft over this trajectory set",
            )
        tokens = np.asarray(traj.token_ids)
        exact = _exact_acceptance(rule, estimator, tokens, score)
        if exact is not None:
            out.append(exact)
            continue
        target = target_top_logprobs(traj, vocab_size) if rule != "greedy" else None
        draft = draft_top_logprobs(score, t_draft, vocab_size)
        out.append(position_acceptance(rule, tokens, draft=draft, target=target, estimator=estimator))
    return out


def predict_model_draft(
    trajset,
    scores,
    ks: Sequence[int] | np.ndarray,
    rule: Rule | None = None,
    estimator: Estimator = "conditional",
    *,
    max_tokens: int | None = None,
    engine: EngineKind = "vllm",
    temperature: float | None = None,
    vocab_size: int | None = None,
    draft_is_target: bool = False,
) -> WalkBounds:
    """Predicted counters of a draft model for every k (see the module doc for ``engine`` and
    ``max_tokens``). ``rule`` defaults to vLLM's at the trajectories' temperature with greedy
    drafting (:func:`draftfit.acceptance.select_rule`). ``draft_is_target``: the draft is the
    target itself, whose drafts the greedy and probabilistic rules always accept (q = p) — exactly,
    whatever top-K logprobs or numerics the scores carry; greedy drafting at T > 0 accepts them with
    p(argmax), which the scores give."""
    trajs = _trajectories(trajset)
    rule = select_rule(_temperature(trajset, temperature), "greedy", rule)
    if draft_is_target and rule in ("greedy", "probabilistic"):
        # past the stop too: the target's own continuation is what it would draft and accept
        accept = [Interval.point(np.ones(len(t) + int(np.max(ks)))) for t in trajs]
    else:
        accept = model_draft_acceptance(trajset, scores, rule, estimator, temperature=temperature, vocab_size=vocab_size)
    n = stop_positions(trajs, max_tokens)
    if engine == "vllm":
        return walk(accept, ks, n)
    if engine == "transformers":
        if max_tokens is None:
            max_tokens = int(getattr(getattr(trajset, "sampling", None), "max_tokens", 0)) or None
        if max_tokens is None:
            raise ValueError("the transformers step structure needs max_tokens")
        return walk_assisted(accept, ks, n, max_tokens, _eos_stopped(trajs, n))
    raise DraftfitError(f"unknown engine {engine!r}", fix=f"Use one of: {', '.join(ENGINES)}.")


def predict_ngram(
    trajset,
    ks: Sequence[int] | np.ndarray,
    lookup_min: int,
    lookup_max: int,
    max_model_len: int | None = None,
    rule: Rule | None = None,
    estimator: Estimator = "conditional",
    *,
    max_tokens: int | None = None,
    vocab_size: int | None = None,
) -> WalkBounds:
    """Predicted counters of vLLM's ngram proposer for every k (:func:`draftfit.ngram.ngram_walk`).

    An ngram proposal carries no draft probabilities, so vLLM verifies it one-hot whatever the
    ``draft_sample_method`` (``draft_probs is None`` → ``NO_DRAFT_PROBS`` in
    ``rejection_sampler.py``): at temperature 0 the ``greedy`` rule, above it a proposed token is
    accepted with probability ``p_t(token)`` (``greedy-draft``; ``probabilistic`` means the same
    here). ``rule`` is validated only; the ``marginal`` estimator reads ``p_t`` from the
    trajectories' top-K.
    """
    trajs = _trajectories(trajset)
    if rule is not None:
        select_rule(0.0, "greedy", rule)  # validates the name
    sequences = [t.sequence for t in trajs]
    prompt_lens = [t.response_start for t in trajs]
    target = [target_top_logprobs(t, vocab_size) for t in trajs] if estimator == "marginal" else None
    return ngram_walk(
        sequences,
        prompt_lens,
        ks,
        min_n=int(lookup_min),
        max_n=int(lookup_max),
        n_tokens=stop_positions(trajs, max_tokens),
        max_model_len=max_model_len,
        estimator=estimator,
        target=target,
    )


def predict_chains(
    trajset,
    chains: Sequence[np.ndarray],
    ks: Sequence[int] | np.ndarray,
    *,
    max_tokens: int | None = None,
    max_model_len: int | None = None,
) -> WalkBounds:
    """Predicted counters of a proposer whose drafts depend on where the step starts (a chain head:
    EAGLE, EAGLE-3, MTP), for every k at once.

    ``chains[b][s - 1]``: the (at least max(k)) tokens the proposer drafts at a step starting at
    response position s of response b, s = 1..N−1. Deterministic proposals (greedy drafting), so
    at temperature 0 a draft is accepted iff it equals the target's token, and above it — one-hot
    proposals, verified with ``p_t(token)`` — iff it equals the emitted token given the response
    (the conditional estimator, exact in expectation). Past the data the lower walk rejects and
    the upper walk accepts. As for ngram, vLLM's scheduler cuts a step's drafts to
    ``max_model_len − context − 1``.
    """
    trajs = _trajectories(trajset)
    ks = _as_ks(ks)
    kmax = int(ks.max())
    n = stop_positions(trajs, max_tokens)
    if len(chains) != len(trajs):
        raise DraftfitError(f"{len(chains)} chains for {len(trajs)} trajectories",
                            fix="Compute the head's chains over the same trajectory set")
    B = len(trajs)
    S = max(int(n.max(initial=0)), 2)
    lower, upper = np.zeros((B, S, kmax)), np.zeros((B, S, kmax))
    lower[:, 0], upper[:, 0] = 1.0, 1.0  # response position 0 comes from the prefill: not a step
    n_prop = np.zeros((B, S, ks.size), dtype=np.int64)
    exact_in_data = np.ones(B, dtype=bool)  # before the stop every draft is checked against a known token
    i_idx = np.arange(kmax)
    for b, traj in enumerate(trajs):
        rows = np.asarray(chains[b])
        steps = int(min(rows.shape[0], max(n[b] - 1, 0)))
        if steps and rows.shape[1] < kmax:
            raise DraftfitError(f"chains of response {b} hold {rows.shape[1]} drafts, k up to {kmax} asked",
                                fix="Compute the chains for max(k) steps")
        response = np.asarray(traj.token_ids)
        T = response.shape[0]
        s_idx = np.arange(1, steps + 1)
        pos = s_idx[:, None] + i_idx[None, :]
        known = pos < T
        flag = (rows[:steps, :kmax] == response[np.clip(pos, 0, max(T - 1, 0))]).astype(np.float64)
        lower[b, 1 : steps + 1] = np.where(known, flag, 0.0)
        upper[b, 1 : steps + 1] = np.where(known, flag, 1.0)
        context = traj.response_start + np.arange(S)
        cap = np.full(S, kmax) if max_model_len is None else np.maximum(int(max_model_len) - context - 1, 0)
        n_prop[b] = np.minimum(ks[None, :], cap[:, None])
    counts = []
    for bound in (lower, upper):
        C = np.concatenate([np.ones((B, S, 1)), np.cumprod(bound, axis=-1)], axis=-1)
        counts.append(expected_walk(C, n_prop, n, ks))
    return WalkBounds(counts[0], counts[1], n, exact_in_data, position_based=False)


def walk_assisted(
    accept: Sequence[Interval],
    ks: Sequence[int] | np.ndarray,
    n_tokens: Sequence[int] | np.ndarray,
    max_tokens: int,
    eos_stopped: Sequence[bool] | np.ndarray | None = None,
) -> WalkBounds:
    """The walk with transformers' assisted-generation step structure (module doc).

    ``accept[b]``: per-position acceptance of response b (positions 0..T-1); ``n_tokens[b]``: its
    length at the stop; ``eos_stopped[b]``: it ended with EOS (that position is then never
    accepted). Runs :func:`draftfit.acceptance.expected_walk` on positions shifted by one, so
    that its first step (walk position 1) is response position 0.
    """
    ks = _as_ks(ks)
    kmax = int(ks.max())
    n = np.asarray(n_tokens, dtype=np.int64).reshape(-1)
    B = len(accept)
    if n.shape[0] != B:
        raise ValueError(f"{n.shape[0]} stop positions for {B} responses")
    eos = np.zeros(B, dtype=bool) if eos_stopped is None else np.asarray(eos_stopped, dtype=bool)
    S = int(n.max(initial=0)) + 2  # shifted positions 0..N
    width = S + kmax
    s_idx = np.arange(S)
    # drafts of a step at response position s = shifted position s + 1: min(k, max_tokens - s - 1)
    n_prop = np.clip(np.minimum(ks[None, :], int(max_tokens) - s_idx[:, None]), 0, None)
    n_prop[0] = 0
    counts, exact_in_data = [], np.ones(B, dtype=bool)
    for side in ("lower", "upper"):
        alpha = np.full((B, width), 0.0 if side == "lower" else 1.0)
        for b, item in enumerate(accept):
            row = np.asarray(getattr(item, side), dtype=np.float64).reshape(-1)
            m = min(row.shape[0], int(n[b]))
            alpha[b, 1 : 1 + m] = np.where(np.isnan(row[:m]), 0.0 if side == "lower" else 1.0, row[:m])
            if eos[b] and n[b] > 0:
                alpha[b, n[b]] = 0.0  # response position N-1: the EOS is the step's emitted token
            if side == "lower":
                lo = np.asarray(item.lower, np.float64).reshape(-1)[:m]
                hi = np.asarray(item.upper, np.float64).reshape(-1)[:m]
                exact_in_data[b] = bool(np.array_equal(lo, hi, equal_nan=True))
        windows = np.lib.stride_tricks.sliding_window_view(alpha, kmax, axis=1)[:, :S, :]
        C = np.concatenate([np.ones((B, S, 1)), np.cumprod(windows, axis=-1)], axis=-1)
        counts.append(expected_walk(C, n_prop[None], n + 1, ks))
    return WalkBounds(counts[0], counts[1], n, exact_in_data, position_based=False)


# ------------------------------------------------------------------------------------ summaries


def midpoint(bounds: WalkBounds) -> WalkCounts:
    """Counters halfway between the lower and the upper walk (equal to both when exact)."""
    lo, hi = bounds.lower, bounds.upper
    return WalkCounts(
        lo.ks,
        (lo.num_drafts + hi.num_drafts) / 2,
        (lo.num_draft_tokens + hi.num_draft_tokens) / 2,
        (lo.num_accepted_tokens + hi.num_accepted_tokens) / 2,
        (lo.accepted_per_pos + hi.accepted_per_pos) / 2,
    )


@dataclass(frozen=True)
class PredictedAL:
    """Predicted mean acceptance length for one k.

    ``lower``/``upper``: bounds from what the data cannot tell (top-K mass, acceptance past the
    data); ``point``: the AL of the counters halfway between the two walks; ``ci_low``/``ci_high``:
    percentile bootstrap over prompts of the point counters; ``counts``: the point counters.
    """

    k: int
    point: float
    lower: float
    upper: float
    ci_low: float
    ci_high: float
    counts: SpecCounts

    @property
    def exact(self) -> bool:
        return self.lower == self.upper


def summarize(
    bounds: WalkBounds, k: int, *, n_resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> PredictedAL:
    """The predicted AL of ``k``: point, bounds and bootstrap CI (see :class:`PredictedAL`)."""
    lower, upper = bounds.al_bounds(k)
    mid = midpoint(bounds)
    i = mid._k(k)
    ci = bootstrap(mid, n_resamples=n_resamples, seed=seed, level=level)
    counts = mid.counts(k)
    return PredictedAL(
        int(k),
        float(counts.mean_acceptance_length),
        float(lower),
        float(upper),
        float(ci.mean_acceptance_length_low[i]),
        float(ci.mean_acceptance_length_high[i]),
        counts,
    )

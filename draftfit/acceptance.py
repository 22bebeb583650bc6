"""Offline acceptance: from per-position logprobs to the spec-decode counters vLLM would report.

Three layers, all numpy:

1. **Per-position acceptance** for a response ``y`` of the target, from the target's and the
   draft's top-K logprobs at every response position (:func:`acceptance_probs`,
   :func:`acceptance_given_token`), under the rule vLLM applies (:func:`select_rule`).
2. **The walk** (:func:`walk`): for every k at once, the verification steps the engine would take
   along the response, giving expected vLLM counters per prompt (:class:`WalkCounts`).
3. **Aggregation** (:class:`WalkCounts` ``.counts``, :func:`segments`) and **bootstrap confidence
   intervals** over prompts (:func:`bootstrap`). The metrics themselves are defined once, in
   :mod:`draftfit.metrics`.

Rules (vLLM V1, ``vllm/v1/sample/rejection_sampler.py``)
--------------------------------------------------------
- ``greedy`` — target temperature 0 (``temperature < 1e-5``, ``vllm/sampling_params.py``):
  the draft proposes its argmax, the target accepts it iff it equals the target's argmax, which
  at temperature 0 is the response token ``y_t`` (``rejection_greedy_sample_kernel``).
- ``greedy-draft`` — temperature > 0 with ``draft_sample_method="greedy"`` (vLLM's default):
  the draft proposes its argmax ``d_t`` (``llm_base_proposer.py`` ``_greedy_sample``), treated as
  one-hot: accepted with probability ``p_t(d_t)``; on rejection the target samples from ``p_t``
  with ``d_t`` masked out (``rejection_random_sample_kernel`` with ``NO_DRAFT_PROBS``,
  ``sample_recovered_tokens_kernel``).
- ``probabilistic`` — ``draft_sample_method="probabilistic"``: the draft samples from ``q_t``
  (its logits divided by the temperature, *no* top-k/top-p: ``compute_probs_and_sample_next_token``
  in ``llm_base_proposer.py``); accepted with ``min(1, p_t(v)/q_t(v))``; rejection resamples from
  ``max(p_t - q_t, 0)``. ``p_t`` is the target's distribution after temperature and top-k/top-p
  (``apply_sampling_constraints``), i.e. vLLM's ``processed_logprobs``.

Two estimators of the per-position acceptance
---------------------------------------------
``marginal`` (α): the probability that the draft at position t is accepted given the prefix
``y_<t``: ``[argmax q_t = y_t]`` (greedy), ``p_t(argmax q_t)`` (greedy-draft),
``Σ_v min(p_t(v), q_t(v))`` (probabilistic). Walking a fixed trajectory with α is exact when the
distributions do not depend on the tokens of the prefix, and only approximate otherwise: in a
real step the token after an accepted draft is conditioned on the *draft's* token, while the
walk evaluates α at the response token ``y_t`` (which differs from the draft whenever the
draft would have been rejected). The error does not vanish with more prompts.

``conditional`` (β, the default): the probability that the draft at position t was accepted
given that speculative decoding emitted exactly ``y_t`` there. In every rule above an accepted
draft *is* the emitted token, and a rejection emits a token drawn from the residual, so
``P(accepted, emitted v) = q̃_t(v)·min(1, p_t(v)/q̃_t(v))`` where ``q̃`` is the proposal
distribution (one-hot for greedy drafting), while ``P(emitted v) = p_t(v)``. Hence

- greedy and greedy-draft: ``β_t = [argmax q_t = y_t]`` — a 0/1 flag;
- probabilistic: ``β_t = min(1, q_t(y_t) / p_t(y_t))``.

Because the emitted sequence of speculative decoding has exactly the target's distribution and
the acceptance events are, given that sequence, independent with these probabilities (the joint
probability factorizes position by position), walking a target trajectory with β gives the
*exact* conditional expectation of vLLM's counters given that the engine emitted this
trajectory; averaged over trajectories sampled from the target it is unbiased. For the greedy
rules the walk is then deterministic, and exact from any top-K (the draft's argmax is its top-1).
For probabilistic drafting β needs the logprob of ``y_t`` under each model: vLLM returns the
sampled token's logprob (``logprobs=K``) and the prompt token's (``prompt_logprobs=K``), but
the latter at temperature 1 — under a temperature the draft's normalizer is bounded from its
top-K (:class:`TopLogprobs` ``temperature``), tightly for T < 1, exactly with the full vocabulary.

Bounds from top-K logprobs
--------------------------
Each model's row lists its top-K tokens with probabilities; the rest of the vocabulary shares
the missing mass ``m = 1 - Σ listed`` and every unlisted token has probability at most
``c = min(m, smallest listed top-K probability)``. Known extra entries (the response token's
logprob) join the listed set. Then, with A = tokens listed by both models, B = listed by the
target only, C = listed by the draft only, D = the rest:

- ``p(v)`` for an unlisted v lies in ``[0, c_p]`` (greedy-draft α, β);
- ``Σ_v min(p, q)`` ≥ ``Σ_A min(p, q)`` (the unknown tokens can carry disjoint mass) and
  ≤ ``Σ_A min(p, q) + min(min(S_B, m_q) + m_p, min(S_C, m_p) + m_q)`` with
  ``S_B = Σ_B min(p_v, c_q)``, ``S_C = Σ_C min(q_v, c_p)``, because ``Σ_B min(p, q)`` is at most
  both ``S_B`` and the draft's missing mass, and ``Σ_{C∪D} min(p, q) ≤ Σ_{C∪D} p = m_p``
  (symmetrically for the draft);
- ``min(1, q/p)`` from the intervals of ``q(y)`` and ``p(y)``.

With the full vocabulary listed (``K = vocab_size``, the transformers backend) m = 0 and the
bounds coincide. Raw (temperature-1) logprobs used under a temperature give intervals for the
listed probabilities too (see ``_tempered``); every bound above then takes the matching end.

The walk, as vLLM V1 (0.32) runs it
-----------------------------------
Read from the installed vLLM (line numbers of 0.32.0):

- The first response token comes from the prefill step; drafts are proposed after it
  (``gpu_model_runner.py`` ``sample_tokens`` runs the drafter on every step's sampled tokens;
  ``scheduler.py:2550`` ``update_draft_token_ids``), so the first verification step starts at
  response position 1.
- A step starting at position s verifies the k drafts for s..s+k-1, accepts the leading
  accepted ones (A of them) and emits A+1 tokens (the last one recovered or the bonus); the next
  step starts at s+A+1 (``rejection_greedy_sample_kernel``/``rejection_random_sample_kernel``).
- A running request schedules all of its drafts: ``num_new_tokens = num_tokens_with_spec -
  num_computed_tokens`` (``scheduler.py:703``), clipped only by ``max_model_len``
  (``scheduler.py:714``); nothing clips it to ``max_tokens``. A model draft always proposes k.
- Counting happens before the stop check: ``num_accepted = len(generated_token_ids) - 1``
  (``scheduler.py:2118``) feeds ``make_spec_decoding_stats`` first, and only then
  ``_update_request_with_output`` (``scheduler.py:2493``-``2510``) trims tokens past EOS /
  ``max_tokens``. So the last step counts all k drafts and every accepted draft, including
  those past the stop. Steps after the request finished are not counted (``scheduler.py``
  ``update_from_output`` skips finished requests, ``scheduler.py:2091``; the async scheduler does
  not schedule a step once ``max_tokens`` is certainly reached, ``scheduler.py:674``).
- A step without proposal (ngram with no match) schedules no spec tokens and is not counted:
  ``make_spec_decoding_stats`` returns early when ``num_draft_tokens`` is 0 (``scheduler.py:2969``);
  a shorter proposal counts only its own tokens.
- Not modelled: drafts near ``max_model_len`` (the drafter then proposes zeros,
  ``gpu_model_runner.py:4288`` ``_input_fits_in_drafter``; choose ``max_model_len`` ≥ prompt +
  ``max_tokens`` + k + 1), structured-output grammar rejections, dynamic k per batch size.

Acceptance past the end of the data (positions ≥ the length of the acceptance arrays, e.g. after
EOS or beyond ``max_tokens``, and NaN entries) is unknown: the lower walk takes it as rejected,
the upper walk as accepted. Trajectories generated with ``max(k)`` extra tokens past
``max_tokens`` (pass the stop as ``n_tokens``) make length-stopped responses exact.

The walk is the dynamic programme ``π(s+a+1) += π(s)·P(A=a | s)``,
``P(A ≥ m | s) = Π_{j<m} α_{s+j}``, run forward over start positions for all k at once and
vectorized over prompts; it gives the expected drafts, draft tokens, accepted tokens and
accepted-per-position. With 0/1 acceptances (greedy rules, conditional estimator) it reduces
to the deterministic walk and the counts are exact integers.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from draftfit.errors import DraftfitError
from draftfit.metrics import SpecCounts

Rule = Literal["greedy", "greedy-draft", "probabilistic"]
Estimator = Literal["conditional", "marginal"]
RULES: tuple[str, ...] = get_args(Rule)
ESTIMATORS: tuple[str, ...] = get_args(Estimator)

#: vLLM treats temperatures below this as greedy (``vllm/sampling_params.py`` ``_SAMPLING_EPS``).
GREEDY_TEMPERATURE_EPS = 1e-5


# --------------------------------------------------------------------------- rule selection
def select_rule(
    temperature: float, draft_sample_method: str = "greedy", rule: str | None = None
) -> Rule:
    """The acceptance rule vLLM applies: temperature 0 → ``greedy``; otherwise the draft sample
    method (``"greedy"`` → ``greedy-draft``, ``"probabilistic"`` → ``probabilistic``). ``rule``
    overrides the choice."""
    if rule is not None:
        if rule not in RULES:
            raise DraftfitError(
                f"unknown acceptance rule {rule!r}", fix=f"Use one of: {', '.join(RULES)}."
            )
        return rule  # type: ignore[return-value]
    if temperature < GREEDY_TEMPERATURE_EPS:
        return "greedy"
    if draft_sample_method == "greedy":
        return "greedy-draft"
    if draft_sample_method == "probabilistic":
        return "probabilistic"
    raise DraftfitError(
        f"unknown draft_sample_method {draft_sample_method!r}",
        fix="Use 'greedy' (vLLM's default) or 'probabilistic'.",
    )


# --------------------------------------------------------------------------- inputs and outputs
@dataclass(frozen=True)
class TopLogprobs:
    """One model's top-K logprobs along a response (any leading shape ``[..., T]``).

    ``ids`` (int ``[..., T, K]``) and ``logprobs`` (float, natural log) list the model's top-K'
    tokens at each position (K' ≤ K; unused slots have id -1). Do not put the response token
    into these arrays when it is not among the top-K (vLLM appends it to its logprob dicts):
    pass its logprob in ``token_logprob`` (float ``[..., T]``, NaN where unknown) instead.
    ``vocab_size`` lets a full-vocabulary row count as complete (missing mass exactly 0) and
    tightens the bounds under a temperature.

    ``temperature``: the distribution that matters is ``softmax(logits / temperature)`` while the
    logprobs given are at temperature 1 (raw prompt logprobs of a draft: vLLM's probabilistic
    draft samples from its logits divided by the request temperature, without top-p). Without
    the full vocabulary the normalizer is then unknown and the probabilities become bounds. For
    the target pass the processed logprobs the trajectory was sampled from (temperature 1 here).
    """

    ids: np.ndarray
    logprobs: np.ndarray
    token_logprob: np.ndarray | None = None
    vocab_size: int | None = None
    temperature: float = 1.0


@dataclass(frozen=True)
class Interval:
    """Lower and upper bound of a quantity (equal where the value is exact)."""

    lower: np.ndarray
    upper: np.ndarray

    @classmethod
    def point(cls, value: np.ndarray) -> Interval:
        value = np.asarray(value, dtype=np.float64)
        return cls(value, value)

    @property
    def exact(self) -> bool:
        return bool(np.array_equal(self.lower, self.upper))

    @property
    def width(self) -> np.ndarray:
        return np.asarray(self.upper) - np.asarray(self.lower)


@dataclass(frozen=True)
class _Dist:
    ids: np.ndarray  # [..., K+1] listed ids (top-K plus the response token when known), -1 unused
    p_lo: np.ndarray  # [..., K+1] bounds of their probabilities (0 where unused)
    p_hi: np.ndarray
    missing_lo: np.ndarray  # [...] bounds of the mass of the unlisted tokens
    missing_hi: np.ndarray
    cap: np.ndarray  # [...] upper bound of any unlisted token's probability
    argmax: np.ndarray  # [...] top-1 id (-1 when the row is empty)


def _dist(tl: TopLogprobs, tokens: np.ndarray) -> _Dist:
    # int64: engines store int32 ids, and the sentinel below does not fit in int32
    ids = np.asarray(tl.ids).astype(np.int64, copy=False)
    lp_in = np.asarray(tl.logprobs)
    eps = np.finfo(lp_in.dtype).eps if lp_in.dtype.kind == "f" else np.finfo(np.float64).eps
    lp = lp_in.astype(np.float64)
    if ids.shape != lp.shape or ids.ndim < 1:
        raise ValueError(f"ids {ids.shape} and logprobs {lp.shape} must have the same shape [..., T, K]")
    if ids.shape[:-1] != tokens.shape:
        raise ValueError(f"top-K rows {ids.shape[:-1]} do not match the response tokens {tokens.shape}")
    valid = ids >= 0
    score = np.where(valid, lp, -np.inf)
    r = np.exp(score)
    top_min = np.where(valid, r, np.inf).min(axis=-1)
    top_min = np.where(np.isfinite(top_min), top_min, 1.0)
    best = score.max(axis=-1, keepdims=True)
    big = np.iinfo(np.int64).max
    argmax = np.where(valid & (score == best), ids, big).min(axis=-1)
    argmax = np.where(argmax == big, -1, argmax)

    listed = valid & (ids == tokens[..., None])
    y_listed = listed.any(axis=-1)
    if tl.token_logprob is not None:
        tlp = np.asarray(tl.token_logprob, dtype=np.float64)
        if tlp.shape != tokens.shape:
            raise ValueError(f"token_logprob {tlp.shape} does not match the response tokens {tokens.shape}")
        known = ~np.isnan(tlp)
        r_tok = np.exp(np.where(known, tlp, -np.inf))
    else:
        known = np.zeros(tokens.shape, dtype=bool)
        r_tok = np.zeros(tokens.shape)
    extra = known & ~y_listed
    ids_all = np.concatenate([ids, np.where(extra, tokens, -1)[..., None]], axis=-1)
    r_all = np.concatenate([r, np.where(extra, r_tok, 0.0)[..., None]], axis=-1)
    n_listed = (ids_all >= 0).sum(axis=-1)
    missing = np.clip(1.0 - r_all.sum(axis=-1), 0.0, 1.0)
    # a missing mass within the rounding of the given logprobs is no mass at all
    missing = np.where(missing <= 4 * ids.shape[-1] * eps, 0.0, missing)
    if tl.vocab_size is not None:
        missing = np.where(n_listed >= tl.vocab_size, 0.0, missing)
    cap = np.minimum(missing, top_min)
    if tl.temperature == 1.0:
        return _Dist(ids_all, r_all, r_all, missing, missing, cap, argmax)
    return _tempered(ids_all, r_all, missing, cap, n_listed, tl, argmax)


def _tempered(ids_all, r_all, missing, cap, n_listed, tl: TopLogprobs, argmax) -> _Dist:
    """Bounds of softmax(logits / T) from the temperature-1 top-K.

    ``q_T(v) = r_v^b / Z`` with ``b = 1/T`` and ``Z = Σ_listed r^b + U``, ``U = Σ_unlisted r_u^b``
    where the unlisted ``r_u`` sum to the missing mass m and each is at most c. ``r^b`` is convex
    for T < 1, so U is largest with the mass packed into tokens of probability c
    (``⌊m/c⌋·c^b + rem^b``) and smallest spread over the rest of the vocabulary (→ 0 when the
    vocabulary size is unknown); for T > 1 the two swap (spread → unbounded without a
    vocabulary size). An unlisted token's own term is part of U, so ``q_T(u) ≤ c^b/(E + c^b)``.
    """
    if not tl.temperature > 0:
        raise ValueError(f"temperature must be > 0, got {tl.temperature}")
    b = 1.0 / tl.temperature
    e = np.where(r_all > 0, r_all, 0.0) ** b
    E = e.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        full = np.where(cap > 0, np.floor(missing / np.where(cap > 0, cap, 1.0)), 0.0)
        rem = np.clip(missing - full * cap, 0.0, None)
        packed = full * cap**b + rem**b
        if tl.vocab_size is not None:
            n_u = np.maximum(tl.vocab_size - n_listed, 1).astype(np.float64)
            spread = missing**b * n_u ** (1.0 - b)
        else:
            spread = np.full(missing.shape, 0.0 if b > 1 else np.inf)
        u_lo, u_hi = (spread, packed) if b > 1 else (packed, spread)
        u_lo = np.where(missing > 0, u_lo, 0.0)
        u_hi = np.where(missing > 0, u_hi, 0.0)
        p_lo = e / (E + u_hi)[..., None]
        p_hi = e / (E + u_lo)[..., None]
        m_lo = u_lo / (E + u_lo)
        m_hi = np.where(np.isinf(u_hi), 1.0, u_hi / (E + u_hi))
        own = cap**b / (E + cap**b)
    p_lo = np.nan_to_num(p_lo, nan=0.0)
    return _Dist(ids_all, p_lo, p_hi, m_lo, m_hi, np.minimum(m_hi, own), argmax)


def _lookup(d: _Dist, token: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of the probability of ``token`` (one id per row)."""
    hit = (d.ids >= 0) & (d.ids == token[..., None])
    listed = hit.any(axis=-1)
    lo = (d.p_lo * hit).sum(axis=-1)
    hi = (d.p_hi * hit).sum(axis=-1)
    return np.where(listed, lo, 0.0), np.where(listed, hi, d.cap)


def _greedy_flags(tokens: np.ndarray, draft: _Dist) -> Interval:
    has = draft.argmax >= 0
    eq = (draft.argmax == tokens).astype(np.float64)
    return Interval(np.where(has, eq, 0.0), np.where(has, eq, 1.0))


def _check(rule: str, tokens: np.ndarray, target: TopLogprobs | None) -> None:
    if rule not in RULES:
        raise DraftfitError(f"unknown acceptance rule {rule!r}", fix=f"Use one of: {', '.join(RULES)}.")
    if rule != "greedy" and target is None:
        raise ValueError(f"rule {rule!r} needs the target's logprobs")


def acceptance_probs(
    rule: Rule, tokens: np.ndarray, *, draft: TopLogprobs, target: TopLogprobs | None = None
) -> Interval:
    """Marginal α_t = P(draft at t accepted | prefix y_<t), bounds from top-K (see module doc).

    ``tokens``: the response token ids ``y`` (int ``[..., T]``). Vectorized over all axes.
    """
    tokens = np.asarray(tokens)
    _check(rule, tokens, target)
    q = _dist(draft, tokens)
    if rule == "greedy":
        return _greedy_flags(tokens, q)
    assert target is not None
    p = _dist(target, tokens)
    if rule == "greedy-draft":
        lo, hi = _lookup(p, q.argmax)
        has = q.argmax >= 0
        return Interval(np.where(has, lo, 0.0), np.where(has, hi, 1.0))
    # probabilistic: Σ_v min(p(v), q(v))
    vp, vq = p.ids >= 0, q.ids >= 0
    both = (p.ids[..., :, None] == q.ids[..., None, :]) & vp[..., :, None] & vq[..., None, :]
    overlap_lo = (np.minimum(p.p_lo[..., :, None], q.p_lo[..., None, :]) * both).sum(axis=(-2, -1))
    if p.p_hi is p.p_lo and q.p_hi is q.p_lo:
        overlap_hi = overlap_lo
    else:
        overlap_hi = (np.minimum(p.p_hi[..., :, None], q.p_hi[..., None, :]) * both).sum(axis=(-2, -1))
    p_only = vp & ~both.any(axis=-1)
    q_only = vq & ~both.any(axis=-2)
    s_b = (np.minimum(p.p_hi, q.cap[..., None]) * p_only).sum(axis=-1)
    s_c = (np.minimum(q.p_hi, p.cap[..., None]) * q_only).sum(axis=-1)
    extra = np.minimum(
        np.minimum(s_b, q.missing_hi) + p.missing_hi, np.minimum(s_c, p.missing_hi) + q.missing_hi
    )
    return Interval(np.minimum(overlap_lo, 1.0), np.minimum(overlap_hi + extra, 1.0))


def acceptance_given_token(
    rule: Rule, tokens: np.ndarray, *, draft: TopLogprobs, target: TopLogprobs | None = None
) -> Interval:
    """Conditional β_t = P(draft at t accepted | the engine emitted y_t there) (see module doc).

    greedy / greedy-draft: ``[argmax q_t = y_t]``; probabilistic: ``min(1, q_t(y_t)/p_t(y_t))``,
    exact whenever both models' logprob of ``y_t`` is known.
    """
    tokens = np.asarray(tokens)
    _check(rule, tokens, target)
    q = _dist(draft, tokens)
    if rule in ("greedy", "greedy-draft"):
        return _greedy_flags(tokens, q)
    assert target is not None
    p = _dist(target, tokens)
    p_lo, p_hi = _lookup(p, tokens)
    q_lo, q_hi = _lookup(q, tokens)
    with np.errstate(divide="ignore", invalid="ignore"):
        lower = np.where(p_hi > 0, np.minimum(1.0, q_lo / p_hi), np.where(q_lo > 0, 1.0, 0.0))
        upper = np.where(p_lo > 0, np.minimum(1.0, q_hi / p_lo), np.where(q_hi > 0, 1.0, 0.0))
    return Interval(lower, upper)


def position_acceptance(
    rule: Rule,
    tokens: np.ndarray,
    *,
    draft: TopLogprobs,
    target: TopLogprobs | None = None,
    estimator: Estimator = "conditional",
) -> Interval:
    """Per-position acceptance for the walk: β (``conditional``, default) or α (``marginal``)."""
    if estimator == "conditional":
        return acceptance_given_token(rule, tokens, draft=draft, target=target)
    if estimator == "marginal":
        return acceptance_probs(rule, tokens, draft=draft, target=target)
    raise DraftfitError(f"unknown estimator {estimator!r}", fix=f"Use one of: {', '.join(ESTIMATORS)}.")


# --------------------------------------------------------------------------- the walk
@dataclass(frozen=True)
class WalkCounts:
    """Expected vLLM counters per prompt and k (exact integers for 0/1 acceptances).

    Arrays: ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens`` ``[prompts, len(ks)]``;
    ``accepted_per_pos`` ``[prompts, len(ks), max(ks)]`` (zero past each k).
    """

    ks: np.ndarray
    num_drafts: np.ndarray
    num_draft_tokens: np.ndarray
    num_accepted_tokens: np.ndarray
    accepted_per_pos: np.ndarray

    @property
    def n_prompts(self) -> int:
        return int(self.num_drafts.shape[0])

    def _k(self, k: int) -> int:
        hits = np.flatnonzero(self.ks == k)
        if hits.size == 0:
            raise KeyError(f"k={k} was not walked (walked: {self.ks.tolist()})")
        return int(hits[0])

    def counts(self, k: int, prompts: np.ndarray | Sequence[int] | None = None) -> SpecCounts:
        """Token-weighted total over ``prompts`` (all by default): the sum of their counters."""
        i = self._k(k)
        sel = slice(None) if prompts is None else np.asarray(prompts)
        return SpecCounts(
            float(self.num_drafts[sel, i].sum()),
            float(self.num_draft_tokens[sel, i].sum()),
            float(self.num_accepted_tokens[sel, i].sum()),
            self.accepted_per_pos[sel, i, :k].sum(axis=0),
        )

    def per_prompt(self, k: int) -> list[SpecCounts]:
        i = self._k(k)
        return [
            SpecCounts(
                float(self.num_drafts[b, i]),
                float(self.num_draft_tokens[b, i]),
                float(self.num_accepted_tokens[b, i]),
                self.accepted_per_pos[b, i, :k].copy(),
            )
            for b in range(self.n_prompts)
        ]

    def mean_acceptance_length(self, prompts: np.ndarray | Sequence[int] | None = None) -> np.ndarray:
        """Token-weighted AL for every walked k: ``1 + Σ accepted / Σ drafts``."""
        sel = slice(None) if prompts is None else np.asarray(prompts)
        drafts = self.num_drafts[sel].sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return 1.0 + self.num_accepted_tokens[sel].sum(axis=0) / drafts

    def select(self, prompts: np.ndarray | Sequence[int]) -> WalkCounts:
        sel = np.asarray(prompts)
        return WalkCounts(
            self.ks,
            self.num_drafts[sel],
            self.num_draft_tokens[sel],
            self.num_accepted_tokens[sel],
            self.accepted_per_pos[sel],
        )


@dataclass(frozen=True)
class WalkBounds:
    """The walk under the lower and under the upper per-position acceptance.

    ``exact_in_data[b]``: prompt b's acceptances before its stop were exact, so only the
    unknown acceptance past the end separates ``lower`` from ``upper``. ``position_based``:
    acceptance depends on the position only (model drafts), which makes the number of steps
    monotone in it (see :meth:`al_bounds`).
    """

    lower: WalkCounts
    upper: WalkCounts
    n_tokens: np.ndarray
    exact_in_data: np.ndarray
    position_based: bool = True

    @property
    def ks(self) -> np.ndarray:
        return self.lower.ks

    @property
    def exact(self) -> bool:
        a, b = self.lower, self.upper
        return all(
            np.array_equal(x, y)
            for x, y in [
                (a.num_drafts, b.num_drafts),
                (a.num_draft_tokens, b.num_draft_tokens),
                (a.num_accepted_tokens, b.num_accepted_tokens),
                (a.accepted_per_pos, b.accepted_per_pos),
            ]
        )

    def select(self, prompts: np.ndarray | Sequence[int]) -> WalkBounds:
        sel = np.asarray(prompts)
        return WalkBounds(
            self.lower.select(sel),
            self.upper.select(sel),
            self.n_tokens[sel],
            self.exact_in_data[sel],
            self.position_based,
        )

    def al_bounds(
        self, k: int, prompts: np.ndarray | Sequence[int] | None = None
    ) -> tuple[float, float]:
        """Bounds of the token-weighted AL for ``k``.

        Rigorous when acceptance is position-based: increasing any α can only move every step's
        end forward (the next start ``s + 1 + min(k, run of accepts from s)`` is non-decreasing in
        s and in α), so the lower walk has the most steps and the upper walk the fewest; the tokens
        emitted per prompt lie between ``N - 1`` and ``N - 1 + k`` (only the last step overshoots
        the stop). For prompts whose acceptances before the stop are exact the walks themselves
        bound the value (only the last step's acceptance past the end differs). For ngram with
        inexact (marginal) acceptance the lower/upper walk values are returned as they are.
        """
        i = self.lower._k(k)
        sel = np.arange(self.lower.n_prompts) if prompts is None else np.asarray(prompts)
        lo, hi = self.lower, self.upper
        if not self.position_based:
            return (
                float(lo.mean_acceptance_length(sel)[i]),
                float(hi.mean_acceptance_length(sel)[i]),
            )
        ex = self.exact_in_data[sel]
        steps_max = lo.num_drafts[sel, i]
        steps_min = hi.num_drafts[sel, i]
        n_emit = np.maximum(self.n_tokens[sel] - 1, 0).astype(np.float64)
        emit_lo = np.where(ex, lo.num_accepted_tokens[sel, i] + steps_max, n_emit)
        emit_hi = np.where(ex, hi.num_accepted_tokens[sel, i] + steps_min, n_emit + k * (n_emit > 0))
        # a step emits at most k + 1 tokens, however loose the bound on the tokens past the stop
        emit_hi = np.minimum(emit_hi, steps_min * (k + 1.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(emit_lo.sum() / steps_max.sum()), float(emit_hi.sum() / steps_min.sum())


def _as_ks(ks: Sequence[int] | np.ndarray | int) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(ks, dtype=np.int64))
    if arr.ndim != 1 or arr.size == 0 or (arr < 1).any():
        raise DraftfitError(f"invalid k values {arr.tolist()}", fix="Give speculative token counts ≥ 1.")
    return arr


def expected_walk(
    prefix_accept: np.ndarray,
    n_proposed: np.ndarray,
    n_tokens: np.ndarray,
    ks: Sequence[int] | np.ndarray,
) -> WalkCounts:
    """The dynamic programme over step starts, for every k at once (the engine-independent core).

    ``prefix_accept[b, s, m]``: probability that the first m drafts of a step starting at
    response position s are all accepted (``[..., 0] = 1``; shape ``[B, S, max(ks)+1]`` with S ≥
    max(n_tokens)). ``n_proposed[b, s, i]``: drafts a step at s carries when ``k = ks[i]``
    (0 = no proposal: one token, not counted), shape broadcastable to ``[B, S, len(ks)]``.
    ``n_tokens[b]``: response length N (steps start at 1..N-1).
    """
    ks = _as_ks(ks)
    C = np.asarray(prefix_accept, dtype=np.float64)
    B, S, K1 = C.shape
    kmax = K1 - 1
    if kmax < ks.max():
        raise ValueError(f"prefix_accept covers {kmax} drafts, k up to {ks.max()} requested")
    n_tokens = np.asarray(n_tokens, dtype=np.int64)
    nk = ks.size
    n_prop = np.asarray(n_proposed, dtype=np.int64)
    n_prop = n_prop.reshape((1,) * (3 - n_prop.ndim) + n_prop.shape)
    if n_prop.shape[2] != nk or n_prop.shape[0] not in (1, B) or n_prop.shape[1] not in (1, S):
        raise ValueError(f"n_proposed {n_prop.shape} does not broadcast to {(B, S, nk)}")
    per_start = n_prop.shape[1] > 1
    a = np.arange(K1)[:, None, None]
    # P(A = a | s) = C[s, a] - C[s, a+1] for a < n, C[s, n] for a = n (n drafts proposed);
    # laid out [start, a, prompt] so that every step of the loop reads contiguous memory
    C_t = np.ascontiguousarray(C.transpose(1, 2, 0))  # [S, K1, B]
    drop_t = C_t - np.concatenate([C_t[:, 1:, :], np.zeros((S, 1, B))], axis=1)
    pi = np.zeros((S + K1 + 1, B, nk))  # pi[s, b, i]: probability that a step starts at s
    pi[1] = 1.0
    n = n_prop[:, 0, :][None]  # [1, 1|B, nk]
    below, at = (a < n).astype(np.float64), (a == n).astype(np.float64)
    for s in range(1, int(min(S, n_tokens.max(initial=0)))):
        if per_start:
            n = n_prop[:, s, :][None]
            below, at = (a < n).astype(np.float64), (a == n).astype(np.float64)
        P = drop_t[s][:, :, None] * below + C_t[s][:, :, None] * at  # [K1, B, nk]
        P *= pi[s][None]
        pi[s + 1 : s + 1 + K1] += P
    pi = pi.transpose(1, 2, 0)  # [B, nk, S + K1 + 1]
    # a start at or past N is not a step (the request has finished)
    s_idx = np.arange(S)
    live = pi[:, :, :S] * ((s_idx >= 1) & (s_idx < n_tokens[:, None]))[:, None, :]  # [B, nk, S]
    n_full = np.broadcast_to(n_prop, (B, S, nk)).transpose(0, 2, 1)  # [B, nk, S]
    drafts = (live * (n_full > 0)).sum(axis=-1)
    draft_tokens = (live * n_full).sum(axis=-1)
    per_pos = np.zeros((B, nk, kmax))
    j = np.arange(kmax)
    for i in range(nk):
        mask = j < n_prop[:, :, i, None]  # [1|B, 1|S, kmax]
        per_pos[:, i, :] = np.einsum("bs,bsj->bj", live[:, i, :], C[:, :, 1:] * mask)
    return WalkCounts(ks, drafts, draft_tokens, per_pos.sum(axis=-1), per_pos)


def _stack(rows: Sequence[np.ndarray], width: int, fill: float) -> np.ndarray:
    out = np.full((len(rows), width), fill, dtype=np.float64)
    for b, r in enumerate(rows):
        m = min(r.shape[0], width)
        out[b, :m] = np.where(np.isnan(r[:m]), fill, r[:m])
    return out


def walk(
    accept: Interval | Sequence[Interval],
    ks: Sequence[int] | np.ndarray | int = tuple(range(1, 9)),
    n_tokens: Sequence[int] | np.ndarray | int | None = None,
) -> WalkBounds:
    """Walk responses as the engine does, for every k in ``ks`` at once (model drafts: k per step).

    ``accept``: per-position acceptance of each response (positions 0..T-1; position 0 is never
    drafted): a list of 1-D :class:`Interval` s, one 1-D Interval, or one 2-D Interval
    ``[responses, T]`` padded with NaN (NaN = no data). ``n_tokens``: where each request stopped
    (default: the length of its data); positions in ``[N, T)`` are data past the stop, used for
    the drafts the last step counts there. Without data the lower walk rejects and the upper walk
    accepts.
    """
    if isinstance(accept, Interval) and np.ndim(accept.lower) == 2:
        items = [Interval(lo_row, hi_row) for lo_row, hi_row in zip(accept.lower, accept.upper, strict=True)]
    else:
        items = [accept] if isinstance(accept, Interval) else list(accept)
    ks = _as_ks(ks)
    kmax = int(ks.max())
    lows = [np.asarray(it.lower, dtype=np.float64).reshape(-1) for it in items]
    highs = [np.asarray(it.upper, dtype=np.float64).reshape(-1) for it in items]
    lengths = np.array([_data_length(r) for r in lows], dtype=np.int64)
    if n_tokens is None:
        n = lengths.copy()
    else:
        n = np.broadcast_to(np.asarray(n_tokens, dtype=np.int64), lengths.shape).copy()
    if (n > np.array([r.shape[0] for r in lows], dtype=np.int64)).any():
        raise ValueError("n_tokens exceeds the acceptance data of a response")
    S = max(int(n.max(initial=0)), 2)
    width = S + kmax
    lo = _stack(lows, width, 0.0)
    hi = _stack(highs, width, 1.0)
    positions = np.arange(width)
    in_data = (positions >= 1) & (positions < n[:, None])
    exact_in_data = ~((lo != hi) & in_data).any(axis=1)
    counts = []
    for alpha in (lo, hi):
        windows = np.lib.stride_tricks.sliding_window_view(alpha, kmax, axis=1)[:, :S, :]
        C = np.concatenate([np.ones((len(items), S, 1)), np.cumprod(windows, axis=-1)], axis=-1)
        counts.append(expected_walk(C, ks[None, None, :], n, ks))
    return WalkBounds(counts[0], counts[1], n, exact_in_data, position_based=True)


def _data_length(row: np.ndarray) -> int:
    """Length of a row up to its trailing NaN padding."""
    known = np.flatnonzero(~np.isnan(row))
    return int(known[-1]) + 1 if known.size else 0


# --------------------------------------------------------------------------- aggregation
def segments(
    walked: WalkCounts | WalkBounds, labels: Sequence[Hashable] | np.ndarray
) -> dict[Hashable, WalkCounts | WalkBounds]:
    """Split per-prompt counts by a label per prompt (length bucket, category, ...)."""
    labels = np.asarray(labels)
    n = walked.lower.n_prompts if isinstance(walked, WalkBounds) else walked.n_prompts
    if labels.shape != (n,):
        raise ValueError(f"{labels.shape[0] if labels.ndim else 0} labels for {n} prompts")
    out: dict[Hashable, WalkCounts | WalkBounds] = {}
    for value in dict.fromkeys(labels.tolist()):
        out[value] = walked.select(np.flatnonzero(labels == value))
    return out


@dataclass(frozen=True)
class BootstrapCI:
    """Percentile bootstrap over prompts for every walked k (arrays indexed like ``ks``).

    ``*_low``/``*_high`` are the ``level`` interval; per-position arrays are ``[len(ks), max(ks)]``.
    """

    ks: np.ndarray
    level: float
    n_resamples: int
    seed: int
    mean_acceptance_length: np.ndarray
    mean_acceptance_length_low: np.ndarray
    mean_acceptance_length_high: np.ndarray
    acceptance_rate: np.ndarray
    acceptance_rate_low: np.ndarray
    acceptance_rate_high: np.ndarray
    per_position_rate: np.ndarray
    per_position_rate_low: np.ndarray
    per_position_rate_high: np.ndarray

    def to_dict(self) -> dict:
        out = {"ks": self.ks.tolist(), "level": self.level, "n_resamples": self.n_resamples, "seed": self.seed}
        for name in (
            "mean_acceptance_length", "acceptance_rate", "per_position_rate",
        ):
            for suffix in ("", "_low", "_high"):
                out[name + suffix] = np.asarray(getattr(self, name + suffix)).tolist()
        return out


def bootstrap(
    walked: WalkCounts, n_resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> BootstrapCI:
    """Bootstrap CIs over prompts: resample prompts with replacement (seeded), sum their counts
    and take the token-weighted ratio (AL of a resample = 1 + Σ accepted / Σ drafts)."""
    B = walked.n_prompts
    if B == 0:
        raise ValueError("no prompts to bootstrap")
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(B, np.full(B, 1.0 / B), size=n_resamples).astype(np.float64)  # [R, B]
    drafts = weights @ walked.num_drafts
    tokens = weights @ walked.num_draft_tokens
    accepted = weights @ walked.num_accepted_tokens
    nk, kmax = walked.accepted_per_pos.shape[1:]
    per_pos = (weights @ walked.accepted_per_pos.reshape(B, -1)).reshape(n_resamples, nk, kmax)
    with np.errstate(divide="ignore", invalid="ignore"):
        al = 1.0 + accepted / drafts
        rate = accepted / tokens
        pos = per_pos / drafts[..., None]
    alpha = (1.0 - level) / 2.0
    q = [100 * alpha, 100 * (1 - alpha)]
    valid_pos = np.arange(kmax)[None, :] < walked.ks[:, None]

    def ci(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if np.isnan(x).all():
            nan = np.full(x.shape[1:], np.nan)
            return nan, nan
        with np.errstate(invalid="ignore"):
            low, high = np.nanpercentile(x, q, axis=0)
        return low, high

    al_lo, al_hi = ci(al)
    rate_lo, rate_hi = ci(rate)
    pos_lo, pos_hi = ci(pos)
    total_drafts = walked.num_drafts.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        point_pos = walked.accepted_per_pos.sum(axis=0) / total_drafts[:, None]
        point_rate = walked.num_accepted_tokens.sum(axis=0) / walked.num_draft_tokens.sum(axis=0)
    nan_past_k = np.where(valid_pos, 1.0, np.nan)
    return BootstrapCI(
        ks=walked.ks,
        level=level,
        n_resamples=n_resamples,
        seed=seed,
        mean_acceptance_length=walked.mean_acceptance_length(),
        mean_acceptance_length_low=al_lo,
        mean_acceptance_length_high=al_hi,
        acceptance_rate=point_rate,
        acceptance_rate_low=rate_lo,
        acceptance_rate_high=rate_hi,
        per_position_rate=point_pos * nan_past_k,
        per_position_rate_low=pos_lo * nan_past_k,
        per_position_rate_high=pos_hi * nan_past_k,
    )

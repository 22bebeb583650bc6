"""vLLM's ngram prompt-lookup proposer, simulated exactly on token sequences, and its walk.

What vLLM 0.32 does (``vllm/v1/spec_decode/ngram_proposer.py``):

- The context is the prompt plus every response token so far (``token_ids_cpu[:num_tokens_no_spec]``).
  ``_find_longest_matched_ngram_and_propose_tokens`` finds the *longest* n in
  ``[prompt_lookup_min, prompt_lookup_max]`` such that the context's last n tokens occur earlier
  in the context (the occurrence may overlap the suffix but must end before the last token);
  among occurrences of that longest n-gram the *earliest* one wins (the KMP scan over the
  reversed context keeps the last hit, ``if prev_lps >= longest_ngram``, line 263). It proposes
  the tokens that followed that occurrence: ``min(k, tokens left before the end of the
  context)`` of them (line 294), so a proposal can be shorter than k. No match, or a context
  shorter than ``prompt_lookup_min``, proposes nothing; such a step is not a draft in vLLM's
  counters (``scheduler.py:2969``).
- ``k`` is first cut to ``max_model_len - len(context)`` (line 228); the scheduler then schedules
  at most ``max_model_len - len(context) - 1`` spec tokens (``scheduler.py:714``: positions may
  not exceed ``max_model_len``). Contexts at ``max_model_len`` are skipped (line 159).
- Defaults: both bounds 5 when neither is given; one given sets the other
  (``vllm/config/speculative.py:1197``).

Acceptance of a proposed token: at temperature 0 iff it equals the target's token (exact). At
temperature > 0 the proposal is one-hot (no draft probabilities), so it is accepted with
probability ``p_t(token)`` and a rejection never emits it; given the emitted response the walk
is therefore again deterministic — accepted iff it equals ``y_t`` — which is the ``conditional``
estimator (exact, default). The ``marginal`` estimator uses ``p_t(token)`` from the target's
top-K logprobs along the response (bounds when the token is not listed); see
:mod:`draftfit.acceptance` for why it is only approximate.

Suffix decoding (``method="suffix"``) is simulated with arctic-inference's own trees in
:mod:`draftfit.suffix`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from draftfit.acceptance import (
    ESTIMATORS,
    Estimator,
    TopLogprobs,
    WalkBounds,
    _as_ks,
    _dist,
    expected_walk,
)
from draftfit.errors import DraftfitError

DEFAULT_LOOKUP = 5


def ngram_match_starts(tokens: np.ndarray | Sequence[int], min_n: int, max_n: int) -> np.ndarray:
    """For every context ``tokens[:c]`` (c = 0..len), where vLLM's proposal starts, or -1.

    Vectorized: for each n the n-grams of the whole sequence are grouped (``np.unique``) and
    each one's first occurrence is the earliest match of that suffix in every prefix that
    contains it (first occurrences never lie in the future). O(len · (max_n - min_n + 1) · log).
    """
    _check_lookup(min_n, max_n)
    seq = np.ascontiguousarray(np.asarray(tokens).reshape(-1))
    length = seq.shape[0]
    starts = np.full(length + 1, -1, dtype=np.int64)
    for n in range(max_n, min_n - 1, -1):
        if length < n + 1:
            continue
        grams = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(seq, n))
        keys = grams.view(np.dtype((np.void, grams.dtype.itemsize * n))).ravel()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        rows = np.arange(grams.shape[0])
        first_row = first[inverse.reshape(-1)]
        context = rows + n  # the n-gram at row r is the suffix of tokens[:r + n]
        hit = (first_row < rows) & (starts[context] < 0)
        starts[context[hit]] = first_row[hit] + n
    return starts


def ngram_propose(
    context: np.ndarray | Sequence[int],
    k: int,
    min_n: int = DEFAULT_LOOKUP,
    max_n: int = DEFAULT_LOOKUP,
    max_model_len: int | None = None,
) -> np.ndarray:
    """The proposal vLLM's proposer makes for one context (same result as
    ``_find_longest_matched_ngram_and_propose_tokens``)."""
    ctx = np.asarray(context).reshape(-1)
    c = ctx.shape[0]
    if max_model_len is not None:
        k = min(k, max_model_len - c)
    if k <= 0 or c < min_n:
        return ctx[:0]
    start = ngram_match_starts(ctx, min_n, max_n)[c]
    if start < 0:
        return ctx[:0]
    return ctx[start : start + min(k, c - start)]


def _check_lookup(min_n: int, max_n: int) -> None:
    if not 1 <= min_n <= max_n:
        raise DraftfitError(
            f"prompt_lookup_min={min_n}, prompt_lookup_max={max_n}",
            fix="Use 1 ≤ prompt_lookup_min ≤ prompt_lookup_max (vLLM's rule).",
        )


def ngram_walk(
    sequences: Sequence[np.ndarray | Sequence[int]],
    prompt_lens: Sequence[int] | np.ndarray,
    ks: Sequence[int] | np.ndarray | int = tuple(range(1, 9)),
    *,
    min_n: int = DEFAULT_LOOKUP,
    max_n: int = DEFAULT_LOOKUP,
    n_tokens: Sequence[int] | np.ndarray | None = None,
    max_model_len: int | None = None,
    estimator: Estimator = "conditional",
    target: Sequence[TopLogprobs] | None = None,
) -> WalkBounds:
    """Expected vLLM counters of ngram speculation along target responses, for every k at once.

    ``sequences[b]``: prompt token ids followed by the target's response ids; ``prompt_lens[b]``
    splits them. ``n_tokens[b]``: where the request stopped (default: the whole response; tokens
    past it are look-ahead data for the drafts the last step counts). ``target[b]``: the target's
    top-K logprobs along response b (``[T, K]``), needed for ``estimator="marginal"``.
    Acceptance beyond the data is rejected in the lower walk and accepted in the upper walk.
    """
    if estimator not in ESTIMATORS:
        raise DraftfitError(f"unknown estimator {estimator!r}", fix=f"Use one of: {', '.join(ESTIMATORS)}.")
    if estimator == "marginal" and target is None:
        raise ValueError("the marginal estimator needs the target's top-K logprobs")
    _check_lookup(min_n, max_n)
    ks = _as_ks(ks)
    kmax = int(ks.max())
    seqs = [np.asarray(s).reshape(-1) for s in sequences]
    plen = np.asarray(prompt_lens, dtype=np.int64).reshape(-1)
    if plen.shape[0] != len(seqs):
        raise ValueError(f"{plen.shape[0]} prompt lengths for {len(seqs)} sequences")
    resp_len = np.array([s.shape[0] for s in seqs], dtype=np.int64) - plen
    if (resp_len < 0).any():
        raise ValueError("a prompt length exceeds its sequence")
    n = resp_len.copy() if n_tokens is None else np.asarray(n_tokens, dtype=np.int64).reshape(-1)
    if n.shape != resp_len.shape or (n > resp_len).any():
        raise ValueError("n_tokens must give one length per response, within the response")
    B = len(seqs)
    S = max(int(n.max(initial=0)), 2)
    s_idx = np.arange(S)
    i_idx = np.arange(kmax)
    bounds = {"lower": np.zeros((B, S, kmax)), "upper": np.zeros((B, S, kmax))}
    n_prop = np.zeros((B, S, ks.size), dtype=np.int64)
    exact_in_data = np.ones(B, dtype=bool)
    for b, seq in enumerate(seqs):
        P, T = int(plen[b]), int(resp_len[b])
        starts = ngram_match_starts(seq, min_n, max_n)
        context = P + s_idx  # context length of a step starting at response position s
        ok = context <= seq.shape[0]
        st = np.where(ok, starts[np.minimum(context, seq.shape[0])], -1)
        avail = np.where(st >= 0, context - st, 0)
        if max_model_len is not None:
            avail = np.minimum(avail, np.maximum(max_model_len - context - 1, 0))
        n_prop[b] = np.minimum(ks[None, :], avail[:, None])
        # proposed token i of the step at s, and the response position it is checked against
        src = np.clip(st[:, None] + i_idx[None, :], 0, max(seq.shape[0] - 1, 0))
        proposed = seq[src] if seq.shape[0] else np.zeros((S, kmax), dtype=np.int64)
        pos = s_idx[:, None] + i_idx[None, :]
        has_proposal = i_idx[None, :] < avail[:, None]
        known = pos < T
        if estimator == "conditional":
            truth = seq[np.clip(P + pos, 0, max(seq.shape[0] - 1, 0))] if seq.shape[0] else proposed
            flag = (proposed == truth).astype(np.float64)
            lo = np.where(known, flag, 0.0)
            hi = np.where(known, flag, 1.0)
        else:
            assert target is not None
            lo, hi = _marginal(target[b], seq[P:], pos, proposed, known)
        bounds["lower"][b] = np.where(has_proposal, lo, 0.0)
        bounds["upper"][b] = np.where(has_proposal, hi, 0.0)
        in_data = has_proposal & (pos < n[b]) & (s_idx[:, None] >= 1) & (s_idx[:, None] < n[b])
        exact_in_data[b] = not ((lo != hi) & in_data).any()
    counts = []
    for name in ("lower", "upper"):
        C = np.concatenate([np.ones((B, S, 1)), np.cumprod(bounds[name], axis=-1)], axis=-1)
        counts.append(expected_walk(C, n_prop, n, ks))
    return WalkBounds(counts[0], counts[1], n, exact_in_data, position_based=False)


def _marginal(
    target: TopLogprobs, response: np.ndarray, pos: np.ndarray, proposed: np.ndarray, known: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of p_pos(proposed) from the target's top-K along the response (1 past the data)."""
    T = response.shape[0]
    ids = np.asarray(target.ids)
    if ids.shape[0] != T:
        raise ValueError(f"target logprobs cover {ids.shape[0]} positions, the response has {T}")
    d = _dist(target, response)
    rows = np.clip(pos, 0, max(T - 1, 0))
    if T == 0:
        return np.zeros(pos.shape), np.ones(pos.shape)
    row_ids = d.ids[rows]  # [S, kmax, K+1]
    hit = (row_ids >= 0) & (row_ids == proposed[..., None])
    listed = hit.any(axis=-1)
    lo = np.where(listed, (d.p_lo[rows] * hit).sum(axis=-1), 0.0)
    hi = np.where(listed, (d.p_hi[rows] * hit).sum(axis=-1), d.cap[rows])
    return np.where(known, lo, 0.0), np.where(known, hi, 1.0)

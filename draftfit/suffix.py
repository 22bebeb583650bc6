"""vLLM's suffix-decoding proposer, simulated exactly offline with arctic-inference's own suffix trees.

What vLLM 0.32 does (``vllm/v1/spec_decode/suffix_decoding.py``): one ``SuffixDecodingCache``
(arctic-inference) per engine, ``max_tree_depth`` and ``max_cached_requests`` from the speculative
config. Each step, for each running request: a request seen for the first time gets a prompt tree
(``start_request``); the tokens the step just emitted are appended to its response
(``add_active_response``); the proposal is ``speculate(pattern = the last max_tree_depth tokens,
max_spec_tokens = min(k, max_model_len − len − 1), max_spec_factor, min_token_prob)`` — of dynamic
length, possibly empty (then the step is no draft in vLLM's counters). A request that left the
batch is stopped, and its response joins the global tree that later requests speculate from.

The simulation replays that per request, in request order, one request at a time (vLLM at
concurrency 1: a request's response is in the global tree before the next one starts), and walks it
as vLLM verifies it: greedy, the proposal has no probabilities, so a draft is accepted iff it equals
the target's token (at temperature > 0 given the emitted response — the conditional estimator); the
emitted tokens (accepted + the target's own) are what the next step appends. It runs once per k:
the tree's proposals depend on k through ``max_spec_tokens``. Past the data (beyond the look-ahead)
a draft counts as rejected in the lower walk and accepted in the upper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from draftfit.acceptance import WalkBounds, WalkCounts, _as_ks
from draftfit.errors import DraftfitError

# vLLM 0.32's defaults (vllm/config/speculative.py)
MAX_TREE_DEPTH = 24
MAX_CACHED_REQUESTS = 10000
MAX_SPEC_FACTOR = 1.0
MIN_TOKEN_PROB = 0.1
INSTALL = "pip install arctic-inference (vLLM's suffix method needs it too)"


@dataclass(frozen=True)
class SuffixParams:
    """The speculative config's suffix-decoding parameters, as vLLM passes them to the cache."""

    max_tree_depth: int = MAX_TREE_DEPTH
    max_cached_requests: int = MAX_CACHED_REQUESTS
    max_spec_factor: float = MAX_SPEC_FACTOR
    min_token_prob: float = MIN_TOKEN_PROB


def cache_class():
    """arctic-inference's ``SuffixDecodingCache``, or a DraftfitError saying how to install it."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise DraftfitError(f"suffix decoding needs arctic-inference ({exc})", fix=f"Install it: {INSTALL}") from exc
    return SuffixDecodingCache


def suffix_walk(
    sequences: Sequence[np.ndarray],
    prompt_lens: Sequence[int],
    n_tokens: Sequence[int],
    ks: Sequence[int] | np.ndarray,
    params: SuffixParams = SuffixParams(),
    max_model_len: int | None = None,
) -> WalkBounds:
    """vLLM's counters of suffix decoding along the target's responses, per request and k."""
    ks = _as_ks(ks)
    kmax = int(ks.max())
    B = len(sequences)
    out = {side: {name: np.zeros((B, ks.size)) for name in ("drafts", "tokens", "accepted")} for side in ("lower", "upper")}
    per_pos = {side: np.zeros((B, ks.size, kmax)) for side in ("lower", "upper")}
    for i, k in enumerate(ks):
        for side in ("lower", "upper"):
            cache = cache_class()(max_tree_depth=params.max_tree_depth, max_cached_requests=params.max_cached_requests)
            for b, seq in enumerate(sequences):
                d, t, a, pos = _request(cache, b, np.asarray(seq), int(prompt_lens[b]), int(n_tokens[b]), int(k),
                                        params, max_model_len, accept_unknown=side == "upper")
                out[side]["drafts"][b, i], out[side]["tokens"][b, i], out[side]["accepted"][b, i] = d, t, a
                per_pos[side][b, i, : len(pos)] = pos
    counts = [WalkCounts(ks, out[s]["drafts"], out[s]["tokens"], out[s]["accepted"], per_pos[s]) for s in ("lower", "upper")]
    return WalkBounds(counts[0], counts[1], np.asarray(n_tokens, dtype=np.int64), np.ones(B, dtype=bool), position_based=False)


def _request(cache, req_id: int, seq: np.ndarray, P: int, n_stop: int, k: int, params: SuffixParams,
             max_model_len: int | None, *, accept_unknown: bool):
    """One request through the cache: (drafts, draft tokens, accepted tokens, accepted per position)."""
    response = seq[P:]
    T = response.shape[0]
    if n_stop > T:
        raise DraftfitError(f"request {req_id} stops at {n_stop} tokens, its answer has {T}",
                            fix="Generate the answers at least as long as the stop")
    cache.start_request(req_id, seq[:P].tolist())
    drafts = tokens = accepted = 0
    per_pos = np.zeros(k)
    n = 1  # the prefill emitted the first response token
    emitted = response[:1].tolist()
    while True:
        cache.add_active_response(req_id, emitted)
        if n >= n_stop:
            break  # finished: the step that ended it proposed nothing vLLM schedules
        num_tokens = P + n
        limit = k if max_model_len is None else min(k, int(max_model_len) - num_tokens - 1)
        proposal: list[int] = []
        if limit > 0 and (max_model_len is None or num_tokens < max_model_len):
            context = np.concatenate([seq[:P], response[:n]])
            pattern = context[max(0, num_tokens - params.max_tree_depth):].tolist()
            proposal = list(cache.speculate(req_id, pattern, max_spec_tokens=limit, max_spec_factor=params.max_spec_factor,
                                            min_token_prob=params.min_token_prob).token_ids)
        a = 0
        while a < len(proposal):
            if n + a < T:
                if proposal[a] != response[n + a]:
                    break
            elif not accept_unknown:
                break
            a += 1
        if proposal:
            drafts += 1
            tokens += len(proposal)
            accepted += a
            per_pos[:a] += 1
        # the target's own token closes the step (past the data the walk can only assume one)
        emitted = response[n : min(n + a + 1, T)].tolist() or [int(proposal[a - 1]) if a else 0]
        n += a + 1
    cache.stop_request(req_id)
    return drafts, tokens, accepted, per_pos

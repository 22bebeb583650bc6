"""ngram prompt lookup: the proposer against vLLM's own code and a literal reimplementation, and
its walk against the engine's algorithm run step by step."""

from __future__ import annotations

import functools
import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftfit.acceptance import TopLogprobs
from draftfit.errors import DraftfitError
from draftfit.ngram import ngram_match_starts, ngram_propose, ngram_walk


def reference_propose(ctx, k, min_n, max_n, max_model_len=None):
    """vLLM's rule written from its description: the longest n in [min_n, max_n] whose suffix
    n-gram occurs earlier (ending before the last token); its earliest occurrence; the tokens
    after it, at most k and at most up to the end of the context."""
    ctx = list(ctx)
    c = len(ctx)
    if max_model_len is not None:
        k = min(k, max_model_len - c)
    if k <= 0 or c < min_n:
        return []
    for n in range(min(max_n, c - 1), min_n - 1, -1):
        suffix = ctx[c - n :]
        for j in range(c - n):
            if ctx[j : j + n] == suffix:
                start = j + n
                return ctx[start : start + min(k, c - start)]
    return []


# (context, k, min_n, max_n, max_model_len) -> proposal
KNOWN = [
    ([1, 2, 3, 1, 2], 3, 2, 3, None, [3, 1, 2]),
    ([1, 2, 3, 1, 2], 5, 2, 3, None, [3, 1, 2]),  # fewer than k tokens left after the match
    ([6, 7, 1, 5, 6, 7, 2, 5, 6, 7], 3, 1, 3, None, [2, 5, 6]),  # the longest n wins
    ([1, 2, 9, 1, 2, 8, 1, 2], 3, 2, 2, None, [9, 1, 2]),  # the earliest occurrence wins
    ([4, 4, 4], 3, 1, 2, None, [4]),  # the match may overlap the suffix
    ([1, 2, 3, 4, 1, 2, 3, 4], 3, 1, 2, None, [1, 2, 3]),  # n capped at max_n
    ([1, 2, 3], 3, 1, 2, None, []),  # no match
    ([1, 1], 3, 3, 4, None, []),  # context shorter than min_n
    ([1, 2, 1, 2, 1, 2], 4, 2, 2, 8, [1, 2]),  # k cut to max_model_len - len(context)
    ([1, 2, 1, 2, 1, 2], 4, 2, 2, 6, []),  # at max_model_len: nothing
    ([], 3, 1, 1, None, []),
]


@pytest.mark.parametrize(("ctx", "k", "min_n", "max_n", "mml", "expected"), KNOWN)
def test_known_proposals(ctx, k, min_n, max_n, mml, expected):
    assert ngram_propose(np.array(ctx, dtype=np.int64), k, min_n, max_n, mml).tolist() == expected
    assert reference_propose(ctx, k, min_n, max_n, mml) == expected


def test_invalid_lookup_bounds():
    with pytest.raises(DraftfitError, match="prompt_lookup_min"):
        ngram_match_starts([1, 2, 3], 3, 2)


def _sequence(rng, length, vocab, repetitive):
    if not repetitive:
        return rng.integers(0, vocab, size=length)
    base = rng.integers(0, vocab, size=int(rng.integers(1, 7)))
    seq = np.tile(base, length // base.size + 1)[:length]
    noise = rng.random(length) < 0.15
    return np.where(noise, rng.integers(0, vocab, size=length), seq)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(0, 70),
    vocab=st.integers(1, 6),
    repetitive=st.booleans(),
    min_n=st.integers(1, 4),
    extra=st.integers(0, 3),
    k=st.integers(1, 8),
)
def test_proposer_equals_the_literal_definition(seed, length, vocab, repetitive, min_n, extra, k):
    seq = _sequence(np.random.default_rng(seed), length, vocab, repetitive)
    starts = ngram_match_starts(seq, min_n, min_n + extra)
    for c in range(length + 1):
        expected = reference_propose(seq[:c].tolist(), k, min_n, min_n + extra)
        got = seq[starts[c] : starts[c] + min(k, c - starts[c])].tolist() if starts[c] >= 0 else []
        assert got == expected


# vLLM's own function runs in a child process, where numba compiles it: these tests need no engine
# and their process no JIT
_VLLM_FIND = """
import json, sys
import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as find
print(json.dumps([find(np.array(c, dtype=np.int32), lo, hi, mml, k).tolist() for c, lo, hi, mml, k in json.load(sys.stdin)]))
"""


def vllm_find_all(cases):
    """vLLM's own function on every ``(context, min_n, max_n, max_model_len, k)``, in a child process."""
    import subprocess
    import sys

    pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
    out = subprocess.run([sys.executable, "-c", _VLLM_FIND], input=json.dumps(cases), capture_output=True, text=True,
                         check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # imports vLLM (and torch)
def test_proposer_equals_vllms_own_function():
    cases, ours = [], []
    for repetitive in (False, True):
        rng = np.random.default_rng(int(repetitive))
        for _ in range(60):
            length = int(rng.integers(1, 80))
            seq = _sequence(rng, length, int(rng.integers(2, 6)), repetitive).astype(np.int32)
            min_n = int(rng.integers(1, 4))
            max_n = min_n + int(rng.integers(0, 4))
            k = int(rng.integers(1, 8))
            mml = int(rng.integers(length // 2 + 1, length + 10))
            for c in range(length + 1):
                cases.append((seq[:c].tolist(), min_n, max_n, mml, k))
                ours.append(ngram_propose(seq[:c], k, min_n, max_n, mml).tolist())
    known = [(ctx, min_n, max_n, mml or 10**6, k) for ctx, k, min_n, max_n, mml, _ in KNOWN]
    theirs = vllm_find_all(cases + known)
    assert len(cases) > 2000
    for case, mine, vllms in zip(cases, ours, theirs[: len(cases)], strict=True):
        assert mine == vllms, case
    assert theirs[len(cases):] == [expected for *_, expected in KNOWN]


# ----------------------------------------------------------------- the walk at temperature 0
def engine_counts(seq, prompt_len, n_stop, k, min_n, max_n, max_model_len=None):
    """vLLM's loop: the proposer on the context, the scheduler's clip at max_model_len, greedy
    verification against the target's tokens, counting before the stop check."""
    seq = list(seq)
    drafts = draft_tokens = accepted = 0
    per_pos = np.zeros(k, dtype=np.int64)
    s = 1  # response tokens so far (the first came from the prefill)
    while s < n_stop:
        ctx = seq[: prompt_len + s]
        proposal = reference_propose(ctx, k, min_n, max_n, max_model_len)
        if max_model_len is not None:
            proposal = proposal[: max(0, max_model_len - len(ctx) - 1)]
        if not proposal:
            s += 1
            continue
        a = 0
        while a < len(proposal):
            assert prompt_len + s + a < len(seq), "test data too short"
            if proposal[a] != seq[prompt_len + s + a]:
                break
            a += 1
        drafts += 1
        draft_tokens += len(proposal)
        accepted += a
        per_pos[:a] += 1
        s += a + 1
    return drafts, draft_tokens, accepted, per_pos


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("min_n", "max_n"), [(1, 1), (2, 4), (3, 3), (5, 5)])
def test_greedy_ngram_walk_equals_the_engine_loop(seed, min_n, max_n):
    rng = np.random.default_rng(seed)
    ks = list(range(1, 7))
    seqs, plens, stops = [], [], []
    for b in range(5):
        plen = int(rng.integers(0, 40))
        n_stop = int(rng.integers(1, 60))
        seqs.append(_sequence(rng, plen + n_stop + max(ks), 4, repetitive=b % 2 == 0))
        plens.append(plen)
        stops.append(n_stop)
    w = ngram_walk(seqs, plens, ks, min_n=min_n, max_n=max_n, n_tokens=stops)
    assert w.exact
    for b in range(5):
        for k in ks:
            drafts, draft_tokens, accepted, per_pos = engine_counts(seqs[b], plens[b], stops[b], k, min_n, max_n)
            got = w.lower.counts(k, prompts=[b])
            assert (got.num_drafts, got.num_draft_tokens, got.num_accepted_tokens) == (
                drafts, draft_tokens, accepted,
            )
            np.testing.assert_array_equal(got.accepted_per_pos, per_pos)


@pytest.mark.parametrize("seed", range(4))
def test_ngram_walk_clips_at_max_model_len_like_the_scheduler(seed):
    rng = np.random.default_rng(seed)
    ks = [1, 3, 5]
    plen, n_stop = 10, 30
    seq = _sequence(rng, plen + n_stop + max(ks), 3, repetitive=True)
    mml = plen + n_stop + 2
    w = ngram_walk([seq], [plen], ks, min_n=1, max_n=3, n_tokens=[n_stop], max_model_len=mml)
    for k in ks:
        drafts, draft_tokens, accepted, _ = engine_counts(seq, plen, n_stop, k, 1, 3, mml)
        got = w.lower.counts(k)
        assert (got.num_drafts, got.num_draft_tokens, got.num_accepted_tokens) == (drafts, draft_tokens, accepted)


def test_ngram_walk_without_look_ahead_brackets_the_exact_counts():
    rng = np.random.default_rng(5)
    ks = [2, 4, 8]
    seqs = [_sequence(rng, 60, 3, repetitive=True) for _ in range(4)]
    exact = ngram_walk(seqs, [20] * 4, ks, min_n=2, max_n=3, n_tokens=[30] * 4)
    cut = ngram_walk([s[:50] for s in seqs], [20] * 4, ks, min_n=2, max_n=3)  # data ends at the stop
    assert exact.exact and not cut.exact
    for k in ks:
        lo, hi = cut.lower.counts(k), cut.upper.counts(k)
        ex = exact.lower.counts(k)
        assert lo.num_drafts == ex.num_drafts == hi.num_drafts
        assert lo.num_accepted_tokens <= ex.num_accepted_tokens <= hi.num_accepted_tokens


def test_no_match_steps_are_not_drafts():
    seq = np.arange(30)  # never repeats: no proposal ever
    w = ngram_walk([seq], [10], [1, 4], min_n=1, max_n=2)
    assert w.exact
    assert w.lower.counts(4).num_drafts == 0
    assert np.isnan(w.lower.counts(4).mean_acceptance_length)


# ----------------------------------------------------------------- temperature > 0
class _Target:
    """A prefix-dependent target over 3 tokens (deterministic function of the whole context)."""

    vocab = 3

    def __init__(self, seed):
        self.seed = seed

    @functools.cache  # noqa: B019 - test-local instances
    def p(self, ctx):
        z = np.random.default_rng([self.seed, len(ctx), *ctx]).normal(size=self.vocab) * 1.5
        e = np.exp(z - z.max())
        return e / e.sum()


def _engine_expectation(target, prompt, n_stop, k, min_n, max_n):
    """Exact E[drafts, draft tokens, accepted] of ngram speculation at temperature > 0: the
    one-hot proposal is accepted with p(token); a rejection samples p without it; then bonus."""
    V = target.vocab

    @functools.cache
    def from_step(resp):
        if len(resp) >= n_stop:
            return np.zeros(3)
        proposal = reference_propose(list(prompt) + list(resp), k, min_n, max_n)
        if not proposal:
            return sum(target.p(prompt + resp)[v] * from_step(resp + (v,)) for v in range(V))
        total = np.array([1.0, len(proposal), 0.0])

        def verify(r, i, weight):
            nonlocal total
            p = target.p(prompt + r)
            if i == len(proposal):
                for b in range(V):
                    total += weight * p[b] * (from_step(r + (b,)) + np.r_[0, 0, i])
                return
            d = proposal[i]
            verify(r + (d,), i + 1, weight * p[d])
            rest = p.copy()
            rest[d] = 0.0
            for v in range(V):
                if rest[v]:
                    total += weight * rest[v] * (from_step(r + (v,)) + np.r_[0, 0, i])

        verify(resp, 0, 1.0)
        return total

    first = target.p(prompt)
    return sum(first[y0] * from_step((y0,)) for y0 in range(V))


@pytest.mark.parametrize("seed", [1, 2])
def test_ngram_walk_at_temperature_equals_the_engines_exact_expectation(seed):
    target = _Target(seed)
    prompt = (0, 1, 2, 0, 1)
    ks, n_stop, min_n, max_n = [1, 2, 3], 5, 1, 2
    seqs, probs = [], []
    for resp in itertools.product(range(3), repeat=n_stop + max(ks)):
        pr = np.prod([target.p(prompt + resp[:t])[resp[t]] for t in range(len(resp))])
        seqs.append(np.array(prompt + resp))
        probs.append(pr)
    probs = np.array(probs)
    w = ngram_walk(seqs, [len(prompt)] * len(seqs), ks, min_n=min_n, max_n=max_n, n_tokens=[n_stop] * len(seqs))
    assert w.exact
    for i, k in enumerate(ks):
        walked = np.r_[
            probs @ w.lower.num_drafts[:, i],
            probs @ w.lower.num_draft_tokens[:, i],
            probs @ w.lower.num_accepted_tokens[:, i],
        ]
        np.testing.assert_allclose(walked, _engine_expectation(target, prompt, n_stop, k, min_n, max_n), rtol=1e-10)


def _onehot_topk(tokens, vocab, K=None):
    T = len(tokens)
    P = np.full((T, vocab), 1e-12)
    P[np.arange(T), tokens] = 1.0
    P /= P.sum(-1, keepdims=True)
    order = np.argsort(-P, axis=-1, kind="stable")[:, : K or vocab]
    return P, TopLogprobs(order, np.log(np.take_along_axis(P, order, axis=-1)), vocab_size=vocab)


def test_marginal_with_a_nearly_one_hot_target_matches_the_conditional_walk():
    rng = np.random.default_rng(0)
    ks = [1, 3, 5]
    seqs = [_sequence(rng, 70, 4, repetitive=True) for _ in range(3)]
    targets = [_onehot_topk(s[20:], 4)[1] for s in seqs]
    cond = ngram_walk(seqs, [20] * 3, ks, min_n=1, max_n=3, n_tokens=[44] * 3)
    marg = ngram_walk(seqs, [20] * 3, ks, min_n=1, max_n=3, n_tokens=[44] * 3, estimator="marginal", target=targets)
    for k in ks:
        assert marg.lower.counts(k).isclose(cond.lower.counts(k), rtol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_marginal_bounds_from_truncated_top_k_bracket_full_vocabulary(seed):
    rng = np.random.default_rng(seed)
    V, ks = 6, [2, 4]
    seqs, full, cut = [], [], []
    for _ in range(3):
        seq = _sequence(rng, 50, V, repetitive=True)
        P = rng.dirichlet(np.full(V, 0.5), size=30)
        seqs.append(seq)
        full.append(TopLogprobs(np.tile(np.arange(V), (30, 1)), np.log(P), vocab_size=V))
        order = np.argsort(-P, axis=-1)[:, :2]
        cut.append(TopLogprobs(order, np.log(np.take_along_axis(P, order, axis=-1))))
    exact = ngram_walk(seqs, [20] * 3, ks, min_n=1, max_n=2, estimator="marginal", target=full, n_tokens=[25] * 3)
    bounds = ngram_walk(seqs, [20] * 3, ks, min_n=1, max_n=2, estimator="marginal", target=cut, n_tokens=[25] * 3)
    for k in ks:
        for ex_table, name in ((exact.lower, "lower"), (exact.upper, "upper")):
            lo = bounds.lower.counts(k).num_accepted_tokens
            hi = bounds.upper.counts(k).num_accepted_tokens
            assert lo - 1e-9 <= ex_table.counts(k).num_accepted_tokens <= hi + 1e-9, name


def test_marginal_needs_the_target():
    with pytest.raises(ValueError, match="target"):
        ngram_walk([np.arange(10)], [5], [2], estimator="marginal")

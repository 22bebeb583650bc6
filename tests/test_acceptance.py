"""Acceptance and the walk, against known answers and against speculative decoding actually run.

The reference runner below re-implements vLLM V1's verification step from its source
(``rejection_greedy_sample_kernel``, ``rejection_random_sample_kernel``,
``sample_recovered_tokens_kernel``; counting in ``scheduler.py`` before the stop check) on
synthetic target/draft distributions that depend on the whole prefix.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftfit.acceptance import (
    Interval,
    TopLogprobs,
    acceptance_given_token,
    acceptance_probs,
    bootstrap,
    position_acceptance,
    segments,
    select_rule,
    walk,
)
from draftfit.errors import DraftfitError

# ----------------------------------------------------------------- synthetic models


class Synthetic:
    """A target p and a draft q over a small vocabulary, deterministic functions of the prefix."""

    def __init__(self, vocab: int, seed: int, sharpness: float = 2.0, draft_noise: float = 1.0,
                 prefix_matters: bool = True):
        self.vocab = vocab
        self.seed = seed
        self.sharpness = sharpness
        self.draft_noise = draft_noise
        self.prefix_matters = prefix_matters

    @functools.cache  # noqa: B019 - test-local instances
    def _pair(self, prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        key = [self.seed, len(prefix), *prefix] if self.prefix_matters else [self.seed, len(prefix)]
        rng = np.random.default_rng(key)
        z = rng.normal(size=self.vocab) * self.sharpness
        noise = rng.normal(size=self.vocab) * self.draft_noise
        return _softmax(z), _softmax(z + noise)

    def p(self, prefix) -> np.ndarray:
        return self._pair(tuple(prefix))[0]

    def q(self, prefix) -> np.ndarray:
        return self._pair(tuple(prefix))[1]


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _sample(dist: np.ndarray, rng: np.random.Generator) -> int:
    return int(min(np.searchsorted(np.cumsum(dist), rng.random() * dist.sum(), side="right"), dist.size - 1))


def run_speculative(model, rule: str, k: int, n_stop: int, rng, eos: int | None = None):
    """One request through vLLM's algorithm: returns (drafts, draft tokens, accepted, per-pos, output)."""
    greedy_target = rule == "greedy"
    out = [int(np.argmax(model.p(()))) if greedy_target else _sample(model.p(()), rng)]  # prefill
    drafts = draft_tokens = accepted_total = 0
    per_pos = np.zeros(k, dtype=np.int64)
    stopped = len(out) >= n_stop or out[-1] == eos
    while not stopped:
        ctx = list(out)
        proposal = []
        for _ in range(k):
            q = model.q(ctx)
            d = _sample(q, rng) if rule == "probabilistic" else int(np.argmax(q))
            proposal.append((d, q))
            ctx.append(d)
        ctx = list(out)
        generated = []
        for d, q in proposal:
            p = model.p(ctx)
            if greedy_target:
                ok, tok = d == int(np.argmax(p)), int(np.argmax(p))
            else:
                u = rng.random()
                draft_prob = 1.0 if rule == "greedy-draft" else q[d]
                ok = draft_prob > 0 and p[d] / draft_prob >= u
                if ok:
                    tok = d
                else:
                    residual = p.copy()
                    if rule == "greedy-draft":
                        residual[d] = 0.0
                    else:
                        residual = np.maximum(p - q, 0.0)
                    tok = _sample(residual, rng)
            generated.append(tok)
            ctx.append(tok)
            if not ok:
                break
        else:
            p = model.p(ctx)
            generated.append(int(np.argmax(p)) if greedy_target else _sample(p, rng))  # bonus
        n_acc = len(generated) - 1  # scheduler.py: counted before the stop check
        drafts += 1
        draft_tokens += k
        accepted_total += n_acc
        per_pos[:n_acc] += 1
        for tok in generated:
            out.append(tok)
            if len(out) >= n_stop or tok == eos:
                stopped = True
                break
    return drafts, draft_tokens, accepted_total, per_pos, out


def full_topk(dists: np.ndarray) -> TopLogprobs:
    """Full-vocabulary 'top-K' rows (the transformers backend case)."""
    T, V = dists.shape
    with np.errstate(divide="ignore"):
        return TopLogprobs(np.tile(np.arange(V), (T, 1)), np.log(dists), vocab_size=V)


def truncated_topk(dists: np.ndarray, K: int, tokens: np.ndarray | None = None) -> TopLogprobs:
    """The top-K rows vLLM returns, plus the response token's logprob when ``tokens`` is given."""
    order = np.argsort(-dists, axis=-1, kind="stable")[..., :K]
    lp = np.log(np.take_along_axis(dists, order, axis=-1))
    tok_lp = None if tokens is None else np.log(np.take_along_axis(dists, tokens[..., None], axis=-1)[..., 0])
    return TopLogprobs(order, lp, token_logprob=tok_lp)


def trajectory_dists(model, y):
    P = np.stack([model.p(y[:t]) for t in range(len(y))])
    Q = np.stack([model.q(y[:t]) for t in range(len(y))])
    return P, Q


# ----------------------------------------------------------------- rule selection
@pytest.mark.parametrize(
    ("temperature", "method", "override", "rule"),
    [
        (0.0, "greedy", None, "greedy"),
        (0.0, "probabilistic", None, "greedy"),
        (5e-6, "probabilistic", None, "greedy"),  # vLLM: temperature < 1e-5 is greedy
        (0.7, "greedy", None, "greedy-draft"),
        (0.7, "probabilistic", None, "probabilistic"),
        (0.7, "greedy", "probabilistic", "probabilistic"),
        (0.0, "greedy", "greedy-draft", "greedy-draft"),
    ],
)
def test_select_rule(temperature, method, override, rule):
    assert select_rule(temperature, method, override) == rule


@pytest.mark.parametrize(("method", "override"), [("beam", None), ("greedy", "typical")])
def test_select_rule_rejects_unknown_names(method, override):
    with pytest.raises(DraftfitError):
        select_rule(0.5, method, override)


# ----------------------------------------------------------------- per-position acceptance
def _exact(rule, estimator, P, Q, y):
    t = np.arange(len(y))
    d = Q.argmax(axis=-1)
    if rule == "greedy" or (estimator == "conditional" and rule == "greedy-draft"):
        return (d == y).astype(float)
    if estimator == "marginal":
        return P[t, d] if rule == "greedy-draft" else np.minimum(P, Q).sum(axis=-1)
    return np.minimum(1.0, Q[t, y] / P[t, y])


HAND = [
    # p, q, y -> marginal α, conditional β  (greedy-draft, probabilistic)
    ([0.6, 0.3, 0.1], [0.5, 0.1, 0.4], 0, (0.6, 1.0), (0.5 + 0.1 + 0.1, 0.5 / 0.6)),
    ([0.6, 0.3, 0.1], [0.5, 0.1, 0.4], 1, (0.6, 0.0), (0.7, 0.1 / 0.3)),
    ([0.2, 0.7, 0.1], [0.9, 0.05, 0.05], 2, (0.2, 0.0), (0.2 + 0.05 + 0.05, 0.5)),
]


@pytest.mark.parametrize(("p", "q", "y", "greedy_draft", "probabilistic"), HAND)
def test_hand_computed_acceptance(p, q, y, greedy_draft, probabilistic):
    P, Q, Y = np.array([p]), np.array([q]), np.array([y])
    target, draft = full_topk(P), full_topk(Q)
    for rule, (alpha, beta) in (("greedy-draft", greedy_draft), ("probabilistic", probabilistic)):
        a = acceptance_probs(rule, Y, draft=draft, target=target)
        b = acceptance_given_token(rule, Y, draft=draft, target=target)
        assert a.exact and b.exact
        assert a.lower[0] == pytest.approx(alpha)
        assert b.lower[0] == pytest.approx(beta)
    g = acceptance_probs("greedy", Y, draft=draft)
    assert g.lower[0] == float(np.argmax(q) == y)


@pytest.mark.parametrize("rule", ["greedy", "greedy-draft", "probabilistic"])
@pytest.mark.parametrize("estimator", ["marginal", "conditional"])
def test_full_vocabulary_is_exact(rule, estimator):
    rng = np.random.default_rng(7)
    P = rng.dirichlet(np.full(12, 0.3), size=(4, 50))
    Q = rng.dirichlet(np.full(12, 0.3), size=(4, 50))
    y = np.array([[_sample(P[b, t], rng) for t in range(50)] for b in range(4)])
    got = position_acceptance(rule, y, draft=full_topk_nd(Q), target=full_topk_nd(P), estimator=estimator)
    assert got.exact
    expected = np.stack([_exact(rule, estimator, P[b], Q[b], y[b]) for b in range(4)])
    np.testing.assert_allclose(got.lower, expected, rtol=1e-12, atol=1e-12)


def full_topk_nd(D: np.ndarray) -> TopLogprobs:
    V = D.shape[-1]
    with np.errstate(divide="ignore"):
        return TopLogprobs(np.broadcast_to(np.arange(V), D.shape).copy(), np.log(D), vocab_size=V)


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 40),
    k_frac=st.floats(0.0, 1.0),
    token_logprob=st.booleans(),
    concentration=st.sampled_from([0.05, 0.3, 1.0, 5.0]),
)
def test_truncated_top_k_bounds_bracket_the_exact_value(seed, vocab, k_frac, token_logprob, concentration):
    rng = np.random.default_rng(seed)
    K = 1 + int(k_frac * (vocab - 1))
    T = 30
    P = rng.dirichlet(np.full(vocab, concentration), size=T)
    Q = rng.dirichlet(np.full(vocab, concentration), size=T)
    P = np.maximum(P, 1e-300) / np.maximum(P, 1e-300).sum(-1, keepdims=True)
    Q = np.maximum(Q, 1e-300) / np.maximum(Q, 1e-300).sum(-1, keepdims=True)
    y = np.array([_sample(P[t], rng) for t in range(T)])
    target = truncated_topk(P, K, y if token_logprob else None)
    draft = truncated_topk(Q, K, y if token_logprob else None)
    for rule in ("greedy", "greedy-draft", "probabilistic"):
        for estimator in ("marginal", "conditional"):
            got = position_acceptance(rule, y, draft=draft, target=target, estimator=estimator)
            exact = _exact(rule, estimator, P, Q, y)
            assert (got.lower <= exact + 1e-9).all(), (rule, estimator)
            assert (exact <= got.upper + 1e-9).all(), (rule, estimator)
            assert ((got.lower >= 0) & (got.upper <= 1 + 1e-12)).all()
            if rule == "greedy" or (estimator == "conditional" and rule == "greedy-draft"):
                assert got.exact  # argmax q and y are always known
            if estimator == "conditional" and token_logprob:
                np.testing.assert_allclose(got.lower, got.upper, atol=1e-12)  # exact from top-K + token


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 60),
    k_frac=st.floats(0.0, 1.0),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.5, 3.0]),
    know_vocab=st.booleans(),
    token_logprob=st.booleans(),
)
def test_raw_draft_logprobs_under_a_temperature_bracket_the_tempered_values(
    seed, vocab, k_frac, temperature, know_vocab, token_logprob
):
    """vLLM's probabilistic draft samples from softmax(logits/T) but prompt logprobs are raw."""
    rng = np.random.default_rng(seed)
    K, T = 1 + int(k_frac * (vocab - 1)), 25
    P = rng.dirichlet(np.full(vocab, 0.4), size=T)
    P = np.maximum(P, 1e-200) / np.maximum(P, 1e-200).sum(-1, keepdims=True)
    logits = rng.normal(size=(T, vocab)) * 2.5
    raw = np.exp(logits - logits.max(-1, keepdims=True))
    raw /= raw.sum(-1, keepdims=True)
    tempered = raw ** (1 / temperature)
    tempered /= tempered.sum(-1, keepdims=True)
    y = np.array([_sample(P[t], rng) for t in range(T)])
    cut = truncated_topk(raw, K, y if token_logprob else None)
    draft = TopLogprobs(cut.ids, cut.logprobs, cut.token_logprob, vocab if know_vocab else None, temperature)
    target = full_topk(P)
    for estimator in ("marginal", "conditional"):
        got = position_acceptance("probabilistic", y, draft=draft, target=target, estimator=estimator)
        exact = _exact("probabilistic", estimator, P, tempered, y)
        assert (got.lower <= exact + 1e-9).all() and (exact <= got.upper + 1e-9).all(), estimator
    if K == vocab and know_vocab:
        full = position_acceptance("probabilistic", y, draft=draft, target=target, estimator="marginal")
        np.testing.assert_allclose(full.lower, full.upper, atol=1e-12)


def test_bounds_shrink_as_k_grows_and_meet_at_full_vocabulary():
    rng = np.random.default_rng(3)
    V, T = 30, 40
    P = rng.dirichlet(np.full(V, 0.2), size=T)
    Q = rng.dirichlet(np.full(V, 0.2), size=T)
    y = np.array([_sample(P[t], rng) for t in range(T)])
    widths = []
    for K in (1, 3, 10, 30):
        target, draft = truncated_topk(P, K), truncated_topk(Q, K)
        widths.append(acceptance_probs("probabilistic", y, draft=draft, target=target).width.mean())
    assert widths == sorted(widths, reverse=True)
    assert widths[-1] < 1e-12


# ----------------------------------------------------------------- the walk: known answers
IID = [(alpha, k) for alpha in (0.0, 0.3, 0.6, 0.9, 1.0) for k in (1, 2, 3, 5, 8)]


@pytest.mark.parametrize(("alpha", "k"), IID)
def test_iid_alpha_gives_leviathans_acceptance_length(alpha, k):
    """Constant α everywhere (also past the stop): by Wald's identity E[accepted]/E[drafts] is
    exactly E[A] per step, so AL = (1-α^{k+1})/(1-α) for any response length."""
    n = 37
    w = walk(Interval.point(np.full(n + k + 1, alpha)), ks=[k], n_tokens=n)
    expected = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    counts = w.lower.counts(k)
    assert w.exact
    assert counts.mean_acceptance_length == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(counts.per_position_rate, alpha ** np.arange(1, k + 1), rtol=1e-12, atol=1e-15)
    assert counts.num_draft_tokens == pytest.approx(k * counts.num_drafts)


# (flags at positions 1.., N, k) -> (drafts, accepted, per-position) by hand from vLLM's rules
GREEDY_BY_HAND = [
    # all accepted, k=3, N=8: steps at 1 (emits 1-4) and 5 (emits 5-8: accepted past the stop count)
    ([1] * 10, 8, 3, (2, 6, [2, 2, 2])),
    # none accepted: one step per token after the prefill
    ([0] * 10, 6, 2, (5, 0, [0, 0])),
    # step at 1 accepts 2 then rejects (emits 1-3), step at 4 accepts 1 (emits 4-5), step at 6
    # accepts 3 (emits 6-9, two of them past the stop)
    ([1, 1, 0, 1, 0, 1, 1, 1, 1], 7, 3, (3, 6, [3, 2, 1])),
    # a response of one token (prefill only) has no drafts
    ([1, 1, 1], 1, 2, (0, 0, [0, 0])),
]


@pytest.mark.parametrize(("flags", "n", "k", "expected"), GREEDY_BY_HAND)
def test_greedy_walk_by_hand(flags, n, k, expected):
    alpha = np.array([0.0] + flags, dtype=float)
    w = walk(Interval.point(alpha), ks=[k], n_tokens=n)
    c = w.lower.counts(k)
    drafts, accepted, per_pos = expected
    assert (c.num_drafts, c.num_accepted_tokens) == (drafts, accepted)
    np.testing.assert_array_equal(c.accepted_per_pos, per_pos)
    assert c.num_draft_tokens == k * drafts


def test_unknown_acceptance_past_the_data_gives_bounds():
    # all accepted in the data, k=4, N=7: the step at 1 emits 1-5, the step at 6 drafts 6 (data)
    # and 7-9 (no data)
    alpha = Interval.point(np.ones(7))
    w = walk(alpha, ks=[4])
    assert not w.exact
    assert w.lower.counts(4).num_accepted_tokens == 4 + 1
    assert w.upper.counts(4).num_accepted_tokens == 4 + 4
    assert w.lower.counts(4).num_drafts == w.upper.counts(4).num_drafts == 2
    lo, hi = w.al_bounds(4)
    assert (lo, hi) == (1 + 5 / 2, 1 + 8 / 2)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("eos", [None, 0])
def test_greedy_walk_equals_brute_force_speculative_decoding(seed, eos):
    model = Synthetic(vocab=5, seed=seed, sharpness=3.0, draft_noise=1.2)
    n_stop, ks = 40, list(range(1, 7))
    # the target's greedy trajectory, continued past the stop (the engine verifies there too)
    y: list[int] = []
    while len(y) < n_stop + max(ks) + 1:
        y.append(int(np.argmax(model.p(y))))
    n = n_stop if eos is None or eos not in y[:n_stop] else y.index(eos) + 1
    P, Q = trajectory_dists(model, y)
    acc = acceptance_given_token("greedy", np.array(y), draft=full_topk(Q))
    w = walk(acc, ks=ks, n_tokens=n)
    assert w.exact
    rng = np.random.default_rng(0)
    for k in ks:
        drafts, draft_tokens, accepted, per_pos, out = run_speculative(model, "greedy", k, n_stop, rng, eos=eos)
        assert out == y[:n]
        got = w.lower.counts(k)
        assert (got.num_drafts, got.num_draft_tokens, got.num_accepted_tokens) == (drafts, draft_tokens, accepted)
        np.testing.assert_array_equal(got.accepted_per_pos, per_pos)


# ----------------------------------------------------------------- the walk vs Monte Carlo
def _enumerate(model, length, greedy=False):
    """All trajectories of ``length`` tokens with their probability under the target (the one
    argmax trajectory at temperature 0)."""
    ys, probs = [], []
    for y in itertools.product(range(model.vocab), repeat=length):
        pr = 1.0
        for t in range(length):
            p = model.p(y[:t])
            pr *= float(y[t] == int(np.argmax(p))) if greedy else p[y[t]]
        if pr:
            ys.append(y)
            probs.append(pr)
    return np.array(ys), np.array(probs)


def _expected_counts(model, rule, estimator, ks, n_stop):
    """E over target trajectories of the walk (exact, by enumeration incl. look-ahead tokens)."""
    ys, probs = _enumerate(model, n_stop + max(ks), greedy=rule == "greedy")
    PQ = [trajectory_dists(model, tuple(y)) for y in ys]
    P = np.stack([a for a, _ in PQ])
    Q = np.stack([b for _, b in PQ])
    acc = position_acceptance(rule, ys, draft=full_topk_nd(Q), target=full_topk_nd(P), estimator=estimator)
    w = walk([Interval(acc.lower[b], acc.upper[b]) for b in range(len(ys))], ks=ks, n_tokens=n_stop)
    assert w.exact
    c = w.lower
    return {
        k: (
            probs @ c.num_drafts[:, i],
            probs @ c.num_accepted_tokens[:, i],
            probs @ c.accepted_per_pos[:, i, :k],
        )
        for i, k in enumerate(c.ks)
    }


def _monte_carlo(model, rule, k, n_stop, runs, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(runs):
        drafts, _, accepted, per_pos, _ = run_speculative(model, rule, k, n_stop, rng)
        rows.append([drafts, accepted, *per_pos])
    return np.array(rows, dtype=float)


def _assert_matches(mc: np.ndarray, expected: np.ndarray, z_max: float = 4.0):
    # each column is a mean of i.i.d. runs: |mean - E| / (sd/sqrt(n)) is ~N(0,1); with ~40
    # comparisons per test, |z| < 4 keeps the family-wise false-alarm rate below 0.3%.
    mean = mc.mean(axis=0)
    se = mc.std(axis=0, ddof=1) / np.sqrt(mc.shape[0])
    z = np.abs(mean - expected) / np.maximum(se, 1e-12)
    assert (z < z_max).all(), f"MC {mean} vs DP {expected} (z={z})"


@pytest.mark.parametrize("rule", ["greedy-draft", "probabilistic"])
def test_conditional_walk_equals_monte_carlo_rejection_sampling(rule):
    """Prefix-dependent p and q: the walk on target trajectories, averaged over them, equals
    speculative decoding actually run (vLLM's acceptance test, residual and bonus sampling)."""
    model = Synthetic(vocab=3, seed=11, sharpness=1.5, draft_noise=0.8)
    ks, n_stop = [1, 2, 3], 5
    exact = _expected_counts(model, rule, "conditional", ks, n_stop)
    for k in ks:
        mc = _monte_carlo(model, rule, k, n_stop, runs=4000, seed=k)
        drafts, accepted, per_pos = exact[k]
        _assert_matches(mc, np.r_[drafts, accepted, per_pos])


def _engine_expectation(model, rule, k, n_stop):
    """E[drafts, accepted, per-pos] of the engine's algorithm, exactly: recursion over contexts,
    summing over every draft sample, acceptance outcome, recovered and bonus token."""
    V = model.vocab

    def emitted(dist):  # the emitted token's distribution (a point mass for greedy)
        if rule == "greedy":
            out = np.zeros(V)
            out[int(np.argmax(dist))] = 1.0
            return out
        return dist / dist.sum()

    @functools.cache
    def from_step(ctx):
        if len(ctx) >= n_stop:
            return np.zeros(2 + k)
        total = np.zeros(2 + k)
        total[0] = 1.0

        def verify(c, i, weight):
            nonlocal total
            if i == k:  # all accepted: bonus token
                for b, pb in enumerate(emitted(model.p(c))):
                    if pb:
                        tail = from_step(c + (b,))
                        total += weight * pb * (tail + np.r_[0, k, np.ones(k)])
                return
            q, p = model.q(c), model.p(c)
            proposals = [(int(np.argmax(q)), 1.0)] if rule != "probabilistic" else list(enumerate(q))
            for d, pd in proposals:
                if not pd:
                    continue
                if rule == "greedy":
                    acc = float(d == int(np.argmax(p)))
                    residual = p
                elif rule == "greedy-draft":
                    acc = p[d]
                    residual = np.where(np.arange(V) == d, 0.0, p)
                else:
                    acc = min(1.0, p[d] / q[d])
                    residual = np.maximum(p - q, 0.0)
                if acc:
                    verify(c + (d,), i + 1, weight * pd * acc)
                if acc < 1 and residual.sum() > 0:
                    for r, pr in enumerate(emitted(residual)):
                        if pr:
                            tail = from_step(c + (r,))
                            total += weight * pd * (1 - acc) * pr * (
                                tail + np.r_[0, i, np.arange(k) < i]
                            )

        verify(ctx, 0, 1.0)
        return total

    first = emitted(model.p(()))
    return sum(first[y0] * from_step((y0,)) for y0 in range(V) if first[y0])


@pytest.mark.parametrize("rule", ["greedy", "greedy-draft", "probabilistic"])
@pytest.mark.parametrize("seed", [11, 12])
def test_conditional_walk_equals_the_engines_exact_expectation(rule, seed):
    model = Synthetic(vocab=3, seed=seed, sharpness=1.5, draft_noise=0.8)
    ks, n_stop = [1, 2, 3], 5
    walked = _expected_counts(model, rule, "conditional", ks, n_stop)
    for k in ks:
        engine = _engine_expectation(model, rule, k, n_stop)
        drafts, accepted, per_pos = walked[k]
        np.testing.assert_allclose(np.r_[drafts, accepted, per_pos], engine, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rule", ["greedy-draft", "probabilistic"])
def test_marginal_walk_equals_monte_carlo_when_only_the_position_matters(rule):
    model = Synthetic(vocab=4, seed=5, sharpness=1.5, draft_noise=0.8, prefix_matters=False)
    ks, n_stop = [1, 2, 3], 6
    y = tuple([0] * (n_stop + max(ks)))  # any trajectory: α depends on the position only
    P, Q = trajectory_dists(model, y)
    acc = acceptance_probs(rule, np.array(y), draft=full_topk(Q), target=full_topk(P))
    w = walk(acc, ks=ks, n_tokens=n_stop)
    for k in ks:
        c = w.lower.counts(k)
        mc = _monte_carlo(model, rule, k, n_stop, runs=4000, seed=100 + k)
        _assert_matches(mc, np.r_[c.num_drafts, c.num_accepted_tokens, c.accepted_per_pos])


class _Fork:
    """p_1 = (½, ½), the draft guesses token 0; position 2 is certain (token 0) but the draft
    guesses it only after its own guess at 1 was right."""

    vocab = 2

    def p(self, prefix):
        return np.array([0.5, 0.5]) if len(prefix) == 1 else np.array([1.0, 0.0])

    def q(self, prefix):
        if len(prefix) == 2:
            return np.array([0.9, 0.1]) if prefix[1] == 0 else np.array([0.1, 0.9])
        return np.array([0.9, 0.1])


@pytest.mark.parametrize(
    ("estimator", "expected_accepted"),
    [("conditional", 0.5), ("marginal", 0.75)],  # the truth (by hand, and by the MC below) is 0.5
)
def test_marginal_estimator_is_biased_when_the_prefix_matters(estimator, expected_accepted):
    model = _Fork()
    exact = _expected_counts(model, "greedy-draft", estimator, [1], 3)
    drafts, accepted, _ = exact[1]
    assert drafts == pytest.approx(1.5)
    assert accepted == pytest.approx(expected_accepted)
    mc = _monte_carlo(model, "greedy-draft", 1, 3, runs=3000, seed=0)
    assert mc[:, 1].mean() == pytest.approx(0.5, abs=0.05)


# ----------------------------------------------------------------- walk bounds
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("rule", ["greedy-draft", "probabilistic"])
def test_walk_bounds_bracket_the_exact_walk_when_top_k_is_truncated(seed, rule):
    rng = np.random.default_rng(seed)
    V, K, ks = 40, 3, [1, 2, 4, 6]
    items_exact, items_bounds, lengths = [], [], []
    for _ in range(6):
        T = int(rng.integers(5, 60))
        P = rng.dirichlet(np.full(V, 0.1), size=T)
        Q = np.maximum(0.6 * P + 0.4 * rng.dirichlet(np.full(V, 0.1), size=T), 1e-300)
        y = np.array([_sample(P[t], rng) for t in range(T)])
        items_exact.append(acceptance_probs(rule, y, draft=full_topk(Q), target=full_topk(P)))
        items_bounds.append(acceptance_probs(rule, y, draft=truncated_topk(Q, K), target=truncated_topk(P, K)))
        lengths.append(int(rng.integers(1, T + 1)))
    # the "truth": exact in the data, and some fixed acceptance past it
    past = [Interval.point(np.r_[e.lower, np.full(10, 0.5)]) for e in items_exact]
    truth = walk(past, ks=ks, n_tokens=lengths).lower
    bounds = walk(items_bounds, ks=ks, n_tokens=lengths)
    assert not bounds.exact
    for i, k in enumerate(ks):
        assert (bounds.upper.num_drafts[:, i] <= truth.num_drafts[:, i] + 1e-9).all()
        assert (truth.num_drafts[:, i] <= bounds.lower.num_drafts[:, i] + 1e-9).all()
        lo, hi = bounds.al_bounds(k)
        al = truth.counts(k).mean_acceptance_length
        assert lo - 1e-9 <= al <= hi + 1e-9


# ----------------------------------------------------------------- aggregation and bootstrap
def _walked(seed=0, prompts=40):
    rng = np.random.default_rng(seed)
    items = [Interval.point(rng.random(int(rng.integers(10, 80))) < rng.uniform(0.2, 0.9)) for _ in range(prompts)]
    return walk(items, ks=[1, 2, 3, 4]).lower


def test_segments_partition_the_counts():
    w = _walked()
    labels = np.array(["short", "long"] * 20)
    parts = segments(w, labels)
    assert set(parts) == {"short", "long"}
    for k in (1, 3):
        assert parts["short"].counts(k) + parts["long"].counts(k) == w.counts(k)
    with pytest.raises(ValueError):
        segments(w, labels[:-1])


def test_bootstrap_is_seeded_and_brackets_the_point_estimate():
    w = _walked()
    a, b = bootstrap(w, n_resamples=500, seed=1), bootstrap(w, n_resamples=500, seed=1)
    np.testing.assert_array_equal(a.mean_acceptance_length_low, b.mean_acceptance_length_low)
    c = bootstrap(w, n_resamples=500, seed=2)
    assert not np.array_equal(a.mean_acceptance_length_low, c.mean_acceptance_length_low)
    assert (a.mean_acceptance_length_low <= a.mean_acceptance_length).all()
    assert (a.mean_acceptance_length <= a.mean_acceptance_length_high).all()
    assert (a.mean_acceptance_length_low < a.mean_acceptance_length_high).all()
    # a resample's AL is a ratio of sums, so it lies within the per-prompt ALs
    for i, k in enumerate(w.ks):
        prompt_al = [c.mean_acceptance_length for c in w.per_prompt(int(k)) if c.num_drafts]
        assert min(prompt_al) <= a.mean_acceptance_length_low[i] <= a.mean_acceptance_length_high[i] <= max(prompt_al)
    assert np.isnan(a.per_position_rate_low[0, 1:]).all()  # k=1 has one position
    assert a.to_dict()["ks"] == [1, 2, 3, 4]


def test_bootstrap_of_identical_prompts_has_no_spread():
    one = Interval.point(np.array([0, 1, 1, 0, 1, 1, 1, 0, 0, 1], dtype=float))
    w = walk([one] * 10, ks=[2, 3]).lower
    ci = bootstrap(w, n_resamples=200, seed=0)
    np.testing.assert_allclose(ci.mean_acceptance_length_low, ci.mean_acceptance_length_high)
    np.testing.assert_allclose(ci.mean_acceptance_length_low, w.mean_acceptance_length())


def test_bootstrap_point_is_token_weighted():
    w = _walked(seed=4)
    ci = bootstrap(w, n_resamples=100, seed=0)
    for i, k in enumerate(w.ks):
        assert ci.mean_acceptance_length[i] == pytest.approx(w.counts(int(k)).mean_acceptance_length)


def test_walk_takes_a_nan_padded_batch_like_a_list_of_responses():
    rng = np.random.default_rng(2)
    rows = [rng.random(int(n)) for n in (5, 17, 1, 30)]
    padded = np.full((4, 30), np.nan)
    for b, r in enumerate(rows):
        padded[b, : r.size] = r
    as_list = walk([Interval.point(r) for r in rows], ks=[1, 3])
    as_batch = walk(Interval.point(padded), ks=[1, 3])
    np.testing.assert_array_equal(as_list.n_tokens, [5, 17, 1, 30])
    np.testing.assert_array_equal(as_batch.n_tokens, as_list.n_tokens)
    for k in (1, 3):
        assert as_batch.lower.counts(k) == as_list.lower.counts(k)
        assert as_batch.upper.counts(k) == as_list.upper.counts(k)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_greedy_flags_with_engine_id_dtypes(dtype):
    """Engines store token ids as int32; the draft's argmax must not depend on the dtype."""
    tokens = np.array([5, 7, 9], dtype=dtype)
    ids = np.array([[5, 1], [2, 7], [9, 3]], dtype=dtype)
    logprobs = np.log(np.array([[0.6, 0.3], [0.5, 0.4], [0.9, 0.05]]))
    flags = acceptance_given_token("greedy", tokens, draft=TopLogprobs(ids, logprobs))
    assert flags.exact and flags.lower.tolist() == [1.0, 0.0, 1.0]


def test_the_upper_al_bound_never_exceeds_k_plus_one():
    """A step emits at most k + 1 tokens: the top-K bound on the tokens past the stop cannot lift
    the AL above that (a self-draft at k=3 was bounded at 4.12)."""
    from draftfit.acceptance import Interval, walk

    for n in (2, 5, 9, 13):
        bounds = walk([Interval(np.zeros(n), np.ones(n))], [1, 3, 4], [n])
        for k in (1, 3, 4):
            low, high = bounds.al_bounds(k)
            assert 1.0 <= low <= high <= k + 1 + 1e-12, (n, k, low, high)


def test_the_point_al_comes_from_the_same_walk_as_its_counters():
    """rank's point prediction is one walk (midway between the bounds' walks): its AL is the AL of
    the counters it reports."""
    from draftfit.acceptance import Interval, walk
    from draftfit.acceptance_walk import midpoint

    bounds = walk([Interval(np.full(20, 0.2), np.full(20, 0.9))], [3], [20])
    point = midpoint(bounds)
    counts = point.counts(3)
    assert counts.mean_acceptance_length == pytest.approx(1 + counts.num_accepted_tokens / counts.num_drafts)
    lo, hi = bounds.lower.counts(3).mean_acceptance_length, bounds.upper.counts(3).mean_acceptance_length
    assert lo <= counts.mean_acceptance_length <= hi

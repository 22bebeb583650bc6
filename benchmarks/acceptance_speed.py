"""Speed of the offline acceptance core: per-position acceptance + the walk for k = 1..8.

Synthetic data shaped like a real study: 500 responses of 256 tokens, top-20 logprobs from a
target and a draft over a 49,152-token vocabulary (SmolLM2's), drafts agreeing with the target
most of the time. Prints milliseconds per response for each rule and estimator, and for the
ngram walk. Run: ``python benchmarks/acceptance_speed.py [--responses 500 --tokens 256 --k 20]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from draftfit.acceptance import TopLogprobs, bootstrap, position_acceptance, walk
from draftfit.ngram import ngram_walk


def synthetic(responses: int, tokens: int, k: int, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape = (responses, tokens, k)
    # target top-K: distinct ids per row, a peaked distribution
    ids_p = rng.integers(0, vocab, size=shape)
    ids_p[..., 0] = rng.integers(0, vocab, size=shape[:2])
    logits = np.sort(rng.gumbel(size=shape) * 2.0, axis=-1)[..., ::-1]
    lp_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True) * 1.05)
    # draft: same candidates, shuffled partly, a different peak 30% of the time
    ids_q = ids_p.copy()
    swap = rng.random(shape[:2]) < 0.3
    ids_q[swap, 0], ids_q[swap, 1] = ids_p[swap, 1], ids_p[swap, 0]
    ids_q[..., k // 2 :] = rng.integers(0, vocab, size=(responses, tokens, k - k // 2))
    lp_q = lp_p + rng.normal(scale=0.3, size=shape)
    lp_q = np.sort(lp_q, axis=-1)[..., ::-1]
    lp_q -= np.log(np.exp(lp_q).sum(-1, keepdims=True) * 1.05)
    # the sampled token: usually the target's top-1
    pick = np.where(rng.random(shape[:2]) < 0.8, 0, rng.integers(0, k, size=shape[:2]))
    y = np.take_along_axis(ids_p, pick[..., None], axis=-1)[..., 0]
    y_lp = np.take_along_axis(lp_p, pick[..., None], axis=-1)[..., 0]
    target = TopLogprobs(ids_p, lp_p, token_logprob=y_lp, vocab_size=vocab)
    draft = TopLogprobs(ids_q, lp_q, token_logprob=np.full(y.shape, np.log(0.05)), vocab_size=vocab)
    return y, target, draft


def timed(fn, repeat: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=20, help="top-K logprobs per position")
    parser.add_argument("--vocab", type=int, default=49152)
    args = parser.parse_args()
    B, T = args.responses, args.tokens
    y, target, draft = synthetic(B, T, args.k, args.vocab)
    ks = list(range(1, 9))
    print(f"{B} responses x {T} tokens, top-{args.k} logprobs, k = 1..8 (best of 3)")
    print(f"{'':28}{'--- ms per response ---':>32}")
    print(f"{'rule':<15}{'estimator':<13}{'acceptance':>12}{'walk':>10}{'total':>10}   predicted AL at k=4 (bounds)")
    for rule in ("greedy", "greedy-draft", "probabilistic"):
        for estimator in ("conditional", "marginal"):
            t_acc, acc = timed(
                lambda rule=rule, estimator=estimator: position_acceptance(
                    rule, y, draft=draft, target=target, estimator=estimator
                )
            )
            t_walk, walked = timed(lambda acc=acc: walk(acc, ks=ks))
            lo, hi = walked.al_bounds(4)
            print(
                f"{rule:<15}{estimator:<13}{1e3 * t_acc / B:>12.3f}{1e3 * t_walk / B:>10.3f}"
                f"{1e3 * (t_acc + t_walk) / B:>10.3f}   [{lo:.3f}, {hi:.3f}]"
            )
    t_boot, _ = timed(lambda: bootstrap(walked.lower, n_resamples=2000, seed=0), repeat=1)
    print(f"bootstrap, 2000 resamples over {B} prompts, all k: {1e3 * t_boot:.1f} ms in total")
    rng = np.random.default_rng(1)
    seqs = []
    for _ in range(B):
        base = rng.integers(0, args.vocab, size=int(rng.integers(20, 200)))
        prompt = rng.integers(0, args.vocab, size=300)
        resp = np.where(rng.random(T) < 0.5, np.resize(base, T), rng.integers(0, args.vocab, size=T))
        seqs.append(np.concatenate([prompt, base, resp]))
    plens = [s.shape[0] - T for s in seqs]
    t_ng, _ = timed(lambda: ngram_walk(seqs, plens, ks, min_n=2, max_n=4), repeat=1)
    print(f"ngram walk (lookup 2-4, prompts of ~400 tokens): {1e3 * t_ng / B:.3f} ms/response")


if __name__ == "__main__":
    main()

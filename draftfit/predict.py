"""Glue from engine outputs to acceptance: trajectories (+ draft scores) → the walk for every k.

``predict_model_draft`` turns a draft model's one-prefill scores over the target's trajectories
into per-position acceptance under the study's rule and walks it; ``predict_ngram`` simulates
vLLM's prompt-lookup proposer on the same token sequences. Both return
:class:`draftfit.acceptance.WalkBounds` (lower and upper walks; equal when exact).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from draftfit.acceptance import Rule, TopLogprobs, WalkBounds, position_acceptance, walk
from draftfit.ngram import ngram_walk


def _target_top(trajectory) -> TopLogprobs:
    return TopLogprobs(trajectory.top_ids, trajectory.top_logprobs, token_logprob=trajectory.token_logprobs)


def predict_model_draft(
    trajset,
    scores: Sequence,
    ks: Sequence[int],
    rule: Rule,
    *,
    estimator: str = "conditional",
    vocab_size: int | None = None,
) -> WalkBounds:
    """Walk every k over the trajectories with a model draft's per-position acceptance."""
    temperature = float(trajset.sampling.temperature)
    accepts = []
    for trajectory, score in zip(trajset.trajectories, scores, strict=True):
        draft = TopLogprobs(score.top_ids, score.top_logprobs, token_logprob=score.token_logprobs,
                            vocab_size=vocab_size, temperature=temperature if rule == "probabilistic" else 1.0)
        target = None if rule == "greedy" else _target_top(trajectory)
        accepts.append(position_acceptance(rule, np.asarray(trajectory.token_ids), draft=draft, target=target,
                                           estimator=estimator))
    return walk(accepts, ks, n_tokens=[len(t) for t in trajset.trajectories])


def predict_ngram(
    trajset,
    ks: Sequence[int],
    lookup_min: int,
    lookup_max: int,
    max_model_len: int | None,
    rule: Rule,
    *,
    estimator: str = "conditional",
) -> WalkBounds:
    """Simulate vLLM's ngram prompt lookup over the trajectories and walk every k."""
    sequences, starts = trajset.sequences()
    target = None if rule == "greedy" else [_target_top(t) for t in trajset.trajectories]
    return ngram_walk(sequences, starts, ks, min_n=lookup_min, max_n=lookup_max,
                      n_tokens=[len(t) for t in trajset.trajectories], max_model_len=max_model_len,
                      estimator=estimator, target=target)

"""The head recipe's sampled softmax (a head over the target's whole vocabulary): which columns a
sequence's softmax spans, that their corrected exponentials estimate the whole normaliser, and that
the loss over columns is the loss over the vocabulary when the columns are all of it. Heads trained
together read the target's states they would read alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_fixtures import encode_prompts
from test_eagle3 import VOCAB, sequence_following, tiny_head

from draftfit.train_head import HeadRecipe, _chain_loss, _plan, _read_states, sampled_columns


def test_the_columns_are_the_ones_asked_for_and_a_draw_of_the_rest():
    gen = np.random.default_rng(0)
    frequent, seq, top = torch.arange(10), torch.tensor([50, 51, 50]), torch.tensor([[60, -1], [61, 62]])
    columns, correction = sampled_columns(100, (frequent, seq, top, None), 20, gen)
    always = set(range(10)) | {50, 51, 60, 61, 62}  # the −1 of an empty top-k slot is clamped to 0
    assert set(columns[: len(always)].tolist()) == always and not correction[: len(always)].any()
    drawn = columns[len(always):].tolist()
    assert len(drawn) == len(set(drawn)) == 20 and not set(drawn) & always
    assert torch.allclose(correction[len(always):], torch.full((20,), float(np.log(85 / 20))))
    assert sampled_columns(100, (frequent, seq, top), 85, gen) is None  # the draw would be the whole rest


def test_the_corrected_columns_estimate_the_whole_normaliser():
    """Over many draws the mean of Σ exp(logit + correction) over the columns is Σ exp over the
    vocabulary (without the correction it is far below: the rest's mass is mostly not drawn)."""
    gen = np.random.default_rng(1)
    V, frequent = 2000, torch.arange(200)
    logits = torch.as_tensor(gen.normal(size=V) * 2.0)
    logits[:200] += 3.0  # the frequent tokens carry most of the mass, as they do
    whole = float(logits.exp().sum())
    estimates, uncorrected = [], []
    for _ in range(3000):
        columns, correction = sampled_columns(V, (frequent,), 200, gen)
        estimates.append(float((logits[columns] + correction.double()).exp().sum()))
        uncorrected.append(float(logits[columns].exp().sum()))
    assert np.mean(estimates) == pytest.approx(whole, rel=0.02)
    assert np.mean(uncorrected) < 0.8 * whole


@pytest.mark.parametrize("soft", [False, True])
def test_the_loss_over_all_columns_in_any_order_is_the_vocabularys(soft):
    head = tiny_head(0, reduced=False)
    gen = np.random.default_rng(2)
    L = 16
    seq, aux = sequence_following(head, 5, L, 0.7, gen)  # an answer that follows the head now and then
    seq = torch.as_tensor(seq)
    top = None
    if soft:
        ids = torch.as_tensor(np.stack([gen.permutation(VOCAB)[:3] for _ in range(L)]))
        top = (ids, torch.softmax(torch.as_tensor(gen.normal(size=(L, 3)), dtype=torch.float32), -1))
    labels_map = torch.arange(VOCAB)
    whole = _chain_loss(head, seq, aux, 4, 3, labels_map, response_start=6, soft=top)
    permuted = torch.as_tensor(gen.permutation(VOCAB))
    sampled = _chain_loss(head, seq, aux, 4, 3, labels_map, response_start=6, soft=top,
                          sampled=(permuted, torch.zeros(VOCAB)))
    assert float(sampled[0]) == pytest.approx(float(whole[0]), rel=1e-5)
    assert whole[1].sum() > 0  # some tokens predicted right, so comparing them compares something
    np.testing.assert_array_equal(sampled[1], whole[1])


def test_heads_trained_together_read_what_each_reads_alone(smollm2_model):
    """An EAGLE-3 head and an MTP layer trained on one recipe share one prefill per sequence (the
    auxiliary layers and the last layer's output): each gets the very tensors a pass of its own
    gives, so a head trained with another is the one its cache key names."""
    seqs = [np.asarray(p + p[-6:], dtype=np.int64) for p in encode_prompts(smollm2_model)[:2]]
    starts = [len(s) - 6 for s in seqs]
    recipe = HeadRecipe(soft_top_k=4)
    plans = {method: _plan(smollm2_model, seqs, starts, recipe, method) for method in ("eagle3", "mtp")}
    said = []
    together, _ = _read_states(smollm2_model, seqs, starts, recipe, plans, said.append)
    assert len(said) == 1 and "layers [2, 15, 27, 30]" in said[0]  # one pass
    for method, plan in plans.items():
        alone, _ = _read_states(smollm2_model, seqs, starts, recipe, {method: plan}, said.append)
        assert len(together[method]) == len(alone[method]) == len(seqs)
        for mine, own in zip(together[method], alone[method], strict=True):
            assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(mine, own, strict=True))
        assert together[method][0][1].shape[-1] == 576 * len(plan.aux)
    # and what the recipe read before heads shared a pass: a pass of the head's own layers
    from draftfit.eagle_head import TargetStates

    own, top_ids, top_p = TargetStates(smollm2_model, plans["eagle3"].aux)(seqs[0], 4)
    assert torch.equal(together["eagle3"][0][1], own) and torch.equal(together["mtp"][0][2], top_ids)

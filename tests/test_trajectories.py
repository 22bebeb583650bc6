"""Trajectories and draft scores: cached once, reused, rebuilt when damaged.

Cache behaviour is shown with a counting fake engine (tests/engine_fixtures.py), so the tests can
say exactly which models were built; exact scoring runs for real in transformers.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_fixtures import make_model_dir

from draftfit.draft_scoring import score_draft, score_drafts
from draftfit.engines import EngineConfig, SamplingSpec
from draftfit.errors import DraftfitError
from draftfit.refs import resolve
from draftfit.trajectories import (
    MANIFEST,
    load_trajectories,
    make_key,
    prompts_hash,
    target_trajectories,
    trajectory_fields,
)

PROMPTS = [[5, 6, 7], [9, 10], [1, 2, 3, 4, 5, 6]]
SAMPLING = SamplingSpec(0.0, 1.0, 6, 0)
CONFIG = EngineConfig(backend="vllm", dtype="bfloat16")


@pytest.fixture
def models(tmp_path):
    root = tmp_path / "models"
    return {name: resolve(str(make_model_dir(root, name))) for name in ("target", "draft-a", "draft-b")}


def run(models, cache, factory, drafts):
    trajset = target_trajectories(
        models["target"], PROMPTS, SAMPLING, engine_config=CONFIG, top_k=4, cache_root=cache, engine_factory=factory
    )
    scored = score_drafts(
        trajset, [models[d] for d in drafts], engine_config=CONFIG, cache_root=cache, engine_factory=factory
    )
    return trajset, scored


def test_second_run_scores_only_the_new_candidate(models, tmp_path, fake_factory):
    factory, log = fake_factory
    cache = tmp_path / "cache"
    first, _ = run(models, cache, factory, ["draft-a"])
    assert log == [
        ("build", "target"), ("generate", "target"), ("close", "target"),
        ("build", "draft-a"), ("score", "draft-a"), ("close", "draft-a"),
    ]
    log.clear()
    again, scored = run(models, cache, factory, ["draft-a", "draft-b"])
    # the target is not built again, nor the first draft: only the new candidate runs
    assert log == [("build", "draft-b"), ("score", "draft-b"), ("close", "draft-b")]
    assert again.from_cache and not first.from_cache and again.key == first.key
    assert [s.from_cache for s in scored] == [True, False]
    assert again.timings["engine"] == 0.0


def test_cache_round_trip_is_exact(models, tmp_path, fake_factory):
    factory, _ = fake_factory
    cache = tmp_path / "cache"
    fresh, (fresh_scores,) = run(models, cache, factory, ["draft-a"])
    loaded, (loaded_scores,) = run(models, cache, factory, ["draft-a"])
    assert loaded.from_cache and loaded_scores.from_cache
    assert loaded.sampling == SAMPLING and loaded.top_k == 4 and loaded.engine["name"] == "fake"
    for a, b in zip(fresh.trajectories, loaded.trajectories, strict=True):
        for name in ("prompt_token_ids", "token_ids", "token_logprobs", "top_ids", "top_logprobs"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)  # -inf included
        assert a.finish_reason == b.finish_reason
    for a, b in zip(fresh_scores.scores, loaded_scores.scores, strict=True):
        for name in ("top_ids", "top_logprobs", "token_logprobs", "token_ranks"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    sequences, starts = loaded.sequences()
    assert starts == [3, 2, 6] and [len(s) for s in sequences] == [9, 8, 12]


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-manifest", "extra-file"])
def test_damaged_entry_is_detected_and_rebuilt(models, tmp_path, fake_factory, damage):
    factory, log = fake_factory
    cache = tmp_path / "cache"
    first, _ = run(models, cache, factory, ["draft-a"])
    arrow = next(first.path.rglob("*.arrow"))
    if damage == "truncate":
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    elif damage == "flip":
        data = bytearray(arrow.read_bytes())
        data[-9] ^= 0xFF
        arrow.write_bytes(bytes(data))
    elif damage == "no-manifest":
        (first.path / MANIFEST).unlink()
    else:
        (first.path / "data" / "stray.bin").write_bytes(b"x")
    assert load_trajectories(first.key, cache) is None
    log.clear()
    rebuilt, _ = run(models, cache, factory, ["draft-a"])
    assert log[:3] == [("build", "target"), ("generate", "target"), ("close", "target")]
    assert not rebuilt.from_cache
    assert load_trajectories(first.key, cache) is not None


@pytest.mark.parametrize(
    "change",
    [
        {"sampling": SamplingSpec(0.7, 1.0, 6, 0)},
        {"sampling": SamplingSpec(0.0, 1.0, 7, 0)},
        {"sampling": SamplingSpec(0.7, 1.0, 6, 1)},
        {"top_k": 5},
        {"prompts": [[5, 6, 7], [9, 10], [1, 2, 3, 4, 5]]},
        {"config": EngineConfig(backend="vllm", dtype="float32")},
        {"config": EngineConfig(backend="transformers", dtype="bfloat16")},
        {"target": "other-fingerprint"},
    ],
)
def test_key_changes_with_everything_that_changes_the_numbers(change):
    base = dict(target="fp", prompts=PROMPTS, sampling=SAMPLING, config=CONFIG, top_k=4)
    key = lambda d: make_key(trajectory_fields(d["target"], d["prompts"], d["sampling"], d["config"], d["top_k"]))  # noqa: E731
    assert key({**base, **change}) != key(base)


@pytest.mark.parametrize(
    "same",
    [
        {"sampling": SamplingSpec(0.0, 0.5, 6, 0)},  # top_p means nothing at temperature 0
        {"config": EngineConfig(backend="vllm", dtype="bfloat16", gpu_memory_utilization=0.5, progress=False)},
    ],
)
def test_key_ignores_what_does_not_change_the_numbers(same):
    base = dict(target="fp", prompts=PROMPTS, sampling=SAMPLING, config=CONFIG, top_k=4)
    key = lambda d: make_key(trajectory_fields(d["target"], d["prompts"], d["sampling"], d["config"], d["top_k"]))  # noqa: E731
    assert key({**base, **same}) == key(base)


def test_prompts_hash_sees_boundaries():
    assert prompts_hash([[1, 2], [3]]) != prompts_hash([[1], [2, 3]])
    assert prompts_hash([[1, 2], [3]]) == prompts_hash([np.array([1, 2]), (3,)])


def test_exact_scoring_needs_full_logits_and_the_target(models, tmp_path, fake_factory):
    factory, _ = fake_factory
    trajset = target_trajectories(models["target"], PROMPTS, SAMPLING, engine_config=CONFIG, top_k=4, cache_root=tmp_path, engine_factory=factory)
    with pytest.raises(DraftfitError, match="exact scoring needs full-vocabulary logits.*transformers"):
        score_draft(trajset, models["draft-a"], exact=True, target=models["target"], engine_config=CONFIG, cache_root=tmp_path, engine_factory=factory)
    hf = EngineConfig(backend="transformers", dtype="float32")
    with pytest.raises(DraftfitError, match="needs the target that generated the trajectories"):
        score_draft(trajset, models["draft-a"], exact=True, target=models["draft-b"], engine_config=hf, cache_root=tmp_path, engine_factory=factory)


# --- exact scores, for real -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling",
    [SamplingSpec(0.0, 1.0, 10, 0), SamplingSpec(0.7, 1.0, 10, 3)],
    ids=["greedy", "T0.7"],
)
def test_exact_self_draft_accepts_everything(smollm2_ref, smollm2_prompts, tmp_path, sampling):
    """The target scored as its own draft: Σ min(p, q) = 1 and the draft's argmax is the target's.

    At temperature 0 the trajectory token is the argmax, so greedy acceptance is 1 everywhere; at
    0.7 (no top-p) p = q, so the overlap is 1 and p(argmax q) is the target's top probability.
    """
    config = EngineConfig(backend="transformers", dtype="float32", progress=False)
    trajset = target_trajectories(smollm2_ref, smollm2_prompts[:2], sampling, engine_config=config, top_k=5, cache_root=tmp_path)
    (scored,) = score_drafts(trajset, [smollm2_ref], exact=True, target=smollm2_ref, engine_config=config, cache_root=tmp_path)
    for t, s in zip(trajset.trajectories, scored.scores, strict=True):
        e = s.exact
        assert e is not None and len(e.overlap) == len(t)
        np.testing.assert_allclose(e.overlap, 1.0, atol=1e-5)
        np.testing.assert_array_equal(e.draft_argmax, e.target_top_ids[:, 0])
        np.testing.assert_allclose(e.p_draft_argmax, np.exp(e.target_top_logprobs[:, 0]) if not sampling.greedy else 1.0, atol=1e-5)
        np.testing.assert_allclose(e.target_token_logprobs, t.token_logprobs, atol=1e-4)
    (again,) = score_drafts(trajset, [smollm2_ref], exact=True, target=smollm2_ref, engine_config=config, cache_root=tmp_path)
    assert again.from_cache and again.mode == "exact"
    np.testing.assert_array_equal(again.scores[0].exact.overlap, scored.scores[0].exact.overlap)

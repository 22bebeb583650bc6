"""Ranking rules (DESIGN §4.8): order, fit, ties, Pareto front, k schedule, recommendation."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from draftfit.costmodel import MeasuredStepTime, ModelDraftCost, predict_costs
from draftfit.deploy import vllm_command
from draftfit.errors import DraftfitError
from draftfit.hardware import GIB, StepProfile
from draftfit.ranking import (
    RankRow,
    build_ranking,
    k_schedule,
    pareto_front,
    rank_configs,
    rows_from_prediction,
    vllm_schedule,
)

LEVELS = (1, 4, 8, 16, 32)


def row(
    candidate, k, s, lo=None, hi=None, *, extra=1 * GIB, fits=True, cost=1e9, rate=None, levels=(1,)
):
    """A row whose speedup is ``s`` (a number for one level, or one value per level)."""
    s = (s,) if isinstance(s, (int, float)) else tuple(s)
    lo = (
        tuple(x - 0.01 for x in s)
        if lo is None
        else ((lo,) if isinstance(lo, (int, float)) else tuple(lo))
    )
    hi = (
        tuple(x + 0.01 for x in s)
        if hi is None
        else ((hi,) if isinstance(hi, (int, float)) else tuple(hi))
    )
    return RankRow(
        candidate=candidate,
        k=k,
        concurrency=tuple(levels),
        speedup=s,
        speedup_low=lo,
        speedup_high=hi,
        al=1.0 + k * 0.5,
        al_low=1.0 + k * 0.45,
        al_high=1.0 + k * 0.55,
        extra_vram_bytes=extra,
        fits=fits,
        draft_cost=cost,
        model=f"org/{candidate}",
        fit_reason="" if fits else "too big",
        acceptance_rate=rate,
    )


def order(ranked):
    return [(r.row.candidate, r.row.k) for r in ranked]


def test_orders_by_speedup_at_primary_concurrency():
    rows = [row("a", 3, (2.0, 1.1), levels=(1, 32)), row("b", 3, (1.5, 1.4), levels=(1, 32))]
    assert order(rank_configs(rows, 1)) == [("a", 3), ("b", 3)]
    assert order(rank_configs(rows, 32)) == [("b", 3), ("a", 3)]


def test_rows_must_share_concurrency_levels():
    with pytest.raises(DraftfitError, match="different concurrency levels"):
        rank_configs(
            [row("a", 3, (2.0, 1.1), levels=(1, 32)), row("b", 3, (1.5, 1.4), levels=(1, 16))], 1
        )


def test_configs_that_do_not_fit_are_never_ranked():
    rows = [row("huge", 4, 3.0, fits=False), row("small", 4, 1.5)]
    ranked = rank_configs(rows, 1)
    assert [(r.row.candidate, r.rank) for r in ranked] == [("small", 1), ("huge", None)]
    assert ranked[1].reason == "not ranked: does not fit (too big)"
    assert build_ranking(rows, 1).recommendation.candidate == "small"


def test_tie_within_ci_recommends_the_smaller_k_but_the_order_stays_by_speedup():
    rows = [row("a", 5, 1.80, 1.70, 1.90), row("a", 3, 1.75, 1.65, 1.85)]
    ranking = build_ranking(rows, 1)
    assert order(ranking.ranked) == [("a", 5), ("a", 3)]
    assert ranking.ranked[0].reason == "highest predicted speedup"
    rec = ranking.recommendation
    assert (rec.candidate, rec.k) == ("a", 3)
    assert rec.reason.startswith("rank 2 at concurrency 1: tied within CI with a k=5 (1.80× [1.70, 1.90]); chosen for smaller k")
    assert ranking.ranked[1].reason.endswith(f"recommended — {rec.reason}")


def test_tie_within_ci_recommends_the_cheaper_draft():
    rows = [row("big", 4, 1.80, 1.70, 1.90, cost=8e9), row("small", 4, 1.78, 1.60, 1.90, cost=1e9)]
    ranking = build_ranking(rows, 1)
    assert order(ranking.ranked) == [("big", 4), ("small", 4)]
    assert ranking.recommendation.candidate == "small" and "cheaper draft" in ranking.recommendation.reason


def test_smaller_k_is_preferred_over_cheaper_draft_when_both_tie():
    rows = [row("big", 3, 1.79, 1.70, 1.90, cost=8e9), row("small", 5, 1.80, 1.70, 1.90, cost=1e9)]
    ranking = build_ranking(rows, 1)
    assert order(ranking.ranked) == [("small", 5), ("big", 3)]
    assert (ranking.recommendation.candidate, ranking.recommendation.k) == ("big", 3)


def test_the_order_is_by_speedup_even_when_many_ties_chain():
    """Pairwise ties applied down the list used to push the fastest config behind slower ones
    (ngram k=6 at 1.75× sat 11th behind configs at 1.49×)."""
    rows = [row("ngram", k, 1.40 + 0.05 * k, 1.28 + 0.05 * k, 1.52 + 0.05 * k) for k in range(1, 8)]
    ranking = build_ranking(rows, 1)
    speeds = [r.row.speedup[0] for r in ranking.ranked]
    assert speeds == sorted(speeds, reverse=True) and ranking.ranked[0].row.k == 7
    rec = ranking.recommendation
    # k=7: 1.75× [1.63, 1.87]; k=3's CI reaches 1.67, k=2's only 1.62
    assert rec.k == 3 and "tied within CI with ngram k=7" in rec.reason


def test_a_recommendation_never_predicts_a_loss():
    rows = [row("a", 4, 1.02, 0.80, 1.20), row("a", 1, 0.95, 0.90, 1.05)]
    rec = build_ranking(rows, 1).recommendation
    assert rec.k == 4  # k=1 ties within CI but is predicted slower than no speculation


def test_no_tie_when_intervals_are_apart():
    rows = [row("a", 5, 2.0, 1.95, 2.05), row("a", 3, 1.7, 1.65, 1.75)]
    ranked = rank_configs(rows, 1)
    assert order(ranked) == [("a", 5), ("a", 3)]
    assert ranked[0].reason == "highest predicted speedup"


def test_never_ranks_by_acceptance_rate_across_k():
    """Acceptance rate falls as k grows; the faster k=6 must win although its rate is lowest."""
    rows = [row("a", 2, 1.5, rate=0.80), row("a", 4, 1.8, rate=0.65), row("a", 6, 2.0, rate=0.55)]
    assert order(rank_configs(rows, 1)) == [("a", 6), ("a", 4), ("a", 2)]
    swapped = [
        row("a", 2, 1.5, rate=0.10),
        row("a", 4, 1.8, rate=0.99),
        row("a", 6, 2.0, rate=0.50),
    ]
    assert order(rank_configs(swapped, 1)) == order(rank_configs(rows, 1))


def test_pareto_front_of_speedup_vs_extra_vram():
    rows = [
        row("8b", 4, 2.0, extra=10 * GIB),
        row("1b", 4, 1.8, extra=2 * GIB),
        row("ngram", 4, 1.5, extra=0),
        row("3b", 4, 1.7, extra=5 * GIB),  # slower and bigger than 1b
        row("70b", 4, 2.5, extra=40 * GIB, fits=False),
        row("1b-dup", 4, 1.8, extra=2 * GIB),  # equal to 1b: neither dominates
    ]
    assert pareto_front(rows, 1) == [True, True, True, False, False, True]
    assert [r.pareto for r in rank_configs(rows, 1) if r.row.candidate == "3b"] == [False]


def test_k_schedule_and_vllm_ranges():
    rows = [
        row("d", 1, (1.40, 1.30, 1.20, 1.05, 0.95), levels=LEVELS),
        row("d", 2, (1.70, 1.50, 1.25, 1.02, 0.90), levels=LEVELS),
        row("d", 3, (1.90, 1.55, 1.22, 0.98, 0.85), levels=LEVELS),
    ]
    entries = k_schedule(rows, "d")
    # at 8: k=2 is fastest but k=1 (1.20 ± 0.01) is not within its CI (lower 1.24) → 2;
    # at 16 only k=1 and k=2 pay and k=1 is fastest; at 32 none pays.
    assert [e.k for e in entries] == [3, 3, 2, 1, None]
    assert entries[-1].reason == "off: best predicted speedup 0.95× (k=1) < 1"
    # boundaries at geometric means: √4 = 2, √32 = 5.7, √128 = 11.3, √512 = 22.6
    assert vllm_schedule(entries, max_batch_size=256) == [
        [1, 5, 3],
        [6, 11, 2],
        [12, 22, 1],
        [23, 256, 0],
    ]


def test_recommendation_is_off_when_nothing_pays_at_primary():
    rows = [row("d", 2, (1.3, 0.9), levels=(1, 32))]
    rec = build_ranking(rows, 32).recommendation
    assert rec.candidate is None and rec.spec_config() is None
    assert "serve without speculation" in rec.reason


def test_recommendation_without_fitting_config():
    rec = build_ranking([row("d", 2, 2.0, fits=False)], 1).recommendation
    assert rec.candidate is None and rec.reason.startswith("no configuration fits")


def test_recommendation_to_vllm_command():
    rows = [
        row("d", 2, (1.70, 1.50, 1.25, 1.02, 0.90), levels=LEVELS),
        row("d", 4, (1.95, 1.60, 1.20, 0.95, 0.80), levels=LEVELS),
    ]
    ranking = build_ranking(rows, 1)
    rec = ranking.recommendation
    assert (rec.candidate, rec.k) == ("d", 4)
    spec = rec.spec_config(max_batch_size=256)
    cmd = vllm_command("org/target", spec, "0.32.0")
    cfg = cmd.speculative_config
    assert cfg["num_speculative_tokens"] == 4
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 5, 4], [6, 22, 2], [23, 256, 0]]
    assert cfg["model"] == "org/d"
    data = json.loads(json.dumps(ranking.to_dict()))
    assert data["kind"] == "predicted" and data["recommendation"]["vllm_schedule"][0] == [1, 5, 4]


def test_fixed_k_when_schedule_never_changes():
    rows = [row("d", 3, (1.9, 1.6, 1.3), levels=(1, 4, 8))]
    spec = build_ranking(rows, 1).recommendation.spec_config()
    assert spec.per_batch_size is None and spec.num_speculative_tokens == 3


def test_rows_from_cost_prediction():
    target = MeasuredStepTime(StepProfile(a=0.01, b=1e-4, c=0.0))
    draft = ModelDraftCost(MeasuredStepTime(StepProfile(a=1e-3, b=0.0, c=0.0)))
    pred = predict_costs(
        target,
        draft,
        [1, 3],
        [1.7, 2.4],
        al_low=[1.6, 2.2],
        al_high=[1.8, 2.6],
        concurrency=[1, 8],
        context_len=100,
    )
    rows = rows_from_prediction(
        "tiny", pred, None, draft_cost=1.35e8, model="org/tiny", acceptance_rate=[0.7, 0.47]
    )
    assert [(r.k, r.fits, r.extra_vram_bytes) for r in rows] == [(1, True, 0.0), (3, True, 0.0)]
    # k = 3 at B = 1: T_spec = 3 ms draft + (10 + 0.4) ms verify; speedup = 2.4 · 10.1 / 13.4
    assert rows[1].speedup[0] == pytest.approx(2.4 * 10.1 / 13.4)
    assert rows[1].speedup_low[0] == pytest.approx(2.2 * 10.1 / 13.4)
    assert rows[1].source == "measured-profile"
    # k = 0 in a schedule: the draft's first pass over one token per sequence, 1 ms, still runs each step
    assert rows[0].off_speedup == rows[1].off_speedup == pytest.approx(tuple(pred.off_speedup))
    assert rows[0].off_speedup[0] == pytest.approx(10.1 / 11.1)


def test_an_off_level_carries_what_the_schedule_runs_there():
    """Off, the schedule still runs the draft's first pass each step: the entry says what that costs
    (predicted), beside the best k's speedup that put it off."""
    rows = [replace(row("d", k, s, levels=(1, 16)), off_speedup=(0.97, 0.93)) for k, s in ((1, (1.3, 0.95)), (2, (1.5, 0.9)))]
    entries = k_schedule(rows, "d")
    assert [(e.k, e.off_speedup) for e in entries] == [(2, None), (None, 0.93)]
    assert entries[1].speedup == 0.95 and entries[1].to_dict()["off_speedup"] == 0.93
    # rows of a record without it: not predicted, not 1
    assert k_schedule([row("d", 1, (1.3, 0.95), levels=(1, 16))], "d")[1].off_speedup is None


def test_speculation_left_on_past_the_largest_studied_level_is_said():
    """The schedule carries the largest level's k to vLLM's largest batch, where nothing was
    predicted: the recommendation says so. Off at that level, or a level at the batch limit, it is silent."""
    on = build_ranking([row("d", 3, (1.9, 1.6, 1.3), levels=(1, 4, 8))], 1).recommendation
    note = on.extrapolation_note()
    assert note == ("the deploy command keeps d at k=3 for batches above 8 sequences, the largest concurrency "
                    "studied (1.30× predicted there): nothing was predicted beyond it. If the service runs more "
                    "sequences at once, add those levels (--concurrency) or cap --max-num-seqs")
    off = build_ranking([row("d", 3, (1.9, 1.6, 0.9), levels=(1, 4, 8))], 1).recommendation
    assert off.vllm_schedule()[-1][2] == 0 and off.extrapolation_note() is None
    assert on.extrapolation_note(max_batch_size=8) is None
    assert build_ranking([row("d", 3, 0.9)], 1).recommendation.extrapolation_note() is None

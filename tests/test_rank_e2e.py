"""`draftfit rank` end to end on the embedded SmolLM2 with a small sample (real vLLM engines)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import faultcases
import numpy as np
import pytest
from click.testing import CliRunner
from engine_fixtures import RANKED_STUDY_OPTIONS

from draftfit import results as results_mod
from draftfit.cli import cli

SMALL = list(RANKED_STUDY_OPTIONS)  # the session's ranked study (tests/engine_fixtures.py)


@pytest.fixture(scope="module")
def candidate_files(ranked_study) -> list[str]:
    return ranked_study["candidate_files"]


@pytest.fixture(scope="module")
def measured_run(ranked_study):
    return ranked_study["output"], ranked_study["data"], ranked_study["out_dir"]


@pytest.mark.slow
@pytest.mark.engine
def test_rank_writes_results_and_prints_the_ranking(measured_run):
    output, data, out_dir = measured_run
    assert (out_dir / "results.csv").is_file()
    assert "Ranking at concurrency 1" in output and "Recommendation (predicted)" in output
    assert data["schema_version"] == results_mod.SCHEMA_VERSION == 2 and data["prompts"]["summary"]
    names = {c["candidate"] for c in data["configs"]}
    assert names == {"ngram-2-4", "self-draft", "early-exit-4"}
    assert all(c["kind"] == "predicted" for c in data["configs"])
    assert data["provenance"]["command_line"].startswith("draftfit rank")
    assert data["deploy"]["recommended"]["shell"].startswith("vllm serve")


@pytest.mark.slow
@pytest.mark.engine
def test_greedy_predictions_are_exact_through_the_last_step(measured_run):
    # the answers run max(k) tokens past max_tokens, so a response cut at max_tokens (most are, at 24
    # tokens) tells whether its last step's drafts were accepted: no bound is left at temperature 0
    _, data, _ = measured_run
    trajectories = data["targets"][0]["trajectories"]
    assert trajectories["look_ahead_tokens"] == 3 and trajectories["output_tokens"] <= 6 * 24
    assert all(c["exact"] and c["al_bound_low"] == c["al_bound_high"] for c in data["configs"])


@pytest.mark.slow
@pytest.mark.engine
def test_the_measured_path_times_the_served_steps(measured_run):
    """The served baseline is timed alone and four at once (the study predicts up to 16 in flight),
    beside each candidate;
    a model-free candidate at its largest k alike; a draft model alone at its smallest k and two and
    four at once at its largest (one engine, vLLM's per-batch-size schedule). The correction they
    give is recorded and used (draftfit.spec_timing)."""
    _, data, out_dir = measured_run
    served = data["provenance"]["served_timing"]
    assert served["kind"] == "measured" and served["baseline"]["seconds_per_step"] > 0
    assert [t["batch"] for t in served["baseline_batched"]] == [4]
    assert set(served["speculative"]) == set(served["corrections"]) == {"ngram-2-4", "self-draft", "early-exit-4"}
    # the baseline's engine stayed up beside each candidate's, timed before and after it (B C₁ B C₂ B C₃ B):
    # the predictions divide by the median of those four timings
    repeats = served["baseline_repeats"]
    assert served["unpaired"] == {}, served["unpaired"]
    assert len(repeats) == len(served["speculative"]) + 1 == served["baseline"]["repeats"]
    for batch in (0, 1):
        median = float(np.median([r[batch]["seconds_per_step"] for r in repeats]))
        assert [served["baseline"], *served["baseline_batched"]][batch]["seconds_per_step"] == pytest.approx(median)
    # each candidate's speedup interval also holds its speedup divided by the two timings around its own
    assert set(served["beside"]) == set(served["reference"]) == set(served["speculative"])
    for name, rows in served["beside"].items():
        assert len(rows) == 2 and all(row in repeats for row in rows), name
        ratio = float(np.median([r[0]["seconds_per_step"] for r in rows])) / served["baseline"]["seconds_per_step"]
        reference = served["reference"][name]
        assert reference["low"][0] == pytest.approx(min(ratio, 1.0)) and reference["high"][0] == pytest.approx(max(ratio, 1.0))
        for config in (c for c in data["configs"] if c["candidate"] == name):
            level = config["per_concurrency"][0]
            assert level["speedup_ci_low"] <= level["speedup_predicted"] <= level["speedup_ci_high"], (name, config["k"])
    from draftfit.costmodel import MeasuredStepTime, ModelFreeDraftCost, predict_costs
    from draftfit.hardware import StepProfile

    # the baseline's timing records its prompts' context, which is not the study's mean
    timed_context = served["baseline"]["context_len"]
    assert timed_context > 0 and timed_context != next(c["cost"]["context_len"] for c in data["configs"])
    target_step = MeasuredStepTime(StepProfile.from_dict(data["targets"][0]["profile"]["profile"]))
    profile_step = float(predict_costs(target_step, ModelFreeDraftCost("ngram"), [1], [1.0], concurrency=[1],
                                       context_len=timed_context, spec_overhead_s=0.0).t_base[0])
    for name, timings in served["speculative"].items():
        plan = [(3, 1), (3, 4)] if name == "ngram-2-4" else [(1, 1), (3, 2), (3, 4)]
        assert [(t["k"], t["batch"]) for t in timings] == plan and timings[0]["steps"] > 0, name
        correction = served["corrections"][name]
        assert correction["timed_ks"] == sorted({k for k, _ in plan})
        assert correction["timed_batch"] == 4
        assert np.isfinite([correction["overhead_per_seq_s"], correction["base_per_seq_s"]]).all(), correction
        # the offset is the served step less the profile's own step alone, at the context it was timed at
        assert correction["base_offset_s"] == pytest.approx(served["baseline"]["seconds_per_step"] - profile_step, abs=1e-9)
    assert served["corrections"]["ngram-2-4"]["draft_scale"] == 1.0  # no proposer passes to scale
    self_draft = next(c for c in data["configs"] if c["candidate"] == "self-draft")
    assert "served-timing" in json.dumps(self_draft["cost"])
    # the report shows each step timed alone as the corrected model gives it back, there and at the study's context
    page = (out_dir / "report.html").read_text()
    plain = served["replayed"]["self-draft"][0]
    assert page.count("given back by the model") == len(served["speculative"])
    assert f"at the study&#39;s {plain['study_context_len']:.0f}" in page or f"at the study's {plain['study_context_len']:.0f}" in page


@pytest.mark.slow
@pytest.mark.engine
def test_results_name_models_as_the_user_deploys_them(measured_run):
    """No cache path of this machine in the deploy command or the configurations: the target as
    exported from `smollm2`, derived drafts as exported from it, each with the export command."""
    _, data, _ = measured_run
    target = data["targets"][0]["target"]
    assert target["spec"] == "smollm2" and len(target["fingerprint"]) == 16
    recommended = data["deploy"]["recommended"]
    assert recommended["shell"].startswith("vllm serve ./SmolLM2-135M-Instruct ")
    assert recommended["prepare"][0] == "draftfit export smollm2 -o ./SmolLM2-135M-Instruct"
    derived = {c["draft"] for c in data["configs"] if c["candidate"] == "early-exit-4"}
    assert derived == {"./SmolLM2-135M-Instruct-first4"}
    cache = os.environ["DRAFTFIT_CACHE"]
    assert cache not in recommended["shell"] and all(cache not in (c["draft"] or "") for c in data["configs"])


@pytest.mark.slow
@pytest.mark.engine
def test_self_draft_is_always_accepted_yet_never_faster(measured_run):
    """Every proposal is accepted, yet each costs a target pass. With requests in flight the
    verification of B·(k+1) tokens is no longer free and the self-draft is slower. At concurrency 1
    a proposal skips the step's fixed costs (scheduling, sampling, streaming), a large share of a
    135M model's step on a CPU, so whether the self-draft gains there is a timing, not a law: rank
    times the real self-draft step, and the corrected model gives back that step and the served
    baseline's at the context they were timed at (two CI runs of this study predicted 1.11× and
    0.68× from their timings). The prediction at the timed k is then their ratio moved to the
    study's context by the profile (timed at 150 tokens, predicted at 219: 1.5% apart in one run).
    What the cost model itself must do: price every proposal, so a longer chain costs more."""
    _, data, _ = measured_run
    served = data["provenance"]["served_timing"]
    timed = next(t for t in served["speculative"]["self-draft"] if t["batch"] == 1)
    replayed = {r["k"]: r for r in served["replayed"]["self-draft"]}
    assert set(replayed) == {0, timed["k"]}, replayed
    for step in replayed.values():
        # the correction meets the steps timed alone, through the predictions' own cost path
        assert step["modelled_s"] == pytest.approx(step["timed_s"], rel=0.01), replayed
        assert step["study_context_len"] == next(c["cost"]["context_len"] for c in data["configs"])
    plain, spec = replayed[0], replayed[timed["k"]]
    assert plain["timed_s"] == served["baseline"]["seconds_per_step"] and spec["timed_s"] == timed["seconds_per_step"]
    for config in (c for c in data["configs"] if c["candidate"] == "self-draft"):
        k = config["k"]
        # greedy: the target's own prefill agrees with its greedy answer up to numeric ties
        assert config["al_predicted"] >= 0.95 * (k + 1)
        levels = {level["concurrency"]: level["speedup_predicted"] for level in config["per_concurrency"]}
        assert all(speedup < 1.0 for c, speedup in levels.items() if c > 1), levels
        if k == timed["k"]:
            # tokens per decode step, not AL: a response's last step may stop short at max_tokens
            ratio = config["tokens_per_step_predicted"] * plain["timed_s"] / spec["timed_s"]
            moved = (plain["at_study_context_s"] / plain["modelled_s"]) / (spec["at_study_context_s"] / spec["modelled_s"])
            assert levels[1] == pytest.approx(ratio * moved, rel=0.01), (levels, replayed)
    # the speculative step at concurrency 1 (no prefill stalls there): ITL × tokens per step
    steps = [c["per_concurrency"][0]["itl_spec_ms_predicted"] * c["tokens_per_step_predicted"]
             for c in sorted((c for c in data["configs"] if c["candidate"] == "self-draft"), key=lambda c: c["k"])]
    assert all(later > earlier > 0 for earlier, later in zip(steps, steps[1:], strict=False)), steps


@pytest.mark.slow
@pytest.mark.engine
def test_early_exit_draft_costs_memory_and_ngram_none(measured_run):
    _, data, _ = measured_run
    by_name = {c["candidate"]: c for c in data["configs"]}
    assert by_name["ngram-2-4"]["extra_vram_gib"] == 0.0
    assert by_name["early-exit-4"]["extra_vram_gib"] > 0.0
    # 2·layers·kv_heads·head_dim·bytes of the study's dtype (float32: the session's ranked study)
    assert data["study"]["dtype"] == "float32"
    assert by_name["early-exit-4"]["vram"]["kv_draft_bytes_per_token"] == 2 * 4 * 3 * 64 * 4
    # a k schedule off at a level still runs a draft model's first pass there, and nothing model-free
    offs = {name: [level["speedup_off_predicted"] for level in c["per_concurrency"]] for name, c in by_name.items()}
    assert offs["ngram-2-4"] == [1.0] * len(offs["ngram-2-4"])
    assert all(0.0 < off < 1.0 for off in offs["early-exit-4"]), offs


@pytest.mark.slow
@pytest.mark.engine
def test_second_run_reuses_every_cached_stage(candidate_files, measured_run, tmp_path):
    _, first, _ = measured_run
    args = ["rank", *candidate_files, *SMALL, "--reports-dir", str(tmp_path), "--run-id", "again"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["targets"][0]["trajectories"]["from_cache"] is True
    assert again["targets"][0]["profile"]["from_cache"] is True
    assert again["provenance"]["timings"]["wall"] < first["provenance"]["timings"]["wall"]
    for run in (first, again):  # the drafts' preparation is timed apart: a part of the wall, not all of it
        assert 0.0 <= run["provenance"]["timings"]["draft_preparation"] < run["provenance"]["timings"]["wall"]
    assert [c["al_predicted"] for c in again["configs"]] == [c["al_predicted"] for c in first["configs"]]


@pytest.mark.slow
@pytest.mark.engine
def test_measured_profile_drives_the_latency(measured_run):
    _, data, _ = measured_run
    profile = data["targets"][0]["profile"]
    assert profile["kind"] == "measured" and profile["profile"]["n_samples"] >= 6
    # the profiles, corrected by the served steps timed at concurrency 1 (draftfit.spec_timing)
    assert all(c["latency_source"] == "measured-profile+served-timing" for c in data["configs"])


def test_rank_needs_candidate_files():
    result = CliRunner().invoke(cli, ["rank"])
    assert result.exit_code == 2 and "CANDIDATE_FILES" in result.output


def test_rank_reports_bad_candidate_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: a\ntarget: smollm2\ndraft: {method: ngram}\nk: [0]\n")
    result = CliRunner().invoke(cli, ["rank", str(bad)])
    assert result.exit_code == 2 and f"{bad}: k: entry [0] is 0" in result.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--concurrency", "1,x"], "give whole numbers separated by commas"),
        (["--latency-source", "roofline"], "latency_source roofline needs `gpu`"),
        (["--concurrency", "4,8", "--primary-concurrency", "1"], "primary_concurrency 1 is not among"),
        (["--gpu", "H999", "--latency-source", "roofline"], "H999"),
    ],
)
def test_rank_option_errors(args, words, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("name: a\ntarget: smollm2\ndraft: {method: ngram}\nk: [1]\n")
    result = CliRunner().invoke(cli, ["rank", str(good), *args, "--reports-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_decode_steps_count_steps_without_drafts():
    import numpy as np

    from draftfit.acceptance import WalkCounts
    from draftfit.metrics import decode_steps

    # prompt 0: 11 tokens after the prefill one; 3 drafting steps accepted 5, so 3 plain steps
    # prompt 1: 5 tokens; 2 drafting steps accepted 4 (one past the stop): no plain step
    walked = WalkCounts(np.array([2]), np.array([[3.0], [2.0]]), np.array([[6.0], [4.0]]),
                        np.array([[5.0], [4.0]]), np.zeros((2, 1, 2)))
    per_step, fraction = decode_steps(walked, [12, 6])
    assert per_step[0] == pytest.approx((11 + 5) / (6 + 2))
    assert fraction[0] == pytest.approx(5 / 8)


@pytest.mark.slow
@pytest.mark.engine
def test_the_terminal_shows_draftfits_progress_and_the_engines_go_to_the_run_log(tmp_path, smollm2_model):
    """A real `draftfit rank` process: vLLM's and torch's output (warnings, loading bars, C++
    notices) lands in reports/<run>/engines.log, the terminal keeps draftfit's own lines."""
    import os
    import subprocess
    import sys

    candidates = [str(Path(__file__).resolve().parents[1] / "candidates" / name) for name in ("ngram-5.yaml", "self-draft.yaml")]
    args = [sys.executable, "-m", "draftfit", "rank", *candidates, "--sample-size", "2", "--max-tokens", "8",
            "--max-model-len", "512", "--concurrency", "1", "--latency-source", "roofline", "--gpu", "H100 SXM",
            "--reports-dir", str(tmp_path), "--run-id", "quiet"]
    # a cache of its own, so the target's engine really starts (and writes) whatever ran before; the
    # session's converted GGUF is linked in (converting it again took 55 of this run's 85 s here)
    cache = faultcases.fresh_cache(tmp_path / "cache", Path(os.environ["DRAFTFIT_CACHE"]))
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, env={**os.environ, "DRAFTFIT_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    log = (tmp_path / "quiet" / "engines.log").read_text()
    assert "Loading safetensors checkpoint shards" in log or "vllm" in log.lower()
    noise = [line for line in done.stderr.splitlines()
             if any(word in line for word in ("Warning", "Loading safetensors", "it/s]", "INFO", "WARNING"))]
    assert noise == [], noise
    assert "target trajectories" in done.stderr and "Recommendation (predicted)" in done.stdout
    assert f"engine and library output: {tmp_path / 'quiet' / 'engines.log'}" in done.stdout
    # the self-draft's VRAM on an H100 at vllm serve's default of 1,024 sequences: the published reserve gap
    caution = "KV capacity: published start-ups on H100s at vLLM's default of 1,024 sequences"
    assert caution in done.stderr
    assert any(w.startswith(caution) for w in json.loads((tmp_path / "quiet" / "results.json").read_text())["warnings"])

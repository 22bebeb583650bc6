"""An interrupted `draftfit rank` resumes: a fault injected at each stage (DRAFTFIT_FAULT) fails
the run, leaves nothing half-written, and the run started again reuses the finished stages and
decides exactly what an uninterrupted run decided. A draft whose engine fails is recorded as
failed, with the engine's message and the knobs to turn, while the other candidates are ranked.

Real vLLM engines on the embedded SmolLM2 (see tests/faultcases.py for the cases and how the
cache is shared so that each faulted run redoes only the stages after its fault).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import faultcases
import pytest
from faultcases import CASES, decisions

pytestmark = [pytest.mark.slow, pytest.mark.engine]


@pytest.fixture(scope="module")
def study(tmp_path_factory, engine_slot, ranked_study):
    """One uninterrupted run on a cache of its own: the reference every case is compared with. Its
    cache holds the session's ranked study's measured step profile and served timings (the same
    study settings, the same two drafts among its three): the run measures none again."""
    engine_slot.release()  # one engine at a time: the session's shared engine goes first
    root = tmp_path_factory.mktemp("faults")
    cache = faultcases.fresh_cache(root / "cache", Path(os.environ["DRAFTFIT_CACHE"]), timings=True)
    candidates = faultcases.write_candidates(root / "candidates")
    reports = root / "reports"
    clean = faultcases.clean_run(candidates, reports, cache)
    assert clean.ok, clean.ended
    return {"cache": cache, "candidates": candidates, "reports": reports, "clean": clean, "root": root}


def test_the_clean_run_ranks_both_candidates(study, ranked_study):
    data = study["clean"].data
    assert {c["candidate"] for c in data["configs"]} == {"ngram-2-4", "early-exit-4"}
    assert data["failed"] == [] and data["targets"][0]["trajectories"]["from_cache"] is False
    assert (study["clean"].out_dir / "report.html").is_file()
    # the ranked study's timings were found in this cache, the derived draft's under its path here:
    # only the target's answers and the draft's scores were computed (two engines, no served one)
    assert data["targets"][0]["profile"]["from_cache"] is True and len(study["clean"].engines) == 2
    timed = ranked_study["data"]["provenance"]["served_timing"]["speculative"]
    assert data["provenance"]["served_timing"]["speculative"] == {name: timed[name] for name in ("ngram-2-4", "early-exit-4")}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_run_interrupted_at_a_stage_resumes_with_the_same_results(study, case):
    result = faultcases.run_case(case, study["candidates"], study["reports"], study["cache"])
    # the faulted run failed where it was told to, and left no temporary file behind
    assert not result.faulted.ok
    assert result.faulted.ended.startswith("killed (-9)" if case.mode == "kill" else f"fault injected at stage '{case.stage}'")
    assert result.leftovers == [] and result.orphans == [] and result.shm_leaked == []
    written_before = {"results": True, "report": True}.get(case.stage, False)
    assert result.written_after_fault["results.json"] is written_before
    assert result.written_after_fault["report.html"] is (case.stage == "report")
    # the stage it finished before the fault is in the cache, whole; the next one was never started
    finished = {"trajectories": {"trajectories": [True], "scores": []}, "scoring": {"scores": [True]}}.get(case.stage, {})
    assert result.entries_after_fault == finished
    if result.faulted.engines is not None:
        assert len(result.faulted.engines) == case.faulted_engines
    if written_before:  # what it did write is whole
        from draftfit.results import load

        load(result.faulted.out_dir / "results.json")
    # the restart completed, reused what was finished and decided what the clean run decided
    assert result.restart.ok, result.restart.ended
    assert (result.restart.out_dir / "report.html").is_file()
    assert {"trajectories", "target profile"} <= set(result.reused)
    if result.restart.engines is not None:
        assert len(result.restart.engines) == case.restart_engines
    assert decisions(result.restart.data) == decisions(study["clean"].data)


def test_a_draft_whose_engine_fails_is_recorded_and_the_others_are_ranked(study, tmp_path):
    """A draft vLLM refuses to start (its config allows 64 positions, the study needs 1024)."""
    cache = study["cache"]
    derived = next((cache / "derived").glob("*-first4"))
    broken = tmp_path / "short-context-draft"
    broken.mkdir()
    for path in derived.iterdir():
        if path.name not in ("config.json", "draftfit-manifest.json", "draftfit-source.json"):
            os.symlink(path, broken / path.name)
    config = json.loads((derived / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    folder = tmp_path / "candidates"
    candidates = faultcases.write_candidates(folder)
    (folder / "short.yaml").write_text(f"name: short-context\ntarget: smollm2\ndraft: {{method: draft_model, model: {broken}}}\nk: [1, 2]\n")
    run = faultcases.rank_in_process([*candidates, str(folder / "short.yaml")], tmp_path / "reports", "engine-fails", cache)
    assert run.ok, run.ended
    data = run.data
    assert {c["candidate"] for c in data["configs"]} == {"ngram-2-4", "early-exit-4"}
    assert data["ranking"] and data["recommendation"]
    [failed] = data["failed"]
    assert failed["candidate"] == "short-context" and failed["stage"] == "engine start"
    assert "max_model_len (1024)" in failed["error"] and "max_position_embeddings=64" in failed["error"]
    assert set(failed["knobs"]) == {"gpu_memory_utilization", "max_model_len", "concurrency", "draft_dtype"}
    assert failed["knobs"]["max_model_len"]["value"] == 1024 and failed["knobs"]["concurrency"]["value"] == 16
    assert not any(s["candidate"] == "short-context" for s in data["skipped"])
    html = (run.out_dir / "report.html").read_text()
    assert "short-context" in html and "max_position_embeddings=64" in html and "gpu_memory_utilization" in html
    # the other candidates' numbers are those of the run without the failing draft
    clean = {(c["candidate"], c["k"]): c["al_predicted"] for c in study["clean"].data["configs"]}
    assert {(c["candidate"], c["k"]): c["al_predicted"] for c in data["configs"]} == clean


def test_kill_during_a_derived_draft_leaves_a_temporary_directory_that_is_swept(study, tmp_path):
    """A process killed while deriving a draft leaves only a temporary directory, never an entry;
    the next derive of the same draft removes it and publishes a whole draft."""
    import subprocess
    import sys

    from draftfit import cachedir

    cache = faultcases.fresh_cache(tmp_path / "cache", study["cache"])
    env = {**os.environ, "DRAFTFIT_CACHE": str(cache), "DRAFTFIT_FAULT": "derive:kill", "HF_HUB_OFFLINE": "1"}
    code = "from draftfit.derive import first_layers; first_layers('smollm2', 2)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    derived = cache / "derived"
    [left] = list(derived.iterdir())
    assert left.name.startswith(".") and ".tmp-" in left.name
    env.pop("DRAFTFIT_FAULT")
    proc = subprocess.run([sys.executable, "-c", code + "; print('ok')"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "ok", proc.stderr
    [entry] = list(derived.iterdir())
    assert not entry.name.startswith(".") and cachedir.check_manifest(entry)["derived"] == "first_layers"
    shutil.rmtree(cache)


def test_verify_killed_after_a_group_goes_on_where_it_stopped(study, tmp_path):
    """`verify` killed with SIGKILL (no clean-up at all) right after its first group (the baseline
    and ngram k=2, two servers side by side) was measured and saved: the results file is whole, no
    engine or server is left running, and the same command run again keeps that group, measures
    only the group that was left (its own baseline and k=1) and ends complete. (benchmarks/fault_injection.py
    runs the same case with the fault raised instead.)"""
    from draftfit.results import load
    from draftfit.verify.run import unfinished_run

    ranked = study["reports"] / "clean" / "results.json"
    result = faultcases.run_verify_case("kill", ranked, tmp_path / "verify", study["cache"])
    assert result.faulted.ended.startswith("killed (-9)") and result.orphans == [] and result.shm_leaked == []
    assert [(e["group"], e["candidate"], e["k"]) for e in result.faulted.data["measured"]] == [
        (0, None, None), (0, "ngram-2-4", 2)]  # the first group, saved
    saved = load(tmp_path / "verify" / "results.json")
    assert result.restart.ok, result.restart.ended
    assert result.baseline_kept and result.resumed
    measured = faultcases.verify_decisions(result.restart.data)
    assert [(c, k, level) for c, k, level, *_ in measured] == [("", 0, 1), ("", 0, 1), ("ngram-2-4", 1, 1), ("ngram-2-4", 2, 1)]
    assert all(not failed for *_, failed, _ in measured)
    [run] = result.restart.data["provenance"]["verify"]
    assert {e["verify_id"] for e in result.restart.data["measured"]} == {run["verify_id"]}
    for entry in result.restart.data["measured"]:  # each group's speedups divide by that group's own baseline
        if entry["candidate"] is not None:
            assert entry["baseline_ref"]["group"] == entry["group"] and entry["speedup_measured"] > 0
    # finished: the same command would measure everything again, as a new run
    assert unfinished_run(saved, run["plan_key"]) is None

"""The GPU step model's constants: each with a source, the fitted ones reproduced from the published
points by the committed fit, and the published data files well formed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from draftfit.calibration import gpu_constants, load_calibration_file
from draftfit.hardware import ModelShape
from draftfit.methods import get_method

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "benchmarks" / "published"


def _benchmark():
    spec = importlib.util.spec_from_file_location("published_gpu", ROOT / "benchmarks" / "published_gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_constant_has_a_source():
    constants = gpu_constants("H100 SXM")
    for name in ("target_pass_s", "spec_step_s", "eager_layer_s", "memory_efficiency", "compute_efficiency",
                 "transition_p", "allreduce_latency_s", "allreduce_bytes_per_s", "cuda_graph_bytes",
                 "non_torch_bytes_per_gpu_tp"):
        assert constants.source_of(name).strip(), name
    for role in constants.draft_pass_s:
        assert constants.source_of("draft_pass_s", role).strip(), role
    assert not any("placeholder" in s for s in constants.sources.values())


def test_a_gpu_without_an_entry_takes_the_default_and_says_so():
    constants = gpu_constants("L4")
    assert constants.entry == "default" and constants.gpu == "L4"
    assert constants.pass_fixed_s("mtp") == constants.pass_fixed_s("default")


def test_the_committed_fitted_values_are_what_the_fit_computes():
    """The data file's fitted values were computed by benchmarks/published_gpu.py --fit, not typed."""
    bench = _benchmark()
    points, _ = bench.load_points()
    fitted = bench.fit(points, gpu_constants("H100 SXM"))
    committed = gpu_constants("H100 SXM")
    for name, value in fitted.items():
        have = committed.pass_fixed_s(name.split(".")[1]) if "." in name else getattr(committed, name)
        assert have == pytest.approx(value, rel=2e-3, abs=2e-7), name
        source = committed.source_of(*name.split(".")) if "." in name else committed.source_of(name)
        assert source.startswith("fitted by benchmarks/published_gpu.py"), name


def test_published_points_name_their_source_and_role():
    data = yaml.safe_load((PUBLISHED / "speed.yaml").read_text())
    for source in data["sources"].values():
        assert source["url"].startswith("https://") and source["quote"]
    roles = []
    for series in data["series"]:
        assert series["source"] in data["sources"]
        roles += [series["baseline"]["role"]] + [p["role"] for p in series["points"]]
        for p in series["points"]:
            assert 1 <= p["al"] <= p["k"] + 1
    assert set(roles) == {"fit", "holdout"}
    for log in yaml.safe_load((PUBLISHED / "kv_logs.yaml").read_text())["logs"]:
        assert log["url"].startswith("https://") and log["quote"] and log["kv_capacity_tokens"] > 0


def test_the_benchmark_reports_holdout_errors_apart(capsys):
    _benchmark().main([])
    out = capsys.readouterr().out
    assert "holdout  points" in out and "fit      points" in out
    assert "best k per series" in out and "KV capacity" in out and "coverage:" in out


def test_head_shapes_by_hand():
    """EAGLE-1 for Llama-3.1-8B: one decoder layer (218,112,000 + 8,192 norm params) plus fc
    2·4096·4096 = 33,554,432, reading the target's 128,256-token LM head. EAGLE-3: q/k/v over
    2·hidden inputs (+ 4096·(32+16)·128 = 25,165,824), fc 3·4096·4096 = 50,331,648, and an LM head of
    32,000 tokens only (− 96,256·4096 = 394,264,576)."""
    eagle = json.loads((PUBLISHED / "models" / "eagle-llama3.1-instruct-8b.json").read_text())
    eagle3 = json.loads((PUBLISHED / "models" / "eagle3-llama3.1-instruct-8b.json").read_text())
    plain = ModelShape.from_config(eagle)
    e1 = get_method("eagle").draft_shape(eagle, "e1")
    e3 = get_method("eagle3").draft_shape(eagle3, "e3")
    assert e1.params - plain.params == 33_554_432
    assert e3.params - plain.params == 50_331_648 + 25_165_824 - 394_264_576
    assert e3.streamed_params < e1.streamed_params  # the smaller LM head


def test_an_mtp_head_is_one_layer_of_the_target():
    config = json.loads((ROOT / "tests" / "data" / "llama-3.1-8b-config.json").read_text())
    target = ModelShape.from_config(config)
    mtp = get_method("mtp").draft_shape({**config, "num_nextn_predict_layers": 1}, "mtp")
    assert mtp.num_layers == 1
    per_layer = (target.params - 2 * target.embedding_params) / 32
    assert mtp.params - 2 * mtp.embedding_params == pytest.approx(per_layer + 2 * 4096 * 4096, rel=1e-3)


def test_the_calibration_file_is_valid():
    cal = load_calibration_file()
    assert cal.default.memory_efficiency.value <= 1


def test_the_predict_caution_quotes_the_published_reserve_gaps():
    """predict's caution on H100-class GPUs quotes the gaps the published start-ups show at 1,024
    sequences (recomputed here, so a change of the reserve model must change the caution), and the
    logs at 256 sequences show none worth a caution."""
    from draftfit.what_if import UNEXPLAINED_RESERVE_GIB

    gaps = _benchmark().reserve_gaps()
    wide = [g["gap_gib"] for g in gaps if g["max_num_seqs"] >= 1024]
    assert len(wide) == 3 and (round(min(wide), 1), round(max(wide), 1)) == UNEXPLAINED_RESERVE_GIB
    assert all(abs(g["gap_gib"]) < 1.0 for g in gaps if g["max_num_seqs"] < 1024)

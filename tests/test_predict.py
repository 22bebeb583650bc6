"""`draftfit predict`: the what-if from config.json alone, its JSON schema and every input error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.cli import cli
from draftfit.what_if import Acceptance, iid_alpha, iid_length

DATA = Path(__file__).parent / "data"


@pytest.fixture
def models(tmp_path):
    """Directories that hold nothing but config.json (Llama-3.1-70B target, 8B draft)."""
    paths = {}
    for name, file in (("target", "llama-3.1-70b-config.json"), ("draft", "llama-3.1-8b-config.json")):
        (tmp_path / name).mkdir()
        shutil.copy(DATA / file, tmp_path / name / "config.json")
        paths[name] = str(tmp_path / name)
    return paths


def run(*args):
    return CliRunner().invoke(cli, ["predict", *args])


def test_json_has_an_entry_per_k_and_concurrency_with_the_documented_fields(models):
    result = run(models["target"], "--draft", models["draft"], "--k", "3,5", "--acceptance-rates", "0.8,0.6,0.45,0.35,0.3",
                 "--gpu", "H100 SXM", "--tensor-parallel-size", "4", "--concurrency", "1,8,32", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema_version"] == 1 and data["kind"] == "predicted"
    assert [(e["k"], e["concurrency"]) for e in data["entries"]] == [(3, 1), (3, 8), (3, 32), (5, 1), (5, 8), (5, 32)]
    for entry in data["entries"]:
        assert {"k", "concurrency", "speedup_predicted", "itl_ms_predicted", "step_ms_predicted"} <= set(entry)
        assert entry["speedup_predicted"] == pytest.approx(entry["itl_base_ms_predicted"] / entry["itl_ms_predicted"])
    assert data["entries"][0]["al_predicted"] == pytest.approx(1 + 0.8 + 0.6 + 0.45)
    assert {"kv_capacity_tokens", "kv_cache_gib", "extra_vram_gib", "fits"} <= set(data["vram"])
    assert data["vram"]["kv_capacity_tokens"] < data["vram"]["kv_capacity_tokens_baseline"]
    assert data["provenance"]["hardware"]["tensor_parallel_size"] == 4 and data["provenance"]["draft"]["name"]
    # the gain shrinks as concurrency rises (verification stops being free)
    speed = {(e["k"], e["concurrency"]): e["speedup_predicted"] for e in data["entries"]}
    assert speed[(3, 1)] > speed[(3, 32)]


def test_the_same_functions_as_rank(models):
    """predict's numbers are predict_costs' on the GPU step model, as rank computes them."""
    from draftfit.calibration import gpu_constants
    from draftfit.costmodel import GpuStepTime, ModelDraftCost, predict_costs
    from draftfit.hardware import ModelShape, load_catalog, parse_hardware
    from draftfit.what_if import predict_what_if

    got = predict_what_if(models["target"], gpu="H100 SXM", gpu_count=2, tensor_parallel_size=2, draft=models["draft"],
                          ks=[2], acceptance_rates=[0.7, 0.5], concurrency=[4], input_len=100, output_len=50)
    hw = parse_hardware("2x H100 SXM", catalog=load_catalog(), tensor_parallel_size=2)
    target = ModelShape.from_config(json.loads((DATA / "llama-3.1-70b-config.json").read_text()))
    draft = ModelShape.from_config(json.loads((DATA / "llama-3.1-8b-config.json").read_text()))
    constants = gpu_constants(hw.gpu.name)
    want = predict_costs(GpuStepTime(hw.gpu, target, constants, 2, "bf16", "bf16"),
                         ModelDraftCost(GpuStepTime(hw.gpu, draft, constants, 2, "bf16", "bf16", role="draft_model")),
                         [2], [2.2], concurrency=[4],
                         context_len=125.0, prompt_len=100.0, output_len=50.0)
    assert got.entries[0]["speedup_predicted"] == pytest.approx(float(want.speedup[0, 0]))


def test_without_a_draft_it_predicts_the_baseline_and_the_kv_capacity(models):
    result = run(models["target"], "--gpu", "A100 80GB SXM", "--tensor-parallel-size", "4", "--max-model-len", "8192", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert all(e["k"] is None and "speedup_predicted" not in e for e in data["entries"])
    assert data["vram"]["extra_vram_gib"] == 0 and data["vram"]["kv_capacity_tokens"] > 8192
    assert data["vram"]["max_model_len"] == 8192 and data["vram"]["fit_reason"].startswith("baseline:")


def test_an_acceptance_length_implies_iid_rates_and_says_so(models):
    result = run(models["target"], "--draft", models["draft"], "--k", "3,1,6", "--acceptance-length", "2.5",
                 "--gpu", "H100 SXM", "--tensor-parallel-size", "4", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    al = {e["k"]: e["al_predicted"] for e in data["entries"]}
    assert al[3] == pytest.approx(2.5) and al[1] < al[3] < al[6] < 7
    assert any("i.i.d." in note for note in data["notes"])


@pytest.mark.parametrize("alpha, k", [(0.0, 3), (0.5, 1), (0.8, 4), (0.99, 7)])
def test_iid_alpha_inverts_the_iid_length(alpha, k):
    assert iid_alpha(iid_length(alpha, k), k) == pytest.approx(alpha, abs=1e-9)


def test_rates_give_al_per_k():
    acc = Acceptance.from_rates([0.9, 0.7, 0.4], [1, 3])
    assert acc.al == pytest.approx((1.9, 3.0))


BAD = [
    (["--gpu", "H900"], "unknown GPU"),
    (["--gpu", "H100 SXM", "--draft", "{draft}", "--k", "2", "--acceptance-rates", "0.5,0.7"], "rise along the draft"),
    (["--gpu", "H100 SXM", "--draft", "{draft}", "--k", "3", "--acceptance-rates", "0.8,0.6"], "k=3 needs 3 per-position rates"),
    (["--gpu", "H100 SXM", "--draft", "{draft}", "--k", "2", "--acceptance-length", "3.5"], "outside [1, k+1]"),
    (["--gpu", "H100 SXM", "--draft", "{draft}", "--k", "2"], "give one of --acceptance-length or --acceptance-rates"),
    (["--gpu", "H100 SXM", "--draft", "{draft}", "--acceptance-length", "2"], "--acceptance-length needs --k"),
    (["--gpu", "H100 SXM", "--method", "ngram", "--draft", "{draft}", "--k", "2", "--acceptance-length", "2"], "uses no draft model"),
    (["--gpu", "H100 SXM", "--method", "eagle3", "--k", "2", "--acceptance-length", "2"], "needs --draft"),
    (["--gpu", "H100 SXM", "--k", "2"], "need a draft"),
    (["--gpu", "H100 SXM", "--draft", "{draft}", "--k", "2", "--acceptance-rates", "0.8,x"], "give fractions"),
    (["--gpu", "H100 SXM", "--kv-cache-dtype", "fp3"], "unknown dtype"),
    (["--gpu", "H100 SXM", "--tensor-parallel-size", "4", "--gpu-count", "2"], "cannot be split into tensor-parallel groups"),
]


@pytest.mark.parametrize("args, words", BAD, ids=[w for _, w in BAD])
def test_bad_input_is_one_line_and_exit_2(models, args, words):
    result = run(models["target"], *[a.replace("{draft}", models["draft"]) for a in args])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and words in errors[0], result.output  # click's usage lines may stand before it


def test_a_directory_without_config_json_is_refused(tmp_path):
    result = run(str(tmp_path), "--gpu", "H100 SXM")
    assert result.exit_code == 2 and "no config.json" in result.output


def test_the_table_names_the_source_and_the_kv_capacity(models):
    result = run(models["target"], "--draft", models["draft"], "--k", "4", "--acceptance-rates", "0.8,0.6,0.5,0.4",
                 "--gpu", "H100 SXM", "--tensor-parallel-size", "4")
    assert result.exit_code == 0, result.output
    assert "Predicted (step model of 4x H100 SXM (TP=4); no model was run)" in result.output
    assert "KV capacity" in result.output and "off" in result.output


def test_a_quantization_it_does_not_model_is_named_not_hidden(models):
    """A quantization draftfit does not model (bitsandbytes) is read at the torch dtype: the output says
    so, and that its memory is overstated; MXFP4 names the kernel whose padding it holds the experts
    at; a modelled one (fp8) carries no note."""
    config = Path(models["target"]) / "config.json"
    raw = json.loads(config.read_text())
    expected = {
        "bitsandbytes": ["weights: the target's bitsandbytes quantization is not modelled; its weights are read as "
                         "bf16, so their memory and read time are overstated and the KV capacity understated"],
        "mxfp4": ["weights: the target's mxfp4 experts as vLLM's triton MoE kernel holds them on this GPU (the "
                  "hidden width unpadded, the intermediate width to a multiple of 64 per shard); the rest at the "
                  "activation dtype"],
        "fp8": [],
    }
    for quant, notes in expected.items():
        config.write_text(json.dumps(raw | {"quantization_config": {"quant_method": quant}}))
        result = run(models["target"], "--gpu", "H100 SXM", "--tensor-parallel-size", "4", "--json")
        assert result.exit_code == 0, result.output
        assert [n for n in json.loads(result.output)["notes"] if n.startswith("weights:")] == notes, quant


def test_h100_class_gpus_carry_the_published_reserve_caution(models):
    """On a GPU where vllm serve defaults to 1,024 sequences the KV capacity carries the caution the
    published start-ups call for; where it defaults to 256 (an A100) it does not."""
    def notes(gpu):
        result = run(models["target"], "--gpu", gpu, "--json")
        assert result.exit_code == 0, result.output
        return [n for n in json.loads(result.output)["notes"] if n.startswith("KV capacity:")]

    assert len(notes("H100 SXM")) == 1 and "5.3–7.9 GiB" in notes("H100 SXM")[0]
    assert notes("A100 80GB SXM") == []


def test_a_hybrid_target_is_sized_by_its_layers_or_says_it_is_not(tmp_path):
    """Nemotron-H's KV capacity counts its 4 attention layers and its 27 mamba states, with no
    caution; Jamba's, whose state draftfit does not read, carries the caution in the notes."""
    from test_hardware import NEMOTRON_NANO_9B_V2
    from transformers import AutoConfig

    for name, config in (("nemotron", NEMOTRON_NANO_9B_V2),
                         ("jamba", AutoConfig.for_model("jamba").to_dict() | {"model_type": "jamba"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    nemotron = run(str(tmp_path / "nemotron"), "--gpu", "H100 SXM", "--max-model-len", "32768", "--json")
    jamba = run(str(tmp_path / "jamba"), "--gpu", "H100 SXM", "--max-model-len", "32768", "--json")
    assert nemotron.exit_code == 0 and jamba.exit_code == 0, nemotron.output + jamba.output
    assert not any("a hybrid whose" in note for note in json.loads(nemotron.output)["notes"])
    assert any(note.startswith("target (jamba): a hybrid whose") for note in json.loads(jamba.output)["notes"])

"""vLLM's parallelism reaches the engines, the deploy command, and the refusals come before anything loads."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from click.testing import CliRunner

from draftfit import parallelism as par
from draftfit.candidates import Candidate, StudySettings
from draftfit.cli import cli
from draftfit.deploy import SpecConfig, vllm_command
from draftfit.engines import EngineConfig
from draftfit.engines.vllm_engine import config_options, engine_kwargs
from draftfit.errors import DraftfitError
from draftfit.methods import get_method
from draftfit.methods.base import PlanContext
from draftfit.parallelism import Parallelism

LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 64, "num_hidden_layers": 80}
SMOL = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 9, "num_hidden_layers": 30}


def test_the_layout_reaches_vllm_serve_and_the_engine_arguments():
    layout = Parallelism(4, 2, 3, "ray")
    assert layout.serve_flags() == ["--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
                                    "--data-parallel-size", "3", "--distributed-executor-backend", "ray"]
    assert Parallelism().serve_flags() == []
    assert (layout.world_size, layout.gpus) == (8, 24)
    served = engine_kwargs("/m", parallelism=layout, offline=False)
    assert (served["tensor_parallel_size"], served["pipeline_parallel_size"], served["data_parallel_size"],
            served["distributed_executor_backend"]) == (4, 2, 3, "ray")
    # an offline LLM is one DP rank: vLLM raises on LLM(data_parallel_size>1)
    offline = engine_kwargs("/m", parallelism=layout)
    assert "data_parallel_size" not in offline and offline["tensor_parallel_size"] == 4
    config = EngineConfig(parallelism=Parallelism(2))
    assert engine_kwargs("/m", **config_options(config))["tensor_parallel_size"] == 2
    # the layout is part of the cache keys (step times change with it); the default keeps the old keys
    assert "parallelism" in config.key_fields() and "parallelism" not in EngineConfig().key_fields()


def test_an_unknown_backend_is_refused_with_vllms_words():
    with pytest.raises(DraftfitError, match="Unrecognized distributed executor backend torchrun.*mp, ray"):
        Parallelism(distributed_executor_backend="torchrun")
    with pytest.raises(DraftfitError, match="pipeline_parallel_size 0 must be ≥ 1"):
        Parallelism(pipeline_parallel_size=0)


def test_the_deploy_command_carries_the_layout_and_says_what_it_needs():
    layout = Parallelism(8, 2, 2, "ray")
    draft = SpecConfig(method="draft_model", model="meta-llama/Llama-3.2-1B-Instruct", num_speculative_tokens=3,
                       per_batch_size=((1, 8, 3), (9, 256, 0)))
    command = vllm_command("meta-llama/Llama-3.1-405B-Instruct", draft, "0.32.0", parallelism=layout)
    assert command.deployable, command.problem
    argv = list(command.argv)
    for flag, value in (("--tensor-parallel-size", "8"), ("--pipeline-parallel-size", "2"),
                        ("--data-parallel-size", "2"), ("--distributed-executor-backend", "ray")):
        assert argv[argv.index(flag) + 1] == value
    assert command.llm_kwargs["pipeline_parallel_size"] == 2
    assert command.speculative_config["draft_tensor_parallel_size"] == 8
    notes = " ".join(command.notes)
    assert "ray start --head" in notes and "per engine" in notes
    assert "Dynamic speculative decoding is not supported with data parallelism" in notes
    # tensor_parallel_size alone still works as before
    assert "--tensor-parallel-size" in vllm_command("m", None, "0.32.0", tensor_parallel_size=2).argv


@pytest.mark.parametrize("config, layout, expected", [
    (SMOL, Parallelism(2), "Total number of attention heads (9) must be divisible by tensor parallel size (2)."),
    (SMOL, Parallelism(3), None),
    (LLAMA_70B, Parallelism(8, 4), None),
    (SMOL, Parallelism(1, 31), "30 layers cannot be split into 31 pipeline stages"),
    ({"text_config": {"num_attention_heads": 12}}, Parallelism(8), "attention heads (12)"),
])
def test_the_target_refusals_quote_vllm(config, layout, expected, monkeypatch):
    monkeypatch.setattr(par, "supports_pp", lambda arch: True)
    refusal = layout.target_refusal(config)
    assert refusal is None if expected is None else expected in refusal
    if refusal:
        assert refusal.startswith("target") and " Use a --" in refusal  # ends with the fix


def test_pipeline_parallelism_is_refused_for_a_model_without_supports_pp(monkeypatch):
    monkeypatch.setattr(par, "supports_pp", lambda arch: arch != "NoPPForCausalLM")
    refusal = Parallelism(2, 2).target_refusal({**LLAMA_70B, "architectures": ["NoPPForCausalLM"]})
    assert "Pipeline parallelism is not supported for this model" in refusal and "--pipeline-parallel-size 1" in refusal
    assert Parallelism(2, 2).target_refusal(LLAMA_70B) is None


@pytest.mark.slow
def test_the_installed_vllm_says_which_architectures_support_pp():
    pytest.importorskip("vllm")
    assert par.supports_pp("LlamaForCausalLM") is True
    assert par.supports_pp("NoSuchArchitectureForCausalLM") is None


def test_draft_refusals_follow_vllm():
    draft_model, ngram = get_method("draft_model"), get_method("ngram")
    four = Parallelism(4)
    assert "cannot be other value than 1 or target model tensor_parallel_size" in four.draft_refusal(ngram, None, 2)
    assert "must be the same. Got 1 and 4" in four.draft_refusal(draft_model, None, 1)
    assert four.draft_refusal(draft_model, LLAMA_70B, None) is None
    refusal = Parallelism(3).draft_refusal(draft_model, {"num_attention_heads": 32}, None)
    assert "attention heads (32) must be divisible by tensor parallel size (3)" in refusal
    assert four.draft_refusal(ngram, None, None) is None


def test_ray_missing_is_caught_before_an_engine_starts(monkeypatch):
    monkeypatch.setattr(par.importlib.util, "find_spec", lambda name: None)
    assert "Failed to import Ray: No module named 'ray'" in Parallelism(2, distributed_executor_backend="ray").engine_refusal()
    assert Parallelism(2).engine_refusal() is None


def test_on_a_cpu_the_engines_run_in_one_process_and_say_so(monkeypatch):
    monkeypatch.setattr(par, "on_gpu", lambda: False)
    assert par.engine_parallelism(Parallelism()) == (Parallelism(), None)
    engine, note = par.engine_parallelism(Parallelism(4, 1, 2))
    assert engine == Parallelism() and "TP=4, DP=2 reaches the deploy command" in note
    monkeypatch.setattr(par, "on_gpu", lambda: True)
    engine, note = par.engine_parallelism(Parallelism(4, 2, 2, "ray"))
    assert engine == Parallelism(4, 2, 1, "ray") and "one data-parallel engine" in note
    assert par.engine_parallelism(Parallelism(4)) == (Parallelism(4), None)


def test_the_gpu_models_refuse_pipeline_stages():
    with pytest.raises(ValueError, match="do not model pipeline stages"):
        StudySettings(gpu="H100 SXM", pipeline_parallel_size=2)
    assert StudySettings(pipeline_parallel_size=2, data_parallel_size=2).parallelism == Parallelism(1, 2, 2)


def test_a_draft_whose_heads_the_tp_does_not_divide_is_skipped_with_vllms_words(tmp_path, smollm2_ref, smollm2_meta):
    draft = tmp_path / "draft"
    shutil.copytree(smollm2_meta, draft)
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4, "num_key_value_heads": 1}))
    candidate = Candidate(name="small-heads", target="smollm2", draft={"method": "draft_model", "model": str(draft)}, k=[2])
    study = StudySettings(tensor_parallel_size=3)
    plan = get_method("draft_model").plan(candidate, PlanContext(smollm2_ref, smollm2_meta, study))
    assert plan.skip_reason and "attention heads (4) must be divisible by tensor parallel size (3)" in plan.skip_reason
    assert get_method("draft_model").plan(candidate, PlanContext(smollm2_ref, smollm2_meta, StudySettings())).skip_reason is None


def test_rank_refuses_a_tp_the_target_cannot_take_before_any_engine_starts(tmp_path):
    (tmp_path / "c.yaml").write_text("name: ng\ntarget: smollm2\ndraft: {method: ngram}\nk: [2]\n")
    start = time.perf_counter()
    result = CliRunner().invoke(cli, ["rank", str(tmp_path / "c.yaml"), "--tensor-parallel-size", "2",
                                       "--reports-dir", str(tmp_path / "reports")])
    assert result.exit_code == 2, result.output
    assert "Total number of attention heads (9) must be divisible by tensor parallel size (2)" in result.output
    assert time.perf_counter() - start < 60  # no engine started (an engine start alone takes longer here)

"""MTP offline: the batched chains of a MiMo-layout MTP layer and their walk against a plain proposer
loop of vLLM's ``mimo_mtp.py``, the checkpoint written with its target, and what rank plans for
each kind of MTP candidate (a layer trained here against vLLM's counters: tests/test_eagle3.py;
DeepSeek-V3's layout: tests/test_mtp_deepseek.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from reference_eagle import EagleProposer, MTPProposer
from test_eagle3 import (
    VOCAB,
    H,
    every_chain_equals_the_proposers,
    sequence_following,
    walk_equals_the_proposer_loop,
)

from draftfit.eagle_head import HeadConfig, MTPHead, load_head, read_config

LAYERS = 2


def tiny_head(seed: int, *, scale: float = 5.0) -> MTPHead:
    config = HeadConfig(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=4, intermediate_size=32, rms_norm_eps=1e-6,
                        rope_theta=10000.0, vocab_size=VOCAB, draft_vocab_size=VOCAB, target_hidden_size=H,
                        aux_layer_ids=None, max_position_embeddings=512, attention_bias=True, method="mtp")
    g = torch.Generator().manual_seed(seed)
    head = MTPHead.init(config, torch.randn(VOCAB, H, generator=g), seed=seed)
    with torch.no_grad():
        for name, value in head.t.items():  # large weights: a peaked argmax, so drafts are not noise
            if name.endswith(".bias"):
                value.copy_(torch.randn(value.shape, generator=g))  # non-zero: a pass that drops them fails
            value.mul_(scale if value.dim() == 2 else 1.0)
            value.requires_grad_(False)
    return head


@pytest.mark.parametrize("seed", [0, 1])
def test_every_chain_equals_the_proposers_token_for_token(seed):
    every_chain_equals_the_proposers(tiny_head(seed), MTPProposer, seed, H)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_chains_and_walk_equal_the_proposer_loop(seed):
    walk_equals_the_proposer_loop(tiny_head(seed), MTPProposer, seed, H)


def test_the_comparison_catches_another_layers_pass():
    """EAGLE-1's pass over the same tensors (no norms around the projection, no final norm) drafts
    other tokens: the reference is not blind to the layer's layout."""
    head = tiny_head(3)
    head.t["fc"] = head.t["input_proj"]
    rng = np.random.default_rng(3)
    seq, states = sequence_following(head, 4, 16, 0.0, rng, width=H)
    chains = head.greedy_chains(seq, states, 3, 13, 4)
    wrong = np.array([EagleProposer(head).chain(seq, states, a, 4) for a in range(3, 14)])
    assert (chains != wrong).any()


def tiny_target(directory, head: MTPHead):
    """A Llama target of ``LAYERS`` layers (only the tensors the writer copies)."""
    from safetensors.torch import save_file

    directory.mkdir()
    c = head.config
    tensors = {"model.embed_tokens.weight": head.embed.contiguous(), "model.norm.weight": torch.ones(H)}
    for i in range(LAYERS):
        tensors[f"model.layers.{i}.self_attn.q_proj.weight"] = torch.randn(c.num_heads * c.head_dim, H)
    save_file(tensors, str(directory / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 4, "intermediate_size": 32, "num_hidden_layers": LAYERS,
              "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
              "vocab_size": VOCAB, "max_position_embeddings": 512, "tie_word_embeddings": True}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer.json").write_text("{}")
    return directory


def test_the_layer_is_written_into_its_target_as_vllm_serves_a_mimo_target(tmp_path):
    head = tiny_head(4)
    target = tiny_target(tmp_path / "target", head)
    out = tmp_path / "with-mtp"
    head.save(out, verifier="tiny", target_layers=LAYERS, target_dir=target)
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["MiMoForCausalLM"] and raw["num_nextn_predict_layers"] == 1
    assert raw["model_type"] == "llama" and (out / "tokenizer.json").is_file()  # the tokenizer loads as the target's
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as handle:
        names = set(handle.keys())
        # Qwen2's q/k/v have biases, Llama's none: zero, so the served target's outputs are its own
        assert all(torch.count_nonzero(handle.get_tensor(f"model.layers.{i}.self_attn.{p}_proj.bias")) == 0
                   for i in range(LAYERS) for p in "qkv")
        assert torch.equal(handle.get_tensor("model.layers.1.self_attn.q_proj.weight"),
                           safe_open(str(target / "model.safetensors"), "pt").get_tensor("model.layers.1.self_attn.q_proj.weight"))
    assert {"lm_head.weight", "model.mtp_layers.0.input_proj.weight", "model.mtp_layers.0.self_attn.q_proj.bias",
            "model.mtp_layers.0.mlp.down_proj.weight", "model.mtp_layers.0.final_layernorm.weight"} <= names
    config, _ = read_config(out, "mtp")
    assert config.method == "mtp" and config.attention_bias and config.before_final_norm
    back = load_head(out, None, "mtp")
    assert isinstance(back, MTPHead)
    for name, value in head.t.items():  # written in the target's precision (float32 here)
        assert torch.equal(back.t[name], value if name != "lm_head" else head.embed), name


def test_the_written_copy_tokenizes_as_its_target(tmp_path, smollm2_model):
    """The copy keeps the target's model_type: transformers (and vLLM's server with it) picks the
    tokenizer class by it, and under Qwen2's SmolLM2's text splits differently."""
    import shutil

    from transformers import AutoTokenizer

    head = tiny_head(6)
    target = tiny_target(tmp_path / "target", head)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (smollm2_model / name).is_file():
            shutil.copy2(smollm2_model / name, target / name)
    head.save(tmp_path / "with-mtp", verifier="tiny", target_layers=LAYERS, target_dir=target)
    text = "Hello there,  사랑\n\n  def f(x):\treturn x"
    ours, theirs = AutoTokenizer.from_pretrained(str(tmp_path / "with-mtp")), AutoTokenizer.from_pretrained(str(smollm2_model))
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]


def test_mtp_candidates_validate():
    from draftfit.candidates import DraftSpec

    assert DraftSpec(method="mtp").model is None  # the target's own layers
    assert DraftSpec(method="mtp", trained={"epochs": 2}).trained.epochs == 2
    with pytest.raises(ValueError, match="derived"):
        DraftSpec(method="mtp", derived={"first_layers": 2})


def test_a_checkpoint_carrying_the_layer_is_served_in_the_targets_place(tmp_path, smollm2_ref):
    """verify and the timed steps start the checkpoint itself; the JSON names no model (vLLM reads
    the layers from the served model), and a plain target's own layers are meant without one."""
    from draftfit.candidates import Candidate
    from draftfit.methods import get_method
    from draftfit.verify.measure import served_dir
    from draftfit.verify.selection import VerifyConfig

    head = tiny_head(5)
    out = tmp_path / "with-mtp"
    head.save(out, verifier="tiny", target_layers=LAYERS, target_dir=tiny_target(tmp_path / "target", head))
    method = get_method("mtp")
    assert method.replaces_target and not method.uses_model
    carried = Candidate(name="m", target="smollm2", draft={"method": "mtp", "model": str(out)}, k=[2])
    spec = method.engine_config(carried, 2, smollm2_ref, {"draft_sample_method": "greedy"})
    assert spec.config == {"method": "mtp", "num_speculative_tokens": 2} and spec.target == out and spec.directory is None
    assert served_dir(tmp_path / "target", VerifyConfig("m", 2, "mtp", None, spec.config, target=str(spec.target))) == out
    own = Candidate(name="o", target="smollm2", draft={"method": "mtp"}, k=[1])
    assert method.engine_config(own, 1, smollm2_ref, {}).target is None
    assert served_dir(tmp_path / "target", VerifyConfig("o", 1, "mtp", None, {})) == tmp_path / "target"


def test_the_deploy_command_serves_the_copy_that_carries_the_layer(smollm2_ref):
    """A trained layer's recommendation serves its copy of the target (and prepares only that copy);
    the baseline still serves the target."""
    from types import SimpleNamespace

    from draftfit.candidates import Candidate, StudySettings
    from draftfit.methods import PlannedDraft
    from draftfit.pipeline import RankRun
    from draftfit.ranking import Recommendation

    candidate = Candidate(name="mtp", target="smollm2", draft={"method": "mtp", "trained": {}}, k=[2])
    plan = PlannedDraft(candidate, "mtp", deploy_model="./SmolLM2-135M-Instruct-mtp",
                        prepare="cp -r /cache/heads/mtp-x ./SmolLM2-135M-Instruct-mtp")
    rec = Recommendation(1, "mtp", "mtp", plan.deploy_model, 2, 1.2, 1.1, 1.3, 0.0, (), "best")
    deploy = RankRun([candidate], StudySettings())._deploy(SimpleNamespace(recommendation=rec), [plan], smollm2_ref)
    chosen, baseline = deploy["recommended"], deploy["baseline"]
    assert chosen["argv"][:3] == ["vllm", "serve", "./SmolLM2-135M-Instruct-mtp"], chosen["argv"]
    assert chosen["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert chosen["prepare"] == [plan.prepare]
    assert baseline["argv"][2] == "./SmolLM2-135M-Instruct" and baseline["prepare"]  # the target, exported

"""EAGLE(-1) offline: the batched chains and their walk against a plain proposer loop of vLLM's
``llama_eagle.py``, the checkpoint layout vLLM loads, and the head checks (a head trained here
against vLLM's counters: tests/test_eagle3.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from reference_eagle import EagleProposer
from test_eagle3 import (
    VOCAB,
    H,
    every_chain_equals_the_proposers,
    sequence_following,
    walk_equals_the_proposer_loop,
)

from draftfit.compat.heads import check_head
from draftfit.eagle_head import EagleHead, HeadConfig, load_head, read_config


def tiny_head(seed: int, *, scale: float = 5.0) -> EagleHead:
    config = HeadConfig(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=4, intermediate_size=32, rms_norm_eps=1e-6,
                        rope_theta=10000.0, vocab_size=VOCAB, draft_vocab_size=VOCAB, target_hidden_size=H,
                        aux_layer_ids=None, max_position_embeddings=512, method="eagle")
    g = torch.Generator().manual_seed(seed)
    head = EagleHead.init(config, torch.randn(VOCAB, H, generator=g), seed=seed)
    with torch.no_grad():
        for value in head.t.values():  # large weights: a peaked argmax, so drafts are not noise
            value.mul_(scale if value.dim() == 2 else 1.0)
            value.requires_grad_(False)
    return head


@pytest.mark.parametrize("seed", [0, 1])
def test_every_chain_equals_the_proposers_token_for_token(seed):
    every_chain_equals_the_proposers(tiny_head(seed), EagleProposer, seed, H)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_chains_and_walk_equal_the_proposer_loop(seed):
    walk_equals_the_proposer_loop(tiny_head(seed), EagleProposer, seed, H)


class _TargetStateOnly(EagleProposer):
    """A deliberate bug: chain steps after the first read the target's state at the start instead of
    the head's own output."""

    def chain(self, seq, fused, start, k):
        self.kv = {}
        for p in range(start + 1):
            token, _ = self._pass(p, int(seq[p + 1]), fused[p])
        proposal = [token]
        for j in range(1, k):
            token, _ = self._pass(start + j, proposal[-1], fused[start])
            proposal.append(token)
        return proposal


def test_the_comparison_catches_a_chain_fed_the_wrong_state():
    head = tiny_head(3)
    rng = np.random.default_rng(3)
    seq, states = sequence_following(head, 4, 16, 0.0, rng, width=H)
    chains = head.greedy_chains(seq, states, 3, 13, 4)
    wrong = np.array([_TargetStateOnly(head).chain(seq, states, a, 4) for a in range(3, 14)])
    assert (chains[:, 1:] != wrong[:, 1:]).any() and (chains[:, 0] == wrong[:, 0]).all()


def test_saved_head_reads_back_in_the_layout_vllm_loads(tmp_path):
    head = tiny_head(4)
    head.save(tmp_path, verifier="tiny", target_layers=4)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLM"] and raw["num_hidden_layers"] == 1
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as handle:
        names = set(handle.keys())
    assert "fc.weight" in names and "layers.0.self_attn.q_proj.weight" in names
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)  # vLLM shares the target's
    config, _ = read_config(tmp_path, "eagle")
    assert config.method == "eagle" and config.aux_layers(4) == (4,)  # the target's normed output
    from safetensors.torch import save_file

    target = tmp_path / "target"
    target.mkdir()
    save_file({"model.embed_tokens.weight": head.embed.contiguous(), "lm_head.weight": head.t["lm_head"].contiguous()},
              str(target / "model.safetensors"))
    back = load_head(tmp_path, target, "eagle")
    assert isinstance(back, EagleHead)
    for name, value in head.t.items():
        expected = value if name == "lm_head" else value.to(torch.bfloat16).float()  # written in bfloat16
        assert torch.allclose(back.t[name], expected), name


def test_vllms_eagle_config_layout_and_speculators_eagle(tmp_path):
    head = tiny_head(5)
    head.save(tmp_path, verifier="tiny", target_layers=4)
    llama = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "eagle", "architectures": ["EagleLlamaForCausalLM"],
                                                      "model": llama}))
    config, _ = read_config(tmp_path)  # the architecture says EAGLE
    assert config.method == "eagle" and config.hidden_size == H
    (tmp_path / "config.json").write_text(json.dumps({"speculators_model_type": "eagle", "transformer_layer_config": llama}))
    with pytest.raises(Exception, match="not an EAGLE\\(-1\\) head vLLM 0.32 loads"):
        read_config(tmp_path)


def test_check_head_refuses_another_targets_eagle_head(tmp_path):
    tiny_head(6).save(tmp_path, verifier="tiny", target_layers=4)
    target = {"hidden_size": H, "num_hidden_layers": 4, "vocab_size": VOCAB, "max_position_embeddings": 512}
    assert check_head("eagle", tmp_path, target, [3], 512)["verdict"] == "compatible"
    report = check_head("eagle", tmp_path, {**target, "hidden_size": 2 * H}, [3], 512)
    assert report["verdict"] == "incompatible" and "hidden size" in report["summary"]
    report = check_head("eagle", tmp_path, {**target, "vocab_size": 2 * VOCAB}, [3], 512)
    assert report["verdict"] == "incompatible" and "vocab_size" in report["summary"]


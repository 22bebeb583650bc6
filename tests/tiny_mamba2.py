"""Tiny mamba-2 hybrid targets, randomly initialised in their families' own shapes (no such model
loads or downloads here), with SmolLM2's tokenizer and the config.json keys their published
checkpoints carry rather than the ones transformers writes: Nemotron-H's ``hybrid_override_pattern``
(a mamba layer, an MLP layer, an attention layer, an MLP layer: "M-*-", two B/C groups, its state in
float32), Granite-4's ``layers_block_type`` (a mamba layer, then an attention one, each with its
MLP; one group, the state in the model's dtype) and Falcon-H1's two layers, each with attention and
a mamba mixer side by side (its mixer 256 wide, not expand × hidden)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

FAMILIES = ("nemotron_h", "granitemoehybrid", "falcon_h1")
COMMON = {"vocab_size": 49152, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 512, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}


def _model(family: str):
    from transformers import (
        FalconH1Config,
        FalconH1ForCausalLM,
        GraniteMoeHybridConfig,
        GraniteMoeHybridForCausalLM,
        NemotronHConfig,
        NemotronHForCausalLM,
    )

    if family == "nemotron_h":
        return NemotronHForCausalLM(NemotronHConfig(
            **COMMON, head_dim=64, layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"],
            mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=64, n_groups=2, conv_kernel=4))
    if family == "falcon_h1":
        return FalconH1ForCausalLM(FalconH1Config(
            **COMMON, num_hidden_layers=2, head_dim=64, mamba_d_ssm=256, mamba_n_heads=8, mamba_d_head=32,
            mamba_n_groups=1, mamba_d_state=64, mamba_d_conv=4, mamba_expand=2))
    return GraniteMoeHybridForCausalLM(GraniteMoeHybridConfig(
        **COMMON, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], mamba_n_heads=8,
        mamba_d_head=64, mamba_d_state=64, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2,
        shared_intermediate_size=512, num_local_experts=0))


def build(out: Path, tokenizer_dir: Path, family: str, seed: int = 0) -> Path:
    """Write the ``family`` target to ``out`` with its config as published checkpoints spell it."""
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    _model(family).float().save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(out))
    path = out / "config.json"
    config = json.loads(path.read_text())
    config.pop("layer_types", None)
    config.pop("layers_block_type", None)
    if family == "nemotron_h":
        config |= {"hybrid_override_pattern": "M-*-", "num_hidden_layers": 4}
    elif family == "granitemoehybrid":
        config["layers_block_type"] = ["mamba", "attention"]
    if "time_step_limit" in config:  # as published: [0.0, Infinity], not transformers' {"__float__": ...}
        config["time_step_limit"] = [0.0, float("inf")]
    path.write_text(json.dumps(config, indent=2))
    return out

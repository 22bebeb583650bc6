"""EAGLE-3 and EAGLE(-1) heads and MTP layers run offline as vLLM's proposer runs them: config,
weights, chains.

What vLLM 0.32 runs (``model_executor/models/llama_eagle3.py``, ``v1/spec_decode/llm_base_proposer.py``):

* The target returns the hidden states of its auxiliary layers (``eagle_aux_hidden_state_layer_ids``,
  default ``(2, L // 2, L - 3)``): the residual stream entering layer i, i.e. transformers'
  ``hidden_states[i]``. They are concatenated and fused by the head's ``fc`` (``combine_hidden_states``).
* The head's one decoder layer reads ``[input_layernorm(embed(token)), hidden_norm(hidden)]`` (its
  q/k/v take 2·hidden inputs); the residual is the normed hidden (``norm_before_residual``) or the
  hidden itself. ``post_attention_layernorm`` and the final ``norm`` are fused add-and-norm; the
  logits come from the normed output, the hidden state fed to the next chain step is the pre-norm
  sum (unless ``norm_output``).
* At a step whose context ends with the target's newest token at position c−1, the first pass runs
  the positions the target just processed, each with the *next* token's embedding and the target's
  fused state at that position; the chain then runs k−1 more single-token passes at positions c−1,
  c, … with the head's own token and own pre-norm state. The head's KV cache holds, for every
  position up to c−2, what the target-conditioned pass wrote there (rewritten every step), and for
  the chain's positions its own entries: so a chain from every step start, conditioned on the
  target's states up to the start and the head's own after it.
* Draft tokens are the argmax of the logits (greedy drafting, the default; vLLM refuses
  probabilistic drafting with a reduced vocabulary), mapped to the target's vocabulary by
  ``d2t`` (target id = draft id + d2t[draft id]).

Checkpoint formats read: speculators' (``speculators_model_type: eagle3`` with a
``transformer_layer_config``; ``norm_before_residual`` defaults to true there, as vLLM's
``SpeculatorsConfig`` reads it) and the original EAGLE-3 layout (a Llama config with
``draft_vocab_size``; tensors ``midlayer.*``). Written: speculators' format.

EAGLE(-1) (``model_executor/models/llama_eagle.py``) differs in what the layer reads and returns,
not in the chain: the target hands over its *last* hidden state after its final norm (what its
model returns; transformers' ``hidden_states[L]``); the head's ``fc`` fuses
``[embed(token), state]`` (2·hidden → hidden) into the layer's input, which has no input norm
(vLLM replaces layer 0's with the identity) and is the residual; the layer's output plus residual
is both the hidden state fed onwards and what the LM head reads (no final norm). vLLM loads it
from a Llama config (its ``EAGLEConfig`` renames the architecture ``Eagle…``) with tensors
``layers.0.*`` and ``fc``; embeddings and LM head are the target's unless the checkpoint has its
own. speculators' ``eagle`` format is not among the speculators algorithms vLLM 0.32 loads.

An MTP layer in MiMo's layout (``model_executor/models/mimo_mtp.py``, :class:`MTPHead`) is chained
the same way; it differs in what it reads (the target's last layer's output before the final norm:
MiMo's model returns it un-normed) and in its layer (see the class). vLLM's MiMo MTP reads the
*served* model's config, so the layer rides inside its target: a layer trained here is written into
a copy of the target in MiMo's layout, served in the target's place.

DeepSeek-V3's and GLM-4.5's MTP layers (``deepseek_mtp.py``, ``glm4_moe_mtp.py``;
:class:`DeepSeekMTPHead`, :class:`Glm4MoeMTPHead`) are read from their target (``model.layers.{L}.*``):
they read the target's *normed* last hidden state, project ``[embedding, state]`` (the other order
from MiMo's) into a decoder layer of their family (latent or grouped-query attention, experts), and
feed back their normed output (DeepSeek) or the sum before that norm (GLM); GLM-4.7-Flash's
(``glm4_moe_lite_mtp.py``, :class:`Glm4MoeLiteMTPHead`) is DeepSeek's layer fed back as GLM's, Hunyuan 3's
(``hy_v3_mtp.py``, :class:`HyV3MTPHead`) DeepSeek's reading through HY V3's layer, MiMo-V2-Flash's
(``mimo_v2_mtp.py``, :class:`MiMoV2MTPHead`) a window layer with attention sinks, GLM-OCR's
(``glm_ocr_mtp.py``, :class:`GlmOcrMTPHead`) GLM's reading through GLM-4's sandwich-normed dense layer.
Qwen3-Next's (``qwen3_next_mtp.py``, :class:`Qwen3NextMTPHead`) is read as ``mtp.*``: the same reading
through its own ``fc``, one of the target's full-attention layers (a gated query), its normed output
fed back; K-EXAONE's and EXAONE-4.5's (:class:`ExaoneMoeMTPHead`, :class:`Exaone4_5MTPHead`) read so
through EXAONE's layers. Nemotron-H's (``nemotron_h_mtp.py``, :class:`NemotronHMTPHead`) are two of
the target's blocks, ``mtp.layers.{0,1}.*``: DeepSeek's reading into an attention block without RoPE,
then a block of ungated experts in a latent width.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from draftfit.compat.files import decoder_layers, text_config, uses_ngram_embedding
from draftfit.errors import DraftfitError

WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class HeadConfig:
    """What the offline head reads from an EAGLE-3 checkpoint's config (vLLM's reading of it)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...] | None  # None: the target's default (2, L // 2, L - 3)
    max_position_embeddings: int
    num_layers: int = 1
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    attention_bias: bool = False
    speculators_format: bool = False
    method: str = "eagle3"  # or "eagle": EAGLE(-1); "mtp": a target's MTP layer
    architecture: str = ""  # MTP: the target's architecture, which names the layer's layout

    def aux_layers(self, target_layers: int) -> tuple[int, ...]:
        """The target's hidden states the head reads, as indices of transformers' ``hidden_states``
        (i < L: entering layer i; L: the last layer's output, normed for EAGLE-1, before the final
        norm for MTP — see ``before_final_norm``)."""
        if self.method in ("eagle", "mtp"):
            return (int(target_layers),)
        return self.aux_layer_ids or default_aux_layers(target_layers)

    @property
    def before_final_norm(self) -> bool:
        """MiMo's model hands its MTP layer the last layer's output before the final norm (its
        ``compute_logits`` applies the norm); Llama's hands EAGLE-1 the normed output, DeepSeek's
        and GLM's their MTP layers too."""
        return self.method == "mtp" and self.architecture == MTP_ARCHITECTURE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_aux_layers(target_layers: int) -> tuple[int, ...]:
    """vLLM's default auxiliary layers (``get_eagle3_default_aux_hidden_state_layers``)."""
    return (2, target_layers // 2, target_layers - 3)


def read_config(directory: Path, method: str | None = None) -> tuple[HeadConfig, dict[str, Any]]:
    """The head's config and the raw ``config.json`` (any format above). ``method``: the
    candidate's (``eagle`` or ``eagle3``); default what the config says, else EAGLE-3."""
    from draftfit.compat.heads import head_method

    raw = text_config(json.loads((Path(directory) / "config.json").read_text(encoding="utf-8")))
    method = method or head_method(raw) or "eagle3"
    if method == "eagle":
        return _eagle1_config(raw, directory), raw
    if method == "mtp":
        return _mtp_config(raw, directory), raw
    speculators = "speculators_model_type" in raw
    if speculators:
        if raw["speculators_model_type"] != "eagle3":
            raise DraftfitError(f"speculators model type {raw['speculators_model_type']!r} is not an EAGLE-3 head",
                                where=str(directory), fix="Use method eagle3 with an eagle3 checkpoint")
        layer = dict(raw.get("transformer_layer_config") or {})
        extra = {"draft_vocab_size": raw.get("draft_vocab_size"), "target_hidden_size": raw.get("target_hidden_size"),
                 "norm_before_residual": raw.get("norm_before_residual", True),
                 "norm_before_fc": raw.get("norm_before_fc", False), "fc_norm": raw.get("fc_norm", False),
                 "norm_output": raw.get("norm_output", False),
                 "eagle_aux_hidden_state_layer_ids": raw.get("eagle_aux_hidden_state_layer_ids")}
    else:
        layer = raw
        eagle = raw.get("eagle_config") or {}
        extra = {"draft_vocab_size": raw.get("draft_vocab_size"), "target_hidden_size": raw.get("target_hidden_size"),
                 "norm_before_residual": raw.get("norm_before_residual", False),
                 "norm_before_fc": eagle.get("norm_before_fc", raw.get("norm_before_fc", False)),
                 "fc_norm": raw.get("fc_norm", False), "norm_output": raw.get("norm_output", False),
                 "eagle_aux_hidden_state_layer_ids": raw.get("eagle_aux_hidden_state_layer_ids")
                 or eagle.get("eagle_aux_hidden_state_layer_ids")}
    fields = _layer_fields(layer, directory)
    aux = extra["eagle_aux_hidden_state_layer_ids"]
    config = HeadConfig(
        **fields, draft_vocab_size=int(extra["draft_vocab_size"] or fields["vocab_size"]),
        target_hidden_size=int(extra["target_hidden_size"] or fields["hidden_size"]),
        aux_layer_ids=tuple(int(i) for i in aux) if aux else None,
        norm_before_residual=bool(extra["norm_before_residual"]), norm_before_fc=bool(extra["norm_before_fc"]),
        fc_norm=bool(extra["fc_norm"]), norm_output=bool(extra["norm_output"]), speculators_format=speculators,
    )
    _one_layer(config, directory)
    return config, raw


def _eagle1_config(raw: dict[str, Any], directory: Path) -> HeadConfig:
    """An EAGLE(-1) head's config: a Llama config (or vLLM's ``EAGLEConfig``, the Llama config
    under ``model``)."""
    if "speculators_model_type" in raw:
        raise DraftfitError(
            f"a speculators {raw['speculators_model_type']!r} checkpoint is not an EAGLE(-1) head vLLM 0.32 loads "
            "(its speculators algorithms are eagle3, peagle and dflash)", where=str(directory),
            fix="Use method eagle3 with a speculators eagle3 checkpoint, or an EAGLE head in the original Llama layout")
    layer = raw["model"] if isinstance(raw.get("model"), dict) else raw
    fields = _layer_fields(layer, directory)
    config = HeadConfig(**fields, draft_vocab_size=fields["vocab_size"], target_hidden_size=fields["hidden_size"],
                        aux_layer_ids=None, method="eagle")
    _one_layer(config, directory)
    return config


MTP_ARCHITECTURE = "MiMoForCausalLM"  # the layout a layer trained here is written in
DEEPSEEK_MTP_ARCHITECTURE = "DeepseekV3ForCausalLM"
DEEPSEEK_MTP_MODEL_TYPE = "deepseek_v3"  # what vLLM maps to its deepseek_mtp proposer
DEEPSEEK_V32_MTP_ARCHITECTURE = "DeepseekV32ForCausalLM"  # DeepSeek-V3.2: deepseek_mtp over its sparse layer
GLM_DSA_MTP_ARCHITECTURE = "GlmMoeDsaForCausalLM"  # GLM-5: vLLM serves it as DeepSeek-V3.2, the same MTP layer
# DeepSeek sparse attention's targets, by architecture: the model_type vLLM gives its V3.2 MTP proposer
SPARSE_MTP_MODEL_TYPES = {DEEPSEEK_V32_MTP_ARCHITECTURE: "deepseek_v32", GLM_DSA_MTP_ARCHITECTURE: "glm_moe_dsa"}
GLM_MTP_ARCHITECTURE = "Glm4MoeForCausalLM"  # GLM-4.5 / 4.6: vLLM's glm4_moe_mtp
GLM_LITE_MTP_ARCHITECTURE = "Glm4MoeLiteForCausalLM"  # GLM-4.7-Flash: vLLM's glm4_moe_lite_mtp
QWEN3_NEXT_MTP_ARCHITECTURE = "Qwen3NextForCausalLM"  # vLLM's qwen3_next_mtp
ERNIE_MTP_ARCHITECTURE = "Ernie4_5_MoeForCausalLM"  # ERNIE-4.5's MoE models: vLLM's ernie_mtp
EXAONE_MOE_MTP_ARCHITECTURES = ("ExaoneMoeForCausalLM", "ExaoneMoEForCausalLM")  # K-EXAONE: vLLM's exaone_moe_mtp
HY_V3_MTP_ARCHITECTURE = "HYV3ForCausalLM"  # Hunyuan 3 (Hy3): vLLM's hy_v3_mtp
GLM_OCR_MTP_ARCHITECTURE = "GlmOcrForConditionalGeneration"  # GLM-OCR: vLLM's glm_ocr_mtp
EXAONE4_5_MTP_ARCHITECTURE = "Exaone4_5_ForConditionalGeneration"  # EXAONE-4.5: vLLM's exaone4_5_mtp
MIMO_V2_MTP_ARCHITECTURE = "MiMoV2FlashForCausalLM"  # MiMo-V2-Flash: vLLM's mimo_v2_mtp (its first layer)
NEMOTRON_H_MTP_ARCHITECTURE = "NemotronHForCausalLM"  # Nemotron-H (Nemotron 3): vLLM's nemotron_h_mtp
LONGCAT_MTP_ARCHITECTURE = "LongcatFlashForCausalLM"  # LongCat-Flash: vLLM's longcat_flash_mtp
# vLLM's qwen3_5_mtp: the multimodal checkpoints Qwen3.5 ships and text-only ones, dense and MoE
QWEN3_5_MTP_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                             "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")
OFFLINE_MTP_LAYOUTS = ("MiMo's (vLLM's mimo_mtp), DeepSeek-V3's, DeepSeek-V3.2's and GLM-5's (deepseek_mtp), GLM-4.5's (glm4_moe_mtp), "
                       "GLM-4.7-Flash's (glm4_moe_lite_mtp), Qwen3-Next's (qwen3_next_mtp), Qwen3.5's "
                       "(qwen3_5_mtp), ERNIE-4.5's (ernie_mtp), K-EXAONE's (exaone_moe_mtp), Hunyuan 3's (hy_v3_mtp), "
                       "MiMo-V2-Flash's (mimo_v2_mtp), GLM-OCR's (glm_ocr_mtp), EXAONE-4.5's (exaone4_5_mtp) and "
                       "Nemotron-H's (nemotron_h_mtp, blocks \"*E\"), LongCat-Flash's (longcat_flash_mtp), and Gemma 4's "
                       "assistant (gemma4_mtp)")
# Nemotron-H's block kinds as its configs name them (transformers' list) → the pattern's symbols (vLLM's)
_NEMOTRON_H_BLOCKS = {"attention": "*", "full_attention": "*", "moe": "E", "mlp": "-", "mamba": "M", "linear_attention": "M"}


def nemotron_h_mtp_pattern(raw: dict[str, Any]) -> str:
    """The blocks of a Nemotron-H target's MTP layer, as vLLM reads them (``mtp_hybrid_override_pattern``;
    transformers' ``mtp_layers_block_type`` where a config names that instead; ``*E`` by default)."""
    pattern = raw.get("mtp_hybrid_override_pattern")
    if not pattern and raw.get("mtp_layers_block_type"):
        pattern = "".join(_NEMOTRON_H_BLOCKS.get(block, "?") for block in raw["mtp_layers_block_type"])
    return str(pattern or "*E")


def mtp_layout(raw: dict[str, Any]) -> str | None:
    """The architecture naming the MTP layout this version runs offline for a target's config, or None."""
    arch = (raw.get("architectures") or [None])[0]
    if arch in (MTP_ARCHITECTURE, GLM_MTP_ARCHITECTURE, QWEN3_NEXT_MTP_ARCHITECTURE, *QWEN3_5_MTP_ARCHITECTURES,
                GLM_OCR_MTP_ARCHITECTURE, EXAONE4_5_MTP_ARCHITECTURE):
        return arch
    if arch == DEEPSEEK_MTP_ARCHITECTURE and raw.get("model_type") == DEEPSEEK_MTP_MODEL_TYPE:
        return arch
    if arch == GLM_LITE_MTP_ARCHITECTURE and "index_topk" not in raw:  # with it, V3.2's sparse attention: not checked
        return arch
    # the first chain step's picks reused by the later ones (index_share_for_mtp_iteration): not modelled
    if (arch in SPARSE_MTP_MODEL_TYPES and raw.get("model_type") == SPARSE_MTP_MODEL_TYPES[arch] and raw.get("q_lora_rank")
            and not raw.get("index_share_for_mtp_iteration")):  # (its indexer reads the query's low rank)
        return arch
    if arch == ERNIE_MTP_ARCHITECTURE and raw.get("model_type") == "ernie4_5_moe" and not raw.get("use_bias"):
        return arch  # with use_bias the checkpoint's layer has biases vLLM's Llama layer does not read
    if arch in EXAONE_MOE_MTP_ARCHITECTURES and raw.get("model_type") == "exaone_moe" and not any(
            (raw.get("swiglu_limits") or [0])[:1]):  # a clamped SwiGLU: a GPU kernel, not modelled
        return arch
    if arch == HY_V3_MTP_ARCHITECTURE and raw.get("model_type") == "hy_v3" and not raw.get("use_cla"):
        return arch  # with cross-layer attention vLLM's layer shares another's keys and values
    if arch == MIMO_V2_MTP_ARCHITECTURE and raw.get("swa_num_attention_heads"):  # the keys vLLM's layer reads
        return arch
    # "*E" (attention, then experts) is one decoder layer; vLLM builds any other run of blocks, which the
    # one-layer chain does not hold. With mlp_bias, the latent projection's bias and the routed scale do
    # not commute, and vLLM and transformers apply them in different orders
    if (arch == NEMOTRON_H_MTP_ARCHITECTURE and raw.get("model_type") == "nemotron_h"
            and nemotron_h_mtp_pattern(raw) == "*E" and not raw.get("mlp_bias")):
        return arch
    if arch == LONGCAT_MTP_ARCHITECTURE and not uses_ngram_embedding(raw):  # LongCat-Flash-Lite's: not modelled
        return arch
    return None


def _mtp_config(raw: dict[str, Any], directory: Path) -> HeadConfig:
    """The MTP layer of a target in MiMo's layout (Qwen2's decoder layer, q/k/v biases), DeepSeek-V3's
    (an MLA decoder layer, dense or MoE), GLM-4.5's (GLM's decoder layer), Qwen3-Next's and
    Qwen3.5's (their full-attention layer), ERNIE-4.5's (a Llama layer) or K-EXAONE's (EXAONE's
    layer), with the target's own sizes, ``num_nextn_predict_layers`` (Qwen3.5:
    ``mtp_num_hidden_layers``) of them."""
    from draftfit.compat.heads import mtp_layer_count

    arch = mtp_layout(raw)
    if arch is None:
        raise DraftfitError(f"the target's MTP layers ({(raw.get('architectures') or [None])[0]}, model_type "
                            f"{raw.get('model_type')!r}) are not modelled offline by this draftfit version, which runs "
                            f"{OFFLINE_MTP_LAYOUTS} layouts",
                            where=str(directory), fix="Measure this target's MTP with `draftfit verify`")
    if arch in (DEEPSEEK_MTP_ARCHITECTURE, *SPARSE_MTP_MODEL_TYPES, GLM_LITE_MTP_ARCHITECTURE, LONGCAT_MTP_ARCHITECTURE):
        fields = _deepseek_fields(raw, directory)
    elif arch in (GLM_MTP_ARCHITECTURE, QWEN3_NEXT_MTP_ARCHITECTURE, ERNIE_MTP_ARCHITECTURE, *QWEN3_5_MTP_ARCHITECTURES,
                  *EXAONE_MOE_MTP_ARCHITECTURES, HY_V3_MTP_ARCHITECTURE, GLM_OCR_MTP_ARCHITECTURE):
        fields = _layer_fields(raw, directory)
        if arch in (QWEN3_NEXT_MTP_ARCHITECTURE, *QWEN3_5_MTP_ARCHITECTURES) and (raw.get("layer_scale") or raw.get("attn_output_gate") is False):
            raise DraftfitError("a Qwen3-Next or Qwen3.5 layer with layer_scale or without its attention output gate is not "
                                "modelled offline by this draftfit version", where=str(directory),
                                fix="Measure this target's MTP with `draftfit verify`")
    elif arch == EXAONE4_5_MTP_ARCHITECTURE:  # EXAONE 4's RoPE: Llama 3's scaling where named, base 1e6 by default
        fields = _layer_fields(raw, directory, rope_types=("default", "llama3"))
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        fields["rope_theta"] = float(rope.get("rope_theta") or raw.get("rope_theta") or 1000000.0)
    elif arch == NEMOTRON_H_MTP_ARCHITECTURE:  # no RoPE (the target's mamba layers place the tokens)
        h, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        fields = {"hidden_size": h, "num_heads": heads, "num_kv_heads": int(raw.get("num_key_value_heads") or heads),
                  # transformers' default width, which vLLM reads through it: 128, not hidden ÷ heads
                  "head_dim": int(raw.get("head_dim") or raw.get("attention_head_dim") or 128),
                  "intermediate_size": int(raw.get("moe_intermediate_size") or raw.get("intermediate_size") or 0),
                  "rms_norm_eps": float(raw.get("layer_norm_epsilon", 1e-5)), "rope_theta": 10000.0,
                  "vocab_size": int(raw["vocab_size"]), "max_position_embeddings": int(raw.get("max_position_embeddings") or 4096)}
    elif arch == MIMO_V2_MTP_ARCHITECTURE:  # the layer is a sliding-window one, with its own sizes
        fields = _layer_fields(raw, directory) | {
            "num_heads": int(raw["swa_num_attention_heads"]), "num_kv_heads": int(raw["swa_num_key_value_heads"]),
            "head_dim": int(raw["swa_head_dim"]), "rms_norm_eps": float(raw["layernorm_epsilon"]),
            "rope_theta": float(raw.get("swa_rope_theta") or raw.get("rope_theta") or 1000000)}
    else:
        fields = _layer_fields(raw, directory) | {"attention_bias": True}
    fields["num_layers"] = mtp_layer_count(raw)
    config = HeadConfig(**fields, draft_vocab_size=fields["vocab_size"], target_hidden_size=fields["hidden_size"],
                        aux_layer_ids=None, method="mtp", architecture=arch)
    _one_layer(config, directory)
    return config


def _deepseek_fields(raw: dict[str, Any], directory: Path) -> dict[str, Any]:
    """:class:`HeadConfig`'s fields of a DeepSeek-V3 layer: every head its own key (MLA's latent
    expands per head); ``head_dim`` is the rotary part's (what the RoPE frequencies span)."""
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in ("default", "yarn") or (rope_type == "yarn" and rope.get("attention_factor") == 1.0):
        raise DraftfitError(f"the MTP layer's RoPE {rope_type!r} is not modelled offline by this draftfit version "
                            "(it runs the default and DeepSeek's YaRN)", where=str(directory),
                            fix="Measure this target's MTP with `draftfit verify`")
    heads = int(raw["num_attention_heads"])
    return {
        "hidden_size": int(raw["hidden_size"]), "num_heads": heads, "num_kv_heads": heads,
        "head_dim": int(raw["qk_rope_head_dim"]),
        "intermediate_size": int(raw.get("intermediate_size") or raw["ffn_hidden_size"]),  # LongCat-Flash's name
        "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(rope.get("rope_theta") or raw.get("rope_theta") or 10000.0),
        "vocab_size": int(raw["vocab_size"]), "max_position_embeddings": int(raw.get("max_position_embeddings") or 2048),
    }


def _layer_fields(layer: dict[str, Any], directory: Path, rope_types: tuple[str, ...] = ("default",)) -> dict[str, Any]:
    """The decoder layer's fields of :class:`HeadConfig` from a Llama layer config (its RoPE one of
    ``rope_types``: the head's layout applies the scaling)."""
    rope = layer.get("rope_scaling") or layer.get("rope_parameters") or {}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in rope_types:
        raise DraftfitError(f"the head's RoPE scaling {rope_type!r} is not modelled offline by this draftfit version",
                            where=str(directory), fix="Measure this head with `draftfit verify`")
    h = int(layer["hidden_size"])
    heads = int(layer["num_attention_heads"])
    return {
        "hidden_size": h, "num_heads": heads, "num_kv_heads": int(layer.get("num_key_value_heads") or heads),
        "head_dim": int(layer.get("head_dim") or h // heads), "intermediate_size": int(layer["intermediate_size"]),
        "rms_norm_eps": float(layer.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(rope.get("rope_theta") or layer.get("rope_theta") or 10000.0),
        "vocab_size": int(layer["vocab_size"]),
        "max_position_embeddings": int(layer.get("max_position_embeddings") or 2048),
        "num_layers": int(layer.get("num_hidden_layers") or 1), "attention_bias": bool(layer.get("attention_bias", False)),
    }


def _one_layer(config: HeadConfig, directory: Path) -> None:
    if config.num_layers != 1:
        name = {"eagle3": "EAGLE-3", "eagle": "EAGLE", "mtp": "MTP"}[config.method]
        raise DraftfitError(f"the head has {config.num_layers} decoder layers; this draftfit version runs one-layer "
                            f"{name} heads offline", where=str(directory), fix="Measure this head with `draftfit verify`")


def _torch():
    import torch

    return torch


def _rms(x, weight, eps):
    torch = _torch()
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


def _initializer(seed: int):
    """``lin(out, inp)``: a Llama-style normal(0, 0.02) linear weight, trainable, from one seeded stream."""
    torch = _torch()
    g = torch.Generator().manual_seed(int(seed))

    def lin(out, inp):
        return (torch.randn(out, inp, generator=g) * 0.02).requires_grad_()

    return lin


def _decoder_layer(c: HeadConfig, lin, width: int) -> dict[str, Any]:
    """One decoder layer's fresh tensors, its q/k/v reading ``width`` inputs (drawn in this order:
    a seeded head is the same head from one version to the next)."""
    torch = _torch()
    h, hd = c.hidden_size, c.head_dim
    return {"q_proj": lin(c.num_heads * hd, width), "k_proj": lin(c.num_kv_heads * hd, width),
            "v_proj": lin(c.num_kv_heads * hd, width), "o_proj": lin(h, c.num_heads * hd),
            "post_attention_layernorm": torch.ones(h, requires_grad=True), "gate_proj": lin(c.intermediate_size, h),
            "up_proj": lin(c.intermediate_size, h), "down_proj": lin(h, c.intermediate_size)}


class Eagle3Head:
    """The head's tensors and its passes (plain torch; differentiable, so training uses it too)."""

    METHOD = "eagle3"
    PARAMS = ("fc", "input_layernorm", "hidden_norm", "q_proj", "k_proj", "v_proj", "o_proj",
              "post_attention_layernorm", "gate_proj", "up_proj", "down_proj", "norm", "lm_head")

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None):
        torch = _torch()
        self.config = config
        self.t = tensors  # name → tensor (the PARAMS, plus optional q/k/v biases and input_norm / fc_norm_i)
        self.embed = embed  # [vocab, hidden]: the head's own or the target's (vLLM shares it when absent)
        self.d2t = None if d2t is None else torch.as_tensor(d2t, dtype=torch.long)
        c = config
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self.inv_freq = inv.float()
        self.scale = c.head_dim ** -0.5  # the attention's softmax scale
        self.window: int | None = None  # a sliding window: a query reads the last `window` positions, its own included
        self.sinks = None  # [heads]: attention sinks, a logit per head that weighs no value (MiMo-V2's)

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def init(cls, config: HeadConfig, embed, n_aux: int, seed: int = 0, d2t=None) -> Eagle3Head:
        """A freshly initialised head (for training): Llama-style normal(0, 0.02) linears, unit norms."""
        torch = _torch()
        c = config
        h = c.hidden_size
        lin = _initializer(seed)
        t = {
            "fc": lin(h, n_aux * c.target_hidden_size),
            "input_layernorm": torch.ones(h, requires_grad=True), "hidden_norm": torch.ones(h, requires_grad=True),
            **_decoder_layer(c, lin, 2 * h), "norm": torch.ones(h, requires_grad=True),
            "lm_head": lin(c.draft_vocab_size, h),
        }
        return cls(config, t, embed, d2t)

    @classmethod
    def load(cls, directory: Path, target_dir: Path | None = None) -> Eagle3Head:
        """The head of ``directory``; the target's embeddings when the checkpoint has none."""
        from safetensors.torch import load_file

        torch = _torch()
        directory = Path(directory)
        config, _ = read_config(directory, cls.METHOD)
        tensors: dict[str, Any] = {}
        for f in sorted(directory.glob("*.safetensors")):
            tensors.update(load_file(str(f)))
        if not tensors:
            raise DraftfitError("no .safetensors weights in the head's directory", where=str(directory),
                                fix="Point `model` at the head's checkpoint directory")
        named = {}
        for name, value in tensors.items():
            key = name.replace("midlayer.", "layers.0.").removeprefix("model.")
            for prefix in ("layers.0.self_attn.", "layers.0.mlp.", "layers.0."):
                key = key.removeprefix(prefix)
            named[key.removesuffix(".weight")] = value.float()
        d2t = named.pop("d2t", None)
        named.pop("t2d", None)
        embed = named.pop("embed_tokens", None)
        if embed is None:
            if target_dir is None:
                raise DraftfitError("the head has no embed_tokens and no target was given to share them",
                                    where=str(directory), fix="Pass the target's directory")
            embed = target_embeddings(target_dir)
        missing = [p for p in cls.PARAMS if p not in named and not (p == "lm_head" and config.draft_vocab_size == config.vocab_size)]
        if missing:
            raise DraftfitError(f"the head's checkpoint lacks {', '.join(missing)}", where=str(directory),
                                fix=f"Use a {cls.METHOD} checkpoint vLLM loads (see draftfit.eagle_head for the layouts)")
        if "lm_head" not in named:
            named["lm_head"] = target_lm_head(target_dir) if target_dir is not None else embed
        if config.draft_vocab_size != config.vocab_size and d2t is None:
            raise DraftfitError(
                f"the head's vocabulary ({config.draft_vocab_size}) is smaller than the target's ({config.vocab_size}) "
                "and its checkpoint has no d2t mapping", where=str(directory),
                fix="Add the d2t tensor (draft id → target id offsets) to the checkpoint")
        return cls(config, named, embed.float(), None if d2t is None else d2t.to(torch.long))

    def save(self, directory: Path, *, verifier: str, target_layers: int, speculative_tokens: int = 3,
             target_dir: Path | None = None) -> None:
        """Write the head in speculators' EAGLE-3 format (config.json + model.safetensors)."""
        from safetensors.torch import save_file

        torch = _torch()
        c = self.config
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        layer = self._layer_config()
        config = {
            "speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": layer, "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": c.target_hidden_size, "norm_before_residual": c.norm_before_residual,
            "eagle_aux_hidden_state_layer_ids": list(c.aux_layers(target_layers)),
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens)}],
                "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
            },
        }
        out = self._layer_tensors(self.PARAMS)
        if self.d2t is not None:
            out["d2t"] = self.d2t.contiguous()
            t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
            t2d[torch.arange(c.draft_vocab_size) + self.d2t] = True
            out["t2d"] = t2d
        save_file(out, str(directory / WEIGHTS), metadata={"format": "pt"})
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    def parameters(self) -> list:
        return [v for v in self.t.values() if getattr(v, "requires_grad", False)]

    def _layer_config(self) -> dict[str, Any]:
        """The head's decoder layer as a one-layer Llama config."""
        c = self.config
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
            "vocab_size": c.vocab_size, "hidden_act": "silu",
            "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": False,
            "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
        }

    def _layer_tensors(self, names) -> dict[str, Any]:
        """``names`` as checkpoint tensors (Llama names of layer 0; ``fc``, ``norm``, ``lm_head`` at
        the top), in bfloat16 as vLLM serves them."""
        torch = _torch()
        out = {}
        for name in names:
            if name in ("fc", "norm", "lm_head"):
                key = name
            elif name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                key = f"layers.0.self_attn.{name}"
            elif name in ("gate_proj", "up_proj", "down_proj"):
                key = f"layers.0.mlp.{name}"
            else:
                key = f"layers.0.{name}"
            out[f"{key}.weight"] = self.t[name].detach().to(torch.bfloat16).contiguous()
        return out

    # --- passes -----------------------------------------------------------------------------

    def fuse(self, aux):
        """``combine_hidden_states``: the target's concatenated auxiliary states → the head's width."""
        torch = _torch()
        c = self.config
        x = aux
        if c.norm_before_fc and "input_norm" in self.t:
            x = _rms(x, self.t["input_norm"], c.rms_norm_eps)
        if c.fc_norm:
            chunks = x.chunk(x.shape[-1] // c.target_hidden_size, dim=-1)
            x = torch.cat([_rms(ch, self.t[f"fc_norm_{i}"], c.rms_norm_eps) for i, ch in enumerate(chunks)], dim=-1)
        return x @ self.t["fc"].T

    def _rope(self, x, positions):
        """Neox-style rotary embedding of ``x`` [..., n, heads, head_dim] at ``positions`` [..., n]."""
        return _rope_halves(x, positions, self.inv_freq)

    def _layer_input(self, tokens, hidden, positions):
        """What q/k/v read, [input_layernorm(embed), hidden_norm(hidden)], and the residual."""
        c = self.config
        e = _rms(self.embed[tokens], self.t["input_layernorm"], c.rms_norm_eps)
        normed = _rms(hidden, self.t["hidden_norm"], c.rms_norm_eps)
        return _torch().cat([e, normed], dim=-1), (normed if c.norm_before_residual else hidden)

    def _qkv(self, tokens, hidden, positions):
        """Layer input of (token, hidden) rows: q, k, v (rotated) and the residual."""
        c = self.config
        x, residual = self._layer_input(tokens, hidden, positions)
        shape = x.shape[:-1]
        q = x @ self.t["q_proj"].T
        k = x @ self.t["k_proj"].T
        v = x @ self.t["v_proj"].T
        if c.attention_bias:
            q, k, v = q + self.t["q_proj.bias"], k + self.t["k_proj.bias"], v + self.t["v_proj.bias"]
        q = self._rope(q.view(*shape, c.num_heads, c.head_dim), positions)
        k = self._rope(k.view(*shape, c.num_kv_heads, c.head_dim), positions)
        v = v.view(*shape, c.num_kv_heads, c.head_dim)
        return q, k, v, residual

    def _finish(self, attn, residual):
        """The layer's rest, then the final norm: (normed output, next chain hidden)."""
        c = self.config
        prenorm = self._block(attn, residual)
        out = _rms(prenorm, self.t["norm"], c.rms_norm_eps)
        return out, (out if c.norm_output else prenorm)

    def _output(self, attn):
        """The attention's heads joined and through ``o_proj``."""
        return attn.reshape(*attn.shape[:-2], -1) @ self.t["o_proj"].T

    def _block(self, attn, residual):
        """o_proj, add-and-norm, MLP, add: the layer's pre-norm output."""
        c = self.config
        residual = self._output(attn) + residual
        return self._mlp(_rms(residual, self.t["post_attention_layernorm"], c.rms_norm_eps)) + residual

    def _mlp(self, x):
        return _mlp(self.t, "", x)

    def logits(self, out):
        """Draft-vocabulary logits of normed outputs."""
        return out @ self.t["lm_head"].T

    def to_target(self, draft_ids):
        """Draft-vocabulary ids → the target's ids (d2t), as vLLM's ``compute_logits`` places them."""
        if self.d2t is None:
            return draft_ids
        return draft_ids + self.d2t[draft_ids]

    def _attend(self, q, keys, values, prefix_mask, chain_k, chain_v, chain_mask=None):
        """q [A, H, hd] over the prefix's keys/values [n, KV, hd] where ``prefix_mask`` [A, n] allows,
        and over each row's own chain keys/values [A, j, KV, hd] (where ``chain_mask`` [A, j] allows, if given)."""
        torch = _torch()
        c = self.config
        rep = c.num_heads // c.num_kv_heads
        k, v = keys.repeat_interleave(rep, dim=-2), values.repeat_interleave(rep, dim=-2)  # [n, H, hd]
        ck, cv = chain_k.repeat_interleave(rep, dim=-2), chain_v.repeat_interleave(rep, dim=-2)  # [A, j, H, hd]
        scale = self.scale
        prefix = torch.einsum("ahd,nhd->ahn", q, k) * scale
        prefix = prefix.masked_fill(~prefix_mask[:, None, :], float("-inf"))
        own = torch.einsum("ahd,ajhd->ahj", q, ck) * scale
        if chain_mask is not None:
            own = own.masked_fill(~chain_mask[:, None, :], float("-inf"))
        w = self._softmax(torch.cat([prefix, own], dim=-1))
        n = k.shape[0]
        return torch.einsum("ahn,nhd->ahd", w[..., :n], v) + torch.einsum("ahj,ajhd->ahd", w[..., n:], cv)

    def _softmax(self, scores):
        """Softmax over the last dimension; with sinks, each head's sink logit joins the denominator."""
        if self.sinks is None:
            return scores.softmax(-1)
        sink = self.sinks.to(scores.dtype)[:, None].expand(*scores.shape[:-1], 1)
        return _torch().cat([scores, sink], dim=-1).softmax(-1)[..., :-1]

    def _in_window(self, queries, keys):
        """[len(queries), len(keys)]: which key positions lie in each query position's sliding window."""
        return keys[None, :] > queries[:, None] - self.window

    def _selected(self, positions, mask):
        """The prefix pass's attention mask (None: causal) as the layer narrows it (sparse attention's
        picks: :class:`DeepSeekV32MTPHead`); the layer's :meth:`_qkv` has just run over ``positions``."""
        return mask

    def _chain_selected(self, step: int, positions, prefix_mask):
        """A chain step's (prefix mask [A, n], own-keys mask [A, step] or None: all) as the layer narrows
        them; the layer's :meth:`_qkv` has just run over the step's ``positions``."""
        return prefix_mask, None

    def prefix_pass(self, seq, fused):
        """The target-conditioned pass over positions 0..L−2 (token at p+1, target state at p):
        (normed outputs, chain hiddens, keys, values), causal."""
        torch = _torch()
        n = fused.shape[0]
        positions = torch.arange(n)
        q, k, v, residual = self._qkv(seq[1 : n + 1], fused, positions)
        rep = self.config.num_heads // self.config.num_kv_heads
        mask = None if self.window is None else self._in_window(positions, positions) & (positions[None, :] <= positions[:, None])
        mask = self._selected(positions, mask)
        if self.sinks is None:
            attn = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k.repeat_interleave(rep, dim=-2).transpose(0, 1)[None],
                v.repeat_interleave(rep, dim=-2).transpose(0, 1)[None], attn_mask=mask, is_causal=mask is None,
                scale=self.scale)[0].transpose(0, 1)
        else:  # the sinks' logits in the softmax: written out (scaled_dot_product_attention has none)
            causal = positions[None, :] <= positions[:, None]
            scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(rep, dim=-2)) * self.scale
            scores = scores.masked_fill(~(causal if mask is None else mask)[None], float("-inf"))
            attn = torch.einsum("hqk,khd->qhd", self._softmax(scores.transpose(0, 1)).transpose(0, 1),
                                v.repeat_interleave(rep, dim=-2))
        out, hidden = self._finish(attn, residual)
        return out, hidden, k, v

    def chain_steps(self, starts, first_out, first_hidden, keys, values, inputs, steps: int, project=None):
        """Steps 2..``steps`` of the chains from ``starts`` [A] (absolute positions of the first pass).

        ``first_out``/``first_hidden`` [A, h]: the first pass's outputs there; ``keys``/``values``
        [n, KV, hd]: the prefix pass's. ``inputs(j, logits)`` → the token ids [A] fed to step j + 1
        (the argmax when predicting; the target's tokens when training). Returns the logits of every
        step, [A, steps, draft vocab] — or ``project`` of each step's output where given (training
        projects onto a share of the vocabulary; then ``inputs`` must not read the logits).
        """
        torch = _torch()
        project = project or self.logits
        n = keys.shape[0]
        logits = [project(first_out)]
        hidden = first_hidden
        prefix_mask = torch.arange(n)[None, :] <= starts[:, None]  # [A, n]
        if self.window is not None and steps > self.window:  # the chain's own keys are read whole below
            raise DraftfitError(f"a chain of {steps} drafts is longer than the layer's sliding window ({self.window})",
                                fix="Use fewer speculative tokens")
        ck, cv = [], []
        for j in range(1, steps):
            tokens = inputs(j, logits[-1])
            pos = starts + j
            q, k, v, residual = self._qkv(tokens, hidden, pos)
            ck.append(k)
            cv.append(v)
            window = prefix_mask if self.window is None else prefix_mask & self._in_window(pos, torch.arange(n))
            window, own = self._chain_selected(j, pos, window)
            attn = self._attend(q, keys, values, window, torch.stack(ck, dim=1), torch.stack(cv, dim=1), own)
            out, hidden = self._finish(attn, residual)
            logits.append(project(out))
        return torch.stack(logits, dim=1)

    def greedy_chains(self, seq: np.ndarray, aux, first: int, last: int, steps: int) -> np.ndarray:
        """Draft tokens (target ids) of the chain from every start position ``first..last``:
        ``[last − first + 1, steps]``; row r is the step whose first pass samples at ``first + r``."""
        torch = _torch()
        with torch.no_grad():
            s = torch.as_tensor(np.asarray(seq), dtype=torch.long)
            fused = self.fuse(aux[: last + 1])
            out, hidden, k, v = self.prefix_pass(s[: last + 2], fused)
            starts = torch.arange(first, last + 1)

            def argmax(j, logits):
                return self.to_target(logits.argmax(-1))

            logits = self.chain_steps(starts, out[starts], hidden[starts], k, v, argmax, steps)
            return self.to_target(logits.argmax(-1)).numpy()


class EagleHead(Eagle3Head):
    """An EAGLE(-1) head: the chain of :class:`Eagle3Head` over EAGLE-1's layer (module doc)."""

    METHOD = "eagle"
    PARAMS = ("fc", "q_proj", "k_proj", "v_proj", "o_proj", "post_attention_layernorm", "gate_proj", "up_proj",
              "down_proj", "lm_head")

    @classmethod
    def init(cls, config: HeadConfig, embed, n_aux: int = 1, seed: int = 0, d2t=None) -> EagleHead:
        """A freshly initialised head (for training): Llama-style normal(0, 0.02) linears, unit norms."""
        c = config
        h = c.hidden_size
        lin = _initializer(seed)
        t = {"fc": lin(h, 2 * h), **_decoder_layer(c, lin, h), "lm_head": lin(c.draft_vocab_size, h)}
        return cls(config, t, embed, d2t)

    def save(self, directory: Path, *, verifier: str, target_layers: int, speculative_tokens: int = 3,
             target_dir: Path | None = None) -> None:
        """Write the head as vLLM loads an EAGLE head: a one-layer Llama config, ``layers.0.*`` and
        ``fc``; no embeddings and no LM head (vLLM shares the target's)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = self._layer_config() | {
            "draftfit_head": {"method": "eagle", "verifier": verifier, "target_layers": int(target_layers)}}
        out = self._layer_tensors([name for name in self.PARAMS if name != "lm_head"])  # vLLM shares the target's
        save_file(out, str(directory / WEIGHTS), metadata={"format": "pt"})
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    def fuse(self, aux):
        """The target's state is read as it comes (its last layer's, normed)."""
        return aux

    def _layer_input(self, tokens, hidden, positions):
        """``fc([embed, hidden])``: what q/k/v read (no input norm) and the residual."""
        x = _torch().cat([self.embed[tokens], hidden], dim=-1) @ self.t["fc"].T
        return x, x

    def _finish(self, attn, residual):
        """The layer's rest, no final norm: the pre-norm sum is the output and the next hidden."""
        out = self._block(attn, residual)
        return out, out


MTP_PREFIX = "model.mtp_layers.0."


class MTPHead(Eagle3Head):
    """A target's MTP layer in MiMo's layout (vLLM's ``mimo_mtp.py``), chained as an EAGLE head is.

    The layer reads ``input_proj([hidden_layernorm(state), token_layernorm(embed(token))])`` — the
    embedding zeroed at position 0 — through one Qwen2 decoder layer (its own input norm, q/k/v
    biases), adds the residual and applies ``final_layernorm``; that normed output is both what the
    target's LM head reads and the state fed to the next chain step. The first pass reads the
    target's last layer's output before its final norm. vLLM 0.32 runs layer 0 for every step.
    """

    METHOD = "mtp"
    PARAMS = ("token_layernorm", "hidden_layernorm", "input_proj", "input_layernorm", "q_proj", "k_proj", "v_proj",
              "o_proj", "post_attention_layernorm", "gate_proj", "up_proj", "down_proj", "final_layernorm", "lm_head")

    @classmethod
    def init(cls, config: HeadConfig, embed, n_aux: int = 1, seed: int = 0, d2t=None) -> MTPHead:
        """A freshly initialised layer (for training): normal(0, 0.02) linears, zero biases, unit norms."""
        torch = _torch()
        c = config
        h, hd = c.hidden_size, c.head_dim
        lin = _initializer(seed)

        def ones():
            return torch.ones(h, requires_grad=True)

        t = {
            "token_layernorm": ones(), "hidden_layernorm": ones(), "input_proj": lin(h, 2 * h),
            "input_layernorm": ones(), **_decoder_layer(c, lin, h),
            "q_proj.bias": torch.zeros(c.num_heads * hd, requires_grad=True),
            "k_proj.bias": torch.zeros(c.num_kv_heads * hd, requires_grad=True),
            "v_proj.bias": torch.zeros(c.num_kv_heads * hd, requires_grad=True),
            "final_layernorm": ones(), "lm_head": lin(c.vocab_size, h),
        }
        return cls(config, t, embed, d2t)

    @classmethod
    def load(cls, directory: Path, target_dir: Path | None = None) -> MTPHead:
        """The MTP layer of the MiMo-layout checkpoint ``directory`` (the target that carries it),
        with that checkpoint's embeddings and LM head."""
        directory = Path(directory)
        config, raw = read_config(directory, cls.METHOD)
        named = _layer_tensors(directory, MTP_PREFIX)
        missing = [p for p in (*cls.PARAMS[:-1], "q_proj.bias", "k_proj.bias", "v_proj.bias") if p not in named]
        if missing:
            raise DraftfitError(f"the checkpoint's MTP layer lacks {', '.join(missing)}", where=str(directory),
                                fix=f"Use a {MTP_ARCHITECTURE} checkpoint with its {MTP_PREFIX}* tensors")
        embed = target_embeddings(directory)
        named["lm_head"] = embed if raw.get("tie_word_embeddings") else target_lm_head(directory)
        return cls(config, named, embed)

    def save(self, directory: Path, *, verifier: str, target_layers: int, speculative_tokens: int = 3,
             target_dir: Path | None = None) -> None:
        """Write the target with this layer as vLLM serves a MiMo target with ``method: mtp``: the
        target's files and weights under Qwen2's names (q/k/v biases zero: Llama has none), the
        architecture ``MiMoForCausalLM`` with ``num_nextn_predict_layers: 1`` (the target's own
        ``model_type``, so its tokenizer loads as the target's), and the layer as
        ``model.mtp_layers.0.*``. Its own outputs are the target's."""
        import shutil

        from safetensors import safe_open
        from safetensors.torch import save_file

        torch = _torch()
        if target_dir is None:
            raise DraftfitError("an MTP layer is written with its target", fix="Pass the target's directory")
        directory, target_dir = Path(directory), Path(target_dir)
        directory.mkdir(parents=True, exist_ok=True)
        raw = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))
        if raw.get("model_type") not in ("llama", "qwen2") or raw.get("attention_bias") or raw.get("mlp_bias"):
            raise DraftfitError(f"an MTP layer is written into a Llama or Qwen2 target, not {raw.get('model_type')!r}",
                                where=str(target_dir), fix="Train an EAGLE-3 head for this target instead")
        tensors: dict[str, Any] = {}
        for f in sorted(target_dir.glob("*.safetensors")):
            with safe_open(str(f), "pt") as handle:
                for name in handle.keys():
                    tensors[name] = handle.get_tensor(name)
        dtype = tensors["model.embed_tokens.weight"].dtype  # the target's own precision: its outputs stay its own
        c = self.config
        for i in range(int(raw["num_hidden_layers"])):
            for proj, width in (("q_proj", c.num_heads), ("k_proj", c.num_kv_heads), ("v_proj", c.num_kv_heads)):
                tensors.setdefault(f"model.layers.{i}.self_attn.{proj}.bias", torch.zeros(width * c.head_dim, dtype=dtype))
        tensors.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"].clone())  # MiMo's MTP reads its own
        for name, value in self.t.items():
            if name == "lm_head":
                continue
            base = name.removesuffix(".bias")
            group = "self_attn." if base.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else \
                "mlp." if base.endswith(("gate_proj", "up_proj", "down_proj")) else ""
            suffix = "" if name.endswith(".bias") else ".weight"
            tensors[f"{MTP_PREFIX}{group}{name}{suffix}"] = value.detach().to(dtype)
        for f in target_dir.iterdir():
            if (f.is_file() and f.suffix != ".safetensors" and not f.name.startswith("draftfit-")
                    and f.name not in ("config.json", "model.safetensors.index.json")):
                shutil.copy2(f, directory / f.name)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / WEIGHTS), metadata={"format": "pt"})
        config = {k: v for k, v in raw.items() if k not in ("_model_name_or_path", "transformers_version")} | {
            # the target's own model_type: transformers picks the tokenizer class by it (Qwen2's splits
            # SmolLM2's text differently), and vLLM picks the model by the architecture
            "architectures": [MTP_ARCHITECTURE], "num_nextn_predict_layers": 1,
            "use_sliding_window": False, "max_window_layers": int(raw["num_hidden_layers"]),
            "draftfit_head": {"method": "mtp", "verifier": verifier, "target_layers": int(target_layers)}}
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    def fuse(self, aux):
        """The target's state is read as it comes (its last layer's output, before the final norm)."""
        return aux

    def _layer_input(self, tokens, hidden, positions):
        """``input_proj([hidden_layernorm(state), token_layernorm(embed)])`` (the residual), and its
        ``input_layernorm`` (what q/k/v read)."""
        torch = _torch()
        c = self.config
        e = torch.where((positions != 0)[..., None], self.embed[tokens], torch.zeros((), dtype=self.embed.dtype))
        e = _rms(e, self.t["token_layernorm"], c.rms_norm_eps)
        x = torch.cat([_rms(hidden, self.t["hidden_layernorm"], c.rms_norm_eps), e], dim=-1) @ self.t["input_proj"].T
        return _rms(x, self.t["input_layernorm"], c.rms_norm_eps), x

    def _finish(self, attn, residual):
        """The layer's rest and ``final_layernorm``: the output and the next hidden alike."""
        out = _rms(self._block(attn, residual), self.t["final_layernorm"], self.config.rms_norm_eps)
        return out, out


class EhProjMTPHead(MTPHead):
    """What DeepSeek-V3's and GLM-4.5's MTP layers share (vLLM's ``deepseek_mtp.py``,
    ``glm4_moe_mtp.py``): read from the target as ``model.layers.{L}.*`` (L its number of decoder
    layers), the layer reads ``eh_proj([enorm(embed(token)), hnorm(state)])`` — the embedding
    zeroed at position 0 — through one decoder layer of the target's family whose MLP is dense or a
    mixture of experts (grouped top-k routing, the correction bias for choosing only, renormalised,
    times ``routed_scaling_factor``, plus the shared experts), and ``shared_head.norm`` of the
    residual sum is what the target's LM head reads. The first pass reads the target's normed last
    hidden state (what both models return). vLLM shares the target's embedding and LM head.
    """

    PARAMS = ("enorm", "hnorm", "eh_proj", "input_layernorm", "o_proj", "post_attention_layernorm", "final_layernorm")
    FAMILY = ""
    DENSE = False  # vLLM builds the layer with a dense MLP whatever the target's later layers are
    EXPERT_PARAMS = ("gate", "experts.0.gate_proj")  # what a layer of experts reads
    PREFIX = ""  # where the checkpoint holds the layer, for :meth:`_load_prefixed`
    NAMES: dict[str, str] = {}  # the checkpoint's names under PREFIX → the layout's

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        """``model``: the target's ``config.json`` (the attention's sizes, the experts, the RoPE)."""
        super().__init__(config, tensors, embed, d2t)
        m = model
        layer = int(m["num_hidden_layers"])  # the MTP layer's index: vLLM's decoder layer picks its MLP by it
        self.moe = (not self.DENSE and m.get("n_routed_experts") is not None
                    and layer >= int(m.get("first_k_dense_replace") or 0) and layer % int(m.get("moe_layer_freq") or 1) == 0)
        self.routing = {"top_k": int(m.get("num_experts_per_tok") or 1), "groups": int(m.get("n_group") or 1),
                        "topk_group": int(m.get("topk_group") or 1), "renormalize": bool(m.get("norm_topk_prob", True)),
                        "scoring": self._scoring(m), "scale": float(m.get("routed_scaling_factor") or 1.0)}

    @staticmethod
    def _scoring(model: dict[str, Any]) -> str:
        return model.get("scoring_func") or "softmax"

    @classmethod
    def _attention_params(cls, raw: dict[str, Any]) -> tuple[str, ...]:
        """The attention's tensors beyond ``PARAMS`` that the config says the layer has."""
        return ()

    def _partial_rotary(self, model: dict[str, Any], default: float) -> None:
        """Neox RoPE on the first ``partial_rotary_factor`` of each head (GLM's, Qwen3-Next's)."""
        torch = _torch()
        rope = model.get("rope_parameters") or model.get("rope_scaling") or {}
        factor = float(rope.get("partial_rotary_factor") or model.get("partial_rotary_factor") or default)
        self.rotary_dim = int(self.config.head_dim * factor)
        steps = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64) / self.rotary_dim
        self.inv_freq = (1.0 / (self.config.rope_theta ** steps)).float()

    def _rope(self, x, positions):
        """Neox RoPE on the first ``rotary_dim`` of each head, the rest passing (all of it unless
        :meth:`_partial_rotary` set a part)."""
        rot = getattr(self, "rotary_dim", x.shape[-1])
        return _torch().cat([super()._rope(x[..., :rot], positions), x[..., rot:]], dim=-1)

    def _shared_experts(self, flat):
        """The shared experts' sum, added to the routed experts' (DeepSeek's and GLM's: ungated)."""
        return _mlp(self.t, "shared_experts.", flat) if "shared_experts.gate_proj" in self.t else 0

    @classmethod
    def load(cls, directory: Path, target_dir: Path | None = None) -> EhProjMTPHead:
        """The first MTP layer of the checkpoint ``directory``, with its embeddings and LM head."""
        directory = Path(directory)
        config, raw = read_config(directory, cls.METHOD)
        prefix = f"model.layers.{int(raw['num_hidden_layers'])}."
        named = {key.replace("shared_head.norm", "final_layernorm"): value
                 for key, value in _layer_tensors(directory, prefix).items()
                 if not key.startswith(("embed_tokens", "shared_head.head"))}  # vLLM shares the target's
        return cls._complete(cls(config, named, target_embeddings(directory), model=raw), raw, directory, f"{prefix}*")

    @classmethod
    def _complete(cls, head: EhProjMTPHead, raw: dict[str, Any], directory: Path, tensors: str) -> EhProjMTPHead:
        """``head`` checked for every tensor its layout reads (named ``tensors`` in the checkpoint),
        with the LM head vLLM gives it: the target's (its embedding where the two are tied)."""
        mlp = cls.EXPERT_PARAMS if head.moe else ("gate_proj", "up_proj", "down_proj")
        missing = [p for p in (*cls.PARAMS, *cls._attention_params(raw), *mlp) if p not in head.t]
        if missing:
            raise DraftfitError(f"the checkpoint's MTP layer lacks {', '.join(missing)}", where=str(directory),
                                fix=f"Use a {cls.FAMILY} checkpoint with its {tensors} tensors")
        head.t["lm_head"] = head.embed if raw.get("tie_word_embeddings") else target_lm_head(directory)
        return head

    @classmethod
    def _layer_name(cls, key: str) -> str | None:
        """A tensor's name under ``PREFIX`` as the layout reads it (``NAMES`` renames; None: not read)."""
        return cls.NAMES.get(key, key)

    @classmethod
    def _load_prefixed(cls, directory: Path) -> EhProjMTPHead:
        """The layer of the checkpoint ``directory``: its tensors under ``PREFIX``, named by
        :meth:`_layer_name`, with the checkpoint's embeddings and LM head."""
        directory = Path(directory)
        config, raw = read_config(directory, cls.METHOD)
        named = {name: value for key, value in _layer_tensors(directory, cls.PREFIX).items()
                 if (name := cls._layer_name(key)) is not None}
        return cls._complete(cls(config, named, target_embeddings(directory), model=raw), raw, directory, f"{cls.PREFIX}*")

    def save(self, *args, **kwargs) -> None:
        raise DraftfitError(f"a {self.FAMILY} MTP layer is read from its target, not written by this draftfit version",
                            fix="Train MTP layers here for a Llama or Qwen2 target (written in MiMo's layout)")

    def _layer_input(self, tokens, hidden, positions):
        """``eh_proj([enorm(embed), hnorm(state)])`` (the residual), and its ``input_layernorm``."""
        torch = _torch()
        c, t = self.config, self.t
        e = torch.where((positions != 0)[..., None], self.embed[tokens], torch.zeros((), dtype=self.embed.dtype))
        x = torch.cat([_rms(e, t["enorm"], c.rms_norm_eps), _rms(hidden, t["hnorm"], c.rms_norm_eps)], dim=-1)
        x = x @ t["eh_proj"].T
        return _rms(x, t["input_layernorm"], c.rms_norm_eps), x

    def _mlp(self, x):
        """The dense MLP, or vLLM's grouped top-k routing over the routed experts plus the shared experts."""
        if not self.moe:
            return _mlp(self.t, "", x)
        flat = x.reshape(-1, x.shape[-1])
        ids, weights = self._route(flat)
        return (self._routed(flat, ids, weights) + self._shared_experts(flat)).view(x.shape)

    def _route(self, flat):
        """vLLM's grouped top-k routing of the rows ``flat``: the experts' ids and their weights."""
        torch = _torch()
        r, t = self.routing, self.t
        logits = flat.float() @ t["gate"].float().T
        scores = logits.sigmoid() if r["scoring"] == "sigmoid" else logits.softmax(-1)
        bias = t.get("gate.e_score_correction_bias")
        choice = scores if bias is None else scores + bias
        grouped = choice.view(len(flat), r["groups"], -1)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1) if bias is not None else grouped.max(-1).values
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(r["topk_group"], dim=-1).indices, 1)
        choice = choice.masked_fill(~keep.bool().repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
        ids = choice.topk(r["top_k"], dim=-1).indices
        weights = scores.gather(1, ids)
        if r["renormalize"]:
            weights = weights / weights.sum(-1, keepdim=True)
        return ids, weights * r["scale"]

    def _routed(self, flat, ids, weights):
        """The routed experts' weighted sum over the rows ``flat``."""
        out = _torch().zeros_like(flat)
        for e in ids.unique().tolist():
            rows, slot = (ids == e).nonzero(as_tuple=True)
            out = out.index_add(0, rows, self._expert(f"experts.{e}.", flat[rows]) * weights[rows, slot, None].to(flat.dtype))
        return out

    def _expert(self, prefix: str, x):
        return _mlp(self.t, prefix, x)


class DeepSeekMTPHead(EhProjMTPHead):
    """A DeepSeek-V3 target's MTP layer (vLLM's ``deepseek_mtp.py``; :class:`EhProjMTPHead` for what
    it shares with GLM's), chained as an EAGLE head is.

    Its decoder layer's attention is multi-head latent attention: the query direct or through its
    low-rank ``q_a``/``q_b``; keys and values expanded per head from the normed latent by
    ``kv_b_proj``, plus one rotary key shared by all heads, rotated in interleaved pairs; softmax
    scale ``qk_head_dim^-½``, times YaRN's mscale² under YaRN. The normed output is both what the
    LM head reads and the next step's state (the model returns the two).
    """

    PARAMS = (*EhProjMTPHead.PARAMS, "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj")
    FAMILY = "DeepSeek-V3"

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        m = model
        self.nope, self.rope_dim = int(m["qk_nope_head_dim"]), int(m["qk_rope_head_dim"])
        self.v_dim, self.lora = int(m["v_head_dim"]), int(m["kv_lora_rank"])
        self.scale = (self.nope + self.rope_dim) ** -0.5
        self.rope_gain = 1.0
        rope = m.get("rope_scaling") or m.get("rope_parameters") or {}
        if (rope.get("rope_type") or rope.get("type")) == "yarn":
            self._yarn(m, rope)

    @classmethod
    def _attention_params(cls, raw: dict[str, Any]) -> tuple[str, ...]:
        return ("q_proj",) if raw.get("q_lora_rank") is None else ("q_a_proj", "q_a_layernorm", "q_b_proj")

    def _yarn(self, model: dict[str, Any], rope: dict[str, Any]) -> None:
        """DeepSeek's YaRN: transformers' frequencies and cos/sin gain; the softmax scale times
        ``yarn_get_mscale(factor, mscale_all_dim)²``."""
        import math

        self.inv_freq, self.rope_gain = _scaled_rope(model, "yarn")
        factor, all_dim = float(rope["factor"]), float(rope.get("mscale_all_dim") or 0.0)
        if all_dim and factor > 1:
            self.scale *= (0.1 * all_dim * math.log(factor) + 1.0) ** 2

    def _rope(self, x, positions):
        """GPT-J-style rotary embedding, cos/sin times YaRN's gain."""
        return _rope_pairs(x, positions, self.inv_freq, self.rope_gain)

    def _qkv(self, tokens, hidden, positions):
        """MLA's per-head q, k (the no-RoPE part from the latent, the shared rotary key) and v."""
        x, residual = self._layer_input(tokens, hidden, positions)
        return (*self._latent_qkv(x, positions), residual)

    def _latent_qkv(self, x, positions):
        """MLA's q, k and v of the layer's normed input ``x``."""
        torch = _torch()
        c, t = self.config, self.t
        shape = x.shape[:-1]
        if "q_proj" in t:
            q = x @ t["q_proj"].T
        else:
            q = _rms(x @ t["q_a_proj"].T, t["q_a_layernorm"], c.rms_norm_eps) @ t["q_b_proj"].T
        q = q.view(*shape, c.num_heads, self.nope + self.rope_dim)
        latent, k_pe = (x @ t["kv_a_proj_with_mqa"].T).split([self.lora, self.rope_dim], dim=-1)
        kv = (_rms(latent, t["kv_a_layernorm"], c.rms_norm_eps) @ t["kv_b_proj"].T).view(*shape, c.num_heads, -1)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k_pe = self._rope(k_pe[..., None, :], positions).expand(*shape, c.num_heads, self.rope_dim)
        q = torch.cat([q[..., : self.nope], self._rope(q[..., self.nope :], positions)], dim=-1)
        return q, torch.cat([k_nope, k_pe], dim=-1), v


class Glm4MoeMTPHead(EhProjMTPHead):
    """A GLM-4.5 target's MTP layer (vLLM's ``glm4_moe_mtp.py``; :class:`EhProjMTPHead` for what it
    shares with DeepSeek's), chained as an EAGLE head is.

    Its decoder layer's attention is GLM's grouped-query attention: q/k/v biases (``attention_bias``),
    optional per-head q/k RMS norms (``use_qk_norm``), neox RoPE on the first
    ``partial_rotary_factor`` (default ½) of each head. The routing scores are always sigmoid. The
    layer returns the residual sum *before* ``shared_head.norm``: that is the next step's state, its
    norm what the LM head reads.
    """

    PARAMS = (*EhProjMTPHead.PARAMS, "q_proj", "k_proj", "v_proj")
    FAMILY = "GLM-4.5"

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        self._partial_rotary(model, default=0.5)

    @staticmethod
    def _scoring(model: dict[str, Any]) -> str:
        return "sigmoid"

    @classmethod
    def _attention_params(cls, raw: dict[str, Any]) -> tuple[str, ...]:
        biases = ("q_proj.bias", "k_proj.bias", "v_proj.bias") if raw.get("attention_bias") else ()
        return biases + (("q_norm", "k_norm") if raw.get("use_qk_norm") else ())

    def _qkv(self, tokens, hidden, positions):
        c, t = self.config, self.t
        x, residual = self._layer_input(tokens, hidden, positions)
        shape = x.shape[:-1]
        q, k, v = x @ t["q_proj"].T, x @ t["k_proj"].T, x @ t["v_proj"].T
        if c.attention_bias:
            q, k, v = q + t["q_proj.bias"], k + t["k_proj.bias"], v + t["v_proj.bias"]
        q = q.view(*shape, c.num_heads, c.head_dim)
        k = k.view(*shape, c.num_kv_heads, c.head_dim)
        if "q_norm" in t:
            q, k = _rms(q, t["q_norm"], c.rms_norm_eps), _rms(k, t["k_norm"], c.rms_norm_eps)
        return self._rope(q, positions), self._rope(k, positions), v.view(*shape, c.num_kv_heads, c.head_dim), residual

    def _finish(self, attn, residual):
        """``shared_head.norm`` of the residual sum for the LM head; the sum itself fed onwards."""
        prenorm = self._block(attn, residual)
        return _rms(prenorm, self.t["final_layernorm"], self.config.rms_norm_eps), prenorm


class DeepSeekV32MTPHead(DeepSeekMTPHead):
    """A DeepSeek-V3.2 target's MTP layer (vLLM's ``deepseek_mtp.py`` over V3.2's decoder layer):
    DeepSeek-V3's layer whose latent attention reads only the ``index_topk`` tokens its lightning
    indexer picks (DeepSeek sparse attention; vLLM builds an indexer in every MTP layer).

    The indexer reads the layer's normed input ``x`` and the query's low-rank ``q_a_layernorm(q_a_proj(x))``:
    ``index_n_heads`` queries from ``wq_b``, one key ``k_norm(wk(x))`` (a LayerNorm with bias), both
    rotated on their first ``qk_rope_head_dim`` values (neox halves; interleaved pairs where the config
    names ``indexer_rope_interleave``), and per-head weights ``weights_proj(x)``; a key's score is
    Σ_h weight_h · relu(q_h · k) / √(heads · head_dim), and each query keeps the top ``index_topk`` of
    its context's keys (its own included). Scores are in float32, as transformers computes them; vLLM
    quantizes the indexer's queries and keys to FP8, so where a context is longer than ``index_topk``
    the keys at the picks' margin can differ. Up to ``index_topk`` tokens of context every key is kept
    and the layer is V3's, exactly.
    """

    FAMILY = "DeepSeek-V3.2"
    INDEXER = ("indexer.wq_b", "indexer.wk", "indexer.k_norm", "indexer.k_norm.bias", "indexer.weights_proj")
    ROWS = 256  # queries scored at once: heads x keys floats each

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        m = model
        self.index_topk = int(m["index_topk"])
        self.index_heads, self.index_dim = int(m.get("index_n_heads") or 64), int(m.get("index_head_dim") or 128)
        self.index_rope = _rope_pairs if m.get("indexer_rope_interleave") else _rope_halves
        self._index = self._prefix_keys = None  # the last rows' (queries, weights, keys); the prefix pass's keys
        self._chain_keys: list = []

    @classmethod
    def _attention_params(cls, raw: dict[str, Any]) -> tuple[str, ...]:
        return (*super()._attention_params(raw), *cls.INDEXER)

    def _latent_qkv(self, x, positions):
        """MLA's q, k and v of ``x``; the indexer's queries, weights and keys of the same rows kept for
        the selection that follows."""
        torch = _torch()
        c, t = self.config, self.t
        shape = x.shape[:-1]
        low = _rms(x @ t["q_a_proj"].T, t["q_a_layernorm"], c.rms_norm_eps)
        q = (low @ t["indexer.wq_b"].T).view(*shape, self.index_heads, self.index_dim)
        k = torch.nn.functional.layer_norm(x @ t["indexer.wk"].T, (self.index_dim,), t["indexer.k_norm"],
                                           t["indexer.k_norm.bias"], eps=1e-6)[..., None, :]
        q, k = (torch.cat([self.index_rope(a[..., : self.rope_dim], positions, self.inv_freq, self.rope_gain),
                           a[..., self.rope_dim :]], dim=-1) for a in (q, k))
        weights = (x @ t["indexer.weights_proj"].T) * (self.index_heads * self.index_dim) ** -0.5
        self._index = (q, weights, k[..., 0, :])
        return super()._latent_qkv(x, positions)

    def _scores(self, queries, weights, keys):
        """The indexer's scores [A, n] of queries [A, H, D] (weights [A, H]) against keys [n, D], or
        [A, j, D] each row its own."""
        torch = _torch()
        out = []
        for a in range(0, len(queries), self.ROWS):
            q, w = queries[a : a + self.ROWS].float(), weights[a : a + self.ROWS].float()
            k = keys[a : a + self.ROWS] if keys.dim() == 3 else keys
            dots = torch.einsum("ahd,ajd->ahj" if keys.dim() == 3 else "ahd,nd->ahn", q, k.float()).relu()
            out.append(torch.einsum("ahn,ah->an", dots, w))
        return torch.cat(out)

    @staticmethod
    def _top(scores, allowed, topk: int):
        """``allowed`` [A, n] narrowed to each row's ``topk`` highest ``scores`` among those allowed."""
        torch = _torch()
        top = scores.masked_fill(~allowed, float("-inf")).topk(min(topk, scores.shape[-1]), dim=-1).indices
        return torch.zeros_like(allowed).scatter(-1, top, True) & allowed

    def _selected(self, positions, mask):
        queries, weights, keys = self._index
        self._prefix_keys = keys
        if len(positions) <= self.index_topk:  # every query's context fits: all of it is kept
            return mask
        causal = positions[None, :] <= positions[:, None]
        allowed = causal if mask is None else mask
        return self._top(self._scores(queries, weights, keys), allowed, self.index_topk)

    def _chain_selected(self, step: int, positions, prefix_mask):
        torch = _torch()
        queries, weights, keys = self._index
        if step == 1:
            self._chain_keys = []
        self._chain_keys.append(keys)
        if int(positions.max()) + 1 <= self.index_topk:
            return prefix_mask, None
        own = torch.stack(self._chain_keys, dim=1)  # [A, step, D]
        scores = torch.cat([self._scores(queries, weights, self._prefix_keys), self._scores(queries, weights, own)], dim=-1)
        allowed = torch.cat([prefix_mask, torch.ones(len(queries), step, dtype=torch.bool)], dim=-1)
        picked = self._top(scores, allowed, self.index_topk)
        n = prefix_mask.shape[-1]
        return picked[:, :n], picked[:, n:]


class GlmMoeDsaMTPHead(DeepSeekV32MTPHead):
    """A GLM-5 target's MTP layer (``glm_moe_dsa``): vLLM serves GLM-5 as DeepSeek-V3.2 (its
    ``deepseek_mtp`` over the same sparse layer), the routing and the indexer's RoPE as the config names
    them (GLM-5's: sigmoid scores with a correction bias, ``indexer_rope_interleave``)."""

    FAMILY = "GLM-5"


class Glm4MoeLiteMTPHead(DeepSeekMTPHead):
    """A GLM-4.7-Flash target's MTP layer (vLLM's ``glm4_moe_lite_mtp.py``): DeepSeek's layer
    (multi-head latent attention, rotated in interleaved pairs) under GLM's routing (sigmoid scores)
    and GLM's return — the residual sum before ``shared_head.norm`` is the next step's state."""

    FAMILY = "GLM-4.7-Flash"
    _scoring = staticmethod(Glm4MoeMTPHead._scoring)
    _finish = Glm4MoeMTPHead._finish


class GlmOcrMTPHead(Glm4MoeMTPHead):
    """A GLM-OCR target's MTP layer (vLLM's ``glm_ocr_mtp.py``), chained as an EAGLE head is.

    Read from the multimodal checkpoint's text model as ``model.language_model.layers.{L}.*``:
    ``eh_proj([enorm(embed(token)), hnorm(state)])``, the embedding zeroed at position 0, the
    target's normed last state first; then GLM-4's dense decoder layer (vLLM's ``Glm4DecoderLayer``):
    grouped-query attention rotated in interleaved pairs on the first ``partial_rotary_factor``
    (default ½) of each head — its M-RoPE is plain RoPE on text — with the attention's and the MLP's
    outputs each normed before their residual sums (``post_self_attn_layernorm``,
    ``post_mlp_layernorm``); the MLP's gate and up projections stored as one ``gate_up_proj``. As
    GLM-4.5's, the residual sum before ``shared_head.norm`` is the next step's state; the LM head and
    the embedding are the target's.
    """

    PARAMS = (*Glm4MoeMTPHead.PARAMS, "post_self_attn_layernorm", "post_mlp_layernorm")
    FAMILY = "GLM-OCR"
    DENSE = True

    @classmethod
    def _attention_params(cls, raw: dict[str, Any]) -> tuple[str, ...]:
        return ("q_proj.bias", "k_proj.bias", "v_proj.bias") if raw.get("attention_bias") else ()

    @classmethod
    def load(cls, directory: Path, target_dir: Path | None = None) -> GlmOcrMTPHead:
        """The first MTP layer of the checkpoint ``directory`` (its text model's layer L), with the
        checkpoint's embeddings and LM head."""
        directory = Path(directory)
        config, raw = read_config(directory, cls.METHOD)
        layer = int(raw["num_hidden_layers"])
        prefix = f"model.language_model.layers.{layer}."
        named = _layer_tensors(directory, prefix) or _layer_tensors(directory, prefix := f"model.layers.{layer}.")
        named = {key.replace("shared_head.norm", "final_layernorm"): value for key, value in named.items()
                 if not key.startswith(("embed_tokens", "shared_head.head"))}  # vLLM shares the target's
        if "gate_up_proj" in named:
            named["gate_proj"], named["up_proj"] = named.pop("gate_up_proj").chunk(2, dim=0)
        return cls._complete(cls(config, named, target_embeddings(directory), model=raw), raw, directory, f"{prefix}*")

    def _rope(self, x, positions):
        """Interleaved pairs on the first ``rotary_dim`` of each head, the rest passing."""
        rot = self.rotary_dim
        return _torch().cat([_rope_pairs(x[..., :rot], positions, self.inv_freq), x[..., rot:]], dim=-1)

    def _block(self, attn, residual):
        """o_proj and its norm, add, the MLP between ``post_attention_layernorm`` and
        ``post_mlp_layernorm``, add: the layer's pre-norm output."""
        eps, t = self.config.rms_norm_eps, self.t
        residual = _rms(self._output(attn), t["post_self_attn_layernorm"], eps) + residual
        return _rms(self._mlp(_rms(residual, t["post_attention_layernorm"], eps)), t["post_mlp_layernorm"], eps) + residual


class Qwen3NextMTPHead(EhProjMTPHead):
    """A Qwen3-Next target's MTP layer (vLLM's ``qwen3_next_mtp.py``), chained as an EAGLE head is.

    Read from the target as ``mtp.*``: ``fc([pre_fc_norm_embedding(embed(token)),
    pre_fc_norm_hidden(state)])`` — the embedding not zeroed at position 0 — through one of the
    target's full-attention decoder layers: the query projection carries a per-head output gate
    (``sigmoid(gate) · attention`` before ``o_proj``), per-head q/k norms, neox RoPE on the first
    ``partial_rotary_factor`` of each head; its MLP a softmax top-k mixture of experts plus one
    shared expert scaled by ``sigmoid(shared_expert_gate)`` (or dense, as the target's
    ``mlp_only_layers`` / ``decoder_sparse_step`` say for layer 0). ``mtp.norm`` of the residual sum is
    both what the LM head reads and the next step's state. Every norm is zero-centred (Gemma's
    ``x · (1 + w)``): the weights are read as ``1 + w``.
    """

    PARAMS = ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc", "input_layernorm", "o_proj",
              "post_attention_layernorm", "final_layernorm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm")
    NORMS = ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "input_layernorm", "post_attention_layernorm",
             "final_layernorm", "q_norm", "k_norm")
    FAMILY = "Qwen3-Next"
    ROTARY = 0.25  # the share of each head RoPE turns where the config names none

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        m = model
        # vLLM numbers the MTP layer 0 ("mtp.layers.0"), and picks its MLP by that index
        self.moe = (not self.DENSE and int(m.get("num_experts") or 0) > 0 and 0 not in (m.get("mlp_only_layers") or [])
                    and 1 % int(m.get("decoder_sparse_step") or 1) == 0)
        self.routing |= {"groups": 1, "topk_group": 1, "scoring": "softmax", "scale": 1.0}
        self._partial_rotary(model, default=self.ROTARY)

    @classmethod
    def load(cls, directory: Path, target_dir: Path | None = None) -> Qwen3NextMTPHead:
        """The first MTP layer of the checkpoint ``directory`` (``mtp.layers.0.*`` and ``mtp.fc``, its
        norms), with the checkpoint's embeddings and LM head."""
        directory = Path(directory)
        config, raw = read_config(directory, cls.METHOD)
        top = {"final_layernorm" if key == "norm" else key: value
               for key, value in _layer_tensors(directory, "mtp.").items() if not key.startswith("layers.")}
        named = top | _layer_tensors(directory, "mtp.layers.0.")
        for norm in cls.NORMS:
            if norm in named:
                named[norm] = named[norm] + 1.0
        return cls._complete(cls(config, named, target_embeddings(directory), model=raw), raw, directory, "mtp.*")

    def _fc(self, tokens, hidden):
        """``fc([pre_fc_norm_embedding(embed), pre_fc_norm_hidden(state)])``."""
        c, t = self.config, self.t
        e = _rms(self.embed[tokens], t["pre_fc_norm_embedding"], c.rms_norm_eps)
        return _torch().cat([e, _rms(hidden, t["pre_fc_norm_hidden"], c.rms_norm_eps)], dim=-1) @ t["fc"].T

    def _layer_input(self, tokens, hidden, positions):
        """:meth:`_fc` (the residual), and its ``input_layernorm``."""
        x = self._fc(tokens, hidden)
        return _rms(x, self.t["input_layernorm"], self.config.rms_norm_eps), x

    def _qkv(self, tokens, hidden, positions):
        """q (its gate split off per head), k, v; the residual carries the gate to :meth:`_block`."""
        c, t = self.config, self.t
        x, residual = self._layer_input(tokens, hidden, positions)
        shape = x.shape[:-1]
        q, gate = (x @ t["q_proj"].T).view(*shape, c.num_heads, 2 * c.head_dim).chunk(2, dim=-1)
        k = (x @ t["k_proj"].T).view(*shape, c.num_kv_heads, c.head_dim)
        v = (x @ t["v_proj"].T).view(*shape, c.num_kv_heads, c.head_dim)
        q, k = _rms(q, t["q_norm"], c.rms_norm_eps), _rms(k, t["k_norm"], c.rms_norm_eps)
        return self._rope(q, positions), self._rope(k, positions), v, GatedResidual(residual, gate)

    def _block(self, attn, residual):
        return super()._block(attn * residual.gate.sigmoid(), residual.residual)

    def _shared_experts(self, flat):
        t = self.t
        if "shared_expert.gate_proj" not in t:
            return 0
        return _mlp(t, "shared_expert.", flat) * (flat @ t["shared_expert_gate"].T).sigmoid()


class Qwen3_5MTPHead(Qwen3NextMTPHead):
    """A Qwen3.5 target's MTP layer (vLLM's ``qwen3_5_mtp.py``): Qwen3-Next's, read from the text
    model's config; its MLP a mixture of experts where the text model is ``qwen3_5_moe_text``, else
    dense. Its M-RoPE is plain RoPE on text (every section at the token's position)."""

    FAMILY = "Qwen3.5"

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        self.moe = model.get("model_type") == "qwen3_5_moe_text"


class ErnieMTPHead(EhProjMTPHead):
    """An ERNIE-4.5 MoE target's MTP layer (vLLM's ``ernie_mtp.py``), chained as an EAGLE head is.

    Read from the target as ``model.mtp_emb_norm.0``, ``model.mtp_hidden_norm.0``,
    ``model.mtp_linear_proj.0`` and ``model.mtp_block.0.*``: ``mtp_linear_proj([mtp_emb_norm(embed),
    mtp_hidden_norm(state)])`` — the embedding zeroed at position 0 — through vLLM's Llama decoder
    layer: no biases, neox RoPE over the whole head (the target's own layers rotate interleaved
    pairs), a dense MLP of ``intermediate_size`` though the target's later layers are experts. There
    is no final norm: the layer's residual sum is both what the LM head reads and the next step's
    state. The first pass reads the target's normed last hidden state.
    """

    PARAMS = ("enorm", "hnorm", "eh_proj", "input_layernorm", "o_proj", "post_attention_layernorm",
              "q_proj", "k_proj", "v_proj")
    FAMILY = "ERNIE-4.5"
    NAMES = {"emb_norm.0": "enorm", "hidden_norm.0": "hnorm", "linear_proj.0": "eh_proj"}  # model.mtp_* → the layout's
    DENSE = True

    @classmethod
    def load(cls, directory: Path, target_dir: Path | None = None) -> ErnieMTPHead:
        """The MTP layer of the checkpoint ``directory``, with its embeddings and LM head."""
        directory = Path(directory)
        config, raw = read_config(directory, cls.METHOD)
        top = _layer_tensors(directory, "model.mtp_")
        named = _layer_tensors(directory, "model.mtp_block.0.") | {key: top[name] for name, key in cls.NAMES.items() if name in top}
        return cls._complete(cls(config, named, target_embeddings(directory), model=raw), raw, directory,
                             "model.mtp_*.0")

    def _finish(self, attn, residual):
        """The layer's residual sum, unnormed: the LM head's input and the next state alike."""
        prenorm = self._block(attn, residual)
        return prenorm, prenorm


class ExaoneMoeMTPHead(Qwen3NextMTPHead):
    """A K-EXAONE (EXAONE-MoE) target's MTP layer (vLLM's ``exaone_moe_mtp.py``), chained as an EAGLE
    head is.

    Read as Qwen3-Next's is (``mtp.fc`` over ``[pre_fc_norm_embedding(embed), pre_fc_norm_hidden(state)]``,
    the embedding not zeroed; ``mtp.layers.0.*``; ``mtp.norm`` of the residual sum both the logits'
    input and the next state), but its norms are plain RMS norms (``x · w``) and its layer is
    EXAONE's: per-head q/k norms, no output gate, neox RoPE over the whole head (the MTP layer always
    rotates, where the target's global layers do not), a dense MLP of ``intermediate_size``, and the
    attention of the target's first layer type (``mtp_layer_types`` where the config has them): a
    sliding window where that type is ``sliding_attention``.
    """

    PARAMS = ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc", "input_layernorm", "o_proj",
              "post_attention_layernorm", "final_layernorm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm")
    NORMS = ()
    FAMILY = "K-EXAONE"
    ROTARY = 1.0
    DENSE = True

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        self.window = self.layer_window(model)

    @staticmethod
    def layer_window(model: dict[str, Any]) -> int | None:
        """The MTP layer's sliding window (None: full attention), by the target's first layer type."""
        types = model.get("mtp_layer_types") or model.get("layer_types") or ["full_attention"]
        windows = model.get("mtp_sliding_windows") or model.get("sliding_windows")
        if types[0] == "full_attention":
            return None
        return int(windows[0] if windows else model["sliding_window"])

    _qkv = Glm4MoeMTPHead._qkv
    _block = Eagle3Head._block


class Exaone4_5MTPHead(ExaoneMoeMTPHead):
    """An EXAONE-4.5 target's MTP layer (vLLM's ``exaone4_5_mtp.py``), chained as an EAGLE head is.

    Read as K-EXAONE's is (``mtp.fc`` over ``[pre_fc_norm_embedding(embed), pre_fc_norm_hidden(state)]``,
    the embedding not zeroed; ``mtp.layers.0.*``; ``mtp.norm`` of the layer's output both the logits'
    input and the next state; plain norms), from the multimodal checkpoint beside its text model, through
    EXAONE 4's decoder layer: no input norm — the attention's and the MLP's outputs are each normed
    before their sums (``post_attention_layernorm``, ``post_feedforward_layernorm``) — per-head q/k norms,
    the attention of the text model's first layer type (a sliding window where that is
    ``sliding_attention``), and neox RoPE over the whole head (Llama 3's scaling where the config names
    it) only where the layer slides or the model has no sliding layers: EXAONE 4's global layers are NoPE.
    """

    PARAMS = ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc", "o_proj", "post_attention_layernorm",
              "post_feedforward_layernorm", "final_layernorm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm")
    FAMILY = "EXAONE-4.5"

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        self.rotates = self.window is not None or "sliding_attention" not in (model.get("layer_types") or [])
        rope = model.get("rope_parameters") or model.get("rope_scaling") or {}
        if (rope.get("rope_type") or rope.get("type")) == "llama3":
            self.inv_freq, _ = _scaled_rope(model, "llama3")

    @staticmethod
    def layer_window(model: dict[str, Any]) -> int | None:
        """The MTP layer's sliding window (None: full attention): vLLM builds it as the text model's layer 0."""
        types = model.get("layer_types") or ["full_attention"]
        return int(model["sliding_window"]) if types[0] == "sliding_attention" else None

    def _layer_input(self, tokens, hidden, positions):
        """:meth:`_fc` unnormed (EXAONE 4 has no input norm): what q/k/v read, and the residual."""
        x = self._fc(tokens, hidden)
        return x, x

    def _rope(self, x, positions):
        return super()._rope(x, positions) if self.rotates else x

    def _block(self, attn, residual):
        """o_proj and its norm, add, the MLP and its norm, add: the layer's output."""
        eps, t = self.config.rms_norm_eps, self.t
        residual = _rms(self._output(attn), t["post_attention_layernorm"], eps) + residual
        return _rms(self._mlp(residual), t["post_feedforward_layernorm"], eps) + residual


class HyV3MTPHead(EhProjMTPHead):
    """A Hunyuan 3 (HY V3) target's MTP layer (vLLM's ``hy_v3_mtp.py``), chained as an EAGLE head is.

    Read as DeepSeek's is (``model.layers.{L}.*``; ``eh_proj([enorm(embed(token)), hnorm(state)])``,
    the embedding zeroed at position 0; the target's normed last state first), through HY V3's
    decoder layer: grouped-query attention without biases, per-head q/k norms (where ``qk_norm``)
    before neox RoPE over the whole head; a dense MLP below ``first_k_dense_replace``, else
    sigmoid-scored experts (``expert_bias`` for choosing only, renormalised where ``route_norm``,
    times ``router_scaling_factor``) plus the shared MLP. ``final_layernorm`` of the residual sum is
    both what the LM head reads — the target's ``lm_head``, not the checkpoint's ``shared_head`` —
    and the next step's state.
    """

    PARAMS = (*EhProjMTPHead.PARAMS, "q_proj", "k_proj", "v_proj")
    FAMILY = "Hunyuan 3"
    # the checkpoint's MoE names → the ones the experts' code reads (DeepSeek's)
    NAMES = {"router.gate": "gate", "expert_bias": "gate.e_score_correction_bias", "shared_mlp.": "shared_experts."}

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        m = model
        layer = int(m["num_hidden_layers"])  # vLLM builds the layer by its index, as the target's
        self.moe = int(m.get("num_experts") or 0) > 1 and layer >= int(m.get("first_k_dense_replace") or 0)
        # vLLM reads route_norm without a default; Hy3's config names it
        self.routing |= {"groups": 1, "topk_group": 1, "scoring": "sigmoid", "renormalize": bool(m.get("route_norm", True)),
                         "scale": float(m.get("router_scaling_factor") or 1.0)}
        self._partial_rotary(model, default=1.0)

    @classmethod
    def _attention_params(cls, raw: dict[str, Any]) -> tuple[str, ...]:
        return ("q_norm", "k_norm") if raw.get("qk_norm") else ()

    @classmethod
    def load(cls, directory: Path, target_dir: Path | None = None) -> HyV3MTPHead:
        """The first MTP layer of the checkpoint ``directory``, with its embeddings and LM head."""
        directory = Path(directory)
        config, raw = read_config(directory, cls.METHOD)
        prefix = f"model.layers.{int(raw['num_hidden_layers'])}."
        named = {}
        for key, value in _layer_tensors(directory, prefix).items():
            if key.startswith(("embed_tokens", "shared_head")):  # vLLM uses the target's
                continue
            if key in ("q_norm", "k_norm") and not raw.get("qk_norm"):  # vLLM leaves them unread
                continue
            for old, new in cls.NAMES.items():
                if key.startswith(old):
                    key = new + key.removeprefix(old)
            named[key] = value
        return cls._complete(cls(config, named, target_embeddings(directory), model=raw), raw, directory, f"{prefix}*")

    _qkv = Glm4MoeMTPHead._qkv


class MiMoV2MTPHead(EhProjMTPHead):
    """A MiMo-V2-Flash target's first MTP layer (vLLM's ``mimo_v2_mtp.py``, which runs only that one),
    chained as an EAGLE head is.

    Read from the target as ``model.mtp.layers.0.*``: ``eh_proj([enorm(embed(token)), hnorm(state)])``
    — the embedding not zeroed at position 0; the target's normed last state first — through a
    sliding-window attention layer of the target's window sizes (``swa_*``: heads, head dims,
    ``sliding_window_size``, ``swa_rope_theta``), neox RoPE on the first ``partial_rotary_factor`` of
    each head, values times ``attention_value_scale``, a sink logit per head where
    ``add_swa_attention_sink_bias``; ``pre_mlp_layernorm`` and a dense MLP. ``final_layernorm`` of
    the residual sum is both what the target's LM head reads and the next step's state.
    """

    PARAMS = ("enorm", "hnorm", "eh_proj", "input_layernorm", "o_proj", "post_attention_layernorm", "final_layernorm",
              "q_proj", "k_proj", "v_proj")
    FAMILY = "MiMo-V2-Flash"
    DENSE = True
    PREFIX = "model.mtp.layers.0."

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        m = model
        self.window = self.layer_window(m)
        self.v_head_dim = int(m.get("swa_v_head_dim") or config.head_dim)
        self.v_scale = m.get("attention_value_scale")
        self.sinks = tensors.get("sinks") if m.get("add_swa_attention_sink_bias") else None
        self._partial_rotary({"partial_rotary_factor": m.get("partial_rotary_factor")}, default=1.0)

    @staticmethod
    def layer_window(model: dict[str, Any]) -> int | None:
        """The layer's sliding window (vLLM's ``sliding_window_size``; −1: none)."""
        window = int(model.get("sliding_window_size", -1))
        return window if window > -1 else None

    @classmethod
    def _attention_params(cls, raw: dict[str, Any]) -> tuple[str, ...]:
        return ("sinks",) if raw.get("add_swa_attention_sink_bias") else ()

    NAMES = {"pre_mlp_layernorm": "post_attention_layernorm", "attention_sink_bias": "sinks"}

    @classmethod
    def load(cls, directory: Path, target_dir: Path | None = None) -> MiMoV2MTPHead:
        """The first MTP layer of the checkpoint ``directory``, with its embeddings and LM head."""
        return cls._load_prefixed(directory)

    def _layer_input(self, tokens, hidden, positions):
        """``eh_proj([enorm(embed), hnorm(state)])`` (the residual, the embedding kept at position
        0), and its ``input_layernorm``."""
        c, t = self.config, self.t
        x = _torch().cat([_rms(self.embed[tokens], t["enorm"], c.rms_norm_eps), _rms(hidden, t["hnorm"], c.rms_norm_eps)],
                         dim=-1) @ t["eh_proj"].T
        return _rms(x, t["input_layernorm"], c.rms_norm_eps), x

    def _qkv(self, tokens, hidden, positions):
        c, t = self.config, self.t
        x, residual = self._layer_input(tokens, hidden, positions)
        shape = x.shape[:-1]
        q = (x @ t["q_proj"].T).view(*shape, c.num_heads, c.head_dim)
        k = (x @ t["k_proj"].T).view(*shape, c.num_kv_heads, c.head_dim)
        v = (x @ t["v_proj"].T).view(*shape, c.num_kv_heads, self.v_head_dim)
        if self.v_scale is not None:
            v = v * float(self.v_scale)
        return self._rope(q, positions), self._rope(k, positions), v, residual


class NemotronHMTPHead(EhProjMTPHead):
    """A Nemotron-H (Nemotron 3) target's MTP layer (vLLM's ``nemotron_h_mtp.py``), chained as an EAGLE
    head is.

    Read from the target as ``mtp.layers.{0,1}.*``: the blocks of ``mtp_hybrid_override_pattern`` "*E",
    an attention block then a block of experts, each normed (``norm``) before its mixer and added to the
    residual — one pre-norm decoder layer. Block 0 reads ``eh_proj([enorm(embed(token)), hnorm(state)])``
    (the embedding not zeroed at position 0; the target's normed last state first). The attention has no
    RoPE (Nemotron-H's mamba layers place the tokens) and no biases. The experts are routed as
    DeepSeek's (sigmoid scores, a correction bias for choosing only, in groups, renormalised where
    ``norm_topk_prob``, times ``routed_scaling_factor``) but ungated, ``down(relu(up(x))²)``, and run in
    the latent width where the config names ``moe_latent_size`` (``fc1_latent_proj`` in,
    ``fc2_latent_proj`` out); the shared experts are one ungated MLP over the full width. Block 1's
    ``final_layernorm`` of the residual sum is both what the target's LM head reads and the next
    step's state.
    """

    PARAMS = ("enorm", "hnorm", "eh_proj", "input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj",
              "post_attention_layernorm", "final_layernorm")
    EXPERT_PARAMS = ("gate", "gate.e_score_correction_bias", "experts.0.up_proj", "experts.0.down_proj")
    FAMILY = "Nemotron-H"
    PREFIX = "mtp.layers."
    # the blocks' pre-norms as the one layer's: the attention's input norm, the experts' post-attention one
    NAMES = {"0.norm": "input_layernorm", "1.norm": "post_attention_layernorm"}

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        self.moe = True  # the pattern's "E"
        self.routing |= {"scoring": "sigmoid"}
        self.window = self.layer_window(model)

    @staticmethod
    def layer_window(model: dict[str, Any]) -> int | None:
        """The attention's sliding window (vLLM's ``sliding_window``; none by default)."""
        return int(model["sliding_window"]) if model.get("sliding_window") else None

    @staticmethod
    def shape_config(config: dict[str, Any], layers: int) -> dict[str, Any]:
        """The target's config as a model of its MTP blocks alone (``layers`` of them in turn), for sizing."""
        pattern = nemotron_h_mtp_pattern(config) * layers
        named = ("layers_block_type", "layer_types", "hybrid_override_pattern", "mtp_layers_block_type")
        return {k: v for k, v in config.items() if k not in named} | {"hybrid_override_pattern": pattern,
                                                                     "num_hidden_layers": len(pattern)}

    @classmethod
    def _layer_name(cls, key: str) -> str:
        return cls.NAMES.get(key, key).replace("mixer.", "", 1).removeprefix("0.").removeprefix("1.")

    @classmethod
    def load(cls, directory: Path, target_dir: Path | None = None) -> NemotronHMTPHead:
        """The MTP blocks of the checkpoint ``directory``, with its embeddings and LM head."""
        return cls._load_prefixed(directory)

    def _rope(self, x, positions):
        return x

    _layer_input = MiMoV2MTPHead._layer_input
    _qkv = Glm4MoeMTPHead._qkv

    def _routed(self, flat, ids, weights):
        """The experts in the latent width, where the config names one."""
        t = self.t
        if "fc1_latent_proj" not in t:
            return super()._routed(flat, ids, weights)
        return super()._routed(flat @ t["fc1_latent_proj"].T, ids, weights) @ t["fc2_latent_proj"].T

    def _expert(self, prefix: str, x):
        return _relu2_mlp(self.t, prefix, x)

    def _shared_experts(self, flat):
        return _relu2_mlp(self.t, "shared_experts.", flat) if "shared_experts.up_proj" in self.t else 0


class LongCatMTPHead(DeepSeekMTPHead):
    """A LongCat-Flash target's MTP layer (vLLM's ``longcat_flash_mtp.py``), chained as an EAGLE head is.

    Read from the target as ``model.mtp.*``: ``eh_proj([enorm(embed(token)), hnorm(state)])`` — the
    embedding not zeroed at position 0; the target's normed last state first — through DeepSeek-V2's
    decoder layer, dense (an MLP of ``ffn_hidden_size``, named ``transformer_layer.mlp``): latent
    attention whose LoRA norms are scaled as vLLM loads them (``q_a_layernorm`` times
    √(hidden / q_lora_rank) where ``mla_scale_q_lora``, ``kv_a_layernorm`` times √(hidden / kv_lora_rank)
    where ``mla_scale_kv_lora``). ``model.mtp.norm`` of the residual sum is both what the LM head reads
    and the next step's state. vLLM shares the target's embedding and LM head (the layer's own
    ``embed_tokens`` copy is not read).
    """

    FAMILY = "LongCat-Flash"
    DENSE = True
    PREFIX = "model.mtp."
    NAMES = {"enorm.m": "enorm", "hnorm.m": "hnorm", "norm": "final_layernorm"}  # model.mtp.* → the layout's

    @staticmethod
    def shape_config(config: dict[str, Any], layers: int) -> dict[str, Any]:
        """The layer as a dense DeepSeek-V3 model of ``layers`` layers (its MLP ``ffn_hidden_size`` wide), for sizing."""
        own = ("num_layers", "n_routed_experts", "zero_expert_num", "moe_topk", "expert_ffn_hidden_size", "architectures")
        return {k: v for k, v in config.items() if k not in own} | {
            "model_type": "deepseek_v3", "num_hidden_layers": layers, "intermediate_size": int(config["ffn_hidden_size"]),
            "layer_types": ["full_attention"] * layers}

    def __init__(self, config: HeadConfig, tensors: dict[str, Any], embed, d2t=None, *, model: dict[str, Any]):
        super().__init__(config, tensors, embed, d2t, model=model)
        for norm, rank, flag in (("q_a_layernorm", "q_lora_rank", "mla_scale_q_lora"),
                                 ("kv_a_layernorm", "kv_lora_rank", "mla_scale_kv_lora")):
            if model.get(flag) and norm in self.t:  # as vLLM's loader scales them
                self.t[norm] = self.t[norm] * (int(model["hidden_size"]) / int(model[rank])) ** 0.5

    @classmethod
    def _layer_name(cls, key: str) -> str | None:
        key = key.removeprefix("layers.0.").removeprefix("transformer_layer.mlp.").removeprefix("self_attn.")
        return None if key == "embed_tokens" else cls.NAMES.get(key, key)  # vLLM shares the target's embedding

    @classmethod
    def load(cls, directory: Path, target_dir: Path | None = None) -> LongCatMTPHead:
        """The MTP layer of the checkpoint ``directory``, with its embeddings and LM head."""
        return cls._load_prefixed(directory)

    _layer_input = MiMoV2MTPHead._layer_input


class GatedResidual(NamedTuple):
    """A layer's residual with the attention's output gate (Qwen3-Next's), from q/k/v to the block."""

    residual: Any
    gate: Any


def _layer_tensors(directory: Path, prefix: str) -> dict[str, Any]:
    """The checkpoint's tensors under ``prefix`` as the heads name them (no ``self_attn.`` / ``mlp.``
    group, no ``.weight``), in float32 — an FP8 weight times its scales (:func:`_read_weight`)."""

    named: dict[str, Any] = {}
    block = _weight_block(directory)
    with _checkpoint(directory) as where:
        for name in where:
            if name.startswith(prefix) and not name.endswith(FP8_SCALES):
                key = name.removeprefix(prefix)
                for group in ("self_attn.", "mlp."):
                    key = key.removeprefix(group)
                named[key.removesuffix(".weight")] = _read_weight(where, name, block, directory)
    return named


@contextlib.contextmanager
def _checkpoint(directory: Path):
    """Every tensor name of the checkpoint ``directory`` → the open shard that holds it (each shard
    opened once, for as long as the block runs)."""
    from safetensors import safe_open

    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), "pt")) for f in sorted(Path(directory).glob("*.safetensors"))]
        yield {name: handle for handle in handles for name in handle.keys()}


# an FP8 weight's scales as checkpoints name them: DeepSeek's and Qwen's per block (``quant_method: fp8``,
# ``weight_block_size``, the inverse scale stored), compressed-tensors' per channel or per tensor
FP8_SCALES = (".weight_scale_inv", ".weight_scale")
# 4- and 8-bit integer and FP4 formats (AWQ/GPTQ, compressed-tensors' packed, ModelOpt's NVFP4, MXFP4)
_UNREAD_QUANTIZED = (".qweight", ".weight_packed", ".weight_scale_2", "_blocks")


def _weight_block(directory: Path) -> tuple[int, int] | None:
    """The block of an FP8 checkpoint's scales (``quantization_config.weight_block_size``), or None."""
    path = Path(directory) / "config.json"
    raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    quant = raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config") or {}
    block = quant.get("weight_block_size")
    return (int(block[0]), int(block[1])) if block else None


def _read_weight(where, name: str, block: tuple[int, int] | None, directory: Path):
    """A checkpoint tensor (``where``: :func:`_checkpoint`'s index) in float32: an FP8 ``*.weight`` times
    its scale — per ``block`` of the weight where the scale is a grid, per output channel or whole
    otherwise, as vLLM dequantizes it. A weight in a format draftfit does not read stops with the fix."""
    torch = _torch()
    stem = name.removesuffix(".weight")
    if name.endswith(_UNREAD_QUANTIZED) or (name.endswith(".weight") and stem + ".weight_scale_2" in where):
        raise DraftfitError(f"{name} is quantized in a format this draftfit version does not read offline (it reads "
                            "float weights and FP8 ones with their scales)", where=str(directory),
                            fix="Point draftfit at the checkpoint's BF16 or FP8 release")
    tensor = where[name].get_tensor(name)
    if tensor.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        if name.endswith(".weight") and not tensor.is_floating_point():
            raise DraftfitError(f"{name} holds {tensor.dtype} values, a quantized format this draftfit version does not "
                                "read offline", where=str(directory), fix="Point draftfit at the checkpoint's BF16 or FP8 release")
        return tensor.float()
    scale_name = next((stem + suffix for suffix in FP8_SCALES if stem + suffix in where), None)
    if scale_name is None:
        raise DraftfitError(f"{name} is FP8 without a scale beside it ({' or '.join(stem + s for s in FP8_SCALES)})",
                            where=str(directory), fix="Point draftfit at a complete checkpoint")
    weight, scale = tensor.float(), where[scale_name].get_tensor(scale_name).float()
    if scale.dim() == 2 and (block is not None or scale.shape[0] != weight.shape[0]):  # one scale per block
        rows, cols = block or (-(-weight.shape[0] // scale.shape[0]), -(-weight.shape[1] // scale.shape[1]))
        scale = scale.repeat_interleave(rows, 0)[: weight.shape[0]].repeat_interleave(cols, 1)[:, : weight.shape[1]]
    elif scale.dim() == 1 and scale.numel() == weight.shape[0] > 1:  # one per output channel
        scale = scale[:, None]
    return weight * scale


def _scaled_rope(model: dict[str, Any], rope_type: str):
    """transformers' RoPE frequencies and cos/sin gain of the scaling ``rope_type`` (YaRN, Llama 3's)
    for the layer config ``model`` — what vLLM's scaled rotary embeddings compute."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = AutoConfig.for_model(model["model_type"], **{k: v for k, v in model.items()
                                                       if k not in ("model_type", "architectures", "auto_map")})
    inv, gain = ROPE_INIT_FUNCTIONS[rope_type](hf)
    return inv.float(), float(gain)


def _rope_halves(x, positions, inv_freq, gain: float = 1.0):
    """Neox-style rotary embedding of ``x`` [..., n, heads, 2·len(inv_freq)] at ``positions`` [..., n]:
    the two halves rotated together, vLLM's ``is_neox_style=True``; cos/sin times ``gain``."""
    torch = _torch()
    freqs = positions.float()[..., None] * inv_freq  # [..., n, hd/2]
    cos = (torch.cat([freqs.cos(), freqs.cos()], dim=-1) * gain)[..., None, :]
    sin = (torch.cat([freqs.sin(), freqs.sin()], dim=-1) * gain)[..., None, :]
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def _rope_pairs(x, positions, inv_freq, gain: float = 1.0):
    """GPT-J-style rotary embedding of ``x`` [..., n, heads, 2·len(inv_freq)] at ``positions`` [..., n]:
    interleaved pairs, vLLM's ``is_neox_style=False``; cos/sin times ``gain``."""
    torch = _torch()
    freqs = positions.float()[..., None] * inv_freq  # [..., n, rope/2]
    cos, sin = (freqs.cos() * gain)[..., None, :], (freqs.sin() * gain)[..., None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def _mlp(t: dict[str, Any], prefix: str, x):
    """A SiLU-gated MLP of tensors ``{prefix}gate_proj`` / ``up_proj`` / ``down_proj``."""
    torch = _torch()
    return (torch.nn.functional.silu(x @ t[f"{prefix}gate_proj"].T) * (x @ t[f"{prefix}up_proj"].T)) @ t[f"{prefix}down_proj"].T


def _relu2_mlp(t: dict[str, Any], prefix: str, x):
    """An ungated MLP of tensors ``{prefix}up_proj`` / ``down_proj``, squared ReLU between (Nemotron-H's)."""
    return _torch().relu(x @ t[f"{prefix}up_proj"].T).square() @ t[f"{prefix}down_proj"].T


HEADS = {cls.METHOD: cls for cls in (Eagle3Head, EagleHead, MTPHead)}
MTP_LAYOUTS = {MTP_ARCHITECTURE: MTPHead, DEEPSEEK_MTP_ARCHITECTURE: DeepSeekMTPHead,
               DEEPSEEK_V32_MTP_ARCHITECTURE: DeepSeekV32MTPHead, GLM_DSA_MTP_ARCHITECTURE: GlmMoeDsaMTPHead,
               GLM_MTP_ARCHITECTURE: Glm4MoeMTPHead,
               GLM_LITE_MTP_ARCHITECTURE: Glm4MoeLiteMTPHead, QWEN3_NEXT_MTP_ARCHITECTURE: Qwen3NextMTPHead,
               ERNIE_MTP_ARCHITECTURE: ErnieMTPHead,
               **dict.fromkeys(QWEN3_5_MTP_ARCHITECTURES, Qwen3_5MTPHead),
               **dict.fromkeys(EXAONE_MOE_MTP_ARCHITECTURES, ExaoneMoeMTPHead), HY_V3_MTP_ARCHITECTURE: HyV3MTPHead,
               MIMO_V2_MTP_ARCHITECTURE: MiMoV2MTPHead, GLM_OCR_MTP_ARCHITECTURE: GlmOcrMTPHead,
               EXAONE4_5_MTP_ARCHITECTURE: Exaone4_5MTPHead, NEMOTRON_H_MTP_ARCHITECTURE: NemotronHMTPHead,
               LONGCAT_MTP_ARCHITECTURE: LongCatMTPHead}


def load_head(directory: Path, target_dir: Path | None = None, method: str | None = None) -> Eagle3Head:
    """The head of ``directory`` as the class of its method (``method``, else what its config says;
    an MTP layer as the class of its target's layout)."""
    from draftfit.compat.heads import is_assistant
    from draftfit.gemma4_assistant import Gemma4Assistant

    if method in (None, "mtp") and is_assistant(json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))):
        if target_dir is None:
            raise DraftfitError("a Gemma 4 assistant reads its target's embeddings", where=str(directory),
                                fix="Pass the target's directory")
        return Gemma4Assistant.load(directory, target_embeddings(target_dir))  # a draft of its own, beside the target
    config, _ = read_config(directory, method)
    cls = MTP_LAYOUTS[config.architecture] if config.method == "mtp" else HEADS[config.method]
    return cls.load(directory, target_dir)


def target_embeddings(target_dir: Path):
    """The target's input embeddings (what vLLM shares with a head that has none)."""
    return _target_tensor(target_dir, ("model.embed_tokens.weight", "embed_tokens.weight",
                                       "model.language_model.embed_tokens.weight", "backbone.embeddings.weight"))


def target_lm_head(target_dir: Path):
    try:
        return _target_tensor(target_dir, ("lm_head.weight",))
    except DraftfitError:
        return target_embeddings(target_dir)  # tied embeddings


def _target_tensor(target_dir: Path, names: Sequence[str]):
    with _checkpoint(target_dir) as where:
        for name in names:
            if name in where:
                return _read_weight(where, name, _weight_block(target_dir), target_dir)
    raise DraftfitError(f"the target has none of {', '.join(names)}", where=str(target_dir),
                        fix="Point the target at a transformers checkpoint with safetensors weights")


def _auto_model(target_dir: Path):
    """transformers' auto class of the target: its causal LM, else (a multimodal checkpoint with no
    text-only class, GLM-OCR's) the image-text-to-text model, whose hidden states are its text model's."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = json.loads((Path(target_dir) / "config.json").read_text(encoding="utf-8")).get("model_type")
    return AutoModelForCausalLM if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModelForImageTextToText


def load_target(target_dir: Path, dtype):
    """transformers' model of the target, in ``dtype``, for inference.

    A LongCat-Flash checkpoint holds gate and up projections for its routed experts only, as vLLM
    loads it; transformers' model stacks a row for each zero-computation expert too (an identity, never
    read) and refuses such a checkpoint ("mismatched_keys … gate_up_proj"). It is loaded without them and
    the routed experts' rows are filled from the checkpoint."""

    raw = json.loads((Path(target_dir) / "config.json").read_text(encoding="utf-8"))
    longcat = raw.get("model_type") == "longcat_flash"
    if not longcat:
        try:
            return _auto_model(target_dir).from_pretrained(str(target_dir), dtype=dtype).eval()
        except (RuntimeError, ValueError) as exc:
            if _weight_block(target_dir) is None or "CONVERSION" not in str(exc):
                raise
            # transformers dequantizes an FP8 checkpoint on a CPU only where each weight's sides are whole
            # multiples of its scales' grid; DeepSeek's latent projection (576 rows in 128-row blocks) is not
            raise DraftfitError("transformers cannot dequantize this FP8 checkpoint on this machine: without a GPU it "
                                "dequantizes weights whose sides are whole multiples of weight_block_size only (its report "
                                "above names the others)", where=str(target_dir),
                                fix="Run the target pass where transformers runs FP8 (a GPU), or point the target at the "
                                    "checkpoint's BF16 release") from exc
    model, info = _auto_model(target_dir).from_pretrained(str(target_dir), dtype=dtype, ignore_mismatched_sizes=True,
                                                          output_loading_info=True)
    mismatched = [str(key[0] if isinstance(key, tuple) else key) for key in info.get("mismatched_keys") or ()]
    other = sorted(key for key in mismatched if "experts.gate_up_proj" not in key)
    if other:
        raise DraftfitError(f"the checkpoint's {', '.join(other)} are not the sizes its config gives", where=str(target_dir),
                            fix="Use the checkpoint its config.json belongs to")
    if not mismatched:
        return model.eval()  # the checkpoint held the identities' rows too: loaded whole
    routed, block = int(raw["n_routed_experts"]), _weight_block(target_dir)
    with _checkpoint(target_dir) as where, _torch().no_grad():
        for name in where:
            parts = name.split(".")  # model.layers.{L}.mlp.experts.{E}.gate_proj.weight
            if ".mlp.experts." in name and name.endswith(".gate_proj.weight") and int(parts[5]) < routed:
                up = name.replace(".gate_proj.", ".up_proj.")
                rows = _torch().cat([_read_weight(where, n, block, target_dir) for n in (name, up)])
                model.model.layers[int(parts[2])].mlp.experts.gate_up_proj[int(parts[5])].copy_(rows)
    return model.eval()


class TargetStates:
    """The target's auxiliary hidden states over whole sequences (transformers, one prefill each)."""

    def __init__(self, target_dir: Path, layer_ids: Sequence[int], dtype: str | None = None, *,
                 before_final_norm: bool = False):
        """``dtype``: default what vLLM runs the target in here (bfloat16 where the CPU computes it
        natively, float32 elsewhere), so the states carry the served engine's rounding.
        ``before_final_norm``: index L is the last layer's output before the final norm (MTP's)."""
        import torch

        from draftfit.engines import auto_dtype

        self.dtype = dtype or auto_dtype("vllm")
        self.model = load_target(target_dir, getattr(torch, self.dtype))
        n_layers = decoder_layers(self.model.config.get_text_config().to_dict())
        bad = [i for i in layer_ids if not 0 <= i <= n_layers]  # n_layers: the normed output (EAGLE-1's)
        if bad:
            raise DraftfitError(f"auxiliary layer ids {bad} are outside the target's layers 0..{n_layers - 1} "
                                f"({n_layers}: its normed output)",
                                where=str(target_dir), fix="Use a head trained for this target")
        self.layer_ids = tuple(int(i) for i in layer_ids)
        self.n_layers = n_layers
        self._last: list = []
        if before_final_norm:
            self.model.model.norm.register_forward_pre_hook(lambda module, args: self._last.append(args[0]))

    def __call__(self, seq: Sequence[int], top_k: int = 0):
        """``[len(seq), n_aux · hidden]`` float32: the states entering each auxiliary layer (index L:
        the normed output); with ``top_k``, also the target's top-k next-token ids and
        probabilities at every position."""
        import torch

        with torch.no_grad():
            ids = torch.as_tensor(np.asarray(seq), dtype=torch.long)[None]
            self._last.clear()
            # without top_k no logits are read: the vocabulary projection of one position, not every one
            out = self.model(input_ids=ids, output_hidden_states=True, logits_to_keep=0 if top_k else 1)
            hidden = list(out.hidden_states)
            if self._last:
                hidden[self.n_layers] = self._last[-1]
            states = torch.cat([hidden[i][0] for i in self.layer_ids], dim=-1).float()
            if not top_k:
                return states
            probs = out.logits[0].float().softmax(-1)
            top = probs.topk(top_k, dim=-1)
            return states, top.indices, top.values.half()


CHAINS_VERSION = 1


def _target_pass(model, target_dir: Path, dtype: str | None):
    """What the head reads of the target per sequence: its auxiliary states (a Gemma 4 assistant:
    the last state and the keys and values its layers read)."""
    from draftfit.gemma4_assistant import AssistantTargetStates, Gemma4Assistant

    if isinstance(model, Gemma4Assistant):
        return AssistantTargetStates(target_dir, dtype)
    layers = decoder_layers(json.loads((Path(target_dir) / "config.json").read_text(encoding="utf-8")))
    return TargetStates(target_dir, model.config.aux_layers(layers), dtype, before_final_norm=model.config.before_final_norm)


def head_chains(trajset, head: Path, target_dir: Path, head_fp: str, steps: int, stops: np.ndarray,
                progress=lambda message: None, method: str | None = None) -> list[np.ndarray]:
    """The head's greedy chain of ``steps`` drafts from every step start of every response
    (``[N_b − 1, steps]`` each; see :meth:`Eagle3Head.greedy_chains`), cached per trajectory set,
    head and length."""
    import hashlib

    from draftfit import cachedir
    from draftfit.paths import cache_subdir

    dtype = str(trajset.engine.get("dtype") or "").removeprefix("torch.") or None  # the states as the engine rounds them
    key = {"v": CHAINS_VERSION, "trajectories": trajset.key, "head": head_fp, "steps": int(steps),
           "stops": [int(x) for x in stops], "dtype": dtype}
    if method in ("eagle", "mtp"):  # EAGLE-3 chains keep their keys
        key["method"] = method
    blob = json.dumps(key, sort_keys=True)
    final = cache_subdir("head_chains") / hashlib.sha256(blob.encode()).hexdigest()[:24]
    if final.exists():
        if cachedir.verified(final, what="EAGLE head chains") is not None:
            data = np.load(final / "chains.npz")
            return [data[f"c{b}"] for b in range(len(trajset.trajectories))]
        cachedir.discard(final)
    model = load_head(head, target_dir, method)
    states = _target_pass(model, target_dir, dtype if dtype in ("float32", "bfloat16", "float16") else None)
    chains = []
    for b, traj in enumerate(trajset.trajectories):
        if b % 8 == 0:
            progress(f"running the head's chains: response {b + 1}/{len(trajset.trajectories)}")
        seq = traj.sequence.astype(np.int64)
        P, n = traj.response_start, int(stops[b])
        if n <= 1:
            chains.append(np.zeros((0, steps), dtype=np.int64))
            continue
        # steps start at response positions 1..n−1; the first pass of the one at s samples at P + s − 2
        chains.append(model.greedy_chains(seq, states(seq[: P + n]), P - 1, P + n - 3, steps))
    tmp = cachedir.temp_dir(final)
    try:
        np.savez(tmp / "chains.npz", **{f"c{b}": c for b, c in enumerate(chains)})
        cachedir.write_manifest(tmp, {"trajectories": trajset.key, "head": head_fp, "steps": int(steps)})
        cachedir.publish(tmp, final)
    except BaseException:
        cachedir.discard(tmp)
        raise
    return chains

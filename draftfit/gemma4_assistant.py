"""Gemma 4's assistant drafter (``gemma4_assistant``; vLLM's ``gemma4_mtp``) run offline as vLLM's
``Gemma4Proposer`` runs it.

The assistant is a checkpoint of its own, served beside an unchanged Gemma 4 target with
``method: mtp`` and ``model: <assistant>``. What vLLM 0.32 runs (``model_executor/models/gemma4_mtp.py``,
``v1/spec_decode/gemma4.py``):

* Each step reads ``pre_projection([embed(token) · √H_target, state])`` — the target's embedding (vLLM
  shares it) and a state of the target's width — through the assistant's decoder layers, then its
  ``norm``; the normed output is what its own LM head reads (its ``embed_tokens``, of its own width,
  tied), and ``post_projection`` of it is the next step's state. The first step's state is the
  target's last hidden state (after the target's final norm, what its model returns).
* Its layers have queries only. Each reads the keys and values the *target* wrote in its last
  layer of the same kind (sliding or full attention) that keeps its own KV: nothing the assistant
  drafts is written anywhere. A layer is Gemma 4's: ``q_norm`` on each head, RoPE of its kind
  (neox; proportional on full layers: the first ``partial_rotary_factor`` of the frequencies, the
  rest still), softmax scale 1, ``o_proj``, ``post_attention_layernorm``, add, then
  ``pre_feedforward_layernorm``, a tanh-GELU gated MLP, ``post_feedforward_layernorm``, add, times
  ``layer_scalar``.
* Positions are constant: the first pass runs the positions the target just processed (token at
  p+1, the target's state at p, as EAGLE's), and every later step of the chain stays at the first
  pass's last position. So the chain from a step start s is k passes of one query at position s over
  the target's keys and values at 0..s (the last ``sliding_window`` of them in sliding layers).
* Drafts are the argmax of the logits; with ``use_ordered_embeddings`` only the tokens of the
  ``centroid_intermediate_top_k`` centroids the output scores highest are scored (the rest masked);
  the generation config's ``suppress_tokens`` never drafted.

transformers ships the assistant too (``Gemma4AssistantForCausalLM``), which drafts from the
target's *next* position; the tests check these passes against its layers at vLLM's positions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftfit.compat.heads import ASSISTANT_TARGET_TYPES, is_assistant
from draftfit.errors import DraftfitError

KINDS = ("sliding_attention", "full_attention")


def _not_modelled(what: str, directory: Path) -> DraftfitError:
    return DraftfitError(f"a Gemma 4 assistant with {what} is not modelled offline by this draftfit version",
                         where=str(directory), fix="Measure this assistant with `draftfit verify`")


@dataclass(frozen=True)
class AssistantConfig:
    """What the offline assistant reads from its ``config.json`` (and generation config)."""

    hidden_size: int
    backbone_hidden_size: int
    num_heads: int
    layer_types: tuple[str, ...]
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    sliding_window: int
    rope: dict[str, dict[str, Any]]  # per layer kind: rope_type, rope_theta, partial_rotary_factor
    max_position_embeddings: int
    centroids: tuple[int, int] | None  # (num_centroids, centroid_intermediate_top_k) with ordered embeddings
    suppress_tokens: tuple[int, ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @classmethod
    def read(cls, directory: Path) -> AssistantConfig:
        directory = Path(directory)
        raw = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        if not is_assistant(raw):
            raise DraftfitError(f"model_type {raw.get('model_type')!r} is not a Gemma 4 assistant", where=str(directory),
                                fix="Point the candidate's model at a gemma4_assistant checkpoint")
        text = raw.get("text_config") or {}
        for key, bad in (("hidden_size_per_layer_input", 0), ("vocab_size_per_layer_input", 0)):
            if int(text.get(key) or 0) != bad:
                raise _not_modelled(f"{key} {text.get(key)}", directory)
        if text.get("enable_moe_block") or text.get("use_double_wide_mlp"):
            raise _not_modelled("an expert block or a double-wide MLP", directory)
        if text.get("attn_logit_softcapping"):
            raise _not_modelled("attention logit soft-capping", directory)
        layers = int(text["num_hidden_layers"])
        types = tuple(text.get("layer_types") or ["full_attention"] * layers)
        if any(t not in KINDS for t in types):
            raise _not_modelled(f"layer types {sorted(set(types) - set(KINDS))}", directory)
        rope = dict(text.get("rope_parameters") or {})
        if not all(t in rope for t in set(types)):  # one dict for every kind
            rope = dict.fromkeys(set(types), rope)
        for kind, params in rope.items():
            kind_type = params.get("rope_type") or "default"
            partial = float(params.get("partial_rotary_factor") or 1.0)
            if kind_type not in ("default", "proportional") or float(params.get("factor") or 1.0) != 1.0 \
                    or (kind_type == "default" and partial != 1.0):  # vLLM rotates a part of the head then
                raise _not_modelled(f"{kind} RoPE {kind_type!r} (factor {params.get('factor')}, partial {partial})", directory)
        suppress: tuple[int, ...] = ()
        generation = directory / "generation_config.json"
        if generation.exists():
            suppress = tuple(int(i) for i in json.loads(generation.read_text(encoding="utf-8")).get("suppress_tokens") or ())
        return cls(
            hidden_size=int(text["hidden_size"]), backbone_hidden_size=int(raw.get("backbone_hidden_size") or text["hidden_size"]),
            num_heads=int(text["num_attention_heads"]), layer_types=types,
            intermediate_size=int(text["intermediate_size"]), rms_norm_eps=float(text.get("rms_norm_eps") or 1e-6),
            vocab_size=int(text["vocab_size"]), sliding_window=int(text.get("sliding_window") or 0), rope=rope,
            max_position_embeddings=int(text.get("max_position_embeddings") or 131072),
            centroids=(int(raw.get("num_centroids") or 2048), int(raw.get("centroid_intermediate_top_k") or 32))
            if raw.get("use_ordered_embeddings") else None, suppress_tokens=suppress)


def _torch():
    import torch

    return torch


def _rms(x, weight, eps):
    torch = _torch()
    out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return out if weight is None else out * weight


def inv_freq(params: dict[str, Any], head_dim: int):
    """Neox RoPE frequencies over a whole head: a layer kind's (default: every frequency; proportional:
    the first ``partial_rotary_factor`` of them, with exponents over the head, the rest zero)."""
    torch = _torch()
    theta = float(params.get("rope_theta") or 10000.0)
    angles = head_dim // 2
    if (params.get("rope_type") or "default") == "proportional":
        angles = int(float(params.get("partial_rotary_factor") or 1.0) * head_dim // 2)
    rotated = 1.0 / theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.float32) / head_dim)
    return torch.cat([rotated, torch.zeros(head_dim // 2 - angles)])


class Gemma4Assistant:
    """The assistant's tensors and passes (plain torch; differentiable, so training uses it too)."""

    METHOD = "mtp"

    def __init__(self, config: AssistantConfig, tensors: dict[str, Any], target_embed, token_ordering=None):
        self.config = config
        self.t = tensors  # checkpoint names, without ``model.`` and ``.weight``
        self.target_embed = target_embed  # [vocab, backbone hidden]: vLLM shares the target's
        self.token_ordering = token_ordering
        self.scale = float(config.backbone_hidden_size) ** 0.5  # the target's embedding scale
        c = config
        self.head_dims = [int(tensors[f"layers.{i}.self_attn.q_norm"].shape[0]) for i in range(c.num_layers)]
        self.inv_freq = [inv_freq(c.rope[kind], hd) for kind, hd in zip(c.layer_types, self.head_dims, strict=True)]

    @classmethod
    def load(cls, directory: Path, target_embed) -> Gemma4Assistant:
        """The assistant of ``directory``, reading the target's input embedding ``target_embed``
        (draftfit.eagle_head.load_head reads it from the target)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        config = AssistantConfig.read(directory)
        tensors: dict[str, Any] = {}
        for f in sorted(directory.glob("*.safetensors")):
            tensors.update(load_file(str(f)))
        named = {k.removeprefix("model.").removesuffix(".weight"): v for k, v in tensors.items()}
        ordering = named.pop("masked_embedding.token_ordering", None)
        need = ["pre_projection", "post_projection", "norm", "embed_tokens"] + [
            f"layers.{i}.{p}" for i in range(config.num_layers)
            for p in ("self_attn.q_proj", "self_attn.q_norm", "self_attn.o_proj", "input_layernorm", "post_attention_layernorm",
                      "pre_feedforward_layernorm", "post_feedforward_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
        if config.centroids:
            need.append("masked_embedding.centroids")
        missing = [p for p in need if p not in named]
        if missing or (config.centroids and ordering is None):
            raise DraftfitError(f"the assistant's checkpoint lacks {', '.join(missing) or 'masked_embedding.token_ordering'}",
                                where=str(directory), fix="Use a gemma4_assistant checkpoint as Google ships it")
        named = {k: v.float() for k, v in named.items()}
        if "lm_head" not in named:  # tied, as vLLM ties it by default
            named["lm_head"] = named["embed_tokens"]
        return cls(config, named, target_embed.float(), None if ordering is None else ordering.long())

    # --- passes -----------------------------------------------------------------------------

    def _rope(self, x, position, layer: int):
        """Neox RoPE of ``x`` [A, heads, hd] at positions [A]."""
        torch = _torch()
        freqs = position.float()[:, None] * self.inv_freq[layer]  # [A, hd/2]
        cos = torch.cat([freqs.cos(), freqs.cos()], dim=-1)[:, None, :]
        sin = torch.cat([freqs.sin(), freqs.sin()], dim=-1)[:, None, :]
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def step(self, tokens, states, positions, kv: dict[str, tuple[Any, Any]]):
        """One pass for rows of (token [A], state [A, H_target], position [A]) over the target's keys
        and values ``kv[kind]`` ([n, KV, hd] each, positions 0..n−1): (normed output [A, h], next state)."""
        torch = _torch()
        c, t = self.config, self.t
        x = torch.cat([self.target_embed[tokens] * self.scale, states], dim=-1) @ t["pre_projection"].T
        n = next(iter(kv.values()))[0].shape[0]
        keys = torch.arange(n)
        for i, kind in enumerate(c.layer_types):
            p = f"layers.{i}."
            keys_k, values = kv[kind]
            hd = self.head_dims[i]
            q = (_rms(x, t[p + "input_layernorm"], c.rms_norm_eps) @ t[p + "self_attn.q_proj"].T).view(len(x), c.num_heads, hd)
            q = self._rope(_rms(q, t[p + "self_attn.q_norm"], c.rms_norm_eps), positions, i)
            rep = c.num_heads // keys_k.shape[1]
            scores = torch.einsum("ahd,nhd->ahn", q, keys_k.repeat_interleave(rep, dim=1))  # softmax scale 1
            allowed = keys[None, :] <= positions[:, None]
            if kind == "sliding_attention" and c.sliding_window:
                allowed = allowed & (keys[None, :] > positions[:, None] - c.sliding_window)
            weights = scores.masked_fill(~allowed[:, None, :], float("-inf")).softmax(-1)
            attn = torch.einsum("ahn,nhd->ahd", weights, values.repeat_interleave(rep, dim=1)).reshape(len(x), -1)
            x = _rms(attn @ t[p + "self_attn.o_proj"].T, t[p + "post_attention_layernorm"], c.rms_norm_eps) + x
            h = _rms(x, t[p + "pre_feedforward_layernorm"], c.rms_norm_eps)
            h = (torch.nn.functional.gelu(h @ t[p + "mlp.gate_proj"].T, approximate="tanh") * (h @ t[p + "mlp.up_proj"].T)) \
                @ t[p + "mlp.down_proj"].T
            x = (_rms(h, t[p + "post_feedforward_layernorm"], c.rms_norm_eps) + x) * t.get(p + "layer_scalar", 1.0)
        out = _rms(x, t["norm"], c.rms_norm_eps)
        return out, out @ t["post_projection"].T

    def logits(self, out):
        """Full-vocabulary logits; with ordered embeddings, the tokens of unselected centroids and the
        suppressed tokens at −inf."""
        torch = _torch()
        c = self.config
        logits = out @ self.t["lm_head"].T
        if c.centroids:
            count, top = c.centroids
            chosen = (out @ self.t["masked_embedding.centroids"].T).topk(top, dim=-1).indices  # [A, top]
            tokens = self.token_ordering.view(count, -1)[chosen].reshape(len(out), -1)
            keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, tokens, True)
            logits = logits.masked_fill(~keep, float("-inf"))
        if c.suppress_tokens:
            logits[:, list(c.suppress_tokens)] = float("-inf")
        return logits

    def greedy_chains(self, seq: np.ndarray, target, first: int, last: int, steps: int) -> np.ndarray:
        """Draft tokens of the chain from every start ``first..last`` (``[last − first + 1, steps]``):
        ``target`` = (the target's normed last states [n, H], its keys and values per layer kind)."""
        torch = _torch()
        states, kv = target
        with torch.no_grad():
            s = torch.as_tensor(np.asarray(seq), dtype=torch.long)
            starts = torch.arange(first, last + 1)
            tokens, state = s[starts + 1], states[starts]
            drafts = []
            for _ in range(steps):
                out, state = self.step(tokens, state, starts, kv)
                tokens = self.logits(out).argmax(-1)
                drafts.append(tokens)
            return torch.stack(drafts, dim=1).numpy()


class AssistantTargetStates:
    """The Gemma 4 target's pass the assistant reads (transformers, one prefill each): its normed
    last hidden states and, per layer kind, the keys and values of its last layer of that kind that
    keeps its own (transformers' ``shared_kv_states``: keys normed and rotated, values normed)."""

    def __init__(self, target_dir: Path, dtype: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM

        from draftfit.engines import auto_dtype

        self.dtype = dtype or auto_dtype("vllm")
        self.model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=getattr(torch, self.dtype))
        self.model.eval()
        if getattr(self.model.config, "model_type", "") not in ASSISTANT_TARGET_TYPES:
            raise DraftfitError(f"a Gemma 4 assistant drafts for a Gemma 4 target, not {self.model.config.model_type!r}",
                                where=str(target_dir), fix="Pair the assistant with the Gemma 4 model it was trained for")

    def __call__(self, seq):
        import torch

        with torch.no_grad():
            ids = torch.as_tensor(np.asarray(seq), dtype=torch.long)[None]
            out = self.model(input_ids=ids, output_hidden_states=True, return_shared_kv_states=True, use_cache=False,
                             logits_to_keep=1)
            kv = {kind: (k[0].transpose(0, 1).float(), v[0].transpose(0, 1).float())
                  for kind, (k, v) in out.shared_kv_states.items()}
            return out.hidden_states[-1][0].float(), kv

"""An independent, deliberately plain re-implementation of vLLM's EAGLE-3 and EAGLE proposer loops, to check
draftfit.eagle_head (the batched chains from every start) and acceptance_walk.predict_chains (the
walk) against.

It runs one request the way vLLM's engine does, step by step, with a KV cache indexed by position:

* prefill: the first pass over the prompt's positions 0..P−1 (token at p+1 — the last one the
  target's first sampled token — and the target's fused state at p), KV written at each position;
* each step: the chain from the last written position, its own KV at the next positions; the target
  verifies greedily (accept while the draft equals the target's token); the next step's first pass
  re-runs the accepted positions with the target's states, overwriting those KV slots — rejected
  positions are never attended again (the sequence length is cut back).

Counts drafts and accepted tokens as vLLM's scheduler does (every step that proposes is a draft;
the request stops once ``n_stop`` response tokens exist; the last step counts its drafts and
accepted tokens in full).
"""

from __future__ import annotations

import math

import numpy as np
import torch


def _norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rotate(x, pos, theta):
    d = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(d // 2):
        angle = pos * theta ** (-2.0 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        out[..., i] = x[..., i] * c - x[..., i + d // 2] * s
        out[..., i + d // 2] = x[..., i + d // 2] * c + x[..., i] * s
    return out


class Proposer:
    """vLLM's proposer for one request, over ``head`` (an Eagle3Head: only its tensors are read)."""

    def __init__(self, head):
        self.w = head.t
        self.c = head.config
        self.embed = head.embed
        self.d2t = head.d2t
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _attend(self, pos: int, q, k, v) -> list[torch.Tensor]:
        """Rotates q and k at ``pos``, writes KV[pos] and attends KV[0..pos]: every head's output."""
        c = self.c
        q = torch.stack([_rotate(q[h], pos, c.rope_theta) for h in range(c.num_heads)])
        k = torch.stack([_rotate(k[h], pos, c.rope_theta) for h in range(c.num_kv_heads)])
        self.kv[pos] = (k, v)
        group = c.num_heads // c.num_kv_heads
        heads = []
        for h in range(c.num_heads):
            keys = torch.stack([self.kv[p][0][h // group] for p in range(pos + 1)])
            vals = torch.stack([self.kv[p][1][h // group] for p in range(pos + 1)])
            a = torch.softmax(keys @ q[h] / math.sqrt(c.head_dim), dim=0)
            heads.append(a @ vals)
        return heads

    def _pass(self, pos: int, token: int, hidden: torch.Tensor):
        """One token through the layer at ``pos``: writes KV[pos], attends KV[0..pos]."""
        c, w = self.c, self.w
        e = _norm(self.embed[token], w["input_layernorm"], c.rms_norm_eps)
        hn = _norm(hidden, w["hidden_norm"], c.rms_norm_eps)
        residual = hn if c.norm_before_residual else hidden
        x = torch.cat([e, hn])
        q = (w["q_proj"] @ x).view(c.num_heads, c.head_dim)
        k = (w["k_proj"] @ x).view(c.num_kv_heads, c.head_dim)
        v = (w["v_proj"] @ x).view(c.num_kv_heads, c.head_dim)
        heads = self._attend(pos, q, k, v)
        o = w["o_proj"] @ torch.cat(heads)
        residual = o + residual
        y = _norm(residual, w["post_attention_layernorm"], c.rms_norm_eps)
        m = w["down_proj"] @ (torch.nn.functional.silu(w["gate_proj"] @ y) * (w["up_proj"] @ y))
        pre = m + residual
        out = _norm(pre, w["norm"], c.rms_norm_eps)
        logits = w["lm_head"] @ out
        draft = int(logits.argmax())
        if self.d2t is not None:
            draft += int(self.d2t[draft])
        return draft, (out if c.norm_output else pre)

    def chain(self, seq: np.ndarray, fused: torch.Tensor, start: int, k: int) -> list[int]:
        """The k drafts of a step whose first pass samples at position ``start`` (a fresh cache)."""
        self.kv = {}
        for p in range(start + 1):
            token, hidden = self._pass(p, int(seq[p + 1]), fused[p])
        proposal = [token]
        for j in range(1, k):
            token, hidden = self._pass(start + j, proposal[-1], hidden)
            proposal.append(token)
        return proposal

    def run(self, seq: np.ndarray, fused: torch.Tensor, prompt_len: int, k: int, n_stop: int):
        """(drafts, draft tokens, accepted tokens) of one request answering ``seq[prompt_len:]``."""
        P = prompt_len
        response = seq[P:]
        drafts = draft_tokens = accepted = 0
        written = 0  # first-pass positions written so far
        n = 1  # response tokens so far: the first came from the prefill
        while n < n_stop:
            c = P + n  # context length; the newest token (position c − 1) has no target state yet
            for p in range(written, c - 1):  # the first pass: positions the target has processed
                token, hidden = self._pass(p, int(seq[p + 1]), fused[p])
            written = c - 1
            proposal = [token]
            for j in range(1, k):
                token, hidden = self._pass(c - 2 + j, proposal[-1], hidden)
                proposal.append(token)
            drafts += 1
            draft_tokens += k
            a = 0
            while a < k and n + a < len(response) and proposal[a] == response[n + a]:
                a += 1
            accepted += a
            n += a + 1
        return drafts, draft_tokens, accepted


class EagleProposer(Proposer):
    """vLLM's EAGLE(-1) proposer (``llama_eagle.py``): ``fc`` over [embedding, state] is the layer's
    input and residual, no input norm, no final norm; the output plus residual is both what the
    LM head reads and the next hidden state."""

    def _pass(self, pos: int, token: int, hidden: torch.Tensor):
        c, w = self.c, self.w
        x = w["fc"] @ torch.cat([self.embed[token], hidden])
        q = (w["q_proj"] @ x).view(c.num_heads, c.head_dim)
        k = (w["k_proj"] @ x).view(c.num_kv_heads, c.head_dim)
        v = (w["v_proj"] @ x).view(c.num_kv_heads, c.head_dim)
        heads = self._attend(pos, q, k, v)
        residual = w["o_proj"] @ torch.cat(heads) + x
        y = _norm(residual, w["post_attention_layernorm"], c.rms_norm_eps)
        out = w["down_proj"] @ (torch.nn.functional.silu(w["gate_proj"] @ y) * (w["up_proj"] @ y)) + residual
        return int((w["lm_head"] @ out).argmax()), out


class MTPProposer(Proposer):
    """vLLM's MiMo MTP proposer (``mimo_mtp.py``): ``input_proj`` over [hidden_layernorm(state),
    token_layernorm(embedding)] — the embedding zeroed at position 0 — is the residual; one Qwen2
    layer (input norm, q/k/v biases); ``final_layernorm`` of output plus residual is both what the
    LM head reads and the next hidden state."""

    def _pass(self, pos: int, token: int, hidden: torch.Tensor):
        c, w = self.c, self.w
        e = self.embed[token] if pos != 0 else torch.zeros_like(self.embed[token])
        e = _norm(e, w["token_layernorm"], c.rms_norm_eps)
        x = w["input_proj"] @ torch.cat([_norm(hidden, w["hidden_layernorm"], c.rms_norm_eps), e])
        y = _norm(x, w["input_layernorm"], c.rms_norm_eps)
        q = (w["q_proj"] @ y + w["q_proj.bias"]).view(c.num_heads, c.head_dim)
        k = (w["k_proj"] @ y + w["k_proj.bias"]).view(c.num_kv_heads, c.head_dim)
        v = (w["v_proj"] @ y + w["v_proj.bias"]).view(c.num_kv_heads, c.head_dim)
        heads = self._attend(pos, q, k, v)
        residual = w["o_proj"] @ torch.cat(heads) + x
        z = _norm(residual, w["post_attention_layernorm"], c.rms_norm_eps)
        out = _norm(w["down_proj"] @ (torch.nn.functional.silu(w["gate_proj"] @ z) * (w["up_proj"] @ z)) + residual,
                    w["final_layernorm"], c.rms_norm_eps)
        return int((w["lm_head"] @ out).argmax()), out

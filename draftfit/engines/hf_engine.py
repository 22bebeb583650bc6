"""The transformers backend: the exact reference (full-vocabulary logits, no vLLM needed).

* :meth:`HFEngine.generate_trajectories` runs ``model.generate`` one prompt at a time (no padding,
  so no padding numerics), greedy or sampling with temperature/top-p and seed ``seed + i``
  (``torch.manual_seed``), and keeps the top-K of the processed scores that ``generate`` returns
  (``output_scores=True``: after temperature and top-p, the same rule and order as vLLM's sampler).
  transformers' top-k default (50) is switched off, as in vLLM.
* :meth:`HFEngine.score` is one forward pass over prompt + response (``logits_to_keep`` keeps only
  the response positions) returning the raw top-K, like vLLM's ``prompt_logprobs``.
* :meth:`HFEngine.score_exact` runs the target's and the draft's prefill over the same sequence
  and reduces the two full distributions, position by position, to what acceptance needs
  (:class:`~draftfit.engines.base.ExactInputs`); nothing vocabulary-sized outlives one chunk of
  positions of one sequence.

torch and transformers are imported when an engine is built.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from draftfit.engines.base import (
    DraftScore,
    Engine,
    EngineInfo,
    ExactInputs,
    SamplingSpec,
    Trajectory,
    check_inputs,
    check_prompts,
    empty_score,
)
from draftfit.errors import DraftfitError, EngineMissing

CHUNK_POSITIONS = 128  # positions reduced at once: CHUNK_POSITIONS x vocab floats of scratch
_DTYPES = {"float32": "float32", "fp32": "float32", "auto": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}


def import_torch_transformers():
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise EngineMissing(
            f"the transformers engine is not installed ({exc.name or exc})",
            fix="Install it: pip install 'draftfit[hf]'",
        ) from exc
    return torch, transformers


def processed_logprobs(logits, sampling: SamplingSpec):
    """log p of the distribution a token is drawn from: vLLM's sampler, step by step.

    ``logits`` [N, V] float32. Greedy: the plain log-softmax (vLLM's all-greedy path). Otherwise
    divide by the temperature, then apply top-p exactly as ``apply_top_k_top_p_pytorch`` does
    (ascending sort; drop tokens whose ascending cumulative probability is ``<= 1 - top_p``; the
    most likely token always stays), then log-softmax.
    """
    import torch

    logits = logits.float()
    if sampling.greedy:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / float(sampling.temperature)
    if sampling.top_p < 1.0:
        sorted_logits, order = scaled.sort(dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1.0 - float(sampling.top_p)
        drop[:, -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(-1, order, sorted_logits)
    return torch.log_softmax(scaled, dim=-1)


def _topk(logprobs, k: int) -> tuple[np.ndarray, np.ndarray]:
    values, ids = logprobs.topk(k, dim=-1)
    return ids.numpy().astype(np.int32), values.float().numpy()


def _rank_and_logprob(logprobs, tokens) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's rank (count of entries >= the token's, itself included) and the token's log-prob."""
    chosen = logprobs.gather(-1, tokens.unsqueeze(-1))
    ranks = (logprobs >= chosen).sum(dim=-1)
    return ranks.numpy().astype(np.int32), chosen.squeeze(-1).float().numpy()


class HFEngine(Engine):
    """One model loaded with transformers on the CPU (or a torch device)."""

    name = "transformers"

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        max_model_len: int | None = None,
        trust_remote_code: bool = False,
        progress: bool = True,
    ) -> None:
        super().__init__()
        start = time.perf_counter()
        torch, transformers = import_torch_transformers()  # counted as start-up
        import_seconds = time.perf_counter() - start
        self.model_dir = Path(model_dir)
        if dtype not in _DTYPES:
            raise DraftfitError(f"unknown dtype '{dtype}'", where="engine", fix=f"Use one of: {', '.join(sorted(_DTYPES))}")
        self.dtype = _DTYPES[dtype]
        self.device = device
        self.max_model_len = max_model_len
        self.progress = progress
        self._version = transformers.__version__
        self._torch_version = torch.__version__
        if not progress:
            transformers.utils.logging.disable_progress_bar()
        with self.timed("startup"):
            try:
                self.model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(self.model_dir), dtype=getattr(torch, self.dtype), trust_remote_code=trust_remote_code
                )
            except Exception as exc:
                raise DraftfitError(
                    f"transformers could not load the model ({type(exc).__name__}: {exc})",
                    where=str(self.model_dir),
                    fix="Pass a complete HF model directory (config.json, weights); --trust-remote-code only for code you trust",
                ) from exc
            self.model.to(device).eval()
        self.timings[-1].seconds += import_seconds
        self.startup_seconds = self.timings[-1].seconds
        generation = getattr(self.model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None) if generation is not None else None
        if eos is None:
            eos = self.model.config.eos_token_id
        self.eos_token_ids = sorted({int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None})
        pad = getattr(generation, "pad_token_id", None) if generation is not None else None
        self.pad_token_id = int(pad) if pad is not None else (self.eos_token_ids[0] if self.eos_token_ids else 0)

    @classmethod
    def from_config(cls, model_dir: str | Path, config) -> HFEngine:
        return cls(
            model_dir,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            trust_remote_code=config.trust_remote_code,
            progress=config.progress,
            **dict(config.extra),
        )

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(
            name="transformers",
            version=self._version,
            model=str(self.model_dir),
            dtype=self.dtype,
            options={"device": self.device, "torch": self._torch_version},
        )

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def _bar(self, total: int, label: str):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=f"{self.model_dir.name}: {label}", disable=not self.progress, leave=False)

    def _response_logits(self, sequence: Sequence[int], start: int):
        """Logits [T, V] (float32) predicting response tokens ``start .. L-1`` from one prefill."""
        import torch

        ids = torch.tensor([list(map(int, sequence))], dtype=torch.long, device=self.device)
        keep = len(sequence) - start + 1  # positions start-1 .. L-1; the last one predicts past the end
        with torch.inference_mode():
            out = self.model(input_ids=ids, logits_to_keep=keep, use_cache=False)
        return out.logits[0, :-1].float().cpu()

    # -- the interface ---------------------------------------------------------------------------

    def generate_trajectories(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingSpec, top_k_logprobs: int = 20
    ) -> list[Trajectory]:
        import torch
        import transformers

        self._check_open()
        check_prompts(prompt_token_ids, self.max_model_len, str(self.model_dir))
        options: dict[str, Any] = {
            "max_new_tokens": int(sampling.max_tokens),
            "eos_token_id": self.eos_token_ids or None,
            "pad_token_id": self.pad_token_id,
            "output_scores": True,
            "return_dict_in_generate": True,
        }
        if sampling.greedy:
            options["do_sample"] = False
        else:
            options.update(do_sample=True, temperature=float(sampling.temperature), top_p=float(sampling.top_p), top_k=0)
        config = transformers.GenerationConfig(**options)
        trajectories = []
        bar = self._bar(len(prompt_token_ids), "target answers")
        with self.timed("generate", items=len(prompt_token_ids)) as timing:
            for i, prompt in enumerate(prompt_token_ids):
                ids = torch.tensor([list(map(int, prompt))], dtype=torch.long, device=self.device)
                if not sampling.greedy:
                    torch.manual_seed(int(sampling.seed) + i)
                with torch.inference_mode():
                    out = self.model.generate(
                        input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config
                    )
                tokens = out.sequences[0, ids.shape[1]:].cpu()
                scores = torch.cat([s.float().cpu() for s in out.scores], dim=0)  # [T, V] processed
                logprobs = torch.log_softmax(scores, dim=-1)
                top_ids, top_lps = _topk(logprobs, top_k_logprobs)
                token_lps = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).numpy()
                stopped = bool(self.eos_token_ids) and int(tokens[-1]) in self.eos_token_ids
                trajectories.append(
                    Trajectory(
                        prompt_token_ids=np.asarray(prompt, dtype=np.int32),
                        token_ids=tokens.numpy().astype(np.int32),
                        token_logprobs=token_lps.astype(np.float32),
                        top_ids=top_ids,
                        top_logprobs=top_lps.astype(np.float32),
                        finish_reason="stop" if stopped else "length",
                    )
                )
                timing.tokens += int(tokens.shape[0])
                del out, scores, logprobs
                bar.update(1)
        bar.close()
        return trajectories

    def score(
        self, sequences: Sequence[Sequence[int]], response_starts: Sequence[int], top_k: int = 20
    ) -> list[DraftScore]:
        import torch

        self._check_open()
        check_inputs(sequences, response_starts)
        scores = []
        bar = self._bar(len(sequences), "scoring")
        with self.timed("score", items=len(sequences), tokens=sum(map(len, sequences))):
            for sequence, start in zip(sequences, response_starts, strict=True):
                logits = self._response_logits(sequence, start)
                tokens = torch.as_tensor(np.asarray(sequence[start:], dtype=np.int64))
                parts = [self._draft_part(logits[a : a + CHUNK_POSITIONS], tokens[a : a + CHUNK_POSITIONS], top_k) for a in range(0, len(tokens), CHUNK_POSITIONS)]
                scores.append(_join(parts, top_k))
                bar.update(1)
        bar.close()
        return scores

    @staticmethod
    def _draft_part(logits, tokens, top_k: int) -> DraftScore:
        import torch

        logprobs = torch.log_softmax(logits, dim=-1)
        top_ids, top_lps = _topk(logprobs, top_k)
        ranks, token_lps = _rank_and_logprob(logprobs, tokens)
        return DraftScore(top_ids, top_lps.astype(np.float32), token_lps.astype(np.float32), ranks)

    def score_exact(
        self,
        target: HFEngine,
        sequences: Sequence[Sequence[int]],
        response_starts: Sequence[int],
        sampling: SamplingSpec,
        top_k: int = 20,
        *,
        draft_temperature: float | None = None,
    ) -> list[DraftScore]:
        """This model as the draft, ``target`` as the target: exact per-position acceptance inputs.

        Both models read the same prompt + response; position by position the target's processed
        distribution p_t and this draft's q_t (as vLLM drafts: temperature only) are reduced to
        argmax q_t, p_t(argmax q_t) and Σ min(p_t, q_t). At temperature 0 both are point masses
        (the trajectory token and the draft's argmax), so both acceptance values are
        ``argmax q_t == y_t``. The raw top-K fields are filled as by :meth:`score`.

        ``draft_temperature``: the temperature of q_t when the engine to be predicted drafts at
        another one than the sampling temperature vLLM uses (transformers' assisted generation
        samples its assistant at T², see tests/reference_spec.py); default: vLLM's rule.
        """
        import torch

        self._check_open()
        target._check_open()
        check_inputs(sequences, response_starts)
        if target.vocab_size != self.vocab_size:
            raise DraftfitError(
                f"draft vocabulary {self.vocab_size} != target {target.vocab_size}",
                where=str(self.model_dir),
                fix="Pad the draft with `draftfit pad-vocab` or pick a draft with the target's tokenizer",
            )
        scores = []
        bar = self._bar(len(sequences), "exact scoring")
        with self.timed("score_exact", items=len(sequences), tokens=sum(map(len, sequences))):
            for sequence, start in zip(sequences, response_starts, strict=True):
                if len(sequence) == start:
                    scores.append(empty_score(top_k))
                    continue
                q_logits = self._response_logits(sequence, start)
                p_logits = target._response_logits(sequence, start)
                tokens = torch.as_tensor(np.asarray(sequence[start:], dtype=np.int64))
                parts = []
                for a in range(0, len(tokens), CHUNK_POSITIONS):
                    sl = slice(a, a + CHUNK_POSITIONS)
                    part = self._draft_part(q_logits[sl], tokens[sl], top_k)
                    part.exact = _exact_part(p_logits[sl], q_logits[sl], tokens[sl], sampling, top_k, draft_temperature)
                    parts.append(part)
                scores.append(_join(parts, top_k))
                del q_logits, p_logits
                bar.update(1)
        bar.close()
        return scores

    def _release(self) -> None:
        self.model = None
        gc.collect()


def _exact_part(
    p_logits, q_logits, tokens, sampling: SamplingSpec, top_k: int, draft_temperature: float | None = None
) -> ExactInputs:
    import torch

    p_log = processed_logprobs(p_logits, sampling)
    target_top_ids, target_top_lps = _topk(p_log, top_k)
    target_token_lps = p_log.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    draft_argmax = q_logits.argmax(dim=-1)
    if sampling.greedy:
        match = (draft_argmax == tokens).float()
        p_at_argmax, overlap = match, match
        q_log = torch.log_softmax(q_logits.double(), dim=-1)
    else:
        p = p_log.double().exp()
        q_log = torch.log_softmax(q_logits.double() / float(draft_temperature or sampling.temperature), dim=-1)
        q = q_log.exp()
        p_at_argmax = p.gather(-1, draft_argmax.unsqueeze(-1)).squeeze(-1)
        overlap = torch.minimum(p, q).sum(dim=-1).clamp_(0.0, 1.0)
    draft_token_lps = q_log.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return ExactInputs(
        draft_argmax=draft_argmax.numpy().astype(np.int32),
        p_draft_argmax=p_at_argmax.float().numpy(),
        overlap=overlap.float().numpy(),
        target_token_logprobs=target_token_lps.float().numpy(),
        target_top_ids=target_top_ids,
        target_top_logprobs=target_top_lps.astype(np.float32),
        draft_token_logprobs=draft_token_lps.float().numpy(),
    )


def _join(parts: list[DraftScore], top_k: int) -> DraftScore:
    if not parts:
        return empty_score(top_k)
    if len(parts) == 1:
        return parts[0]
    exact = None
    if parts[0].exact is not None:
        exact = ExactInputs(*(np.concatenate([getattr(p.exact, f) for p in parts]) for f in ExactInputs.__dataclass_fields__))
    return DraftScore(
        top_ids=np.concatenate([p.top_ids for p in parts]),
        top_logprobs=np.concatenate([p.top_logprobs for p in parts]),
        token_logprobs=np.concatenate([p.token_logprobs for p in parts]),
        token_ranks=np.concatenate([p.token_ranks for p in parts]),
        exact=exact,
    )

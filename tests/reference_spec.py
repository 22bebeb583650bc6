"""Reference speculative decoding with real models: the truths draftfit's predictions are checked against.

Nothing here comes from draftfit's prediction code; each runner is written from the engine's
source and counts what the engine counts (vLLM's definitions, :class:`draftfit.metrics.SpecCounts`).

* :func:`run_vllm_rule` — vLLM V1's verification of a *one-hot* proposal, run as a seeded
  Monte-Carlo with transformers models (float32, prefix KV caches). A proposal is a model draft's
  greedy continuation (``draft_sample_method="greedy"``, vLLM's default) or vLLM's ngram lookup.
  Read from vllm 0.32 ``vllm/v1/sample/rejection_sampler.py``:

  - temperature 0 (``rejection_greedy_sample_kernel``): a draft is accepted iff it equals the
    target's argmax; the first mismatch emits the target's argmax; all accepted emits the bonus
    argmax;
  - temperature > 0 (``rejection_random_sample_kernel`` with ``NO_DRAFT_PROBS``): a draft ``d``
    is accepted iff ``p(d) >= u``, ``u ~ U(0, 1)``, with ``p`` the target's distribution after
    temperature and top-p; the first rejection emits a sample of ``p`` with ``d`` removed
    (``sample_recovered_tokens_kernel``); all accepted emits a sample of ``p`` (bonus).

  Step structure and counting (``vllm/v1/core/sched/scheduler.py``): the prefill emits the first
  token without drafts; every later step proposes up to k tokens after everything emitted so far;
  a step with a proposal counts 1 draft, its proposal length in draft tokens and its accepted
  drafts — all of them, also those past EOS or ``max_tokens``, which are trimmed from the output
  only afterwards; a step without a proposal (ngram miss) is not counted.

* :func:`run_assisted` — transformers' own assisted generation (``generate(assistant_model=...,
  do_sample=True)``) with a constant ``num_assistant_tokens = k`` and the confidence threshold
  off. Its acceptance is Leviathan et al.'s rejection sampling (``_speculative_sampling`` in
  ``transformers/generation/utils.py``). Each step is recorded by wrapping the candidate generator:
  ``get_candidates`` gives the number of candidates, ``update_candidate_strategy`` the number of
  accepted ones (``n_matches`` after transformers crops the step at EOS and at ``max_length``).
  What transformers 5.19 does, read from its source and checked numerically:

  - the first step drafts straight from the prompt (no draft-free prefill step);
  - a step at output position s drafts ``min(k, max_new_tokens - s - 1)`` candidates (fewer when
    the assistant samples EOS; none in the last position, a step that is not counted);
  - an accepted EOS ends the step: it is emitted as the step's last token and not counted as a
    match, and nothing after it is;
  - the assistant samples from ``softmax(logits / T²)``, not ``softmax(logits / T)``: ``generate``
    hands its prepared processors (which hold a ``TemperatureLogitsWarper``) to the assistant's
    ``generate`` as custom processors, and that call appends its own warpers from the copied
    generation config, so the temperature is applied twice. The acceptance test uses the same
    ``q`` (``candidate_logits`` are those twice-tempered scores), so the output is still the
    target's distribution, but the acceptance is that of a draft at temperature T².
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from draftfit.metrics import SpecCounts, sum_counts

Proposer = Callable[[Sequence[int], int], list[int]]


@dataclass
class ReferenceRun:
    """Outputs and counters of a reference run (measured by the reference, per prompt)."""

    output_token_ids: list[np.ndarray]
    finish_reasons: list[str]
    per_prompt: list[SpecCounts]
    steps: list[list[tuple[int, int]]] = field(default_factory=list)  # per prompt: (drafts, accepted) per step
    # vLLM rule: every token the steps emitted, before the stop trimmed them (the last step's
    # accepted drafts and its recovered/bonus token past EOS or max_tokens included)
    emitted_token_ids: list[np.ndarray] = field(default_factory=list)

    @property
    def counts(self) -> SpecCounts:
        return sum_counts(self.per_prompt)


# ------------------------------------------------------------------------------------ models


class CachedLM:
    """A transformers causal LM that keeps the KV cache of the last sequence it read.

    ``logits(tokens, n)`` returns the float32 logits after each of the last ``n`` tokens (row i
    predicts the token after ``tokens[len - n + i]``); only the part of ``tokens`` that differs
    from the previous call is run through the model.
    """

    def __init__(self, model) -> None:
        self.model = model
        self._tokens: list[int] = []
        self._cache = None

    def reset(self) -> None:
        self._tokens, self._cache = [], None

    def logits(self, tokens: Sequence[int], n_last: int = 1):
        import torch
        from transformers import DynamicCache

        tokens = [int(t) for t in tokens]
        if not 1 <= n_last <= len(tokens):
            raise ValueError(f"n_last={n_last} for {len(tokens)} tokens")
        keep = 0
        for a, b in zip(self._tokens, tokens, strict=False):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(tokens) - n_last)
        if self._cache is None:
            self._cache = DynamicCache(config=self.model.config)
            keep = 0
        cached = self._cache.get_seq_length()
        if cached > keep:
            self._cache.crop(keep - cached)
        ids = torch.tensor([tokens[keep:]], dtype=torch.long)
        with torch.inference_mode():
            out = self.model(input_ids=ids, past_key_values=self._cache, use_cache=True)
        self._tokens = tokens
        return out.logits[0, -n_last:].float()


def model_proposer(draft: CachedLM) -> Proposer:
    """A draft model's greedy continuation (vLLM ``draft_sample_method="greedy"``: argmax of the
    raw logits, token by token)."""

    def propose(context: Sequence[int], k: int) -> list[int]:
        ctx = list(context)
        out: list[int] = []
        for _ in range(k):
            token = int(draft.logits(ctx, 1)[0].argmax())
            out.append(token)
            ctx.append(token)
        return out

    return propose


def ngram_proposer(lookup_min: int, lookup_max: int) -> Proposer:
    """vLLM's prompt lookup, by brute force: the longest n in [min, max] whose last-n-token suffix
    occurs earlier in the context (the occurrence ends before the last token); its earliest
    occurrence; the tokens that followed it, at most k and at most up to the end of the context."""

    def propose(context: Sequence[int], k: int) -> list[int]:
        ctx = [int(t) for t in context]
        c = len(ctx)
        if c < lookup_min:
            return []
        for n in range(lookup_max, lookup_min - 1, -1):
            if c < n + 1:
                continue
            suffix = ctx[c - n :]
            for start in range(0, c - n):
                if ctx[start : start + n] == suffix:
                    follow = start + n
                    return ctx[follow : follow + min(k, c - follow)]
        return []

    return propose


# ------------------------------------------------------------------------------------ vLLM's rule


def _processed_probs(logits, temperature: float, top_p: float):
    """vLLM's target distribution: temperature, then top-p (the sampler's own order)."""
    import torch

    from draftfit.engines.base import SamplingSpec
    from draftfit.engines.hf_engine import processed_logprobs

    return torch.exp(processed_logprobs(logits, SamplingSpec(temperature, top_p, 1, 0)).double())


def _sample(probs, gen) -> int:
    import torch

    return int(torch.multinomial(probs, 1, generator=gen)[0])


def run_vllm_rule(
    target: CachedLM,
    propose: Proposer,
    prompts: Sequence[Sequence[int]],
    k: int,
    *,
    temperature: float,
    max_tokens: int,
    eos_token_ids: Sequence[int],
    top_p: float = 1.0,
    seed: int = 0,
) -> ReferenceRun:
    """vLLM's verification of one-hot proposals with its step structure and counters (module doc).

    Prompt i draws from ``torch.Generator().manual_seed(seed + i)``.
    """
    import torch

    greedy = temperature < 1e-5
    eos = {int(e) for e in eos_token_ids}
    outputs, reasons, per_prompt, all_steps, emitted_all = [], [], [], [], []
    for i, prompt in enumerate(prompts):
        gen = torch.Generator().manual_seed(int(seed) + i)
        ctx = [int(t) for t in prompt]
        first = target.logits(ctx, 1)
        out = [int(first[0].argmax()) if greedy else _sample(_processed_probs(first, temperature, top_p)[0], gen)]
        drafts = draft_tokens = accepted = 0
        per_pos = np.zeros(k, dtype=np.int64)
        steps: list[tuple[int, int]] = []
        finished = out[0] in eos or len(out) >= max_tokens
        while not finished:
            proposal = [int(t) for t in propose(ctx + out, k)][:k]
            n = len(proposal)
            logits = target.logits(ctx + out + proposal, n + 1)
            if greedy:
                best = logits.argmax(dim=-1).tolist()
                a = 0
                while a < n and proposal[a] == best[a]:
                    a += 1
                emitted = proposal[:a] + [int(best[a])]
            else:
                probs = _processed_probs(logits, temperature, top_p)
                a = 0
                while a < n:
                    u = float(torch.rand(1, generator=gen, dtype=torch.float64)[0])
                    if float(probs[a, proposal[a]]) >= u:
                        a += 1
                    else:
                        break
                row = probs[a].clone()
                if a < n:
                    row[proposal[a]] = 0.0  # the rejected draft is never the recovered token
                emitted = proposal[:a] + [_sample(row / row.sum(), gen)]
            if n:
                drafts += 1
                draft_tokens += n
                accepted += a
                per_pos[:a] += 1
                steps.append((n, a))
            out.extend(emitted)
            stop = next((j for j, t in enumerate(out) if t in eos), None)
            if stop is not None or len(out) >= max_tokens:
                finished = True
        emitted_all.append(np.asarray(out, dtype=np.int32))
        stop = next((j for j, t in enumerate(out) if t in eos), None)
        out = out[: min(max_tokens, len(out) if stop is None else stop + 1)]
        outputs.append(np.asarray(out, dtype=np.int32))
        reasons.append("stop" if out[-1] in eos else "length")
        per_prompt.append(SpecCounts(drafts, draft_tokens, accepted, per_pos))
        all_steps.append(steps)
    return ReferenceRun(outputs, reasons, per_prompt, all_steps, emitted_all)


# ------------------------------------------------------------------------------------ transformers


@contextlib.contextmanager
def _recording() -> Iterator[list[list[int]]]:
    """Record ``[candidates, n_matches]`` for every step of assisted generation."""
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    steps: list[list[int]] = []
    get_candidates = AssistedCandidateGenerator.get_candidates
    update = AssistedCandidateGenerator.update_candidate_strategy

    def recording_get_candidates(self, input_ids, *args, **kwargs):
        candidate_ids, candidate_logits = get_candidates(self, input_ids, *args, **kwargs)
        steps.append([int(candidate_ids.shape[1] - input_ids.shape[1]), -1])
        return candidate_ids, candidate_logits

    def recording_update(self, input_ids, scores, num_matches):
        steps[-1][1] = int(num_matches)
        return update(self, input_ids, scores, num_matches)

    AssistedCandidateGenerator.get_candidates = recording_get_candidates
    AssistedCandidateGenerator.update_candidate_strategy = recording_update
    try:
        yield steps
    finally:
        AssistedCandidateGenerator.get_candidates = get_candidates
        AssistedCandidateGenerator.update_candidate_strategy = update


def run_assisted(
    target_model,
    draft_model,
    prompts: Sequence[Sequence[int]],
    k: int,
    *,
    temperature: float,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int | None = None,
    seed: int = 0,
) -> ReferenceRun:
    """transformers' assisted generation with sampling (module doc); ``torch.manual_seed(seed + i)``
    before prompt i. The draft model's generation config is set to a constant ``k`` candidates
    with the confidence threshold off, and restored afterwards."""
    import torch
    import transformers

    assistant_config = draft_model.generation_config
    saved = (
        assistant_config.num_assistant_tokens,
        assistant_config.num_assistant_tokens_schedule,
        assistant_config.assistant_confidence_threshold,
    )
    assistant_config.num_assistant_tokens = int(k)
    assistant_config.num_assistant_tokens_schedule = "constant"
    assistant_config.assistant_confidence_threshold = 0.0  # off: the candidate count stays k
    config = transformers.GenerationConfig(
        do_sample=True,
        temperature=float(temperature),
        top_k=0,
        top_p=1.0,
        max_new_tokens=int(max_new_tokens),
        eos_token_id=int(eos_token_id),
        pad_token_id=int(eos_token_id if pad_token_id is None else pad_token_id),
    )
    outputs, reasons, per_prompt, all_steps = [], [], [], []
    try:
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([[int(t) for t in prompt]], dtype=torch.long)
            torch.manual_seed(int(seed) + i)
            with _recording() as steps, torch.inference_mode():
                sequence = target_model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    assistant_model=draft_model,
                    generation_config=config,
                )
            out = sequence[0, ids.shape[1] :].numpy().astype(np.int32)
            counted = [(n, a) for n, a in steps if n > 0]
            per_pos = np.zeros(k, dtype=np.int64)
            for _, a in counted:
                per_pos[:a] += 1
            outputs.append(out)
            reasons.append("stop" if len(out) and int(out[-1]) == int(eos_token_id) else "length")
            per_prompt.append(
                SpecCounts(len(counted), sum(n for n, _ in counted), sum(a for _, a in counted), per_pos)
            )
            all_steps.append([(n, a) for n, a in steps])
    finally:
        (
            assistant_config.num_assistant_tokens,
            assistant_config.num_assistant_tokens_schedule,
            assistant_config.assistant_confidence_threshold,
        ) = saved
    return ReferenceRun(outputs, reasons, per_prompt, all_steps)


def simulate_assisted(
    beta: np.ndarray, n_tokens: int, k: int, max_tokens: int, eos: bool, reps: int, rng: np.random.Generator
) -> np.ndarray:
    """Monte-Carlo of transformers' step structure along one fixed output: ``[reps, 2]`` (drafts,
    accepted). Position t's draft is accepted with probability ``beta[t]`` independently (each
    position belongs to exactly one step); an EOS at the end is never counted as accepted."""
    flags = rng.random((reps, n_tokens)) < np.asarray(beta, np.float64)[:n_tokens]
    if eos and n_tokens:
        flags[:, n_tokens - 1] = False
    out = np.zeros((reps, 2), dtype=np.int64)
    for r in range(reps):
        s = 0
        while s < n_tokens:
            n = max(min(k, max_tokens - s - 1), 0)
            a = 0
            while a < n and s + a < n_tokens and flags[r, s + a]:
                a += 1
            if n:
                out[r, 0] += 1
                out[r, 1] += a
            s += a + 1
    return out


def simulate_assisted_outputs(outputs, exact_scores, k: int, max_tokens: int, reps: int, seed: int = 0) -> np.ndarray:
    """:func:`simulate_assisted` summed over a run's outputs: ``[reps, 2]`` (drafts, accepted).

    ``outputs``: trajectories of the run's own outputs; ``exact_scores``: their exact draft scores
    (``draft_token_logprobs`` and ``target_token_logprobs``), β_t = min(1, q(y_t)/p(y_t)).
    """
    rng = np.random.default_rng(seed)
    sims = np.zeros((reps, 2))
    for o, e in zip(outputs, exact_scores, strict=True):
        beta = np.minimum(1.0, np.exp(e.exact.draft_token_logprobs - e.exact.target_token_logprobs))
        sims += simulate_assisted(beta, len(o), k, max_tokens, o.finish_reason == "stop", reps, rng)
    return sims

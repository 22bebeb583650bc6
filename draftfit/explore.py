"""Explore a results.json: the tables the report and the notebook draw from.

Every function takes a loaded :class:`draftfit.results.Results` and returns plain rows (lists of
dicts, one key per column, ready for ``pandas.DataFrame(rows)``). Each row says what its numbers
are under ``kind``: ``predicted`` (the offline models), ``bound`` (what top-K logprobs allow) or
``measured`` (``draftfit verify``).

Configurations are named ``"CANDIDATE k=K"``; where a function takes ``which``, pass such names,
bare candidate names (meaning that candidate's best-ranked k), or ``None`` for the best-ranked k of
every candidate.

    from draftfit import explore
    results = explore.load("reports/RUN/results.json")
    explore.per_position(results, ["ngram-2-4 k=4", "early-exit-10"])
    explore.speedup_vs_concurrency(results)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from draftfit.errors import DraftfitError
from draftfit.records import ConfigEntry, flat_level
from draftfit.results import Results
from draftfit.results import load as _load

# The measured latency figures the report shows: ``draftfit verify`` writes each as a distribution
# ``{"n", "mean", "p50", "p95", "p99"}`` under ``<name>_ms_measured`` (flat ``<name>_p50_ms_measured``
# keys are read too).
LATENCY_MEASURES = ("ttft", "itl")
PERCENTILES = ("p50", "p95", "p99")


def load(path: str | os.PathLike) -> Results:
    """Load a results.json (another schema version is refused with the fix)."""
    return _load(path)


def config_label(config: dict[str, Any]) -> str:
    """``"CANDIDATE k=K"``: how the report, the notebook and ``which`` name a configuration."""
    return f"{config['candidate']} k={config['k']}"


def is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def primary_concurrency(results: Results) -> int | None:
    level = (results.ranking or {}).get("primary_concurrency") or results.study.get("primary_concurrency")
    return int(level) if level is not None else None


def concurrency_levels(results: Results) -> list[int]:
    """The concurrency levels the run predicted, ascending."""
    levels = {int(p["concurrency"]) for c in results.configs for p in c.get("per_concurrency", [])}
    return sorted(levels)


def level_of(config: ConfigEntry, concurrency: int | None) -> dict[str, Any] | None:
    """A config's entry at one concurrency level with the config's own fields beside it
    (:func:`draftfit.records.flat_level`); ``None`` when it was not predicted there."""
    for level in config.get("per_concurrency", []):
        if concurrency is not None and int(level["concurrency"]) == int(concurrency):
            return flat_level(config, level)
    return None


def candidates(results: Results) -> list[str]:
    """Candidate names in the order their best configuration ranks (unranked ones last)."""
    best: dict[str, float] = {}
    for c in results.configs:
        rank = c.get("rank")
        key = float(rank) if rank is not None else math.inf
        best[c["candidate"]] = min(best.get(c["candidate"], math.inf), key)
    order = {name: i for i, name in enumerate(c["name"] for c in results.candidates)}
    return sorted(best, key=lambda name: (best[name], order.get(name, len(order)), name))


def _speed_at(config: dict[str, Any], concurrency: int | None) -> float:
    level = level_of(config, concurrency)
    value = level.get("speedup_predicted") if level else None
    return float(value) if is_finite(value) else -math.inf


def best_per_candidate(results: Results) -> list[dict[str, Any]]:
    """For each candidate, its best configuration: the best-ranked k, or (when none of its ks fits
    in memory) the k with the highest predicted speedup at the primary concurrency."""
    primary = primary_concurrency(results)
    out = []
    for name in candidates(results):
        own = [c for c in results.configs if c["candidate"] == name]
        ranked = [c for c in own if c.get("rank") is not None]
        if ranked:
            out.append(min(ranked, key=lambda c: c["rank"]))
        else:
            out.append(max(own, key=lambda c: (_speed_at(c, primary), -c["k"])))
    return out


def largest_k_per_candidate(results: Results) -> list[dict[str, Any]]:
    """Each candidate's configuration with the largest k (its per-position data reach furthest)."""
    out = []
    for name in candidates(results):
        own = [c for c in results.configs if c["candidate"] == name]
        out.append(max(own, key=lambda c: c["k"]))
    return out


def select(results: Results, which: str | Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The configurations named by ``which`` ("CAND k=K", "CAND:K" or a bare candidate name for its
    best-ranked k); ``None`` = the best configuration of every candidate."""
    if which is None:
        return best_per_candidate(results)
    names = [which] if isinstance(which, str) else list(which)
    by_label = {config_label(c): c for c in results.configs}
    best = {c["candidate"]: c for c in best_per_candidate(results)}
    chosen = []
    for raw in names:
        name = str(raw).strip()
        if ":" in name and name.rsplit(":", 1)[1].strip().isdigit():
            cand, k = name.rsplit(":", 1)
            name = f"{cand.strip()} k={int(k)}"
        if name in by_label:
            chosen.append(by_label[name])
        elif name in best:
            chosen.append(best[name])
        else:
            known = ", ".join(sorted(best)) or "none"
            raise DraftfitError(
                f"no configuration {raw!r} in run {results.run_id}",
                fix=f"Name a candidate ({known}) or a config as 'CANDIDATE k=K'",
            )
    return chosen


# ---------------------------------------------------------------------------------------------
# tables


def ranking(results: Results) -> list[dict[str, Any]]:
    """Every configuration, ranked ones first in rank order, then those that do not fit."""
    primary = primary_concurrency(results)
    configs = sorted(results.configs, key=lambda c: (c.get("rank") is None, c.get("rank") or 0, -_speed_at(c, primary)))
    rows = []
    for c in configs:
        row = {
            "rank": c.get("rank"), "pareto": bool(c.get("pareto")), "config": config_label(c), "candidate": c["candidate"],
            "k": c["k"], "method": c.get("method"), "draft": c.get("draft"),
            "al": c.get("al_predicted"), "al_ci_low": c.get("al_ci_low"), "al_ci_high": c.get("al_ci_high"),
            "al_bound_low": c.get("al_bound_low"), "al_bound_high": c.get("al_bound_high"), "exact": bool(c.get("exact")),
            "acceptance_rate": c.get("acceptance_rate_predicted"),
            "extra_vram_gib": c.get("extra_vram_gib"), "fits": bool(c.get("fits", True)), "reason": c.get("rank_reason"),
            "kind": "predicted",
        }
        for level in c.get("per_concurrency", []):
            row[f"speedup@{level['concurrency']}"] = level.get("speedup_predicted")
        rows.append(row)
    return rows


def al_vs_k(results: Results) -> list[dict[str, Any]]:
    """Predicted mean acceptance length for every (candidate, k), with the 95% bootstrap CI over
    prompts and, where acceptance is not exact, the top-K bound."""
    rows = []
    for name in candidates(results):
        for c in sorted((c for c in results.configs if c["candidate"] == name), key=lambda c: c["k"]):
            rows.append({
                "candidate": name, "k": c["k"], "al": c.get("al_predicted"),
                "al_ci_low": c.get("al_ci_low"), "al_ci_high": c.get("al_ci_high"),
                "al_bound_low": c.get("al_bound_low"), "al_bound_high": c.get("al_bound_high"),
                "exact": bool(c.get("exact")), "kind": "predicted",
            })
    return rows


def per_position(results: Results, which: str | Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Per-position acceptance of the chosen configurations (``None``: each candidate's largest k).

    ``marginal`` = accepted at position i / drafts (vLLM's per-position rate: the first i drafts all
    accepted); ``conditional`` = marginal_i / marginal_{i-1} (accepted given the previous one was).
    Positions count from 1."""
    configs = largest_k_per_candidate(results) if which is None else select(results, which)
    rows = []
    for c in configs:
        marginal = c.get("per_position_predicted") or []
        conditional = c.get("conditional_predicted") or []
        for i, value in enumerate(marginal):
            rows.append({
                "config": config_label(c), "candidate": c["candidate"], "k": c["k"], "position": i + 1,
                "marginal": value, "conditional": conditional[i] if i < len(conditional) else None, "kind": "predicted",
            })
    return rows


def speedup_vs_concurrency(results: Results, which: str | Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Predicted speedup (with its CI), ITL and throughput at every concurrency level for the chosen
    configurations (``None``: each candidate's best-ranked k). Speedup < 1 means slower than serving
    without speculation."""
    rows = []
    for c in select(results, which):
        for level in c.get("per_concurrency", []):
            base, spec = level.get("itl_base_ms_predicted"), level.get("itl_spec_ms_predicted")
            gain = (1.0 - spec / base) if is_finite(base) and is_finite(spec) and base > 0 else None
            rows.append({
                "config": config_label(c), "candidate": c["candidate"], "k": c["k"], "concurrency": int(level["concurrency"]),
                "speedup": level.get("speedup_predicted"), "speedup_low": level.get("speedup_ci_low"),
                "speedup_high": level.get("speedup_ci_high"), "itl_base_ms": base, "itl_spec_ms": spec,
                "itl_gain": gain, "tok_s_per_seq": level.get("tok_s_per_seq_predicted"),
                "tok_s_aggregate": level.get("tok_s_aggregate_predicted"), "fits": bool(c.get("fits", True)),
                "source": level.get("latency_source") or c.get("latency_source"), "kind": "predicted",
            })
    return rows


def segments(results: Results, which: str | Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Predicted AL per prompt segment (``bucket``: input-length bucket; ``category``) for the chosen
    configurations (``None``: each candidate's best-ranked k). ``al`` is None where a segment saw no
    draft step."""
    rows = []
    for c in select(results, which):
        for dimension, parts in (c.get("segments_predicted") or {}).items():
            for name, part in parts.items():
                rows.append({
                    "config": config_label(c), "candidate": c["candidate"], "k": c["k"], "dimension": dimension,
                    "segment": name, "prompts": part.get("prompts"), "al": part.get("al"), "kind": "predicted",
                })
    return rows


def is_baseline(entry: dict[str, Any]) -> bool:
    """A ``measured`` entry of the no-speculation baseline (``draftfit verify`` writes candidate None)."""
    return entry.get("candidate") in (None, "", "baseline") or entry.get("k") in (None, 0)


def latency(entry: dict[str, Any], measure: str, stat: str) -> float | None:
    """A measured latency statistic in ms (``measure``: ttft, itl, e2e, stream_gap; ``stat``: mean,
    p50, p95, p99) of one ``measured`` entry."""
    dist = entry.get(f"{measure}_ms_measured")
    if isinstance(dist, dict):
        value = dist.get(stat)
    else:
        value = entry.get(f"{measure}_{stat}_ms_measured")
    return float(value) if is_finite(value) else None


def machine_load_text(loads: Any) -> str | None:
    """The machine's load over an entry's rounds: the highest 1-minute load average / CPUs, and the CPU steal."""
    rounds = loads if isinstance(loads, list) else [loads] if loads else []
    values = [v for r in rounds for v in (r.get("load_avg_1m_before"), r.get("load_avg_1m_after")) if v is not None]
    if not values:
        return None
    steal = [r["cpu_steal_share"] for r in rounds if r.get("cpu_steal_share") is not None]
    cpus = next((r.get("cpus") for r in rounds if r.get("cpus")), None)
    return f"{max(values):.1f}" + (f" / {cpus} CPUs" if cpus else "") + (f", steal {100 * max(steal):.0f}%" if steal else "")


def measured_vs_predicted(results: Results, *, latest_only: bool = False) -> list[dict[str, Any]]:
    """One row per ``measured`` entry, the prediction beside each measured value: AL, acceptance
    rate, speedup vs the baseline of the same run and group (median over rounds, with its
    interval), mean ITL; then the measured TTFT and ITL percentiles, output tok/s, errors, peak
    memory, the machine's load and the roll-out flags. Rows are grouped by verify run (newest
    first) and group, baseline first, so no table mixes baselines. ``latest_only``: the last run's.
    Empty until ``draftfit verify`` has run."""
    configs = {(c["candidate"], c["k"]): c for c in results.configs}
    base_levels = {}  # concurrency -> any config's level there (all share the predicted baseline ITL)
    for c in results.configs:
        for lv in c.get("per_concurrency", []):
            base_levels.setdefault(int(lv["concurrency"]), lv)
    from draftfit.verify.comparison import entry_label, latest_run

    rows = []
    for entry in (latest_run(results.measured) if latest_only else results.measured):
        baseline = is_baseline(entry)
        # a k schedule's prediction at a level is that of the k it runs there (k_predicted; none where it is off)
        k = entry.get("k_predicted") if entry.get("schedule") else entry.get("k")
        config = None if baseline or k is None else configs.get((entry.get("candidate"), k))
        if baseline:
            level = base_levels.get(int(entry["concurrency"])) if entry.get("concurrency") is not None else None
        else:
            level = level_of(config, entry.get("concurrency")) if config else None

        def predicted(key: str, level_key: str | None = None, *, _entry=entry, _level=level):
            value = _entry.get(key)
            if value is None and _level is not None:
                value = _level.get(level_key or key)
            return value

        memory = entry.get("memory_measured") or {}
        row = {
            "config": "no speculation (baseline)" if baseline else entry_label(entry),
            "candidate": None if baseline else entry.get("candidate"), "k": None if baseline else entry.get("k"),
            "schedule": None if baseline else entry.get("schedule"), "k_predicted": entry.get("k_predicted"),
            "concurrency": entry.get("concurrency"), "baseline": baseline,
            "requests": entry.get("requests"), "completed": entry.get("completed"), "errors": entry.get("errors"),
            "al_predicted": None if baseline else predicted("al_predicted"),
            "al_measured": entry.get("al_measured"),
            "acceptance_rate_predicted": None if baseline else predicted("acceptance_rate_predicted"),
            "acceptance_rate_measured": entry.get("acceptance_rate_measured"),
            "speedup_predicted": None if baseline else predicted("speedup_predicted"),
            "speedup_measured": entry.get("speedup_measured"),
            "itl_mean_ms_predicted": predicted("itl_ms_predicted", "itl_base_ms_predicted" if baseline else "itl_spec_ms_predicted"),
            "itl_mean_ms_measured": (entry.get("itl_rounds_measured") or {}).get("median") or latency(entry, "itl", "mean"),
            "tok_s_measured": entry.get("output_tok_s_measured", entry.get("tok_s_measured")),
            "peak_memory_gib_measured": memory.get("peak_device_used_gib") or memory.get("peak_engine_rss_gib"),
            "per_position_measured": list(entry.get("per_position_measured") or []),
            "per_position_predicted": list((config or {}).get("per_position_predicted") or []),
            "flags": list(entry.get("flags") or []),
            "engine_fault": entry.get("engine_fault"),
            "engine_failed": bool(entry.get("engine_failed")),
            "error": entry.get("error"),
            "machine_load_measured": entry.get("machine_load_measured"),
            "machine_load_text": machine_load_text(entry.get("machine_load_measured")),
            "verify_id": entry.get("verify_id"), "group": int(entry.get("group") or 0), "rounds": entry.get("rounds") or 1,
            "speedup_ci_low_measured": entry.get("speedup_ci_low_measured"),
            "speedup_ci_high_measured": entry.get("speedup_ci_high_measured"),
            "itl_ci_low_ms_measured": (entry.get("itl_rounds_measured") or {}).get("ci_low"),
            "itl_ci_high_ms_measured": (entry.get("itl_rounds_measured") or {}).get("ci_high"),
            "baseline_itl_ms_measured": (entry.get("baseline_ref") or {}).get("itl_ms_median"),
            "kind": "measured",
        }
        for measure in LATENCY_MEASURES:
            for stat in PERCENTILES:
                row[f"{measure}_{stat}_ms_measured"] = latency(entry, measure, stat)
        rows.append(row)
    rows.sort(key=lambda r: (r["candidate"] or "", r["k"] or 0, str(r["schedule"] or "")))
    rows.sort(key=lambda r: (r["group"], not r["baseline"]))
    rows.sort(key=lambda r: str(r["verify_id"] or ""), reverse=True)
    return rows


__all__ = [
    "LATENCY_MEASURES",
    "al_vs_k",
    "best_per_candidate",
    "candidates",
    "concurrency_levels",
    "is_baseline",
    "config_label",
    "largest_k_per_candidate",
    "latency",
    "level_of",
    "load",
    "measured_vs_predicted",
    "per_position",
    "primary_concurrency",
    "ranking",
    "recommended_keys",
    "row_key",
    "segments",
    "select",
    "speedup_vs_concurrency",
]


def row_key(row: dict[str, Any]) -> tuple[str | None, int | None, list[list[int]] | None]:
    """A measured row's configuration: (candidate, k, k schedule or None)."""
    return row["candidate"], row["k"], row["schedule"] or None


def recommended_keys(results: Results) -> list[tuple[str | None, int | None, list[list[int]] | None]]:
    """The recommended configuration as measured rows name it (:func:`row_key`): rank's exact deploy
    command (its k schedule included) first, then its k alone."""
    from draftfit.verify.selection import deployed_k

    rec = results.recommendation or {}
    keys = [(rec.get("candidate"), rec.get("k"), None)]
    try:
        deployed = deployed_k(results)
    except DraftfitError:  # not deployable: no command to have measured
        deployed = None
    if deployed is not None and deployed[1]:
        keys.insert(0, (rec["candidate"], deployed[0], [list(r) for r in deployed[1]]))
    return keys


def measured_better(results: Results) -> str | None:
    """A sentence when `verify` measured a configuration faster than the recommended one at the
    primary concurrency (both measured, neither a suspected engine fault), else None."""
    rec = results.recommendation or {}
    level = rec.get("primary_concurrency")
    usable = [r for r in measured_vs_predicted(results, latest_only=True)
              if not r["baseline"] and r["concurrency"] == level and r["speedup_measured"] is not None
              and not r["engine_fault"] and not r["engine_failed"]]
    if not usable:
        return None
    best = max(usable, key=lambda r: r["speedup_measured"])
    chosen = (rec.get("candidate"), rec.get("k"))
    if chosen[0] is None:  # the recommendation was to serve without speculation
        if best["speedup_measured"] <= 1.0:
            return None
        return (f"rank recommended serving without speculation, but verify measured {best['config']} faster than the "
                f"baseline at concurrency {level}: {best['speedup_measured']:.2f}× (measured)")
    keys = recommended_keys(results)
    mine = next((r for key in keys for r in usable if row_key(r) == key), None)
    if mine is None:
        return (f"the recommended {chosen[0]} k={chosen[1]} was not verified; of the verified configurations "
                f"{best['config']} measured fastest at concurrency {level}: {best['speedup_measured']:.2f}× (measured)")
    # at the primary level the schedule runs the recommended k: that k measured alone is not another choice
    if best is mine or best["speedup_measured"] <= mine["speedup_measured"] or row_key(best) == keys[-1]:
        return None
    return (f"verify measured {best['config']} faster than the recommended {mine['config']} at concurrency {level}: "
            f"{best['speedup_measured']:.2f}× against {mine['speedup_measured']:.2f}× (measured, "
            + ("one run each)" if best["rounds"] == 1 else f"median over {best['rounds']} interleaved rounds)"))

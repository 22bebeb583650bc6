"""The plain-text tables the commands print: rank's ranking, verify's plan and summary."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from draftfit import results as results_mod
from draftfit.explore import machine_load_text
from draftfit.verify.comparison import entry_label
from draftfit.verify.selection import VerifyConfig


def format_table(results: results_mod.Results, *, limit: int = 20) -> str:
    """The ranking as plain text: rank, config, predicted AL and speedup per concurrency, VRAM, fit.

    Once `draftfit verify` has measured a config, its row is followed by one line per verified
    concurrency: measured AL and speedup with the relative error of the prediction.
    """
    configs = [c for c in results.configs if c.get("rank") is not None]
    configs.sort(key=lambda c: c["rank"])
    levels = [p["concurrency"] for p in configs[0]["per_concurrency"]] if configs else []
    head = f"{'#':>3}  {'config':<22} {'AL (pred.)':>15} " + " ".join(f"{'×@' + str(b):>7}" for b in levels) + f" {'+VRAM GiB':>9}  fit"
    lines = [head, "-" * len(head)]

    def row(c: dict, rank: str) -> None:
        # no drafting step at all in the sample (prompt lookup that never matched): no AL to show
        drafted = c.get("al_predicted") is not None and math.isfinite(c["al_predicted"])
        al = f"{c['al_predicted']:.2f} [{c['al_ci_low']:.2f},{c['al_ci_high']:.2f}]" if drafted else "— (no drafts)"
        speeds = " ".join(f"{p['speedup_predicted']:>7.2f}" for p in c["per_concurrency"])
        lines.append(f"{rank:>4} {c['candidate'] + ' k=' + str(c['k']):<22} {al:>15} {speeds} {c['extra_vram_gib']:>9.3f}  {'yes' if c['fits'] else 'NO'}")
        lines.extend(_measured_lines(c))

    def ranked_row(c: dict) -> None:
        row(c, f"{c['rank']}{'*' if c.get('pareto') else ' '}")

    for c in configs[:limit]:
        ranked_row(c)
    if len(configs) > limit:
        shown = {c["candidate"] for c in configs[:limit]}
        best_of_rest = []
        for c in configs[limit:]:  # ranked order: the first row of a draft is its best
            if c["candidate"] not in shown:
                shown.add(c["candidate"])
                best_of_rest.append(c)
        if best_of_rest:
            lines.append("  the best configuration of every other draft:")
            for c in best_of_rest:
                ranked_row(c)
        lines.append(f"  ({len(configs) - limit - len(best_of_rest)} more ranked configs in results.csv and the report)")
    unranked = [c for c in results.configs if c.get("rank") is None]
    if unranked:
        lines.append(f"  not ranked — they do not fit in memory at the study's concurrency and max_model_len ({len(unranked)}):")
        for c in unranked:
            row(c, "-")
    return "\n".join(lines)


def format_recommendation(rec: dict[str, Any]) -> str:
    """The recommendation as rank prints it, with why it was chosen: by the tie rule it need not be
    rank 1, and a user who sees a faster config above it should read the reason beside it."""
    if not rec.get("candidate"):
        return f"Recommendation (predicted): no speculation — {rec.get('reason', 'nothing ranked')}"
    lines = [f"Recommendation (predicted): {rec['candidate']} with k={rec['k']} — {rec['speedup']:.2f}× "
             f"[{rec['speedup_low']:.2f}, {rec['speedup_high']:.2f}] at concurrency {rec['primary_concurrency']}"]
    if rec.get("reason"):
        lines.append(f"why: {rec['reason']}")
    schedule = ", ".join(f"{e['concurrency']}: {'off' if not e['k'] else 'k=' + str(e['k'])}" for e in rec.get("schedule", []))
    if schedule:
        lines.append(f"k by concurrency: {schedule}")
    return "\n".join(lines)


def _measured_lines(config: dict) -> list[str]:
    def err(pred, meas) -> str:
        return f"{(pred - meas) / meas:+.0%}" if pred is not None and meas else "—"

    lines = []
    for level in config["per_concurrency"]:
        al, speed = level.get("al_measured"), level.get("speedup_measured")
        if al is None and speed is None:
            continue
        al_text = f"AL {al:.2f} (pred. err {err(config['al_predicted'], al)})" if al is not None else "AL —"
        speed_text = (f"× {speed:.2f} (pred. err {err(level['speedup_predicted'], speed)})" if speed is not None else "× —")
        lines.append(f"       measured @{level['concurrency']}: {al_text}, {speed_text}")
    return lines


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.0f}%"


def _interval_text(point: float | None, low: float | None, high: float | None, spec: str = ".2f") -> str:
    if point is None:
        return "—"
    return f"{point:{spec}} [{_fmt(low, spec)},{_fmt(high, spec)}]" if low is not None else f"{point:{spec}}"


def format_summary(measured: Sequence[dict[str, Any]], verify_id: str | None = None) -> str:
    """Predicted vs measured per (configuration, concurrency) of one verify run: the measured
    speedup and ITL as the median over rounds with their bootstrap 95% interval, the baseline
    each speedup divides by, the machine's load, and the relative error of each prediction."""
    rows = [e for e in measured if verify_id is None or e.get("verify_id") == verify_id]
    width = max([20, *(len(entry_label(e)) for e in rows)])
    head = (f"{'config':<{width}} {'C':>3} {'AL pred':>7} {'meas':>6} {'err':>5}  {'× pred':>6} {'× meas [95%]':>18} {'err':>5}  "
            f"{'ITL pred':>8} {'ITL meas [95%] ms':>20} {'base ITL':>8} {'p95/p99':>9} {'TTFT p50':>8}  {'machine load':<26} flags")
    lines = [head, "-" * len(head)]
    for e in rows:
        name = entry_label(e)
        if e.get("engine_failed"):
            lines.append(f"{name:<{width}} {e['concurrency']:>3}  engine failed: {e.get('error')}")
            continue
        itl = e.get("itl_ms_measured") or {}
        rounds = e.get("itl_rounds_measured") or {}
        itl_point = rounds.get("median", itl.get("mean"))
        tails = "/".join(_fmt(itl.get(f"p{q}"), ".0f") for q in (95, 99))
        base = (e.get("baseline_ref") or {}).get("itl_ms_median")
        lines.append(
            f"{name:<{width}} {e['concurrency']:>3} {_fmt(e.get('al_predicted')):>7} {_fmt(e.get('al_measured')):>6} {_pct(e.get('al_error')):>5}  "
            f"{_fmt(e.get('speedup_predicted')):>6} "
            f"{_interval_text(e.get('speedup_measured'), e.get('speedup_ci_low_measured'), e.get('speedup_ci_high_measured')):>18} "
            f"{_pct(e.get('speedup_error')):>5}  {_fmt(e.get('itl_ms_predicted'), '.1f'):>8} "
            f"{_interval_text(itl_point, rounds.get('ci_low'), rounds.get('ci_high'), '.1f'):>20} {_fmt(base, '.1f'):>8} "
            f"{tails:>9} {_fmt((e.get('ttft_ms_measured') or {}).get('p50'), '.0f'):>8}  "
            f"{machine_load_text(e.get('machine_load_measured')) or '—':<26} "
            f"{','.join(e.get('flags', [])) or '-'}"
        )
    if rows:
        first = rows[0]
        groups = sorted({int(e.get("group") or 0) for e in rows})
        lines.append(f"verify {first.get('verify_id')}: {first.get('rounds') or 1} round(s) per configuration and level, "
                     f"{first.get('requests_per_run') or first.get('requests')} requests per run, prompts {str(first.get('prompts_hash') or '')[:12]}; "
                     + (f"{len(groups)} groups, each speedup divided by its own group's baseline; " if len(groups) > 1 else "")
                     + "machine load = the highest 1-min load average over the rounds, and the CPU time stolen")
    if any(e.get("schedule") for e in rows):
        lines.append("k=[start-end:k …]: a k schedule by batch size (rank's recommended command); its prediction at a level is "
                     "that of the k it runs there (none where k is 0), while the requests finishing at a level's end run "
                     "at smaller batch sizes")
    mismatched = sum(int(e.get("prompt_token_mismatches") or 0) for e in rows)
    if mismatched:
        lines.append(f"{mismatched} request(s): the server counted the prompt in other tokens than `rank` rendered it "
                     "(its chat template differs); their acceptance is not the predicted text's")
    subsets = {e["prompts_predicted"] for e in rows if e.get("prompts_predicted")}
    if subsets:
        lines.append(f"predictions cover the {', '.join(map(str, sorted(subsets)))} prompts sent (the first of the sample), "
                     "as the measurements do; results.json keeps the whole sample's as *_all_prompts")
    faults = [e for e in rows if e.get("engine_fault")]
    if faults:
        lines.append("")
        lines.append("Suspected engine faults (not prediction errors):")
        for e in faults:
            name = entry_label(e)
            lines.append(f"  {name} at concurrency {e['concurrency']}: {e['engine_fault']}")
    return "\n".join(lines)


def describe_plan(configs: Sequence[VerifyConfig], levels: Sequence[int], requests: int | None) -> str:
    """What a verify run will start, for --dry-run."""
    lines = [f"concurrency levels: {', '.join(map(str, levels))}; requests per run: {requests or 'one per sampled prompt'}",
             "baseline: no speculation"]
    for config in configs:
        lines.append(f"{config.label}: speculative_config {json.dumps(config.speculative_config)}")
    return "\n".join(lines)


def format_what_if(result) -> str:
    """`draftfit predict`'s table: one row per k, predicted speedup and ITL at each concurrency, then the memory."""
    entries = result.entries
    levels = sorted({e["concurrency"] for e in entries})
    lines = ["Predicted (step model of " + result.provenance["hardware"]["label"] + "; no model was run)"]
    head = f"{'k':>4} {'AL':>6} " + " ".join(f"{'×@' + str(c):>8}" for c in levels) + "  ITL ms at each level"
    lines += [head, "-" * len(head)]
    base = {e["concurrency"]: e["itl_base_ms_predicted"] for e in entries}
    lines.append(f"{'off':>4} {'1.00':>6} " + " ".join(f"{1.0:>8.2f}" for _ in levels) + "  "
                 + " ".join(f"{base[c]:.1f}" for c in levels))
    for k in sorted({e["k"] for e in entries if e["k"] is not None}):
        row = {e["concurrency"]: e for e in entries if e["k"] == k}
        lines.append(f"{k:>4} {row[levels[0]]['al_predicted']:>6.2f} "
                     + " ".join(f"{row[c]['speedup_predicted']:>8.2f}" for c in levels) + "  "
                     + " ".join(f"{row[c]['itl_ms_predicted']:.1f}" for c in levels))
    vram = result.vram
    lines.append("")
    pool = f"; {vram['cache_blocks']:,} pool blocks (vLLM needs one per sequence)" if vram["cache_blocks"] else ""
    lines.append(f"KV capacity {vram['kv_capacity_tokens']:,} tokens ({vram['kv_cache_gib']:.2f} GiB per GPU, kv dtype "
                 f"{vram['kv_cache_dtype']}){pool}; speculation takes {vram['extra_vram_gib']:.2f} GiB per GPU; {vram['fit_reason']}")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)

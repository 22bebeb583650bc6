"""Render a results file into one self-contained HTML page.

The page is a Jinja2 template shipped with the package (``templates/report.html.j2``, CSS inline)
with the figures of :mod:`draftfit.report.plots` inlined as SVG data URIs: it opens from disk and
fetches nothing. Autoescaping is on for everything, so text that comes from prompts, datasets,
candidate files or model files (special tokens such as ``<|im_start|>``) shows as text and never as
markup. The page has no script.

Sections follow the order a reviewer needs them: recommendation, tokenizer verdicts, ranking,
acceptance (AL vs k, per position), speedup vs concurrency, memory, Pareto front, segments,
predicted vs measured, warnings, provenance.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from draftfit import explore
from draftfit.outputs import check_output_file, head_contains
from draftfit.results import Results

REPORT_NAME = "report.html"
# A bound or interval counts as wide (and is listed under warnings) past these fractions of the value.
WIDE_BOUND = 0.10
WIDE_CI = 0.25
MIN_R2 = 0.8  # a measured step-time fit below this is listed under warnings
MAX_DROPPED_ROWS = 200

SECTIONS = (
    ("recommendation", "Recommendation"),
    ("tokenizers", "Tokenizer verdicts"),
    ("ranking", "Ranking"),
    ("acceptance", "Acceptance length vs k"),
    ("positions", "Per-position acceptance"),
    ("speedup", "Speedup vs concurrency"),
    ("memory", "Memory"),
    ("pareto", "Speedup vs extra VRAM"),
    ("segments", "Acceptance by segment"),
    ("measured", "Predicted vs measured"),
    ("warnings", "Warnings"),
    ("provenance", "Provenance"),
)


# ---------------------------------------------------------------------------------------------
# formatting (Jinja filters)


def _finite(value: Any) -> bool:
    return explore.is_finite(value)


def fmt_num(value: Any, digits: int = 2) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not _finite(value):
        return "—"
    return f"{value:,.{digits}f}"


def fmt_x(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}×" if _finite(value) else "—"


def fmt_pct(value: Any, digits: int = 0) -> str:
    return f"{100 * value:.{digits}f}%" if _finite(value) else "—"


def fmt_ci(low: Any, high: Any, digits: int = 2) -> str:
    if not (_finite(low) and _finite(high)):
        return ""
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def fmt_gib(value: Any, digits: int = 3) -> str:
    return f"{value:,.{digits}f} GiB" if _finite(value) else "—"


def fmt_bytes(value: Any) -> str:
    if not _finite(value):
        return "—"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} B"


def fmt_int(value: Any) -> str:
    return f"{int(value):,}" if _finite(value) else "—"


def fmt_ms(value: Any) -> str:
    if not _finite(value):
        return "—"
    return f"{value:.3f}" if abs(value) < 1 else f"{value:,.1f}"


def fmt_g(value: Any) -> str:
    return f"{value:.6g}" if _finite(value) else "—"


def speed_class(value: Any) -> str:
    """CSS class of a speedup cell: gain, loss, or near break-even (within 2%)."""
    if not _finite(value):
        return ""
    if value >= 1.02:
        return "gain"
    if value <= 0.98:
        return "loss"
    return "even"


def heat(value: Any, low: float, high: float) -> str:
    """An inline background colour for a value in [low, high] (white → blue)."""
    if not _finite(value) or not (_finite(low) and _finite(high)) or high <= low:
        return ""
    t = min(1.0, max(0.0, (value - low) / (high - low)))
    return f"background-color: hsl(212, 70%, {96 - 30 * t:.0f}%)"


def fmt_command(command: str | list[str] | None):
    """A shell command as HTML whose options a browser never breaks (a hyphen is a line-break
    opportunity: `--speculative-config` broke as `-` / `-speculative-config`); other words wrap."""
    import shlex

    from markupsafe import Markup

    if not command:
        return ""
    words = shlex.split(command) if isinstance(command, str) else list(command)
    return Markup(" ").join(
        Markup('<span class="flag">{}</span>').format(shlex.quote(w)) if w.startswith("-") else shlex.quote(w)
        for w in words)


FILTERS = {
    "num": fmt_num, "x": fmt_x, "pct": fmt_pct, "ci": fmt_ci, "gib": fmt_gib, "bytes": fmt_bytes,
    "int": fmt_int, "ms": fmt_ms, "g": fmt_g, "speed_class": speed_class, "command": fmt_command,
}


# ---------------------------------------------------------------------------------------------
# the sections' data


def _recommendation(results: Results) -> dict[str, Any]:
    rec = results.recommendation or {}
    deploy = results.deploy or {}
    recommended = deploy.get("recommended") or {}
    baseline = deploy.get("baseline") or {}
    levels = explore.concurrency_levels(results)
    configs = {(c["candidate"], c["k"]): c for c in results.configs}
    base_itl = {}
    for c in results.configs:
        for level in c.get("per_concurrency", []):
            base_itl.setdefault(int(level["concurrency"]), level.get("itl_base_ms_predicted"))
    schedule = []
    for entry in rec.get("schedule") or []:
        level_no = int(entry["concurrency"])
        k = entry.get("k")
        # off (k = 0): any of the candidate's configurations carries what its proposer costs there
        config = configs.get((rec.get("candidate"), k)) if k else next(
            (c for c in results.configs if c["candidate"] == rec.get("candidate")), None)
        level = explore.level_of(config, level_no) if config else None
        base = (level or {}).get("itl_base_ms_predicted", base_itl.get(level_no))
        spec = (level or {}).get("itl_spec_ms_predicted" if k else "itl_off_ms_predicted")
        gain = 1.0 - spec / base if _finite(base) and _finite(spec) and base > 0 else None
        schedule.append({
            "concurrency": level_no, "k": k, "speedup": entry.get("speedup") if k else entry.get("off_speedup"),
            "speedup_low": entry.get("speedup_low") if k else None, "speedup_high": entry.get("speedup_high") if k else None,
            "best_off": entry.get("speedup") if not k else None,
            "itl_base_ms": base, "itl_spec_ms": spec, "itl_gain": gain, "reason": entry.get("reason", ""),
        })
    chosen = configs.get((rec.get("candidate"), rec.get("k")))
    vram = (chosen or {}).get("vram")
    rows = explore.measured_vs_predicted(results)
    # the deploy command itself (its k schedule included) where verify measured it, else its k alone
    measured = next((found for key in explore.recommended_keys(results)
                     if (found := [r for r in rows if explore.row_key(r) == key])), [])
    method = rec.get("method")
    cand = next((c for c in results.candidates if c.get("name") == rec.get("candidate")), {})
    draft = _draft_label(cand.get("draft") or {"method": method}) or rec.get("model") or ""
    return {
        "present": bool(rec.get("candidate")),
        "candidate": rec.get("candidate"), "method": method, "draft": draft, "k": rec.get("k"),
        "primary": rec.get("primary_concurrency"), "speedup": rec.get("speedup"),
        "speedup_low": rec.get("speedup_low"), "speedup_high": rec.get("speedup_high"),
        "extra_vram_gib": (rec.get("extra_vram_bytes") or 0.0) / 1024**3 if rec.get("candidate") else None,
        "reason": rec.get("reason") or ("no results" if not results.configs else ""),
        "schedule": schedule, "vllm_schedule": rec.get("vllm_schedule") or [], "levels": levels,
        "vram": vram, "exact": bool((chosen or {}).get("exact")),
        "al": (chosen or {}).get("al_predicted"), "al_ci_low": (chosen or {}).get("al_ci_low"),
        "al_ci_high": (chosen or {}).get("al_ci_high"),
        "deploy_shell": recommended.get("shell"), "deployable": recommended.get("deployable", True),
        "deploy_problem": recommended.get("problem"), "deploy_notes": recommended.get("notes") or [],
        "deploy_version": recommended.get("vllm_version"),
        "baseline_shell": baseline.get("shell"), "deploy_prepare": recommended.get("prepare") or [],
        "measured": measured,
        "measured_better": explore.measured_better(results),
    }


def _draft_label(draft: dict[str, Any]) -> str:
    """How a candidate file names its draft, in its method's words (draftfit.methods)."""
    from draftfit.methods import METHODS

    method = METHODS.get(draft.get("method") or "draft_model")
    return method.label(draft) if method is not None else str(draft.get("model") or "")


def _model_free(method: str | None) -> bool:
    from draftfit.methods import METHODS

    return method in METHODS and METHODS[method].model_free


def _tokenizers(results: Results) -> list[dict[str, Any]]:
    checks = {c.get("candidate"): c for c in results.checks}
    skipped = {s.get("candidate"): s.get("reason") for s in results.skipped}
    failed = {f.get("candidate"): f for f in results.failed}
    rows = []
    for cand in results.candidates:
        name = cand.get("name")
        draft = cand.get("draft") or {}
        method = draft.get("method")
        check = checks.get(name)
        row = {"candidate": name, "method": method, "draft": _draft_label(draft), "skipped": skipped.get(name), "failed": failed.get(name), "check": check,
               "verdict": None, "summary": None, "engines": [], "by_engine": {}, "full": False}
        if check is None:
            if _model_free(method):
                row["verdict"], row["summary"] = "n/a", "model-free: proposes the target's own tokens"
        else:
            row["verdict"], row["summary"] = check.get("verdict"), check.get("summary")
            row["engines"] = [dict(e, name=key) for key, e in (check.get("engines") or {}).items()]
            row["by_engine"] = {e["name"]: e for e in row["engines"]}
            row["full"] = "tokenizer" in check
        rows.append(row)
    return rows


def _wide(results: Results) -> list[str]:
    notes = []
    by_candidate: dict[str, dict[str, list[int]]] = {}
    for c in results.configs:
        al = c.get("al_predicted")
        if not _finite(al) or al <= 0:
            continue
        entry = by_candidate.setdefault(c["candidate"], {"bound": [], "ci": []})
        lo, hi = c.get("al_bound_low"), c.get("al_bound_high")
        if not c.get("exact") and _finite(lo) and _finite(hi) and (hi - lo) > WIDE_BOUND * al:
            entry["bound"].append(c["k"])
        lo, hi = c.get("al_ci_low"), c.get("al_ci_high")
        if _finite(lo) and _finite(hi) and (hi - lo) > WIDE_CI * al:
            entry["ci"].append(c["k"])
    top_k = results.study.get("top_k_logprobs")
    sample = (results.prompts.get("summary") or {}).get("n_sampled")
    for name, entry in by_candidate.items():
        if entry["bound"]:
            notes.append(
                f"{name}: the top-K bound on AL is wider than {WIDE_BOUND:.0%} of AL at k = {_ks(entry['bound'])}"
                f" (top {top_k} logprobs) — the true value lies anywhere in it; more logprobs or the transformers"
                " backend (exact) narrow it")
        if entry["ci"]:
            notes.append(
                f"{name}: the 95% CI of AL is wider than {WIDE_CI:.0%} of AL at k = {_ks(entry['ci'])}"
                f"{f' over {sample} prompts' if sample else ''} — sample more prompts (--sample-size) to narrow it")
    for label, profile in _profiles(results):
        r2 = profile.get("r2")
        if _finite(r2) and r2 < MIN_R2:
            notes.append(
                f"{label or 'the target'}: the measured step-time fit explains little of the timings (R² {r2:.2f} over"
                f" {profile.get('n_samples')} steps) — latency predictions that use it are uncertain; time the"
                " steps again on a quiet machine")
    rec = results.recommendation or {}
    if rec.get("candidate") and _finite(rec.get("speedup_low")) and rec["speedup_low"] < 1.0:
        notes.append(
            f"the recommended {rec['candidate']} k={rec['k']} has a speedup CI "
            f"{fmt_ci(rec.get('speedup_low'), rec.get('speedup_high'))} that reaches below 1× at concurrency "
            f"{rec.get('primary_concurrency')}: it may not pay — confirm with `draftfit verify`")
    return notes


def _profiles(results: Results) -> list[tuple[str | None, dict[str, Any]]]:
    """(candidate, fitted step profile) of every model draft with a measured profile, and
    (None, profile) for the target's."""
    out = []
    target = (results.targets or [{}])[0] if results.targets else {}
    profile = (target.get("profile") or {}).get("profile")
    if profile:
        out.append((None, profile))
    seen = set()
    for c in results.configs:
        step = ((c.get("cost") or {}).get("draft") or {}).get("step") or {}
        prof = step.get("profile")
        if prof and c["candidate"] not in seen:
            seen.add(c["candidate"])
            out.append((c["candidate"], prof))
    return out


def _ks(ks: list[int]) -> str:
    return ", ".join(str(k) for k in sorted(ks))


def _warnings(results: Results) -> dict[str, Any]:
    dropped = list(results.prompts.get("dropped") or [])
    reasons: dict[str, int] = {}
    for d in dropped:
        reason = str(d.get("reason", "dropped")).split(":")[0]
        reasons[reason] = reasons.get(reason, 0) + 1
    meanings = _flag_meanings()
    flags = []
    for row in explore.measured_vs_predicted(results):
        where = f"{row['config']} at concurrency {row['concurrency']}"
        for flag in row["flags"]:
            meaning = meanings.get(flag)
            flags.append(f"{where}: {flag}" + (f" — {meaning}" if meaning else ""))
        if row["engine_fault"]:
            flags.append(f"{where}: suspected engine fault — {row['engine_fault']}")
        if row["engine_failed"] and row["error"]:
            flags.append(f"{where}: the engine failed — {row['error']}")
    failed = []
    for f in results.failed:
        what = f.get("candidate") or f.get("name") or ""
        knobs = f.get("knobs") if isinstance(f.get("knobs"), dict) else {}
        if knobs:  # the engine's message here, the knobs as a list below it
            why = f"the draft's engine {f.get('kind', 'failed')} during {f.get('stage', 'the run')}: {f.get('error', '')}"
        else:
            why = f.get("reason") or f.get("message") or f.get("error") or ", ".join(f"{k}={v}" for k, v in f.items() if k != "candidate")
        failed.append({"candidate": what, "reason": why, "knobs": {k: v for k, v in knobs.items() if isinstance(v, dict)}})
    items = {
        "run": list(results.warnings), "skipped": list(results.skipped), "failed": failed,
        "dropped": dropped[:MAX_DROPPED_ROWS], "dropped_total": len(dropped), "dropped_reasons": reasons,
        "wide": _wide(results), "measured_flags": flags,
    }
    items["count"] = (len(items["run"]) + len(items["skipped"]) + len(failed) + (1 if dropped else 0)
                      + len(items["wide"]) + len(flags))
    return items


def _flag_meanings() -> dict[str, str]:
    """What each of `draftfit verify`'s roll-out flags means (empty where verify is not installed)."""
    try:
        from draftfit.verify.comparison import ROLLOUT_FLAGS
    except ImportError:
        return {}
    return dict(ROLLOUT_FLAGS)


def _segments(results: Results) -> list[dict[str, Any]]:
    rows = explore.segments(results)
    configs = list(dict.fromkeys(r["config"] for r in rows))
    summary = results.prompts.get("summary") or {}
    tables = []
    for dimension, title in (("bucket", "input-length bucket"), ("category", "category")):
        own = [r for r in rows if r["dimension"] == dimension]
        if not own:
            continue
        names = list(dict.fromkeys(r["segment"] for r in own))
        if dimension == "bucket":
            order = {"short": 0, "medium": 1, "long": 2}
            names.sort(key=lambda n: (order.get(n, 9), n))
        values = [r["al"] for r in own if _finite(r["al"])]
        low, high = (min(values), max(values)) if values else (0.0, 0.0)
        cells = {(r["segment"], r["config"]): r for r in own}
        prompts = {r["segment"]: r["prompts"] for r in own}
        table_rows = []
        for name in names:
            cols = []
            for cfg in configs:
                cell = cells.get((name, cfg))
                value = cell["al"] if cell else None
                cols.append({"al": value, "style": heat(value, low, high)})
            table_rows.append({"segment": name, "prompts": prompts.get(name), "cells": cols})
        thresholds = summary.get("thresholds") if dimension == "bucket" else None
        tables.append({"dimension": dimension, "title": title, "configs": configs, "rows": table_rows, "thresholds": thresholds})
    return tables


def _memory(results: Results) -> list[dict[str, Any]]:
    rows = []
    for c in explore.best_per_candidate(results):
        v = c.get("vram")
        if not v:
            continue
        rows.append({"candidate": c["candidate"], **v})
    return rows


def _break_even(results: Results) -> list[dict[str, Any]]:
    levels = explore.concurrency_levels(results)
    out = []
    for c in explore.best_per_candidate(results):
        be = c.get("break_even") or {}
        itl = [explore.level_of(c, level) or {} for level in levels]
        out.append({"config": explore.config_label(c), "status": be.get("status"),
                     "first_losing": be.get("first_losing_concurrency"), "crossing": be.get("crossing_concurrency"),
                     "itl": [(p.get("itl_base_ms_predicted"), p.get("itl_spec_ms_predicted")) if p else None for p in itl]})
    return out


def _al_table(results: Results) -> dict[str, Any]:
    rows = explore.al_vs_k(results)
    ks = sorted({r["k"] for r in rows})
    table = []
    for name in dict.fromkeys(r["candidate"] for r in rows):
        by_k = {r["k"]: r for r in rows if r["candidate"] == name}
        table.append({"candidate": name, "cells": [by_k.get(k) for k in ks]})
    return {"ks": ks, "rows": table}


def _speed_table(results: Results) -> list[dict[str, Any]]:
    levels = explore.concurrency_levels(results)
    rows = explore.speedup_vs_concurrency(results)
    out = []
    for label in dict.fromkeys(r["config"] for r in rows):
        by_level = {r["concurrency"]: r for r in rows if r["config"] == label}
        out.append({"config": label, "cells": [by_level.get(level) for level in levels]})
    return out


def _pareto_front(results: Results) -> list[dict[str, Any]]:
    primary = explore.primary_concurrency(results)
    front = []
    for c in results.configs:
        if c.get("pareto"):
            level = explore.level_of(c, primary) or {}
            front.append({"config": explore.config_label(c), "extra_vram_gib": c.get("extra_vram_gib"),
                          "speedup": level.get("speedup_predicted"), "rank": c.get("rank")})
    return sorted(front, key=lambda r: (r["extra_vram_gib"] or 0.0, -(r["speedup"] or 0.0)))


def _position_table(results: Results) -> tuple[int, list[dict[str, Any]]]:
    rows = explore.per_position(results)
    width = max((r["position"] for r in rows), default=0)
    table = []
    for label in dict.fromkeys(r["config"] for r in rows):
        cells: list[dict[str, Any] | None] = [None] * width
        for r in rows:
            if r["config"] == label:
                cells[r["position"] - 1] = r
        table.append({"config": label, "cells": cells})
    return width, table


def _provenance(results: Results) -> dict[str, Any]:
    prov = dict(results.provenance)
    hardware = prov.get("hardware") or {}
    engine = prov.get("engine") or {}
    target = (results.targets or [{}])[0]
    profiles = _profiles(results)
    profile = next((p for label, p in profiles if label is None), None)
    draft_profiles = [{"candidate": label, **p} for label, p in profiles if label is not None]
    return {
        "run_id": results.run_id, "created": results.created, "schema_version": results.schema_version,
        "draftfit": prov.get("draftfit"), "git_commit": prov.get("git_commit"), "command_line": prov.get("command_line"),
        "python": prov.get("python"), "platform": prov.get("platform"), "machine": prov.get("machine") or {},
        "packages": prov.get("packages") or {}, "seeds": prov.get("seeds") or {}, "hardware": hardware,
        "engine": engine, "timings": prov.get("timings") or {}, "study": results.study,
        "prompts": results.prompts.get("summary") or {}, "prompts_hash": results.prompts.get("prompts_hash"),
        "target": (target or {}).get("target") or {}, "trajectories": (target or {}).get("trajectories") or {},
        "target_profile": profile, "draft_profiles": draft_profiles, "served_timing": _served_timing(prov),
        "verify_runs": [v for v in prov.get("verify") or [] if isinstance(v, dict)],
    }


def _served_timing(prov: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per timed engine (the plain target, then each candidate): its served steps by batch
    (ms) and, for a candidate, the correction they gave the cost model and its steps timed alone as
    the corrected model gives them back, at their context and at the study's."""
    served = prov.get("served_timing") or {}
    if not served:
        return []
    base = [t for t in [served.get("baseline"), *(served.get("baseline_batched") or [])] if t]
    rows = [{"name": "no speculation", "steps": base, "correction": None, "replayed": []}] if base else []
    corrections = served.get("corrections") or {}
    replayed = served.get("replayed") or {}
    rows += [{"name": name, "steps": steps, "correction": corrections.get(name), "replayed": replayed.get(name) or []}
             for name, steps in sorted((served.get("speculative") or {}).items())]
    return rows


def _figures(results: Results) -> dict[str, str | None]:
    from draftfit.report import plots

    builders = {
        "al_vs_k": lambda: plots.al_vs_k_figure(results),
        "marginal": lambda: plots.per_position_figure(results),
        "conditional": lambda: plots.per_position_figure(results, conditional=True),
        "speedup": lambda: plots.speedup_figure(results),
        "vram_stack": lambda: plots.vram_stack_figure(results),
        "extra_vram": lambda: plots.extra_vram_figure(results),
        "pareto": lambda: plots.pareto_figure(results),
        "measured_speedup": lambda: plots.measured_figure(results, "speedup"),
        "measured_al": lambda: plots.measured_figure(results, "al"),
        "measured_positions": lambda: plots.measured_positions_figure(results),
    }
    out: dict[str, str | None] = {}
    for key, build in builders.items():
        fig = build()
        out[key] = plots.svg_data_uri(fig) if fig is not None else None
    return out


def _constant_text(name: str, value: float) -> str:
    if name.endswith("bytes_per_s"):
        return f"{value / 1e9:g} GB/s"
    if "bytes" in name:
        return f"{value / 2**30:.2f} GiB"
    if name.endswith("_s"):
        return f"{value * 1e3:.3f} ms"
    return f"{value:g}"


def _step_constants(step_model: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(constant, value, source) rows of the GPU step model the speed predictions used."""
    sources = step_model.get("sources") or {}
    rows = []
    for key, source in sources.items():
        name, _, role = key.partition(".")
        value = step_model.get(name)
        if isinstance(value, dict):
            value = value.get(role)
        if isinstance(value, (int, float)):
            rows.append((key, _constant_text(name, float(value)), source))
    return rows


def context(results: Results, *, figures: bool = True, results_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Everything the template shows, as plain data."""
    target = ((results.targets or [{}])[0].get("target") or {}) if results.targets else {}
    hardware = (results.provenance.get("hardware") or {}).get("gpu") or {}
    latency = results.study.get("latency_source")
    step_model = results.provenance.get("step_model") or {}
    if latency == "roofline" and results.study.get("gpu"):
        latency = f"step model of {results.study.get('gpu')} (constants below, each with its source)"
    elif latency == "measured":
        latency = "measured step profile on this machine"
    primary = explore.primary_concurrency(results)
    return {
        "results": results,
        "title": f"draftfit report — {target.get('name') or target.get('spec') or results.run_id}",
        "target": target,
        "hardware_name": hardware.get("name"),
        "latency": latency,
        "step_constants": _step_constants(step_model),
        "primary": primary,
        "levels": explore.concurrency_levels(results),
        "sections": SECTIONS,
        "rec": _recommendation(results),
        "tokenizers": _tokenizers(results),
        "ranking": explore.ranking(results),
        "al_rows": explore.al_vs_k(results),
        "positions": _position_table(results),
        "al_table": _al_table(results),
        "speed_table": _speed_table(results),
        "pareto_front": _pareto_front(results),
        "results_path": str(results_path) if results_path else f"reports/{results.run_id}/results.json",
        "break_even": _break_even(results),
        "memory": _memory(results),
        "segments": _segments(results),
        "measured": explore.measured_vs_predicted(results),
        "measured_prompts": sorted({int(e["prompts_predicted"]) for e in results.measured if e.get("prompts_predicted")}),
        "latency_columns": [(f"{m}_{q}_ms_measured", f"{m.upper()} {q}") for m in explore.LATENCY_MEASURES for q in explore.PERCENTILES],
        "warnings": _warnings(results),
        "prov": _provenance(results),
        "figures": _figures(results) if figures else {},
    }


# ---------------------------------------------------------------------------------------------
# rendering


def _environment():
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(
        loader=PackageLoader("draftfit.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(FILTERS)
    env.globals["heat"] = heat
    env.globals["isfinite"] = _finite
    return env


def render_html(results: Results, *, figures: bool = True, results_path: str | os.PathLike | None = None) -> str:
    """The report for ``results`` as one HTML document (``figures=False`` leaves the plots out;
    ``results_path`` is the results.json the page names in its commands)."""
    return _environment().get_template("report.html.j2").render(**context(results, figures=figures, results_path=results_path))


def write_report(results: Results, out_dir: str | os.PathLike) -> Path:
    """Write ``out_dir/report.html`` atomically and return its path (what ``draftfit rank`` calls
    at the end of a run)."""
    return write_html(results, Path(out_dir) / REPORT_NAME, results_path=Path(out_dir) / "results.json")


def write_html(results: Results, path: str | os.PathLike, *, results_path: str | os.PathLike | None = None) -> Path:
    """Render ``results`` into the HTML file ``path`` (written atomically)."""
    from draftfit.io import atomic_write_text

    return atomic_write_text(Path(path), render_html(results, results_path=results_path))


def render_file(results_path: str | os.PathLike, output: str | os.PathLike | None = None) -> Path:
    """Re-render the report of a saved results.json (default output: report.html beside it)."""
    from draftfit.results import load

    results = load(results_path)
    target = Path(output) if output is not None else Path(results_path).with_name(REPORT_NAME)
    results_path = Path(results_path)
    check_output_file(target, inputs=[results_path, results_path.with_suffix(".csv")], is_ours=is_report, what="report")
    return write_html(results, target, results_path=results_path)


def is_report(path: Path) -> bool:
    """Whether ``path`` is an HTML report draftfit wrote (its generator tag, or the title older reports carry)."""
    return head_contains(path, b'<meta name="generator" content="draftfit">') or head_contains(path, b"<title>draftfit report")

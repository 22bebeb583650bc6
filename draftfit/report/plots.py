"""The report's figures, built with matplotlib's object API (``Figure`` on the Agg/SVG canvases, never
pyplot), so building them neither needs a display nor changes the backend of a notebook that calls
them. Each function takes a loaded :class:`~draftfit.results.Results` and returns a ``Figure`` (or
``None`` when the run has nothing to draw); :func:`svg_data_uri` turns one into the inline image the
report embeds. Every figure says in its top-right corner whether it shows *predicted*, *measured*
or *bound* values, and every axis carries its unit.
"""

from __future__ import annotations

import base64
import io
import math
import re
from collections.abc import Iterable
from typing import Any

from draftfit import explore
from draftfit.results import Results

GIB = 1024**3
KIND_COLORS = {"predicted": "#1f5fa8", "measured": "#1a7f37", "bound": "#9a6700"}
STYLE = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "path",  # glyphs as paths: the image looks the same without the fonts installed
    "svg.hashsalt": "draftfit",  # stable element ids: the same results give the same file
}
MARKERS = "osD^vP*Xh<>p"


def _mpl():
    import matplotlib

    return matplotlib


def _figure(width: float = 5.2, height: float = 3.0):
    from matplotlib.figure import Figure

    with _mpl().rc_context(STYLE):
        return Figure(figsize=(width, height), layout="constrained")


def _axes(fig, title: str, kind: str):
    with _mpl().rc_context(STYLE):
        ax = fig.add_subplot()
        ax.set_title(title, loc="left")
        ax.set_title(kind, loc="right", color=KIND_COLORS.get(kind.split()[0], "#444"), fontweight="bold")
    return ax


def _legend(fig, ax, ncol: int | None = None) -> None:
    """The legend below the axes; the figure grows by its rows, so the plot area keeps its size."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    ncol = ncol or min(len(labels), 2)
    rows = math.ceil(len(labels) / ncol)
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, height + 0.2 * rows + 0.1)
    with _mpl().rc_context(STYLE):
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False)


def colors(results: Results) -> dict[str, Any]:
    """One colour per candidate, the same in every figure (in candidate-file order)."""
    from matplotlib import colormaps

    names = [c["name"] for c in results.candidates] + [c["candidate"] for c in results.configs]
    unique = list(dict.fromkeys(names))
    cmap = colormaps["tab10" if len(unique) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(unique)}


def series_styles(results: Results, configs: list[tuple[str, str]]) -> dict[str, tuple[Any, str]]:
    """(colour, marker) per config label for ``configs`` = [(label, candidate), ...]: the candidate's
    colour and marker while each candidate appears once, else one colour and marker per config."""
    candidates = [cand for _, cand in configs]
    if len(set(candidates)) == len(candidates):
        palette = colors(results)
        return {label: (palette.get(cand), _marker(results, cand)) for label, cand in configs}
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(configs) <= 10 else "tab20"]
    return {label: (cmap(i % cmap.N), MARKERS[i % len(MARKERS)]) for i, (label, _) in enumerate(configs)}


def _marker(results: Results, name: str) -> str:
    names = list(colors(results))
    return MARKERS[names.index(name) % len(MARKERS)] if name in names else "o"


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) if explore.is_finite(v) else math.nan for v in values]


# ---------------------------------------------------------------------------------------------
# figures


def al_vs_k_figure(results: Results):
    """Predicted mean acceptance length against k per candidate: 95% bootstrap CI as error bars, the
    top-K bound (where acceptance is not exact) as a band, and k+1 (every draft accepted) dashed."""
    rows = explore.al_vs_k(results)
    if not rows:
        return None
    fig = _figure()
    ax = _axes(fig, "Mean acceptance length vs k", "predicted")
    palette = colors(results)
    ks_all = sorted({r["k"] for r in rows})
    with _mpl().rc_context(STYLE):
        ax.plot(ks_all, [k + 1 for k in ks_all], ls=":", color="#888", lw=1, label="k+1 (every draft accepted)")
        bound_labelled = False
        for name in explore.candidates(results):
            own = [r for r in rows if r["candidate"] == name]
            ks = [r["k"] for r in own]
            al = _finite(r["al"] for r in own)
            lo = _finite(r["al_ci_low"] for r in own)
            hi = _finite(r["al_ci_high"] for r in own)
            yerr = [[max(0.0, a - b) if not math.isnan(b) else 0.0 for a, b in zip(al, lo, strict=True)],
                    [max(0.0, b - a) if not math.isnan(b) else 0.0 for a, b in zip(al, hi, strict=True)]]
            ax.errorbar(ks, al, yerr=yerr, color=palette[name], marker=_marker(results, name), ms=4, lw=1.4, capsize=3, label=name)
            if not all(r["exact"] for r in own):
                blo = _finite(r["al_bound_low"] for r in own)
                bhi = _finite(r["al_bound_high"] for r in own)
                if any(b - a > 1e-9 for a, b in zip(blo, bhi, strict=True)):
                    ax.fill_between(ks, blo, bhi, color=palette[name], alpha=0.15, lw=0,
                                    label=None if bound_labelled else "top-K bound (band)")
                    bound_labelled = True
        ax.set_xlabel("k (speculative tokens per step)")
        ax.set_ylabel("mean acceptance length (tokens/step)")
        ax.set_xticks(ks_all)
        ax.set_ylim(bottom=0.9)
    _legend(fig, ax)
    return fig


def per_position_figure(results: Results, which: str | Iterable[str] | None = None, *, conditional: bool = False):
    """Predicted acceptance at each draft position for the chosen configs (default: each candidate's
    largest k): the marginal rate (vLLM's per-position rate) or the conditional one."""
    rows = explore.per_position(results, which)
    if not rows:
        return None
    key = "conditional" if conditional else "marginal"
    title = "Conditional acceptance by draft position" if conditional else "Acceptance by draft position (marginal)"
    fig = _figure()
    ax = _axes(fig, title, "predicted")
    styles = series_styles(results, list(dict.fromkeys((r["config"], r["candidate"]) for r in rows)))
    with _mpl().rc_context(STYLE):
        for label, (color, marker) in styles.items():
            own = [r for r in rows if r["config"] == label]
            ax.plot([r["position"] for r in own], _finite(r[key] for r in own), color=color, marker=marker, ms=4, lw=1.4, label=label)
        ax.set_xlabel("draft position (1 = first drafted token)")
        ax.set_ylabel("P(accepted | previous accepted)" if conditional else "P(first i drafts accepted)")
        ax.set_ylim(-0.03, 1.05)
        ax.set_xticks(sorted({r["position"] for r in rows}))
    _legend(fig, ax)
    return fig


def speedup_figure(results: Results, which: str | Iterable[str] | None = None):
    """Predicted speedup against concurrency for the chosen configs (default: each candidate's
    best-ranked k), the CI as a band, and the break-even line (1×: no speculation)."""
    rows = explore.speedup_vs_concurrency(results, which)
    if not rows:
        return None
    rec = results.recommendation or {}
    recommended = f"{rec.get('candidate')} k={rec.get('k')}" if rec.get("candidate") else None
    fig = _figure(height=3.2)
    ax = _axes(fig, "Speedup vs concurrency", "predicted")
    styles = series_styles(results, list(dict.fromkeys((r["config"], r["candidate"]) for r in rows)))
    levels = sorted({r["concurrency"] for r in rows})
    with _mpl().rc_context(STYLE):
        ax.axhline(1.0, color="#222", ls="--", lw=1.1, label="break-even (no speculation = 1×)")
        for label, (color, marker) in styles.items():
            own = sorted((r for r in rows if r["config"] == label), key=lambda r: r["concurrency"])
            x = [r["concurrency"] for r in own]
            best = label == recommended
            ax.plot(x, _finite(r["speedup"] for r in own), color=color, marker=marker, ms=4,
                    lw=2.6 if best else 1.4, label=f"{label} (recommended)" if best else label)
            ax.fill_between(x, _finite(r["speedup_low"] for r in own), _finite(r["speedup_high"] for r in own),
                            color=color, alpha=0.12, lw=0)
        if len(levels) > 1 and levels[0] > 0:
            ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.set_xticklabels([str(level) for level in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("speedup vs no speculation (×)")
        ax.set_ylim(bottom=0)
    _legend(fig, ax)
    return fig


def _vram_by_candidate(results: Results) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for c in explore.best_per_candidate(results):
        if c.get("vram"):
            out.append((c["candidate"], c["vram"]))
    return out


def vram_stack_figure(results: Results):
    """The vLLM memory budget per GPU without and with each model draft: weights and the KV-cache
    pool each model gets (vLLM gives every token slot both models' KV)."""
    rows = _vram_by_candidate(results)
    if not rows:
        return None
    first = rows[0][1]

    def pool(v: dict, with_draft: bool) -> tuple[float, float]:
        length = v["max_model_len"]
        requests = v["capacity_tokens_with_draft" if with_draft else "capacity_tokens_baseline"] / length
        # results written before sliding windows were modelled size a request by its tokens alone
        target, draft = (v.get(f"kv_{who}_bytes_per_request", v[f"kv_{who}_bytes_per_token"] * length) for who in ("target", "draft"))
        return requests * target, requests * draft * with_draft

    bars = [("no speculation", first["target_weight_bytes"], 0.0, *pool(first, False))]
    for name, v in rows:
        bars.append((name, v["target_weight_bytes"], v["draft_weight_bytes"], *pool(v, True)))
    fig = _figure(height=1.2 + 0.4 * len(bars))
    ax = _axes(fig, "Memory budget per GPU", "predicted")
    parts = (("target weights", "#4c72b0"), ("draft weights", "#dd8452"), ("target KV pool", "#a6c8ec"), ("draft KV pool", "#f6c28b"))
    with _mpl().rc_context(STYLE):
        y = list(range(len(bars)))[::-1]
        left = [0.0] * len(bars)
        for j, (label, color) in enumerate(parts):
            widths = [b[j + 1] / GIB for b in bars]
            ax.barh(y, widths, left=left, color=color, edgecolor="white", lw=0.5, height=0.62, label=label)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        budget = first["budget_bytes"] / GIB
        ax.axvline(budget, color="#222", ls="--", lw=1, label=f"budget {budget:.1f} GiB")
        ax.set_yticks(y)
        ax.set_yticklabels([b[0] for b in bars])
        ax.set_xlabel(f"GiB per GPU ({first['gpu_memory_utilization']:g} × {first['gpu']})")
        ax.grid(axis="y", visible=False)
    _legend(fig, ax)
    return fig


def extra_vram_figure(results: Results):
    """What each model draft adds per GPU at the configured load: its weights plus its KV cache for
    ``concurrency`` sequences of ``tokens_per_seq`` tokens."""
    rows = _vram_by_candidate(results)
    if not rows:
        return None
    fig = _figure(height=1.1 + 0.4 * len(rows))
    ax = _axes(fig, "Extra memory the draft takes", "predicted")
    with _mpl().rc_context(STYLE):
        y = list(range(len(rows)))[::-1]
        weights = [v["draft_weight_bytes"] / GIB for _, v in rows]
        kv = [v["draft_kv_bytes_at_load"] / GIB for _, v in rows]
        ax.barh(y, weights, color="#dd8452", height=0.62, label="draft weights")
        ax.barh(y, kv, left=weights, color="#f6c28b", height=0.62, label="draft KV at full load")
        ax.set_yticks(y)
        ax.set_yticklabels([name for name, _ in rows])
        v0 = rows[0][1]
        ax.set_xlabel(f"GiB per GPU (KV for {v0['concurrency']} sequences × {v0['tokens_per_seq']} tokens)")
        ax.grid(axis="y", visible=False)
    _legend(fig, ax)
    return fig


def pareto_figure(results: Results):
    """Predicted speedup at the primary concurrency against extra VRAM for every config that fits;
    the Pareto front (nothing both faster and cheaper) is outlined and joined."""
    primary = explore.primary_concurrency(results)
    points = []
    for c in results.configs:
        level = explore.level_of(c, primary)
        if not c.get("fits", True) or level is None or not explore.is_finite(level.get("speedup_predicted")):
            continue
        points.append((c, float(c.get("extra_vram_gib") or 0.0), float(level["speedup_predicted"])))
    if not points:
        return None
    rec = results.recommendation or {}
    fig = _figure(height=3.2)
    ax = _axes(fig, f"Speedup at concurrency {primary} vs extra VRAM", "predicted")
    palette = colors(results)
    points = _dodge_zero(points, explore.candidates(results))
    with _mpl().rc_context(STYLE):
        ax.axhline(1.0, color="#222", ls="--", lw=1.0, label="break-even (1×)")
        for name in explore.candidates(results):
            own = [p for p in points if p[0]["candidate"] == name]
            if own:
                ax.scatter([p[1] for p in own], [p[2] for p in own], color=palette[name], marker=_marker(results, name),
                           s=26, alpha=0.85, label=name, zorder=3)
        front = sorted((p for p in points if p[0].get("pareto")), key=lambda p: p[1])
        if front:
            ax.plot([p[1] for p in front], [p[2] for p in front], color="#222", lw=1, drawstyle="steps-post", zorder=2)
            ax.scatter([p[1] for p in front], [p[2] for p in front], facecolors="none", edgecolors="#222", s=110,
                       lw=1.2, label="Pareto front", zorder=4)
        for c, x, y in points:
            if rec.get("candidate") == c["candidate"] and rec.get("k") == c["k"]:
                ax.scatter([x], [y], marker="*", s=260, facecolors="none", edgecolors="#d62728", lw=1.5,
                           label="recommended", zorder=5)
        ax.set_xlabel("extra VRAM per GPU (GiB)")
        ax.set_ylabel(f"speedup at concurrency {primary} (×)")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=min(p[1] for p in points) - 0.02 * max(0.1, max(p[1] for p in points)))
    _legend(fig, ax)
    return fig


def _dodge_zero(points: list[tuple[dict, float, float]], order: list[str]) -> list[tuple[dict, float, float]]:
    """Draw the configurations at 0 GiB (model-free methods) a little apart, one column per candidate
    in legend order, so their markers do not hide each other; the caption says so."""
    zero = [name for name in order if any(p[0]["candidate"] == name and p[1] == 0.0 for p in points)]
    if len(zero) < 2:
        return points
    span = max((p[1] for p in points), default=0.0) or 1.0
    step = 0.025 * span
    shift = {name: (i - (len(zero) - 1) / 2) * step for i, name in enumerate(zero)}
    return [(c, shift[c["candidate"]] if x == 0.0 else x, y) for c, x, y in points]


def measured_figure(results: Results, what: str = "speedup"):
    """Measured against predicted (``what``: ``speedup`` or ``al``) for every config and concurrency
    ``draftfit verify`` ran; the diagonal is a perfect prediction."""
    key_m, key_p = ("speedup_measured", "speedup_predicted") if what == "speedup" else ("al_measured", "al_predicted")
    rows = [r for r in explore.measured_vs_predicted(results, latest_only=True)
            if not r["baseline"] and explore.is_finite(r[key_m]) and explore.is_finite(r[key_p])]
    if not rows:
        return None
    fig = _figure(height=3.2)
    title = "Speedup: measured vs predicted" if what == "speedup" else "Acceptance length: measured vs predicted"
    ax = _axes(fig, title, "measured")
    styles = series_styles(results, list(dict.fromkeys((r["config"], r["candidate"]) for r in rows)))
    with _mpl().rc_context(STYLE):
        values = [r[key_m] for r in rows] + [r[key_p] for r in rows]
        lo, hi = min(values + [1.0]), max(values + [1.0])
        pad = 0.08 * (hi - lo or 1.0)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="#888", ls=":", lw=1, label="measured = predicted")
        for label, (color, marker) in styles.items():
            own = [r for r in rows if r["config"] == label]
            ax.scatter([r[key_p] for r in own], [r[key_m] for r in own], color=color, marker=marker, s=30, label=label, zorder=3)
        unit = "×" if what == "speedup" else "tokens/step"
        ax.set_xlabel(f"predicted ({unit})")
        ax.set_ylabel(f"measured ({unit})")
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
    _legend(fig, ax)
    return fig


def measured_positions_figure(results: Results):
    """Per-position acceptance measured by ``draftfit verify`` (vLLM's counters; markers, at the lowest
    concurrency measured) against the prediction (lines), for every measured config."""
    rows = [r for r in explore.measured_vs_predicted(results, latest_only=True) if not r["baseline"] and r["per_position_measured"]]
    if not rows:
        return None
    first: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["concurrency"] or 0):
        first.setdefault(r["config"], r)
    fig = _figure()
    ax = _axes(fig, "Acceptance by draft position", "measured")
    styles = series_styles(results, [(label, r["candidate"]) for label, r in first.items()])
    with _mpl().rc_context(STYLE):
        for label, r in first.items():
            color, marker = styles[label]
            pred = _finite(r["per_position_predicted"])
            meas = _finite(r["per_position_measured"])
            if pred:
                ax.plot(range(1, len(pred) + 1), pred, color=color, lw=1.2, ls="--", label=f"{label} predicted")
            ax.plot(range(1, len(meas) + 1), meas, color=color, marker=marker, ms=5, lw=0,
                    label=f"{label} measured @{r['concurrency']}")
        ax.set_xlabel("draft position (1 = first drafted token)")
        ax.set_ylabel("P(first i drafts accepted)")
        ax.set_ylim(-0.03, 1.05)
        width = max(max(len(r["per_position_measured"]), len(r["per_position_predicted"])) for r in first.values())
        ax.set_xticks(range(1, width + 1))
    _legend(fig, ax)
    return fig


# ---------------------------------------------------------------------------------------------
# output


def svg(fig) -> str:
    """The figure as an SVG document: deterministic (no date, stable ids) and without the DTD and
    metadata blocks, so the only URLs left are the XML namespace names."""
    buffer = io.StringIO()
    with _mpl().rc_context(STYLE):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", buffer.getvalue(), flags=re.S)
    return re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.S)


def svg_data_uri(fig) -> str:
    """The figure as a ``data:image/svg+xml;base64,...`` URI for an ``<img>``: the page needs no
    other file, and an image loaded this way can neither run script nor fetch anything."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg(fig).encode("utf-8")).decode("ascii")


__all__ = [
    "al_vs_k_figure",
    "colors",
    "extra_vram_figure",
    "measured_figure",
    "measured_positions_figure",
    "pareto_figure",
    "per_position_figure",
    "series_styles",
    "speedup_figure",
    "svg",
    "svg_data_uri",
    "vram_stack_figure",
]

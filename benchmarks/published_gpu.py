"""Published GPU measurements of vLLM speculative decoding, predicted against measured.

    python benchmarks/published_gpu.py            # the table, the errors, the targets
    python benchmarks/published_gpu.py --fit      # refit the constants on the `fit` points and show them
    python benchmarks/published_gpu.py --fit --write   # … and rewrite draftfit/data/gpu_calibration.yaml

Every measured number is *published* (benchmarks/published/, each with its source and the figures
quoted); every other number is *predicted* by draftfit's step model (draftfit.costmodel.GpuStepTime
with the constants of draftfit/data/gpu_calibration.yaml) and VRAM model (draftfit.vram). The
constants are fitted on the points marked `fit`; the errors that count are those on the `holdout`
points, printed apart. Nothing is timed here, so the machine's load does not matter.

Exit status: 0 when every target of the issue is met, 1 otherwise (each unmet one is printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from draftfit.calibration import CALIBRATION_FILE, GpuConstants, gpu_constants  # noqa: E402
from draftfit.costmodel import GpuStepTime, ModelDraftCost, predict_costs  # noqa: E402
from draftfit.hardware import ModelShape, load_catalog  # noqa: E402
from draftfit.methods import get_method  # noqa: E402
from draftfit.vram import vram_report  # noqa: E402

DATA = ROOT / "benchmarks" / "published"
# The constants the fit moves, with their bounds; the rest stay as the data file says.
FITTED = {
    "target_pass_s": (0.0, 0.01),
    "draft_pass_s.eagle": (0.0, 0.005),
    "draft_pass_s.eagle3": (0.0, 0.005),
    "spec_step_s": (0.0, 0.005),
    "memory_efficiency": (0.3, 1.0),
}
TARGETS = {"median_abs": 0.10, "max_abs": 0.25, "kv_abs": 0.15, "points": 15, "sources": 3, "gpus": 2}


@dataclass
class Point:
    series: str
    source: str
    gpu: str
    tp: int
    concurrency: int
    method: str | None
    k: int | None
    al: float
    tpot_ms: float | None  # published (None where the source gives only a speedup)
    baseline_tpot_ms: float | None  # published
    role: str
    context_len: float
    target: ModelShape
    target_dtype: str
    draft: ModelShape | None
    published_speedup: float | None = None  # where the source gives the ratio (wall time) itself

    @property
    def measured_speedup(self) -> float:
        if self.published_speedup is not None:
            return self.published_speedup
        return self.baseline_tpot_ms / self.tpot_ms


def _model(models: dict, name: str, method: str | None = None) -> tuple[ModelShape, str]:
    entry = models[name]
    config = json.loads((DATA / entry["config"]).read_text())
    shape = get_method(method).draft_shape(config, name) if method else ModelShape.from_config(config, name=name)
    return shape, entry.get("weight_dtype", "bf16")


def load_points() -> tuple[list[Point], dict]:
    data = yaml.safe_load((DATA / "speed.yaml").read_text())
    points = []
    for s in data["series"]:
        target, dtype = _model(data["models"], s["target"])
        draft, _ = _model(data["models"], s["draft"], s["method"])
        base = s["baseline"].get("tpot_ms")
        common = dict(series=s["id"], source=s["source"], gpu=s["gpu"], tp=s["tensor_parallel_size"],
                      concurrency=s["concurrency"], context_len=float(s["context_len"]), target=target,
                      target_dtype=dtype, baseline_tpot_ms=None if base is None else float(base))
        if base is not None:
            points.append(Point(**common, method=None, k=None, al=1.0, tpot_ms=float(base),
                                role=s["baseline"]["role"], draft=None))
        for p in s["points"]:
            points.append(Point(**common, method=s["method"], k=int(p["k"]), al=float(p["al"]),
                                tpot_ms=float(p["tpot_ms"]) if "tpot_ms" in p else None, role=p["role"], draft=draft,
                                published_speedup=p.get("speedup")))
    return points, data["sources"]


def predict(point: Point, constants: GpuConstants) -> tuple[float, float]:
    """Predicted (TPOT ms, speedup) of a point: the baseline's when it has no draft."""
    gpu = load_catalog().get(point.gpu)
    target = GpuStepTime(gpu, point.target, constants, point.tp, point.target_dtype)
    if point.draft is None:
        t = float(target.step_time(point.concurrency, point.concurrency * point.context_len, point.concurrency))
        return 1000 * t, 1.0
    draft = ModelDraftCost(GpuStepTime(gpu, point.draft, constants, point.tp, "bf16", role=point.method))
    pred = predict_costs(target, draft, [point.k], [point.al], concurrency=[point.concurrency],
                         context_len=point.context_len)
    return 1000 * float(pred.itl_spec_s[0, 0]), float(pred.speedup[0, 0])


def _with(constants: GpuConstants, values: dict[str, float]) -> GpuConstants:
    """``constants`` with ``values`` changed; ``draft_pass_s.<method>`` names one proposer's pass."""
    drafts = {name.split(".", 1)[1]: v for name, v in values.items() if name.startswith("draft_pass_s.")}
    plain = {name: v for name, v in values.items() if not name.startswith("draft_pass_s.")}
    return constants.replace(**plain, **({"draft_pass_s": {**constants.draft_pass_s, **drafts}} if drafts else {}))


def fit(points: list[Point], base: GpuConstants) -> dict[str, float]:
    """Least squares on the relative TPOT error of the `fit` points (baselines included)."""
    from scipy.optimize import least_squares

    names = list(FITTED)
    fit_points = [p for p in points if p.role == "fit" and p.tpot_ms is not None]

    def residuals(x):
        c = _with(base, dict(zip(names, x, strict=True)))
        return [predict(p, c)[0] / p.tpot_ms - 1.0 for p in fit_points]

    start = [getattr(base, n) if "." not in n else base.pass_fixed_s(n.split(".")[1]) for n in names]
    lo, hi = zip(*FITTED.values(), strict=True)
    result = least_squares(residuals, np.clip(start, lo, hi), bounds=(lo, hi), x_scale="jac")
    return {n: float(round(v, 7 if n != "memory_efficiency" else 4)) for n, v in zip(names, result.x, strict=True)}


def write_calibration(values: dict[str, float], points: list[Point]) -> None:
    path = ROOT / "draftfit" / CALIBRATION_FILE
    text = path.read_text()
    header, _, _ = text.partition("default:\n")
    data = yaml.safe_load(text)
    used = sorted({f"{p.series} ({p.gpu})" for p in points if p.role == "fit"})
    note = (f"fitted by benchmarks/published_gpu.py --fit on the `fit` points of benchmarks/published/speed.yaml: "
            f"{', '.join(used)}")
    logs = [log["id"] for log in kv_logs() if log["role"] == "fit"]
    memory_note = (f"fitted by benchmarks/published_gpu.py --fit on the `fit` start-up logs of "
                   f"benchmarks/published/kv_logs.yaml ({', '.join(logs)}): Δ available KV ÷ Δ utilization ÷ catalog memory")
    for name, value in values.items():
        if name == "usable_memory_fraction":
            data["default"][name] = {"value": value, "source": memory_note}
            continue
        if name.startswith("draft_pass_s."):
            data["default"]["draft_pass_s"][name.split(".", 1)[1]] = {"value": value, "source": note}
        else:
            data["default"][name] = {"value": value, "source": note}
    heads = {m: values[f"draft_pass_s.{m}"] for m in ("eagle", "eagle3")}
    slowest = max(heads, key=heads.get)
    data["default"]["draft_pass_s"]["default"] = {
        "value": heads[slowest],
        "source": f"no published point for the other methods (draft_model, mtp): the costlier of the fitted head "
                  f"passes ({slowest}), so that their speedups are not overstated"}
    path.write_text(header + yaml.safe_dump({"default": data["default"], "gpus": data.get("gpus") or {}},
                                            sort_keys=False, allow_unicode=True, width=200))


def kv_logs(section: str = "logs") -> list[dict]:
    """One section of benchmarks/published/kv_logs.yaml: the start-up logs, the refusals (`requests`)
    or the weights' loads (`weights`)."""
    return yaml.safe_load((DATA / "kv_logs.yaml").read_text()).get(section) or []


def log_shape(log: dict) -> ModelShape:
    """The shape of the model a published log served (its typed config under benchmarks/published)."""
    return ModelShape.from_config(json.loads((DATA / log["model"]["config"]).read_text()), name=log["id"])


def fit_usable_memory(logs: list[dict]) -> float:
    """The memory the driver reports ÷ the catalog's, from `fit` logs of one setup at two
    utilizations: vLLM's budget is utilization × that memory, the rest of the sum is the same."""
    groups: dict[tuple, list[dict]] = {}
    for log in logs:
        if log["role"] == "fit":
            groups.setdefault((log["model"]["config"], log["gpu"], log["tensor_parallel_size"]), []).append(log)
    fractions = []
    for (_, gpu, _), group in groups.items():
        if len(group) >= 2:
            a, b = sorted(group, key=lambda g: g["gpu_memory_utilization"])[:2]
            usable_gib = (b["available_kv_gib"] - a["available_kv_gib"]) / (b["gpu_memory_utilization"] - a["gpu_memory_utilization"])
            fractions.append(usable_gib / load_catalog().get(gpu).memory_gib)
    if not fractions:
        raise SystemExit("no `fit` logs of one setup at two utilizations in kv_logs.yaml")
    return float(round(statistics.fmean(fractions), 4))


def kv_checks(constants: GpuConstants | None = None) -> list[dict]:
    from draftfit.hardware import Hardware

    out = []
    for log in kv_logs():
        shape = log_shape(log)
        hw = Hardware(load_catalog().get(log["gpu"]), log["tensor_parallel_size"], log["tensor_parallel_size"])
        c = constants if constants is not None else gpu_constants(log["gpu"])
        report = vram_report(hw, shape, None, target_dtype=log["model"]["weight_dtype"],
                             kv_cache_dtype=log["kv_cache_dtype"], gpu_memory_utilization=log["gpu_memory_utilization"],
                             max_model_len=1, reserved_bytes=None, constants=c, vllm_version=log["vllm"],
                             max_num_batched_tokens=log.get("max_num_batched_tokens"), max_num_seqs=log.get("max_num_seqs"))
        predicted = report.capacity_tokens_baseline
        out.append({"id": log["id"], "role": log["role"], "predicted_tokens": predicted,
                    "published_tokens": log["kv_capacity_tokens"], "error": predicted / log["kv_capacity_tokens"] - 1.0,
                    "caveat": log.get("caveat", ""), "url": log["url"]})
    return out


def request_checks() -> list[dict]:
    """KV one request at max_model_len needs, predicted, against what vLLM's published start-up
    refusals say it needs (independent of weights and the reserve)."""
    from draftfit.hardware import Hardware

    out = []
    for log in kv_logs("requests"):
        shape = log_shape(log)
        hw = Hardware(load_catalog().get(log["gpu"]), log["tensor_parallel_size"], log["tensor_parallel_size"])
        report = vram_report(hw, shape, None, kv_cache_dtype=log["kv_cache_dtype"], max_model_len=log["max_model_len"],
                             max_num_batched_tokens=log["max_num_batched_tokens"], vllm_version=log["vllm"])
        predicted = report.kv_target_bytes_per_request / 2**30
        out.append({"id": log["id"], "predicted_gib": predicted, "published_gib": log["needed_gib"],
                    "error": predicted / log["needed_gib"] - 1.0, "url": log["url"]})
    return out


def weight_checks() -> list[dict]:
    """Weights on one GPU, predicted (draftfit.vram.weight_bytes_per_gpu, MXFP4 experts laid out by the
    kernel the log names), against what vLLM's published start-up logs say loading took."""
    from draftfit.vram import mxfp4_layout, weight_bytes_per_gpu

    out = []
    for log in kv_logs("weights"):
        shape = log_shape(log)
        gpu = load_catalog().get(log["gpu"])
        layout = mxfp4_layout(gpu.arch, log["vllm"], backend=log.get("backend"))
        predicted = weight_bytes_per_gpu(shape, log["model"]["weight_dtype"], log["tensor_parallel_size"], "bf16",
                                         layout) / 2**30
        out.append({"id": log["id"], "predicted_gib": predicted, "published_gib": log["loaded_gib"],
                    "error": predicted / log["loaded_gib"] - 1.0, "url": log["url"]})
    return out


def reserve_gaps() -> list[dict]:
    """What each published start-up left for the KV cache against what draftfit predicts it leaves
    (the budget less the weights and the non-KV reserve), with vLLM's default number of sequences on
    the GPU: a positive gap is memory vLLM kept outside the KV cache that draftfit does not reserve."""
    from draftfit.hardware import Hardware
    from draftfit.vram import mxfp4_layout, serve_defaults

    out = []
    for log in [*kv_logs(), *kv_logs("requests"), *kv_logs("weights")]:
        if "available_kv_gib" not in log:
            continue
        shape = log_shape(log)
        gpu = load_catalog().get(log["gpu"])
        tp = log["tensor_parallel_size"]
        report = vram_report(Hardware(gpu, tp, tp), shape, None, target_dtype=log["model"]["weight_dtype"],
                             kv_cache_dtype=log["kv_cache_dtype"], gpu_memory_utilization=log["gpu_memory_utilization"],
                             max_model_len=1, reserved_bytes=None, constants=gpu_constants(log["gpu"]),
                             vllm_version=log["vllm"], max_num_batched_tokens=log.get("max_num_batched_tokens"),
                             mxfp4=mxfp4_layout(gpu.arch, log["vllm"], backend=log.get("backend")))
        available = (report.budget_bytes - report.target_weight_bytes - report.reserved_bytes) / 2**30
        out.append({"id": log["id"], "gpu": log["gpu"], "max_num_seqs": serve_defaults(gpu.name, gpu.memory_bytes)[1],
                    "predicted_gib": available, "published_gib": log["available_kv_gib"],
                    "gap_gib": available - log["available_kv_gib"]})
    return out


def _gib_checks(title: str, rows: list[dict], what: str, unmet: list[str]) -> None:
    """Print published → predicted GiB figures; each off by more than the KV target is unmet."""
    print("\n" + title)
    for row in rows:
        print(f"  {row['id']:36} {row['published_gib']:.2f} GiB → {row['predicted_gib']:.3f} GiB "
              f"({100 * row['error']:+.1f}%)  {row['url']}")
        if abs(row["error"]) > TARGETS["kv_abs"]:
            unmet.append(f"{what} of {row['id']} off by more than {100 * TARGETS['kv_abs']:.0f}%")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the constants on the `fit` points")
    parser.add_argument("--write", action="store_true", help="with --fit: rewrite the calibration file")
    args = parser.parse_args(argv)

    points, sources = load_points()
    constants = gpu_constants("H100 SXM")
    if args.fit:
        values = fit(points, constants)
        values["usable_memory_fraction"] = fit_usable_memory(kv_logs())
        print("fitted (on the `fit` points):", ", ".join(f"{k}={v:g}" for k, v in values.items()))
        if args.write:
            write_calibration(values, points)
            print(f"wrote draftfit/{CALIBRATION_FILE}")
        constants = _with(constants, values)

    print(f"\n{'series':30} {'k':>2} {'role':8} {'AL':>5} {'TPOT pub':>9} {'TPOT pred':>9} "
          f"{'speedup pub':>11} {'pred':>6} {'error':>7}")
    errors = {"fit": [], "holdout": []}
    by_series: dict[str, list[tuple[int, float, float]]] = {}
    for p in points:
        c = _with(gpu_constants(p.gpu), {}) if not args.fit else constants
        tpot, speedup = predict(p, c)
        err = (speedup / p.measured_speedup - 1.0) if p.k else (tpot / p.tpot_ms - 1.0)
        errors[p.role].append((p, err))
        if p.k:
            by_series.setdefault(p.series, []).append((p.k, p.measured_speedup, speedup))
        what = f"{p.measured_speedup:>10.3f}× {speedup:>5.3f}×" if p.k else f"{'(baseline)':>11} {'':>6}"
        published = f"{p.tpot_ms:>8.2f}m" if p.tpot_ms is not None else f"{'-':>9}"
        print(f"{p.series:30} {p.k or '-':>2} {p.role:8} {p.al:>5.2f} {published} {tpot:>8.2f}m {what} {100 * err:>+6.1f}%")
    print("  (error: predicted/published − 1 of the speedup; of the TPOT for baselines. pub = published, pred = predicted)")

    unmet = []
    for role in ("fit", "holdout"):
        errs = [e for _, e in errors[role]]
        if errs:
            abs_errs = [abs(e) for e in errs]
            print(f"\n{role:8} points {len(errs):2}: median |error| {100 * statistics.median(abs_errs):.1f}%, "
                  f"max {100 * max(abs_errs):.1f}%, signed mean {100 * statistics.fmean(errs):+.1f}%, "
                  f"{sum(e > 0 for e in errs)} high / {sum(e < 0 for e in errs)} low")
    hold = [e for _, e in errors["holdout"]]
    if statistics.median(abs(e) for e in hold) > TARGETS["median_abs"]:
        unmet.append(f"median |error| on holdout points > {100 * TARGETS['median_abs']:.0f}%")
    if max(abs(e) for e in hold) > TARGETS["max_abs"]:
        unmet.append(f"max |error| on holdout points > {100 * TARGETS['max_abs']:.0f}%")
    if not (any(e > 0 for e in hold) and any(e < 0 for e in hold)):
        unmet.append("holdout errors are all of one sign")

    print("\nbest k per series (published → predicted):")
    for series, rows in by_series.items():
        if len(rows) < 2:
            continue
        best_pub = max(rows, key=lambda r: r[1])
        best_pred = max(rows, key=lambda r: r[2])
        close = best_pub[2] >= 0.97 * best_pred[2]
        ok = best_pub[0] == best_pred[0] or close
        print(f"  {series:30} k={best_pub[0]} → k={best_pred[0]}"
              f"{'' if best_pub[0] == best_pred[0] else f' (published best predicted {best_pub[2]:.3f}× vs {best_pred[2]:.3f}×)'}"
              f"  {'ok' if ok else 'WRONG'}")
        if not ok:
            unmet.append(f"{series}: best k {best_pub[0]} predicted as {best_pred[0]}")

    print("\nKV capacity (published start-up log → predicted):")
    for kv in kv_checks(constants if args.fit else None):
        print(f"  {kv['id']:36} {kv['role']:8} {kv['published_tokens']:>10,} → {kv['predicted_tokens']:>10,} tokens "
              f"({100 * kv['error']:+.1f}%)  {kv['url']}" + (f"\n    caveat: {kv['caveat']}" if kv["caveat"] else ""))
        if kv["role"] == "holdout" and abs(kv["error"]) > TARGETS["kv_abs"]:
            unmet.append(f"KV capacity of {kv['id']} off by more than {100 * TARGETS['kv_abs']:.0f}%")

    _gib_checks("KV one request at max_model_len needs (published start-up refusal → predicted):", request_checks(),
                "KV one request", unmet)
    _gib_checks('Weights on one GPU (published "Model loading took" → predicted):', weight_checks(), "weights", unmet)

    print("\nMemory left for the KV cache (published start-up → predicted; gap: what vLLM kept beyond the reserve):")
    for g in reserve_gaps():
        print(f"  {g['id']:36} {g['gpu']:14} {g['max_num_seqs']:>5} seqs  {g['published_gib']:6.2f} GiB → "
              f"{g['predicted_gib']:6.2f} GiB  (gap {g['gap_gib']:+.2f} GiB)")
        published, predicted = g["published_gib"], g["predicted_gib"]
        if (published <= 0 < predicted) or (published > 0 and abs(predicted / published - 1.0) > TARGETS["kv_abs"]):
            unmet.append(f"memory left for the KV cache in {g['id']} off by more than {100 * TARGETS['kv_abs']:.0f}%")

    spec_points = [p for p in points if p.k]
    coverage = {
        "points": len(spec_points), "sources": len({p.source for p in points}), "gpus": len({p.gpu for p in points}),
        "concurrency > 1": any(p.concurrency > 1 for p in spec_points), "TP > 1": any(p.tp > 1 for p in spec_points)}
    print("\ncoverage:", ", ".join(f"{k}: {v}" for k, v in coverage.items()))
    for key in ("points", "sources", "gpus"):
        if coverage[key] < TARGETS[key]:
            unmet.append(f"fewer than {TARGETS[key]} {key} ({coverage[key]})")
    for key in ("concurrency > 1", "TP > 1"):
        if not coverage[key]:
            unmet.append(f"no published point with {key} and an acceptance length")
    print("sources:", ", ".join(f"{k} ({v['url']})" for k, v in sources.items()))
    if unmet:
        print("\ntargets not met:\n  " + "\n  ".join(unmet))
        return 1
    print("\nall targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())

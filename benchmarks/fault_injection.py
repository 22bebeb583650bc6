"""Interrupt `draftfit rank` at each stage, and `draftfit verify` after a group, and check that each resumes with the same results.

    python benchmarks/fault_injection.py [--cache DIR] [--seed-cache DIR] [--keep]

Runs one uninterrupted `rank` (the embedded SmolLM2, the test session's ranked-study settings: 6
prompts × 24 tokens, float32, concurrency 1,4,16, quick profile; prompt lookup and an early-exit
draft), then, for each case of tests/faultcases.py, a run with DRAFTFIT_FAULT=<stage>:<mode> and the
same run started again without it, and prints per case: the fault injected, whether the restart
completed, which stages it reused, the engines each run started, temporary files or engine processes
left behind by the fault, and whether what it decided (configs, ranking, recommendation, deploy
command — not timings, ids or timestamps) is identical to the uninterrupted run's. Then `verify`
(ngram k=2 and k=1 at concurrency 1, 4 requests, two groups): an uninterrupted run, and one
interrupted (raise, kill) after the first group was measured and run again: it must keep that group,
measure only the rest, and count what the uninterrupted run counted (vLLM's counters; latencies are
new measurements). Starts real vLLM engines, one at a time (several minutes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import faultcases  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, help="Cache for the runs (default: a new temporary directory).")
    parser.add_argument("--seed-cache", type=Path, default=Path(os.environ["DRAFTFIT_CACHE"]) if os.environ.get("DRAFTFIT_CACHE") else None,
                        help="A cache whose converted GGUF is linked in (default: $DRAFTFIT_CACHE).")
    parser.add_argument("--keep", action="store_true", help="Keep the work directory.")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="draftfit-faults-"))
    cache = faultcases.fresh_cache(args.cache or work / "cache", args.seed_cache)
    candidates = faultcases.write_candidates(work / "candidates")
    reports = work / "reports"
    started = time.perf_counter()
    print(f"clean run (cache {cache}) ...", flush=True)
    clean = faultcases.clean_run(candidates, reports, cache)
    if not clean.ok:
        print(f"the clean run failed: {clean.ended}")
        return 1
    reference = faultcases.decisions(clean.data)
    rows = []
    for case in faultcases.CASES:
        print(f"case {case.id} ...", flush=True)
        t0 = time.perf_counter()
        result = faultcases.run_case(case, candidates, reports, cache)
        injected = not result.faulted.ok and ("fault injected" in result.faulted.ended or "killed" in result.faulted.ended)
        same = result.restart.ok and faultcases.decisions(result.restart.data) == reference
        rows.append((case.stage, case.mode, "yes" if injected else "NO", "yes" if result.restart.ok else "NO",
                     ", ".join(result.reused) or "—", f"{_count(result.faulted)} / {_count(result.restart)}", "yes" if same else "NO",
                     ", ".join(result.leftovers + [f"engine pid {p}" for p in result.orphans] + result.shm_leaked) or "none",
                     f"{time.perf_counter() - t0:.0f}"))
    ranked = reports / "clean" / "results.json"
    print("verify, uninterrupted ...", flush=True)
    verify_clean = faultcases.verify_subprocess(_copy(ranked, work / "verify-clean"), cache)
    if not verify_clean.ok:
        print(f"the uninterrupted verify failed: {verify_clean.ended}")
        return 1
    verify_reference = faultcases.verify_decisions(verify_clean.data)
    for mode in faultcases.VERIFY_MODES:
        print(f"case verify-group:{mode} ...", flush=True)
        t0 = time.perf_counter()
        result = faultcases.run_verify_case(mode, ranked, work / f"verify-{mode}", cache)
        injected = not result.faulted.ok and ("fault injected" in result.faulted.ended or "killed" in result.faulted.ended)
        same = result.restart.ok and faultcases.verify_decisions(result.restart.data) == verify_reference
        rows.append(("verify-group (verify)", mode, "yes" if injected else "NO", "yes" if result.restart.ok else "NO",
                     "baseline" if result.baseline_kept and result.resumed else "—", "— / —", "yes" if same else "NO",
                     ", ".join([f"engine pid {p}" for p in result.orphans] + result.shm_leaked) or "none", f"{time.perf_counter() - t0:.0f}"))
    headers = ("stage", "mode", "fault injected", "completed after restart", "stages reused", "engines fault/restart", "identical to clean run",
               "left behind", "s")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    faults = sum(r[2] == "yes" for r in rows)
    completed = sum(r[3] == "yes" for r in rows)
    identical = sum(r[6] == "yes" for r in rows)
    print(f"\nfaults injected: {faults}/{len(rows)}; runs completed after restart: {completed}/{len(rows)}; "
          f"results identical to the clean run: {identical}/{len(rows)} ({time.perf_counter() - started:.0f} s in all)")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if faults == completed == identical == len(rows) else 1


def _copy(results: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(results, folder / "results.json")
    return folder / "results.json"


def _count(outcome: faultcases.Outcome) -> str:
    """Engines a run started: counted in this process; for a subprocess, "0" or "≥1" from its engine time."""
    if outcome.engines is not None:
        return str(len(outcome.engines))
    timings = ((outcome.data or {}).get("provenance") or {}).get("timings")
    return "?" if timings is None else ("≥1" if "engine_startup" in timings else "0")


if __name__ == "__main__":
    sys.exit(main())

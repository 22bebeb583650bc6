"""Predicted vs measured speedup at concurrency 1 on this machine, in repeated verify rounds.

    DRAFTFIT_CACHE=... .venv/bin/python benchmarks/concurrency1_speedup.py [--rounds 3] [--requests 8] [--out DIR]

1. `draftfit rank candidates/*.yaml` (the measured path: profiles and the served-step timing).
2. `draftfit verify` of 13 configurations spread over the demo grid at concurrency 1, `--rounds`
   times, each round a fresh copy of the results (baseline and configurations measured again).
3. Per configuration: the prediction (for the prompts verify sends), every round's measured speedup,
   their median and spread; over the configurations the signed mean error (target ±5%) and the
   acceptance-length error, which is part of it.

Everything printed is measured on this machine in this run; the rounds run one after the other
(the machine is shared and noisy: the spread says how much).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ["ngram-2-4:1", "ngram-2-4:3", "ngram-2-4:6", "ngram-1-2:2", "ngram-1-2:5", "ngram-5:2", "ngram-5:6",
           "self-draft:1", "self-draft:4", "early-exit-4:1", "early-exit-4:3", "early-exit-10:2", "early-exit-16:1"]
TARGET = 0.05


def draftfit(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "draftfit", *args], cwd=ROOT, check=True, env=os.environ.copy())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="c1-speedup-"))
    draftfit("rank", *sorted(glob.glob(str(ROOT / "candidates" / "*.yaml"))), "--reports-dir", str(out), "--run-id", "rank")
    rows: dict[tuple[str, int], dict] = {}
    for i in range(1, args.rounds + 1):
        copy = out / f"round{i}"
        shutil.copytree(out / "rank", copy)
        config_args = [a for c in CONFIGS for a in ("--config", c)]
        draftfit("verify", str(copy / "results.json"), *config_args, "--concurrency", "1",
                 "--requests", str(args.requests), "--no-resume")
        for e in json.loads((copy / "results.json").read_text())["measured"]:
            if e.get("candidate") and e.get("speedup_measured") is not None:
                row = rows.setdefault((e["candidate"], e["k"]), {"pred": e["speedup_predicted"], "al_pred": e["al_predicted"],
                                                                 "meas": [], "al": []})
                row["meas"].append(e["speedup_measured"])
                row["al"].append(e["al_measured"])
    errors, al_errors = [], []
    print(f"{'configuration':20} {'predicted':>9} {'measured per round':>26} {'median':>7} {'spread':>7} {'error':>7} {'AL err':>7}")
    for (name, k), row in sorted(rows.items()):
        median = statistics.median(row["meas"])
        errors.append(row["pred"] / median - 1)
        al_errors.append(row["al_pred"] / statistics.median(row["al"]) - 1)
        spread = (max(row["meas"]) - min(row["meas"])) / median
        print(f"{name + ' k=' + str(k):20} {row['pred']:9.3f} {' '.join(f'{x:.3f}' for x in row['meas']):>26} "
              f"{median:7.3f} {100 * spread:6.1f}% {100 * errors[-1]:+6.1f}% {100 * al_errors[-1]:+6.1f}%")
    mean = float(np.mean(errors))
    print(f"\n{len(errors)} configurations, {args.rounds} rounds: signed mean speedup error {100 * mean:+.1f}% "
          f"(target ±{100 * TARGET:.0f}%), mean |error| {100 * np.mean(np.abs(errors)):.1f}%, "
          f"max {100 * max(np.abs(errors)):.1f}%; signed mean AL error {100 * np.mean(al_errors):+.1f}%")
    return 0 if abs(mean) <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())

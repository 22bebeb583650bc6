"""Where `draftfit rank` spends its time on the demo: engine work vs draftfit's own processing.

Runs the whole pipeline on the demo candidates with fresh trajectory/score/profile caches (the
converted GGUF and derived drafts are reused: they are one-time materializations) and prints the
split. The target is draftfit's own processing at most 10% of the wall time.

    .venv/bin/python benchmarks/rank_split.py [--sample-size 64] [--max-tokens 128] [--quick]
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample-size", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="the quick profile plan")
    parser.add_argument("--candidates", default="candidates/*.yaml")
    args = parser.parse_args()

    from draftfit.paths import cache_dir

    shared = cache_dir()
    fresh = Path(tempfile.mkdtemp(prefix="draftfit-split-"))
    for reusable in ("gguf", "derived"):
        if (shared / reusable).is_dir():
            os.symlink(shared / reusable, fresh / reusable)
    os.environ["DRAFTFIT_CACHE"] = str(fresh)

    from draftfit.candidates import build_study, load_candidates
    from draftfit.pipeline import PROFILE_PLANS, RankRun

    candidates, from_files = load_candidates(sorted(glob.glob(args.candidates)))
    study = build_study(study_file=None, from_candidates=from_files,
                        overrides={"sample_size": args.sample_size, "max_tokens": args.max_tokens})
    run = RankRun(candidates, study, reports_root=fresh / "reports", run_id="split",
                  profile_plan=dict(PROFILE_PLANS["quick" if args.quick else "standard"]), progress=print)
    run.run()
    t = run.timings
    engine = sum(v for k, v in t.items() if k.startswith("engine_"))
    own = t["wall"] - engine
    print("\n== draftfit rank on the demo (measured, one run) ==")
    print(f"candidates {len(candidates)}, prompts {args.sample_size}, max_tokens {args.max_tokens}")
    for key in ("engine_startup", "engine_calls", "engine_shutdown"):
        print(f"{key:<18} {t.get(key, 0.0):8.1f} s")
    print(f"{'engine total':<18} {engine:8.1f} s")
    print(f"{'draftfit own':<18} {own:8.1f} s  = {own / t['wall']:.1%} of wall (target ≤ 10%)")
    print(f"{'wall':<18} {t['wall']:8.1f} s")


if __name__ == "__main__":
    main()

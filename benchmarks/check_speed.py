"""Wall time of `draftfit check` on two ~128k-entry tokenizers (target: budget 3 s, no torch/vLLM).

    python benchmarks/check_speed.py [--runs 3] [--tokens 128000]

Builds the pair once with the `tokenizers`-format builder in tests/tokfactory.py (a valid
byte-level BPE with 128,000 ids; the target padded to 128,256 embedding rows, the draft with two
ids swapped), then times the CLI end to end in fresh processes (interpreter start-up included) and
the library stages in this process. Every figure printed is measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import tokfactory  # noqa: E402

BUDGET_S = 3.0
_CHILD = (
    "import json, sys, time\n"
    "from draftfit.cli import cli\n"
    "code = cli.main(['check', sys.argv[1], sys.argv[2], '--json'], prog_name='draftfit', standalone_mode=False)\n"
    "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'vllm', 'transformers'})\n"
    "print(json.dumps({'exit': code, 'heavy': heavy}), file=sys.stderr)\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="draftfit-check-speed-") as tmp:
        start = time.perf_counter()
        target, draft = tokfactory.big_pair(Path(tmp), n_tokens=args.tokens, pad_to=args.tokens + 256)
        print(f"built two {args.tokens:,}-entry tokenizers in {time.perf_counter() - start:.2f} s (setup, not timed below)")

        walls = []
        for _ in range(args.runs):
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", _CHILD, str(target), str(draft)],
                                  capture_output=True, text=True, check=False)
            walls.append(time.perf_counter() - start)
            status = json.loads(proc.stderr.strip().splitlines()[-1])
        median = statistics.median(walls)
        print(f"draftfit check (fresh process, measured): runs {', '.join(f'{w:.2f}' for w in walls)} s; "
              f"median {median:.2f} s = {median / BUDGET_S:.2f} × the {BUDGET_S:.0f} s budget; "
              f"exit {status['exit']}; heavy modules imported: {status['heavy'] or 'none'}")

        from draftfit.compat import compare_files, load_model_files
        from draftfit.probe_corpus import builtin_probe_texts

        start = time.perf_counter()
        t_files = load_model_files(target)
        d_files = load_model_files(draft, like=t_files)
        loaded = time.perf_counter()
        compare_files(t_files, d_files, builtin_probe_texts())
        done = time.perf_counter()
        print(f"in process (measured): read both tokenizers {loaded - start:.2f} s, compare {done - loaded:.2f} s")


if __name__ == "__main__":
    main()

"""Engine start-up: the offline engine's core in draftfit's own process vs in a process of its own.

`rank` builds one vLLM engine per model (the target, then each draft). This times building and
closing the same engine both ways, alternating, in one run (the machine is shared and noisy, so
only the ratio measured side by side is meaningful), on the embedded SmolLM2-135M-Instruct:

* in process — what `draftfit.engines.vllm_engine.VLLMEngine` does for a plain engine;
* own process — vLLM's default, kept for speculative engines (see ``place_engine_core``).

It also prints this process's RSS after each close: an engine in this process must give its memory
back before the next is built.

    DRAFTFIT_CACHE=... python benchmarks/engine_start.py [--rounds 2] [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="Builds of each kind (alternating).")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    import psutil

    from draftfit.engines import vllm_engine
    from draftfit.refs import model_dir, resolve

    model = model_dir(resolve("smollm2"))
    vllm_engine.import_vllm()
    timings: dict[str, list[float]] = {"in process": [], "own process": []}
    original = vllm_engine.place_engine_core
    for _ in range(args.rounds):
        for kind in timings:
            # what VLLMEngine chooses for itself is overridden here, for this one build
            vllm_engine.place_engine_core = lambda in_process, kind=kind: original(kind == "in process")
            try:
                start = time.perf_counter()
                engine = vllm_engine.VLLMEngine(model, dtype=args.dtype, progress=False)
                built = time.perf_counter() - start
                engine.close()
            finally:
                vllm_engine.place_engine_core = original
            timings[kind].append(built)
            rss = psutil.Process().memory_info().rss / 2**30
            print(f"{kind:>12}: start-up {built:6.1f} s; this process's RSS after close {rss:.2f} GiB", flush=True)
    inner, outer = (statistics.median(timings[k]) for k in ("in process", "own process"))
    print(f"\nmedian start-up: in process {inner:.1f} s, own process {outer:.1f} s; "
          f"in process takes {inner / outer:.0%} of the time (measured, {args.rounds} builds each)")


if __name__ == "__main__":
    main()

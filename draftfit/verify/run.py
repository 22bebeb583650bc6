"""Orchestration of `draftfit verify`: the plan, the configurations in groups each measured in
interleaved rounds with its own baseline, resume of an interrupted run, and the results file
written after every group."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftfit import results as results_mod
from draftfit.acceptance import select_rule
from draftfit.candidates import StudySettings
from draftfit.engines import EngineConfig
from draftfit.engines.vllm_async import run_async
from draftfit.errors import DraftfitError
from draftfit.faults import fault_point
from draftfit.io import atomic_write_json, atomic_write_text
from draftfit.records import MeasuredEntry
from draftfit.verify.comparison import (
    annotate_configs,
    compare,
    entry_label,
    latest_run,
    merge_measured,
    predicted_level,
    summary_lines,
)
from draftfit.verify.latency import latency_summary
from draftfit.verify.load import DEFAULT_TIMEOUT_S, RunPlan
from draftfit.verify.measure import (
    ConfigRuns,
    Endpoints,
    Mode,
    groups_of,
    measure_group,
    servers_at_once,
)
from draftfit.verify.rounds import (
    DEFAULT_ROUNDS,
    RoundRun,
    itl_over_rounds,
    speedup_over_rounds,
    summed_counts,
)
from draftfit.verify.selection import (
    VerifyConfig,
    _target_ref,
    select_configs,
    speculative_config,
)

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


def _per_level(runs: Sequence[RoundRun], level: int) -> list[RoundRun]:
    return [run for run in runs if run.concurrency == level]


def _median(values: Sequence[float | None]) -> float | None:
    found = [float(v) for v in values if v is not None and np.isfinite(v)]
    return float(np.median(found)) if found else None


def level_entry(runs: Sequence[RoundRun], baseline: Sequence[RoundRun] | None, common: dict[str, Any]) -> MeasuredEntry:
    """The entry of one configuration at one level from its rounds (and its baseline's rounds).

    Latency percentiles pool every round's requests; tok/s, duration and requests in flight are
    medians over rounds; the mean ITL and the speedup are medians over rounds with a bootstrap
    95% interval (:mod:`draftfit.verify.rounds`); vLLM's counters are summed over rounds.
    """
    records = [record for run in runs for record in run.records]
    stats = latency_summary(records)
    per_round = [latency_summary(run.records) for run in runs]
    counts = summed_counts(runs)
    entry: dict[str, Any] = {
        **common, "engine_failed": False, "rounds": len(runs),
        "requests": stats["requests"], "requests_per_run": len(runs[0].records), "completed": stats["completed"], "errors": stats["errors"],
        "error_messages": stats["error_messages"], "finish_reasons": stats["finish_reasons"],
        "output_tokens_measured": stats["output_tokens"],
        "duration_s_measured": _median([r["duration_s"] for r in per_round]),
        "output_tok_s_measured": _median([r["output_tok_s"] for r in per_round]),
        "output_tok_s_rounds_measured": [r["output_tok_s"] for r in per_round],
        "mean_in_flight_measured": _median([r["mean_in_flight"] for r in per_round]),
        "ttft_ms_measured": stats["ttft_ms"], "itl_ms_measured": stats["itl_ms"],
        "itl_rounds_measured": itl_over_rounds(runs),
        "stream_gap_ms_measured": stats["stream_gap_ms"], "e2e_ms_measured": stats["e2e_ms"],
        "memory_measured": max((run.memory for run in runs), key=lambda m: m.get("peak_engine_rss_gib") or 0.0),
        "machine_load_measured": [{"round": run.round, **run.load} for run in runs],
        "counts_measured": counts.to_dict() if counts is not None else None,
    }
    mismatched = [r for r in records if r.prompt_tokens is not None and r.prompt_tokens != common["prompt_lengths"][r.prompt_index]]
    entry["prompt_token_mismatches"] = len(mismatched)
    if counts is not None and common.get("k") is not None:
        summary = counts.summary()
        entry["al_measured"] = summary["mean_acceptance_length"]
        entry["acceptance_rate_measured"] = summary["acceptance_rate"]
        entry["per_position_measured"] = summary["per_position_rate"]
        entry["conditional_measured"] = summary["conditional_rate"]
        entry["al_rounds_measured"] = [run.counts.mean_acceptance_length if run.counts is not None else None for run in runs]
    if baseline is not None and common.get("candidate") is not None:
        speed = speedup_over_rounds(runs, baseline)
        entry["speedup_measured"] = speed["median"]
        entry["speedup_ci_low_measured"], entry["speedup_ci_high_measured"] = speed["ci_low"], speed["ci_high"]
        entry["speedup_rounds_measured"] = speed["per_round"]
        entry["rounds_disagree"] = speed["rounds_disagree"]
        base_tps = {run.round: latency_summary(run.records)["output_tok_s"] for run in baseline}
        ratios = [r["output_tok_s"] / base_tps[run.round] for run, r in zip(runs, per_round, strict=True)
                  if r["output_tok_s"] and base_tps.get(run.round)]
        entry["throughput_ratio_measured"] = _median(ratios)
    elif common.get("candidate") is None:
        entry["rounds_disagree"] = bool(_rounds_outside(entry["itl_rounds_measured"]))
    entry.pop("prompt_lengths", None)
    return _finite(entry)


def _rounds_outside(itl: dict[str, Any]) -> bool:
    values = [v for v in itl.get("per_round") or [] if v is not None]
    low, high = itl.get("ci_low"), itl.get("ci_high")
    return bool(len(values) > 1 and low is not None and (min(values) < low or max(values) > high))


def group_entries(group: dict[str, ConfigRuns], verify_id: str, group_index: int, levels: Sequence[int],
                  context: dict[str, Any]) -> list[MeasuredEntry]:
    """The measured entries of one group (baseline first), one per configuration and level."""
    base = group["baseline"]
    entries = []
    for label, measured in group.items():
        config = measured.config
        common = {
            "kind": "measured", "verify_id": verify_id, "group": group_index, "candidate": config.candidate, "k": config.k,
            "method": config.method, "draft": config.draft, "speculative_config": config.speculative_config,
            "draft_is_target": config.draft_is_target, "serve_argv": measured.serve_argv, "server_url": measured.url,
            "schedule": [list(r) for r in config.schedule] if config.schedule else None,
            "server_state": measured.server_state, "startup_s": _median(measured.startup_s), **context,
        }
        for level in levels:
            runs = _per_level(measured.runs, level)
            if not runs:
                entries.append({**{k: v for k, v in common.items() if k != "prompt_lengths"}, "concurrency": int(level),
                                "engine_failed": True, "error": measured.error or "not measured"})
                continue
            baseline_runs = _per_level(base.runs, level) if label != "baseline" else None
            entry = level_entry(runs, baseline_runs or None, {**common, "concurrency": int(level)})
            if measured.error:
                entry["error"] = measured.error
            entries.append(entry)
    by_level = {e["concurrency"]: e for e in entries if e.get("candidate") is None}
    for entry in entries:
        baseline = by_level.get(entry["concurrency"])
        if entry.get("candidate") is not None and baseline is not None:
            entry["baseline_ref"] = {
                "verify_id": verify_id, "group": group_index, "requests": baseline.get("requests"),
                "rounds": baseline.get("rounds"), "prompts_hash": context.get("prompts_hash"),
                "itl_ms_median": (baseline.get("itl_rounds_measured") or {}).get("median"),
                "engine_failed": bool(baseline.get("engine_failed")),
            }
    return entries


def plan_key(prompts_hash: str, plan: RunPlan, options: EngineConfig, vllm_version: str | None, device: str, *,
             rounds: int = 1, mode: str = "serve") -> str:
    """What makes two verify runs measure the same thing (prompts, sampling, levels, bounds,
    engine settings, vLLM, device); the configurations themselves are not part of it."""
    engine = {k: v for k, v in options.to_dict().items() if k != "debug"}
    raw = json.dumps({
        "prompts_hash": prompts_hash, "temperature": plan.temperature, "top_p": plan.top_p, "max_tokens": plan.max_tokens,
        "seed": plan.seed, "levels": list(plan.levels), "requests": plan.requests, "timeout_s": plan.timeout_s,
        "engine": engine, "vllm": vllm_version, "device": device, "rounds": rounds, "mode": mode,
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
    from draftfit.parallelism import on_gpu

    return "gpu" if on_gpu() else "cpu"


@dataclass
class VerifyRun:
    """`draftfit verify`: measure the chosen configurations and a baseline; merge into results."""

    results_path: Path
    top: int | None = None
    configs: Sequence[str] = ()
    candidate_files: Sequence[str | Path] = ()
    ks: Sequence[int] | None = None
    recommended: bool | None = None  # rank's recommended deploy command (None: when nothing else is chosen)
    concurrency: Sequence[int] | None = None
    requests: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    gpu_memory_utilization: float | None = None
    dtype: str | None = None  # the engines' dtype; default: the study's (what rank ran in)
    argv: list[str] | None = None
    debug: bool = False
    progress: Progress = field(default=lambda message: None)
    report_path: Path | None = None  # report.html re-rendered after the run
    trust_remote_code: bool = False  # let model repositories run their own code
    show_prompts: bool = False  # prompt text in warnings (off: row numbers and a hash only)
    resume: bool = True  # keep what an interrupted verify of the same plan measured
    engine: Mode = "serve"  # how each configuration runs: its own `vllm serve` (default) or vLLM in draftfit
    rounds: int = DEFAULT_ROUNDS  # interleaved rounds of the baseline and each configuration
    servers_at_once: int | None = None  # None: as many as fit in memory
    server: str | None = None  # a running server's URL (the chosen configuration)
    baseline_server: str | None = None  # the running baseline server's URL
    failures: list[dict] = field(default_factory=list)  # this run's failed runs (kept apart from measured)

    def plan(self):
        """Load the results and work out what will run (no engine): (results, study, configs, levels, requests)."""
        from draftfit.refs import model_dir

        self.results_path = Path(self.results_path)
        self._check_servers()  # before the results are read: --dry-run and a real run refuse alike
        results = results_mod.load(self.results_path)
        study = StudySettings.model_validate(results.study)
        chosen = select_configs(results, top=self.top, configs=self.configs, candidate_files=self.candidate_files, ks=self.ks,
                                recommended=self.recommended)
        target_ref = _target_ref(results)
        configs = [speculative_config(c.candidate, c.k, target_ref, study, trust_remote_code=self.trust_remote_code,
                                      schedule=c.schedule) for c in chosen]
        levels = tuple(sorted(set(self.concurrency or study.concurrency)))
        if not levels or min(levels) < 1:
            raise DraftfitError("concurrency levels must be whole numbers ≥ 1", fix="Use e.g. --concurrency 1,4,8")
        return results, study, target_ref, model_dir(target_ref, trust_remote_code=self.trust_remote_code), configs, levels

    def run(self) -> tuple[results_mod.Results, list[dict[str, Any]]]:
        from draftfit.refs import metadata_dir

        wall = time.perf_counter()
        results, study, target_ref, target_dir, configs, levels = self.plan()
        self.progress("sampling the study's prompts")
        from draftfit.prompts.sampling import study_prompts

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
        plan = RunPlan(prompts, study.temperature, study.top_p, study.max_tokens, study.seed, levels, requests, float(self.timeout_s),
                       texts=[item.text for item in sample.items], chats=[item.messages for item in sample.items])
        from draftfit.parallelism import engine_parallelism

        layout, layout_note = engine_parallelism(study.parallelism)
        refusal = layout.engine_refusal()
        if refusal:
            raise DraftfitError(refusal, where="parallelism")
        options = EngineConfig(
            dtype=self.dtype or study.dtype, max_model_len=study.max_model_len,
            gpu_memory_utilization=float(self.gpu_memory_utilization or study.engine_memory_utilization),
            parallelism=layout, seed=study.seed, debug=self.debug,
            trust_remote_code=self.trust_remote_code,
        )
        device = _device()
        rule = select_rule(study.temperature, study.draft_sample_method)
        notes = [layout_note] if layout_note else []
        ranked_with = ((results.targets[0].get("trajectories") or {}).get("engine") or {}).get("version") if results.targets else None
        from draftfit.refs import portable_fingerprint

        recorded = ((results.targets[0].get("target") or {}) if results.targets else {}).get("fingerprint")
        here = portable_fingerprint(target_ref) if recorded else None
        if recorded and recorded != here:
            notes.append(f"verify: the target {target_ref.spec} resolves here to other files than rank used "
                         f"(fingerprint {here} ≠ {recorded}): the predictions may not apply")
        installed = _vllm_version()
        if ranked_with and installed and ranked_with != installed:
            notes.append(f"verify: vLLM {installed} measured predictions made with vLLM {ranked_with}")
        if requests < max(levels):
            notes.append(f"verify: {requests} requests per run cannot keep {max(levels)} in flight; "
                         "see mean_in_flight_measured (raise --requests)")
        if requests > len(prompts):
            notes.append(f"verify: {requests} requests cycle over {len(prompts)} prompts; repeated prompts hit the prefix cache (TTFT is optimistic)")
        mode: Mode = "url" if self.server else self.engine
        endpoints = Endpoints(mode, target_dir, options, self.results_path.parent / "verify-servers.log",
                              urls=self._urls(configs))
        at_once = int(self.servers_at_once or servers_at_once(target_dir, options, configs, mode))
        groups = groups_of(configs, at_once)
        together = at_once >= 2
        key = plan_key(sample.prompts_hash, plan, options, installed, device, rounds=self.rounds, mode=mode)
        record = unfinished_run(results, key) if self.resume else None
        if record is not None:
            record["resumed"] = int(record.get("resumed") or 0) + 1
            record["configs"] = list(dict.fromkeys([*record.get("configs", []), *(c.label for c in configs)]))
        else:
            api = {"serve": "vllm serve, OpenAI-compatible streaming API (continuous usage stats), counters from /metrics",
                   "url": "a running vLLM server (--server), OpenAI-compatible streaming API, counters from /metrics",
                   "inprocess": "vllm AsyncLLM in draftfit (streaming, RequestOutputKind.DELTA)"}[mode]
            record = {
                "verify_id": results_mod.new_run_id(), "kind": "measured", "status": "running", "plan_key": key,
                "command_line": " ".join(self.argv) if self.argv else None,
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": device,
                "engine": options.to_dict() | {"api": api, "mode": mode},
                "concurrency": list(levels), "requests_per_run": requests, "timeout_s": plan.timeout_s,
                "rounds": self.rounds, "prompts_hash": sample.prompts_hash,
                "timings": {"engine_startup": 0.0, "runs": 0.0, "engine_shutdown": 0.0},
                "configs": [c.label for c in configs],
            }
            results.provenance["verify"] = [*results.provenance.get("verify", []), record]
        record["servers_at_once"] = at_once
        if mode == "serve":
            record["serve_command"] = (
                "each server runs the deploy command's speculative config and --max-model-len, with the target's "
                "local directory for its deploy name and verify's memory fraction (--gpu-memory-utilization), plus the settings every engine draftfit "
                "starts uses (so it measures what `rank` profiled): --host 127.0.0.1 --port (free), --dtype, --seed, "
                "--enforce-eager and, on the CPU, --kv-cache-memory-bytes (and a float32 MLA model's CPU_MLA attention "
                "backend); each entry's serve_argv is the command that ran")
        record["groups"] = [[c.label for c in group] for group in groups]
        verify_id, timings = record["verify_id"], record["timings"]
        spent = float(timings.get("wall") or 0.0)
        earlier = [e for e in results.measured if e.get("verify_id") == verify_id]
        prompts_sent = min(plan.requests, len(plan.prompts))  # requests go out over the prompts in order
        context = {"prompts_hash": sample.prompts_hash, "prompt_lengths": [len(p) for p in prompts], "prompts_sent": prompts_sent}
        new: list[dict[str, Any]] = []
        how = "side by side" if together else "one at a time"
        self.progress(f"{len(configs)} configuration(s) in {len(groups)} group(s), {self.rounds} interleaved rounds "
                      f"with the baseline, servers {how}")
        for index, group in enumerate(groups):
            labels = {c.label for c in group} | {"baseline"}
            kept = [e for e in earlier if e.get("group") == index]
            if {entry_label(e) for e in kept} == labels \
                    and all(not e.get("engine_failed") for e in kept) and len(kept) == len(labels) * len(levels):
                self.progress(f"group {index + 1}: measured before the interruption (verify {verify_id}); kept")
                new.extend(kept)
                continue
            measured: dict[str, ConfigRuns] = {}

            async def measure(group=group, measured=measured) -> None:
                measured.update(await measure_group(group, endpoints, plan, self.rounds, together=together,
                                                    progress=self.progress))

            run_async(measure)
            for runs in measured.values():
                timings["engine_startup"] += sum(runs.startup_s)
                timings["engine_shutdown"] += sum(runs.shutdown_s)
                timings["runs"] += sum(run.wall_s for run in runs.runs)
            entries = group_entries(measured, verify_id, index, levels, context)
            baseline_by_level = {e["concurrency"]: e for e in entries if e.get("candidate") is None}
            for entry in entries:
                config = measured[entry_label(entry)].config
                predicted = predicted_level(results, config.candidate, config.k, entry["concurrency"], prompts_sent,
                                            schedule=config.schedule)
                baseline = baseline_by_level.get(entry["concurrency"]) if config.candidate is not None else None
                compare(entry, predicted, baseline, draft_is_target=config.draft_is_target, rule=rule,
                        temperature=study.temperature, device=device)
            new.extend(entries)
            timings["wall"] = spent + time.perf_counter() - wall
            self._save(results, new, notes)  # keep what was measured if a later group is interrupted
            fault_point("verify-group")
        record["status"] = "complete"
        self._save(results, new, notes)
        self.report_path = self._render(results)
        return results, new

    def _check_servers(self) -> None:
        if self.server and not self.baseline_server:
            raise DraftfitError("--server needs the baseline's server too, to measure speedups against",
                                fix="Start `vllm serve` without --speculative-config on the same hardware and pass "
                                    "--baseline-server URL")
        if self.baseline_server and not self.server:
            raise DraftfitError("--baseline-server goes with --server (the running server of the configuration)",
                                fix="Add --server URL, or drop --baseline-server to start the servers here")

    def _urls(self, configs: Sequence[VerifyConfig]) -> dict[str | None, str]:
        """--server URL: the configuration it serves (exactly one named) and the baseline's server."""
        if not self.server:
            return {}
        if len(configs) != 1:
            raise DraftfitError(f"--server measures one configuration; {len(configs)} are chosen",
                                fix="Name the configuration the server runs: --recommended (rank's deploy command) or one --config NAME:K")
        return {configs[0].candidate: self.server, None: self.baseline_server}

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
        measured, failed = split_failures(new)
        results.measured = merge_measured(results.measured, measured)
        runs = {e.get("verify_id") for e in new}
        results.measurement_failures = [*(f for f in results.measurement_failures if f.get("verify_id") not in runs), *failed]
        self.failures = failed
        annotate_configs(results.configs, results.measured)
        kept = [w for w in results.warnings if not w.startswith("verify: ")]
        results.warnings = kept + notes + summary_lines(latest_run(results.measured)) + failure_lines(failed)
        save_results(results, self.results_path)


def is_failure(entry: dict) -> bool:
    """A run that measured nothing: its engine did not start or died, or none of its requests completed."""
    return bool(entry.get("engine_failed")) or not entry.get("completed")


def split_failures(entries: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(measured entries, failed runs labelled kind "failed")."""
    measured = [e for e in entries if not is_failure(e)]
    failed = [{**e, "kind": "failed"} for e in entries if is_failure(e)]
    return measured, failed


def failure_lines(failed: Sequence[dict]) -> list[str]:
    """One line per failed run, for ``warnings`` and the terminal."""
    return [f"verify: {entry_label(e)} at concurrency {e['concurrency']} FAILED, nothing measured: "
            f"{str(e.get('error') or (e.get('error_messages') or ['no request completed'])[0])[:300]}" for e in failed]


def save_results(results: results_mod.Results, path: Path) -> None:
    """Write the results JSON (atomically) and its CSV beside it (same stem)."""
    path = Path(path)
    atomic_write_json(path, results_mod.to_json(results))
    atomic_write_text(path.with_suffix(".csv"), results_mod.to_csv(results))

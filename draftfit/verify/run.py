"""Orchestration of `draftfit verify`: the plan, one engine per configuration (baseline first),
resume of an interrupted run, and the results file written after every configuration."""

from __future__ import annotations

import hashlib
import json
import logging
import os
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
from draftfit.engines.vllm_async import AsyncVLLMEngine, counts_delta, run_async
from draftfit.errors import DraftfitError
from draftfit.faults import fault_point
from draftfit.io import atomic_write_json, atomic_write_text
from draftfit.metrics import SpecCounts
from draftfit.records import MeasuredEntry
from draftfit.verify.comparison import (
    annotate_configs,
    compare,
    entry_key,
    merge_measured,
    predicted_level,
    summary_lines,
)
from draftfit.verify.latency import RequestRecord, latency_summary
from draftfit.verify.load import DEFAULT_TIMEOUT_S, RunPlan, send_load
from draftfit.verify.selection import (
    BASELINE,
    VerifyConfig,
    _target_ref,
    select_configs,
    speculative_config,
)

log = logging.getLogger(__name__)
Progress = Callable[[str], None]

WARMUP_TOKENS = 4


# ---------------------------------------------------------------------------------------------
# what to run




















# ---------------------------------------------------------------------------------------------
# measuring: records of one run, and their summary








# ---------------------------------------------------------------------------------------------
# engine sanity, roll-out flags, prediction errors (pure functions of plain data)






























# ---------------------------------------------------------------------------------------------
# the engine: vLLM's AsyncLLM, started and stopped by draftfit








def _load_average() -> float | None:
    """The machine's 1-minute load average (other work competing for the CPUs), where the OS reports it."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None






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










async def _measure_engine(config: VerifyConfig, target_dir: Path, plan: RunPlan, options: EngineConfig,
                          progress: Progress, run: EngineRun) -> None:
    engine = AsyncVLLMEngine(target_dir, options, config.speculative_config)
    interrupt: BaseException | None = None
    try:
        progress(f"{config.label}: starting vLLM")
        try:
            await engine.__aenter__()
        except DraftfitError as exc:
            run.error = exc.message
            return
        finally:
            run.startup_s = engine.startup_s
        # one short request so that first-call costs are not measured
        async for _ in engine.generate(plan.prompts[0], plan.params(0, WARMUP_TOKENS), "warmup"):
            pass
        for level in plan.levels:
            progress(f"{config.label}: {plan.requests} requests at concurrency {level}")
            await engine.reset_prefix_cache()
            counts_before = await engine.counts()
            load_before = _load_average()
            with engine.memory() as memory:
                t0 = time.perf_counter()
                records = await send_load(engine, plan, level, tag=f"c{level}")
                wall = time.perf_counter() - t0
            counts_after = await engine.counts()
            load = {"kind": "measured", "load_avg_1m_before": load_before, "load_avg_1m_after": _load_average(), "cpus": os.cpu_count()}
            run.levels.append(LevelRun(level, records, counts_delta(counts_after, counts_before), memory.to_dict(), wall, load))
    except Exception as exc:  # an engine that dies mid-run: keep the levels measured so far
        if run.error is None:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            run.error = f"vLLM failed during the runs ({type(exc).__name__}: {first})"
        log.debug("engine failure", exc_info=True)
    except BaseException as exc:  # Ctrl-C: the engine ends its processes at once
        interrupt = exc
        raise
    finally:
        await engine.__aexit__(*((type(interrupt), interrupt, interrupt.__traceback__) if interrupt else (None,) * 3))
        run.shutdown_s = engine.shutdown_s


def measure_config(config: VerifyConfig, target_dir: Path, plan: RunPlan, options: EngineConfig,
                   progress: Progress = lambda message: None) -> EngineRun:
    """Start one engine for ``config``, run every concurrency level of ``plan``, stop the engine."""
    run = EngineRun(config, [])
    run_async(lambda: _measure_engine(config, target_dir, plan, options, progress, run))
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
        plan = RunPlan(prompts, study.temperature, study.top_p, study.max_tokens, study.seed, levels, requests, float(self.timeout_s))
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









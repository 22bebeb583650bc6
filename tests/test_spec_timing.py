"""Timed speculative steps: the differencing of two runs, and the overhead they put into the cost model."""

from __future__ import annotations

import numpy as np
import pytest

from draftfit.metrics import SpecCounts
from draftfit.spec_timing import (
    SpecStepTiming,
    base_offsets,
    batch_schedule,
    served_correction,
    time_spec_steps,
    timing_plan,
)


class FakeSpecLLM:
    """A speculative engine whose decode step takes ``step`` seconds (a clock it advances), plus
    ``per_seq`` for each sequence in it beyond the first, and accepts ``accept`` drafts per drafted
    step, drafting on a share ``drafted`` of its steps; a request also pays ``fixed`` seconds
    (prefill, admission), which the differencing must cancel."""

    def __init__(self, step: float, accept: int, drafted: float, fixed: float = 0.5, per_seq: float = 0.0):
        self.step, self.accept, self.drafted, self.fixed, self.per_seq = step, accept, drafted, fixed, per_seq
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
        n = len(prompts)  # every sequence drafts and accepts alike
        self.clock += self.fixed + steps * (self.step + self.per_seq * (n - 1))
        self.counts = self.counts + SpecCounts(n * drafts, n * drafts * 4, n * accepted, np.zeros(4))
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
    def parts(k, batch=1, context=None):
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

    def parts(k, batch=1, context=None):
        p = predict_costs(target, draft, [max(k, 1)], [1.0], concurrency=[batch], context_len=400, spec_overhead_s=0.0)
        return float(p.t_base[0]), float(p.t_verify[0, 0]), float(p.t_draft[0, 0])

    base = SpecStepTiming(0, 0.041, 0.0, 100, 3, 0.1)
    timed = SpecStepTiming(5, 0.085, 1.0, 100, 3, 0.1)
    c = served_correction(base, timed, parts, model_free=False)
    p = predict_costs(OffsetStepTime(target, c.base_offset_s), ScaledDraftCost(draft, c.draft_scale), [5], [1.0],
                      concurrency=[1], context_len=400, spec_overhead_s=0.0, step_overhead_s=c.step_overhead_s)
    assert float(p.t_spec[0, 0]) == pytest.approx(0.085)
    assert float(p.t_base[0]) == pytest.approx(0.041)


def test_a_batch_is_timed_per_step_of_all_its_sequences(clock):
    llm = FakeSpecLLM(step=0.02, accept=1, drafted=1.0, per_seq=0.004)
    clock["llm"] = llm
    timing = time_spec_steps(llm, llm.counters, [[1, 2, 3], [4, 5], [6]], k=2, tokens=(8, 40), batch=4)
    assert timing.batch == 4 and timing.seconds_per_step == pytest.approx(0.02 + 3 * 0.004)
    assert timing.drafted_fraction == pytest.approx(1.0)
    assert timing.occupancy == pytest.approx(4.0) and timing.sequences == pytest.approx(4.0)


class FakeUnevenLLM:
    """A speculative engine whose sequences accept apart: a prompt starting with token 1 has all of
    its ``k`` = 3 drafts accepted at every step, any other none. Each engine step costs ``step`` plus
    ``per_seq`` per further sequence still running; a run's prefill is one engine step of its own."""

    def __init__(self, step: float, per_seq: float):
        self.step, self.per_seq, self.clock, self.steps = step, per_seq, 0.0, 0
        self.counts = SpecCounts.zeros(3)

    def generate(self, prompts, params, use_tqdm=False):
        per_sequence = []
        drafts = accepted = 0
        for prompt in prompts:
            tokens, steps = params.max_tokens - 1, 0
            while tokens > 0:
                take = min(3 if prompt.get("prompt_token_ids")[0] == 1 else 0, tokens - 1)
                steps, drafts, accepted, tokens = steps + 1, drafts + 1, accepted + take, tokens - take - 1
            per_sequence.append(steps)
        running = [sum(s > i for s in per_sequence) for i in range(max(per_sequence))]
        self.clock += 0.5 + sum(self.step + self.per_seq * (r - 1) for r in running)
        self.steps += 1 + len(running)
        self.counts = self.counts + SpecCounts(drafts, 3 * drafts, accepted, np.zeros(3))
        return []

    def counters(self):
        return self.counts

    def iterations(self):
        return self.steps


def test_a_batch_whose_sequences_finish_apart_is_timed_per_engine_step(clock):
    """Batches [p₁ p₂ p₃ p₁] and [p₂ p₃ p₁ p₂] of 8 and 20 tokens, where p₁ takes 4 tokens a step
    and the others 1 (by hand: p₁ runs 2 and 5 steps, the others 7 and 19). Differenced: 12 engine
    steps each, carrying 30 and 39 sequence-steps — 2.5 and 3.25 sequences per step, 2.875 over
    both. Each engine step costs 20 ms + 4 ms per further sequence, so the timed step is the step at
    2.875 sequences: 27.5 ms. Divided by the mean sequence's steps instead (7.5 and 9.75), the same
    runs read 41.6 and 35.7 ms."""
    llm = FakeUnevenLLM(step=0.020, per_seq=0.004)
    clock["llm"] = llm
    prompts = [[1, 9], [2, 9], [3, 9]]
    timing = time_spec_steps(llm, llm.counters, prompts, k=3, tokens=(8, 40), batch=4, iterations=llm.iterations)
    assert timing.occupancy == pytest.approx(2.875)
    assert timing.seconds_per_step == pytest.approx(0.020 + 0.004 * (2.875 - 1))
    blind = time_spec_steps(llm, llm.counters, prompts, k=3, tokens=(8, 40), batch=4)
    assert blind.seconds_per_step == pytest.approx((0.3120 / 7.5 + 0.348 / 9.75) / 2)
    assert blind.occupancy == pytest.approx(4.0)


@pytest.mark.parametrize("occupancy", [None, 2.5], ids=["full", "sequences-finished-apart"])
@pytest.mark.parametrize("model_free", [False, True], ids=["draft-model", "model-free"])
def test_the_batched_timings_give_what_each_sequence_adds(model_free, occupancy):
    """Served steps timed alone and at batch 4, plain and speculative, where the served engine pays
    3 ms per further sequence on every step and the speculative one 5 ms more (what the profile's
    passes do not hold): the corrected cost model gives back all four timed steps, and at batch 16
    the per-sequence terms extrapolate linearly. Where the batch's sequences finished apart (2.5
    per engine step on average), its timing is the step at 2.5 sequences and is priced there."""
    from draftfit.costmodel import (
        MeasuredStepTime,
        ModelDraftCost,
        ModelFreeDraftCost,
        OffsetStepTime,
        ScaledDraftCost,
        pass_times,
        predict_costs,
    )
    from draftfit.hardware import StepProfile

    target = MeasuredStepTime(StepProfile(a=0.030, b=1.5e-3, c=1e-6, knee=12))
    draft = ModelFreeDraftCost(cpu_seconds_per_seq=0.0) if model_free else ModelDraftCost(
        MeasuredStepTime(StepProfile(a=0.006, b=2e-4, c=1e-7)))

    def predicted(batch, k, offset, base_seq, scale, overhead, spec_seq):
        served = OffsetStepTime(target, offset, base_seq)
        cost = draft if scale == 1.0 else ScaledDraftCost(draft, scale)
        return predict_costs(served, cost, [k], [1.0], concurrency=[batch], context_len=300, spec_overhead_s=0.0,
                             step_overhead_s=overhead, step_overhead_per_seq_s=spec_seq, draft_fraction=[0.6])

    truth = {"offset": 0.004, "base_seq": 0.003, "scale": 1.0 if model_free else 0.7,
             "overhead": 0.002 if model_free else 0.0, "spec_seq": 0.005}
    timed = {b: predicted(b, 3, **truth) for b in (1, 2, 3, 4, 16)}

    def parts(k, seqs=1.0, context=None):
        t_base, t_verify, t_draft = pass_times(target, draft, [max(k, 1)], seqs, 300)
        return float(t_base[0]), float(t_verify[0, 0]), float(t_draft[0, 0])

    base = [SpecStepTiming(0, float(timed[b].t_base[0]), 0.0, 100, 3, 0.1, batch=b) for b in (1, 4)]
    # below the knee every term is linear in the sequences: the step at 2.5 is the mean of those at 2 and 3
    batched = float(timed[4].t_spec[0, 0]) if occupancy is None else (
        float(timed[2].t_spec[0, 0]) + float(timed[3].t_spec[0, 0])) / 2
    spec = [SpecStepTiming(3, float(timed[1].t_spec[0, 0]), 0.6, 100, 3, 0.1),
            SpecStepTiming(3, batched, 0.6, 100, 3, 0.1, batch=4, occupancy=occupancy)]
    c = served_correction(base, spec, parts, model_free=model_free)
    assert (c.base_offset_s, c.base_per_seq_s, c.draft_scale, c.step_overhead_s, c.overhead_per_seq_s) == pytest.approx(
        tuple(truth.values()), abs=1e-9)
    assert c.timed_batch == 4
    again = predicted(16, 3, c.base_offset_s, c.base_per_seq_s, c.draft_scale, c.step_overhead_s, c.overhead_per_seq_s)
    assert float(again.t_spec[0, 0]) == pytest.approx(float(timed[16].t_spec[0, 0]))
    assert float(again.t_base[0]) == pytest.approx(float(timed[16].t_base[0]))


def test_a_batch_timed_below_the_profiles_growth_holds_beyond_it():
    """A plain step timed alike at batch 1 and 4 where the profile grows 2 ms per sequence: the
    served step is what was timed up to batch 4, and beyond it grows as the profile does (a negative
    slope is held, not extrapolated into steps that get cheaper with every sequence)."""
    from draftfit.costmodel import MeasuredStepTime, OffsetStepTime
    from draftfit.hardware import StepProfile

    profile = MeasuredStepTime(StepProfile(a=0.038, b=0.002, c=0.0))

    def parts(k, seqs=1.0, context=None):
        return float(profile.step_time(seqs, 0.0, seqs)), 0.0, 0.0

    base = [SpecStepTiming(0, 0.041, 0.0, 100, 3, 0.1), SpecStepTiming(0, 0.041, 0.0, 100, 3, 0.1, batch=4)]
    offset, per_seq = base_offsets(base, parts)
    assert offset == pytest.approx(0.001) and per_seq == pytest.approx(-0.002)
    served = OffsetStepTime(profile, offset, per_seq, timed_batch=4)
    assert served.step_time(4, 0.0, 4) == pytest.approx(0.041)
    assert served.step_time(16, 0.0, 16) == pytest.approx(0.041 + 12 * 0.002)


def test_the_batches_timed_follow_the_studys_concurrency():
    from draftfit.spec_timing import timing_batches

    assert timing_batches([1]) == (1,)
    assert timing_batches([1, 2]) == (1, 2)
    assert timing_batches([1, 4, 16]) == (1, 4)


def test_a_proposer_with_passes_is_timed_at_its_smallest_k_alone_and_its_largest_in_batches():
    assert timing_plan([3, 1, 5, 2], [1, 4, 16], passes=True) == ((1, 1), (2, 5), (4, 5))
    assert batch_schedule(timing_plan([3, 1, 5, 2], [1, 4, 16], passes=True)) == [[1, 1, 1], [2, 1024, 5]]
    # one k, a model-free proposer, or no batch of 3: the largest k at every batch, no schedule
    assert timing_plan([4], [1, 4], passes=True) == ((1, 4), (4, 4))
    assert timing_plan([1, 4], [1, 4], passes=False) == ((1, 4), (4, 4))
    assert timing_plan([1, 4], [1, 2], passes=True) == ((1, 4), (2, 4))
    assert timing_plan([1, 4], [1], passes=True) == ((1, 4),)
    assert batch_schedule(((1, 4), (4, 4))) is None


@pytest.mark.parametrize("overhead", [0.0, 0.005, -0.004], ids=["none", "5ms", "negative"])
def test_two_k_timed_separate_the_per_pass_cost_from_the_per_step_one(overhead):
    """A draft model whose passes cost 0.9× the profile's and whose every step costs ``overhead``
    more whatever k is, 4 ms per further sequence: timed at k=1 alone and k=4 at batches 2 and 4,
    the correction recovers all three terms, and the corrected cost model gives back the step at
    k=1 and at k=4 alone, neither of them timed. Fitted from k=4 alone (the pass-only fit), k=1
    comes out too cheap by about the overhead. Timings that would need a negative overhead (noise;
    no step is cheaper for speculating) get none, and the step timed alone is still given back."""
    from draftfit.costmodel import (
        MeasuredStepTime,
        ModelDraftCost,
        OffsetStepTime,
        ScaledDraftCost,
        predict_costs,
    )
    from draftfit.hardware import StepProfile

    target = MeasuredStepTime(StepProfile(a=0.035, b=3e-4, c=3e-6))
    draft = ModelDraftCost(MeasuredStepTime(StepProfile(a=0.0064, b=4.5e-5, c=1.8e-7, knee=10)))

    def step(batch, k, offset=-0.001, base_seq=0.0006, scale=0.9, over=overhead, spec_seq=0.004):
        served = OffsetStepTime(target, offset, base_seq)
        return float(predict_costs(served, ScaledDraftCost(draft, scale), [k], [1.0], concurrency=[batch], context_len=330,
                                   spec_overhead_s=0.0, step_overhead_s=over, step_overhead_per_seq_s=spec_seq).t_spec[0, 0])

    def parts(k, batch=1, context=None):
        p = predict_costs(target, draft, [max(k, 1)], [1.0], concurrency=[batch], context_len=330, spec_overhead_s=0.0)
        return float(p.t_base[0]), float(p.t_verify[0, 0]), float(p.t_draft[0, 0])

    base = [SpecStepTiming(0, parts(0, b)[0] - 0.001 + 0.0006 * (b - 1), 0.0, 100, 3, 0.1, batch=b) for b in (1, 4)]
    timed = [SpecStepTiming(k, step(b, k), 1.0, 100, 3, 0.1, batch=b) for b, k in timing_plan([1, 2, 4], [1, 4], passes=True)]
    c = served_correction(base, timed, parts, model_free=False)
    assert c.timed_ks == (1, 4) and c.timed_k == 4 and c.timed_batch == 4
    again = step(1, 1, c.base_offset_s, c.base_per_seq_s, c.draft_scale, c.step_overhead_s, c.overhead_per_seq_s)
    assert again == pytest.approx(step(1, 1), rel=1e-6)
    if overhead < 0:
        assert c.step_overhead_s == 0.0
        return
    assert (c.draft_scale, c.step_overhead_s, c.overhead_per_seq_s) == pytest.approx((0.9, overhead, 0.004), abs=1e-9)
    for k in (1, 4):
        assert step(1, k, c.base_offset_s, c.base_per_seq_s, c.draft_scale, c.step_overhead_s, c.overhead_per_seq_s) == \
            pytest.approx(step(1, k))
    single = served_correction(base, [SpecStepTiming(4, step(b, 4), 1.0, 100, 3, 0.1, batch=b) for b in (1, 4)], parts,
                               model_free=False)
    assert single.step_overhead_s == 0.0 and single.timed_ks == (4,)
    k1 = step(1, 1, single.base_offset_s, single.base_per_seq_s, single.draft_scale, 0.0, single.overhead_per_seq_s)
    assert step(1, 1) - k1 == pytest.approx(overhead * (1 - parts(1)[2] / parts(4)[2]), rel=1e-6)


def test_a_timing_round_trips():
    t = SpecStepTiming(3, 0.01, 0.9, 120.0, 3, 0.2)
    assert SpecStepTiming.from_dict(t.to_dict()) == t


def test_the_timed_context_is_the_timing_prompts_plus_the_middle_of_the_differenced_tokens():
    from draftfit.spec_timing import timing_context

    prompts = [[0] * 57, [0] * 211, [0] * 271]
    # alone: every prompt once, tokens 8 → 128
    assert timing_context(prompts, (8, 128), 1) == pytest.approx((57 + 211 + 271) / 3 + 68)
    # 4 at once: two rotations of the cycled prompts, tokens 8 → 64
    rotations = [57, 211, 271, 57, 211, 271, 57, 211]
    assert timing_context(prompts, (8, 128), 4) == pytest.approx(np.mean(rotations) + 36)
    llm = FakeSpecLLM(step=0.03, accept=0, drafted=0.0)
    timed = time_spec_steps(llm, None, prompts, 0, tokens=(8, 128), batch=4)
    assert timed.context_len == pytest.approx(np.mean(rotations) + 36)


def test_the_correction_compares_a_timing_with_the_profile_at_the_timings_context():
    """The baseline timed on short prompts (context 200) is 2 ms slower than the profile there; the
    study's context is 400, where the profile is 2 ms slower still. The offset is the 2 ms measured
    like for like; at the study's context the profile's growth then adds to it."""
    from draftfit.costmodel import MeasuredStepTime, OffsetStepTime
    from draftfit.hardware import StepProfile

    profile = MeasuredStepTime(StepProfile(a=0.030, b=0.0, c=1e-5))
    study_context = 400.0

    def parts(k, batch=1, context=None):
        ctx = study_context if context is None else context
        return float(profile.step_time(batch, batch * ctx, batch)), 0.0, 0.0

    timed = SpecStepTiming(0, 0.030 + 200 * 1e-5 + 0.002, 0.0, 100, 3, 0.1, context_len=200.0)
    offset, _ = base_offsets([timed], parts)
    assert offset == pytest.approx(0.002)
    served = OffsetStepTime(profile, offset)
    assert float(served.step_time(1, study_context, 1)) == pytest.approx(0.030 + 400 * 1e-5 + 0.002)
    # without the timing's context (an older record) it is compared at the study's, as before
    older = SpecStepTiming(0, timed.seconds_per_step, 0.0, 100, 3, 0.1)
    assert base_offsets([older], parts)[0] == pytest.approx(0.0)


def test_an_alone_timing_under_the_profile_does_not_lever_the_per_sequence_term():
    """A demo MTP layer's timings (rank, seed 0): alone at k=1 the served step (58.2 ms) came in under
    the profile's verification plus the served offset (66.6 ms), which no bounded overhead or scale
    can meet. Its occupancy was counted at 0.996, and the per-sequence term — 0.0036 sequences below
    one, weighted as the timing alone is — absorbed the miss at 1.39 s per sequence: 0.03× predicted
    at four in flight. Alone is one sequence; the term is what the batched timings say."""
    from draftfit.costmodel import MeasuredStepTime, ModelDraftCost, ScaledStepTime, pass_times
    from draftfit.hardware import StepProfile
    from draftfit.spec_timing import ASSUMED_SCALE_RANGE

    target = MeasuredStepTime(StepProfile(a=0.04678, b=0.001377, c=2.354e-06, d=7.305e-06, e=8.142e-07))
    draft = ModelDraftCost(ScaledStepTime(target, 0.03125, "the head's share of the target's parameters"))

    def parts(k, seqs=1.0, context=None):
        t_base, t_verify, t_draft = pass_times(target, draft, [max(k, 1)], seqs, context)
        return float(t_base[0]), float(t_verify[0, 0]), float(t_draft[0, 0])

    base = [SpecStepTiming(0, 0.06343, 0.0, 360, 3, 0.29, context_len=247.7, occupancy=1.0),
            SpecStepTiming(0, 0.07011, 0.0, 112, 3, 0.43, batch=4, context_len=204.25, occupancy=4.0)]
    spec = [SpecStepTiming(1, 0.05817, 1.0, 273, 3, 0.35, context_len=247.7, occupancy=0.99635),
            SpecStepTiming(4, 0.09260, 0.99375, 80, 3, 0.17, batch=2, context_len=223.5, occupancy=2.0),
            SpecStepTiming(4, 0.12671, 0.99371, 79.5, 3, 0.03, batch=4, context_len=204.25, occupancy=4.0)]
    c = served_correction(base, spec, parts, model_free=False, scale_range=ASSUMED_SCALE_RANGE)
    # no more than the timed step grew from one sequence to four, per sequence
    assert 0.0 <= c.overhead_per_seq_s <= (spec[2].seconds_per_step - spec[0].seconds_per_step) / 3
    t_base, t_verify, t_draft = parts(4, 4.0, 204.25)
    shifted = c.base_offset_s + 3 * c.base_per_seq_s
    f = spec[2].drafted_fraction
    again = f * (t_verify + shifted + c.draft_scale * t_draft) + (1 - f) * (t_base + shifted) + c.step_overhead_s \
        + 3 * c.overhead_per_seq_s
    assert again == pytest.approx(spec[2].seconds_per_step, rel=0.05)  # the batched timing is met again
    assert spec[0].sequences == 1.0
    # the scale held at its floor, and the step alone is still given back: the overhead takes the rest
    assert c.draft_scale == pytest.approx(ASSUMED_SCALE_RANGE[0])
    t_base, t_verify, t_draft = parts(1, 1.0, 247.7)
    alone = t_verify + c.base_offset_s + c.draft_scale * t_draft + c.step_overhead_s
    assert alone == pytest.approx(spec[0].seconds_per_step, rel=1e-3)


def test_a_step_alone_under_the_scale_floor_is_still_given_back():
    """A self-draft timed at one k (CI on 756c592): its step alone came in 1.2% under the profile's
    verification plus its passes at the scale's floor, and with no overhead beside the scale the fit
    left it unmet — the concurrency-1 prediction 1.2% off the very step it divides by. The scale stays
    at its floor; a step overhead of either sign takes the rest, and the batched timing is still met."""
    def parts(k, seqs=1.0, context=None):
        # baseline, verification of k+1 tokens, and k draft passes (the target's own step)
        return 0.050 + 0.004 * (seqs - 1), 0.052 + 0.005 * (seqs - 1), k * 0.050

    base = [SpecStepTiming(0, 0.060, 0.0, 300, 3, 0.1), SpecStepTiming(0, 0.075, 0.0, 100, 3, 0.1, batch=4)]
    # alone: 0.052 + offset 0.010 + 0.25·0.050 = 74.5 ms at the floor; timed 72 ms
    spec = [SpecStepTiming(1, 0.072, 1.0, 200, 3, 0.1), SpecStepTiming(1, 0.110, 1.0, 80, 3, 0.1, batch=4)]
    c = served_correction(base, spec, parts, model_free=False)
    assert c.draft_scale == pytest.approx(0.25)
    assert c.step_overhead_s == pytest.approx(-0.0025, abs=1e-6)
    assert 0.052 + c.base_offset_s + c.draft_scale * 0.050 + c.step_overhead_s == pytest.approx(0.072, rel=1e-6)
    shifted = c.base_offset_s + 3 * c.base_per_seq_s
    batched = 0.052 + 0.015 + shifted + c.draft_scale * 0.050 + c.step_overhead_s + 3 * c.overhead_per_seq_s
    assert batched == pytest.approx(0.110, rel=1e-6)
    # within the bounds the scale alone meets it and no overhead appears
    spec_within = [SpecStepTiming(1, 0.090, 1.0, 200, 3, 0.1), spec[1]]
    c = served_correction(base, spec_within, parts, model_free=False)
    assert c.draft_scale == pytest.approx(0.56) and c.step_overhead_s == 0.0


def test_the_steps_timed_alone_are_given_back_at_their_context_and_moved_to_the_studys():
    """A self-draft and the baseline timed on prompts shorter than the study's (150 tokens against
    219, as in a CI run whose prediction stood 1.5% off the timing's ratio): the corrected model gives
    both steps back at 150, and at 219 the profile's context terms move them apart; the concurrency-1
    prediction is the timing's ratio times that move, not the ratio itself."""
    from draftfit.costmodel import (
        MeasuredStepTime,
        ModelDraftCost,
        OffsetStepTime,
        ScaledDraftCost,
        predict_costs,
    )
    from draftfit.hardware import StepProfile
    from draftfit.spec_timing import replay_alone

    target = MeasuredStepTime(StepProfile(a=0.040, b=4e-4, c=1e-5, d=2e-5))
    draft = ModelDraftCost(target)
    timed_context, study_context = 150.0, 219.0

    def parts(k, seqs=1.0, context=None):
        p = predict_costs(target, draft, [max(k, 1)], [1.0], concurrency=[1], context_len=context or study_context)
        return float(p.t_base[0]), float(p.t_verify[0, 0]), float(p.t_draft[0, 0])

    base = [SpecStepTiming(0, 0.062, 0.0, 300, 3, 0.1, context_len=timed_context)]
    spec = [SpecStepTiming(1, 0.117, 1.0, 200, 3, 0.1, context_len=timed_context)]
    c = served_correction(base, spec, parts, model_free=False)
    served, proposer = OffsetStepTime(target, c.base_offset_s), ScaledDraftCost(draft, c.draft_scale)

    def modelled(k, fraction, context):
        p = predict_costs(served, proposer, [max(k, 1)], [1.0], concurrency=[1], context_len=context,
                          draft_fraction=[fraction], **c.cost_terms())
        return float(p.t_spec[0, 0] if k else p.t_base[0])

    plain, alone = replay_alone(base, spec, modelled, study_context)
    assert (plain.k, alone.k) == (0, 1)
    for step, timing in ((plain, base[0]), (alone, spec[0])):
        assert step.context_len == timed_context and step.study_context_len == study_context
        assert step.modelled_s == pytest.approx(timing.seconds_per_step, rel=1e-3)
        assert step.at_study_context_s > step.modelled_s  # longer contexts cost more
    # the self-draft's step holds two target passes' context terms, the plain step one
    moved = (plain.at_study_context_s / plain.modelled_s) / (alone.at_study_context_s / alone.modelled_s)
    assert moved < 0.99
    speedup = float(predict_costs(served, proposer, [1], [2.0], concurrency=[1], context_len=study_context,
                                  **c.cost_terms()).speedup[0, 0])
    assert speedup == pytest.approx(2.0 * 0.062 / 0.117 * moved, rel=1e-3)
    assert speedup != pytest.approx(2.0 * 0.062 / 0.117, rel=0.01)
    # a batched timing is not replayed: alone is what the concurrency-1 predictions divide by
    batched = SpecStepTiming(1, 0.2, 1.0, 80, 3, 0.1, batch=4, context_len=timed_context)
    assert [r.k for r in replay_alone(base, [*spec, batched], modelled, study_context)] == [0, 1]

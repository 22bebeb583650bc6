"""EAGLE-3 offline: the batched chains and their walk against a plain proposer loop, the checkpoint
format, the head checks, and (slow) a head trained here against vLLM's own counters."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from reference_eagle import Proposer

from draftfit.acceptance_walk import predict_chains
from draftfit.compat.heads import check_head
from draftfit.eagle_head import Eagle3Head, HeadConfig, read_config
from draftfit.engines.base import Trajectory

VOCAB, DRAFT_VOCAB, H = 24, 16, 16


def tiny_head(seed: int, *, norm_before_residual: bool = True, reduced: bool = True) -> Eagle3Head:
    config = HeadConfig(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=4, intermediate_size=32, rms_norm_eps=1e-6,
                        rope_theta=10000.0, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB if reduced else VOCAB,
                        target_hidden_size=H, aux_layer_ids=(0, 1, 2), max_position_embeddings=512,
                        norm_before_residual=norm_before_residual)
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(VOCAB, H, generator=g)
    d2t = None
    if reduced:  # draft ids map to every other target id from 3 on: a real offset table
        keep = torch.arange(DRAFT_VOCAB) + torch.clamp(torch.arange(DRAFT_VOCAB) - 4, min=0) // 2
        d2t = keep - torch.arange(DRAFT_VOCAB)
    head = Eagle3Head.init(config, embed, 3, seed=seed, d2t=d2t)
    with torch.no_grad():
        for value in head.t.values():  # large weights: a peaked argmax, so drafts are not noise
            value.mul_(5.0 if value.dim() == 2 else 1.0)
            value.requires_grad_(False)
    return head


def sequence_following(head: Eagle3Head, prompt_len: int, length: int, follow: float, rng,
                       width: int = 3 * H) -> tuple[np.ndarray, torch.Tensor]:
    """A sequence whose response takes the head's first-pass prediction with probability ``follow``
    (so chains are accepted now and then), with random target states ``width`` wide."""
    seq = list(rng.integers(0, VOCAB, prompt_len + 1))
    aux = torch.as_tensor(rng.normal(size=(length, width)), dtype=torch.float32)
    while len(seq) < length:
        s = torch.as_tensor(seq, dtype=torch.long)
        out, _, _, _ = head.prefix_pass(s, head.fuse(aux[: len(seq) - 1]))
        guess = int(head.to_target(head.logits(out[-1]).argmax()))
        seq.append(guess if rng.random() < follow else int(rng.integers(0, VOCAB)))
    return np.asarray(seq), aux


def trajectory(seq: np.ndarray, prompt_len: int) -> Trajectory:
    t = len(seq) - prompt_len
    return Trajectory(np.asarray(seq[:prompt_len], np.int32), np.asarray(seq[prompt_len:], np.int32), np.zeros(t, np.float32),
                      np.zeros((t, 1), np.int32), np.zeros((t, 1), np.float32), "length")


def walk_equals_the_proposer_loop(head, proposer, seed: int, width: int) -> None:
    """Three requests whose answers follow the head now and then: the walk over the batched chains
    gives what ``proposer`` (a reference_eagle class) counts, request by request, for k = 1–4."""
    rng = np.random.default_rng(seed)
    n_stop, ks, look_ahead = 14, [1, 2, 3, 4], 4
    trajs, chains, reference = [], [], {k: np.zeros(3) for k in ks}
    for prompt_len in (3, 6, 9):
        seq, aux = sequence_following(head, prompt_len, prompt_len + n_stop + look_ahead, 0.6, rng, width)
        trajs.append(trajectory(seq, prompt_len))
        chains.append(head.greedy_chains(seq, aux, prompt_len - 1, prompt_len + n_stop - 3, max(ks)))
        fused = head.fuse(aux).detach()
        for k in ks:
            reference[k] += proposer(head).run(seq, fused, prompt_len, k, n_stop)
    walked = predict_chains(trajs, chains, ks, max_tokens=n_stop)
    assert walked.exact
    for k in ks:
        counts = walked.lower.counts(k)
        got = (counts.num_drafts, counts.num_draft_tokens, counts.num_accepted_tokens)
        assert np.allclose(got, reference[k]), (k, got, reference[k])
    assert reference[3][2] > 0  # the check can fail: drafts are accepted


def every_chain_equals_the_proposers(head, proposer, seed: int, width: int = 3 * H) -> None:
    """``head.greedy_chains`` from every start equals ``proposer`` (a reference_eagle class) run from a
    fresh cache there, token for token, on a sequence the head does not follow."""
    rng = np.random.default_rng(seed)
    prompt_len, length, k = 4, 16, 4
    seq, aux = sequence_following(head, prompt_len, length, 0.0, rng, width)
    fused = head.fuse(aux).detach()
    first, last = prompt_len - 1, length - 3
    chains = head.greedy_chains(seq, aux, first, last, k)
    reference = np.array([proposer(head).chain(seq, fused, a, k) for a in range(first, last + 1)])
    np.testing.assert_array_equal(chains, reference)
    assert len({tuple(r) for r in reference.tolist()}) > 3  # the chains differ from start to start


@pytest.mark.parametrize("seed, norm_before_residual, reduced", [(0, True, True), (1, False, True), (2, True, False)])
def test_batched_chains_and_walk_equal_the_proposer_loop(seed, norm_before_residual, reduced):
    head = tiny_head(seed, norm_before_residual=norm_before_residual, reduced=reduced)
    walk_equals_the_proposer_loop(head, Proposer, seed, 3 * H)


@pytest.mark.parametrize("seed, norm_before_residual", [(0, True), (1, False)])
def test_every_chain_equals_the_proposers_token_for_token(seed, norm_before_residual):
    every_chain_equals_the_proposers(tiny_head(seed, norm_before_residual=norm_before_residual), Proposer, seed)


def test_chains_by_hand():
    """A proposer that always drafts the truth: every draft accepted; the last step overshoots the stop."""
    seq = np.arange(30)
    prompt_len, n_stop, k = 5, 10, 3
    traj = trajectory(seq, prompt_len)
    response = seq[prompt_len:]
    chain = np.stack([response[s : s + k] for s in range(1, n_stop)])
    walked = predict_chains([traj], [chain], [k], max_tokens=n_stop)
    c = walked.lower.counts(k)
    # steps start at 1, 5, 9: three drafts, nine draft tokens, all accepted
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (3, 9, 9)
    wrong = chain + 100
    c = predict_chains([traj], [wrong], [k], max_tokens=n_stop).lower.counts(k)
    assert (c.num_drafts, c.num_accepted_tokens) == (9, 0)


def test_saved_head_reads_back_in_speculators_format(tmp_path):
    head = tiny_head(3)
    head.save(tmp_path, verifier="tiny", target_layers=4)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["speculators_model_type"] == "eagle3" and raw["draft_vocab_size"] == DRAFT_VOCAB
    config, _ = read_config(tmp_path)
    assert config.speculators_format and config.norm_before_residual and config.aux_layer_ids == (0, 1, 2)
    # no embeddings in the checkpoint: vLLM shares the target's, and so must the loader
    with pytest.raises(Exception, match="embed_tokens"):
        Eagle3Head.load(tmp_path, None)
    from safetensors.torch import save_file

    target = tmp_path / "target"
    target.mkdir()
    save_file({"model.embed_tokens.weight": head.embed.contiguous()}, str(target / "model.safetensors"))
    back = Eagle3Head.load(tmp_path, target)
    assert torch.equal(back.embed, head.embed) and torch.equal(back.d2t, head.d2t)
    for name, value in head.t.items():  # written in bfloat16, as vLLM serves it
        assert torch.allclose(back.t[name], value.to(torch.bfloat16).float()), name


def _target_config():
    return {"hidden_size": H, "num_hidden_layers": 4, "vocab_size": VOCAB, "max_position_embeddings": 512}


def test_check_head_refuses_a_reduced_vocabulary_without_d2t(tmp_path):
    head = tiny_head(4)
    head.save(tmp_path, verifier="tiny", target_layers=4)
    assert check_head("eagle3", tmp_path, _target_config(), [3], 512)["verdict"] == "compatible"
    from safetensors.torch import load_file, save_file

    weights = load_file(str(tmp_path / "model.safetensors"))
    weights.pop("d2t")
    save_file(weights, str(tmp_path / "model.safetensors"))
    report = check_head("eagle3", tmp_path, _target_config(), [3], 512)
    assert report["verdict"] == "incompatible" and "no d2t mapping" in report["summary"]


def test_check_head_refuses_another_targets_head(tmp_path):
    tiny_head(5).save(tmp_path, verifier="tiny", target_layers=4)
    report = check_head("eagle3", tmp_path, {**_target_config(), "hidden_size": 2 * H}, [3], 512)
    assert report["verdict"] == "incompatible" and "hidden size" in report["summary"]
    report = check_head("eagle3", tmp_path, {**_target_config(), "num_hidden_layers": 1}, [3], 512)
    assert report["verdict"] == "incompatible" and "auxiliary layers" in report["summary"]


def test_check_head_notes_vllms_max_position_override(tmp_path):
    tiny_head(6).save(tmp_path, verifier="tiny", target_layers=4)
    report = check_head("eagle3", tmp_path, _target_config(), [3], 4096)
    assert report["verdict"] == "compatible"
    assert any("Overriding draft model max_position_embeddings from 512" in f["message"] for f in report["findings"])


@pytest.mark.parametrize("layers, ks, ok", [(1, [1, 2, 5], True), (2, [1, 2, 4], True), (2, [3], False), (3, [2, 4], False)])
def test_check_mtp_k_divisible_by_its_layers(layers, ks, ok):
    report = check_head("mtp", None, {**_target_config(), "num_nextn_predict_layers": layers}, ks, 512)
    assert (report["verdict"] == "compatible") == ok
    if not ok:
        assert f"must be divisible by n_predict={layers}" in report["summary"]


def test_mtp_needs_mtp_layers():
    assert check_head("mtp", None, _target_config(), [1], 512)["verdict"] == "incompatible"


# --- a head trained here, against vLLM's own counters ---------------------------------------------

MAX_TOKENS, K, HELD_OUT = 48, 3, 12
SMALL_KV = 0.15
AL_TOLERANCE_T0 = 0.03  # the tolerance at temperature 0
# The floor: a head with real acceptance, so the agreement check can fail. The recipe's
# learning rate and this session's sizing were chosen on 30 demo prompts that are neither trained on
# nor among the held-back ones here (validation AL at k=3: 1.32 with 120 prompts x 5 epochs, 1.36
# with 240 x 4); on the held-back prompts that sizing reached 1.33 (bfloat16 training states). The
# MTP layer's AL there moved with the recipe's seed more than with its softmax: 1.346 (seed 0) and
# 1.296 (seed 1) over the whole vocabulary, 1.333 and 1.296 sampled (the default, half the time),
# trained on the normed last state; on the state vLLM hands it (before the final norm), 1.357 (seed 0, sampled).
AL_FLOOR = 1.3
CI_RECIPE = {"max_tokens": 64, "epochs": 4, "draft_vocab": 4096, "max_prompt_tokens": 384}
TRAINING_PROMPTS = 240


def train_in_session(methods: tuple[str, ...], smollm2_ref, smollm2_meta, smollm2_model, engine_slot):
    """Small heads of ``methods`` trained in the test session on demo prompts (one target pass for
    all of them), and the held-back prompts' answers: method → (head, answers)."""
    pytest.importorskip("vllm")
    from contextlib import nullcontext

    from draftfit.candidates import StudySettings
    from draftfit.engines import EngineConfig, SamplingSpec
    from draftfit.engines.vllm_engine import VLLMEngine
    from draftfit.prompts.sampling import study_prompts
    from draftfit.train_head import HeadRecipe, train_heads, training_prompts
    from draftfit.trajectories import target_trajectories

    def target(ref):  # started only where the answers are not cached
        return nullcontext(engine_slot.acquire(("smollm2", "float32"), lambda: VLLMEngine(
            smollm2_model, dtype="float32", max_model_len=1024, progress=False)))

    study = StudySettings(sample_size=HELD_OUT, max_tokens=MAX_TOKENS, max_model_len=1024)
    held = [item for item in study_prompts(study, smollm2_meta).items]
    prompts = training_prompts(study, smollm2_meta, [item.id for item in held])[1][:TRAINING_PROMPTS]
    config = EngineConfig(dtype="float32", max_model_len=1024)
    heads = train_heads(smollm2_ref, prompts, HeadRecipe(**CI_RECIPE), methods=methods, engine_config=config,
                        engine_factory=target)
    trajset = target_trajectories(smollm2_ref, [item.input_ids for item in held], SamplingSpec(0.0, 1.0, MAX_TOKENS + K, 0),
                                  engine_config=config, top_k=1, engine_factory=target)
    assert not set(map(tuple, prompts)) & {tuple(item.input_ids) for item in held}  # held back from training
    return {method: (head, trajset) for method, head in heads.items()}


def predicted_and_vllms_al(method: str, trained, smollm2_model, engine_slot) -> tuple[float, float]:
    """The head's predicted AL at k=K on the held-back prompts, and vLLM's counters' running it."""
    from draftfit.acceptance_walk import stop_positions, summarize
    from draftfit.eagle_head import head_chains
    from draftfit.engines import SamplingSpec
    from draftfit.engines.vllm_engine import run_speculative

    head, trajset = trained
    stops = stop_positions(trajset, MAX_TOKENS)
    chains = head_chains(trajset, head.path, smollm2_model, head.path.name, K, stops, method=method)
    predicted = summarize(predict_chains(trajset, chains, [K], max_tokens=MAX_TOKENS), K)
    engine_slot.release()  # the speculative run starts an engine of its own
    # an MTP layer is served inside its target (the checkpoint written with it), a head beside it
    served, config = ((head.path, {"method": method, "num_speculative_tokens": K}) if method == "mtp" else
                      (smollm2_model, {"method": method, "model": str(head.path), "num_speculative_tokens": K}))
    run = run_speculative(served, [t.prompt_token_ids.tolist() for t in trajset.trajectories],
                          SamplingSpec(0.0, 1.0, MAX_TOKENS, 0), config,
                          dtype="float32", max_model_len=1024, gpu_memory_utilization=SMALL_KV, progress=False)
    # greedy verification: the served target answers as the target did (so the counters are of the same answers)
    assert all(list(out) == t.token_ids[: len(out)].tolist() for out, t in zip(run.output_token_ids, trajset.trajectories, strict=True))
    truth = run.counters.mean_acceptance_length
    print(f"{method} head, held-back prompts, k={K}: predicted AL {predicted.point:.4f}, vLLM {truth:.4f}")
    return predicted.point, truth


# EAGLE (EAGLE-1) is not here: heads the recipe trained at its earlier learning rate reached AL 1.005
# and 1.009 on these prompts (vLLM's counters agreed to the fourth decimal both times)
@pytest.fixture(scope="module")
def trained_heads(smollm2_ref, smollm2_meta, smollm2_model, engine_slot):
    """An EAGLE-3 head and an MTP layer (written into a copy of the target) trained on the demo
    prompts the held-back ones are not among, on one pass of the target."""
    return train_in_session(("eagle3", "mtp"), smollm2_ref, smollm2_meta, smollm2_model, engine_slot)


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_trained_head_predicted_al_matches_vllms_counters(method, trained_heads, smollm2_model, engine_slot):
    predicted, truth = predicted_and_vllms_al(method, trained_heads[method], smollm2_model, engine_slot)
    assert predicted >= AL_FLOOR, f"the {method} head trained here reached AL {predicted:.3f} < {AL_FLOOR}"
    assert abs(predicted - truth) <= AL_TOLERANCE_T0 * truth

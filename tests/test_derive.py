"""Derived drafts: the target's first N layers, made once, loadable by transformers and vLLM."""

from __future__ import annotations

import json

import numpy as np
import pytest

from draftfit.derive import first_layers, read_header
from draftfit.errors import DraftfitError
from draftfit.refs import resolve

LAYERS = 4


def _tiny_model(root, *, shards: int = 1, tie: bool = True):
    """A Llama-shaped checkpoint with 4 layers (float32 and float16 tensors), optionally sharded."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors = {"model.embed_tokens.weight": rng.standard_normal((11, 4)).astype(np.float32)}
    for i in range(LAYERS):
        tensors[f"model.layers.{i}.self_attn.q_proj.weight"] = rng.standard_normal((4, 4)).astype(np.float16)
        tensors[f"model.layers.{i}.input_layernorm.weight"] = rng.standard_normal(4).astype(np.float32)
    tensors["model.norm.weight"] = rng.standard_normal(4).astype(np.float32)
    if not tie:
        tensors["lm_head.weight"] = rng.standard_normal((11, 4)).astype(np.float32)
    root.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    else:
        groups = np.array_split(np.array(names, dtype=object), shards)
        weight_map = {}
        for s, group in enumerate(groups, start=1):
            file = f"model-{s:05d}-of-{shards:05d}.safetensors"
            save_file({n: tensors[n] for n in group}, str(root / file))
            weight_map.update({n: file for n in group})
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": LAYERS,
        "layer_types": ["full_attention"] * LAYERS,
        "tie_word_embeddings": tie,
        "vocab_size": 11,
    }
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text("{}")
    return root, tensors


@pytest.mark.parametrize("shards, tie", [(1, True), (1, False), (3, True)])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_first_layers_keeps_embeddings_first_n_layers_norm_and_head(tmp_path, shards, tie, n):
    from safetensors.numpy import load_file

    source, tensors = _tiny_model(tmp_path / "target", shards=shards, tie=tie)
    draft = first_layers(resolve(str(source)), n)
    loaded = {}
    for file in sorted(draft.path.glob("*.safetensors")):
        loaded.update(load_file(str(file)))
    expected = {
        name for name in tensors
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < n
    }
    assert set(loaded) == expected
    for name in expected:  # byte for byte, dtype kept
        assert loaded[name].dtype == tensors[name].dtype
        np.testing.assert_array_equal(loaded[name], tensors[name])
    config = json.loads((draft.path / "config.json").read_text())
    assert config["num_hidden_layers"] == n and config["layer_types"] == ["full_attention"] * n
    assert config["tie_word_embeddings"] is tie
    assert (draft.path / "tokenizer.json").is_file()
    assert draft.n_layers == n and draft.target_layers == LAYERS and draft.tensors == len(expected)
    if shards > 1:
        index = json.loads((draft.path / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == expected
        assert all((draft.path / f).is_file() for f in index["weight_map"].values())
    for file in draft.path.glob("*.safetensors"):
        header, start = read_header(file)
        assert start % 8 == 0  # header padded as safetensors writers do


def test_first_layers_is_made_once_and_keyed_by_target_and_n(tmp_path):
    source, _ = _tiny_model(tmp_path / "target")
    ref = resolve(str(source))
    first = first_layers(ref, 2)
    stamp = (first.path / "model.safetensors").stat().st_mtime_ns
    again = first_layers(ref, 2)
    assert again.path == first.path and (again.path / "model.safetensors").stat().st_mtime_ns == stamp
    assert first_layers(ref, 3).path != first.path
    assert first.path.name.startswith(first.target_fingerprint) and first.path.name.endswith("-first2")
    assert not [p for p in first.path.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


@pytest.mark.parametrize("n", [0, LAYERS, LAYERS + 3, -1])
def test_first_layers_rejects_impossible_n(tmp_path, n):
    source, _ = _tiny_model(tmp_path / "target")
    with pytest.raises(DraftfitError, match=rf"first-layers draft needs 1 <= N < {LAYERS} .*got {n}\. Pick N between 1 and {LAYERS - 1}"):
        first_layers(resolve(str(source)), n)


def test_first_layers_needs_safetensors(tmp_path):
    root = tmp_path / "target"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    (root / "pytorch_model.bin").write_bytes(b"\0")
    with pytest.raises(DraftfitError, match="no safetensors weights"):
        first_layers(resolve(str(root)), 2)


@pytest.mark.slow
def test_smollm2_first_layers_is_the_target_exiting_early(smollm2_ref, smollm2_prompts):
    """transformers loads the derived draft, and its logits are the target's norm + head applied
    to the target's hidden state after layer N."""
    torch = pytest.importorskip("torch")
    from draftfit.engines.hf_engine import HFEngine

    n = 6
    draft = first_layers(smollm2_ref, n)
    ids = torch.tensor([smollm2_prompts[0]])
    with HFEngine(draft.path, dtype="float32", progress=False) as small:
        assert small.model.config.num_hidden_layers == n
        with torch.inference_mode():
            got = small.model(input_ids=ids).logits[0]
    from draftfit.refs import model_dir

    with HFEngine(model_dir(smollm2_ref), dtype="float32", progress=False) as full:
        with torch.inference_mode():
            hidden = full.model(input_ids=ids, output_hidden_states=True).hidden_states[n]
            expected = full.model.lm_head(full.model.model.norm(hidden))[0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def _greedy_walk(matches: np.ndarray, k: int) -> tuple[int, int, list[int]]:
    """Greedy speculative decoding over one answer: drafts, draft tokens, accepted per position.

    The prefill emits answer token 0; every later step drafts k tokens starting at the first
    position not yet emitted, keeps the leading matches and emits one more token.
    """
    drafts, draft_tokens, per_pos = 0, 0, [0] * k
    s, T = 1, len(matches)
    while s < T:
        accepted = 0
        while accepted < k and s + accepted < T and matches[s + accepted]:
            accepted += 1
        drafts += 1
        draft_tokens += k
        for i in range(accepted):
            per_pos[i] += 1
        s += accepted + 1
    return drafts, draft_tokens, per_pos


@pytest.mark.slow
@pytest.mark.engine
def test_smollm2_first_layers_runs_as_a_vllm_draft(engine_slot, smollm2_model, smollm2_ref, smollm2_prompts, hf_smollm2):
    """vLLM loads the derived draft and speculates with it; its counters match a greedy walk over
    the same answers with the draft's argmax from a transformers prefill (measured vs exact)."""
    from draftfit.engines import SamplingSpec
    from draftfit.engines.hf_engine import HFEngine
    from draftfit.engines.vllm_engine import run_speculative
    from draftfit.methods.draft_model import draft_model_config

    draft = first_layers(smollm2_ref, 10)
    k = 2
    engine_slot.release()  # one vLLM engine at a time
    run = run_speculative(
        smollm2_model,
        smollm2_prompts[:3],
        SamplingSpec(0.0, 1.0, 24, 0),
        draft_model_config(draft.path, k),
        dtype="float32",
        max_model_len=1024,
        progress=False,
    )
    c = run.counters
    assert run.info.options["speculative_config"]["model"] == str(draft.path)
    assert c.num_drafts > 0 and 0 <= c.num_accepted_tokens <= c.num_draft_tokens == k * c.num_drafts
    # greedy speculation keeps the target's output: compare with the target alone (transformers)
    plain = hf_smollm2.generate_trajectories(smollm2_prompts[:3], SamplingSpec(0.0, 1.0, 24, 0), 2)
    same = sum(int(np.array_equal(a, t.token_ids)) for a, t in zip(run.output_token_ids, plain, strict=True))
    assert same >= 2
    with HFEngine(draft.path, dtype="float32", progress=False) as small:
        sequences = [np.concatenate([np.asarray(p, np.int32), out]) for p, out in zip(smollm2_prompts[:3], run.output_token_ids, strict=True)]
        scores = small.score(sequences, [len(p) for p in smollm2_prompts[:3]], 1)
    walked = [_greedy_walk(s.top_ids[:, 0] == out, k) for s, out in zip(scores, run.output_token_ids, strict=True)]
    predicted_drafts = sum(w[0] for w in walked)
    predicted_accepted = sum(sum(w[2]) for w in walked)
    assert abs(predicted_drafts - c.num_drafts) <= 0.1 * c.num_drafts + 2
    assert abs(predicted_accepted - c.num_accepted_tokens) <= 0.1 * c.num_accepted_tokens + 2

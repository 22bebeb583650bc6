"""`draftfit pad-vocab`: the padded copy keeps greedy output and passes vLLM's vocab_size gate."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from draftfit.cli import cli

TARGET_VOCAB = 49152 + 128


@pytest.fixture(scope="module")
def padded(smollm2_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("padded") / "smollm2-padded"
    result = CliRunner().invoke(cli, ["pad-vocab", "smollm2", "--to", str(TARGET_VOCAB), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"49152 -> {TARGET_VOCAB}" in result.output
    return out


@pytest.mark.slow
def test_padded_config_and_rows(padded):
    from safetensors import safe_open

    assert json.loads((padded / "config.json").read_text())["vocab_size"] == TARGET_VOCAB
    with safe_open(str(padded / "model.safetensors"), "pt") as f:
        rows = f.get_slice("model.embed_tokens.weight").get_shape()[0]
    assert rows == TARGET_VOCAB
    assert (padded / "tokenizer.json").is_file()


@pytest.mark.slow
def test_padded_model_gives_the_same_greedy_output(smollm2_model, padded):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_model))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three primary colours."}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True,
    )
    outputs = []
    for directory in (smollm2_model, padded):
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
        with torch.no_grad():
            generated = model.generate(**prompt, max_new_tokens=16, do_sample=False)
            logits = model(**prompt).logits[0, -1]
        outputs.append(generated[0].tolist())
        if directory == padded:
            assert logits.shape[0] == TARGET_VOCAB
            # the new rows tie with the copied token; argmax picks the smaller, real id
            assert int(logits.argmax()) < 49152
            assert torch.equal(logits[49152:], logits[0].expand(128))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize(
    "to, words",
    [
        ("100", ["--to 100 is below the tokenizer's length 49152", "Use --to 49152 or more"]),
        ("49152", ["already has vocab_size 49152", "Nothing to pad"]),
    ],
)
@pytest.mark.slow
def test_pad_vocab_refuses(smollm2_model, tmp_path, to, words):
    result = CliRunner().invoke(cli, ["pad-vocab", "smollm2", "--to", to, "-o", str(tmp_path / "x")])
    assert result.exit_code == 2
    for word in words:
        assert word in result.output
    assert "Traceback" not in result.output
    assert result.output.startswith("Error: smollm2: ")  # the reference typed, not the cache path


def test_pad_vocab_checks_the_sizes_before_converting_weights(smollm2_meta, tmp_path, monkeypatch):
    from draftfit import padvocab

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were converted before the sizes were checked")

    monkeypatch.setattr(padvocab, "model_dir", no_weights)
    result = CliRunner().invoke(cli, ["pad-vocab", "smollm2", "--to", "100", "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "Error: smollm2: --to 100 is below the tokenizer's length 49152" in result.output


def test_pad_vocab_requires_to(tmp_path):
    result = CliRunner().invoke(cli, ["pad-vocab", "smollm2", "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--to" in result.output


@pytest.mark.slow
def test_pad_vocab_refuses_non_empty_output(smollm2_model, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    result = CliRunner().invoke(cli, ["pad-vocab", "smollm2", "--to", str(TARGET_VOCAB), "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "not empty" in result.output and "--force" in result.output
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"


@pytest.mark.slow
def test_check_passes_the_vllm_gate_after_padding(smollm2_meta, padded, tmp_path):
    """A target with padded embeddings (the Qwen2.5-72B case): the unpadded draft is refused,
    `check` names pad-vocab as the fix, and the padded copy passes."""
    import shutil

    target = tmp_path / "padded-target"
    shutil.copytree(smollm2_meta, target)
    config = json.loads((target / "config.json").read_text())
    config["vocab_size"] = TARGET_VOCAB
    (target / "config.json").write_text(json.dumps(config))

    before = CliRunner().invoke(cli, ["check", str(target), "smollm2"])
    assert before.exit_code == 1, before.output
    assert "Target and draft model should have the same vocabulary size" in before.output
    assert f"draftfit pad-vocab smollm2 --to {TARGET_VOCAB}" in before.output

    after = CliRunner().invoke(cli, ["check", str(target), str(padded), "--json"])
    assert after.exit_code == 0, after.output
    assert json.loads(after.output)["engines"]["vllm"]["verdict"] == "compatible"

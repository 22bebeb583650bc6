"""Every command, fed one malformed file or option at a time (hypothesis draws which, and what):
exit 2, one `Error:` line without "unexpected", no engine reached, and no file changed outside the
folder the command was told to write to (every other file checksummed before and after).

Each case starts from arguments that are valid and breaks exactly one of them, so exit 2 is the
only right answer."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
import tokfactory as tf
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bad_input import _laughs, no_engines  # noqa: F401 - the engine tripwire fixture

from draftfit.cli import cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "reports" / "example"
DEAD_URL = "http://127.0.0.1:9"  # nothing listens on the discard port here

# --- malformed content -------------------------------------------------------------------------

BAD_TEXT = [b"", b"\x00\xff" * 64, b"[1, 2]", b"<html><body>login</body></html>", "café".encode("latin-1"),
            ("seed: " + _laughs() + "\n").encode(), b"{", b"null", b"\xef\xbb\xbf{\"a\": }", b"- - - -\n"]
contents = st.one_of(st.sampled_from(BAD_TEXT), st.binary(max_size=300).map(lambda b: b"\x00" + b))
BAD_CONFIG = [b'{"vocab_size": "lots"}', b'{"hidden_size": -5}', b'{"num_hidden_layers": 1e400}',
              b'{"num_attention_heads": 0}', b'{"vocab_size": true}', b'{"model_type": ["llama"]}']
config_contents = st.one_of(contents, st.sampled_from(BAD_CONFIG))
BAD_RESULTS = [b'{"schema_version": "2"}', b'{"schema_version": 99}', b'{"schema_version": 2, "configs": "x"}',
               b'{"schema_version": 2.5}', b"[]"]
results_contents = st.one_of(contents, st.sampled_from(BAD_RESULTS))
BAD_CANDIDATES = [b"name: c\ntarget: smollm2\ndraft: {method: ngram}\nk: [0]\n",
                  b"name: c\ntarget: smollm2\ndraft: {method: ngram}\nk: [2]\nstudy: {concurrency: [0]}\n",
                  b"name: c\ntarget: smollm2\ndraft: {method: warp}\nk: [2]\n",
                  b"name: c\ntarget: ../../nowhere\ndraft: {method: ngram}\nk: [2]\n",
                  b"name: c\ntarget: smollm2\ndraft: {method: ngram}\nk: [2]\nstudy: {seed: 1e999}\n"]
candidate_contents = st.one_of(contents, st.sampled_from(BAD_CANDIDATES))

# --- the commands: valid arguments, and the ways to break one -----------------------------------
# ``{name}`` is a path of the world below; a file slot replaces that file's content, an option slot
# replaces (or adds) the option's value.

CANDIDATE = "name: ng\ntarget: smollm2\ndraft: {method: ngram, prompt_lookup_min: 2, prompt_lookup_max: 3}\nk: [2]\n"
PROMPTS = "".join(f'{{"prompt": "question {i}: what is {i} + {i}?"}}\n' for i in range(6))

COMMANDS: dict[str, dict] = {
    "rank": {
        "args": ["rank", "{cand}", "--prompts", "{prompts}", "--sample-size", "4", "--max-tokens", "8",
                 "--max-model-len", "256", "--reports-dir", "{out}", "--run-id", "r"],
        "files": {"cand": candidate_contents, "prompts": contents},
        "options": {"--sample-size": ["0", "-3", "many", "1e3"], "--max-tokens": ["0", "-1", "x"],
                    "--max-model-len": ["8", "-1", "lots"], "--concurrency": ["0", "a", "-4", "1,,2", "1,1e9999"],
                    "--run-id": ["../x", "/abs", "a/b", "..", ""], "--gpu": ["Z9000"], "--temperature": ["-1", "hot"],
                    "--tensor-parallel-size": ["0", "2", "-1"], "--gpu-catalog": ["{nowhere}", "{bin}"],
                    "--study": ["{bin}", "{laughs}", "{nowhere}"], "--prompts": ["{nowhere}", "{bin}", "{model}"]},
    },
    "check": {
        "args": ["check", "{model}", "{model2}"],
        "files": {"model/config.json": config_contents, "model/tokenizer.json": contents},
        "options": {"--vllm-version": ["banana", "0.x", "-1"]},
    },
    "predict": {
        "args": ["predict", "{model}", "--gpu", "H100 SXM"],
        "files": {"model/config.json": config_contents},
        "options": {"--gpu": ["Z9000"], "--k": ["0", "1000", "x", "1,,2"], "--tensor-parallel-size": ["0", "3"],
                    "--input-len": ["0", "1000000000"], "--concurrency": ["0", "x", "-1"],
                    "--acceptance-rates": ["2,3", "x", "-0.5"], "--gpu-catalog": ["{bin}", "{laughs}"],
                    "--max-model-len": ["1", "100000000"], "--method": ["warp"]},
    },
    "report": {
        "args": ["report", "{results}", "-o", "{out}/report.html"],
        "files": {"results": results_contents},
        "options": {"-o": ["{results}", "{mine}", "{out}"]},
    },
    "verify": {
        "args": ["verify", "{results}", "--dry-run", "--top", "1"],
        "files": {"results": results_contents},
        "options": {"--top": ["0", "-1", "x"], "--config": ["nope:2", "x", ":3"], "--server": [DEAD_URL],
                    "--baseline-server": [DEAD_URL], "--rounds": ["0", "-2"], "--concurrency": ["0", "x"]},
    },
    "watch": {
        "args": ["watch", DEAD_URL, "--results", "{results}", "--duration", "0"],
        "files": {"results": results_contents},
        "options": {"--json": ["{results}", "{mine}"], "--interval": ["0", "-1", "x"], "--config": ["nope:2", "x"]},
    },
    "pad-vocab": {
        "args": ["pad-vocab", "{model}", "--to", "60000", "-o", "{out}/padded"],
        "files": {"model/config.json": config_contents},
        "options": {"--to": ["0", "-5", "10", "x"], "-o": ["{model}", "{model}/inside", "{mine_dir}", "{link}"]},
        "with_force": True,
    },
    "export": {
        "args": ["export", "{model}", "--first-layers", "1", "-o", "{out}/exported"],
        "files": {"model/config.json": config_contents},
        "options": {"--first-layers": ["0", "10000", "x"], "-o": ["{model}", "{model}/inside", "{mine_dir}", "{link}"]},
        "with_force": True,
    },
}


SHAPE = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
         "intermediate_size": 512, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def bpe() -> dict:
    return tf.train_bpe(600)


def world(root: Path, bpe: dict) -> dict[str, str]:
    """The user's files (all checksummed) and ``out``, the one folder commands may write to."""
    for name in ("model", "model2", "mine_dir"):
        if name != "mine_dir":
            tf.write_model_dir(root / name, bpe, config=SHAPE)
            (root / name / "model.safetensors").write_bytes(b"placeholder weights: never loaded here")
    (root / "mine_dir").mkdir()
    (root / "mine_dir" / "precious.txt").write_text("the user's own file")
    (root / "mine.html").write_text("<p>the user's notes</p>")
    (root / "link").symlink_to(root / "mine_dir")
    (root / "cand.yaml").write_text(CANDIDATE)
    (root / "prompts.jsonl").write_text(PROMPTS)
    (root / "bin").write_bytes(b"\x00\x01\xff" * 100)
    (root / "laughs.yaml").write_text("seed: " + _laughs() + "\n")
    shutil.copy(EXAMPLE / "results.json", root / "results.json")
    (root / "out").mkdir()
    return {"model": str(root / "model"), "model2": str(root / "model2"), "mine_dir": str(root / "mine_dir"),
            "mine": str(root / "mine.html"), "link": str(root / "link"), "cand": str(root / "cand.yaml"),
            "prompts": str(root / "prompts.jsonl"), "bin": str(root / "bin"), "laughs": str(root / "laughs.yaml"),
            "results": str(root / "results.json"), "out": str(root / "out"), "nowhere": str(root / "nowhere.yaml")}


def checksums(root: Path, skip: Path | None = None) -> dict[str, str]:
    found = {}
    for path in sorted(root.rglob("*")):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        if path.is_symlink():
            found[str(path)] = "-> " + str(path.readlink())
        elif path.is_file():
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def project_checksums() -> dict[str, str]:
    """The project's own files (tracked, and reports/), which no command run elsewhere may touch."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    paths = {ROOT / p.decode() for p in listed if p} | set((ROOT / "reports").rglob("*"))
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(paths) if p.is_file()}


def fill(text: str, names: dict[str, str]) -> str:
    for key, value in names.items():
        text = text.replace("{" + key + "}", value)
    return text


@st.composite
def breakages(draw):
    name = draw(st.sampled_from(sorted(COMMANDS)))
    spec = COMMANDS[name]
    slots = [("file", f) for f in spec["files"]] + [("option", o) for o in spec["options"]]
    kind, slot = draw(st.sampled_from(slots))
    value = draw(spec["files"][slot]) if kind == "file" else draw(st.sampled_from(spec["options"][slot]))
    force = spec.get("with_force", False) and draw(st.booleans())
    return name, kind, slot, value, force


def build_args(name: str, kind: str, slot: str, value, force: bool, names: dict[str, str], root: Path) -> list[str]:
    args = [fill(a, names) for a in COMMANDS[name]["args"]]
    if kind == "file":
        path = root / (slot if "/" in slot else Path(names[slot]).name)
        path.write_bytes(value)
    elif slot in args:
        args[args.index(slot) + 1] = fill(value, names)
    else:
        args += [slot, fill(value, names)]
    return args + (["--force"] if force else [])


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(case=breakages())
def test_one_malformed_input_is_one_line_and_changes_nothing_outside(case, bpe, tmp_path_factory, monkeypatch):
    name, kind, slot, value, force = case
    root = tmp_path_factory.mktemp("fuzz")
    names = world(root, bpe)
    monkeypatch.chdir(root / "out")
    args = build_args(name, kind, slot, value, force, names, root)
    user_files, project = checksums(root, skip=root / "out"), project_checksums()

    result = CliRunner().invoke(cli, args, env={"HF_HUB_OFFLINE": "1"})

    shown = f"{args}\n{result.output}"
    assert result.exit_code == 2, shown
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, shown
    assert not errors[0].startswith("Error: unexpected ") and "Traceback" not in result.output, shown
    assert checksums(root, skip=root / "out") == user_files, shown
    assert project_checksums() == project, shown
    assert not list((root / "out").iterdir()), f"{shown}\nwrote {list((root / 'out').rglob('*'))}"


@pytest.mark.parametrize("name", ["check", "predict", "report", "verify"])
def test_the_unbroken_arguments_are_valid(name, bpe, tmp_path, monkeypatch):
    """So that the exit 2 above comes from the one broken input, not from the arguments around it."""
    names = world(tmp_path, bpe)
    monkeypatch.chdir(tmp_path / "out")
    args = [fill(a, names) for a in COMMANDS[name]["args"]]
    result = CliRunner().invoke(cli, args, env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 0, f"{args}\n{result.output}"

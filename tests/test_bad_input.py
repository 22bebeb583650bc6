"""Bad input, through the command line: one line naming the file (and field or row) that ends with
the fix, exit code 2, no engine started and nothing written.

Every case runs `draftfit rank` / `report` / `verify` / `check` through click's CliRunner. An
autouse guard replaces the engine entry points with a tripwire, so a case that got past validation
fails loudly instead of loading a model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tokfactory as tf
from click.testing import CliRunner

from draftfit.cli import cli
from draftfit.prompts.loading import MAX_RECORD_BYTES

# --- the tripwire: no engine, no trajectories, no derived draft ---------------------------------


class EngineReached(Exception):
    """Raised by the guard: validation let a bad input through to the engines."""


@pytest.fixture(autouse=True)
def no_engines(monkeypatch):
    calls: list[str] = []

    def tripwire(name: str):
        def stop(*args, **kwargs):
            calls.append(name)
            raise EngineReached(f"{name} was called")
        return stop

    import draftfit.derive
    import draftfit.engines
    import draftfit.trajectories

    monkeypatch.setattr(draftfit.engines, "open_engine", tripwire("open_engine"))
    monkeypatch.setattr(draftfit.trajectories, "target_trajectories", tripwire("target_trajectories"))
    monkeypatch.setattr(draftfit.derive, "first_layers", tripwire("derive.first_layers"))
    yield calls
    assert calls == [], f"an engine step was reached: {calls}"


# --- model directories built with the `tokenizers` library ---------------------------------------


@pytest.fixture(scope="session")
def bpe() -> dict:
    return tf.train_bpe(600)


def model_dir(path: Path, bpe: dict, *, weights: bool = True, config: bool = True) -> Path:
    """A model directory; ``weights`` adds a weights file that only validation looks at (the
    engines are guarded and never read it)."""
    tf.write_model_dir(path, bpe)
    if weights:
        (path / "model.safetensors").write_bytes(b"placeholder: never loaded in these tests")
    if not config:
        (path / "config.json").unlink()
    return path


# --- the matrix -------------------------------------------------------------------------------


@dataclass
class Case:
    """``args`` of the command (strings; ``{...}`` names filled from ``files``), the files the case
    writes, and the texts the one-line error must contain, in this order: where, what, fix."""

    args: list[str]
    expect: list[str]
    files: dict[str, str | bytes | Callable[[Path], object]] = field(default_factory=dict)


def candidate(target: str = "{target}", draft: str = "{method: ngram, prompt_lookup_min: 2, prompt_lookup_max: 3}",
              k: str = "[1, 2]", extra: str = "") -> str:
    return f"name: c\ntarget: {target}\ndraft: {draft}\nk: {k}\n{extra}"


PROMPTS_OK = "".join(json.dumps({"prompt": f"question {i}: what is {i} + {i}?"}) + "\n" for i in range(6))
RANK = ["rank", "{cand}", "--prompts", "{prompts}", "--sample-size", "4", "--max-tokens", "8", "--max-model-len", "256"]


def _huge_line(path: Path) -> None:
    """A 100 MB JSONL file that is one line (written in chunks, never held in memory)."""
    chunk = b"x" * (1 << 20)
    with path.open("wb") as handle:
        handle.write(b'{"prompt": "')
        for _ in range(100):
            handle.write(chunk)
        handle.write(b'"}\n')


def _laughs() -> str:
    """A YAML "billion laughs": nine levels of nine aliases, 9**8 strings once expanded."""
    levels, prev = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'], "a"
    for name in "bcdefgh":
        levels.append(f"&{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return "[" + ", ".join(levels) + "]"


LAUGHS_VALUE = _laughs() + "\n"
LAUGHS = "study:\n  seed: " + LAUGHS_VALUE

CASES: dict[str, Case] = {
    # candidate files
    "yaml syntax error": Case(RANK, ["{cand}", "line 4: YAML syntax error", "Fix the YAML syntax"],
                              {"cand": "name: c\ntarget: {target}\ndraft: {method: ngram\nk: [1\n"}),
    "unknown key": Case(RANK, ["{cand}", "speed: unknown key", "See `draftfit rank --help`"],
                        {"cand": candidate(extra="speed: 3\n")}),
    "unknown key inside draft": Case(RANK, ["{cand}", "draft.modle: unknown key", "See `draftfit rank --help`"],
                                     {"cand": candidate(draft="{method: draft_model, modle: x}")}),
    "k of the wrong type": Case(RANK, ["{cand}", "k: Input should be a valid tuple", "See `draftfit rank --help`"],
                                {"cand": candidate(k="three")}),
    "k not whole": Case(RANK, ["{cand}", "k[0]: Input should be a valid integer", "See `draftfit rank --help`"],
                        {"cand": candidate(k="[2.5]")}),
    "draft of the wrong type": Case(RANK, ["{cand}", "draft: Input should be a valid dictionary", "See `draftfit rank --help`"],
                                    {"cand": candidate(draft="ngram")}),
    "k = 0": Case(RANK, ["{cand}", "k: entry [0] is 0: must be between 1 and 16", "See `draftfit rank --help`"],
                  {"cand": candidate(k="[0]")}),
    "k < 0": Case(RANK, ["{cand}", "k: -3 must be between 1 and 16", "See `draftfit rank --help`"],
                  {"cand": candidate(k="-3")}),
    "k: 0, a scalar": Case(RANK, ["{cand}", "k: 0 must be between 1 and 16 (a whole number of speculative tokens, or a list",
                                  "See `draftfit rank --help`"], {"cand": candidate(k="0")}),
    "a misspelt key": Case(RANK, ["{cand}", "draft.prompt_lookup_mn: unknown key (did you mean prompt_lookup_min?)",
                                  "See `draftfit rank --help`"],
                           {"cand": candidate(draft="{method: ngram, prompt_lookup_mn: 2}")}),
    "max-model-len below max-tokens": Case(["rank", "{cand}", "--max-model-len", "16"],
                                           ["study settings", "max_tokens 128 leaves no room for a prompt in max_model_len 16",
                                            "raise --max-model-len or lower --max-tokens"], {"cand": candidate()}),
    "k absurdly large": Case(RANK, ["{cand}", "k: entry [1] is 100000000000000000000: must be between 1 and 16", "See"],
                             {"cand": candidate(k="[2, 100000000000000000000]")}),
    "empty k list": Case(RANK, ["{cand}", "k: give at least one k", "See"],
                         {"cand": candidate(k="[]")}),
    "candidate file missing": Case(["rank", "{tmp}/nowhere.yaml"], ["nowhere.yaml", "no such file", "Check the path"]),
    "candidate file binary": Case(RANK, ["{cand}", "is a binary file, not YAML", "Pass a candidate .yaml file"],
                                  {"cand": b"\x00\x01\x02\xff\xfe" * 50}),
    "candidate file not UTF-8": Case(RANK, ["{cand}", "is not UTF-8 text", "Save the file as UTF-8"],
                                     {"cand": "name: c\nnotes: caf\xe9\n".encode("latin-1")}),
    "candidate file a list": Case(RANK, ["{cand}", "must be a mapping", "See candidates/*.yaml"], {"cand": "- a\n- b\n"}),
    # study settings
    "study file unknown key": Case([*RANK, "--study", "{study}"], ["{study}", "sampel_size: unknown key", "See"],
                                   {"study": "sampel_size: 4\n"}),
    "study file wrong type": Case([*RANK, "--study", "{study}"], ["{study}", "seed: Input should be a valid integer", "See"],
                                  {"study": "seed: many\n"}),
    "study block wrong type": Case(RANK, ["study settings", "temperature: Input should be a valid number", "See"],
                                   {"cand": candidate(extra="study: {temperature: hot}\n")}),
    # hardware
    "unknown GPU": Case([*RANK, "--gpu", "Z9000 Ultra"], ["unknown GPU 'Z9000 Ultra'", "known GPUs: A10G", "Pass one of those to --gpu"]),
    "unknown GPU in the study file": Case([*RANK, "--study", "{study}"], ["unknown GPU 'B9000'", "Pass one of those to --gpu"],
                                          {"study": "gpu: B9000\n"}),
    "GPU catalog not YAML": Case([*RANK, "--gpu", "H100 SXM", "--gpu-catalog", "{catalog}"], ["{catalog}", "not valid YAML", "Fix the YAML"],
                                 {"catalog": "gpus: [name: {\n"}),
    "GPU catalog wrong type": Case([*RANK, "--gpu", "H100 SXM", "--gpu-catalog", "{catalog}"],
                                   ["{catalog}", "gpus[0].memory_gib", "Each GPU needs name"],
                                   {"catalog": "gpus:\n  - {name: X1, memory_gib: lots, hbm_tb_per_s: 1, bf16_tflops: 1}\n"}),
    # prompt files
    "prompts missing": Case(RANK, ["{prompts}", "no such file or directory", "Check the prompts path"],
                            {"prompts": lambda p: None}),
    "prompts empty": Case(RANK, ["{prompts}", "the prompts file has no rows", "Point at a file with prompts"], {"prompts": ""}),
    "prompts blank lines only": Case(RANK, ["{prompts}", "the prompts file has no rows", "Point at a file"], {"prompts": "\n \n\n"}),
    "prompts CSV header only": Case([*RANK[:3], "{prompts_csv}", *RANK[4:]], ["{prompts_csv}", "has no rows", "Point at a file"],
                                    {"prompts_csv": "prompt,category\n"}),
    "prompts binary": Case(RANK, ["{prompts}", "is a binary file (NUL bytes), not JSON text", "Pass prompts as UTF-8 JSONL"],
                           {"prompts": bytes(range(256)) * 64}),
    "prompts CSV binary": Case([*RANK[:3], "{prompts_csv}", *RANK[4:]], ["{prompts_csv}", "is a binary file", "UTF-8"],
                               {"prompts_csv": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 10}),
    "prompts UTF-16": Case(RANK, ["{prompts}", "is a binary file (NUL bytes)", "UTF-8"],
                           {"prompts": '{"prompt": "hello"}\n'.encode("utf-16")}),
    "prompts line not UTF-8": Case(RANK, ["{prompts}", "line 2: not UTF-8 (byte 13)", "Fix or remove those lines"],
                                   {"prompts": b'{"prompt": "a"}\n{"prompt": "\xff"}\n'}),
    "prompts 100 MB single line": Case(RANK, ["{prompts}", "line 1: longer than 16 MiB, the limit per prompt record",
                                              "at most 16 MiB"], {"prompts": _huge_line}),
    "prompts missing columns": Case(RANK, ["{prompts}", "no 'prompt' or 'messages' column (columns: 'text')", "--prompt-column"],
                                    {"prompts": '{"text": "hello"}\n'}),
    "prompts malformed messages": Case(RANK, ["{prompts}", "line 2 (row 1): column 'messages': message 0 has no 'role'",
                                              "Fix or remove those rows"],
                                       {"prompts": '{"prompt": "ok"}\n{"messages": [{"content": "hi"}]}\n'}),
    "prompts not JSON": Case(RANK, ["{prompts}", "line 1: not valid JSON", "Fix or remove those lines"], {"prompts": "{prompt: hi}\n"}),
    "prompts all over the context": Case(
        ["rank", "{cand}", "--prompts", "{prompts}", "--sample-size", "2", "--max-tokens", "1", "--max-model-len", "16"],
        ["{prompts}", "no prompt fits: all 3 rows are over max_input_tokens=14", "Raise max_input_tokens"],
        {"prompts": "".join(json.dumps({"prompt": "word " * 40 + str(i)}) + "\n" for i in range(3))}),
    # model references
    "target directory without config": Case(RANK, ["{noconfig}", "has tokenizer files but no config.json", "Copy the model's config.json"],
                                            {"cand": candidate(target="{noconfig}")}),
    "target directory without tokenizer": Case(RANK, ["{empty}", "no tokenizer files", "Pass the directory"],
                                               {"cand": candidate(target="{empty}")}),
    "tokenizer-only target given to rank": Case(RANK, ["{tokonly}", "no weights (*.safetensors or *.bin)", "Pass a directory with the model's weights"],
                                                {"cand": candidate(target="{tokonly}")}),
    "tokenizer-only draft given to rank": Case(RANK, ["{tokonly}", "no weights", "Pass a directory with the model's weights"],
                                               {"cand": candidate(draft="{model: '{tokonly}'}")}),
    "target path missing": Case(RANK, ["{tmp}/no-such-model", "no such file or directory", "Check the path"],
                                {"cand": candidate(target="{tmp}/no-such-model")}),
    "target is a binary file": Case(RANK, ["{blob}", "is a file but not a model", "Pass the model's directory"],
                                    {"cand": candidate(target="{blob}"), "blob": b"\x00" * 64}),
    # results files
    "results of another schema version (report)": Case(["report", "{results}"],
                                                       ["{results}", "results schema version 99 is not the version this draftfit reads (2)",
                                                        "Re-run `draftfit rank`"], {"results": '{"schema_version": 99, "run_id": "x"}'}),
    "results of another schema version (verify)": Case(["verify", "{results}", "--top", "1"],
                                                       ["{results}", "results schema version 0", "Re-run `draftfit rank`"],
                                                       {"results": '{"schema_version": 0}'}),
    "results binary (report)": Case(["report", "{results}"], ["{results}", "not a valid JSON results file", "Re-run `draftfit rank`"],
                                    {"results": b"\x00\xff" * 100}),
    "results missing (report)": Case(["report", "{tmp}/nope/results.json"], ["results.json", "no such file", "Pass the results.json"]),
    # hostile YAML: billion laughs in the study block, huge values in a disagreement
    "YAML alias bomb": Case(["rank", "{cand}", "{cand2}"], ["{cand}", "expands to more than 100,000 values", "Write the settings out"],
                            {"cand": candidate(extra=LAUGHS), "cand2": candidate(extra=LAUGHS.replace("lol", "lul")).replace("name: c", "name: d")}),
    "YAML alias bomb in a GPU catalog": Case([*RANK, "--gpu", "H100 SXM", "--gpu-catalog", "{catalog}"],
                                             ["{catalog}", "expands to more than 100,000 values", "Write"], {"catalog": "gpus: " + LAUGHS_VALUE}),
    "candidate file over the size limit": Case(RANK, ["{cand}", "is larger than 1 MiB; a candidate file is a few hundred bytes",
                                                      "Pass a candidate .yaml file"],
                                               {"cand": candidate(extra="notes: '" + "x" * (2 * 2**20) + "'\n")}),
    "GPU catalog over the size limit": Case([*RANK, "--gpu", "H100 SXM", "--gpu-catalog", "{catalog}"],
                                            ["{catalog}", "is larger than 1 MiB; a GPU catalog is a few kilobytes", "Pass"],
                                            {"catalog": "# " + "x" * (2 * 2**20) + "\n"}),
    "study settings disagree with a huge value": Case(["rank", "{cand}", "{cand2}"],
                                                      ["{cand2}", "study.concurrency = [1, 4] disagrees", "characters)", "Keep study settings"],
                                                      {"cand": candidate(extra=f"study: {{concurrency: {list(range(20000))}}}\n"),
                                                       "cand2": candidate(extra="study: {concurrency: [1, 4]}\n").replace("name: c", "name: d")}),
    # wrong-shaped configs: one validation for check, predict and rank
    "check: vocab_size not a number": Case(["check", "{badvocab}", "{target}"],
                                           ["{badvocab}/config.json", "vocab_size is 'lots', not a positive whole number", "Fix or re-download"]),
    "check: config.json a list": Case(["check", "{listcfg}", "{target}"],
                                      ["{listcfg}/config.json", "expected a JSON object, found list", "Re-download"]),
    "check: hidden_size negative": Case(["check", "{negcfg}", "{target}"], ["{negcfg}/config.json", "hidden_size is -5", "Fix"]),
    "rank: hidden_size negative": Case(RANK, ["{negcfg}/config.json", "hidden_size is -5", "Fix"], {"cand": candidate(target="{negcfg}")}),
    "predict: hidden_size negative": Case(["predict", "{negcfg}", "--gpu", "H100 SXM"], ["{negcfg}/config.json", "hidden_size is -5", "Fix"]),
    "predict: TP not dividing the heads": Case(["predict", "smollm2", "--gpu", "H100 SXM", "--tensor-parallel-size", "2"],
                                               ["Total number of attention heads (9) must be divisible by tensor parallel size (2)",
                                                "Use a --tensor-parallel-size that divides 9"]),
    "predict: k above rank's cap": Case(["predict", "smollm2", "--method", "ngram", "--acceptance-length", "2", "--gpu", "H100 SXM",
                                         "--k", "1000"], ["--k 1000 is outside 1–16", "Use k between 1 and 16"]),
    "predict: input beyond the context": Case(["predict", "smollm2", "--gpu", "H100 SXM", "--input-len", "1000000000"],
                                              ["The decoder prompt (length 1000000000) is longer than the maximum model length of 8192",
                                               "Use --input-len below 8192"]),
    "predict: context beyond the model's": Case(["predict", "smollm2", "--gpu", "H100 SXM", "--max-model-len", "100000"],
                                                ["max_model_len", "100000", "8192"]),
    # check
    # check compares a directory without config.json (tests/test_cli_check.py), rank refuses it (above)
    "check: binary file as a model": Case(["check", "{blob}", "{target}"], ["{blob}", "is a file but not a model", "Pass the model's directory"],
                                          {"blob": b"\x7fELF\x00\x00" * 10}),
}

SUFFIX = {"cand": "c.yaml", "cand2": "c2.yaml", "study": "study.yaml", "prompts": "prompts.jsonl", "prompts_csv": "prompts.csv",
          "catalog": "gpus.yaml", "results": "results.json", "blob": "model.bin"}


@pytest.fixture(scope="module")
def models(bpe, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad-input-models")
    (root / "empty").mkdir()
    shaped = {"badvocab": {"vocab_size": "lots"}, "negcfg": {"hidden_size": -5}}
    for name, change in shaped.items():
        tf.edit_json(model_dir(root / name, bpe) / "config.json", lambda c, change=change: c.update(change))
    (model_dir(root / "listcfg", bpe) / "config.json").write_text("[1, 2]")
    return {
        **{name: str(root / name) for name in [*shaped, "listcfg"]},
        "target": str(model_dir(root / "target", bpe)),
        "tokonly": str(model_dir(root / "tokonly", bpe, weights=False)),
        "noconfig": str(model_dir(root / "noconfig", bpe, config=False)),
        "empty": str(root / "empty"),
    }


def fill(text: str, names: dict[str, str]) -> str:
    for key, value in names.items():
        text = text.replace("{" + key + "}", value)
    return text


def invoke(args: list[str]):
    return CliRunner().invoke(cli, args, env={"HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_with_the_fix_and_writes_nothing(name, models, tmp_path, monkeypatch):
    case = CASES[name]
    monkeypatch.chdir(tmp_path)
    names = {**models, "tmp": str(tmp_path)}
    files = {"cand": candidate(), "prompts": PROMPTS_OK, **case.files}
    names.update({key: str(tmp_path / SUFFIX[key]) for key in files})
    for key, content in files.items():
        path = Path(names[key])
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(fill(content, names), encoding="utf-8")
    reports = tmp_path / "reports"
    args = [fill(a, names) for a in case.args]
    if args[0] == "rank":
        args += ["--reports-dir", str(reports), "--run-id", "run"]
    before = {p for p in tmp_path.rglob("*")}

    result = invoke(args)

    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip("\n").endswith(errors[0]), "the error is the last thing printed, on one line"
    error = errors[0]
    assert "Traceback" not in result.output and "unexpected" not in error
    assert len(error) < 1500, f"a line a terminal can show, not {len(error):,} characters"
    position = 0
    for text in (fill(t, names) for t in case.expect):
        found = error.find(text, position)
        assert found >= 0, f"{text!r} missing (in this order) from: {error}"
        position = found + len(text)
    # nothing written half-way: no run directory, no report, no temporary file
    assert not reports.exists()
    written = {p for p in tmp_path.rglob("*")} - before
    assert written == set(), written


def test_the_record_limit_is_far_beyond_any_context():
    """16 MiB per JSONL line / CSV row: millions of tokens, so only broken files hit it."""
    assert MAX_RECORD_BYTES == 16 * 2**20


def test_a_long_prompt_within_the_limit_loads_from_csv(tmp_path):
    """CSV fields past the csv module's default 128 KiB limit are fine up to the record limit."""
    from draftfit.prompts.loading import load_prompts

    long = "token " * 50_000  # 300 KB
    path = tmp_path / "long.csv"
    path.write_text(f'prompt\n"{long}"\nshort\n', encoding="utf-8")
    dataset = load_prompts(path)
    assert dataset["prompt"] == [long, "short"]


def test_the_huge_line_is_not_read_whole(tmp_path):
    """The 100 MB line is refused after at most the limit (plus one read) is in memory."""
    import tracemalloc

    from draftfit.errors import DraftfitError
    from draftfit.prompts.loading import load_prompts

    path = tmp_path / "huge.jsonl"
    _huge_line(path)
    tracemalloc.start()
    try:
        with pytest.raises(DraftfitError, match="line 1: longer than 16 MiB"):
            load_prompts(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert os.path.getsize(path) > 100 * 2**20
    assert peak < 3 * MAX_RECORD_BYTES

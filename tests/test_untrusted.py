"""Untrusted content: model repositories' code never runs without --trust-remote-code, and prompt
text stays out of terminal output and logs unless --show-prompts is given.

(HTML escaping of prompt and model text in the report is tested in tests/test_report.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokfactory as tf
from click.testing import CliRunner

from draftfit.cli import cli
from draftfit.errors import DraftfitError, ModelRefError
from draftfit.prompts.loading import load_prompts, prompt_digest
from draftfit.prompts.sampling import sample_prompts
from draftfit.refs import custom_code, metadata_dir, resolve

# Code a hostile repository ships: importing it writes the marker file named in its first line.
HOSTILE_MODULE = '''MARKER = {marker!r}
import pathlib
pathlib.Path(MARKER).write_text("the repository's code ran")
from transformers import PreTrainedTokenizer


class RemoteTokenizer(PreTrainedTokenizer):
    pass
'''


def custom_tokenizer_dir(root: Path, marker: Path) -> Path:
    """A model directory whose tokenizer is a class in its own .py file (auto_map), without a
    tokenizer.json: loading the tokenizer means running that file."""
    root.mkdir(parents=True)
    (root / "tokenization_remote.py").write_text(HOSTILE_MODULE.format(marker=str(marker)))
    (root / "vocab.json").write_text(json.dumps({"<unk>": 0, "a": 1, "b": 2}))
    (root / "config.json").write_text(json.dumps({"model_type": "remote", "vocab_size": 3}))
    (root / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "RemoteTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_remote.RemoteTokenizer", None]},
    }))
    return root


@pytest.fixture(scope="session")
def bpe() -> dict:
    return tf.train_bpe(600)


@pytest.fixture
def no_engines(monkeypatch):
    """Stop `rank` where the engines would start, with a one-line error."""
    import draftfit.engines
    import draftfit.trajectories

    def stop(*args, **kwargs):
        raise DraftfitError("stopped where the engines start (test)")

    monkeypatch.setattr(draftfit.engines, "open_engine", stop)
    monkeypatch.setattr(draftfit.trajectories, "target_trajectories", stop)


def run(*args, **kwargs):
    return CliRunner().invoke(cli, [str(a) for a in args], env={"HF_HUB_OFFLINE": "1"}, **kwargs)


# --- (a) remote code ----------------------------------------------------------------------------


def test_custom_tokenizer_code_is_refused_by_default(tmp_path):
    marker = tmp_path / "marker"
    repo = custom_tokenizer_dir(tmp_path / "repo", marker)
    assert custom_code(repo) == {"AutoTokenizer": "tokenization_remote.RemoteTokenizer"}
    with pytest.raises(ModelRefError) as info:
        metadata_dir(resolve(str(repo)))
    message = str(info.value)
    assert message.startswith(f"{repo}: its tokenizer is custom code from the repository (tokenization_remote.RemoteTokenizer)")
    assert message.endswith("Pass --trust-remote-code if you trust that code, or add a tokenizer.json to the directory")
    assert not marker.exists()


@pytest.mark.parametrize("command", ["check", "rank"])
def test_cli_refuses_remote_code_without_the_flag(command, tmp_path, bpe, no_engines):
    marker = tmp_path / "marker"
    repo = custom_tokenizer_dir(tmp_path / "repo", marker)
    other = tf.write_model_dir(tmp_path / "other", bpe)
    if command == "check":
        args = ["check", repo, other]
    else:
        cand = tmp_path / "c.yaml"
        cand.write_text(f"name: c\ntarget: {repo}\ndraft: {{method: ngram}}\nk: [2]\n")
        args = ["rank", cand, "--reports-dir", tmp_path / "reports"]
    result = run(*args)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: {repo}: its tokenizer is custom code from the repository (tokenization_remote.RemoteTokenizer), which "
        "draftfit does not run by default. Pass --trust-remote-code if you trust that code, or add a tokenizer.json to the directory"
    )
    assert not marker.exists()


@pytest.mark.slow  # imports transformers (seconds)
@pytest.mark.parametrize("command", ["check", "rank"])
def test_trust_remote_code_reaches_the_loader(command, tmp_path, bpe, no_engines):
    """With the flag the repository's code is imported (it writes the marker) — the flag is passed
    through to transformers, not dropped on the way."""
    marker = tmp_path / "marker"
    repo = custom_tokenizer_dir(tmp_path / "repo", marker)
    other = tf.write_model_dir(tmp_path / "other", bpe)
    if command == "check":
        args = ["check", repo, other, "--trust-remote-code"]
    else:
        cand = tmp_path / "c.yaml"
        cand.write_text(f"name: c\ntarget: {repo}\ndraft: {{method: ngram}}\nk: [2]\n")
        args = ["rank", cand, "--reports-dir", tmp_path / "reports", "--trust-remote-code"]
    run(*args)
    assert marker.read_text() == "the repository's code ran"


def test_metadata_with_custom_model_code_is_read_without_running_it(tmp_path, bpe):
    """config.json naming custom model classes (auto_map) beside a tokenizer.json: `check` reads the
    JSON files and the tokenizer with the `tokenizers` library; the repository's .py never runs."""
    marker = tmp_path / "marker"
    target = tf.write_model_dir(tmp_path / "target", bpe, config={
        "model_type": "remote", "auto_map": {"AutoConfig": "configuration_remote.RemoteConfig",
                                             "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"}})
    for name in ("configuration_remote.py", "modeling_remote.py"):
        (target / name).write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    draft = tf.write_model_dir(tmp_path / "draft", bpe)
    result = run("check", target, draft, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["verdict"] == "identical"
    assert custom_code(target) == {"AutoConfig": "configuration_remote.RemoteConfig",
                                   "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"}
    assert not marker.exists()


def custom_model_dir(root: Path, bpe: dict, marker: Path, model_type: str = "remote") -> Path:
    """A complete model directory (tokenizer.json, config, weights) whose model classes are the
    repository's own .py files (auto_map); importing them writes ``marker``."""
    target = tf.write_model_dir(root, bpe, config={
        "model_type": model_type, "auto_map": {"AutoConfig": "configuration_remote.RemoteConfig",
                                               "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"}})
    for name in ("configuration_remote.py", "modeling_remote.py"):
        (target / name).write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    (target / "model.safetensors").write_bytes(b"placeholder: never loaded")
    return target


@pytest.mark.slow  # imports transformers' configuration table (seconds)
def test_rank_refuses_a_custom_model_class_before_any_engine(tmp_path, bpe, no_engines):
    marker = tmp_path / "marker"
    target = custom_model_dir(tmp_path / "target", bpe, marker)
    cand = tmp_path / "c.yaml"
    cand.write_text(f"name: c\ntarget: {target}\ndraft: {{method: ngram}}\nk: [2]\n")
    result = run("rank", cand, "--reports-dir", tmp_path / "reports")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: {target}: its model is custom code from the repository (modeling_remote.RemoteForCausalLM), which "
        "draftfit does not run by default. Pass --trust-remote-code if you trust that code"
    )
    assert "stopped where the engines start" not in result.stderr  # refused before, not by the engine
    assert not marker.exists() and not (tmp_path / "reports").exists()
    # with the flag, the refusal is lifted and the run goes on to the engines (stopped there by the test)
    result = run("rank", cand, "--reports-dir", tmp_path / "reports", "--trust-remote-code")
    assert "stopped where the engines start" in result.stderr


@pytest.mark.slow  # imports transformers' configuration table (seconds)
def test_auto_map_beside_a_model_type_transformers_knows_loads_transformers_classes(tmp_path, bpe):
    """auto_map next to model_type "llama": transformers (and vLLM) use their own Llama classes
    without --trust-remote-code, so nothing of the repository runs and the directory is accepted."""
    from draftfit.refs import model_dir

    marker = tmp_path / "marker"
    target = custom_model_dir(tmp_path / "target", bpe, marker, model_type="llama")
    assert model_dir(resolve(str(target))) == target
    assert not marker.exists()


@pytest.mark.parametrize("command", ["check", "rank"])
def test_help_offers_trust_remote_code_only_for_trusted_code(command):
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "--trust-remote-code" in result.output
    assert "Only for code you trust" in " ".join(result.output.split())


# --- (b) prompt text stays out of output and logs -------------------------------------------------

MARKER = "ZQX-PRIVATE-7741"


@pytest.fixture
def leaky_study(tmp_path, bpe) -> tuple[list[str], str]:
    """A rank command whose prompts include a long one (with the marker) that is dropped as over
    the context before any engine starts; returns (args, the dropped prompt's digest)."""
    target = tf.write_model_dir(tmp_path / "target", bpe)
    (target / "model.safetensors").write_bytes(b"placeholder: the engines are stopped before loading it")
    long = f"{MARKER} " + "the draft proposes tokens and the target verifies them " * 20
    rows = [{"prompt": f"short question {i}?"} for i in range(5)] + [{"prompt": long}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cand = tmp_path / "c.yaml"
    cand.write_text(f"name: c\ntarget: {target}\ndraft: {{method: ngram}}\nk: [2]\n")
    args = ["rank", str(cand), "--prompts", str(prompts), "--sample-size", "3", "--max-tokens", "8",
            "--max-model-len", "64", "--reports-dir", str(tmp_path / "reports")]
    return args, prompt_digest(long)


def test_rank_names_dropped_rows_by_number_and_hash_not_text(leaky_study, no_engines, caplog):
    args, digest = leaky_study
    caplog.set_level("DEBUG")
    result = run(*args)
    assert result.exit_code == 2 and "stopped where the engines start" in result.stderr
    assert f"longer than max_input_tokens=55 dropped, not truncated (row 5) [sha256 {digest}]" in " ".join(result.stderr.split())
    assert MARKER not in result.output
    assert MARKER not in caplog.text
    assert f"sha256 {digest}" in caplog.text


def test_rank_show_prompts_shows_the_start_of_the_text(leaky_study, no_engines):
    args, digest = leaky_study
    result = run(*args, "--show-prompts")
    assert result.exit_code == 2
    assert f"[sha256 {digest} '{MARKER} the draft" in " ".join(result.stderr.split())


@pytest.mark.parametrize("command", ["rank", "verify"])
def test_help_offers_show_prompts_and_trust_remote_code(command):
    result = run(command, "--help")
    text = " ".join(result.output.split())
    assert "--show-prompts" in text and "--trust-remote-code" in text and "Only for code you trust" in text


def _word_tokenizer(template: str):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from draftfit.chat_template import ChatTokenizer

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{f"w{i}": i + 1 for i in range(50)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return ChatTokenizer(tok, chat_template=template)


@pytest.mark.parametrize("show", [False, True])
def test_sample_warnings_and_dropped_rows_hide_text_unless_asked(tmp_path, show):
    """Rows dropped for length, and rows a chat template refuses with an error that quotes them."""
    quoting = ("{% for m in messages %}{% if 'refuse' in m['content'] %}{{ raise_exception('cannot take: ' + m['content']) }}"
               "{% endif %}{{ m['content'] }} {% endfor %}")
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": "w1 w2"}, {"prompt": "w3 w4"}, {"messages": [{"role": "user", "content": f"refuse {MARKER}"}]},
            {"prompt": f"{MARKER} " + "w5 " * 30}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(UserWarning) as record:
        sample = sample_prompts(load_prompts(path), _word_tokenizer(quoting), n=2, seed=0, max_input_tokens=10,
                                show_prompts=show)
    assert [d.id for d in sample.dropped] == [2, 3]
    assert sample.dropped[0].digest == prompt_digest(f"refuse {MARKER}")
    assert sample.dropped[1].digest == prompt_digest(f"{MARKER} " + "w5 " * 30)
    shown = " ".join([str(w.message) for w in record] + sample.warnings + [d.reason for d in sample.dropped])
    assert (MARKER in shown) is show
    assert f"sha256 {sample.dropped[1].digest}" in shown
    if not show:
        assert sample.dropped[0].reason.startswith("the chat template refused the conversation (its message quotes the prompt")
    else:
        assert sample.dropped[0].reason == f"the chat template refused the conversation: cannot take: refuse {MARKER}"


def test_template_errors_that_do_not_quote_the_prompt_are_kept(tmp_path):
    strict = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}{% endfor %}"
    path = tmp_path / "p.jsonl"
    rows = [{"messages": [{"role": "system", "content": MARKER}]}, {"prompt": "w1"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(UserWarning):
        sample = sample_prompts(load_prompts(path), _word_tokenizer(strict), n=1, seed=0, max_input_tokens=10)
    assert sample.dropped[0].reason == "the chat template refused the conversation: System role not supported"

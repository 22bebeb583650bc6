"""Nothing a user owns is destroyed: every output path is checked before any work, directories are
swapped in whole, links are never followed, run ids stay inside --reports-dir, and a failed start
leaves no run folder behind. No engine and no model weights: the refusals come first."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tokfactory as tf
from click.testing import CliRunner

from draftfit import outputs
from draftfit.cli import cli
from draftfit.errors import DraftfitError

EXAMPLE = Path(__file__).resolve().parents[1] / "reports" / "example"


@pytest.fixture(scope="module")
def bpe() -> dict:
    return tf.train_bpe(600)


def model(path: Path, bpe: dict) -> Path:
    tf.write_model_dir(path, bpe)
    (path / "model.safetensors").write_bytes(b"placeholder weights: never loaded here")
    return path


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its content's digest (links by their target)."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = "-> " + str(path.readlink())
        elif path.is_file():
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[rel] = "dir"
    return found


def run(*args) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args], env={"HF_HUB_OFFLINE": "1"})
    return result.exit_code, result.output


def one_error(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, output
    assert "unexpected" not in errors[0] and "Traceback" not in output, output
    return errors[0]


# --- directories: pad-vocab and export ----------------------------------------------------------


def test_pad_vocab_onto_its_own_source_keeps_the_source(bpe, tmp_path):
    src = model(tmp_path / "src", bpe)
    before = tree(tmp_path)
    code, out = run("pad-vocab", src, "--to", 50000, "-o", src, "--force")
    assert code == 2
    assert "is an input of this command" in one_error(out)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("where", ["inside", "parent"])
def test_pad_vocab_refuses_an_output_inside_or_around_the_source(bpe, tmp_path, where):
    src = model(tmp_path / "m" / "src", bpe)
    out_dir = src / "padded" if where == "inside" else tmp_path / "m"
    before = tree(tmp_path)
    code, out = run("pad-vocab", src, "--to", 50000, "-o", out_dir, "--force")
    assert code == 2
    assert ("lies inside" if where == "inside" else "contains") in one_error(out)
    assert tree(tmp_path) == before


def test_export_with_a_bad_layer_count_and_force_keeps_a_foreign_directory(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("mine")
    before = tree(tmp_path)
    code, out = run("export", "smollm2", "--first-layers", 10000, "-o", mine, "--force")
    assert code == 2
    assert "was not written by draftfit" in one_error(out)
    assert tree(tmp_path) == before


def test_force_on_a_symlinked_output_is_one_line_and_follows_nothing(bpe, tmp_path):
    src = model(tmp_path / "src", bpe)
    real = tmp_path / "real"
    real.mkdir()
    (real / "f").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(real)
    before = tree(tmp_path)
    code, out = run("pad-vocab", src, "--to", 50000, "-o", link, "--force")
    assert code == 2
    assert "symbolic link" in one_error(out)
    assert tree(tmp_path) == before


def test_write_dir_swaps_in_only_a_complete_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / outputs.DIR_MARKERS[0]).write_text("{}")
    (out / "old.txt").write_text("old")

    def broken(tmp: Path) -> None:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError):
        outputs.write_dir(out, broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "the partial sibling is removed"
    assert (out / "old.txt").read_text() == "old"

    outputs.write_dir(out, lambda tmp: (tmp / "new.txt").write_text("new"))
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "the old directory is gone once swapped"


def test_force_replaces_only_a_directory_draftfit_marked(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "draftfit-padded.json").write_text("{}")
    (ours / "model.safetensors").write_bytes(b"x")
    assert outputs.check_output_dir(ours, force=True) == ours
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "model.safetensors").write_bytes(b"x")
    with pytest.raises(DraftfitError, match="not written by draftfit"):
        outputs.check_output_dir(theirs, force=True)
    with pytest.raises(DraftfitError, match="not empty"):
        outputs.check_output_dir(ours, force=False)


# --- files: report -o and watch --json ----------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(EXAMPLE, folder)
    return folder


def test_report_onto_its_own_results_is_refused(run_dir):
    before = tree(run_dir)
    code, out = run("report", run_dir / "results.json", "-o", run_dir / "results.json")
    assert code == 2
    assert "is an input of this command" in one_error(out)
    assert tree(run_dir) == before


def test_report_onto_a_file_draftfit_did_not_write_is_refused(run_dir, tmp_path):
    notes = tmp_path / "notes.html"
    notes.write_text("<p>my notes</p>")
    code, out = run("report", run_dir / "results.json", "-o", notes)
    assert code == 2
    assert "is not a report draftfit wrote" in one_error(out)
    assert notes.read_text() == "<p>my notes</p>"


def test_report_rewrites_its_own_report_and_replaces_a_link_without_following_it(run_dir, tmp_path):
    code, out = run("report", run_dir / "results.json", "-o", run_dir / "again.html")
    assert code == 0, out
    code, out = run("report", run_dir / "results.json", "-o", run_dir / "again.html")
    assert code == 0, out  # a report draftfit wrote may be rewritten
    elsewhere = tmp_path / "elsewhere.html"
    elsewhere.write_text("theirs")
    link = run_dir / "linked.html"
    link.symlink_to(elsewhere)
    code, out = run("report", run_dir / "results.json", "-o", link)
    assert code == 0, out
    assert elsewhere.read_text() == "theirs" and not link.is_symlink()


def test_watch_json_onto_the_results_is_refused(run_dir):
    results = run_dir / "results.json"
    before = tree(run_dir)
    # refused before the server is read: the URL is never contacted
    code, out = run("watch", "http://127.0.0.1:9", "--results", results, "--json", results, "--duration", 0)
    assert code == 2
    assert "is an input of this command" in one_error(out)
    assert tree(run_dir) == before


# --- run folders ---------------------------------------------------------------------------------

CANDIDATE = "name: ng\ntarget: smollm2\ndraft: {method: ngram}\nk: [2]\n"


@pytest.mark.parametrize("run_id", ["../../escape", "/tmp/absolute", "a/b", "..", ".hidden", "x" * 200, ""])
def test_run_ids_are_one_folder_name(tmp_path, monkeypatch, run_id):
    monkeypatch.chdir(tmp_path)
    cand = tmp_path / "c.yaml"
    cand.write_text(CANDIDATE)
    reports = tmp_path / "deep" / "reports"
    code, out = run("rank", cand, "--run-id", run_id, "--reports-dir", reports)
    assert code == 2
    assert "--run-id" in one_error(out)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["c.yaml"]


def test_a_run_folder_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "r").symlink_to(tmp_path / "elsewhere")
    cand = tmp_path / "c.yaml"
    cand.write_text(CANDIDATE)
    code, out = run("rank", cand, "--run-id", "r", "--reports-dir", reports)
    assert code == 2
    assert "symbolic link" in one_error(out)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_dangling_log_link_is_replaced_not_followed(tmp_path):
    target = tmp_path / "created-by-draftfit.txt"
    log = tmp_path / "run" / "engines.log"
    log.parent.mkdir()
    log.symlink_to(target)
    with outputs.open_log(log) as handle:
        handle.write("line\n")
    assert not target.exists()
    assert not log.is_symlink() and log.read_text() == "line\n"


def _rank(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """rank in a child process, as a user runs it (its own run folder handling, exit code)."""
    return subprocess.run([sys.executable, "-m", "draftfit", "rank", *args], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)


def test_a_failed_start_leaves_no_run_folder(bpe, tmp_path):
    """Two targets, a TP vLLM refuses, a hub id that is not on this machine: found before or right
    after the run folder is made, and nothing of it is left."""
    cand = tmp_path / "c.yaml"
    cand.write_text(CANDIDATE)
    other = tmp_path / "other.yaml"
    other.write_text(CANDIDATE.replace("ng\n", "other\n").replace("smollm2", str(model(tmp_path / "m", bpe))))
    hub = tmp_path / "hub.yaml"
    hub.write_text(CANDIDATE.replace("smollm2", "no-such-org/no-such-model-xyz"))
    reports = tmp_path / "reports"
    cases = {
        "two": [str(cand), str(other)],
        "tp": [str(cand), "--tensor-parallel-size", "2"],
        "hub": [str(hub)],
    }
    for run_id, args in cases.items():
        done = _rank(tmp_path, *args, "--reports-dir", str(reports), "--run-id", run_id)
        assert done.returncode == 2, (run_id, done.stderr)
        assert done.stderr.strip().splitlines()[-1].startswith("Error: "), done.stderr
        assert "engines.log" not in done.stderr + done.stdout, "no pointer to an empty log"
        assert not (reports / run_id).exists(), (run_id, list(reports.rglob("*")))


def test_removed_on_failure_keeps_what_was_there(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text("{}")
    with pytest.raises(DraftfitError), outputs.removed_on_failure(run_dir):
        (run_dir / "engines.log").touch()
        (run_dir / "kept.log").write_text("the failure, for the user to read\n")
        raise DraftfitError("late refusal")
    assert sorted(p.name for p in run_dir.iterdir()) == ["kept.log", "results.json"]


def test_results_schema_version_of_the_wrong_type_says_so(run_dir):
    data = json.loads((run_dir / "results.json").read_text())
    data["schema_version"] = "2"
    (run_dir / "sv.json").write_text(json.dumps(data))
    code, out = run("report", run_dir / "sv.json", "-o", run_dir / "sv.html")
    assert code == 2
    error = one_error(out)
    assert "'2' (str), not a whole number" in error and "reads (2)" not in error
    assert not (run_dir / "sv.html").exists()

"""Nothing half-written is ever trusted: checksummed cache entries (directories with a manifest,
JSON documents with a SHA-256), atomic writes that leave no temporary file, the fault-injection
hook, and engine failures turned into a results entry with the knobs to turn. No engines here."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from draftfit import cachedir, faults
from draftfit.cachedir import MANIFEST, DamagedEntry
from draftfit.io import atomic_write_bytes, atomic_write_json

# ---------------------------------------------------------------------------------------------
# directories with a manifest


def _entry(root: Path) -> Path:
    entry = root / "entry"
    (entry / "data").mkdir(parents=True)
    (entry / "data" / "table.arrow").write_bytes(bytes(range(256)) * 40)
    (entry / "config.json").write_text('{"layers": 4}')
    cachedir.write_manifest(entry, {"kind": "test"})
    cachedir._verified.clear()  # as a new process sees it
    return entry


def _truncate(entry):
    path = entry / "data" / "table.arrow"
    path.write_bytes(path.read_bytes()[:1000])


def _flip_keep_mtime(entry):
    path = entry / "config.json"
    stat = path.stat()
    path.write_text('{"layers": 5}')  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _truncate_manifest(entry):
    path = entry / MANIFEST
    path.write_text(path.read_text()[:40])


@pytest.mark.parametrize(
    "damage, words",
    [
        (_truncate, "table.arrow does not match its checksum"),
        (_flip_keep_mtime, "config.json does not match its checksum"),
        (lambda e: (e / "config.json").unlink(), "missing ['config.json']"),
        (lambda e: (e / "stray.bin").write_bytes(b"x"), "extra ['stray.bin']"),
        (lambda e: (e / MANIFEST).unlink(), "no manifest"),
        (_truncate_manifest, "manifest is unreadable"),
    ],
    ids=["truncated-file", "same-size-edit", "missing-file", "extra-file", "no-manifest", "truncated-manifest"],
)
def test_a_damaged_entry_is_detected(tmp_path, damage, words, caplog):
    entry = _entry(tmp_path)
    assert cachedir.check_manifest(entry)["kind"] == "test"
    cachedir._verified.clear()
    damage(entry)
    with pytest.raises(DamagedEntry, match=words.replace("[", r"\[").replace("]", r"\]")):
        cachedir.check_manifest(entry)
    with caplog.at_level(logging.WARNING, logger="draftfit"):
        assert cachedir.verified(entry) is None
    assert "damaged" in caplog.text and "rebuilding" in caplog.text


def test_an_entry_is_hashed_once_per_process_until_a_file_changes(tmp_path, monkeypatch):
    entry = _entry(tmp_path)
    hashed = []
    real = cachedir.sha256_file
    monkeypatch.setattr(cachedir, "sha256_file", lambda path: hashed.append(Path(path).name) or real(path))
    for _ in range(3):
        cachedir.check_manifest(entry)
    assert sorted(hashed) == ["config.json", "table.arrow"]
    _truncate(entry)  # size and mtime change: hashed again, and caught
    with pytest.raises(DamagedEntry):
        cachedir.check_manifest(entry)


def test_only_checks_the_named_files(tmp_path):
    entry = _entry(tmp_path)
    _truncate(entry)
    assert cachedir.check_manifest(entry, only=("config.json",))["kind"] == "test"
    with pytest.raises(DamagedEntry):
        cachedir.check_manifest(entry, only=("data/table.arrow",))


def test_an_entry_without_a_manifest_is_never_trusted(tmp_path, caplog):
    """An entry of an older draftfit (or an interrupted write) cannot show it is whole: rebuilt."""
    entry = tmp_path / "old"
    entry.mkdir()
    (entry / "weights.bin").write_bytes(b"w" * 100)
    (entry / "draftfit-source.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="draftfit"):
        assert cachedir.verified(entry) is None
    assert "no manifest" in caplog.text and "rebuilding" in caplog.text


def test_publish_replaces_a_damaged_entry_and_temp_dirs_of_dead_processes_are_swept(tmp_path):
    final = _entry(tmp_path)
    _truncate(final)
    dead = tmp_path / ".entry.tmp-999999999-x"  # no such process
    dead.mkdir()
    mine = tmp_path / f".entry.tmp-{os.getpid()}-y"
    mine.mkdir()
    tmp = cachedir.temp_dir(final)
    assert not dead.exists() and mine.exists() and tmp.name.startswith(f".entry.tmp-{os.getpid()}-")
    (tmp / "fresh.txt").write_text("new")
    cachedir.write_manifest(tmp)
    cachedir.publish(tmp, final)
    assert set(cachedir.check_manifest(final)["files"]) == {"fresh.txt"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name, "entry"]


# ---------------------------------------------------------------------------------------------
# checksummed JSON documents (measured profiles)

PROFILE = {"kind": "measured", "profile": {"kind": "measured", "a": 0.01, "b": 2e-5, "c": 3e-8}}


def _truncate_json(path):
    path.write_text(path.read_text()[:30])


def _edit_payload(path):
    data = json.loads(path.read_text())
    data["payload"]["profile"]["a"] = 0.02
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "damage, words",
    [(_truncate_json, "unreadable"), (_edit_payload, "does not match its checksum"), (lambda p: p.write_text("[1, 2]"), "no checksum")],
    ids=["truncated", "edited", "not-a-profile"],
)
def test_a_damaged_checked_document_is_refused(tmp_path, damage, words, caplog):
    path = tmp_path / "p.json"
    cachedir.write_checked_json(path, PROFILE)
    assert cachedir.read_checked_json(path) == PROFILE
    damage(path)
    with caplog.at_level(logging.WARNING, logger="draftfit"):
        assert cachedir.read_checked_json(path) is None
    assert words in caplog.text


def test_a_document_written_before_checksums_is_rebuilt(tmp_path, caplog):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILE))  # a whole measured profile, but nothing shows it is whole
    with caplog.at_level(logging.WARNING, logger="draftfit"):
        assert cachedir.read_checked_json(path) is None
    assert "no checksum" in caplog.text


class _Session:
    """Stands in for rank's EngineSession: counts engine requests; the profile is timed by a stub."""

    def __init__(self, ref):
        self.ref, self.engines = ref, 0

    def get(self):
        self.engines += 1

        class Engine:
            def step_profile(self, **kw):
                from draftfit import profiling

                return profiling.measure_step_profile(None, **kw), 1

        return Engine()


@pytest.mark.parametrize("damage", [_truncate_json, _edit_payload], ids=["truncated", "edited"])
def test_rank_measures_a_damaged_profile_again(tmp_path, monkeypatch, damage):
    from draftfit import pipeline, profiling
    from draftfit.refs import ModelRef

    monkeypatch.setenv("DRAFTFIT_CACHE", str(tmp_path / "cache"))
    measured = []

    class Profile:
        def to_dict(self):
            measured.append(1)
            return {"kind": "measured", "profile": {"kind": "measured", "n_samples": len(measured)}}

    monkeypatch.setattr(profiling, "measure_step_profile", lambda llm, **kw: Profile())
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    session = _Session(ModelRef(str(model), "dir", str(model)))
    first = pipeline.measured_profile(session, {"engine": "x"}, {"quick": 1}, 10, lambda m: None)
    again = pipeline.measured_profile(session, {"engine": "x"}, {"quick": 1}, 10, lambda m: None)
    assert (first["from_cache"], again["from_cache"], session.engines) == (False, True, 1)
    [path] = (tmp_path / "cache" / "profiles").iterdir()
    damage(path)
    rebuilt = pipeline.measured_profile(session, {"engine": "x"}, {"quick": 1}, 10, lambda m: None)
    assert (rebuilt["from_cache"], session.engines, rebuilt["profile"]["n_samples"]) == (False, 2, 2)


# ---------------------------------------------------------------------------------------------
# derived drafts and trajectories entries


def test_a_damaged_derived_draft_is_derived_again(tmp_path, monkeypatch, caplog):
    from test_derive import _tiny_model

    from draftfit.derive import first_layers
    from draftfit.refs import resolve

    monkeypatch.setenv("DRAFTFIT_CACHE", str(tmp_path / "cache"))
    source, _ = _tiny_model(tmp_path / "target")
    draft = first_layers(resolve(str(source)), 2)
    assert cachedir.check_manifest(draft.path)["derived"] == "first_layers"
    weights = draft.path / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[:-16])
    with caplog.at_level(logging.WARNING, logger="draftfit"):
        again = first_layers(resolve(str(source)), 2)
    assert "derived draft" in caplog.text and "damaged" in caplog.text
    assert again.path == draft.path and cachedir.check_manifest(again.path)
    assert weights.read_bytes() == whole


@pytest.mark.parametrize("mode", ["raise", "error"])
def test_a_fault_while_deriving_leaves_no_entry_and_no_temporary_directory(tmp_path, monkeypatch, mode):
    from test_derive import _tiny_model

    from draftfit.derive import first_layers
    from draftfit.refs import resolve

    monkeypatch.setenv("DRAFTFIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(faults.ENV, f"derive:{mode}")
    faults.reset()
    source, _ = _tiny_model(tmp_path / "target")
    with pytest.raises((faults.InjectedFault, faults.InjectedError)):
        first_layers(resolve(str(source)), 2)
    assert list((tmp_path / "cache" / "derived").iterdir()) == []


def test_a_failed_cache_write_leaves_no_temporary_directory(tmp_path, monkeypatch):
    import numpy as np

    from draftfit.trajectories import list_column, load_entry, save_entry

    def broken(directory, meta=None):
        raise OSError("disk full")

    monkeypatch.setattr(cachedir, "write_manifest", broken)
    final = tmp_path / "entries" / "key"
    with pytest.raises(OSError, match="disk full"):
        save_entry(final, {"x": list_column([np.arange(3)], np.int32)}, {"key": "key"})
    assert list((tmp_path / "entries").iterdir()) == []
    monkeypatch.undo()
    save_entry(final, {"x": list_column([np.arange(3)], np.int32)}, {"key": "key"})
    table, manifest = load_entry(final)
    assert table.num_rows == 1 and manifest["rows"] == 1 and list((tmp_path / "entries").iterdir()) == [final]


# ---------------------------------------------------------------------------------------------
# atomic writes


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch, failing):
    target = tmp_path / "results.json"
    atomic_write_json(target, {"old": True})

    def boom(*args, **kwargs):
        raise OSError(f"{failing} failed")

    monkeypatch.setattr(os, failing, boom)
    with pytest.raises(OSError, match=failing):
        atomic_write_bytes(target, b'{"new": true}')
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_an_interrupted_atomic_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """KeyboardInterrupt (or SIGTERM's SystemExit) in the middle of writing."""
    real = os.fsync

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(tmp_path / "report.html", b"<html>")
    monkeypatch.setattr(os, "fsync", real)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# the fault hook


@pytest.mark.parametrize(
    "spec, parsed",
    [("scoring", ("scoring", "raise", 1)), ("profile:kill", ("profile", "kill", 1)), ("profile:error@2", ("profile", "error", 2)),
     ("results:raise@3", ("results", "raise", 3))],
)
def test_fault_specs(spec, parsed):
    assert faults.parse(spec) == parsed


@pytest.mark.parametrize("spec", ["nowhere", "scoring:explode", "scoring@0", "scoring@x", ":raise"])
def test_bad_fault_specs_name_the_stages_and_modes(spec):
    with pytest.raises(ValueError, match="expected <stage>"):
        faults.parse(spec)


def test_fault_points_do_nothing_unless_named(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.fault_point("scoring")
    monkeypatch.setenv(faults.ENV, "report")
    faults.reset()
    faults.fault_point("scoring")


def test_a_raised_fault_is_an_interruption_not_a_handled_error(monkeypatch):
    monkeypatch.setenv(faults.ENV, "scoring@2")
    faults.reset()
    faults.fault_point("scoring")  # the first occurrence passes
    with pytest.raises(faults.InjectedFault, match="stage 'scoring'"):
        try:
            faults.fault_point("scoring")
        except Exception:  # noqa: BLE001 - what the pipeline's handlers catch
            pytest.fail("an injected interruption must not be caught as an ordinary error")
    faults.fault_point("scoring")  # only the named occurrence


def test_an_error_fault_is_an_ordinary_failure(monkeypatch):
    monkeypatch.setenv(faults.ENV, "engine:error")
    faults.reset()
    with pytest.raises(RuntimeError, match="stage 'engine'"):
        faults.fault_point("engine")


# ---------------------------------------------------------------------------------------------
# engine failures


def _chained(outer: Exception, inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as exc:
            raise outer from exc
    except Exception as exc:  # noqa: BLE001
        return exc


@pytest.mark.parametrize(
    "exc, stage, kind, message",
    [
        (_chained(RuntimeError("vLLM could not load the model"),
                  ValueError("1 validation error for ModelConfig\n  Value error, User-specified max_model_len (512) is greater")),
         "engine start", "did not start", "ValueError: User-specified max_model_len (512) is greater"),
        (_chained(RuntimeError("Engine core initialization failed. See root cause above."),
                  ValueError("No available memory for the cache blocks. Try increasing `gpu_memory_utilization`")),
         "engine start", "out of memory", "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"),
        (MemoryError("cannot allocate 2 GiB"), "scoring", "out of memory", "cannot allocate 2 GiB"),
        (ValueError("Too long. " * 40 + " [type=value_error, input_value=...]"), "profiling", "died", ("Too long. " * 24).strip()),
        (RuntimeError("EngineCore encountered an issue.\nTraceback ..."), "scoring", "died", "EngineCore encountered an issue."),
        (faults.InjectedError("fault injected at stage 'engine'"), "engine start", "injected", "fault injected at stage 'engine'"),
    ],
    ids=["refused-config", "no-kv-memory", "oom-while-scoring", "long-message", "died", "injected"],
)
def test_an_engine_failure_names_the_message_and_the_knobs(exc, stage, kind, message):
    entry = faults.engine_failure(exc, candidate="early-exit-4", draft="/cache/derived/x", stage=stage,
                                  gpu_memory_utilization=0.25, max_model_len=512, concurrency=[1, 4, 16], dtype="bfloat16")
    assert (entry["kind"], entry["error"], entry["stage"]) == (kind, message, stage)
    assert {name: knob["value"] for name, knob in entry["knobs"].items()} == {
        "gpu_memory_utilization": 0.25, "max_model_len": 512, "concurrency": 16, "draft_dtype": "bfloat16"}
    assert message in entry["reason"] and "max_model_len (now 512)" in entry["reason"]


def test_the_report_shows_a_failed_draft_with_its_knobs():
    from draftfit.report import render_html
    from draftfit.results import load

    results = load(Path(__file__).resolve().parents[1] / "reports" / "example" / "results.json")
    failure = faults.engine_failure(ValueError("No available memory for the cache blocks"), candidate="big-draft", draft="org/big",
                                    stage="engine start", gpu_memory_utilization=0.25, max_model_len=4096, concurrency=[1, 8],
                                    dtype="bfloat16")
    results = results.model_copy(update={"failed": [failure], "candidates": [*results.candidates,
                                 {"name": "big-draft", "target": "smollm2", "draft": {"method": "draft_model", "model": "org/big"}}]})
    html = render_html(results)
    assert "big-draft" in html and "No available memory for the cache blocks" in html
    assert "engine failed" in html
    for knob in ("gpu_memory_utilization", "max_model_len", "concurrency", "draft_dtype"):
        assert f"<code>{knob}</code>" in html


# ---------------------------------------------------------------------------------------------
# converted model directories (GGUF, slow tokenizers)


@pytest.mark.parametrize(
    "state, whole, kept",
    [
        ("whole", True, True),
        ("truncated", False, False),
        ("no-manifest", False, False),  # an interrupted write, or an older draftfit's entry: never trusted
    ],
)
def test_a_converted_directory_is_used_only_when_whole(tmp_path, state, whole, kept):
    from draftfit.refs import SOURCE_MARKER, _whole

    final = tmp_path / "model"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"\0" * 4096)
    (final / "config.json").write_text("{}")
    (final / SOURCE_MARKER).write_text('{"gguf": "x.gguf"}')
    if state in ("whole", "truncated"):
        cachedir.write_manifest(final)
        cachedir._verified.clear()
    if state == "truncated":
        (final / "model.safetensors").write_bytes(b"\0" * 100)
    assert _whole(final) is whole
    assert final.exists() is kept

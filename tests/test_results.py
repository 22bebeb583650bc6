"""results.json: versioned schema, atomic save, clear errors for other versions and bad files."""

from __future__ import annotations

import json

import pytest

from draftfit import results as R
from draftfit.errors import DraftfitError


def sample() -> R.Results:
    return R.Results(
        run_id="20261129-000000",
        created="2026-11-29T00:00:00Z",
        provenance=R.provenance(argv=["draftfit", "rank", "candidates/a.yaml"], seeds={"sample": 0}),
        study={"sample_size": 4},
        candidates=[{"name": "a"}],
        configs=[{
            "candidate": "a", "method": "ngram", "k": 2, "al_predicted": 1.5,
            "per_concurrency": [{"concurrency": 1, "speedup_predicted": 1.2}, {"concurrency": 8, "speedup_predicted": 0.9}],
        }],
    )


def test_round_trip_and_csv(tmp_path):
    json_path, csv_path = R.save(sample(), tmp_path / "run")
    loaded = R.load(json_path)
    assert loaded == sample().model_copy(update={"provenance": loaded.provenance})
    lines = csv_path.read_text().splitlines()
    assert lines[0].split(",")[:5] == ["run_id", "candidate", "method", "draft", "k"]
    assert len(lines) == 3  # one row per (config, concurrency)
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_provenance_names_versions_command_and_seeds():
    prov = R.provenance(argv=["draftfit", "rank", "x y.yaml"], seeds={"sample": 3})
    assert prov["command_line"] == "draftfit rank 'x y.yaml'"
    assert prov["seeds"] == {"sample": 3} and "numpy" in prov["packages"] and prov["draftfit"]


@pytest.mark.parametrize(
    "content, words",
    [
        ('{"schema_version": 99}', "results schema version 99 is not the version this draftfit reads (1)"),
        ('{"run_id": 1}', "not a draftfit results file"),
        ("{not json", "not a valid JSON results file"),
        ('{"schema_version": 1, "run_id": "x"}', "created: Field required"),
    ],
)
def test_bad_results_files(tmp_path, content, words):
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(DraftfitError) as info:
        R.load(path)
    assert words in str(info.value) and str(path) in str(info.value)


def test_missing_results_file(tmp_path):
    with pytest.raises(DraftfitError, match="no such file"):
        R.load(tmp_path / "nope.json")


def test_saved_file_is_plain_json(tmp_path):
    json_path, _ = R.save(sample(), tmp_path)
    assert json.loads(json_path.read_text())["schema_version"] == R.SCHEMA_VERSION

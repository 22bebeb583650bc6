"""results.json: versioned schema, atomic save, clear errors for other versions and bad files."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from draftfit import results as R
from draftfit.errors import DraftfitError
from draftfit.records import PARENT_KEYS, ConfigEntry, LevelEntry, MeasuredEntry


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
        ('{"schema_version": 99}', "results schema version 99 is not the version this draftfit reads (2)"),
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


SCHEMA1 = Path(__file__).parent / "data" / "results-schema1.json"


def _csv_of_schema1(data: dict) -> str:
    """The CSV as draftfit wrote it from a schema-1 file: every level row carried its parent's fields."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=R.CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for config in data["configs"]:
        for level in config["per_concurrency"]:
            writer.writerow({"run_id": data["run_id"], **{k: v for k, v in config.items() if k != "per_concurrency"}, **level})
    return buffer.getvalue()


def test_a_schema_1_file_is_migrated_and_reads_the_same():
    raw = json.loads(SCHEMA1.read_text())
    assert raw["schema_version"] == 1 and set(PARENT_KEYS) <= set(raw["configs"][0]["per_concurrency"][0])
    loaded = R.load(SCHEMA1)
    assert loaded.schema_version == R.SCHEMA_VERSION == 2
    for config in loaded.configs:
        assert config["per_concurrency"] and all(not set(PARENT_KEYS) & set(level) for level in config["per_concurrency"])
    assert R.to_csv(loaded) == _csv_of_schema1(raw)
    assert loaded.measured == raw["measured"]


def test_every_csv_column_is_a_record_field():
    fields = set(ConfigEntry.__annotations__) | set(LevelEntry.__annotations__) | {"run_id"}
    assert set(R.CSV_COLUMNS) <= fields
    assert set(PARENT_KEYS) <= set(ConfigEntry.__annotations__) and not set(PARENT_KEYS) & set(LevelEntry.__annotations__)


@pytest.mark.parametrize("where, change, words", [
    ("config", lambda c: c.update(al_predictd=1.0), "configs.0.al_predictd: Extra inputs are not permitted"),
    ("level", lambda c: c["per_concurrency"][0].update(rank=1), "configs.0.per_concurrency.0.rank: Extra inputs are not permitted"),
    ("level", lambda c: c["per_concurrency"][0].update(speedup_predicted="fast"), "configs.0.per_concurrency.0.speedup_predicted"),
])
def test_records_refuse_unknown_or_mistyped_fields(tmp_path, where, change, words):
    data = sample().model_dump(mode="json")
    change(data["configs"][0])
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DraftfitError) as info:
        R.load(path)
    assert words in str(info.value)


def test_every_record_field_is_described():
    for record in (ConfigEntry, LevelEntry, MeasuredEntry):
        schema = TypeAdapter(record).json_schema()
        missing = [name for name, prop in schema["properties"].items() if not prop.get("description")]
        assert not missing, f"{record.__name__}: {missing}"


def test_an_undefined_number_is_saved_as_strict_json_null(tmp_path):
    results = sample()
    results.configs[0]["conditional_predicted"] = [1.0, float("nan")]
    results.configs[0]["per_concurrency"][0]["speedup_ci_high"] = float("inf")
    json_path, _ = R.save(results, tmp_path)
    text = json_path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["configs"][0]["conditional_predicted"] == [1.0, None]
    assert data["configs"][0]["per_concurrency"][0]["speedup_ci_high"] is None

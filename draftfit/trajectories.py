"""Pipeline step 3: target trajectories, generated once and cached.

The target answers every sampled prompt once under the study's sampling parameters; each answer
keeps its output token ids and, per position, the top-K of the processed distribution it was drawn
from (see :mod:`draftfit.engines.base`). The set is saved as a ``datasets`` dataset under
``<cache>/trajectories/<key>`` where the key hashes (target fingerprint, prompts hash, sampling
parameters, engine and version, dtype, top-K). A later run with the same key loads it and builds
no engine at all, so adding a candidate costs only that candidate's scoring.

Cache entries are :mod:`draftfit.cachedir` directories: written into a temporary directory and
renamed into place, with a manifest of the SHA-256 of every file written last; an entry whose
manifest is missing or does not match its files (a crash, a truncated copy) is rebuilt.

The helpers :func:`save_entry` / :func:`load_entry` are shared with :mod:`draftfit.draft_scoring`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftfit import __version__, cachedir
from draftfit.cachedir import MANIFEST  # noqa: F401 - re-exported: the name tests and tools use
from draftfit.engines import EngineConfig, SamplingSpec, Trajectory
from draftfit.engines.base import Engine
from draftfit.paths import cache_dir
from draftfit.refs import ModelRef, fingerprint

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
EngineFactory = Callable[[ModelRef], Engine]


# ---------------------------------------------------------------------------------------------
# keys


def prompts_hash(prompt_token_ids: Sequence[Sequence[int]]) -> str:
    """SHA-256 of the prompts' token ids (order and lengths included)."""
    digest = hashlib.sha256(f"prompts:{len(prompt_token_ids)}".encode())
    for ids in prompt_token_ids:
        arr = np.asarray(ids, dtype=np.int64)
        digest.update(arr.shape[0].to_bytes(8, "little"))
        digest.update(arr.astype("<i8").tobytes())
    return digest.hexdigest()


def make_key(fields: dict[str, Any]) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def trajectory_fields(
    target_fingerprint: str,
    prompt_token_ids: Sequence[Sequence[int]],
    sampling: SamplingSpec,
    engine_config: EngineConfig,
    top_k: int,
) -> dict[str, Any]:
    return {
        "kind": "trajectories",
        "schema": SCHEMA_VERSION,
        "target": target_fingerprint,
        "prompts": prompts_hash(prompt_token_ids),
        "sampling": sampling.to_dict(),
        "top_k": int(top_k),
        **engine_config.key_fields(),
    }


# ---------------------------------------------------------------------------------------------
# the cache store: one datasets directory + a manifest written last


def save_entry(final: Path, columns: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``columns`` (name -> pyarrow array) as a datasets dataset at ``final``, atomically."""
    import datasets
    import pyarrow as pa
    from datasets.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    tmp = cachedir.temp_dir(final)
    try:
        table = pa.table(columns)
        quiet = not are_progress_bars_disabled()
        if quiet:
            disable_progress_bars()
        try:
            datasets.Dataset(table).save_to_disk(str(tmp / "data"))
        finally:
            if quiet:
                enable_progress_bars()
        cachedir.write_manifest(tmp, {**meta, "rows": table.num_rows, "draftfit": __version__})  # last: marks the entry whole
        cachedir.publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_entry(path: Path):
    """``(pyarrow table, manifest)`` of a sound cache entry, else ``None`` (missing or damaged)."""
    manifest = cachedir.verified(path)
    if manifest is None:
        return None
    try:
        import datasets

        table = datasets.load_from_disk(str(path / "data")).data.table
        if table.num_rows != manifest["rows"]:
            raise ValueError("row count does not match the manifest")
    except Exception as exc:  # damaged: say so, and let the caller rebuild
        log.warning("cache entry %s is damaged (%s); rebuilding it", path, exc)
        return None
    return table, manifest


def list_column(arrays: Sequence[np.ndarray], dtype) -> Any:
    """A pyarrow ``list<dtype>`` column from per-row numpy arrays (flattened), without Python loops over values."""
    import pyarrow as pa

    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate([np.asarray(a, dtype=dtype).ravel() for a in arrays]) if arrays else np.zeros(0, dtype)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))


def split_column(table, name: str, width: int | None = None) -> list[np.ndarray]:
    """Per-row numpy arrays of a list column (reshaped to ``[-1, width]`` when ``width`` is given)."""
    column = table.column(name).combine_chunks()
    if len(column) == 0:
        return []
    offsets = column.offsets.to_numpy()
    values = column.flatten().to_numpy(zero_copy_only=False)
    rows = np.split(values, offsets[1:-1] - offsets[0])
    if width is not None:
        rows = [r.reshape(-1, width) for r in rows]
    return rows


# ---------------------------------------------------------------------------------------------
# trajectories


@dataclass
class TrajectorySet:
    """The target's answers to the sampled prompts, with where they came from."""

    key: str
    trajectories: list[Trajectory]
    sampling: SamplingSpec
    top_k: int
    target: str  # fingerprint of the target model
    engine: dict[str, Any]  # EngineInfo of the engine that generated them
    path: Path
    from_cache: bool
    timings: dict[str, float] = field(default_factory=dict)  # wall / engine seconds of this call

    def __len__(self) -> int:
        return len(self.trajectories)

    def sequences(self) -> tuple[list[np.ndarray], list[int]]:
        """Prompt + response token ids and the response starts, for draft scoring."""
        return [t.sequence for t in self.trajectories], [t.response_start for t in self.trajectories]

    @property
    def output_tokens(self) -> int:
        return int(sum(len(t) for t in self.trajectories))


def _trajectory_columns(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    import pyarrow as pa

    return {
        "prompt_token_ids": list_column([t.prompt_token_ids for t in trajectories], np.int32),
        "token_ids": list_column([t.token_ids for t in trajectories], np.int32),
        "token_logprobs": list_column([t.token_logprobs for t in trajectories], np.float32),
        "top_ids": list_column([t.top_ids for t in trajectories], np.int32),
        "top_logprobs": list_column([t.top_logprobs for t in trajectories], np.float32),
        "finish_reason": pa.array([t.finish_reason for t in trajectories], pa.string()),
    }


def _trajectories_from(table, top_k: int) -> list[Trajectory]:
    columns = {name: split_column(table, name) for name in ("prompt_token_ids", "token_ids", "token_logprobs")}
    top_ids = split_column(table, "top_ids", top_k)
    top_lps = split_column(table, "top_logprobs", top_k)
    reasons = table.column("finish_reason").to_pylist()
    return [
        Trajectory(
            prompt_token_ids=columns["prompt_token_ids"][i],
            token_ids=columns["token_ids"][i],
            token_logprobs=columns["token_logprobs"][i],
            top_ids=top_ids[i],
            top_logprobs=top_lps[i],
            finish_reason=reasons[i],
        )
        for i in range(table.num_rows)
    ]


def engine_timings(*engines: Engine) -> dict[str, float]:
    """Seconds the engines spent starting, working and shutting down (for the engine/own split)."""
    out = {"engine": 0.0, "engine_startup": 0.0, "engine_calls": 0.0, "engine_shutdown": 0.0}
    for engine in engines:
        for timing in engine.timings:
            part = {"startup": "engine_startup", "shutdown": "engine_shutdown"}.get(timing.op, "engine_calls")
            out[part] += timing.seconds
            out["engine"] += timing.seconds
    return out


def default_factory(engine_config: EngineConfig) -> EngineFactory:
    """Build an engine for a model reference (GGUF references are converted once, then cached)."""

    def build(ref: ModelRef) -> Engine:
        from draftfit.engines import open_engine
        from draftfit.refs import model_dir

        return open_engine(model_dir(ref, trust_remote_code=engine_config.trust_remote_code), engine_config)

    return build


def trajectories_dir(cache_root: Path | None = None) -> Path:
    return Path(cache_root or cache_dir()) / "trajectories"


def load_trajectories(key: str, cache_root: Path | None = None) -> TrajectorySet | None:
    """A cached trajectory set by key, or ``None``."""
    path = trajectories_dir(cache_root) / key
    entry = load_entry(path)
    if entry is None:
        return None
    table, manifest = entry
    top_k = int(manifest["fields"]["top_k"])
    return TrajectorySet(
        key=key,
        trajectories=_trajectories_from(table, top_k),
        sampling=SamplingSpec(**manifest["fields"]["sampling"]),
        top_k=top_k,
        target=manifest["fields"]["target"],
        engine=manifest.get("engine", {}),
        path=path,
        from_cache=True,
    )


def target_trajectories(
    target: ModelRef,
    prompt_token_ids: Sequence[Sequence[int]],
    sampling: SamplingSpec,
    *,
    engine_config: EngineConfig | None = None,
    top_k: int = 20,
    cache_root: Path | None = None,
    engine_factory: EngineFactory | None = None,
) -> TrajectorySet:
    """The target's trajectories for these prompts: from the cache, else generated once and saved.

    No engine is built on a cache hit. ``engine_factory(ref)`` builds the engine otherwise (by
    default :func:`draftfit.engines.open_engine` on :func:`draftfit.refs.model_dir`); the engine is
    closed before this returns.
    """
    start = time.perf_counter()
    engine_config = engine_config or EngineConfig()
    fields = trajectory_fields(fingerprint(target), prompt_token_ids, sampling, engine_config, top_k)
    key = make_key(fields)
    cached = load_trajectories(key, cache_root)
    if cached is not None:
        cached.timings = {"wall": time.perf_counter() - start, "engine": 0.0}
        return cached
    factory = engine_factory or default_factory(engine_config)
    with factory(target) as engine:
        trajectories = engine.generate_trajectories(prompt_token_ids, sampling, top_k)
        info = engine.info.to_dict()
    path = trajectories_dir(cache_root) / key
    save_entry(path, _trajectory_columns(trajectories), {"key": key, "fields": fields, "engine": info, "target_spec": target.spec})
    return TrajectorySet(
        key=key,
        trajectories=trajectories,
        sampling=sampling,
        top_k=top_k,
        target=fields["target"],
        engine=info,
        path=path,
        from_cache=False,
        timings={"wall": time.perf_counter() - start, **engine_timings(engine)},
    )

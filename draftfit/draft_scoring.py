"""Pipeline step 4: score each draft model against the target's trajectories, one prefill each.

Every draft reads prompt + target response (the cached :class:`~draftfit.trajectories.TrajectorySet`)
once and returns its top-K at every response position (raw log-probabilities, see
:mod:`draftfit.engines.base`). With the transformers backend and ``exact=True`` the target's
prefill runs next to the draft's and the full distributions are reduced to exact acceptance
inputs (:class:`~draftfit.engines.base.ExactInputs`).

Results are cached like trajectories, under ``<cache>/scores/<key>`` where the key hashes (draft
fingerprint, trajectory key — which already names target, prompts, sampling and target engine —,
scoring engine and version, dtype, top-K, mode). :func:`score_drafts` builds one engine at a time
and only for drafts whose scores are not cached yet.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftfit.engines import EngineConfig
from draftfit.engines.base import DraftScore, ExactInputs
from draftfit.errors import DraftfitError
from draftfit.paths import cache_dir
from draftfit.refs import ModelRef, fingerprint
from draftfit.trajectories import (
    SCHEMA_VERSION,
    EngineFactory,
    TrajectorySet,
    default_factory,
    engine_timings,
    list_column,
    load_entry,
    make_key,
    save_entry,
    split_column,
)

_EXACT_VECTORS = ("draft_argmax", "p_draft_argmax", "overlap", "target_token_logprobs", "draft_token_logprobs")
_VECTOR_DTYPES = {
    "token_logprobs": np.float32,
    "token_ranks": np.int32,
    "draft_argmax": np.int32,
    "p_draft_argmax": np.float32,
    "overlap": np.float32,
    "target_token_logprobs": np.float32,
    "draft_token_logprobs": np.float32,
}


@dataclass
class DraftScores:
    """One draft's scores over a trajectory set (index i matches trajectory i)."""

    key: str
    draft: str  # fingerprint of the draft model
    draft_spec: str  # what the user named
    trajectory_key: str
    mode: str  # "topk" (raw top-K only) | "exact" (plus ExactInputs)
    top_k: int
    scores: list[DraftScore]
    engine: dict[str, Any]
    path: Path
    from_cache: bool
    timings: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.scores)


def score_fields(
    draft_fingerprint: str, trajset: TrajectorySet, engine_config: EngineConfig, top_k: int, mode: str
) -> dict[str, Any]:
    fields = {
        "kind": "scores",
        "schema": SCHEMA_VERSION,
        "draft": draft_fingerprint,
        "trajectories": trajset.key,
        "top_k": int(top_k),
        "mode": mode,
        **engine_config.key_fields(),
    }
    if mode == "exact":  # the exact inputs depend on how the target's distribution is processed
        fields["sampling"] = trajset.sampling.to_dict()
    return fields


def scores_dir(cache_root: Path | None = None) -> Path:
    return Path(cache_root or cache_dir()) / "scores"


def _columns(scores: Sequence[DraftScore], exact: bool) -> dict[str, Any]:
    columns = {
        "top_ids": list_column([s.top_ids for s in scores], np.int32),
        "top_logprobs": list_column([s.top_logprobs for s in scores], np.float32),
        "token_logprobs": list_column([s.token_logprobs for s in scores], np.float32),
        "token_ranks": list_column([s.token_ranks for s in scores], np.int32),
    }
    if exact:
        for name in _EXACT_VECTORS:
            if any(getattr(s.exact, name) is None for s in scores):
                continue
            columns[name] = list_column([getattr(s.exact, name) for s in scores], _VECTOR_DTYPES[name])
        columns["target_top_ids"] = list_column([s.exact.target_top_ids for s in scores], np.int32)
        columns["target_top_logprobs"] = list_column([s.exact.target_top_logprobs for s in scores], np.float32)
    return columns


def _scores_from(table, top_k: int, exact: bool) -> list[DraftScore]:
    top_ids = split_column(table, "top_ids", top_k)
    top_lps = split_column(table, "top_logprobs", top_k)
    token_lps = split_column(table, "token_logprobs")
    ranks = split_column(table, "token_ranks")
    extra: dict[str, list[np.ndarray]] = {}
    if exact:
        extra = {name: split_column(table, name) for name in _EXACT_VECTORS if name in table.column_names}
        extra["target_top_ids"] = split_column(table, "target_top_ids", top_k)
        extra["target_top_logprobs"] = split_column(table, "target_top_logprobs", top_k)
    return [
        DraftScore(
            top_ids=top_ids[i],
            top_logprobs=top_lps[i],
            token_logprobs=token_lps[i],
            token_ranks=ranks[i],
            exact=ExactInputs(**{name: values[i] for name, values in extra.items()}) if exact else None,
        )
        for i in range(table.num_rows)
    ]


def load_scores(key: str, cache_root: Path | None = None) -> tuple[list[DraftScore], dict[str, Any]] | None:
    path = scores_dir(cache_root) / key
    entry = load_entry(path)
    if entry is None:
        return None
    table, manifest = entry
    fields = manifest["fields"]
    return _scores_from(table, int(fields["top_k"]), fields["mode"] == "exact"), manifest


def score_draft(
    trajset: TrajectorySet,
    draft: ModelRef,
    *,
    engine_config: EngineConfig | None = None,
    top_k: int | None = None,
    exact: bool = False,
    target: ModelRef | None = None,
    cache_root: Path | None = None,
    engine_factory: EngineFactory | None = None,
) -> DraftScores:
    """One draft's scores over ``trajset``: from the cache, else one prefill per sequence, saved.

    ``exact=True`` needs the transformers backend and the ``target`` reference (its prefill runs
    beside the draft's). No engine is built on a cache hit; otherwise engines are closed before
    this returns.
    """
    start = time.perf_counter()
    engine_config = engine_config or EngineConfig()
    top_k = int(top_k or trajset.top_k)
    mode = "exact" if exact else "topk"
    if exact:
        if engine_config.backend != "transformers":
            raise DraftfitError(
                "exact scoring needs full-vocabulary logits", where="scoring", fix="Use the transformers engine for exact scores"
            )
        if target is None or fingerprint(target) != trajset.target:
            raise DraftfitError(
                "exact scoring needs the target that generated the trajectories",
                where="scoring",
                fix="Pass the same target reference as for the trajectories",
            )
    fields = score_fields(fingerprint(draft), trajset, engine_config, top_k, mode)
    key = make_key(fields)
    path = scores_dir(cache_root) / key
    cached = load_scores(key, cache_root)
    if cached is not None:
        scores, manifest = cached
        return DraftScores(
            key, fields["draft"], draft.spec, trajset.key, mode, top_k, scores, manifest.get("engine", {}), path, True,
            {"wall": time.perf_counter() - start, "engine": 0.0},
        )
    factory = engine_factory or default_factory(engine_config)
    sequences, starts = trajset.sequences()
    if exact:
        assert target is not None
        with factory(draft) as draft_engine, factory(target) as target_engine:
            scores = draft_engine.score_exact(target_engine, sequences, starts, trajset.sampling, top_k)
            info = draft_engine.info.to_dict()
        timings = engine_timings(draft_engine, target_engine)
    else:
        with factory(draft) as engine:
            scores = engine.score(sequences, starts, top_k)
            info = engine.info.to_dict()
        timings = engine_timings(engine)
    for i, (score, trajectory) in enumerate(zip(scores, trajset.trajectories, strict=True)):
        if len(score) != len(trajectory):
            raise RuntimeError(f"draft scores for sequence {i} cover {len(score)} positions, its answer has {len(trajectory)}")
    save_entry(path, _columns(scores, exact), {"key": key, "fields": fields, "engine": info, "draft_spec": draft.spec})
    return DraftScores(
        key, fields["draft"], draft.spec, trajset.key, mode, top_k, scores, info, path, False,
        {"wall": time.perf_counter() - start, **timings},
    )


def score_drafts(
    trajset: TrajectorySet,
    drafts: Sequence[ModelRef],
    **options: Any,
) -> list[DraftScores]:
    """Score several drafts, one engine at a time; cached drafts build no engine."""
    return [score_draft(trajset, draft, **options) for draft in drafts]

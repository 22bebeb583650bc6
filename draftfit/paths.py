"""Where draftfit keeps its cache (converted GGUFs, derived drafts, trajectories, scores)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "DRAFTFIT_CACHE"


def cache_dir() -> Path:
    """The cache root: ``$DRAFTFIT_CACHE``, else ``$XDG_CACHE_HOME/draftfit``, else ``~/.cache/draftfit``."""
    if os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV])
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(base) / "draftfit"
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_subdir(name: str) -> Path:
    path = cache_dir() / name
    path.mkdir(parents=True, exist_ok=True)
    return path

"""Shared fixtures.

The draftfit cache never points at the user's home during tests: scripts/test sets
DRAFTFIT_CACHE to a project-local directory (so the embedded model is converted once per
machine); without it, a per-session temporary directory is used.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _draftfit_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.environ.get("DRAFTFIT_CACHE"):
        os.environ["DRAFTFIT_CACHE"] = str(tmp_path_factory.mktemp("draftfit-cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return Path(os.environ["DRAFTFIT_CACHE"])


@pytest.fixture(scope="session")
def smollm2_ref():
    from draftfit.refs import resolve

    return resolve("smollm2")


@pytest.fixture(scope="session")
def smollm2_meta(smollm2_ref) -> Path:
    """The embedded SmolLM2-135M-Instruct tokenizer/config, read from the bundled GGUF (converted once)."""
    from draftfit.refs import metadata_dir

    return metadata_dir(smollm2_ref)


@pytest.fixture(scope="session")
def smollm2_model(smollm2_ref) -> Path:
    """The embedded model as an HF directory with weights (dequantized from the GGUF once)."""
    from draftfit.refs import model_dir

    return model_dir(smollm2_ref)


# Session-scoped engine fixtures (one shared vLLM engine per test session).
from engine_fixtures import *  # noqa: E402,F401,F403

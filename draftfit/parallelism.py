"""vLLM's parallelism for the deployment and for the engines draftfit starts: one place for the flags,
the engine arguments, and the combinations vLLM refuses, caught before anything loads.

The refusals quote the installed vLLM 0.32.0 (``vllm/config/model.py`` ``verify_with_parallel_config``,
``vllm/config/speculative.py`` ``_verify_and_get_draft_tp``, ``vllm/v1/spec_decode/draft_model.py``,
``vllm/entrypoints/llm.py``, ``vllm/config/parallel.py``, ``vllm/v1/executor/ray_utils.py``). Speculative
decoding itself runs under TP, PP (the proposer on the last stage) and DP in 0.32; what fails is a head
count the TP does not divide (the draft's too, at the draft's TP), a draft TP other than 1 or the
target's, a draft model at a TP other than the target's, PP for an architecture without ``SupportsPP``,
data parallelism in a single-process ``LLM``, and ray where it is not installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from draftfit.errors import DraftfitError

Backend = Literal["mp", "ray", "uni", "external_launcher"]
BACKENDS: tuple[str, ...] = ("mp", "ray", "uni", "external_launcher")


@dataclass(frozen=True)
class Parallelism:
    """How vLLM spreads one deployment: TP × PP GPUs per engine, DP engines, and the executor backend
    (``None``: vLLM chooses, ``mp`` on one node)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: Backend | None = None

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if int(getattr(self, name)) < 1:
                raise DraftfitError(f"{name} {getattr(self, name)} must be ≥ 1",
                                    fix=f"Pass --{name.replace('_', '-')} 1 or more")
        if self.distributed_executor_backend not in (None, *BACKENDS):
            raise DraftfitError(
                f"Unrecognized distributed executor backend {self.distributed_executor_backend}",
                fix=f"Use one of: {', '.join(BACKENDS)}",
            )

    @property
    def world_size(self) -> int:
        """GPUs one engine (one DP rank) spans."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus(self) -> int:
        return self.world_size * self.data_parallel_size

    @property
    def single(self) -> bool:
        return self.gpus == 1 and self.distributed_executor_backend in (None, "mp", "uni")

    def serve_flags(self) -> list[str]:
        """The ``vllm serve`` flags, only those that differ from vLLM's defaults."""
        flags: list[str] = []
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) != 1:
                flags += [f"--{name.replace('_', '-')}", str(getattr(self, name))]
        if self.distributed_executor_backend is not None:
            flags += ["--distributed-executor-backend", self.distributed_executor_backend]
        return flags

    def engine_kwargs(self, *, offline: bool) -> dict[str, Any]:
        """Engine arguments of an engine draftfit starts. An offline ``LLM`` is one DP rank: vLLM refuses
        ``LLM(data_parallel_size>1)``, and every rank of a deployment runs the same engine."""
        kwargs: dict[str, Any] = {"tensor_parallel_size": self.tensor_parallel_size,
                                  "pipeline_parallel_size": self.pipeline_parallel_size}
        if self.data_parallel_size != 1 and not offline:
            kwargs["data_parallel_size"] = self.data_parallel_size
        if self.distributed_executor_backend is not None:
            kwargs["distributed_executor_backend"] = self.distributed_executor_backend
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        return {"tensor_parallel_size": self.tensor_parallel_size, "pipeline_parallel_size": self.pipeline_parallel_size,
                "data_parallel_size": self.data_parallel_size,
                "distributed_executor_backend": self.distributed_executor_backend}

    # ---- what vLLM refuses, before anything loads -------------------------------------------

    def target_refusal(self, config: Mapping[str, Any], *, what: str = "target") -> str | None:
        """vLLM's refusal of this layout for a model with HF ``config``, with the fix; None if it starts."""
        heads = attention_heads(config)
        tp = self.tensor_parallel_size
        if heads is not None and heads % tp:
            return (f"{what}: vLLM refuses it: \"Total number of attention heads ({heads}) must be divisible by "
                    f"tensor parallel size ({tp}).\" Use a --tensor-parallel-size that divides {heads}")
        if self.pipeline_parallel_size > 1:
            layers = config.get("num_hidden_layers")
            if isinstance(layers, int) and self.pipeline_parallel_size > layers:
                return (f"{what}: {layers} layers cannot be split into {self.pipeline_parallel_size} pipeline stages. "
                        f"Use a --pipeline-parallel-size ≤ {layers}")
            unsupported = [arch for arch in config.get("architectures") or [] if supports_pp(arch) is False]
            if unsupported:
                return (f"{what} ({unsupported[0]}): vLLM refuses it: \"Pipeline parallelism is not supported for this "
                        "model. Supported models implement the `SupportsPP` interface.\" Use --pipeline-parallel-size 1 "
                        "and more tensor parallelism")
        return None

    def draft_refusal(self, method, draft_config: Mapping[str, Any] | None, draft_tp: int | None) -> str | None:
        """vLLM's refusal of a draft (``method``: a :mod:`draftfit.methods` entry) at this layout."""
        tp = self.tensor_parallel_size
        if draft_tp is not None and draft_tp not in (1, tp):
            return (f"vLLM refuses it: \"speculative_draft_tensor_parallel_size={draft_tp} cannot be other value than 1 "
                    f"or target model tensor_parallel_size\". Set draft_tensor_parallel_size to 1 or {tp}")
        effective = draft_tp or tp
        if method.draft_tp_is_target_tp and effective != tp:
            return ("vLLM's draft-model proposer refuses it: \"Currently, 'draft_tensor_parallel_size' and "
                    f"'tensor_parallel_size' must be the same. Got {effective} and {tp}.\" Drop draft_tensor_parallel_size")
        if draft_config is not None:
            heads = attention_heads(draft_config)
            if heads is not None and heads % effective:
                return (f"the draft at TP {effective}: vLLM refuses it: \"Total number of attention heads ({heads}) must "
                        f"be divisible by tensor parallel size ({effective}).\" Pick a draft whose head count "
                        f"{effective} divides, or a --tensor-parallel-size that divides {heads}")
        return None

    def engine_refusal(self) -> str | None:
        """What stops vLLM from starting this layout's engines on this machine (ray missing)."""
        if self.distributed_executor_backend == "ray" and importlib.util.find_spec("ray") is None:
            return ("vLLM refuses it: \"Failed to import Ray: No module named 'ray'. Please install Ray with "
                    "`pip install ray`.\" Install ray here, or drop --distributed-executor-backend ray")
        return None


def attention_heads(config: Mapping[str, Any]) -> int | None:
    """The attention-head count vLLM checks against the TP (a multimodal config's text part)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else None
    for source in (config, text or {}):
        for key in ("num_attention_heads", "n_head"):
            if isinstance(source.get(key), int):
                return int(source[key])
    return None


def supports_pp(architecture: str) -> bool | None:
    """Whether the installed vLLM's model class for ``architecture`` implements ``SupportsPP``
    (None: no vLLM here, or the architecture is not in its registry)."""
    try:
        from vllm.model_executor.models.registry import ModelRegistry

        info = ModelRegistry._try_inspect_model_cls(architecture)  # noqa: SLF001 - the registry's own lookup
    except Exception:  # noqa: BLE001 - no vLLM, or a registry of another shape: vLLM decides at start-up
        return None
    return None if info is None else bool(info.supports_pp)


def on_gpu() -> bool:
    """Whether the engines here run on GPUs (where the deployment's layout can run as deployed)."""
    try:
        from vllm.platforms import current_platform

        return not current_platform.is_cpu()
    except Exception:  # noqa: BLE001
        return False


def engine_parallelism(deployed: Parallelism) -> tuple[Parallelism, str | None]:
    """The layout the engines draftfit starts here use, and a note when it is not the deployment's.

    They are one data-parallel engine: every DP rank runs the same engine at its own share of the
    traffic, and vLLM refuses ``LLM(data_parallel_size>1)``. On GPUs they run the deployment's TP,
    PP and backend, so a target that needs several GPUs loads; on a CPU they run in one process:
    acceptance does not depend on the layout, and CPU step times are this machine's in any case.
    """
    if deployed.single:
        return deployed, None
    if on_gpu():
        engine = Parallelism(deployed.tensor_parallel_size, deployed.pipeline_parallel_size, 1,
                             deployed.distributed_executor_backend)
        where = "the engines here run one data-parallel engine"
    else:
        engine = Parallelism()
        where = "the engines here run in one process (this machine has no GPU)"
    if engine == deployed:
        return engine, None
    return engine, f"{where}; the deployment's {describe(deployed)} reaches the deploy command and the GPU models"


def describe(p: Parallelism) -> str:
    parts = [f"TP={p.tensor_parallel_size}"]
    if p.pipeline_parallel_size != 1:
        parts.append(f"PP={p.pipeline_parallel_size}")
    if p.data_parallel_size != 1:
        parts.append(f"DP={p.data_parallel_size}")
    if p.distributed_executor_backend:
        parts.append(f"backend {p.distributed_executor_backend}")
    return ", ".join(parts)


__all__ = ["BACKENDS", "Parallelism", "attention_heads", "describe", "engine_parallelism", "on_gpu", "supports_pp"]

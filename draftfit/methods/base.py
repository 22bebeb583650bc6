"""What every draft method provides, and the records that cross from a method to the pipeline.

A method (one module each under ``draftfit/methods/``) answers, for a candidate that uses it:

* **validate** — is the candidate's ``draft:`` block consistent for this method (raises ValueError);
* **plan** — what must run for it (a draft model to load, or nothing) or why `rank` skips it;
* **acceptance** — its predicted acceptance for every k: from the draft's scores of the target's
  answers, or simulated on the token sequences themselves;
* **cost** — its terms in the step model (draftfit.costmodel) and the draft shape the VRAM model reads;
* **engine_config** — the ``speculative_config`` the vLLM engines here run (`verify`);
* **deploy** — its part of the deployable configuration per vLLM version (draftfit.deploy): refusals,
  JSON keys, pre-0.8.2 flags, notes;
* **label** — how the report names its draft.

Methods import nothing heavy at module level: candidate validation runs in `draftfit check`'s and
`--help`'s import path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from draftfit.candidates import Candidate, DraftSpec, StudySettings
    from draftfit.deploy import SpecConfig
    from draftfit.hardware import ModelShape
    from draftfit.refs import ModelRef

Version = tuple[int, int, int]
Progress = Callable[[str], None]


@dataclass
class PlannedDraft:
    """A candidate resolved to what must run for it."""

    candidate: Candidate
    method: str
    draft_ref: ModelRef | None = None  # a draft model to load and score (after deriving)
    deploy_model: str | None = None  # what the vLLM config names (as the user will deploy it)
    prepare: str | None = None  # the command that makes deploy_model exist (e.g. exports a derived draft)
    check: dict | None = None
    skip_reason: str | None = None
    failure: dict | None = None  # its engine failed (results.failed)


@dataclass(frozen=True)
class PlanContext:
    """What planning a candidate may read: the target, the study and the user's trust setting."""

    target_ref: ModelRef
    target_meta: Path
    study: StudySettings
    trust_remote_code: bool = False
    progress: Progress = lambda message: None


@dataclass(frozen=True)
class AcceptanceInputs:
    """What a method's acceptance walk reads: the target's answers and every draft's scores."""

    trajset: Any  # draftfit.trajectories.TrajectorySet
    scores_by_fp: dict[str, Any]  # draft fingerprint → draftfit.draft_scoring.DraftScores
    ks: list[int]
    rule: str
    max_model_len: int
    target_fp: str = ""  # the target's fingerprint: a draft that is the target is always accepted
    max_tokens: int | None = None  # where responses stop; the answers run past it (look-ahead for the last step)
    progress: Progress = lambda message: None
    target_ref: ModelRef | None = None  # the target itself (a head's offline chains read its hidden states)


@dataclass(frozen=True)
class CostTerms:
    """A planned draft's terms in the step model.

    ``cost`` is a :class:`draftfit.costmodel.DraftCost`; ``shape`` the draft's architecture for
    the VRAM model (``None``: no weights and no KV cache); ``rank_cost`` orders drafts by cost when
    the ranking breaks ties (draft parameters; 0 for a model-free method).
    """

    cost: Any
    shape: ModelShape | None
    rank_cost: float


@dataclass(frozen=True)
class EngineSpec:
    """The ``speculative_config`` the engines here run for (candidate, k), every path local."""

    config: dict[str, Any]
    directory: Path | None = None  # the draft's local directory (a model draft) or None
    draft_is_target: bool = False
    target: Path | None = None  # a checkpoint served in the target's place (the target with its MTP layer)


StepTimeOf = Callable[..., Any]  # (draft fingerprint, shape, role) → costmodel.StepTime; role: the method name


class DraftMethod:
    """One speculative-decoding method: the hooks the pipeline calls, with the common behaviour.

    Subclasses set ``name`` and override what differs. ``in_candidates`` is false for methods
    draftfit only deploys (older vLLM methods a candidate file cannot name).
    """

    name: str = ""
    in_candidates: bool = True
    uses_model: bool = False  # the vLLM config names a model (and takes draft_sample_method)
    uses_lookup: bool = False  # prompt_lookup_min / prompt_lookup_max apply
    scores_model: bool = False  # rank loads the candidate's `model` and scores it (checked before anything loads)
    model_free: bool = False  # proposes from the token sequences, no weights, no tokenizer check
    heterogeneous_vocab: bool = False  # vLLM's use_heterogeneous_vocab applies
    draft_tp_is_target_tp: bool = False  # vLLM runs the draft only at the target's TP
    # proposes from what earlier requests produced (a cache that lives in the server): a server that
    # answered the same prompts before drafts their answers, so verify measures it fresh every run
    state_across_requests: bool = False
    # the candidate's `model` is served in the target's place (a checkpoint of the target that carries
    # the proposer, as MTP layers are carried): the deploy command and verify start it instead
    replaces_target: bool = False
    # the proposer reads the target's hidden states (vLLM's use_eagle): beside chunked-local attention
    # vLLM then turns its hybrid KV-cache manager off (draftfit.vram.vram_report)
    reads_target_states: bool = False
    # vLLM's proposer module (vllm/v1/spec_decode/<module>.py) for this method: whether it takes a
    # k schedule is read there (and in the base class it builds on)
    proposer_module: str = "llm_base_proposer"

    # --- candidate files ------------------------------------------------------------------

    def validate(self, draft: DraftSpec) -> None:
        """Raise ValueError when the ``draft:`` block does not fit this method."""
        if (draft.prompt_lookup_min is not None or draft.prompt_lookup_max is not None) and not self.uses_lookup:
            raise ValueError("prompt_lookup_min/max apply to method ngram only")

    # --- rank -----------------------------------------------------------------------------

    def plan(self, candidate: Candidate, ctx: PlanContext) -> PlannedDraft:
        """What must run for the candidate; ``skip_reason`` set when rank cannot predict it."""
        return PlannedDraft(candidate, self.name, skip_reason=self.skip_reason())

    def skip_reason(self) -> str | None:
        return None

    def acceptance(self, plan: PlannedDraft, inputs: AcceptanceInputs):
        """The acceptance walk for every k (draftfit.acceptance_walk's WalkBounds)."""
        raise NotImplementedError(f"method {self.name} has no offline acceptance")

    def cost(self, plan: PlannedDraft, step_time: StepTimeOf, *, trust_remote_code: bool = False) -> CostTerms:
        raise NotImplementedError(f"method {self.name} has no cost terms")

    def draft_shape(self, config: dict[str, Any], name: str) -> ModelShape | None:
        """The proposer's architecture for the step and VRAM models, from its ``config.json``
        (``None``: no weights, no KV cache)."""
        if self.model_free:
            return None
        from draftfit.hardware import ModelShape

        return ModelShape.from_config(config, name=name)

    def serves_in_target_place(self, candidate: Candidate) -> bool:
        """Whether the deploy command serves the planned checkpoint instead of the target."""
        return self.replaces_target

    def deploy_extra(self, candidate: Candidate) -> dict[str, Any]:
        """Method fields of :class:`draftfit.deploy.SpecConfig` taken from the candidate file."""
        return {}

    # --- verify ---------------------------------------------------------------------------

    def engine_config(self, candidate: Candidate, k: int, target_ref: ModelRef, extra: dict[str, Any], *,
                      trust_remote_code: bool = False) -> EngineSpec:
        raise NotImplementedError(f"method {self.name} cannot run here")

    # --- deploy (per vLLM version) --------------------------------------------------------

    def deploy_refusal(self, spec: SpecConfig, v: Version, version: str) -> str | None:
        """Why vLLM ``version`` cannot run this method at all (with the fix), or None."""
        return None

    def names_method(self, v: Version) -> bool:
        """Whether the ``--speculative-config`` JSON carries ``"method"`` on this version."""
        return True

    def config_keys(self, spec: SpecConfig) -> dict[str, Any]:
        """The method's own ``--speculative-config`` keys (after method, model and k)."""
        return {}

    def legacy_flags(self, spec: SpecConfig) -> dict[str, Any]:
        """vLLM ≤ 0.8.1's separate flags selecting the draft (as ``LLM`` keyword arguments)."""
        return {"speculative_model": spec.model}

    def deploy_notes(self) -> list[str]:
        return []

    # --- report ---------------------------------------------------------------------------

    def label(self, draft: dict[str, Any]) -> str:
        """How the report names a candidate's draft (its ``draft:`` block as saved in results)."""
        return str(draft.get("model") or "")


class HeadMethod(DraftMethod):
    """A draft head trained for one target (EAGLE, EAGLE-3, MTP): a checkpoint vLLM loads beside it."""

    uses_model = True
    trainable = False  # draftfit's recipe can train one (`trained:`)
    model_required = True  # the candidate names the checkpoint (or trains one); MTP's default is the target's own

    def validate(self, draft: DraftSpec) -> None:
        if self.model_required and not draft.model and not (draft.trained and self.trainable):
            raise ValueError(f"method {self.name} needs `model` (the head's checkpoint)")
        if draft.trained and not self.trainable:
            raise ValueError(f"`trained` applies to methods eagle3 and mtp only, not {self.name}")
        if draft.derived:
            raise ValueError(f"`derived` applies to method draft_model only, not {self.name}")
        super().validate(draft)

    def skip_reason(self) -> str | None:
        return f"{self.name} heads are trained for one target and cannot be scored offline; measure them with `draftfit verify`"

    def engine_config(self, candidate, k, target_ref, extra, *, trust_remote_code=False) -> EngineSpec:
        from draftfit.refs import model_dir, resolve

        directory = model_dir(resolve(candidate.draft.model), trust_remote_code=trust_remote_code)
        config = {"method": self.name, "model": str(directory), "num_speculative_tokens": int(k)} | extra
        return EngineSpec(config, directory)


def with_extra_params(shape: ModelShape, extra: float) -> ModelShape:
    """``shape`` with ``extra`` parameters more (or fewer), all read on every pass."""
    from dataclasses import replace

    return replace(shape, params=shape.params + extra, active_params=shape.active_params + extra,
                   params_source=f"{shape.params_source}, adjusted for the head's own layers")


class ModelFreeMethod(DraftMethod):
    """A proposer that searches the token sequences themselves (no weights, no KV cache)."""

    model_free = True

    def validate(self, draft: DraftSpec) -> None:
        if draft.model or draft.derived or draft.trained:
            raise ValueError(f"method {self.name} uses no model; remove `model`/`derived`/`trained`")
        super().validate(draft)

    def cost(self, plan: PlannedDraft, step_time: StepTimeOf, *, trust_remote_code: bool = False) -> CostTerms:
        """No weights: a host-side search per sequence and step (timed by the served steps)."""
        from draftfit.costmodel import ModelFreeDraftCost

        return CostTerms(ModelFreeDraftCost(self.name), None, 0.0)

    def legacy_flags(self, spec: SpecConfig) -> dict[str, Any]:
        raise NotImplementedError(f"method {self.name} has no flags before vLLM 0.8.2")

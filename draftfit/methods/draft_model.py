"""``draft_model``: a separate (smaller) model of the target's tokenizer, or the target's first N
layers (``derived``), proposing k tokens with k sequential forward passes.

Offline, the draft reads prompt + the target's answer in one prefill (draftfit.draft_scoring) and its
acceptance is walked from those scores; its step times are the draft's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftfit.methods.base import AcceptanceInputs, CostTerms, DraftMethod, EngineSpec, PlannedDraft
from draftfit.vllm_versions import V1_NO_DRAFT

METHOD_KEY_SINCE = (0, 15, 0)  # required in 0.15–0.16, inferred from 0.18; older ones infer it from the model


def draft_model_config(draft_dir: str | Path, k: int, draft_sample_method: str | None = None, **extra: Any) -> dict[str, Any]:
    """``speculative_config`` for a separate draft model (the target's own directory = self-draft)."""
    config: dict[str, Any] = {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": int(k)}
    if draft_sample_method is not None:
        config["draft_sample_method"] = draft_sample_method
    config.update(extra)
    return config


class DraftModel(DraftMethod):
    name = "draft_model"
    proposer_module = "draft_model"
    uses_model = True
    scores_model = True
    heterogeneous_vocab = True
    # The installed 0.32 config accepts 1 or the target's TP (vllm/config/speculative.py), but its
    # draft-model proposer then refuses any mismatch (vllm/v1/spec_decode/draft_model.py).
    draft_tp_is_target_tp = True

    def validate(self, draft) -> None:
        if (draft.model is None) == (draft.derived is None):
            raise ValueError("a draft_model needs exactly one of `model` or `derived`")
        if draft.trained:
            raise ValueError("`trained` applies to methods eagle3 and mtp only, not draft_model")
        super().validate(draft)

    def plan(self, candidate, ctx) -> PlannedDraft:
        draft = candidate.draft
        plan = PlannedDraft(candidate, self.name)
        if draft.derived is not None:
            from draftfit.derive import first_layers

            ctx.progress(f"deriving {candidate.name}: the target's first {draft.derived.first_layers} layers")
            import shlex

            n = draft.derived.first_layers
            derived = first_layers(ctx.target_ref, n)
            plan.draft_ref = derived.ref
            plan.deploy_model = f"./{ctx.target_ref.name}-first{n}"
            plan.prepare = (f"draftfit export {shlex.quote(ctx.target_ref.spec)} --first-layers {n} "
                            f"-o {shlex.quote(plan.deploy_model)}")
            plan.check = {"verdict": "identical", "summary": "derived from the target: the target's own tokenizer and vocabulary"}
            return plan
        import json

        from draftfit.compat import compare
        from draftfit.refs import metadata_dir, resolve

        draft_ref = resolve(draft.model)
        draft_meta = metadata_dir(draft_ref, trust_remote_code=ctx.trust_remote_code)
        report = compare(ctx.target_meta, draft_meta,
                         vllm_version=ctx.study.vllm_version, target_label=ctx.target_ref.spec, draft_label=draft_ref.spec)
        plan.check = report.to_dict()
        plan.draft_ref = draft_ref
        plan.deploy_model = draft.model
        if not report.compatible_with("vllm"):
            plan.skip_reason = f"incompatible with vLLM: {report.engines['vllm'].reason}"
            if report.engines["vllm"].fix:
                plan.skip_reason += f". {report.engines['vllm'].fix}"
            return plan
        refusal = ctx.study.parallelism.draft_refusal(self, json.loads((draft_meta / "config.json").read_text()), None)
        if refusal:
            plan.skip_reason = f"cannot run at the deployment's layout: {refusal}"
        return plan

    def acceptance(self, plan: PlannedDraft, inputs: AcceptanceInputs):
        from draftfit import acceptance_walk
        from draftfit.refs import fingerprint

        fp = fingerprint(plan.draft_ref)
        return acceptance_walk.predict_model_draft(inputs.trajset, inputs.scores_by_fp[fp].scores, inputs.ks, inputs.rule,
                                                   draft_is_target=fp == inputs.target_fp, max_tokens=inputs.max_tokens)

    def cost(self, plan: PlannedDraft, step_time, *, trust_remote_code: bool = False) -> CostTerms:
        import json

        from draftfit.costmodel import ModelDraftCost
        from draftfit.refs import fingerprint, metadata_dir

        config = json.loads((metadata_dir(plan.draft_ref, trust_remote_code=trust_remote_code) / "config.json").read_text())
        shape = self.draft_shape(config, plan.draft_ref.name)
        return CostTerms(ModelDraftCost(step_time(fingerprint(plan.draft_ref), shape, self.name)), shape, float(shape.params))

    def engine_config(self, candidate, k, target_ref, extra, *, trust_remote_code=False) -> EngineSpec:
        from draftfit.refs import fingerprint, model_dir, resolve

        draft = candidate.draft
        if draft.derived is not None:
            from draftfit.derive import first_layers

            directory = first_layers(target_ref, draft.derived.first_layers).path
            return EngineSpec(draft_model_config(directory, k, **extra), directory)
        ref = resolve(draft.model)
        directory = model_dir(ref, trust_remote_code=trust_remote_code)
        return EngineSpec(draft_model_config(directory, k, **extra), directory, fingerprint(ref) == fingerprint(target_ref))

    def deploy_refusal(self, spec, v, version) -> str | None:
        if V1_NO_DRAFT[0] <= v < V1_NO_DRAFT[1]:
            return (f"vLLM {version} (V1 engine, 0.10–0.14) refuses separate draft models with "
                    "NotImplementedError. Use vLLM ≥ 0.15, or an ngram/EAGLE method")
        return None

    def names_method(self, v) -> bool:
        return v >= METHOD_KEY_SINCE

    def label(self, draft: dict[str, Any]) -> str:
        derived = draft.get("derived")
        if isinstance(derived, dict) and derived.get("first_layers"):
            return f"the target's first {derived['first_layers']} layers"
        return super().label(draft)


METHOD = DraftModel()

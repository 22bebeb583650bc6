"""``ngram``: vLLM's prompt lookup — the continuation of the latest earlier match of the last
n tokens (n from prompt_lookup_max down to prompt_lookup_min), simulated exactly offline
(draftfit.ngram); no weights, a host-side search per step.
"""

from __future__ import annotations

from typing import Any

from draftfit.methods.base import (
    AcceptanceInputs,
    EngineSpec,
    ModelFreeMethod,
    PlannedDraft,
)

DEFAULT_LOOKUP = 5  # vLLM: both omitted → 5/5; one given → the other takes its value


def lookup(draft) -> tuple[int, int]:
    """(prompt_lookup_min, prompt_lookup_max) as vLLM reads a ``draft:`` block."""
    lo, hi = draft.prompt_lookup_min, draft.prompt_lookup_max
    if lo is None and hi is None:
        return DEFAULT_LOOKUP, DEFAULT_LOOKUP
    return (lo or hi), (hi or lo)


def ngram_config(k: int, lookup_min: int = 2, lookup_max: int = 4) -> dict[str, Any]:
    """``speculative_config`` for prompt-lookup (ngram) drafting."""
    return {"method": "ngram", "num_speculative_tokens": int(k), "prompt_lookup_min": int(lookup_min), "prompt_lookup_max": int(lookup_max)}


class Ngram(ModelFreeMethod):
    name = "ngram"
    proposer_module = "ngram_proposer"
    uses_lookup = True

    def validate(self, draft) -> None:
        super().validate(draft)
        lo, hi = draft.prompt_lookup_min, draft.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"prompt_lookup_min {lo} > prompt_lookup_max {hi}")

    def plan(self, candidate, ctx) -> PlannedDraft:
        return PlannedDraft(candidate, self.name)

    def acceptance(self, plan: PlannedDraft, inputs: AcceptanceInputs):
        from draftfit import acceptance_walk

        lo, hi = lookup(plan.candidate.draft)
        return acceptance_walk.predict_ngram(inputs.trajset, inputs.ks, lo, hi, inputs.max_model_len, inputs.rule,
                                             max_tokens=inputs.max_tokens)

    def deploy_extra(self, candidate) -> dict[str, Any]:
        lo, hi = lookup(candidate.draft)
        return {"prompt_lookup_min": lo, "prompt_lookup_max": hi}

    def engine_config(self, candidate, k, target_ref, extra, *, trust_remote_code=False) -> EngineSpec:
        return EngineSpec(ngram_config(k, *lookup(candidate.draft)) | extra)

    def config_keys(self, spec) -> dict[str, Any]:
        keys: dict[str, Any] = {}
        if spec.prompt_lookup_min is not None:
            keys["prompt_lookup_min"] = spec.prompt_lookup_min
        if spec.prompt_lookup_max is not None:
            keys["prompt_lookup_max"] = spec.prompt_lookup_max
        return keys

    def legacy_flags(self, spec) -> dict[str, Any]:
        # Before 0.8.2 ngram prompt lookup was selected by the pseudo-model "[ngram]".
        return {
            "speculative_model": "[ngram]",
            "ngram_prompt_lookup_max": spec.prompt_lookup_max or DEFAULT_LOOKUP,
            "ngram_prompt_lookup_min": spec.prompt_lookup_min or spec.prompt_lookup_max or DEFAULT_LOOKUP,
        }

    def label(self, draft: dict[str, Any]) -> str:
        return "prompt lookup (ngram), model-free"


METHOD = Ngram()

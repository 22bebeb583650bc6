"""``suffix``: suffix decoding (vLLM uses arctic-inference's suffix trees over the request's prompt
and response and over earlier requests' responses), no weights, a host-side tree lookup per step.

Offline (draftfit.suffix): the same trees, fed as vLLM feeds them — request by request in sample
order (concurrency 1), with vLLM's default tree parameters — and walked for every k.
"""

from __future__ import annotations

from draftfit.methods.base import EngineSpec, ModelFreeMethod, PlannedDraft

NO_FLAG_UNTIL = (0, 8, 1)


class Suffix(ModelFreeMethod):
    name = "suffix"
    proposer_module = "suffix_decoding"
    state_across_requests = True  # the global tree of earlier responses

    def plan(self, candidate, ctx) -> PlannedDraft:
        plan = PlannedDraft(candidate, self.name)
        from draftfit.errors import DraftfitError
        from draftfit.suffix import cache_class

        try:
            cache_class()
        except DraftfitError as exc:
            plan.skip_reason = f"{exc.message}. {exc.fix}"
        return plan

    def acceptance(self, plan: PlannedDraft, inputs):
        from draftfit.acceptance_walk import stop_positions
        from draftfit.suffix import suffix_walk

        trajs = list(inputs.trajset.trajectories)
        return suffix_walk([t.sequence for t in trajs], [t.response_start for t in trajs],
                           stop_positions(inputs.trajset, inputs.max_tokens), inputs.ks, max_model_len=inputs.max_model_len)

    def engine_config(self, candidate, k, target_ref, extra, *, trust_remote_code=False) -> EngineSpec:
        return EngineSpec({"method": self.name, "num_speculative_tokens": int(k)} | extra)

    def deploy_refusal(self, spec, v, version) -> str | None:
        if v <= NO_FLAG_UNTIL:
            return f"vLLM {version} has no flag for suffix decoding. Use a newer vLLM"
        return None

    def deploy_notes(self) -> list[str]:
        return ["suffix decoding needs the arctic-inference package (pip install arctic-inference)."]

    def label(self, draft) -> str:
        return "suffix decoding (arctic-inference), model-free"


METHOD = Suffix()

"""Methods draftfit only deploys: vLLM ≤ 0.32's ``medusa`` and ``mlp_speculator`` heads, removed
in vLLM 0.33. A candidate file cannot name them (rank has no offline model of either)."""

from __future__ import annotations

from draftfit.methods.base import DraftMethod

REMOVED_IN = (0, 33, 0)


class RemovedHead(DraftMethod):
    in_candidates = False
    uses_model = True

    def __init__(self, name: str):
        self.name = name
        self.proposer_module = name

    def deploy_refusal(self, spec, v, version) -> str | None:
        if v >= REMOVED_IN:
            return f"vLLM {version} removed the {self.name} method (0.33.0). Use vLLM ≤ 0.32 or another method"
        return None


MEDUSA = RemovedHead("medusa")
MLP_SPECULATOR = RemovedHead("mlp_speculator")

"""``mtp``: the multi-token-prediction layers a target ships (DeepSeek-V3, Qwen3-Next, GLM, …),
run as vLLM's MTP proposer. Part of the target's checkpoint; `verify` measures it."""

from __future__ import annotations

from draftfit.methods.base import HeadMethod


class MTP(HeadMethod):
    name = "mtp"


METHOD = MTP()

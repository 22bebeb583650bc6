"""``suffix``: suffix decoding (vLLM uses arctic-inference's suffix trees over the request and
earlier responses); not yet simulated offline, so `rank` skips it and `verify` measures it."""

from __future__ import annotations

from draftfit.methods.base import EngineSpec, ModelFreeMethod

NO_FLAG_UNTIL = (0, 8, 1)


class Suffix(ModelFreeMethod):
    name = "suffix"

    def skip_reason(self) -> str | None:
        return "suffix decoding is not simulated by this draftfit version (vLLM needs arctic_inference for it); measure it with `draftfit verify`"

    def engine_config(self, candidate, k, target_ref, extra, *, trust_remote_code=False) -> EngineSpec:
        return EngineSpec({"method": self.name, "num_speculative_tokens": int(k)} | extra)

    def deploy_refusal(self, spec, v, version) -> str | None:
        if v <= NO_FLAG_UNTIL:
            return f"vLLM {version} has no flag for suffix decoding. Use a newer vLLM"
        return None

    def deploy_notes(self) -> list[str]:
        return ["suffix decoding needs the arctic-inference package."]


METHOD = Suffix()

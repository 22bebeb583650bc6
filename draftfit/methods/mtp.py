"""``mtp``: the multi-token-prediction layers a target ships (DeepSeek-V3, Qwen3-Next, GLM, …),
run as vLLM's MTP proposer. Part of the target's checkpoint; `verify` measures it."""

from __future__ import annotations

from draftfit.methods.base import HeadMethod, with_extra_params

MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")


class MTP(HeadMethod):
    name = "mtp"

    def draft_shape(self, config, name):
        """The target's own MTP layer(s) (``num_nextn_predict_layers``, default 1), each a decoder
        layer of the target plus its ``eh_proj`` (2·hidden → hidden), sharing the target's
        embedding and LM head; vLLM runs a layer once per drafted token."""
        layers = next((int(config[key]) for key in MTP_LAYER_KEYS if config.get(key)), 1)
        shape = super().draft_shape({**config, "num_hidden_layers": layers}, name)
        return with_extra_params(shape, layers * 2.0 * shape.hidden_size * shape.hidden_size)


METHOD = MTP()

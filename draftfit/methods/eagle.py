"""``eagle``: an EAGLE(-1) head — one decoder layer over the target's last hidden state and the
next token's embedding, chained k times. Trained for one target; `verify` measures it."""

from __future__ import annotations

from draftfit.methods.base import HeadMethod, with_extra_params


class Eagle(HeadMethod):
    name = "eagle"

    def draft_shape(self, config, name):
        """The head's decoder layer(s) plus its ``fc`` (2·hidden → hidden) over [embedding, hidden
        state]; it reads the target's embedding and, lacking its own, the target's LM head of the
        same vocabulary, as vLLM loads it."""
        shape = super().draft_shape(config, name)
        return with_extra_params(shape, 2.0 * shape.hidden_size * shape.hidden_size)


METHOD = Eagle()

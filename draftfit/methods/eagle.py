"""``eagle``: an EAGLE(-1) head — one decoder layer over the target's last hidden state and the
next token's embedding, chained k times. Trained for one target; `verify` measures it."""

from __future__ import annotations

from draftfit.methods.base import HeadMethod


class Eagle(HeadMethod):
    name = "eagle"


METHOD = Eagle()

"""``eagle3``: an EAGLE-3 head — fed the target's hidden states of several auxiliary layers,
with its own (possibly reduced) draft vocabulary. Trained for one target; `verify` measures it."""

from __future__ import annotations

from draftfit.methods.base import HeadMethod


class Eagle3(HeadMethod):
    name = "eagle3"


METHOD = Eagle3()

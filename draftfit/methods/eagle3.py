"""``eagle3``: an EAGLE-3 head — fed the target's hidden states of several auxiliary layers, with its
own (possibly reduced) draft vocabulary, chained k times.

Planned, trained, predicted offline and costed as every EAGLE-family head (draftfit.methods.eagle):
the head reads the target's auxiliary states, and greedy drafting is the only drafting vLLM allows
with a reduced vocabulary.
"""

from __future__ import annotations

from draftfit.methods.base import with_extra_params
from draftfit.methods.eagle import EagleFamily

AUX_LAYERS = 3  # EAGLE-3's default: a low, a middle and a high layer of the target


class Eagle3(EagleFamily):
    name = "eagle3"
    title = "EAGLE-3"
    not_this_head = "its config.json has no speculators type eagle3, no Eagle3 architecture and no draft_vocab_size"

    def draft_shape(self, config, name):
        """The head's layer reads [embedding, hidden] (its q/k/v take 2·hidden inputs), its ``fc``
        fuses the auxiliary layers' states (n·hidden → hidden), and its LM head covers the draft
        vocabulary (``draft_vocab_size``) only."""
        from draftfit.compat.heads import layer_config

        config = layer_config(config)
        shape = super().draft_shape(config, name)
        h = shape.hidden_size
        aux = len((config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
                  or config.get("eagle_aux_hidden_state_layer_ids") or ()) or AUX_LAYERS
        qkv = shape.num_layers * h * (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
        draft_vocab = int(config.get("draft_vocab_size") or shape.vocab_size)
        return with_extra_params(shape, aux * h * h + qkv - (shape.vocab_size - draft_vocab) * h)


METHOD = Eagle3()

"""``eagle3``: an EAGLE-3 head — fed the target's hidden states of several auxiliary layers,
with its own (possibly reduced) draft vocabulary. Trained for one target; `verify` measures it."""

from __future__ import annotations

from draftfit.methods.base import HeadMethod, with_extra_params

AUX_LAYERS = 3  # EAGLE-3's default: a low, a middle and a high layer of the target


class Eagle3(HeadMethod):
    name = "eagle3"

    def draft_shape(self, config, name):
        """The head's layer reads [embedding, hidden] (its q/k/v take 2·hidden inputs), its ``fc``
        fuses the auxiliary layers' states (n·hidden → hidden), and its LM head covers the draft
        vocabulary (``draft_vocab_size``) only."""
        shape = super().draft_shape(config, name)
        h = shape.hidden_size
        aux = len((config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or ()) or AUX_LAYERS
        qkv = shape.num_layers * h * (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
        draft_vocab = int(config.get("draft_vocab_size") or shape.vocab_size)
        return with_extra_params(shape, aux * h * h + qkv - (shape.vocab_size - draft_vocab) * h)


METHOD = Eagle3()

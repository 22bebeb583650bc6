"""Pad a draft's vocabulary (embedding and LM-head rows) to the target's ``vocab_size``.

vLLM refuses a draft model whose ``config.vocab_size`` differs from the target's, even when the
two share a tokenizer and differ only in embedding padding (Qwen2.5 0.5B: 151936 rows vs 72B:
152064). The padded copy has ``vocab_size = N`` and its ids at or beyond the tokenizer's length
cannot be proposed by greedy drafting:

* each new LM-head row is a copy of the row of one existing token (the unknown token, else id 0),
  so its logit equals that token's logit exactly, and ``argmax`` returns the *first* maximal index,
  which is the existing token's smaller id;
* new embedding rows copy the same token's row (they are never looked up: the target never emits
  an id beyond its tokenizer).

Under probabilistic drafting a new id would share the copied token's probability; the copied token
is chosen as the unknown token because its probability is negligible in practice.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from draftfit.compat.files import read_config, text_config_value
from draftfit.errors import DraftfitError
from draftfit.outputs import PADDED_MARKER, check_output_dir, refuse_overlap, write_dir
from draftfit.refs import COMPANION_FILES, ModelRef, metadata_dir, model_dir


@dataclass(frozen=True)
class PadResult:
    output_dir: Path
    old_vocab_size: int
    new_vocab_size: int
    tokenizer_length: int
    copied_row: int


def tokenizer_length(directory: Path) -> int:
    """``len(tokenizer)``: the highest id the tokenizer can produce, plus one (base vocab + added tokens)."""
    from tokenizers import Tokenizer

    path = directory / "tokenizer.json"
    if not path.is_file():
        raise DraftfitError("no tokenizer.json", where=str(directory), fix="Pass a model directory with its tokenizer")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise DraftfitError(
            f"cannot read tokenizer.json ({exc})", where=str(path), fix="Restore the file from the model's source"
        ) from exc
    top = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    return top + 1


def pad_vocab(ref: ModelRef, to: int, output: Path, *, trust_remote_code: bool = False, force: bool = False) -> PadResult:
    # the sizes are checked on the tokenizer and config files, before any weights are converted,
    # and errors name the reference the user gave
    meta = metadata_dir(ref, trust_remote_code=trust_remote_code)
    config = read_config(meta / "config.json")
    old = int(text_config_value(config, "vocab_size") or 0)
    length = tokenizer_length(meta)
    if to < length:
        raise DraftfitError(
            f"--to {to} is below the tokenizer's length {length}: ids the tokenizer produces would lose their rows",
            where=ref.spec,
            fix=f"Use --to {length} or more (usually the target's config.json vocab_size)",
        )
    if to < old:
        raise DraftfitError(
            f"--to {to} is below the draft's vocab_size {old}; pad-vocab only adds rows",
            where=ref.spec,
            fix=f"Use --to {old} or more",
        )
    if to == old:
        raise DraftfitError(
            f"the draft already has vocab_size {old}", where=ref.spec, fix="Nothing to pad; use the draft as it is"
        )
    output = check_output_dir(Path(output), inputs=[None if ref.kind == "hub" else ref.path, meta], force=force)
    source = model_dir(ref, trust_remote_code=trust_remote_code)  # the weights, converted once where needed
    refuse_overlap(output, [source])

    try:
        import torch
        import transformers
    except ImportError as exc:
        raise DraftfitError("pad-vocab needs torch and transformers", fix="pip install 'draftfit[hf]'") from exc

    unk = _unknown_token_id(source)
    copied = unk if unk is not None and unk < old else 0

    def build(tmp: Path) -> None:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(source), dtype="auto", trust_remote_code=trust_remote_code
        )
        embeddings = model.get_input_embeddings()
        head = model.get_output_embeddings()
        tied = head is not None and head.weight.data_ptr() == embeddings.weight.data_ptr()
        model.resize_token_embeddings(to, mean_resizing=False)
        with torch.no_grad():
            embeddings = model.get_input_embeddings()
            embeddings.weight[old:] = embeddings.weight[copied]
            head = model.get_output_embeddings()
            if head is not None and not tied:
                head.weight[old:] = head.weight[copied]
                if getattr(head, "bias", None) is not None:
                    head.bias[old:] = head.bias[copied]
        model.config.vocab_size = to
        model.save_pretrained(str(tmp))
        for name in COMPANION_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, tmp / name)
        (tmp / PADDED_MARKER).write_text(
            json.dumps({"source": str(source), "old_vocab_size": old, "vocab_size": to, "copied_row": copied}, indent=2)
        )

    write_dir(output, build)
    return PadResult(output, old, to, length, copied)


def _unknown_token_id(directory: Path) -> int | None:
    try:
        data = json.loads((directory / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return None
    unk = (data.get("model") or {}).get("unk_token")
    if not unk:
        config_path = directory / "tokenizer_config.json"
        if config_path.is_file():
            unk = json.loads(config_path.read_text()).get("unk_token")
            if isinstance(unk, dict):
                unk = unk.get("content")
    if not unk:
        return None
    vocab = (data.get("model") or {}).get("vocab") or {}
    if isinstance(vocab, dict) and unk in vocab:
        return int(vocab[unk])
    for token in data.get("added_tokens", []):
        if token.get("content") == unk:
            return int(token["id"])
    return None

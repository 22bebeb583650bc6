"""Build real tokenizers with the `tokenizers` library, and model metadata directories around them.

A plain module (not fixtures) so tests and benchmarks can both import it. Tokenizers are handled
as their tokenizer.json dicts, which makes "the same tokenizer with one thing changed" easy to write.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A draft model proposes tokens and the target verifies them.
Speculative decoding is faster when the draft agrees with the target on most tokens.
def add(a, b):\n    return a + b\n\nprint(add(1, 2))
{"key": "value", "numbers": [1, 2, 3], "nested": {"ok": true}}
안녕하세요 세계. 今天天气很好。 https://example.com/path?x=1 3.14159 2024-01-01
Hello world, hello again, and hello once more from the tokenizer tests.
"""


def training_corpus() -> list[str]:
    from draftfit.probe_corpus import builtin_probe_texts

    return [t.text for t in builtin_probe_texts()] + _TRAINING_TEXT.splitlines() * 3


def _train(tokenizer, trainer, texts: Iterable[str] | None = None) -> dict[str, Any]:
    tokenizer.train_from_iterator(list(texts or training_corpus()), trainer=trainer)
    return json.loads(tokenizer.to_str())


def train_bpe(vocab_size: int = 600, *, specials: Iterable[str] = SPECIALS, byte_fallback: bool = False) -> dict:
    """A byte-level BPE (GPT-2 / Llama-3 / SmolLM2 style) trained on the probe corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=byte_fallback))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    return _train(tok, trainer)


def train_unigram(vocab_size: int = 600, *, specials: Iterable[str] = SPECIALS) -> dict:
    """A SentencePiece-style Unigram tokenizer (Metaspace '▁' word marker)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = list(specials)
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=specials, unk_token=specials[0], show_progress=False
    )
    return _train(tok, trainer)


def word_level(vocab: dict[str, int], *, metaspace: bool = False, unk: str = "[UNK]") -> dict:
    """A WordLevel tokenizer with an explicit vocabulary (ByteLevel 'Ġ' or Metaspace '▁' words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Metaspace() if metaspace else pre_tokenizers.ByteLevel(add_prefix_space=False)
    return json.loads(tok.to_str())


def synthetic_bpe(n_tokens: int, *, specials: Iterable[str] = SPECIALS) -> dict:
    """A large, valid byte-level BPE built without training: the 256 byte symbols, then
    two-symbol and three-symbol merges until ``n_tokens`` ids exist (specials come first)."""
    from tokenizers.pre_tokenizers import ByteLevel

    specials = list(specials)
    alphabet = sorted(ByteLevel.alphabet())
    vocab: dict[str, int] = {s: i for i, s in enumerate(specials)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    merges: list[list[str]] = []
    for a in alphabet:
        for b in alphabet:
            if len(vocab) >= n_tokens:
                break
            vocab[a + b] = len(vocab)
            merges.append([a, b])
    pairs = [token for token in vocab if len(token) == 2 and token not in specials]
    i = 0
    while len(vocab) < n_tokens:
        pair, ch = pairs[i // len(alphabet)], alphabet[i % len(alphabet)]
        i += 1
        if pair + ch not in vocab:
            vocab[pair + ch] = len(vocab)
            merges.append([pair, ch])
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added(i, s) for i, s in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": dict(byte_level, trim_offsets=False),
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": merges,
        },
    }


def _added(i: int, content: str, special: bool = True) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def tokenizer_size(tok_json: dict) -> int:
    vocab = tok_json["model"]["vocab"]
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    return max(ids + [t["id"] for t in tok_json.get("added_tokens", [])]) + 1


# --- modifications (return a new tokenizer.json dict) ------------------------------------------

def swap_tokens(tok_json: dict, a: str, b: str) -> dict:
    """Exchange the ids of two vocabulary tokens (same strings, different meaning of two ids)."""
    out = copy.deepcopy(tok_json)
    vocab = out["model"]["vocab"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    return out


def shift_ids(tok_json: dict, k: int) -> dict:
    """Insert ``k`` new special tokens at ids 0..k-1, moving every other id up by ``k``."""
    out = copy.deepcopy(tok_json)
    out["model"]["vocab"] = {t: i + k for t, i in out["model"]["vocab"].items()}
    out["added_tokens"] = [_added(i, f"<|extra_{i}|>") for i in range(k)] + [
        dict(t, id=t["id"] + k) for t in out["added_tokens"]
    ]
    return out


def add_tokens(tok_json: dict, contents: Iterable[str]) -> dict:
    """Append added (non-special) tokens after the last id."""
    out = copy.deepcopy(tok_json)
    n = tokenizer_size(out)
    out["added_tokens"] += [_added(n + i, c, special=False) for i, c in enumerate(contents)]
    return out


def with_component(tok_json: dict, name: str, value: Any) -> dict:
    out = copy.deepcopy(tok_json)
    out[name] = value
    return out


# --- model directories -------------------------------------------------------------------------

def write_model_dir(
    path: Path,
    tok_json: dict,
    *,
    vocab_size: int | None = None,
    tokenizer_config: dict | None = None,
    chat_template: str | None = CHAT_TEMPLATE,
    generation_config: dict | None = None,
    config: dict | None = None,
) -> Path:
    """A metadata directory: tokenizer.json, tokenizer_config.json, config.json (llama-style),
    chat_template.jinja and generation_config.json when given."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False), "utf-8")
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
           "vocab_size": vocab_size if vocab_size is not None else tokenizer_size(tok_json),
           "bos_token_id": 1, "eos_token_id": 2}
    cfg.update(config or {})
    (path / "config.json").write_text(json.dumps(cfg), "utf-8")
    tcfg = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
            "unk_token": "<|endoftext|>", "add_bos_token": False, "add_eos_token": False}
    tcfg.update(tokenizer_config or {})
    (path / "tokenizer_config.json").write_text(json.dumps(tcfg), "utf-8")
    if chat_template is not None:
        (path / "chat_template.jinja").write_text(chat_template, "utf-8")
    if generation_config is not None:
        (path / "generation_config.json").write_text(json.dumps(generation_config), "utf-8")
    return path


def copy_model_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("draftfit-source.json"))
    return dst


def edit_json(path: Path, change: Callable[[dict], None]) -> Path:
    """Load a JSON file, let ``change`` edit it in place, write it back."""
    data = json.loads(path.read_text("utf-8"))
    change(data)
    path.write_text(json.dumps(data, ensure_ascii=False), "utf-8")
    return path


def big_pair(root: Path, n_tokens: int = 128_000, *, pad_to: int = 128_256) -> tuple[Path, Path]:
    """Two ~128k-entry tokenizers (built once under ``root``): the target with ``pad_to``
    embedding rows, the draft with the same tokenizer, one swapped pair of tokens and
    ``n_tokens`` rows. Exercises every comparison at full size."""
    target, draft = root / "target", root / "draft"
    if not (draft / "config.json").is_file():
        tok = synthetic_bpe(n_tokens)
        write_model_dir(target, tok, vocab_size=pad_to)
        write_model_dir(draft, swap_tokens(tok, "ab", "ba"), vocab_size=n_tokens)
    return target, draft

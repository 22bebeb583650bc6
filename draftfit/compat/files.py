"""Reading a model's tokenizer and config files (never weights) into plain data.

Only the ``tokenizers`` library and the JSON files are used: no transformers, no torch.
Every unreadable file becomes a one-line :class:`DraftfitError` naming the file and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftfit.errors import DraftfitError, shown

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE_JINJA = "chat_template.jinja"
CHAT_TEMPLATE_JSON = "chat_template.json"

# files that hold a tokenizer in a format other than tokenizer.json (a "slow" tokenizer)
_SLOW_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "spiece.model")
# where a config names its MTP layers (vLLM reads the first; the others name them in other families)
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")
# nested configs that hold the language model's settings (multimodal and composite models)
_TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config", "decoder", "generator")
SPECIAL_ROLES = ("bos", "eos", "pad", "unk")

_RESAVE_FIX = (
    "Re-download the file, or re-save the tokenizer with "
    "`AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)`"
)


@dataclass
class ModelFiles:
    """What ``check`` reads from one model directory."""

    directory: Path
    label: str
    tokenizer_json: dict[str, Any]
    tokenizer: Any  # tokenizers.Tokenizer
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    generation_config: dict[str, Any] | None = None
    chat_template: str | None = None
    chat_template_source: str | None = None
    tokenizer_text: str = field(default="", repr=False)
    has_config: bool = True  # False: a tokenizer-only directory (no config.json)

    @property
    def config_vocab_size(self) -> int | None:
        """``vocab_size`` of the language model's config (embedding rows), as engines read it."""
        return text_config_value(self.config, "vocab_size")

    def special_token(self, role: str) -> str | None:
        """The ``{role}_token`` string declared in tokenizer_config.json, if any."""
        return token_content(self.tokenizer_config.get(f"{role}_token"))


def load_model_files(
    directory: str | Path, *, label: str | None = None, like: ModelFiles | None = None
) -> ModelFiles:
    """Read tokenizer.json, tokenizer_config.json, config.json, generation_config.json and the
    chat template from a metadata directory.

    When ``like`` (an already loaded model) has a byte-identical tokenizer.json, its parsed
    tokenizer is shared instead of parsed again (the usual same-family pair).
    """
    from tokenizers import Tokenizer

    directory = Path(directory)
    label = label or str(directory)
    if not directory.is_dir():
        what = "is a file, not a model directory" if directory.exists() else "no such directory"
        raise DraftfitError(
            what, where=str(directory),
            fix="Pass a Hugging Face model directory, a .gguf file, a hub id or pkg:PACKAGE",
        )
    tok_path = directory / TOKENIZER_JSON
    if not tok_path.is_file():
        raise _missing_tokenizer(directory)
    text = _read_text(tok_path, _RESAVE_FIX)
    if like is not None and like.tokenizer_text == text:
        tokenizer_json, tokenizer = like.tokenizer_json, like.tokenizer
    else:
        tokenizer_json = _parse_json_object(tok_path, text, _RESAVE_FIX)
        if not isinstance(tokenizer_json.get("model"), dict) or "type" not in tokenizer_json["model"]:
            raise DraftfitError(
                "not a tokenizers file (no `model.type`)", where=str(tok_path), fix=_RESAVE_FIX
            )
        try:
            tokenizer = Tokenizer.from_str(text)
        except Exception as exc:  # noqa: BLE001 - the Rust parser raises plain Exception
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DraftfitError(
                f"the tokenizers library cannot load it ({detail})", where=str(tok_path),
                fix=f"{_RESAVE_FIX}, or upgrade `tokenizers`",
            ) from exc

    config_path = directory / CONFIG
    has_config = config_path.is_file()  # without it the engines' vocab_size gate cannot be told
    config = read_config(config_path) if has_config else {}

    tokenizer_config = _optional_json(directory / TOKENIZER_CONFIG, _RESAVE_FIX) or {}
    generation_config = _optional_json(
        directory / GENERATION_CONFIG, "Re-download the model's generation_config.json, or delete it"
    )
    template, source = _chat_template(directory, tokenizer_config)
    return ModelFiles(
        directory=directory, label=label, tokenizer_json=tokenizer_json, tokenizer=tokenizer,
        tokenizer_config=tokenizer_config, config=config, generation_config=generation_config,
        chat_template=template, chat_template_source=source, tokenizer_text=text, has_config=has_config,
    )


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A multimodal checkpoint's text-model config (Qwen3.5's ``text_config``) with the checkpoint's
    architecture, as vLLM reads a decoder's sizes (``hf_text_config``); any other config as it is.
    The tied embeddings and the MTP layer count come along where the top level names them and the
    text model does not (EXAONE-4.5's ``num_nextn_predict_layers``, which vLLM reads there)."""
    text = raw.get("text_config")
    if not isinstance(text, dict) or "num_hidden_layers" in raw:
        return _with_layer_count(raw)
    carried = {key: raw[key] for key in ("tie_word_embeddings", *MTP_LAYER_KEYS) if key in raw}
    return _with_layer_count(carried | text | {"architectures": raw.get("architectures"),
                                               "model_type": text.get("model_type", raw.get("model_type"))})


def double_layers(config: dict[str, Any]) -> int | None:
    """LongCat-Flash's double layers (``num_layers``: vLLM builds that many, each of two attention
    sublayers); None for any other model."""
    if config.get("model_type") == "longcat_flash" and "num_layers" in config:
        return int(config["num_layers"])
    return None


def uses_ngram_embedding(config: dict[str, Any]) -> bool:
    """A LongCat-Flash-Lite config (hashed n-gram embedding tables over LongCat-Flash's layers), told
    apart as vLLM does: by ``ngram_vocab_size_ratio``."""
    return config.get("ngram_vocab_size_ratio") is not None


def _with_layer_count(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its layer count where only its block list gives it: transformers ≥ 5 writes a
    Nemotron-H config's ``layers_block_type`` and no ``num_hidden_layers`` (its length, as vLLM reads it).
    A LongCat-Flash config counts double layers in ``num_layers`` (vLLM builds that many, each of two
    attention sublayers): its ``num_hidden_layers`` is twice that, as transformers derives it."""
    if (double := double_layers(config)) is not None:
        return config | {"num_hidden_layers": 2 * double}
    blocks = config.get("layers_block_type")
    if "num_hidden_layers" in config or not isinstance(blocks, list):
        return config
    return config | {"num_hidden_layers": len(blocks)}


def decoder_layers(config: dict[str, Any]) -> int:
    """The decoder layers a model runs in turn, as transformers' ``hidden_states`` step through them (one
    more entry: the embeddings): ``num_hidden_layers`` of its text config; LongCat-Flash's double layers
    (``num_layers``), each of two attention sublayers."""
    text = text_config(config)
    double = double_layers(text)
    return double if double is not None else int(text["num_hidden_layers"])


def text_config_value(config: dict[str, Any], key: str) -> Any:
    """``config[key]``, else the same key in the nested language-model config (as engines look it up)."""
    if key in config:
        return config[key]
    for nested in _TEXT_CONFIG_KEYS:
        sub = config.get(nested)
        if isinstance(sub, dict) and key in sub:
            return sub[key]
    thinker = config.get("thinker_config")
    if isinstance(thinker, dict):
        return text_config_value(thinker, key)
    return None


def token_content(value: Any) -> str | None:
    """A special-token entry of tokenizer_config.json: a string or a serialized AddedToken."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _missing_tokenizer(directory: Path) -> DraftfitError:
    slow = [name for name in _SLOW_TOKENIZER_FILES if (directory / name).is_file()]
    if slow:
        return DraftfitError(
            f"no tokenizer.json (only {', '.join(slow)}: a slow tokenizer)", where=str(directory),
            fix="Convert it once with `AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)`, "
            "which writes tokenizer.json",
        )
    return DraftfitError(
        "no tokenizer files (tokenizer.json)", where=str(directory),
        fix="Point at the model's directory, or copy its tokenizer.json, tokenizer_config.json "
        "and config.json into it",
    )


def _read_text(path: Path, fix: str) -> str:
    try:
        return path.read_text("utf-8")
    except UnicodeDecodeError as exc:
        raise DraftfitError(f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                            where=str(path), fix=fix) from exc
    except OSError as exc:
        raise DraftfitError(f"cannot read it ({exc.strerror})", where=str(path), fix=fix) from exc


def _parse_json_object(path: Path, text: str, fix: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DraftfitError(
            f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            where=str(path), fix=fix,
        ) from exc
    if not isinstance(data, dict):
        raise DraftfitError(f"expected a JSON object, found {type(data).__name__}",
                            where=str(path), fix=fix)
    return data


# config.json sizes that engines use as counts: each, where present (top level or the text config), a positive whole number
SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "head_dim", "max_position_embeddings", "num_layers", "n_layer", "n_head", "n_embd")


NAME_KEYS = ("model_type", "torch_dtype", "dtype")


def check_config_shape(config: dict[str, Any], where: str) -> dict[str, Any]:
    """Refuse a config whose sizes are not positive whole numbers (``"vocab_size": "lots"``, ``hidden_size: -5``),
    as vLLM would fail on them later with a traceback. Checked once here for check, rank and predict."""
    scopes = [config, *(config[k] for k in _TEXT_CONFIG_KEYS if isinstance(config.get(k), dict))]
    for scope in scopes:
        for key in SIZE_KEYS:
            value = scope.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DraftfitError(f"{key} is {shown(value)}, not a positive whole number", where=where,
                                    fix="Fix or re-download the model's config.json")
        for key in NAME_KEYS:
            value = scope.get(key)
            if value is not None and not isinstance(value, str):
                raise DraftfitError(f"{key} is {shown(value)}, not a name", where=where,
                                    fix="Fix or re-download the model's config.json")
        architectures = scope.get("architectures")
        if architectures is not None and not (isinstance(architectures, list)
                                              and all(isinstance(a, str) for a in architectures)):
            raise DraftfitError(f"architectures is {shown(architectures)}, not a list of class names", where=where,
                                fix="Fix or re-download the model's config.json")
    return config


def read_config(path: str | Path) -> dict[str, Any]:
    """A model's config.json: a JSON object whose sizes are positive whole numbers; one line with the fix otherwise."""
    path = Path(path)
    fix = "Re-download the model's config.json"
    if not path.is_file():
        raise DraftfitError("no config.json", where=str(path.parent), fix="Point at a directory holding the model's config.json")
    return check_config_shape(_parse_json_object(path, _read_text(path, fix), fix), str(path))


def _optional_json(path: Path, fix: str) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    return _parse_json_object(path, _read_text(path, fix), fix)


def _chat_template(directory: Path, tokenizer_config: dict[str, Any]) -> tuple[str | None, str | None]:
    """The default chat template and the file it came from (chat_template.jinja wins, as in transformers)."""
    jinja = directory / CHAT_TEMPLATE_JINJA
    if jinja.is_file():
        return _read_text(jinja, "Re-download chat_template.jinja"), CHAT_TEMPLATE_JINJA
    value = tokenizer_config.get("chat_template")
    if isinstance(value, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default", next(iter(named.values()), None))
    if isinstance(value, str):
        return value, TOKENIZER_CONFIG
    path = directory / CHAT_TEMPLATE_JSON
    data = _optional_json(path, "Re-download chat_template.json")
    if data and isinstance(data.get("chat_template"), str):
        return data["chat_template"], CHAT_TEMPLATE_JSON
    return None, None

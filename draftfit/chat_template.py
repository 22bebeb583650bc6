"""A torch-free tokenizer facade: ``tokenizers`` for ids, jinja2 for the chat template.

:class:`ChatTokenizer` reads an HF metadata directory (``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja`` or the ``chat_template`` key) and turns prompts into the exact token ids
vLLM would feed the target, without importing transformers:

- ``apply_chat_template`` renders the template the way transformers does (jinja2
  ``ImmutableSandboxedEnvironment`` with ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` and
  ``{% generation %}`` extensions, ``raise_exception``, ``strftime_now``, a non-escaping ``tojson``,
  and the named special tokens, ``tools=None`` and ``documents=None`` in the context). vLLM renders
  chat requests through transformers, so the strings are the ones vLLM renders.
- ``encode(text)`` adds no special tokens by default. That is what vLLM does with a rendered chat
  prompt: the template already emits BOS and friends, so ``LLM.chat`` and the chat-completions API
  tokenize the rendered text with ``add_special_tokens=False``. A plain completion prompt
  (``LLM.generate`` with a string, ``/v1/completions``) is tokenized with
  ``add_special_tokens=True``: pass that for text that is sent to the model as is, and the
  post-processor in ``tokenizer.json`` decides what is added. Like transformers 5, the
  ``add_bos_token``/``add_eos_token`` keys of ``tokenizer_config.json`` are ignored when a
  ``tokenizer.json`` is present.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from draftfit.errors import DraftfitError

# transformers' SPECIAL_TOKENS_ATTRIBUTES: the named special tokens a template sees as variables.
NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@runtime_checkable
class PromptTokenizer(Protocol):
    """What the prompt sampler needs from a tokenizer (``ChatTokenizer`` is the reference one)."""

    @property
    def has_chat_template(self) -> bool: ...

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]: ...

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> str: ...

    def looks_templated(self, text: str) -> bool: ...


def _token_text(value: Any) -> str | None:
    """A special-token entry of tokenizer_config.json: a string or an AddedToken dict."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _template_from_config(value: Any, where: str) -> str | None:
    """The ``chat_template`` key: a string, or a list of ``{"name", "template"}`` (use "default")."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {
            entry.get("name"): entry.get("template") for entry in value if isinstance(entry, Mapping)
        }
        if isinstance(named.get("default"), str):
            return named["default"]
        raise DraftfitError(
            f"several chat templates ({', '.join(sorted(map(str, named)))}) and none named 'default'",
            fix="Keep the serving template in chat_template.jinja",
            where=where,
        )
    raise DraftfitError(
        f"`chat_template` is a {type(value).__name__}, expected a string",
        fix="Fix tokenizer_config.json",
        where=where,
    )


class ChatTokenizer:
    """Token ids and chat-template rendering from an HF metadata directory, without torch.

    Build it with :meth:`from_dir`; the constructor takes an already loaded
    ``tokenizers.Tokenizer`` (tests build small ones in memory).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
        name: str = "tokenizer",
    ):
        self._tokenizer = tokenizer
        self.chat_template = chat_template
        self.special_tokens: dict[str, str] = {
            key: value for key, value in (special_tokens or {}).items() if value is not None
        }
        self.name = name

    @classmethod
    def from_dir(cls, path: str | Path) -> ChatTokenizer:
        """Read ``tokenizer.json`` (required), ``tokenizer_config.json`` and the chat template.

        The template comes from ``chat_template.jinja`` if present (transformers gives the file
        priority), else the ``chat_template`` key of ``tokenizer_config.json``, else
        ``chat_template.json``.
        """
        from tokenizers import Tokenizer

        root = Path(path)
        tok_file = root / "tokenizer.json"
        if not tok_file.is_file():
            raise DraftfitError(
                "no tokenizer.json",
                fix="Point at an HF model directory that has a fast tokenizer (tokenizer.json)",
                where=str(root),
            )
        try:
            tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as exc:  # noqa: BLE001 - the Rust error names the problem
            raise DraftfitError(
                f"tokenizer.json cannot be read ({exc})",
                fix="Re-download or re-convert the model's tokenizer",
                where=str(tok_file),
            ) from exc

        config: dict[str, Any] = {}
        config_file = root / "tokenizer_config.json"
        if config_file.is_file():
            config = _read_json(config_file)

        template: str | None = None
        jinja_file = root / "chat_template.jinja"
        json_template_file = root / "chat_template.json"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        elif config.get("chat_template") is not None:
            template = _template_from_config(config["chat_template"], str(config_file))
        elif json_template_file.is_file():
            template = _template_from_config(
                _read_json(json_template_file).get("chat_template"), str(json_template_file)
            )

        special = {key: _token_text(config.get(key)) for key in NAMED_SPECIAL_TOKENS}
        return cls(
            tokenizer,
            chat_template=template,
            special_tokens={k: v for k, v in special.items() if v is not None},
            name=str(root),
        )

    # ---- facts -------------------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    @property
    def vocab_size(self) -> int:
        """Size of the tokenizer's vocabulary including added tokens."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @cached_property
    def all_special_tokens(self) -> frozenset[str]:
        """Named special tokens plus every added token flagged ``special``."""
        tokens = set(self.special_tokens.values())
        decoder = self._tokenizer.get_added_tokens_decoder()
        tokens.update(tok.content for tok in decoder.values() if tok.special)
        return frozenset(t for t in tokens if t)

    @cached_property
    def _template_markers(self) -> frozenset[str]:
        """Special tokens that the chat template itself emits (probe conversation)."""
        if not self.has_chat_template:
            return frozenset()
        try:
            rendered = self.apply_chat_template(
                [{"role": "user", "content": "x"}], add_generation_prompt=True
            )
        except DraftfitError:
            return frozenset()
        return frozenset(tok for tok in self.all_special_tokens if tok in rendered)

    def looks_templated(self, text: str) -> bool:
        """True when ``text`` already carries the chat template's control tokens.

        The test: the text contains a special token that the template emits for a one-message
        conversation (``<|im_start|>`` for SmolLM2). Such rows came out of a log after templating
        and are sent as they are.
        """
        return any(marker in text for marker in self._template_markers)

    # ---- tokenization ------------------------------------------------------------------------
    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens=True`` lets the post-processor add BOS/EOS."""
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = False) -> list[list[int]]:
        """``encode`` for many texts at once (the Rust tokenizer runs them in parallel)."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [list(enc.ids) for enc in encodings]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ---- chat template -----------------------------------------------------------------------
    @cached_property
    def _compiled_template(self) -> Any:
        if not self.chat_template:
            raise DraftfitError(
                "the tokenizer has no chat template",
                fix="Add chat_template.jinja to the model directory or send prompts untemplated",
                where=self.name,
            )
        return compile_chat_template(self.chat_template, where=self.name)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render ``messages`` to the prompt string, as transformers' ``apply_chat_template``
        (``tokenize=False``) does; extra keyword arguments reach the template as variables."""
        import jinja2

        context = {**self.special_tokens, **kwargs}
        try:
            return self._compiled_template.render(
                messages=list(messages),
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except jinja2.TemplateError as exc:
            # raise_exception() messages are written by the template author, not prompt text.
            raise DraftfitError(
                f"the chat template refused the conversation: {exc}",
                fix="Check the message roles and their order",
                where=self.name,
            ) from exc


def compile_chat_template(source: str, *, where: str = "chat template") -> Any:
    """Compile a chat template with the environment transformers uses."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (transformers tracks
        assistant spans with it; rendering is unchanged)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(
                lineno
            )

        def _render(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise DraftfitError(
            f"chat template syntax error at line {exc.lineno}: {exc.message}",
            fix="Fix the chat template (chat_template.jinja or tokenizer_config.json)",
            where=where,
        ) from exc


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftfitError(f"not valid JSON ({exc})", fix="Fix or re-download the file",
                            where=str(path)) from exc
    if not isinstance(data, dict):
        raise DraftfitError("expected a JSON object", fix="Fix or re-download the file",
                            where=str(path))
    return data

"""The check report: plain dataclasses whose ``to_dict()`` is the documented JSON schema.

docs/check-json.md describes every field; ``SCHEMA_VERSION`` changes whenever a field is renamed,
removed or changes meaning (adding a field keeps the version).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1

IDENTICAL = "identical"
COMPATIBLE = "compatible"
INCOMPATIBLE = "incompatible"
UNKNOWN = "unknown"  # an engine verdict the files cannot decide (e.g. no config.json)
ENGINES = ("vllm", "transformers", "llama.cpp")


@dataclass
class Finding:
    """One difference, with a stable ``code`` (for programs) and a readable ``message``."""

    code: str
    message: str


@dataclass
class TokenRef:
    id: int | None
    token: str | None


@dataclass
class TokenDifference:
    """The token each side has at one id (``None`` where that side has no token)."""

    id: int
    target: str | None
    draft: str | None


@dataclass
class ModelSummary:
    label: str
    directory: str
    model_type: str | None
    tokenizer_model: str
    byte_level: bool
    byte_fallback: bool
    vocab_base_size: int
    added_tokens: int
    len_tokenizer: int
    config_vocab_size: int | None
    chat_template_source: str | None
    has_config: bool = True


@dataclass
class ComponentDiff:
    """One part of tokenizer.json: ``model`` (options, without vocab and merges), ``normalizer``,
    ``pre_tokenizer``, ``post_processor``, ``decoder``, ``truncation``, ``padding``."""

    component: str
    equal: bool
    target: str | None
    draft: str | None
    differences: list[str] = field(default_factory=list)


@dataclass
class VocabComparison:
    identical: bool
    config_vocab_size_equal: bool
    shared_ids: int
    shared_ids_equal: int
    shared_ids_different: int
    first_different: list[TokenDifference]
    target_only_ids: int
    target_only_range: list[int] | None
    draft_only_ids: int
    draft_only_range: list[int] | None
    merges_equal: bool | None


@dataclass
class AddedToken:
    """An entry of tokenizer.json ``added_tokens``."""

    id: int
    token: str
    special: bool


@dataclass
class SpecialTokenRole:
    role: str
    target: TokenRef
    draft: TokenRef
    equal: bool


@dataclass
class SpecialTokens:
    roles: list[SpecialTokenRole]
    added_target: list[AddedToken]
    added_draft: list[AddedToken]
    added_tokens_equal: bool
    added_tokens_different: list[TokenDifference]
    added_tokens_flags_different: list[int]
    encode_adds_target: dict[str, list[int]]
    encode_adds_draft: dict[str, list[int]]
    encode_adds_equal: bool
    config_token_ids_target: dict[str, Any]
    config_token_ids_draft: dict[str, Any]
    config_token_ids_equal: bool
    generation_eos_target: list[int] | None
    generation_eos_draft: list[int] | None
    generation_eos_equal: bool


@dataclass
class ChatTemplateComparison:
    equal: bool
    target_present: bool
    draft_present: bool
    diff: list[str] = field(default_factory=list)


@dataclass
class ProbeCategory:
    category: str
    texts: int
    identical: int


@dataclass
class ProbeExample:
    category: str
    text: str
    position: int
    target: list[TokenRef]
    draft: list[TokenRef]
    target_pieces: list[str] = field(default_factory=list)
    draft_pieces: list[str] = field(default_factory=list)


@dataclass
class ProbeComparison:
    texts: int
    identical: int
    share_identical: float
    target_tokens: int
    draft_tokens: int
    by_category: list[ProbeCategory]
    first_difference: ProbeExample | None


@dataclass
class VocabIntersection:
    method: str
    target_space_prefixes: list[str]
    draft_space_prefixes: list[str]
    size: int
    share_of_target: float
    share_of_draft: float
    probe_target_tokens: int
    probe_tokens_covered: int
    probe_coverage: float


@dataclass
class EngineVerdict:
    engine: str
    version: str | None
    version_source: str
    verdict: str
    mode: str | None
    reason: str
    error: str | None = None
    fix: str | None = None
    requires: dict[str, Any] = field(default_factory=dict)

    @property
    def compatible(self) -> bool:
        return self.verdict == COMPATIBLE


@dataclass
class CheckReport:
    """Everything ``draftfit check`` found about one (target, draft) pair."""

    schema_version: int
    target: ModelSummary
    draft: ModelSummary
    verdict: str
    summary: str
    blocking: list[Finding]
    warnings: list[Finding]
    harmless: list[Finding]
    tokenizer: list[ComponentDiff]
    vocab: VocabComparison
    special_tokens: SpecialTokens
    chat_template: ChatTemplateComparison
    probe: ProbeComparison
    intersection: VocabIntersection
    engines: dict[str, EngineVerdict]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (docs/check-json.md)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckReport:
        """Rebuild a report from :meth:`to_dict` output (e.g. read back from results.json)."""
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"check report schema_version {version!r}; this draftfit reads {SCHEMA_VERSION}")
        return _build(cls, data)

    def engine(self, name: str) -> EngineVerdict:
        return self.engines[name]

    def compatible_with(self, engine: str = "vllm") -> bool:
        """True when ``engine`` can run this pair as a draft (the verdict that sets the exit code)."""
        return self.engines[engine].compatible


def _build(tp: Any, value: Any) -> Any:
    """Turn JSON data back into the annotated dataclass types."""
    if value is None:
        return None
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _build(hints[f.name], value[f.name]) for f in dataclasses.fields(tp)
                     if f.name in value})
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is list:
        return [_build(args[0], item) for item in value]
    if origin is dict:
        return {key: _build(args[1], item) for key, item in value.items()}
    if args:  # X | None
        inner = [arg for arg in args if arg is not type(None)]
        if len(inner) == 1:
            return _build(inner[0], value)
    return value

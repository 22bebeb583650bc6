"""Compare two tokenizers (and the config facts engines check) without loading any weights."""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from draftfit.compat import verdicts
from draftfit.compat.files import SPECIAL_ROLES, ModelFiles, load_model_files, text_config_value
from draftfit.compat.schema import (
    COMPATIBLE,
    IDENTICAL,
    INCOMPATIBLE,
    SCHEMA_VERSION,
    AddedToken,
    ChatTemplateComparison,
    CheckReport,
    ComponentDiff,
    Finding,
    ModelSummary,
    ProbeCategory,
    ProbeComparison,
    ProbeExample,
    SpecialTokenRole,
    SpecialTokens,
    TokenDifference,
    TokenRef,
    VocabComparison,
    VocabIntersection,
)
from draftfit.probe_corpus import ProbeText, builtin_probe_texts

COMPONENTS = ("model", "normalizer", "pre_tokenizer", "post_processor", "decoder", "truncation", "padding")
MAX_LISTED = 10  # differing ids / added tokens listed in the report
MAX_DIFF_LINES = 12  # lines of a component or chat-template diff
_EXAMPLE_WINDOW = 8  # tokens shown from the first differing position of a probe text
_ENCODE_PROBE = "Hello"  # text encoded with and without special tokens to see what encoding adds
# vLLM's fallback space prefixes when probing " a" does not reveal one (BPE 'Ġ', SentencePiece '▁')
_FALLBACK_SPACE_PREFIXES = ("\u0120", "\u2581")


def compare(
    target_dir: str | Path,
    draft_dir: str | Path,
    *,
    probe_texts: Sequence[ProbeText | str] | None = None,
    vllm_version: str | None = None,
    target_label: str | None = None,
    draft_label: str | None = None,
) -> CheckReport:
    """Compare the tokenizer and config files of a target and a draft metadata directory.

    ``probe_texts`` are encoded *in addition to* the built-in probe corpus (plain strings get the
    category ``file``). ``vllm_version`` picks the vLLM rules (default: the installed vLLM).
    The labels name the models in messages and fixes (default: the directory paths).
    """
    target = load_model_files(target_dir, label=target_label)
    draft = load_model_files(draft_dir, label=draft_label, like=target)
    texts = builtin_probe_texts() + [
        t if isinstance(t, ProbeText) else ProbeText("file", str(t)) for t in (probe_texts or [])
    ]
    return compare_files(target, draft, texts, vllm_version=vllm_version)


def compare_files(
    target: ModelFiles, draft: ModelFiles, texts: Sequence[ProbeText], *, vllm_version: str | None = None
) -> CheckReport:
    """:func:`compare` on already-loaded files and an explicit list of probe texts."""
    shared = draft.tokenizer is target.tokenizer  # byte-identical tokenizer.json, parsed once
    t_ids = _id_table(target)
    d_ids = t_ids if shared else _id_table(draft)
    tokenizer = [_component(name, target.tokenizer_json, draft.tokenizer_json) for name in COMPONENTS]
    vocab = _compare_vocab(target, draft, t_ids, d_ids)
    special = _compare_special(target, draft)
    template = _compare_chat_template(target.chat_template, draft.chat_template)
    t_encoded = _encode(target, texts)
    d_encoded = t_encoded if shared else _encode(draft, texts)
    probe = _compare_probe(target, draft, texts, t_encoded, d_encoded, t_ids, d_ids)
    intersection = _intersection(target, draft, t_ids, d_ids, t_encoded)

    blocking, warnings, harmless = _findings(target, draft, tokenizer, vocab, special, template, probe)
    if blocking:
        verdict = INCOMPATIBLE
        summary = "; ".join(f.message for f in blocking)
    elif warnings or harmless:
        verdict = COMPATIBLE
        parts = ["every token id means the same token"]
        if harmless:
            parts.append("differences that do not matter: " + ", ".join(_short(f) for f in harmless))
        if warnings:
            parts.append("may lower acceptance: " + ", ".join(_short(f) for f in warnings))
        summary = "; ".join(parts)
    else:
        verdict = IDENTICAL
        summary = "identical tokenizers, special tokens, chat templates and vocab_size"

    report = CheckReport(
        schema_version=SCHEMA_VERSION,
        target=_summary(target),
        draft=_summary(draft),
        verdict=verdict,
        summary=summary,
        blocking=blocking,
        warnings=warnings,
        harmless=harmless,
        tokenizer=tokenizer,
        vocab=vocab,
        special_tokens=special,
        chat_template=template,
        probe=probe,
        intersection=intersection,
        engines={},
    )
    report.engines = verdicts.engine_verdicts(report, target, draft, t_ids, d_ids, vllm_version=vllm_version)
    return report


# --- model facts -------------------------------------------------------------------------------

def _summary(files: ModelFiles) -> ModelSummary:
    model = files.tokenizer_json["model"]
    tok = files.tokenizer
    return ModelSummary(
        label=files.label,
        directory=str(files.directory),
        model_type=text_config_value(files.config, "model_type"),
        tokenizer_model=str(model["type"]),
        byte_level=_has_type(files.tokenizer_json.get("pre_tokenizer"), "ByteLevel"),
        byte_fallback=bool(model.get("byte_fallback", False)),
        vocab_base_size=tok.get_vocab_size(with_added_tokens=False),
        added_tokens=len(files.tokenizer_json.get("added_tokens") or []),
        len_tokenizer=tok.get_vocab_size(with_added_tokens=True),
        config_vocab_size=files.config_vocab_size,
        chat_template_source=files.chat_template_source,
        has_config=files.has_config,
    )


def _has_type(node: Any, type_name: str) -> bool:
    """Whether a tokenizer.json component (possibly a Sequence) contains a part of ``type_name``."""
    if isinstance(node, dict):
        if node.get("type") == type_name:
            return True
        return any(_has_type(v, type_name) for v in node.values() if isinstance(v, (list, dict)))
    if isinstance(node, list):
        return any(_has_type(v, type_name) for v in node)
    return False


def _id_table(files: ModelFiles) -> np.ndarray:
    """id -> token string for every id of the tokenizer (object array; ``None`` for unused ids)."""
    vocab = files.tokenizer_json["model"].get("vocab") or {}
    added = files.tokenizer_json.get("added_tokens") or []
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], id = position
        tokens = [row[0] for row in vocab]
        ids = np.arange(len(vocab), dtype=np.int64)
    else:
        tokens = list(vocab)
        ids = np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))
    size = max([int(ids.max()) + 1 if len(ids) else 0] + [int(t["id"]) + 1 for t in added])
    table = np.full(size, None, dtype=object)
    if tokens:
        table[ids] = np.asarray(tokens, dtype=object)
    for entry in added:
        table[int(entry["id"])] = entry["content"]
    return table


# --- tokenizer.json components -----------------------------------------------------------------

def _component(name: str, target: dict[str, Any], draft: dict[str, Any]) -> ComponentDiff:
    a, b = target.get(name), draft.get(name)
    if name == "model":
        a = {k: v for k, v in (a or {}).items() if k not in ("vocab", "merges")}
        b = {k: v for k, v in (b or {}).items() if k not in ("vocab", "merges")}
    equal = a == b
    return ComponentDiff(
        component=name, equal=equal, target=_describe(a), draft=_describe(b),
        differences=[] if equal else _cap(_json_diff(a, b, name)),
    )


def _describe(node: Any) -> str | None:
    """``BPE``, ``Sequence[NFC, Replace]``, or None for an absent component."""
    if node is None:
        return None
    if not isinstance(node, dict):
        return json.dumps(node)
    kind = str(node.get("type", "set"))
    parts = next((node[k] for k in ("normalizers", "pretokenizers", "processors", "decoders")
                  if isinstance(node.get(k), list)), None)
    if kind == "Sequence" and parts is not None:
        return f"Sequence[{', '.join(_describe(p) or 'none' for p in parts)}]"
    return kind


def _json_diff(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in list(a) + [k for k in b if k not in a]:
            if a.get(key, _ABSENT) != b.get(key, _ABSENT):
                out += _json_diff(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{path}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                out += _json_diff(x, y, f"{path}[{i}]")
        return out
    return [f"{path}: {_show(a)} → {_show(b)}"]


_ABSENT = object()


def _show(value: Any, limit: int = 60) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cap(lines: list[str], limit: int = MAX_DIFF_LINES) -> list[str]:
    if len(lines) <= limit:
        return lines
    return lines[: limit - 1] + [f"… {len(lines) - limit + 1} more"]


# --- vocabulary --------------------------------------------------------------------------------

def _compare_vocab(target: ModelFiles, draft: ModelFiles, t_ids: np.ndarray, d_ids: np.ndarray) -> VocabComparison:
    n = min(len(t_ids), len(d_ids))
    t_head, d_head = t_ids[:n], d_ids[:n]
    both = (t_head != None) & (d_head != None)  # noqa: E711 - elementwise on object arrays
    differ = both & (t_head != d_head)
    differing = np.flatnonzero(differ)
    t_only = _only_in(t_ids, d_ids)
    d_only = _only_in(d_ids, t_ids)
    merges_equal = None
    t_model, d_model = target.tokenizer_json["model"], draft.tokenizer_json["model"]
    if t_model["type"] == d_model["type"] == "BPE":
        merges_equal = _merges(t_model) == _merges(d_model)
    t_rows, d_rows = target.config_vocab_size, draft.config_vocab_size
    shared = int(both.sum())
    return VocabComparison(
        identical=len(t_ids) == len(d_ids) and bool(np.array_equal(t_ids, d_ids)) and merges_equal is not False,
        config_vocab_size_equal=t_rows == d_rows,
        shared_ids=shared,
        shared_ids_equal=shared - len(differing),
        shared_ids_different=len(differing),
        first_different=[TokenDifference(int(i), t_ids[i], d_ids[i]) for i in differing[:MAX_LISTED]],
        target_only_ids=len(t_only),
        target_only_range=[int(t_only[0]), int(t_only[-1])] if len(t_only) else None,
        draft_only_ids=len(d_only),
        draft_only_range=[int(d_only[0]), int(d_only[-1])] if len(d_only) else None,
        merges_equal=merges_equal,
    )


def _only_in(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Ids that have a token in ``a`` but none in ``b``."""
    in_b = np.zeros(len(a), dtype=bool)
    n = min(len(a), len(b))
    in_b[:n] = b[:n] != None  # noqa: E711 - elementwise on object arrays
    return np.flatnonzero((a != None) & ~in_b)  # noqa: E711


def _merges(model: dict[str, Any]) -> list[Any]:
    """BPE merges in one form: tokenizers writes ``"a b"`` strings (old) or ``["a", "b"]`` pairs (new)."""
    merges = model.get("merges") or []
    if merges and isinstance(merges[0], str):
        return [m.split(" ", 1) for m in merges]
    return merges


# --- special tokens ----------------------------------------------------------------------------

def _compare_special(target: ModelFiles, draft: ModelFiles) -> SpecialTokens:
    roles = []
    for role in SPECIAL_ROLES:
        t, d = _special_ref(target, role), _special_ref(draft, role)
        roles.append(SpecialTokenRole(role=role, target=t, draft=d, equal=t == d))

    t_added = {int(e["id"]): e for e in target.tokenizer_json.get("added_tokens") or []}
    d_added = {int(e["id"]): e for e in draft.tokenizer_json.get("added_tokens") or []}
    content_diff, flag_diff = [], []
    for i in sorted(set(t_added) | set(d_added)):
        a, b = t_added.get(i), d_added.get(i)
        if (a or {}).get("content") != (b or {}).get("content"):
            content_diff.append(TokenDifference(i, a and a["content"], b and b["content"]))
        elif a != b:
            flag_diff.append(i)

    t_adds, d_adds = _encode_adds(target), _encode_adds(draft)
    t_cfg, d_cfg = _config_token_ids(target), _config_token_ids(draft)
    t_gen, d_gen = _generation_eos(target), _generation_eos(draft)
    return SpecialTokens(
        roles=roles,
        added_target=[AddedToken(i, e["content"], bool(e.get("special"))) for i, e in sorted(t_added.items())],
        added_draft=[AddedToken(i, e["content"], bool(e.get("special"))) for i, e in sorted(d_added.items())],
        added_tokens_equal=not content_diff and not flag_diff,
        added_tokens_different=content_diff[:MAX_LISTED],
        added_tokens_flags_different=flag_diff[:MAX_LISTED],
        encode_adds_target=t_adds,
        encode_adds_draft=d_adds,
        encode_adds_equal=t_adds == d_adds,
        config_token_ids_target=t_cfg,
        config_token_ids_draft=d_cfg,
        config_token_ids_equal=t_cfg == d_cfg,
        generation_eos_target=t_gen,
        generation_eos_draft=d_gen,
        generation_eos_equal=t_gen == d_gen,
    )


def _special_ref(files: ModelFiles, role: str) -> TokenRef:
    token = files.special_token(role)
    return TokenRef(id=files.tokenizer.token_to_id(token) if token is not None else None, token=token)


def _encode_adds(files: ModelFiles) -> dict[str, list[int]]:
    """The ids that encoding with special tokens puts before and after the text."""
    tok = files.tokenizer
    plain = tok.encode(_ENCODE_PROBE, add_special_tokens=False).ids
    full = tok.encode(_ENCODE_PROBE, add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return {"prefix": full[:start], "suffix": full[start + len(plain):]}
    return {"prefix": full, "suffix": []}


def _config_token_ids(files: ModelFiles) -> dict[str, Any]:
    return {key: text_config_value(files.config, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}


def _generation_eos(files: ModelFiles) -> list[int] | None:
    """The eos ids generation stops on: generation_config.json, else config.json (as transformers
    derives a generation config from the model config)."""
    value = None
    if files.generation_config is not None:
        value = files.generation_config.get("eos_token_id")
    if value is None:
        value = text_config_value(files.config, "eos_token_id")
    if value is None:
        return None
    return sorted(value) if isinstance(value, list) else [value]


def _compare_chat_template(target: str | None, draft: str | None) -> ChatTemplateComparison:
    diff: list[str] = []
    if target != draft and target is not None and draft is not None:
        lines = difflib.unified_diff(target.splitlines(), draft.splitlines(), "target", "draft", n=0, lineterm="")
        diff = _cap([line for line in lines if not line.startswith(("---", "+++"))])
    return ChatTemplateComparison(
        equal=target == draft, target_present=target is not None, draft_present=draft is not None, diff=diff
    )


# --- probe corpus ------------------------------------------------------------------------------

def _encode(files: ModelFiles, texts: Sequence[ProbeText]) -> list[list[int]]:
    tok = files.tokenizer
    tok.no_truncation()
    tok.no_padding()
    return [enc.ids for enc in tok.encode_batch([t.text for t in texts], add_special_tokens=False)]


def _compare_probe(
    target: ModelFiles, draft: ModelFiles, texts: Sequence[ProbeText],
    t_enc: list[list[int]], d_enc: list[list[int]], t_ids: np.ndarray, d_ids: np.ndarray,
) -> ProbeComparison:
    same = [a == b for a, b in zip(t_enc, d_enc, strict=True)]
    categories: dict[str, list[int]] = {}
    for text, ok in zip(texts, same, strict=True):
        counts = categories.setdefault(text.category, [0, 0])
        counts[0] += 1
        counts[1] += ok
    first = next((i for i, ok in enumerate(same) if not ok), None)
    example = None
    if first is not None:
        a, b = t_enc[first], d_enc[first]
        pos = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        window = slice(max(0, pos - 2), pos + _EXAMPLE_WINDOW)
        example = ProbeExample(
            category=texts[first].category, text=texts[first].text, position=pos,
            target=[TokenRef(i, _token(t_ids, i)) for i in a[window]],
            draft=[TokenRef(i, _token(d_ids, i)) for i in b[window]],
            target_pieces=_pieces(target, a[window]),
            draft_pieces=_pieces(draft, b[window]),
        )
    n = len(texts)
    return ProbeComparison(
        texts=n,
        identical=sum(same),
        share_identical=sum(same) / n if n else 1.0,
        target_tokens=sum(map(len, t_enc)),
        draft_tokens=sum(map(len, d_enc)),
        by_category=[ProbeCategory(c, k, s) for c, (k, s) in categories.items()],
        first_difference=example,
    )


def _pieces(files: ModelFiles, ids: list[int]) -> list[str]:
    """Each token decoded on its own (partial UTF-8 sequences show as U+FFFD)."""
    return [files.tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def _token(table: np.ndarray, i: int) -> str | None:
    return table[i] if 0 <= i < len(table) else None


# --- vocabulary intersection (vLLM's heterogeneous-vocabulary mapping) -------------------------

def _space_prefixes(files: ModelFiles) -> tuple[str, ...]:
    """The word-initial space marker, found as vLLM finds it: the first token of ``" a"``."""
    enc = files.tokenizer.encode(" a", add_special_tokens=False)
    if enc.tokens:
        tok = enc.tokens[0]
        if len(tok) > 1 and tok.endswith("a") and tok[0] not in (" ", "\t"):
            return (tok[:-1],)
    return _FALLBACK_SPACE_PREFIXES


def _normalized_first_ids(table: np.ndarray, prefixes: tuple[str, ...], limit: int) -> dict[str, int]:
    """normalized token string -> lowest id below ``limit`` carrying it."""
    ids = np.flatnonzero(table[:limit] != None)  # noqa: E711 - elementwise on object arrays
    tokens = table[ids].tolist()
    for prefix in prefixes:
        cut = len(prefix)
        tokens = [" " + t[cut:] if t.startswith(prefix) else t for t in tokens]
    # later entries overwrite earlier ones: walk from the highest id down so the lowest id wins
    return dict(zip(reversed(tokens), reversed(ids.tolist()), strict=True))


def _intersection(
    target: ModelFiles, draft: ModelFiles, t_ids: np.ndarray, d_ids: np.ndarray, t_enc: list[list[int]]
) -> VocabIntersection:
    t_rows = target.config_vocab_size or len(t_ids)
    d_rows = draft.config_vocab_size or len(d_ids)
    t_pre, d_pre = _space_prefixes(target), _space_prefixes(draft)
    t_norm = _normalized_first_ids(t_ids, t_pre, t_rows)
    d_norm = _normalized_first_ids(d_ids, d_pre, d_rows)
    common = t_norm.keys() & d_norm.keys()
    covered = np.zeros(max(len(t_ids), t_rows), dtype=bool)
    covered[[t_norm[token] for token in common]] = True
    flat = np.fromiter((i for ids in t_enc for i in ids), dtype=np.int64)
    flat = flat[flat < len(covered)]
    hits = int(covered[flat].sum()) if len(flat) else 0
    total = sum(map(len, t_enc))
    return VocabIntersection(
        method="vllm-tli: exact token strings after mapping the space marker to ' ' (lowest id wins)",
        target_space_prefixes=list(t_pre),
        draft_space_prefixes=list(d_pre),
        size=len(common),
        share_of_target=len(common) / t_rows if t_rows else 0.0,
        share_of_draft=len(common) / d_rows if d_rows else 0.0,
        probe_target_tokens=total,
        probe_tokens_covered=hits,
        probe_coverage=hits / total if total else 1.0,
    )


# --- findings and verdict ----------------------------------------------------------------------

def _findings(
    target: ModelFiles, draft: ModelFiles, tokenizer: list[ComponentDiff], vocab: VocabComparison,
    special: SpecialTokens, template: ChatTemplateComparison, probe: ProbeComparison,
) -> tuple[list[Finding], list[Finding], list[Finding]]:
    blocking: list[Finding] = []
    warnings: list[Finding] = []
    harmless: list[Finding] = []
    t_type, d_type = target.tokenizer_json["model"]["type"], draft.tokenizer_json["model"]["type"]
    if t_type != d_type:
        blocking.append(Finding("model_type_differs", f"tokenizer models differ: {t_type} vs {d_type}"))
    if vocab.shared_ids_different:
        first = vocab.first_different[0]
        blocking.append(Finding(
            "token_ids_differ",
            f"{vocab.shared_ids_different:,} of {vocab.shared_ids:,} shared ids map to different tokens "
            f"(first: id {first.id} {first.target!r} vs {first.draft!r})",
        ))
    t_len = target.tokenizer.get_vocab_size(with_added_tokens=True)
    d_rows = draft.config_vocab_size
    if d_rows is not None and t_len > d_rows:
        blocking.append(Finding(
            "target_ids_beyond_draft",
            f"the target's tokenizer has {t_len:,} ids but the draft's embedding has {d_rows:,} rows "
            f"(ids ≥ {d_rows:,} are out of range for the draft)",
        ))
    elif vocab.target_only_ids:
        lo, hi = vocab.target_only_range or (0, 0)
        warnings.append(Finding(
            "target_only_tokens",
            f"{vocab.target_only_ids:,} target ids ({lo}–{hi}) are not in the draft's tokenizer "
            "(the draft has untrained rows for them)",
        ))
    if vocab.draft_only_ids:
        lo, hi = vocab.draft_only_range or (0, 0)
        harmless.append(Finding(
            "draft_only_tokens",
            f"{vocab.draft_only_ids:,} draft ids ({lo}–{hi}) are not in the target's tokenizer "
            "(drafts of them are rejected)",
        ))

    components = {c.component: c for c in tokenizer}
    for name, code, bucket in (
        ("model", "model_options_differ", warnings),
        ("normalizer", "normalizer_differs", warnings),
        ("pre_tokenizer", "pre_tokenizer_differs", warnings),
        ("post_processor", "post_processor_differs", harmless),
        ("decoder", "decoder_differs", harmless),
        ("truncation", "truncation_differs", harmless),
        ("padding", "padding_differs", harmless),
    ):
        c = components[name]
        if not c.equal and not (name == "model" and t_type != d_type):
            detail = c.differences[0] if c.differences else f"{c.target} → {c.draft}"
            label = "model options" if name == "model" else name.replace("_", "-")
            bucket.append(Finding(code, f"{label} differ{'' if name == 'model' else 's'} ({detail})"))
    if vocab.merges_equal is False:
        warnings.append(Finding("merges_differ", "BPE merges differ (the same text can split differently)"))
    if not blocking and probe.identical < probe.texts:
        ex = probe.first_difference
        where = f" (first: {ex.category} text {ex.text[:40]!r})" if ex else ""
        warnings.append(Finding(
            "probe_encodings_differ",
            f"{probe.texts - probe.identical} of {probe.texts} probe texts encode to different ids{where}",
        ))

    if not vocab.config_vocab_size_equal and not blocking and target.has_config and draft.has_config:
        harmless.append(Finding(
            "vocab_size_padding",
            f"config vocab_size {target.config_vocab_size} vs {draft.config_vocab_size} "
            "(embedding rows beyond the tokenizer; token ids unaffected)",
        ))
    for role in special.roles:
        if not role.equal:
            harmless.append(Finding(
                f"{role.role}_token_differs",
                f"{role.role} token {_ref(role.target)} vs {_ref(role.draft)}",
            ))
    if special.added_tokens_different and not vocab.shared_ids_different:
        d = special.added_tokens_different[0]
        harmless.append(Finding(
            "added_tokens_differ",
            f"added tokens differ (first: id {d.id} {d.target!r} vs {d.draft!r})",
        ))
    if special.added_tokens_flags_different:
        harmless.append(Finding(
            "added_token_flags_differ",
            f"added-token flags (special/normalized/strip) differ at ids {special.added_tokens_flags_different}",
        ))
    if not special.encode_adds_equal:
        harmless.append(Finding(
            "encode_adds_differ",
            f"encoding adds {special.encode_adds_target} vs {special.encode_adds_draft} "
            "(prompts are encoded with the target's tokenizer)",
        ))
    if not special.config_token_ids_equal:
        harmless.append(Finding(
            "config_token_ids_differ",
            f"config.json token ids {special.config_token_ids_target} vs {special.config_token_ids_draft}",
        ))
    if not special.generation_eos_equal:
        harmless.append(Finding(
            "generation_eos_differs",
            f"generation_config eos ids {special.generation_eos_target} vs {special.generation_eos_draft} "
            "(the target decides when to stop)",
        ))
    if not template.equal:
        if template.target_present and template.draft_present:
            message = "chat templates differ (the draft was tuned on another prompt format)"
        else:
            message = f"only the {'target' if template.target_present else 'draft'} has a chat template"
        warnings.append(Finding("chat_template_differs", message))
    return blocking, warnings, harmless


def _ref(ref: TokenRef) -> str:
    return "none" if ref.token is None else f"{ref.token!r} ({ref.id})"


def _short(finding: Finding) -> str:
    return finding.code.replace("_", " ")

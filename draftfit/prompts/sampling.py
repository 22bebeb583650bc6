"""Step 2b: the seeded, length-stratified sample of the prompts the target sees (see
:mod:`draftfit.prompts`)."""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from draftfit.errors import DraftfitError
from draftfit.prompts.loading import (
    BUCKETS,
    DEFAULT_THRESHOLDS,
    EXCERPT_CHARS,
    PromptWarning,
    prompt_digest,
    source_of,
)
from draftfit.scrub import ScrubCounts, scrub_messages, scrub_text

if TYPE_CHECKING:
    import datasets

    from draftfit.candidates import StudySettings
    from draftfit.chat_template import PromptTokenizer

log = logging.getLogger(__name__)

TemplateMode = Literal["auto", "always", "never"]


@dataclass(frozen=True)
class PromptItem:
    """One sampled prompt, exactly as the target will see it."""

    id: int  # row index in the source (stable across runs)
    category: str
    bucket: str  # "short" | "medium" | "long"
    n_input_tokens: int
    input_ids: list[int] = field(repr=False)
    text: str = field(repr=False)  # the input as sent: rendered template, scrubbed if asked
    kind: str = "prompt"  # "prompt" or "messages": which column the row used
    templated: bool = False  # draftfit applied the chat template
    messages: list[dict[str, str]] | None = field(default=None, repr=False)  # the chat the template rendered (templated rows)


@dataclass(frozen=True)
class DroppedPrompt:
    """A row that was not eligible for the sample, and why."""

    id: int
    category: str
    reason: str
    n_input_tokens: int | None = None
    digest: str = ""  # prompt_digest() of the row's text: findable in the source, not readable


@dataclass(frozen=True)
class SampleSummary:
    """What the sample contains: counts per bucket × category, and how it was drawn."""

    source: str
    n_rows: int  # rows in the dataset
    n_eligible: int  # rows that fit the context and rendered
    n_dropped: int
    n_requested: int
    n_sampled: int
    seed: int
    thresholds: tuple[int, int]
    max_input_tokens: int
    stratified: bool
    counts: dict[str, dict[str, int]]  # bucket -> category -> sampled rows
    eligible_by_bucket: dict[str, int]  # bucket -> eligible rows (the population)
    tokens_by_bucket: dict[str, dict[str, float]]  # bucket -> min/median/max input tokens (sampled)
    scrubbed: ScrubCounts | None  # replacements in the sampled prompts; None = scrub off

    @property
    def by_bucket(self) -> dict[str, int]:
        return {b: sum(self.counts.get(b, {}).values()) for b in BUCKETS}

    @property
    def by_category(self) -> dict[str, int]:
        totals: Counter[str] = Counter()
        for cats in self.counts.values():
            totals.update(cats)
        return dict(sorted(totals.items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "n_rows": self.n_rows,
            "n_eligible": self.n_eligible,
            "n_dropped": self.n_dropped,
            "n_requested": self.n_requested,
            "n_sampled": self.n_sampled,
            "seed": self.seed,
            "thresholds": list(self.thresholds),
            "max_input_tokens": self.max_input_tokens,
            "stratified": self.stratified,
            "counts": self.counts,
            "by_bucket": self.by_bucket,
            "by_category": self.by_category,
            "eligible_by_bucket": self.eligible_by_bucket,
            "tokens_by_bucket": self.tokens_by_bucket,
            "scrubbed": None if self.scrubbed is None else self.scrubbed.to_dict(),
        }

    def table(self) -> str:
        """A plain-text table of sampled rows per category (rows) × bucket (columns)."""
        short_max, medium_max = self.thresholds
        heads = [f"short ≤{short_max}", f"medium ≤{medium_max}", f"long >{medium_max}", "total"]
        cats = list(self.by_category)
        width = max([len("category"), len("total"), *map(len, cats)])
        lines = ["category".ljust(width) + "".join(h.rjust(14) for h in heads)]
        for cat in [*cats, "total"]:
            if cat == "total":
                cells = [self.by_bucket[b] for b in BUCKETS]
            else:
                cells = [self.counts.get(b, {}).get(cat, 0) for b in BUCKETS]
            lines.append(cat.ljust(width) + "".join(str(c).rjust(14) for c in [*cells, sum(cells)]))
        return "\n".join(lines)


@dataclass(frozen=True)
class PromptSample:
    """The sampled prompts (ordered by row id), the dropped rows and a summary."""

    items: list[PromptItem]
    dropped: list[DroppedPrompt]
    summary: SampleSummary
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.items)

    @cached_property
    def prompts_hash(self) -> str:
        """SHA-256 (hex) of the input token ids, in order: exactly what the engine is sent.

        Equal hashes mean equal engine inputs, so it keys the trajectory cache. Computed like
        ``draftfit.trajectories.prompts_hash`` over ``[item.input_ids for item in items]``.
        """
        digest = hashlib.sha256(f"prompts:{len(self.items)}".encode())
        for item in self.items:
            ids = np.asarray(item.input_ids, dtype="<i8")
            digest.update(int(ids.shape[0]).to_bytes(8, "little"))
            digest.update(ids.tobytes())
        return digest.hexdigest()

    def to_dataset(self) -> datasets.Dataset:
        """The sample as a ``datasets.Dataset`` (one row per item) for saving with stage outputs."""
        import datasets

        return datasets.Dataset.from_dict(
            {
                "id": [it.id for it in self.items],
                "category": [it.category for it in self.items],
                "bucket": [it.bucket for it in self.items],
                "n_input_tokens": [it.n_input_tokens for it in self.items],
                "input_ids": [list(it.input_ids) for it in self.items],
                "text": [it.text for it in self.items],
                "kind": [it.kind for it in self.items],
                "templated": [it.templated for it in self.items],
            },
            features=datasets.Features(
                {
                    "id": datasets.Value("int64"),
                    "category": datasets.Value("string"),
                    "bucket": datasets.Value("string"),
                    "n_input_tokens": datasets.Value("int64"),
                    "input_ids": datasets.List(datasets.Value("int32")),
                    "text": datasets.Value("string"),
                    "kind": datasets.Value("string"),
                    "templated": datasets.Value("bool"),
                }
            ),
        )


def bucket_of(n_tokens: np.ndarray | Sequence[int], thresholds: tuple[int, int]) -> np.ndarray:
    """Bucket index (0 short, 1 medium, 2 long) for each input length."""
    short_max, medium_max = thresholds
    lengths = np.asarray(n_tokens)
    return (lengths > short_max).astype(np.int64) + (lengths > medium_max).astype(np.int64)


def sample_prompts(
    dataset: datasets.Dataset,
    tokenizer: PromptTokenizer,
    *,
    n: int,
    seed: int,
    thresholds: tuple[int, int] = DEFAULT_THRESHOLDS,
    max_input_tokens: int,
    scrub: bool = False,
    template: TemplateMode = "auto",
    show_prompts: bool = False,
) -> PromptSample:
    """Draw ``n`` prompts stratified by input-length bucket; see the module docstring.

    ``tokenizer`` is the target's (:class:`draftfit.chat_template.ChatTokenizer`). Rows over
    ``max_input_tokens`` are dropped and listed in ``PromptSample.dropped``. Warnings name
    dropped rows by row id and :func:`prompt_digest`; ``show_prompts=True`` adds the start of
    each row's text (for a person debugging their own data).
    """
    src = source_of(dataset)
    _check_args(n=n, seed=seed, thresholds=thresholds, max_input_tokens=max_input_tokens,
                template=template)
    for column in ("row", "prompt", "messages", "category"):
        if column not in dataset.column_names:
            raise DraftfitError(f"the dataset has no '{column}' column",
                                fix="Load prompts with draftfit.prompts.load_prompts", where=src)
    if len(dataset) == 0:
        raise DraftfitError("the prompts dataset has no rows", fix="Point at a file with prompts",
                            where=src)

    rows = [int(r) for r in dataset["row"]]
    categories = [str(c) for c in dataset["category"]]
    prompts = dataset["prompt"]
    chats = dataset["messages"]
    chat_rows = [r for r, m in zip(rows, chats, strict=True) if m is not None]
    if chat_rows and not tokenizer.has_chat_template:
        raise DraftfitError(
            f"{len(chat_rows)} chat prompt(s) ({_list_rows(chat_rows, limit=3)}) need a chat "
            "template and the target's tokenizer has none",
            fix="Use plain `prompt` rows for a base model, or add the model's chat_template.jinja",
            where=src,
        )
    if template == "always" and not tokenizer.has_chat_template:
        raise DraftfitError("template='always' but the target's tokenizer has no chat template",
                            fix="Use template='never' or 'auto'", where=src)

    notes: list[str] = []

    def note(message: str) -> None:
        notes.append(f"{src}: {message}")
        log.info("%s: %s", src, message)
        _warn(src, message)

    def row_text(i: int) -> str:
        chat = chats[i]
        if chat is not None:
            return "\n".join(str(m["content"]) for m in chat)
        return prompts[i] or ""

    def labels(indices: Sequence[int]) -> str:
        return _row_labels([rows[i] for i in indices], [row_text(i) for i in indices], show_prompts)

    # 1-2. render every row to the text the engine receives (scrubbing the user's text first)
    texts: list[str | None] = [None] * len(rows)
    add_special = [False] * len(rows)
    kinds = ["prompt"] * len(rows)
    templated = [False] * len(rows)
    chats_sent: list[list[dict[str, str]] | None] = [None] * len(rows)
    scrub_counts = [ScrubCounts()] * len(rows)
    dropped: list[DroppedPrompt] = []
    refused: list[int] = []
    for i, (row, category, text, chat) in enumerate(zip(rows, categories, prompts, chats, strict=True)):
        if chat is not None:
            kinds[i], apply = "messages", True
            messages = [{"role": m["role"], "content": m["content"]} for m in chat]
            if scrub:
                messages, scrub_counts[i] = scrub_messages(messages)
        elif text is not None:
            if scrub:
                text, scrub_counts[i] = scrub_text(text)
            if template == "auto":
                apply = tokenizer.has_chat_template and not tokenizer.looks_templated(text)
            else:
                apply = template == "always"
            messages = [{"role": "user", "content": text}]
        else:
            dropped.append(DroppedPrompt(id=row, category=category, reason="no prompt and no messages"))
            refused.append(i)
            continue
        try:
            texts[i] = tokenizer.apply_chat_template(messages, add_generation_prompt=True) if apply else text
        except DraftfitError as exc:
            reason = exc.message if show_prompts else _redact(exc.message, [m["content"] for m in messages])
            dropped.append(DroppedPrompt(id=row, category=category, reason=reason,
                                         digest=prompt_digest(row_text(i))))
            refused.append(i)
            continue
        add_special[i] = not apply
        templated[i] = apply
        chats_sent[i] = messages if apply else None
    if dropped:
        note(f"{len(dropped)} row(s) dropped: empty or refused by the chat template {labels(refused)}")

    # tokenization: batched, split by whether special tokens are added
    ids: list[list[int] | None] = [None] * len(rows)
    for flag in (False, True):
        idx = [i for i, t in enumerate(texts) if t is not None and add_special[i] == flag]
        if idx:
            encoded = _encode_many(tokenizer, [texts[i] for i in idx], flag)  # type: ignore[misc]
            for i, enc in zip(idx, encoded, strict=True):
                ids[i] = enc

    # 3. drop rows over the context limit, loudly
    over = [i for i, enc in enumerate(ids) if enc is not None and len(enc) > max_input_tokens]
    for i in over:
        n_tok = len(ids[i])  # type: ignore[arg-type]
        dropped.append(DroppedPrompt(
            id=rows[i], category=categories[i], n_input_tokens=n_tok,
            reason=f"over context: {n_tok} input tokens > max_input_tokens {max_input_tokens}",
            digest=prompt_digest(row_text(i)),
        ))
    if over:
        note(f"{len(over)} row(s) longer than max_input_tokens={max_input_tokens} dropped, not "
             f"truncated {labels(over)}")

    over_set = set(over)
    eligible = np.array([i for i, enc in enumerate(ids) if enc is not None and i not in over_set],
                        dtype=np.int64)
    if eligible.size == 0:
        raise DraftfitError(
            f"no prompt fits: all {len(rows)} rows are over max_input_tokens={max_input_tokens} "
            "or were refused by the chat template",
            fix="Raise max_input_tokens (max_model_len − max_tokens) or use shorter prompts",
            where=src,
        )

    lengths = np.array([len(ids[i]) for i in eligible], dtype=np.int64)  # type: ignore[arg-type]
    buckets = bucket_of(lengths, thresholds)

    # 4-5. stratified, seeded draw
    if n >= eligible.size:
        if n > eligible.size:
            note(f"asked for n={n} prompts but only {eligible.size} are eligible "
                 f"({len(rows)} rows, {len(dropped)} dropped): taking all {eligible.size}")
        chosen, stratified = np.arange(eligible.size), True
    else:
        chosen, stratified = _stratified_choice(buckets, n, seed)
        if not stratified:
            populated = {BUCKETS[b]: int(c) for b, c in zip(*np.unique(buckets, return_counts=True), strict=True)}
            note(f"n={n} of {eligible.size} rows cannot give every length bucket {populated} a row "
                 "and leave one out: drew a plain seeded sample")
    chosen = np.sort(chosen)

    items = []
    for j in chosen:
        i = int(eligible[j])
        items.append(PromptItem(
            id=rows[i], category=categories[i], bucket=BUCKETS[int(buckets[j])],
            n_input_tokens=int(lengths[j]), input_ids=ids[i],  # type: ignore[arg-type]
            text=texts[i], kind=kinds[i], templated=templated[i],  # type: ignore[arg-type]
            messages=chats_sent[i],
        ))
    dropped.sort(key=lambda d: d.id)

    counts: dict[str, dict[str, int]] = {b: {} for b in BUCKETS}
    for item in items:
        counts[item.bucket][item.category] = counts[item.bucket].get(item.category, 0) + 1
    counts = {b: dict(sorted(c.items())) for b, c in counts.items()}
    tokens_by_bucket = {}
    for b, name in enumerate(BUCKETS):
        sel = lengths[chosen][buckets[chosen] == b]
        if sel.size:
            tokens_by_bucket[name] = {"min": int(sel.min()), "median": float(np.median(sel)),
                                      "max": int(sel.max())}
    scrubbed = None
    if scrub:
        scrubbed = ScrubCounts()
        for j in chosen:
            scrubbed = scrubbed + scrub_counts[int(eligible[j])]

    summary = SampleSummary(
        source=src,
        n_rows=len(rows),
        n_eligible=int(eligible.size),
        n_dropped=len(dropped),
        n_requested=n,
        n_sampled=len(items),
        seed=seed,
        thresholds=(int(thresholds[0]), int(thresholds[1])),
        max_input_tokens=max_input_tokens,
        stratified=stratified,
        counts=counts,
        eligible_by_bucket={name: int((buckets == b).sum()) for b, name in enumerate(BUCKETS)},
        tokens_by_bucket=tokens_by_bucket,
        scrubbed=scrubbed,
    )
    log.info("sampled %d of %d eligible prompts from %s (seed %d)", len(items), eligible.size, src, seed)
    return PromptSample(items=items, dropped=dropped, summary=summary, warnings=notes)


def _stratified_choice(buckets: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, bool]:
    """Indices of ``n`` rows drawn with StratifiedShuffleSplit over the bucket labels.

    Returns (indices, stratified?). Requires ``n < len(buckets)``.
    """
    from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit

    labels = buckets.copy()
    values, counts = np.unique(labels, return_counts=True)
    if (counts < 2).any():  # scikit-learn needs two rows per stratum: fold singletons into the largest
        largest = values[np.argmax(counts)]
        for value in values[counts < 2]:
            labels[labels == value] = largest
    n_strata = np.unique(labels).size
    n_rest = labels.size - n
    placeholder = np.zeros((labels.size, 1))
    if n >= n_strata and n_rest >= n_strata:
        splitter = StratifiedShuffleSplit(n_splits=1, train_size=n, test_size=n_rest,
                                          random_state=seed)
        chosen, _ = next(splitter.split(placeholder, labels))
        return chosen, True
    # Too few rows to take (or to leave out) for one per stratum: a plain seeded draw.
    splitter = ShuffleSplit(n_splits=1, train_size=n, test_size=n_rest, random_state=seed)
    chosen, _ = next(splitter.split(placeholder))
    return chosen, False


def _encode_many(tokenizer: PromptTokenizer, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    batch = getattr(tokenizer, "encode_batch", None)
    if callable(batch):
        return [list(x) for x in batch(texts, add_special_tokens=add_special_tokens)]
    return [list(tokenizer.encode(t, add_special_tokens=add_special_tokens)) for t in texts]


def _check_args(*, n: int, seed: int, thresholds: tuple[int, int], max_input_tokens: int,
                template: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DraftfitError(f"n must be a whole number ≥ 1, got {n!r}", fix="Pass --n 500, for example")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise DraftfitError(f"seed must be a whole number ≥ 0, got {seed!r}", fix="Pass --seed 0, for example")
    try:
        short_max, medium_max = (int(t) for t in thresholds)
    except (TypeError, ValueError):
        raise DraftfitError(f"thresholds must be two token counts, got {thresholds!r}",
                            fix="Pass thresholds=(256, 1024), for example") from None
    if not 0 < short_max < medium_max:
        raise DraftfitError(f"thresholds must satisfy 0 < short_max < medium_max, got {thresholds!r}",
                            fix="Pass thresholds=(256, 1024), for example")
    if not isinstance(max_input_tokens, int) or isinstance(max_input_tokens, bool) or max_input_tokens < 1:
        raise DraftfitError(f"max_input_tokens must be a whole number ≥ 1, got {max_input_tokens!r}",
                            fix="Pass the target's max_model_len minus max_tokens")
    if template not in ("auto", "always", "never"):
        raise DraftfitError(f"template must be 'auto', 'always' or 'never', got {template!r}",
                            fix="Use template='auto'")


def _list_rows(row_ids: Sequence[int | str], limit: int = 10) -> str:
    shown = ", ".join(str(r) for r in row_ids[:limit])
    more = f" and {len(row_ids) - limit} more" if len(row_ids) > limit else ""
    return f"row{'s' if len(row_ids) != 1 else ''} {shown}{more}"


def _row_labels(row_ids: Sequence[int], texts: Sequence[str], show: bool, limit: int = 10) -> str:
    """``(rows 2, 3) [sha256 1a2b3c4d5e, 5f6a7b8c9d]``: row ids and digests, never the text —
    unless ``show``: then each digest is followed by the start of the row's text, escaped."""
    parts = []
    for text in texts[:limit]:
        part = f"sha256 {prompt_digest(text)}"
        if show:
            excerpt = text[:EXCERPT_CHARS] + ("…" if len(text) > EXCERPT_CHARS else "")
            part += f" {excerpt!r}"
        parts.append(part)
    return f"({_list_rows(row_ids, limit)}) [{', '.join(parts)}]"


def _redact(message: str, texts: Sequence[str], window: int = 12) -> str:
    """``message`` unless it quotes any ``window`` characters of ``texts`` (a chat template may put
    the conversation into its error); then a notice that the detail was withheld."""
    probe = message[:500]
    for start in range(max(len(probe) - window + 1, 0)):
        piece = probe[start:start + window]
        if any(piece in text for text in texts):
            return "the chat template refused the conversation (its message quotes the prompt; rerun with --show-prompts to see it)"
    return message


def _warn(src: str, message: str) -> None:
    # stacklevel: _warn <- note() <- sample_prompts <- the caller
    warnings.warn(f"{src}: {message}", PromptWarning, stacklevel=4)


def study_prompts(study: StudySettings, target_meta: Path, *, show_prompts: bool = False):
    """Sample the study's prompts as `rank` does (same loader, template, seed and limits)."""
    import warnings

    from draftfit.chat_template import ChatTokenizer
    from draftfit.prompts.loading import DEMO_PROMPTS, PromptWarning, load_prompts
    from draftfit.prompts.sampling import sample_prompts

    source = study.prompts or str(DEMO_PROMPTS)
    dataset = load_prompts(source, prompt_column=study.prompt_column, messages_column=study.messages_column,
                           category_column=study.category_column)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PromptWarning)
        sample = sample_prompts(
            dataset, ChatTokenizer.from_dir(target_meta), n=study.sample_size, seed=study.seed,
            thresholds=tuple(study.length_thresholds), max_input_tokens=study.max_model_len - study.max_tokens - 1,
            scrub=study.scrub, show_prompts=show_prompts,
        )
    if not sample.items:
        raise DraftfitError(
            f"no prompt fits in max_model_len {study.max_model_len} with max_tokens {study.max_tokens}",
            where=source, fix="Raise --max-model-len or lower --max-tokens",
        )
    return sample

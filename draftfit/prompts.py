"""Step 2 of the pipeline: load service prompts and draw a seeded, length-stratified sample.

Loading (:func:`load_prompts`)
    JSONL (``.jsonl``/``.ndjson``; ``.json`` may be JSONL or one JSON array), CSV, Parquet, or a
    directory written by ``datasets.Dataset.save_to_disk``. Each row holds either a plain text
    prompt (column ``prompt``) or a chat conversation (column ``messages``: a list of
    ``{"role", "content"}``; in CSV a JSON string), plus an optional ``category``. Column names are
    configurable. When a row has both, ``messages`` is used. Content given as a list of OpenAI
    text parts is joined with newlines, as vLLM does. Files are parsed here rather than through the
    ``datasets`` builders so that every error names the file and the line or row, and nothing is
    written to the ``datasets`` cache. The result is a ``datasets.Dataset`` with the columns
    ``row`` (the 0-based index of the record in the source: the prompt's stable id), ``prompt``,
    ``messages`` and ``category``.

Sampling (:func:`sample_prompts`)
    1. Every row becomes the exact input the target sees. Chat rows go through the target's chat
       template (with the generation prompt). Plain ``prompt`` rows are treated as the user
       message of a one-turn chat — the usual meaning of a service log's prompt column — when the
       tokenizer has a chat template and the text is not already templated (``template="auto"``);
       ``"always"``/``"never"`` force either way. Text sent without a template is tokenized the way
       vLLM's completion API does it (``add_special_tokens=True``); rendered chats without added
       special tokens, as vLLM's chat API does.
    2. Optional scrub of e-mails, phone numbers and card numbers (:mod:`draftfit.scrub`) in the
       message text before templating.
    3. Rows longer than ``max_input_tokens`` are dropped and reported (never truncated). Pass the
       target's ``max_model_len`` minus the study's ``max_tokens`` so every response fits.
    4. Buckets by input tokens: short ≤ ``short_max`` < medium ≤ ``medium_max`` < long. The
       defaults (256, 1024) suit chat traffic: a chat turn with a system prompt is usually under
       256 tokens, pasted code or an e-mail thread lands in 257-1024, and documents to summarize or
       retrieved context run past 1024.
    5. ``n`` rows drawn with scikit-learn's ``StratifiedShuffleSplit`` on the bucket labels, seeded:
       the sample keeps the buckets' proportions (largest-remainder allocation). A bucket with a
       single row is merged into the largest bucket for the draw (scikit-learn needs two per
       stratum); when ``n`` is smaller than the number of populated buckets the draw is a plain
       seeded shuffle. If ``n`` exceeds the eligible rows, a :class:`PromptWarning` is issued and
       all of them are taken — a short log is still worth measuring.

Row ids and a short hash (:func:`prompt_digest`), never prompt text, appear in errors, warnings
and logs; ``sample_prompts(show_prompts=True)`` adds the start of the text of dropped rows. JSONL
and CSV files are read a line at a time; one line may hold at most :data:`MAX_RECORD_BYTES`.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import logging
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from draftfit.errors import DraftfitError
from draftfit.scrub import ScrubCounts, scrub_messages, scrub_text

if TYPE_CHECKING:
    import datasets

    from draftfit.chat_template import PromptTokenizer

log = logging.getLogger(__name__)

BUCKETS = ("short", "medium", "long")
DEFAULT_THRESHOLDS = (256, 1024)
UNCATEGORIZED = "uncategorized"
JSON_SUFFIXES = {".jsonl", ".ndjson", ".json"}
CSV_SUFFIXES = {".csv"}
PARQUET_SUFFIXES = {".parquet", ".pq"}
# One JSONL line or CSV line may hold at most this many bytes: 16 MiB is millions of tokens, more
# than any context window, and bounds what is held in memory while a file is read line by line.
MAX_RECORD_BYTES = 16 * 2**20
MAX_JSON_ARRAY_BYTES = 256 * 2**20  # a .json array is parsed whole; bigger files should be JSONL
MAX_LISTED_PROBLEMS = 5
# The shipped demo set: ~320 service-style prompts (chat, code, summarize, extract, rewrite; about
# 28% Korean) that the demo candidates run on.
DEMO_PROMPTS = Path(__file__).parent / "data" / "demo_prompts.jsonl"

TemplateMode = Literal["auto", "always", "never"]


class PromptWarning(UserWarning):
    """Something about the prompts the user should know, but not a reason to stop."""


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------


@dataclass
class _Record:
    """One source record before validation: its row id, where it is, and its fields."""

    row: int
    where: str  # "line 7" / "row 6" for messages
    fields: Mapping[str, Any]


def load_prompts(
    path: str | Path,
    *,
    prompt_column: str = "prompt",
    messages_column: str = "messages",
    category_column: str = "category",
) -> datasets.Dataset:
    """Load service prompts from JSONL, CSV, Parquet or a saved dataset directory.

    Returns a ``datasets.Dataset`` with columns ``row``, ``prompt``, ``messages``, ``category``.
    Raises :class:`DraftfitError` naming the file and the line/row/column for bad input.
    """
    path = Path(path)
    src = str(path)
    if not path.exists():
        raise DraftfitError("no such file or directory", fix="Check the prompts path", where=src)

    if path.is_dir():
        columns, records = _read_saved_dataset(path)
    else:
        suffix = path.suffix.lower()
        if suffix in JSON_SUFFIXES:
            columns, records = _read_json(path)
        elif suffix in CSV_SUFFIXES:
            columns, records = _read_csv(path)
        elif suffix in PARQUET_SUFFIXES:
            columns, records = _read_parquet(path)
        else:
            raise DraftfitError(
                f"unknown prompts format '{suffix or '(no extension)'}'",
                fix="Use .jsonl, .json, .csv, .parquet or a directory saved with Dataset.save_to_disk",
                where=src,
            )

    if not records:
        raise DraftfitError("the prompts file has no rows", fix="Point at a file with prompts",
                            where=src)

    has_prompt = prompt_column in columns
    has_messages = messages_column in columns
    if not has_prompt and not has_messages:
        found = ", ".join(repr(str(c)) for c in columns[:20]) or "none"
        if len(columns) > 20:
            found += f" and {len(columns) - 20} more"
        raise DraftfitError(
            f"no '{prompt_column}' or '{messages_column}' column (columns: {found})",
            fix="Name the text column with --prompt-column or the chat column with --messages-column",
            where=src,
        )
    has_category = category_column in columns
    if not has_category and category_column != "category":
        warnings.warn(
            f"{src}: no '{category_column}' column; every prompt is '{UNCATEGORIZED}'",
            PromptWarning,
            stacklevel=2,
        )

    rows: list[int] = []
    prompts: list[str | None] = []
    messages: list[list[dict[str, str]] | None] = []
    categories: list[str] = []
    problems: list[str] = []
    for rec in records:
        try:
            msgs = (
                _normalize_messages(rec.fields.get(messages_column), messages_column)
                if has_messages
                else None
            )
            text = None
            if msgs is None and has_prompt:
                text = _normalize_prompt(rec.fields.get(prompt_column), prompt_column)
            if msgs is None and text is None:
                present = [c for c in (prompt_column, messages_column) if c in columns]
                raise ValueError(f"no value in {' or '.join(repr(c) for c in present)}")
            category = (
                _normalize_category(rec.fields.get(category_column), category_column)
                if has_category
                else UNCATEGORIZED
            )
        except ValueError as exc:
            problems.append(f"{rec.where}: {exc}")
            continue
        rows.append(rec.row)
        prompts.append(text)
        messages.append(msgs)
        categories.append(category)

    if problems:
        listed = "; ".join(problems[:MAX_LISTED_PROBLEMS])
        more = f" (and {len(problems) - MAX_LISTED_PROBLEMS} more)" if len(problems) > MAX_LISTED_PROBLEMS else ""
        raise DraftfitError(
            f"{len(problems)} bad row{'s' if len(problems) != 1 else ''}: {listed}{more}",
            fix="Fix or remove those rows",
            where=src,
        )

    import datasets

    features = datasets.Features(
        {
            "row": datasets.Value("int64"),
            "prompt": datasets.Value("string"),
            "messages": datasets.List(
                {"role": datasets.Value("string"), "content": datasets.Value("string")}
            ),
            "category": datasets.Value("string"),
        }
    )
    data = {"row": rows, "prompt": prompts, "messages": messages, "category": categories}
    info = datasets.DatasetInfo(description=src, features=features)
    dataset = datasets.Dataset.from_dict(data, features=features, info=info)
    log.info("loaded %d prompts from %s", len(dataset), src)
    return dataset


def _check_not_binary(path: Path, kind: str) -> None:
    """Refuse a binary (or UTF-16) file by its first bytes, before parsing it as text."""
    with path.open("rb") as handle:
        head = handle.read(8192)
    if b"\0" in head:
        raise DraftfitError(
            f"is a binary file (NUL bytes), not {kind} text",
            fix="Pass prompts as UTF-8 JSONL, CSV or Parquet",
            where=str(path),
        )


def _physical_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line with its ending) of a text file, one line in memory at a time.

    A line longer than :data:`MAX_RECORD_BYTES` is refused as soon as the limit is reached, so
    a file that is one huge line is never read whole.
    """
    with path.open("rb") as handle:
        for lineno in itertools.count(1):
            line = handle.readline(MAX_RECORD_BYTES + 2)
            if not line:
                return
            if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            if len(line.rstrip(b"\r\n")) > MAX_RECORD_BYTES:
                raise DraftfitError(
                    f"line {lineno}: longer than {MAX_RECORD_BYTES // 2**20} MiB, the limit per prompt record",
                    fix=f"Each JSONL line or CSV row may hold at most {MAX_RECORD_BYTES // 2**20} MiB "
                    "(more than any model's context); remove or shorten that line",
                    where=str(path),
                )
            yield lineno, line


def _first_byte(path: Path) -> bytes:
    """The first non-whitespace byte of a file (after a UTF-8 byte order mark)."""
    with path.open("rb") as handle:
        head = handle.read(8192)
        if head.startswith(b"\xef\xbb\xbf"):
            head = head[3:]
        while head and not head.strip():
            head = handle.read(8192)
    return head.lstrip()[:1]


def _read_json(path: Path) -> tuple[list[str], list[_Record]]:
    _check_not_binary(path, "JSON")
    if _first_byte(path) == b"[":
        size = path.stat().st_size
        if size > MAX_JSON_ARRAY_BYTES:
            raise DraftfitError(
                f"a JSON array of {size / 2**20:.0f} MiB (the limit for one JSON document is "
                f"{MAX_JSON_ARRAY_BYTES // 2**20} MiB)",
                fix="Write one JSON object per line (JSONL); lines are read one at a time",
                where=str(path),
            )
        raw = path.read_bytes()
        return _read_json_array(path, raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw)
    records: list[_Record] = []
    columns: dict[str, None] = {}
    problems: list[str] = []
    for lineno, line in _physical_lines(path):
        if not line.strip():
            continue
        row = len(records) + len(problems)
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(f"line {lineno}: not UTF-8 (byte {exc.start + 1})")
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append(f"line {lineno}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        except RecursionError:
            problems.append(f"line {lineno}: not valid JSON (nested too deeply)")
            continue
        if not isinstance(obj, dict):
            problems.append(f"line {lineno}: expected a JSON object, got {_json_type(obj)}")
            continue
        columns.update(dict.fromkeys(obj))
        records.append(_Record(row=row, where=f"line {lineno} (row {row})", fields=obj))
    _raise_problems(path, problems, "lines")
    return list(columns), records


def _read_json_array(path: Path, raw: bytes) -> tuple[list[str], list[_Record]]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DraftfitError(f"line {line}: not UTF-8", fix="Re-encode the file as UTF-8",
                            where=str(path)) from exc
    except json.JSONDecodeError as exc:
        raise DraftfitError(f"not valid JSON at line {exc.lineno} ({exc.msg})",
                            fix="Fix the file or write one JSON object per line (JSONL)",
                            where=str(path)) from exc
    except RecursionError as exc:
        raise DraftfitError("not valid JSON (nested too deeply)",
                            fix="Write one JSON object per line (JSONL)", where=str(path)) from exc
    if not isinstance(data, list):
        raise DraftfitError("expected a list of objects or JSON lines", fix="Write JSONL",
                            where=str(path))
    columns: dict[str, None] = {}
    records: list[_Record] = []
    problems: list[str] = []
    for row, obj in enumerate(data):
        if not isinstance(obj, dict):
            problems.append(f"row {row}: expected a JSON object, got {_json_type(obj)}")
            continue
        columns.update(dict.fromkeys(obj))
        records.append(_Record(row=row, where=f"row {row}", fields=obj))
    _raise_problems(path, problems, "rows")
    return list(columns), records


def _decoded_lines(path: Path) -> Iterator[str]:
    for lineno, line in _physical_lines(path):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DraftfitError(f"line {lineno}: not UTF-8 (byte {exc.start + 1})",
                                fix="Re-encode the file as UTF-8", where=str(path)) from exc


def _read_csv(path: Path) -> tuple[list[str], list[_Record]]:
    _check_not_binary(path, "CSV")
    reader = csv.DictReader(_decoded_lines(path))
    records: list[_Record] = []
    limit = csv.field_size_limit()
    csv.field_size_limit(MAX_RECORD_BYTES)  # the default (128 KiB) refuses long prompts
    try:
        columns = list(reader.fieldnames or [])
        start = reader.line_num + 1
        for row, fields in enumerate(reader):
            where = f"line {start} (row {row})" if start == reader.line_num else f"lines {start}-{reader.line_num} (row {row})"
            if None in fields:  # more cells than the header names
                fields = {k: v for k, v in fields.items() if k is not None}
            records.append(_Record(row=row, where=where, fields=fields))
            start = reader.line_num + 1
    except csv.Error as exc:
        raise DraftfitError(f"line {reader.line_num}: malformed CSV ({exc})",
                            fix="Fix the quoting on that line", where=str(path)) from exc
    finally:
        csv.field_size_limit(limit)
    return columns, records


def _read_parquet(path: Path) -> tuple[list[str], list[_Record]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DraftfitError(f"not a readable Parquet file ({type(exc).__name__})",
                            fix="Check the file, or convert it to JSONL", where=str(path)) from exc
    return _records_from_table(table.column_names, table.to_pylist())


def _read_saved_dataset(path: Path) -> tuple[list[str], list[_Record]]:
    import datasets

    if not ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        raise DraftfitError(
            "not a saved dataset directory (no state.json or dataset_dict.json)",
            fix="Save it with Dataset.save_to_disk, or pass a .jsonl/.csv/.parquet file",
            where=str(path),
        )
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001 - datasets raises several types for a bad directory
        raise DraftfitError(f"cannot load the saved dataset ({type(exc).__name__})",
                            fix="Save it again with Dataset.save_to_disk", where=str(path)) from exc
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if len(splits) != 1:
            raise DraftfitError(
                f"a dataset with several splits ({', '.join(splits)})",
                fix=f"Pass one split's directory, e.g. {path / splits[0]}",
                where=str(path),
            )
        loaded = loaded[splits[0]]
    return _records_from_table(list(loaded.column_names), loaded.to_list())


def _records_from_table(columns: list[str], rows: list[dict[str, Any]]) -> tuple[list[str], list[_Record]]:
    return columns, [_Record(row=i, where=f"row {i}", fields=r) for i, r in enumerate(rows)]


def _raise_problems(path: Path, problems: list[str], unit: str) -> None:
    if not problems:
        return
    listed = "; ".join(problems[:MAX_LISTED_PROBLEMS])
    more = f" (and {len(problems) - MAX_LISTED_PROBLEMS} more)" if len(problems) > MAX_LISTED_PROBLEMS else ""
    noun = unit if len(problems) != 1 else unit.rstrip("s")
    raise DraftfitError(f"{len(problems)} unreadable {noun}: {listed}{more}",
                        fix="Fix or remove those lines", where=str(path))


def _json_type(obj: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number",
            bool: "a boolean", type(None): "null"}.get(type(obj), type(obj).__name__)


def _normalize_prompt(value: Any, column: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"column '{column}': expected text, got {_json_type(value)}")
    if not value.strip():
        return None
    return _utf8(value, column)


def _utf8(value: str, column: str, what: str = "text") -> str:
    """Text that can be stored and tokenized: JSON may escape lone surrogates ("\\ud800")."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"column '{column}': {what} holds an unpaired surrogate (character {exc.start + 1}), "
                         "not valid Unicode") from None
    return value


def _normalize_category(value: Any, column: str) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        return UNCATEGORIZED
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"column '{column}': expected text, got {_json_type(value)}")
    return _utf8(str(value).strip(), column)


def _normalize_messages(value: Any, column: str) -> list[dict[str, str]] | None:
    """Validate a chat: a non-empty list of {role, content}; return copies with text content."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):  # CSV cells and some Parquet files hold the chat as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"column '{column}': expected a list of messages or its JSON text, got text that "
                f"is not valid JSON ({exc.msg})"
            ) from None
    if not isinstance(value, list):
        raise ValueError(f"column '{column}': expected a list of messages, got {_json_type(value)}")
    if not value:
        raise ValueError(f"column '{column}': empty list of messages")
    out: list[dict[str, str]] = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise ValueError(f"column '{column}': message {i} is {_json_type(message)}, not an object")
        role = message.get("role")
        if not isinstance(role, str) or not role.strip():
            raise ValueError(f"column '{column}': message {i} has no 'role'")
        _utf8(role, column, f"message {i}'s role")
        content = message.get("content")
        if isinstance(content, list):
            content = _join_text_parts(content, column, i)
        if not isinstance(content, str):
            what = "no 'content'" if content is None else f"'content' that is {_json_type(content)}"
            raise ValueError(f"column '{column}': message {i} has {what}")
        out.append({"role": role, "content": _utf8(content, column, f"message {i}'s content")})
    return out


def _join_text_parts(parts: list[Any], column: str, index: int) -> str:
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, Mapping) else _json_type(part)
            raise ValueError(
                f"column '{column}': message {index} has a non-text content part ({kind}); "
                "only text prompts are supported"
            )
    return "\n".join(texts)


def source_of(dataset: datasets.Dataset) -> str:
    """The path a dataset from :func:`load_prompts` was read from (for messages)."""
    description = getattr(dataset.info, "description", None)
    return description or "prompts"


# ---------------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------------


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


EXCERPT_CHARS = 60


def prompt_digest(text: str) -> str:
    """A short SHA-256 of a prompt's text: names a row in logs without showing it.

    ``sha256(text.encode()).hexdigest()[:10]`` — hash a row of the source the same way to find it.
    """
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]


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

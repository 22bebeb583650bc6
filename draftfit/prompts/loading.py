"""Step 2a: load service prompts from JSONL, CSV, Parquet or a saved dataset (see
:mod:`draftfit.prompts`)."""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import logging
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftfit.errors import DraftfitError

if TYPE_CHECKING:
    import datasets


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
DEMO_PROMPTS = Path(__file__).parent.parent / "data" / "demo_prompts.jsonl"



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
            fix="Name the text column with --prompt-column or the chat column with --messages-column "
                "(study keys prompt_column / messages_column)",
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


EXCERPT_CHARS = 60


def prompt_digest(text: str) -> str:
    """A short SHA-256 of a prompt's text: names a row in logs without showing it.

    ``sha256(text.encode()).hexdigest()[:10]`` — hash a row of the source the same way to find it.
    """
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]

"""Probe texts for the tokenizer check: a built-in multilingual corpus plus a user's own file.

The built-in corpus (``draftfit/data/probe_corpus.jsonl``) covers the text shapes where tokenizers
part ways: English, Korean, Chinese, Japanese and other scripts, code, JSON, emoji (with joiners
and variation selectors), whitespace runs, numbers, URLs, Markdown and math symbols.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from draftfit.errors import DraftfitError

FILE_CATEGORY = "file"
_TEXT_KEYS = ("text", "prompt")


@dataclass(frozen=True)
class ProbeText:
    category: str
    text: str


def builtin_probe_texts() -> list[ProbeText]:
    """The built-in probe corpus, in file order."""
    raw = resources.files("draftfit").joinpath("data/probe_corpus.jsonl").read_text("utf-8")
    return [ProbeText(row["category"], row["text"]) for row in map(json.loads, raw.splitlines()) if row]


def read_probe_file(path: str | Path) -> list[ProbeText]:
    """Probe texts from ``path``: JSONL objects with a ``text`` (or ``prompt``) field, else plain lines.

    A file is read as JSONL when it ends in ``.jsonl`` or its first non-empty line starts with
    ``{``; every line must then be an object with a string ``text`` or ``prompt``. Otherwise each
    non-empty line is one text. JSONL objects may carry a ``category``; plain lines get ``file``.
    """
    path = Path(path)
    try:
        raw = path.read_text("utf-8")
    except UnicodeDecodeError as exc:
        raise DraftfitError(
            f"not UTF-8 text ({exc.reason} at byte {exc.start})",
            where=str(path), fix="Save the probe file as UTF-8 text lines or JSONL",
        ) from exc
    except OSError as exc:
        raise DraftfitError(
            f"cannot read the probe file ({exc.strerror})", where=str(path),
            fix="Pass an existing text or JSONL file to --probe-file",
        ) from exc
    lines = raw.splitlines()
    first = next((line for line in lines if line.strip()), "")
    if path.suffix == ".jsonl" or first.lstrip().startswith("{"):
        texts = [_jsonl_row(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]
    else:
        texts = [ProbeText(FILE_CATEGORY, line) for line in lines if line.strip()]
    if not texts:
        raise DraftfitError("the probe file has no texts", where=str(path),
                            fix="Put one text per line, or JSONL objects with a `text` field")
    return texts


def _jsonl_row(path: Path, number: int, line: str) -> ProbeText:
    where = f"{path}:{number}"
    fix = 'Write one JSON object per line, e.g. {"text": "..."}'
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DraftfitError(f"not valid JSON ({exc.msg})", where=where, fix=fix) from exc
    if not isinstance(row, dict):
        raise DraftfitError("expected a JSON object", where=where, fix=fix)
    text = next((row[key] for key in _TEXT_KEYS if key in row), None)
    if not isinstance(text, str):
        raise DraftfitError("no string `text` or `prompt` field", where=where, fix=fix)
    category = row.get("category")
    return ProbeText(category if isinstance(category, str) and category else FILE_CATEGORY, text)

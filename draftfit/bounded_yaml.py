"""YAML read with limits: a file a user hands draftfit is at most MAX_BYTES long and expands to at
most MAX_NODES values once its aliases are followed, so a "billion laughs" document (aliases of
aliases) is refused in milliseconds instead of filling the memory. Only YAML's safe types load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from draftfit.errors import DraftfitError

MAX_BYTES = 1 * 2**20  # candidate, study and GPU catalog files are a few hundred bytes
MAX_NODES = 100_000  # values after aliases are expanded


def _expanded_size(root: yaml.Node, where: str) -> int:
    """Values in the document once every alias is expanded (aliases share nodes: memoized per node)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise DraftfitError("an alias refers to the value that holds it (a recursive YAML structure)", where=where,
                                fix="Write the values out instead of a self-referencing alias")
        open_.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        open_.discard(key)
        if total > MAX_NODES:
            raise DraftfitError(f"expands to more than {MAX_NODES:,} values once its aliases are followed", where=where,
                                fix="Write the settings out without nested aliases")
        sizes[key] = total
        return total

    return size(root)


def refuse_large(path: Path, what: str, fix: str) -> None:
    """Refuse a file over MAX_BYTES before it is read (``what``: what such a file is and how long it is)."""
    if path.stat().st_size > MAX_BYTES:
        raise DraftfitError(f"is larger than {MAX_BYTES // 2**20} MiB; {what}", where=str(path), fix=fix)


def load(text: str, where: str) -> Any:
    """One YAML document of ``text`` (the file ``where``) with YAML's safe types, within the limits."""
    if len(text.encode("utf-8")) > MAX_BYTES:
        raise DraftfitError(f"is larger than {MAX_BYTES // 2**20} MiB; a draftfit YAML file is a few hundred bytes", where=where,
                            fix="Pass the candidate or settings file itself")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, where)
        return loader.construct_document(node)
    finally:
        loader.dispose()

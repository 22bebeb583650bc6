"""Derived drafts: models made from the target itself, materialized once into the cache.

``first_layers(target, n)`` is the early-exit self-draft: the target's embeddings, its first ``n``
decoder layers, its final norm and its LM head, with ``num_hidden_layers = n`` in the config. It
shares the target's tokenizer and vocabulary, so every engine accepts the pair.

The weights are copied tensor by tensor straight out of the target's safetensors files (header
rewritten, tensor bytes copied as they are): any dtype, no torch needed, and the copy is exact.
The result lives at ``<cache>/derived/<target fingerprint>-first<n>/``, written into a temporary
directory, finished with a manifest of its files' SHA-256 (:mod:`draftfit.cachedir`) and renamed
into place; it is checked once per process before reuse, and a damaged one is derived again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftfit import cachedir
from draftfit.errors import DraftfitError
from draftfit.faults import fault_point
from draftfit.paths import cache_subdir
from draftfit.refs import COMPANION_FILES, ModelRef, fingerprint, model_dir, resolve

# config keys that count decoder layers, by architecture family
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# config keys holding one entry per layer, truncated with the layers
PER_LAYER_KEYS = ("layer_types", "sliding_window_pattern_list", "no_rope_layers")
# a decoder layer's tensors: model.layers.<i>. (Llama, Qwen, Mistral...), transformer.h.<i>. (GPT-2)
LAYER_NAME = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
SOURCE_FILE = "draftfit-source.json"
ALIGN = 8


@dataclass(frozen=True)
class DerivedDraft:
    path: Path
    target_fingerprint: str
    n_layers: int
    target_layers: int
    tensors: int
    bytes: int

    @property
    def ref(self) -> ModelRef:
        return resolve(str(self.path))


def derived_dir(target_fingerprint: str, n_layers: int) -> Path:
    return cache_subdir("derived") / f"{target_fingerprint}-first{int(n_layers)}"


def check_first_layers(ref: ModelRef, n_layers: int) -> int:
    """The target's layer count, once its config.json (read without converting any weights) is
    well formed and ``1 <= n_layers <`` that count; one line with the fix otherwise."""
    from draftfit.compat.files import read_config
    from draftfit.refs import metadata_dir

    meta = ref.path if ref.kind == "dir" else metadata_dir(ref)  # a directory's own config, tokenizer or not
    _, total = _layer_count(read_config(meta / "config.json"), meta)
    if not 1 <= int(n_layers) < total:
        raise DraftfitError(
            f"first-layers draft needs 1 <= N < {total} (the target has {total} layers), got {n_layers}",
            where=ref.spec,
            fix=f"Pick N between 1 and {total - 1}",
        )
    return total


def first_layers(target: ModelRef | str | Path, n_layers: int) -> DerivedDraft:
    """The target's first ``n_layers`` decoder layers as a model of its own (cached)."""
    ref = target if isinstance(target, ModelRef) else resolve(str(target))
    total = check_first_layers(ref, n_layers)  # before any weights are converted or read
    source = model_dir(ref)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    layer_key, _ = _layer_count(config, source)
    n_layers = int(n_layers)
    target_fp = fingerprint(ref)
    final = derived_dir(target_fp, n_layers)
    meta = _whole(final)
    if meta is not None:
        return DerivedDraft(final, target_fp, n_layers, total, int(meta["tensors"]), int(meta["bytes"]))
    shards = _weight_shards(source)
    tmp = cachedir.temp_dir(final)
    try:
        kept, written, weight_map = 0, 0, {}
        for shard in shards:
            count, size, names = _copy_tensors(shard, tmp / shard.name, lambda name: _keep(name, n_layers))
            kept += count
            written += size
            weight_map.update({name: shard.name for name in names})
        if len(shards) > 1 or (source / "model.safetensors.index.json").is_file():
            index = {"metadata": {"total_size": written}, "weight_map": dict(sorted(weight_map.items()))}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        derived = dict(config)
        derived[layer_key] = n_layers
        for key in PER_LAYER_KEYS:
            if isinstance(derived.get(key), list):
                derived[key] = derived[key][:n_layers]
        (tmp / "config.json").write_text(json.dumps(derived, indent=2) + "\n", encoding="utf-8")
        for name in COMPANION_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, tmp / name)
        provenance = {
            "derived": "first_layers",
            "target": ref.to_dict(),
            "target_fingerprint": target_fp,
            "target_dir": str(source),
            "n_layers": n_layers,
            "target_layers": total,
            "tensors": kept,
            "bytes": written,
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
        fault_point("derive")
        cachedir.write_manifest(tmp, {"derived": "first_layers"})  # last: marks the draft whole
        cachedir.publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return DerivedDraft(final, target_fp, n_layers, total, kept, written)


def _whole(final: Path) -> dict[str, Any] | None:
    """The provenance of a whole derived draft (its files match their manifest), else ``None``;
    a damaged one is removed with a warning so that it is derived again."""
    if not final.exists():
        return None
    if cachedir.verified(final, what="derived draft") is None or not (final / SOURCE_FILE).is_file():
        cachedir.discard(final)
        return None
    return json.loads((final / SOURCE_FILE).read_text(encoding="utf-8"))


def _layer_count(config: dict[str, Any], source: Path) -> tuple[str, int]:
    for key in LAYER_COUNT_KEYS:
        if isinstance(config.get(key), int):
            return key, int(config[key])
    raise DraftfitError(
        "config.json names no layer count (num_hidden_layers / n_layer)",
        where=str(source),
        fix="A first-layers draft needs a decoder-only text model; multimodal configs are not supported",
    )


def _keep(name: str, n_layers: int) -> bool:
    match = LAYER_NAME.search(name)
    return match is None or int(match.group(1)) < n_layers


def _weight_shards(source: Path) -> list[Path]:
    index = source / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [source / name for name in sorted(set(weight_map.values()))]
    shards = sorted(source.glob("*.safetensors"))
    if not shards:
        raise DraftfitError(
            "no safetensors weights in the target directory",
            where=str(source),
            fix="Derived drafts need safetensors weights; convert with `model.save_pretrained(dir, safe_serialization=True)`",
        )
    return shards


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's JSON header and the byte offset where tensor data starts."""
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise DraftfitError("not a safetensors file (too short)", where=str(path), fix="Re-download or re-save the weights")
        (size,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(handle.read(size))
        except ValueError as exc:
            raise DraftfitError("not a safetensors file (bad header)", where=str(path), fix="Re-download or re-save the weights") from exc
    return header, 8 + size


def _copy_tensors(src: Path, dst: Path, keep) -> tuple[int, int, list[str]]:
    """Copy the tensors ``keep(name)`` selects from one safetensors file into a new one."""
    header, data_start = read_header(src)
    metadata = header.pop("__metadata__", None)
    names = sorted((n for n in header if keep(n)), key=lambda n: header[n]["data_offsets"][0])
    if not names:  # a shard holding only dropped layers is left out
        return 0, 0, []
    out: dict[str, Any] = {}
    offset = 0
    for name in names:
        begin, end = header[name]["data_offsets"]
        out[name] = {"dtype": header[name]["dtype"], "shape": header[name]["shape"], "data_offsets": [offset, offset + end - begin]}
        offset += end - begin
    if metadata is not None:
        out = {"__metadata__": metadata, **out}
    blob = json.dumps(out, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % ALIGN)
    with open(src, "rb") as reader, open(dst, "wb") as writer:
        writer.write(struct.pack("<Q", len(blob)))
        writer.write(blob)
        for name in names:
            begin, end = header[name]["data_offsets"]
            reader.seek(data_start + begin)
            remaining = end - begin
            while remaining:
                chunk = reader.read(min(remaining, 1 << 24))
                if not chunk:
                    raise DraftfitError("safetensors file is truncated", where=str(src), fix="Re-download or re-save the weights")
                writer.write(chunk)
                remaining -= len(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    return len(names), offset, names

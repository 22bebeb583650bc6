"""Cache entries that prove they are whole, so a crash or a damaged copy is rebuilt, never trusted.

Two kinds of entry live in the draftfit cache:

* **Directories** (trajectories and draft scores as datasets, GGUF conversions, derived drafts):
  written into a temporary sibling (:func:`temp_dir`), finished with a manifest holding the
  SHA-256 of every file (:func:`write_manifest`, written last), and renamed into place
  (:func:`publish`). :func:`verified` re-hashes the files against the manifest before an entry
  is used; a missing manifest, a missing or extra file or a wrong checksum makes it ``None``
  (with a warning) and the caller rebuilds it. Hashing happens once per process per directory:
  the verdict is remembered under the size and mtime of every file, so any later change to a file
  is hashed again.
* **JSON documents** (measured step profiles): ``{"sha256": …, "payload": …}`` where the checksum
  covers the payload's canonical JSON (:func:`write_checked_json`, :func:`read_checked_json`).

Temporary directories are named ``.<entry>.tmp-<pid>-…``; one left behind by a process that was
killed is removed the next time the same entry is built.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftfit.io import atomic_write_json

log = logging.getLogger(__name__)

MANIFEST = "draftfit-manifest.json"
_verified: dict[str, tuple[tuple, dict]] = {}  # path -> (file signature, manifest) of entries checked in this process


class DamagedEntry(ValueError):
    """A cache entry whose files do not match its manifest or checksum."""


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def entry_files(directory: Path) -> list[Path]:
    """Every file of an entry, the manifest excepted, in a stable order."""
    return sorted(p for p in Path(directory).rglob("*") if p.is_file() and p.name != MANIFEST)


def _signature(directory: Path) -> tuple:
    out = []
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file():
            stat = path.stat()
            out.append((str(path.relative_to(directory)), stat.st_size, stat.st_mtime_ns))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# directories


def write_manifest(directory: Path, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Hash every file of ``directory`` into its manifest (write this last: it marks the entry whole)."""
    directory = Path(directory)
    manifest = {
        **(meta or {}),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": {str(p.relative_to(directory)): sha256_file(p) for p in entry_files(directory)},
    }
    atomic_write_json(directory / MANIFEST, manifest)
    _verified[str(directory.resolve())] = (_signature(directory), manifest)
    return manifest


def check_manifest(directory: Path, *, only: Sequence[str] | None = None) -> dict[str, Any]:
    """The manifest of a whole entry; :class:`DamagedEntry` (saying what is wrong) otherwise.

    ``only``: check just these of its files (those the manifest lists), e.g. the small metadata
    files of a model directory when its weights are not needed.
    """
    directory = Path(directory)
    key = str(directory.resolve())
    signature = _signature(directory)
    known = _verified.get(key)
    if known is not None and known[0] == signature:
        return known[1]
    path = directory / MANIFEST
    if not path.is_file():
        raise DamagedEntry("it has no manifest (an interrupted write, or an entry of an older draftfit)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DamagedEntry(f"its manifest is unreadable ({exc})") from exc
    if only is not None:
        files = {name: digest for name, digest in files.items() if name in set(only)}
        for name, digest in files.items():
            if not (directory / name).is_file() or sha256_file(directory / name) != digest:
                raise DamagedEntry(f"{name} is missing or does not match its checksum")
        return manifest
    present = {str(p.relative_to(directory)) for p in entry_files(directory)}
    if present != set(files):
        missing, extra = sorted(set(files) - present), sorted(present - set(files))
        raise DamagedEntry(f"its files differ from the manifest (missing {missing[:3]}, extra {extra[:3]})")
    for name, digest in files.items():
        if sha256_file(directory / name) != digest:
            raise DamagedEntry(f"{name} does not match its checksum")
    _verified[key] = (signature, manifest)
    return manifest


def verified(directory: Path, *, what: str = "cache entry", only: Sequence[str] | None = None) -> dict[str, Any] | None:
    """The manifest of a whole entry, else ``None`` with a warning (``None`` quietly if absent)."""
    directory = Path(directory)
    if not directory.exists():
        return None
    try:
        return check_manifest(directory, only=only)
    except DamagedEntry as exc:
        log.warning("%s %s is damaged: %s; rebuilding it", what, directory, exc)
        return None


def temp_dir(final: Path) -> Path:
    """A fresh temporary directory beside ``final`` (stale ones of dead processes are removed first)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}.tmp-"
    for stale in final.parent.glob(f"{prefix}*"):
        pid = stale.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(dir=final.parent, prefix=f"{prefix}{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def publish(tmp: Path, final: Path) -> Path:
    """Rename a finished entry into place, replacing a damaged one; if another process published a
    whole entry first, keep theirs."""
    tmp, final = Path(tmp), Path(final)
    discard(final)
    try:
        os.rename(tmp, final)
    except OSError:
        if verified(final) is None:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def discard(path: Path) -> None:
    """Remove an entry: renamed aside first, so no reader ever sees it half deleted."""
    path = Path(path)
    _verified.pop(str(path.resolve()), None)
    if not path.exists():
        return
    stale = path.with_name(f".{path.name}.stale-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(path, stale)
    except OSError:
        return
    shutil.rmtree(stale, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# checksummed JSON documents


def _payload_digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_checked_json(path: Path, payload: Any) -> Path:
    """Write ``{"sha256": …, "payload": payload}`` atomically."""
    return atomic_write_json(path, {"sha256": _payload_digest(payload), "payload": payload})


def read_checked_json(path: Path, *, what: str = "cache entry") -> Any | None:
    """The payload of a whole checksummed document, else ``None`` (with a warning if it exists):
    a document without a checksum (e.g. written by an older draftfit) cannot be shown whole, so it
    is rebuilt, never trusted."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("%s %s is unreadable (%s); rebuilding it", what, path, type(exc).__name__)
        return None
    if isinstance(data, dict) and set(data) == {"sha256", "payload"}:
        if data["sha256"] == _payload_digest(data["payload"]):
            return data["payload"]
        log.warning("%s %s does not match its checksum; rebuilding it", what, path)
        return None
    log.warning("%s %s has no checksum; rebuilding it", what, path)
    return None

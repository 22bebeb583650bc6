"""Where draftfit writes: every output path is checked against the command's inputs before anything
is touched, directories are built in a temporary sibling and swapped in whole, and nothing draftfit
did not write is deleted or overwritten — `--force` replaces only a directory draftfit wrote.

    check_output_dir(out, inputs=[source], force=force)   # before any work
    write_dir(out, build)                                 # build(tmp) fills a sibling; swapped in at the end
    check_output_file(out, inputs=[results], is_ours=is_report)
    open_log(path)                                        # append, never through a symbolic link
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from draftfit.errors import DraftfitError

# A file each directory-writing command leaves in what it wrote: the mark --force looks for.
EXPORT_MARKER = "draftfit-export.json"
PADDED_MARKER = "draftfit-padded.json"
DIR_MARKERS = (EXPORT_MARKER, PADDED_MARKER)
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def overlap(output: Path, source: Path) -> str | None:
    """How ``output`` overlaps ``source`` ("is", "contains", "lies inside"), both resolved; None if apart."""
    out, src = _real(output), _real(source)
    if out == src:
        return "is"
    if out in src.parents:
        return "contains"
    if src in out.parents:
        return "lies inside"
    return None


def refuse_overlap(output: Path, inputs: Iterable[Path | str | None], *, option: str = "-o") -> None:
    for source in inputs:
        if source is None:
            continue
        how = overlap(Path(output), Path(source))
        if how is not None:
            raise DraftfitError(
                f"{option} {output} {how} an input of this command ({source}): writing there could destroy it",
                fix=f"Pick a {option} path outside the input, e.g. a new directory beside it",
            )


def _refuse_link(path: Path, option: str) -> None:
    if path.is_symlink():
        raise DraftfitError(
            f"{option} {path} is a symbolic link (to {os.readlink(path)}); draftfit neither writes through nor deletes links",
            fix=f"Pass the directory itself, or a new {option} path",
        )


def written_by_draftfit(directory: Path) -> bool:
    return any((directory / name).is_file() for name in DIR_MARKERS)


def check_output_dir(output: Path, *, inputs: Iterable[Path | str | None] = (), force: bool = False,
                     option: str = "-o") -> Path:
    """Refuse an output directory that is a link, overlaps an input, or holds files draftfit did not write."""
    output = Path(output)
    _refuse_link(output, option)
    refuse_overlap(output, inputs, option=option)
    if output.exists() and not output.is_dir():
        raise DraftfitError(f"{option} {output} is a file, not a directory", fix=f"Pick a new {option} DIR")
    if output.is_dir() and any(output.iterdir()):
        if not force:
            raise DraftfitError("output directory exists and is not empty", where=str(output),
                                fix=f"Pick a new {option} DIR or pass --force")
        if not written_by_draftfit(output):
            raise DraftfitError(
                f"output directory exists and was not written by draftfit (no {' or '.join(DIR_MARKERS)}): --force "
                "replaces only a directory draftfit wrote", where=str(output),
                fix=f"Pick a new {option} DIR, or remove it yourself if it is yours to lose",
            )
    return output


def write_dir(output: Path, build: Callable[[Path], None]) -> Path:
    """``build(tmp)`` fills a temporary sibling of ``output``; only when it returns is ``output``
    (if any, already checked by :func:`check_output_dir`) swapped out and removed. On any error the
    sibling is removed and ``output`` is as it was."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.partial-"))
    try:
        build(tmp)
        old = None
        if output.exists():
            old = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.old-"))
            os.rename(output, old / output.name)
        os.rename(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)  # rmtree never follows links inside the tree
    return output


def check_output_file(output: Path, *, inputs: Iterable[Path | str | None] = (),
                      is_ours: Callable[[Path], bool] | None = None, what: str = "file", option: str = "-o") -> Path:
    """Refuse an output file that is an input of the command, a directory, or an existing file draftfit
    did not write (``is_ours``); a symbolic link is replaced, never followed."""
    output = Path(output)
    if not output.is_symlink():
        refuse_overlap(output, inputs, option=option)
    else:
        for source in inputs:  # the link itself is replaced; it must not *be* an input
            if source is not None and os.path.abspath(output) == os.path.abspath(source):
                raise DraftfitError(f"{option} {output} is an input of this command", fix=f"Pick another {option} path")
    if output.is_dir() and not output.is_symlink():
        raise DraftfitError(f"{option} {output} is a directory", fix=f"Pass a file path, e.g. {output / 'report.html'}")
    if output.is_file() and not output.is_symlink() and is_ours is not None and not is_ours(output):
        raise DraftfitError(
            f"{option} {output} exists and is not a {what} draftfit wrote; it is left as it is",
            fix=f"Pick a new {option} path, or remove the file yourself if it is yours to lose",
        )
    return output


def head_contains(path: Path, marker: bytes, limit: int = 4096) -> bool:
    """Whether ``marker`` is in the first ``limit`` bytes of ``path`` (how a file draftfit wrote is told apart)."""
    try:
        with open(path, "rb") as handle:
            return marker in handle.read(limit)
    except OSError:
        return False


def check_run_id(run_id: str) -> str:
    """One path component of letters, digits, '.', '_' and '-' (no '..', no separators)."""
    if not RUN_ID.fullmatch(run_id) or set(run_id) == {"."}:
        raise DraftfitError(
            f"--run-id {run_id[:80]!r} is not one plain folder name: it must stay inside --reports-dir",
            fix="Use letters, digits, '.', '_' and '-' only, e.g. --run-id baseline-2026-12-07",
        )
    return run_id


def check_run_dir(run_dir: Path) -> Path:
    """The run folder must be a real folder (or not exist yet), not a link to somewhere else."""
    if run_dir.is_symlink():
        raise DraftfitError(f"{run_dir} is a symbolic link; draftfit writes a run's files only into a real folder",
                            fix="Pick another --run-id, or remove the link")
    return run_dir


def open_log(path: Path):
    """``path`` opened for appending text, line-buffered; a symbolic link there is replaced by a file
    (never followed: a dangling link would create its target)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o666)
    return os.fdopen(fd, "a", buffering=1)


@contextlib.contextmanager
def removed_on_failure(run_dir: Path) -> object:
    """Remove what a failed start made of ``run_dir``: the folder if this run created it, else only the
    empty files it added. Files with content (a log with the failure in it) stay."""
    existed = run_dir.exists()
    before = set(run_dir.iterdir()) if existed and run_dir.is_dir() else set()
    try:
        yield
    except BaseException:
        if run_dir.is_dir() and not run_dir.is_symlink():
            for path in set(run_dir.iterdir()) - before:
                if path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
                    path.unlink()
            if not existed and not any(run_dir.iterdir()):
                run_dir.rmdir()
        raise

"""The terminal of the long commands (rank, verify): one progress style, and engine output kept out of it.

vLLM, torch and transformers write to the process's stdout and stderr from Python and from C++
(FutureWarnings, NUMA notices, weight-loading bars, their own logs). While a command runs, both file
descriptors go to a log file in the run's directory; draftfit's own progress lines go to the
terminal through a duplicate of the original stderr. On a failure the log's last lines are shown
with its path; ``--debug`` keeps everything on the terminal.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

TAIL_LINES = 20


def _real_stderr() -> bool:
    """Whether sys.stderr is the process's fd 2 (not a test runner's stand-in)."""
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


@contextmanager
def engine_output_to(log_path: Path, *, debug: bool) -> Iterator[object]:
    """Send stdout/stderr (fd 1 and 2, Python and C++) to ``log_path`` while the block runs; yield
    the stream draftfit's own terminal output goes to. Off with ``debug`` or when stderr is not the
    process's own (a test runner's capture): then nothing is redirected."""
    if debug or not _real_stderr():
        yield sys.stderr
        return
    from draftfit.outputs import open_log

    log = open_log(log_path)  # closed below, after the descriptors are back; never through a link
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    terminal = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    failed = False
    try:
        for fd in (1, 2):
            os.dup2(log.fileno(), fd)
        yield terminal
    except (KeyboardInterrupt, SystemExit) as exc:
        # free what the unwound frames hold (vLLM's progress bars) while their last output still goes to the log
        traceback.clear_frames(exc.__traceback__)
        raise
    except BaseException:
        failed = True
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        log.close()
        if failed:
            lines = log_path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
            if lines:
                terminal.write("".join(f"  | {line}\n" for line in lines))
                terminal.write(f"engine and library output: {log_path}\n")
        terminal.close()


def console_on(stream):
    from rich.console import Console

    return Console(file=stream)


def progress_printer(console, status) -> Callable[[str], None]:
    """``progress(message)``: a timestamped line on the console and the spinner's text (rank and verify alike)."""
    from rich.text import Text

    def progress(message: str) -> None:
        status.update(message)
        # soft_wrap: a long line is the terminal's to fold, never broken mid-sentence by us
        console.print(Text.assemble((time.strftime("%H:%M:%S"), "dim"), " ", message), highlight=False, soft_wrap=True)

    return progress


@contextmanager
def draftfit_logs_to(console) -> Iterator[None]:
    """Show draftfit's log records (INFO and up: prompts loaded and sampled, rows dropped) on the
    console while the command runs."""

    class ConsoleHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            console.print(f"{time.strftime('%H:%M:%S')} {self.format(record)}", style="dim", highlight=False, markup=False,
                          soft_wrap=True)

    logger = logging.getLogger("draftfit")
    handler = ConsoleHandler(logging.INFO)
    previous = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


@contextmanager
def long_run(log_path: Path) -> Iterator[Callable[[str], None]]:
    """The terminal of a long command: engine output to ``log_path`` (unless ``--debug``), a spinner,
    draftfit's log records, and the ``progress(message)`` function to report with."""
    with engine_output_to(log_path, debug=is_debug()) as stream:
        console = console_on(stream)
        with console.status("starting") as status, draftfit_logs_to(console):
            yield progress_printer(console, status)


def has_output(log_path: Path) -> bool:
    return log_path.is_file() and log_path.stat().st_size > 0


def is_debug() -> bool:
    """``draftfit --debug`` or DRAFTFIT_DEBUG=1, as the command group reads it."""
    from draftfit.cli import _debug

    return _debug(click.get_current_context())

"""Errors that reach the user as one line ending with the fix (exit code 2)."""

from __future__ import annotations


class DraftfitError(Exception):
    """A usage or input error: what is wrong, where, and how to fix it.

    The CLI prints ``str(error)`` on one line and exits with code 2; the traceback is shown
    only with ``--debug``.
    """

    exit_code = 2

    def __init__(self, message: str, *, fix: str | None = None, where: str | None = None):
        self.message = message
        self.fix = fix
        self.where = where
        super().__init__(self.render())

    def render(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.fix:
            text = f"{text.rstrip('.')}. {self.fix}"
        return text


class ModelRefError(DraftfitError):
    """A model reference that cannot be resolved or read."""


class EngineMissing(DraftfitError):
    """An optional engine (vLLM, transformers) is not installed."""


def error_line(exc: BaseException) -> str:
    """An exception in one line, as results and progress lines record it: its type and the first
    line of its message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text):,} characters)"

"""Options shared by the commands, and study options made from the settings model.

A study option's flag, type, range and help come from its :class:`~draftfit.candidates.StudySettings`
field (its description, default and constraints), so the command line and the study file cannot
drift apart. Study options default to ``None`` (not given): the settings' precedence (defaults <
study file < candidate files < options) then applies.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import annotated_types
import click

from draftfit.candidates import StudySettings

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def comma_parts(value: str) -> list[str]:
    """``"1, 4,8"`` → ``["1", "4", "8"]``; an empty part (``"1,,2"``, a trailing comma) is a typo: ValueError, as for a part that is no number."""
    parts = value.replace(" ", "").split(",")
    if not all(parts):
        raise ValueError(f"{value!r} has an empty item")
    return parts


def int_list(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> tuple[int, ...] | None:
    """``"1,4,8"`` → ``(1, 4, 8)``: whole numbers ≥ 1, separated by commas."""
    if value is None:
        return None
    try:
        numbers = tuple(int(part) for part in comma_parts(value))
    except ValueError:
        raise click.BadParameter(f"{value!r}: give whole numbers separated by commas, e.g. 1,4,8") from None
    if not numbers or min(numbers) < 1:
        raise click.BadParameter(f"{value!r}: give whole numbers ≥ 1 separated by commas, e.g. 1,4,8")
    return numbers


def _range(field, kind: type) -> click.ParamType:
    bounds: dict[str, Any] = {}
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            bounds["min"] = item.ge
        elif isinstance(item, annotated_types.Gt):
            bounds["min"], bounds["min_open"] = item.gt, True
        elif isinstance(item, annotated_types.Le):
            bounds["max"] = item.le
        elif isinstance(item, annotated_types.Lt):
            bounds["max"], bounds["max_open"] = item.lt, True
    if kind is int:
        return click.IntRange(**bounds) if bounds else click.INT
    return click.FloatRange(**bounds) if bounds else click.FLOAT


def _default_text(name: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return f" Default: {'--' if value else '--no-'}{name.replace('_', '-')}."
    if isinstance(value, tuple):
        return f" Default {','.join(map(str, value))}."
    return f" Default {value:g}." if isinstance(value, float) else f" Default {value}."


def study_option(name: str, **extra: Any) -> Decorator:
    """``--NAME`` for the study setting ``name``: its type, range, choices and help from the model."""
    field = StudySettings.model_fields[name]
    if not field.description:
        raise TypeError(f"StudySettings.{name} needs a description to be an option")
    flag = "--" + name.replace("_", "-")
    annotation = field.annotation
    members = typing.get_args(annotation)
    base = next(a for a in members if a is not type(None)) if type(None) in members else annotation  # X | None → X
    kwargs: dict[str, Any] = {"default": None}
    if typing.get_origin(base) is typing.Literal:
        kwargs["type"] = click.Choice([str(v) for v in typing.get_args(base)])
    elif base is bool:
        flag = f"{flag}/--no-{name.replace('_', '-')}"
    elif base in (int, float):
        kwargs["type"] = _range(field, base)
    elif typing.get_origin(base) is tuple:
        kwargs["callback"] = int_list
    kwargs["help"] = field.description + _default_text(name, field.default)
    kwargs.update(extra)
    return click.option(flag, name, **kwargs)


def study_options(*names: str) -> Decorator:
    """Several :func:`study_option` in the order given (as ``--help`` lists them)."""
    def apply(command):
        for name in reversed(names):
            command = study_option(name)(command)
        return command

    return apply


trust_remote_code = click.option(
    "--trust-remote-code", is_flag=True,
    help="Let model repositories run their own Python code (auto_map model or tokenizer classes). Only for code you trust.",
)
show_prompts = click.option(
    "--show-prompts", is_flag=True,
    help="Show the start of prompt texts in warnings and errors. Default: row numbers and a short hash only.",
)

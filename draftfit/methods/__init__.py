"""The draft methods, one module each, behind one registry.

``get_method(name)`` gives a method's hooks (:class:`~draftfit.methods.base.DraftMethod`); candidate
files accept the names in :data:`CANDIDATE_METHODS`, the deploy command every name in
:data:`METHODS`. docs/adding-a-method.md says how to add one.
"""

from __future__ import annotations

from draftfit.errors import DraftfitError
from draftfit.methods import draft_model, eagle, eagle3, legacy, mtp, ngram, suffix
from draftfit.methods.base import (
    AcceptanceInputs,
    CostTerms,
    DraftMethod,
    EngineSpec,
    PlanContext,
    PlannedDraft,
)

METHODS: dict[str, DraftMethod] = {
    m.name: m
    for m in (draft_model.METHOD, ngram.METHOD, suffix.METHOD, eagle.METHOD, eagle3.METHOD, mtp.METHOD,
              legacy.MEDUSA, legacy.MLP_SPECULATOR)
}
CANDIDATE_METHODS: tuple[str, ...] = tuple(name for name, m in METHODS.items() if m.in_candidates)


def get_method(name: str) -> DraftMethod:
    """The registered method ``name``; an unknown name is a DraftfitError listing the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise DraftfitError(f"unknown speculative method {name!r}", fix=f"Use one of: {', '.join(sorted(METHODS))}") from None


__all__ = [
    "AcceptanceInputs",
    "CANDIDATE_METHODS",
    "CostTerms",
    "DraftMethod",
    "EngineSpec",
    "METHODS",
    "PlanContext",
    "PlannedDraft",
    "get_method",
]

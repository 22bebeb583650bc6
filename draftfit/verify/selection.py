"""What verify measures: the configurations chosen from a rank run (or named), and their vLLM
``speculative_config`` with every model path local."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftfit import results as results_mod
from draftfit.candidates import Candidate, StudySettings, load_candidate
from draftfit.deploy import schedule_text, validate_schedule
from draftfit.errors import DraftfitError

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
Schedule = tuple[tuple[int, int, int], ...]

DEFAULT_TOP = 3


def config_label(candidate: str | None, k: int | None, schedule: Sequence[Sequence[int]] | None = None) -> str:
    """``baseline``, ``NAME k=K``, or ``NAME k=[1-2:2 3-1024:1]`` for a k schedule by batch size."""
    if candidate is None:
        return "baseline"
    return f"{candidate} k=[{schedule_text(schedule)}]" if schedule else f"{candidate} k={k}"


@dataclass(frozen=True)
class VerifyConfig:
    """One configuration to measure; ``candidate is None`` is the no-speculation baseline.

    ``schedule``: vLLM's ``num_speculative_tokens_per_batch_size`` (``k`` is then its largest k,
    the ``num_speculative_tokens`` the server is started with)."""

    candidate: str | None
    k: int | None
    method: str | None = None
    draft: str | None = None  # the draft's directory (draft models) or None
    speculative_config: dict[str, Any] | None = None
    draft_is_target: bool = False
    target: str | None = None  # a checkpoint served in the target's place (None: the target)
    schedule: Schedule | None = None

    @property
    def label(self) -> str:
        return config_label(self.candidate, self.k, self.schedule)


@dataclass(frozen=True)
class Choice:
    """A configuration chosen to verify: a candidate at one k, or rank's recommended k schedule."""

    candidate: Candidate
    k: int
    schedule: Schedule | None = None


BASELINE = VerifyConfig(None, None)


def _target_ref(results: results_mod.Results):
    from draftfit.refs import resolve

    if not results.targets:
        raise DraftfitError("the results name no target", fix="Pass a results.json written by `draftfit rank`")
    target = results.targets[0]["target"]
    # the reference as the user gave it (`smollm2`, a hub id, a relative path), resolved here; the
    # path it pointed to on the machine that ranked only when that fails
    try:
        return resolve(target["spec"])
    except DraftfitError:
        if target.get("kind") == "hub" or not Path(target.get("location", "")).exists():
            raise
        return resolve(target["location"])


def _candidates(results: results_mod.Results) -> dict[str, Candidate]:
    return {c["name"]: Candidate.model_validate(c) for c in results.candidates}


def top_configs(results: results_mod.Results, top: int) -> list[tuple[str, int]]:
    """The first ``top`` (candidate, k) of the ranking (predicted speedup at the primary concurrency)."""
    ranked = (results.ranking or {}).get("ranked") or []
    if not ranked:
        raise DraftfitError("the results hold no ranked configuration", fix="Name configurations with --config NAME:K or --candidate FILE --k K")
    return [(r["candidate"], int(r["k"])) for r in ranked[: int(top)]]


def _same_model(a: str, b: str) -> bool:
    """Whether two model references name the same files (the text itself when they do not resolve)."""
    if a == b:
        return True
    from draftfit.refs import fingerprint, resolve

    try:
        return fingerprint(resolve(a)) == fingerprint(resolve(b))
    except DraftfitError:
        return False


def parse_config(text: str) -> tuple[str, int]:
    """``NAME:K`` → (NAME, K)."""
    name, sep, k = text.rpartition(":")
    if not sep or not name or not k.strip().isdigit():
        raise DraftfitError(f"--config {text!r} is not NAME:K", fix="Write e.g. --config ngram-2-4:3")
    return name, int(k)


def speculative_config(candidate: Candidate, k: int, target_ref, study: StudySettings, *,
                       trust_remote_code: bool = False, schedule: Schedule | None = None) -> VerifyConfig:
    """The vLLM ``speculative_config`` for (candidate, k), with every model path made local; with
    ``schedule``, k is its largest and the schedule goes in as ``num_speculative_tokens_per_batch_size``."""
    from draftfit.methods import get_method

    draft = candidate.draft
    extra: dict[str, Any] = {}
    if study.temperature > 0:
        extra["draft_sample_method"] = study.draft_sample_method
    if draft.quantization:
        extra["quantization"] = draft.quantization
    spec = get_method(draft.method).engine_config(candidate, k, target_ref, extra, trust_remote_code=trust_remote_code)
    directory = str(spec.directory) if spec.directory else None
    config = spec.config
    if schedule:
        config = {**config, "num_speculative_tokens_per_batch_size": [list(r) for r in schedule]}
    return VerifyConfig(candidate.name, int(k), draft.method, directory, config, spec.draft_is_target,
                        str(spec.target) if spec.target else None, schedule or None)


def deployed_k(results: results_mod.Results) -> tuple[int, Schedule | None] | None:
    """The ``num_speculative_tokens`` and k schedule by batch size (None: one k) of the deploy
    command rank recommends; None where it recommends serving without speculation."""
    rec = results.recommendation or {}
    if rec.get("candidate") is None:
        return None
    command = (results.deploy or {}).get("recommended") or {}
    if command and not command.get("deployable", True):
        raise DraftfitError(f"rank's recommended command is not deployable on vLLM {command.get('vllm_version')}: "
                            f"{command.get('problem')}", fix="Name a configuration with --config NAME:K instead")
    kwargs = command.get("llm_kwargs") or {}
    spec = command.get("speculative_config") or kwargs.get("speculative_config") or {}
    k = int(spec.get("num_speculative_tokens") or kwargs.get("num_speculative_tokens") or rec["k"])
    schedule = spec.get("num_speculative_tokens_per_batch_size")
    return k, validate_schedule(schedule) if schedule else None


def recommended_choice(results: results_mod.Results) -> Choice | None:
    """The configuration of the deploy command rank recommends, exactly (:func:`deployed_k`), or
    None where rank recommends serving without speculation."""
    deployed = deployed_k(results)
    if deployed is None:
        return None
    name = results.recommendation["candidate"]
    known = _candidates(results)
    if name not in known:
        raise DraftfitError(f"the recommended candidate {name!r} is not among the results' candidates",
                            fix="Run `draftfit rank` again; the results file is incomplete")
    return Choice(known[name], *deployed)


def select_configs(
    results: results_mod.Results,
    *,
    top: int | None = None,
    configs: Sequence[str] = (),
    candidate_files: Sequence[str | Path] = (),
    ks: Sequence[int] | None = None,
    recommended: bool | None = None,
) -> list[Choice]:
    """What to verify: rank's recommended deploy command, the top of the ranking, named configs,
    and candidate files.

    Candidate files may add candidates the results do not hold (e.g. eagle heads `rank` cannot
    score); their target must be the results' target. ``ks`` applies to candidate files (default:
    each file's own k list). Without any choice, the recommended command (where rank recommends
    speculation) and the top 3.
    """
    known = _candidates(results)
    chosen: list[Choice] = []
    if top is None and not configs and not candidate_files and not recommended:
        top = DEFAULT_TOP
        recommended = recommended is None
    if recommended:
        choice = recommended_choice(results)
        if choice is None and top is None and not configs and not candidate_files:
            raise DraftfitError("rank recommends serving without speculation: there is no recommended speculative "
                                "command to verify", fix="Name configurations with --config NAME:K or --top N")
        chosen += [choice] if choice is not None else []
    if top:
        chosen += [Choice(known[name], k) for name, k in top_configs(results, top)]
    for text in configs:
        name, k = parse_config(text)
        if name not in known:
            raise DraftfitError(
                f"--config {text}: no candidate named {name!r} in the results ({', '.join(sorted(known)) or 'none'})",
                fix="Use a candidate name from the ranking, or pass its file with --candidate FILE --k K",
            )
        chosen.append(Choice(known[name], k))
    if candidate_files:
        target = results.candidates[0]["target"] if results.candidates else None
        for path in candidate_files:
            candidate, _ = load_candidate(path)
            if target is not None and not _same_model(candidate.target, target):
                raise DraftfitError(
                    f"its target {candidate.target!r} is not the results' target {target!r}",
                    where=str(path), fix="Verify a candidate of the same target, or run `draftfit rank` for its target",
                )
            if candidate.name in known and known[candidate.name] != candidate:
                raise DraftfitError(
                    f"candidate {candidate.name!r} differs from the one the results were ranked with",
                    where=str(path), fix="Rename it, or pass the file the ranking used",
                )
            for k in ks or candidate.k:
                chosen.append(Choice(candidate, int(k)))
    for choice in chosen:
        if not 1 <= choice.k <= 16:
            raise DraftfitError(f"{choice.candidate.name}: k={choice.k} is outside 1..16", fix="Use k between 1 and 16")
    unique: dict[tuple[str, int, Schedule | None], Choice] = {}
    for choice in chosen:
        unique.setdefault((choice.candidate.name, choice.k, choice.schedule), choice)
    return list(unique.values())

"""``draftfit check TARGET DRAFT``: tokenizer and config compatibility, one verdict per engine."""

from __future__ import annotations

import json
from pathlib import Path

import click

from draftfit.cli.options import trust_remote_code
from draftfit.compat.schema import (
    COMPATIBLE,
    ENGINES,
    IDENTICAL,
    UNKNOWN,
    CheckReport,
    EngineVerdict,
)

EXIT_COMPATIBLE = 0
EXIT_INCOMPATIBLE = 1
EXIT_CANNOT_TELL = 2  # as for an input error: the files given cannot decide the chosen engine's verdict
_LABEL = 18  # width of the row labels


def _check_version(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from packaging.version import InvalidVersion, Version

    try:
        Version(value)
    except InvalidVersion:
        raise click.BadParameter(f"{value!r} is not a version; use X.Y.Z, e.g. 0.32.0") from None
    return value


@click.command("check")
@click.argument("target")
@click.argument("draft")
@click.option("--engine", type=click.Choice(ENGINES), default="vllm", show_default=True,
              help="The engine whose verdict sets the exit code.")
@click.option("--vllm-version", metavar="X.Y.Z", callback=_check_version,
              help="Judge for this vLLM version instead of the installed one.")
@click.option("--probe-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="More probe texts: one per line, or JSONL with a `text` field.")
@click.option("--method", type=click.Choice(["auto", "eagle", "eagle3", "mtp"]), default="auto", show_default=True,
              help="Check DRAFT as a head of this method (auto: an EAGLE/EAGLE-3 head or a Gemma 4 assistant when its "
                   "config.json says so; mtp: the MTP layers DRAFT's checkpoint carries: DRAFT = TARGET for a target that "
                   "ships them, or the copy of the target rank wrote with a layer trained here; or DRAFT a Gemma 4 "
                   "assistant).")
@click.option("-k", "--num-speculative-tokens", "ks", type=click.IntRange(min=1), multiple=True,
              help="Head checks: the k values to deploy (MTP: k must divide by its layers). Repeatable.")
@click.option("--max-model-len", type=click.IntRange(min=1), default=None,
              help="Head checks: the deployment's max_model_len (default: the target's max_position_embeddings).")
@trust_remote_code
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (docs/check-json.md).")
def check(target: str, draft: str, engine: str, vllm_version: str | None, probe_file: Path | None,
          method: str, ks: tuple[int, ...], max_model_len: int | None,
          trust_remote_code: bool, as_json: bool) -> None:
    """Compare tokenizers and configs of TARGET and DRAFT; verdict per engine.

    \b
    Reads tokenizer.json, tokenizer_config.json, config.json and generation_config.json only —
    never weights. TARGET and DRAFT: a local HF directory, a .gguf file, a hub id (offline: only
    if cached) or pkg:PACKAGE.

    \b
    Exit code: 0 compatible with --engine (default vllm), 1 incompatible, 2 usage or input error,
    or a verdict the files cannot decide (a tokenizer-only directory: no config.json).

    \b
    A head (EAGLE, EAGLE-3 — speculators' format included — a Gemma 4 assistant, or, with
    --method mtp, the target's MTP layers) is checked against the target as vLLM loads it
    instead: hidden size, auxiliary layers, vocabulary and its d2t mapping,
    max_position_embeddings, k; an assistant's width, vocabulary and layer kinds.
    """
    from draftfit.compat import compare
    from draftfit.probe_corpus import read_probe_file

    head = _head_method(draft, method, trust_remote_code)
    if head is not None:
        _check_head(target, draft, head, list(ks), max_model_len, trust_remote_code, as_json)
        return

    probe_texts = read_probe_file(probe_file) if probe_file else None
    target_dir = _metadata_dir(target, trust_remote_code)
    draft_dir = _metadata_dir(draft, trust_remote_code)
    report = compare(target_dir, draft_dir, probe_texts=probe_texts, vllm_version=vllm_version,
                     target_label=target, draft_label=draft)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        click.echo(render(report, engine))
    verdict = report.engines[engine].verdict
    code = {COMPATIBLE: EXIT_COMPATIBLE, UNKNOWN: EXIT_CANNOT_TELL}.get(verdict, EXIT_INCOMPATIBLE)
    click.get_current_context().exit(code)


def _head_method(draft: str, method: str, trust_remote_code: bool) -> str | None:
    """The head method DRAFT is checked as, or None for a tokenizer/config comparison."""
    if method == "mtp":
        return "mtp"
    from draftfit.compat.heads import head_method
    from draftfit.refs import resolve

    ref = resolve(draft)
    config_file = ref.path / "config.json" if ref.kind == "dir" and ref.path.is_dir() else None
    found = head_method(json.loads(config_file.read_text(encoding="utf-8"))) if config_file and config_file.exists() else None
    if method == "auto":
        return found
    if found is None:
        raise click.UsageError(f"{draft} is not an {method} head (its config.json names no EAGLE architecture)")
    return method


def _check_head(target: str, draft: str, method: str, ks: list[int], max_model_len: int | None,
                trust_remote_code: bool, as_json: bool) -> None:
    from draftfit.compat.heads import INCOMPATIBLE, check_assistant, check_head, is_assistant
    from draftfit.refs import metadata_dir, model_dir, resolve

    def config_of(spec: str) -> dict:
        from draftfit.compat.files import read_config

        return read_config(metadata_dir(resolve(spec), trust_remote_code=trust_remote_code) / "config.json")

    draft_config = config_of(draft)
    # MTP layers are read where they are carried: the checkpoint served as the target (a Gemma 4
    # assistant is a draft of its own, beside the target)
    assistant = method == "mtp" and is_assistant(draft_config)
    carrier = draft if method == "mtp" and not assistant else target
    target_config = config_of(carrier)
    head_dir = None if method == "mtp" else model_dir(resolve(draft), trust_remote_code=trust_remote_code)
    mml = max_model_len or target_config.get("max_position_embeddings")
    report = check_assistant(draft_config, target_config) if assistant else check_head(method, head_dir, target_config, ks, mml)
    if as_json:
        click.echo(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        colour = "red" if report["verdict"] == INCOMPATIBLE else "green"
        kind = "Gemma 4 assistant" if assistant else f"{method} head"
        lines = [click.style(f"check  target {target}  ·  {kind} {draft}", bold=True), "",
                 f"{'verdict':<{_LABEL}}" + click.style(report["verdict"].upper(), fg=colour, bold=True)]
        for f in report["findings"]:
            lines.append(f"{'':<{_LABEL}}{'✗' if f['severity'] == 'error' else '·'} {f['message']}")
            if f["fix"]:
                lines.append(f"{'':<{_LABEL}}  fix: {f['fix']}")
        if not report["findings"]:
            lines.append(f"{'':<{_LABEL}}· {report['summary']}")
        click.echo("\n".join(lines))
    click.get_current_context().exit(EXIT_INCOMPATIBLE if report["verdict"] == INCOMPATIBLE else EXIT_COMPATIBLE)


def _metadata_dir(spec: str, trust_remote_code: bool) -> Path:
    """The metadata directory of a model reference (tokenizer and config files, no weights)."""
    from draftfit.refs import metadata_dir, resolve

    return metadata_dir(resolve(spec), trust_remote_code=trust_remote_code, tokenizer_only=True)


# --- human-readable output ---------------------------------------------------------------------

def render(report: CheckReport, engine: str = "vllm") -> str:
    """The compact terminal view of a report."""
    t, d = report.target, report.draft
    lines = [click.style(f"check  target {t.label}  ·  draft {d.label}", bold=True), ""]
    rows: list[tuple[str, str, str, bool]] = []

    def row(label: str, a: object, b: object) -> None:
        rows.append((label, _s(a), _s(b), a == b))

    row("tokenizer", _kind(t), _kind(d))
    row("len(tokenizer)", _size(t), _size(d))
    row("config.vocab_size", t.config_vocab_size, d.config_vocab_size)
    for role in report.special_tokens.roles:
        row(role.role, _tok(role.target), _tok(role.draft))
    st = report.special_tokens
    row("adds on encode", _adds(st.encode_adds_target), _adds(st.encode_adds_draft))
    if st.generation_eos_target is not None or st.generation_eos_draft is not None:
        row("generation eos", st.generation_eos_target, st.generation_eos_draft)
    row("chat template", t.chat_template_source, d.chat_template_source)
    width = max([len("target")] + [len(a) for _, a, _, _ in rows]) + 2
    lines.append(f"{'':<{_LABEL}}{'target':<{width}}draft")
    for label, a, b, same in rows:
        mark = "" if same else click.style("  ≠", fg="yellow")
        lines.append(f"{label:<{_LABEL}}{a:<{width}}{b}{mark}")
    for diff in report.chat_template.diff[1:3]:  # skip the @@ hunk header
        lines.append(f"{'':<{_LABEL}}  {diff[:70]}")
    lines.append("")

    parts = "  ".join(f"{c.component.replace('_', '-')} {_ok(c.equal)}" for c in report.tokenizer[:5])
    lines.append(f"{'tokenizer.json':<{_LABEL}}{parts}")
    for c in report.tokenizer:
        for diff in c.differences[:3]:
            lines.append(f"{'':<{_LABEL}}  {diff}")
    v = report.vocab
    ids = f"{v.shared_ids:,} shared ids: "
    if v.shared_ids_different:
        first = v.first_different[0]
        ids += f"{v.shared_ids_different:,} differ (first: id {first.id} {first.target!r} vs {first.draft!r})"
    else:
        ids += "all agree"
    ids += f"; target-only {v.target_only_ids:,}, draft-only {v.draft_only_ids:,}"
    if v.merges_equal is not None:
        ids += f"; merges {'equal' if v.merges_equal else 'differ'}"
    lines.append(f"{'ids':<{_LABEL}}{ids}")
    p = report.probe
    probe = f"{p.identical}/{p.texts} texts encode to identical ids ({p.share_identical:.0%})"
    if p.first_difference:
        ex = p.first_difference
        probe += (f"; first: {ex.category} {ex.text[:30]!r} at token {ex.position}: "
                  f"{_pieces(ex.target, ex.target_pieces)} vs {_pieces(ex.draft, ex.draft_pieces)}")
    lines.append(f"{'probe':<{_LABEL}}{probe}")
    inter = report.intersection
    lines.append(
        f"{'intersection':<{_LABEL}}{inter.size:,} tokens ({inter.share_of_target:.1%} of target, "
        f"{inter.share_of_draft:.1%} of draft); covers {inter.probe_coverage:.1%} of the target's probe tokens"
    )
    lines.append("")

    colour = "green" if report.verdict in (IDENTICAL, COMPATIBLE) else "red"
    lines.append(f"{'verdict':<{_LABEL}}" + click.style(report.verdict.upper(), fg=colour, bold=True))
    for marker, findings in (("✗", report.blocking), ("!", report.warnings), ("·", report.harmless)):
        for f in findings:
            lines.append(f"{'':<{_LABEL}}{marker} {f.message}")
    lines.append("")
    lines.append("engines (▸ sets the exit code)")
    heads = {name: _engine_head(v) for name, v in report.engines.items()}
    head_width = max(map(len, heads.values())) + 2
    for name, verdict in report.engines.items():
        lines.extend(_engine_lines(verdict, heads[name], head_width, selected=name == engine))
    return "\n".join(lines)


def _engine_head(v: EngineVerdict) -> str:
    version = {"installed": f"{v.version} (installed)", "requested": f"{v.version} (requested)",
               "rule": "(rule)"}.get(v.version_source, "(not installed)")
    return f"{v.engine} {version}"


def _engine_lines(v: EngineVerdict, head: str, width: int, *, selected: bool) -> list[str]:
    colour = "green" if v.compatible else "yellow" if v.verdict == UNKNOWN else "red"
    state = click.style(f"{'?' if v.verdict == UNKNOWN else _ok(v.compatible)} {v.verdict:<13}", fg=colour)
    pointer = "▸" if selected else " "
    out = [f"{pointer} {head:<{width}}{state}{v.reason}"]
    pad = " " * 4
    if v.error and not v.compatible:
        out.append(f"{pad}error: {v.error}")
    if v.fix:
        out.append(f"{pad}{'fix:  ' if not v.compatible else 'needs:'} {v.fix}")
    return out


def _size(summary) -> str:
    new = summary.len_tokenizer - summary.vocab_base_size
    return f"{summary.len_tokenizer:,} ({summary.vocab_base_size:,} base + {new} new; {summary.added_tokens} added)"


def _pieces(refs, pieces: list[str], n: int = 6) -> list[str]:
    """Decoded tokens where they are whole characters, else the raw token strings."""
    return [p if p and "\ufffd" not in p else (r.token or "") for r, p in zip(refs[:n], pieces[:n], strict=False)]


def _kind(summary) -> str:
    extra = [x for x, on in (("byte-level", summary.byte_level), ("byte fallback", summary.byte_fallback)) if on]
    return ", ".join([summary.tokenizer_model] + extra)


def _tok(ref) -> str:
    return "—" if ref.token is None else f"{ref.token!r} ({ref.id})"


def _adds(adds: dict[str, list[int]]) -> str:
    if not adds["prefix"] and not adds["suffix"]:
        return "nothing"
    return f"prefix {adds['prefix']} suffix {adds['suffix']}"


def _s(value: object) -> str:
    return "—" if value is None else str(value)


def _ok(flag: bool) -> str:
    return "✓" if flag else "✗"

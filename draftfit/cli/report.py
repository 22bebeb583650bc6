"""`draftfit report RESULTS.json`: re-render the HTML report from saved results (no models load)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("report")
@click.argument("results_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="HTML file to write. Default: report.html beside RESULTS_FILE.")
def report(results_file: Path, output: Path | None) -> None:
    """Re-render the HTML report of a `draftfit rank` run from its RESULTS_FILE (results.json).

    The report is one self-contained file: recommendation and deploy command, tokenizer verdicts,
    ranking, acceptance (AL vs k, per position, by segment), speedup vs concurrency with the
    break-even, memory, the Pareto front, predicted vs measured (after `draftfit verify`),
    warnings and provenance. It opens from disk and fetches nothing. No model is loaded.

    \b
    Example:
      draftfit report reports/20261129-101500/results.json
      draftfit report reports/20261129-101500/results.json -o review.html
    """
    from draftfit.report import render_file

    path = render_file(results_file, output)
    click.echo(f"wrote {path}")

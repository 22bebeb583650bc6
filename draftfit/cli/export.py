"""`draftfit export REF -o DIR`: the model directory `vllm serve` loads."""

from __future__ import annotations

from pathlib import Path

import click

from draftfit.cli.options import trust_remote_code


@click.command("export")
@click.argument("model")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True, metavar="DIR",
              help="Where to write the model (a new or empty directory).")
@click.option("--first-layers", type=click.IntRange(min=1), metavar="N",
              help="Export the model's first N decoder layers (an early-exit draft, as a candidate's `derived`).")
@click.option("--force", is_flag=True, help="Replace an output directory draftfit wrote before (never a directory it did not write).")
@trust_remote_code
def export(model: str, output: Path, first_layers: int | None, force: bool, trust_remote_code: bool) -> None:
    """Write MODEL as a Hugging Face directory that `vllm serve` loads.

    For a GGUF file or a model bundled in a package (`smollm2`) the weights are converted once; with
    --first-layers the directory holds the early-exit draft `rank` derived. The deploy commands
    `rank` writes name such directories, after the export command that makes them.

    \b
    Examples:
      draftfit export smollm2 -o ./SmolLM2-135M-Instruct
      draftfit export smollm2 --first-layers 10 -o ./SmolLM2-135M-Instruct-first10
    """
    from draftfit.export import export as run
    from draftfit.refs import resolve

    written = run(resolve(model), output, first_layers=first_layers, force=force, trust_remote_code=trust_remote_code)
    click.echo(f"wrote {written}")

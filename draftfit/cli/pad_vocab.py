"""`draftfit pad-vocab DRAFT --to N -o DIR`."""

from __future__ import annotations

from pathlib import Path

import click

from draftfit.cli.options import trust_remote_code


@click.command("pad-vocab")
@click.argument("draft")
@click.option("--to", "to", type=click.IntRange(min=1), required=True, metavar="N",
              help="New vocab_size: the target's config.json vocab_size.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              metavar="DIR", help="Where to write the padded copy (a new or empty directory).")
@click.option("--force", is_flag=True, help="Replace an output directory draftfit wrote before (never a directory it did not write).")
@trust_remote_code
def pad_vocab(draft: str, to: int, output: Path, force: bool, trust_remote_code: bool) -> None:
    """Write a copy of DRAFT whose embedding and LM-head rows are padded to N.

    vLLM refuses a draft whose config vocab_size differs from the target's, even when the two
    share one tokenizer and differ only in embedding padding (Qwen2.5-0.5B: 151936 vs 72B: 152064).
    The new rows copy an existing token's row, so greedy drafting can never propose them. Then
    point the speculative config at DIR; `draftfit check TARGET DIR` confirms the vLLM gate passes.

    \b
    Example:
      draftfit pad-vocab Qwen/Qwen2.5-0.5B-Instruct --to 152064 -o drafts/qwen0.5b-padded
    """
    from draftfit.padvocab import pad_vocab as run
    from draftfit.refs import resolve

    result = run(resolve(draft), to, output, trust_remote_code=trust_remote_code, force=force)
    click.echo(
        f"wrote {result.output_dir}: vocab_size {result.old_vocab_size} -> {result.new_vocab_size} "
        f"(tokenizer length {result.tokenizer_length}; new rows copy token id {result.copied_row})"
    )

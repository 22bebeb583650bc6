"""`draftfit export`: a model reference (or its first N layers) as the directory `vllm serve` loads."""

from __future__ import annotations

import shutil
from pathlib import Path

from draftfit.errors import DraftfitError
from draftfit.refs import ModelRef, model_dir


def export(ref: ModelRef, output: str | Path, *, first_layers: int | None = None, force: bool = False,
           trust_remote_code: bool = False) -> Path:
    """Copy the HF directory of ``ref`` (converted from GGUF where needed; its first N layers with
    ``first_layers``) to ``output``."""
    output = Path(output)
    if output.exists() and any(output.iterdir()):
        if not force:
            raise DraftfitError("output directory exists and is not empty", where=str(output),
                                fix="Pick a new -o DIR or pass --force")
        shutil.rmtree(output)
    if first_layers is not None:
        from draftfit.derive import first_layers as derive

        source = derive(ref, first_layers).path
    else:
        source = model_dir(ref, trust_remote_code=trust_remote_code)
    shutil.copytree(source, output, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("draftfit-manifest.json", "draftfit-source.json"))
    return output

"""`draftfit export`: a model reference (or its first N layers) as the directory `vllm serve` loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from draftfit.outputs import EXPORT_MARKER, check_output_dir, refuse_overlap, write_dir
from draftfit.refs import ModelRef, model_dir


def export(ref: ModelRef, output: str | Path, *, first_layers: int | None = None, force: bool = False,
           trust_remote_code: bool = False) -> Path:
    """Copy the HF directory of ``ref`` (converted from GGUF where needed; its first N layers with
    ``first_layers``) to ``output``. Every input is checked (and the draft derived) before ``output``
    is touched; the copy is built beside it and swapped in whole."""
    output = check_output_dir(Path(output), inputs=[None if ref.kind == "hub" else ref.path], force=force)
    if first_layers is not None:
        from draftfit.derive import check_first_layers
        from draftfit.derive import first_layers as derive

        # derive checks this too; export checks it before the derive step is entered at all, so that
        # every input error comes before a step that may convert weights
        check_first_layers(ref, first_layers)
        source = derive(ref, first_layers).path
    else:
        from draftfit.compat.files import read_config
        from draftfit.refs import metadata_dir

        read_config(metadata_dir(ref, trust_remote_code=trust_remote_code) / "config.json")
        source = model_dir(ref, trust_remote_code=trust_remote_code)
    refuse_overlap(output, [source])

    def build(tmp: Path) -> None:
        shutil.copytree(source, tmp, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("draftfit-manifest.json", "draftfit-source.json"))
        (tmp / EXPORT_MARKER).write_text(json.dumps({"exported": ref.spec, "first_layers": first_layers}, indent=2) + "\n")

    return write_dir(output, build)

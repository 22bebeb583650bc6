"""draftfit's parameter count of every decoder family vLLM serves, against transformers' own model.

    python benchmarks/param_estimates.py            # the families off by more than 1%
    python benchmarks/param_estimates.py --all      # every family

For each model type transformers builds as a causal LM whose architecture vLLM's registry serves,
transformers' default config is read by draftfit (draftfit.hardware.ModelShape.from_config) and its
text model is built on the meta device (no memory, no weights) to count its parameters. Both numbers
are *computed* from the same config: the count is the reference. A family draftfit counts off
transformers' model (``counted``) matches by construction; one it refuses (``refused``) is not sized.
Only the text model is compared: a multimodal checkpoint's encoders are counted apart, off
transformers' whole model (draftfit.hardware.ModelShape.encoder_params).

Exit status: 0 when every family draftfit estimates lies within 1% of the count and none fails to be
read, 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from draftfit.errors import DraftfitError  # noqa: E402
from draftfit.hardware import ModelShape  # noqa: E402

TOLERANCE = 0.01


def rows():
    """(model type, draftfit's parameters or None, transformers' count, how draftfit read it)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from vllm.model_executor.models.registry import _MULTIMODAL_MODELS, _TEXT_GENERATION_MODELS

    served = set(_TEXT_GENERATION_MODELS) | set(_MULTIMODAL_MODELS)
    for model_type, architecture in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        if architecture not in served:
            continue
        try:
            config = AutoConfig.for_model(model_type).get_text_config()
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
        except Exception:  # noqa: BLE001 — a default config transformers cannot build: no reference
            continue
        count = float(sum(p.numel() for p in model.parameters()))
        try:
            shape = ModelShape.from_config(config.to_dict())
        except DraftfitError as err:
            yield model_type, None, count, "refused: " + str(err).split(":", 1)[-1].split(". ")[0].strip()
            continue
        except Exception as err:  # noqa: BLE001 — a config draftfit cannot read at all is shown, not hidden
            yield model_type, None, count, f"fails: {type(err).__name__}: {err}"
            continue
        how = "counted" if shape.params_source.startswith("counted") else "estimated"
        if shape.zero_experts:  # LongCat-Flash: transformers' stacked gate-up tensor has a row per identity too
            how += f" as vLLM builds its experts (without gate-up rows for the {shape.zero_experts} zero-computation experts)"
        yield model_type, shape.params, count, how


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="print every family, not only those off by more than 1%%")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    failed = []
    print(f"{'model type':<24} {'draftfit':>10} {'count':>10} {'ratio':>7}  how")
    for model_type, params, count, how in rows():
        ratio = params / count if params is not None else float("nan")
        off = params is not None and abs(ratio - 1.0) > TOLERANCE
        if (off and how == "estimated") or how.startswith("fails"):
            failed.append(model_type)
        if args.all or off or params is None:
            shown = f"{params / 1e9:9.2f}B" if params is not None else f"{'—':>10}"
            print(f"{model_type:<24} {shown} {count / 1e9:9.2f}B {ratio:7.3f}  {how}")
    if failed:
        print(f"\nestimated beyond {TOLERANCE:.0%} of transformers' count: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

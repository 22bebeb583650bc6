"""Step 1 of the pipeline: is a (target, draft) pair compatible, and for which engine?

Reads only tokenizer and config files (``tokenizers`` + JSON; never transformers, torch or
weights) and returns a :class:`CheckReport`: tokenizer pipeline diff, vocabulary agreement,
special tokens, chat template, probe-corpus encodings, the vocabulary intersection vLLM would
use for heterogeneous vocabularies, an overall verdict and one verdict per engine.
"""

from draftfit.compat.compare import compare, compare_files
from draftfit.compat.files import ModelFiles, load_model_files
from draftfit.compat.schema import (
    COMPATIBLE,
    ENGINES,
    IDENTICAL,
    INCOMPATIBLE,
    SCHEMA_VERSION,
    CheckReport,
    EngineVerdict,
    Finding,
)

__all__ = [
    "COMPATIBLE",
    "ENGINES",
    "IDENTICAL",
    "INCOMPATIBLE",
    "SCHEMA_VERSION",
    "CheckReport",
    "EngineVerdict",
    "Finding",
    "ModelFiles",
    "compare",
    "compare_files",
    "load_model_files",
]

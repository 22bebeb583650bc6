"""Ctrl-C and kill -9: draftfit ends within seconds and leaves no process behind.

The first two tests use real processes but no model (a child `sleep` stands for vLLM's engine
core); the last runs a real `draftfit verify` and interrupts it while its engine starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from faultcases import leaked_shm, shm_segments

REPO = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone_within(pid: int, seconds: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if not _alive(pid):
            return time.monotonic() - start
        time.sleep(0.1)
    return None


def _python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_after_kill_9_the_watchdog_ends_what_draftfit_started():
    proc = _python("""
        import subprocess, sys, time
        from draftfit.engines.watchdog import ensure_watchdog
        ensure_watchdog()
        child = subprocess.Popen(["sleep", "300"])
        print(child.pid, flush=True)
        time.sleep(300)
    """)
    child = int(proc.stdout.readline())
    time.sleep(1.0)  # the watchdog notes descendants twice a second
    proc.kill()
    proc.wait()
    took = _gone_within(child, 8.0)
    assert took is not None, "the child outlived a kill -9 of its parent"
    assert took < 6.0


def test_a_swallowed_ctrl_c_is_relayed_to_the_main_thread():
    # a library that catches the first KeyboardInterrupt and then blocks again (as vLLM's client
    # blocks in a poll for an engine that died of the same Ctrl-C) must not keep draftfit alive
    proc = _python("""
        import select, subprocess, sys, time
        from draftfit.engines.watchdog import relay_interrupts
        relay_interrupts()
        child = subprocess.Popen(["sleep", "300"])
        print(child.pid, flush=True)
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            pass  # swallowed
        try:
            select.select([], [], [], 60)
        except KeyboardInterrupt:
            print("relayed", flush=True)
            sys.exit(130)
    """)
    child = int(proc.stdout.readline())
    time.sleep(1.0)
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "relayed" in out
    assert time.monotonic() - start < 8.0
    assert _gone_within(child, 3.0) is not None


@pytest.mark.slow
def test_ctrl_c_while_verify_starts_its_engine_exits_130_within_seconds(tmp_path):
    pytest.importorskip("vllm")
    results = tmp_path / "results.json"
    results.write_text((REPO / "reports" / "example" / "results.json").read_text())
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    segments = shm_segments()
    proc = subprocess.Popen([sys.executable, "-m", "draftfit", "verify", str(results), "--config", "ngram-2-4:2",
                             "--concurrency", "1", "--requests", "2", "--gpu-memory-utilization", "0.1"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    for line in proc.stderr:  # progress lines; the engine's own output goes to the log file
        if "starting vLLM" in line:
            break
    time.sleep(6.0)  # inside vLLM's start-up: the engine core is being spawned or loads the model
    descendants = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground group
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted — run the same command again to resume" in err
    assert took < 10.0, f"exited {took:.1f} s after Ctrl-C"
    assert all(_gone_within(pid, 6.0) is not None for pid in descendants)
    assert leaked_shm(segments) == []  # the engine's shared memory went with it
    terminal = [line for line in err.splitlines() if line.strip()]
    assert not [line for line in terminal if "Warning" in line or "it/s]" in line or "leaked" in line]

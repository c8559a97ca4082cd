"""A real tracking server behind a fault-injecting proxy: retries, then a clear error and
an unchanged warehouse; never a partial import."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from tests.helpers import REPO, audit_process, table_counts


class FaultProxy:
    """Forwards to the tracking server; ``fault(request_number, path, body)`` picks a fault.

    Faults: None (forward), ("status", code), ("slow", seconds), ("reset",),
    ("truncate",), ("dead_token",), ("answer", status, body) (instead of the server),
    ("rewrite", fn) (the server's JSON answer passed through ``fn``), ("drip", seconds)
    (the server's answer one byte at a time), ("unsized", body) (no Content-Length: the
    body ends when the connection closes).
    """

    def __init__(self, upstream: str, fault):
        self.upstream = urlsplit(upstream)
        self.fault = fault
        self.requests: list[tuple[str, str]] = []
        self.faults_served = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._handle()

            def do_POST(self):
                self._handle()

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                number = len(proxy.requests)
                proxy.requests.append((self.command, self.path))
                fault = proxy.fault(number, self.path, body)
                if fault is not None:
                    proxy.faults_served += 1
                kind = fault[0] if fault else None
                if kind == "reset":
                    # RST instead of a response: the client sees a connection reset
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.connection.close()
                    self.close_connection = True
                    return
                if kind == "status":
                    self._reply(fault[1], b'{"error_code": "TEMPORARILY_UNAVAILABLE"}')
                    return
                if kind == "dead_token" and (b"page_token" in body or "page_token" in self.path):
                    self._reply(
                        400,
                        b'{"error_code": "INVALID_PARAMETER_VALUE", '
                        b'"message": "Invalid page token, could not base64-decode"}',
                    )
                    return
                if kind == "answer":
                    self._reply(fault[1], fault[2])
                    return
                if kind == "unsized":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(fault[1])
                    self.close_connection = True
                    return
                if kind == "slow":
                    time.sleep(fault[1])
                status, payload = proxy.forward(self.command, self.path, body, self.headers)
                if kind == "rewrite":
                    payload = json.dumps(fault[1](json.loads(payload))).encode()
                if kind == "drip":
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    for i in range(len(payload)):
                        self.wfile.write(payload[i : i + 1])
                        self.wfile.flush()
                        time.sleep(fault[1])
                    return
                if kind == "truncate":
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload[: len(payload) // 2])
                    self.wfile.flush()
                    self.connection.close()
                    self.close_connection = True
                    return
                self._reply(status, payload)

            def _reply(self, status: int, payload: bytes):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # A client that gave up on a slow reply leaves a broken pipe: expected, not news
        self.httpd.handle_error = lambda request, address: None
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def forward(self, method: str, path: str, body: bytes, headers) -> tuple[int, bytes]:
        con = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        try:
            con.request(
                method,
                path,
                body=body or None,
                headers={"Content-Type": headers.get("Content-Type", "application/json")},
            )
            response = con.getresponse()
            return response.status, response.read()
        finally:
            con.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def ingest(run_cli, db, config, uri: str):
    return run_cli(
        "--db", str(db), "--config", str(config), "ingest", "mlflow", "--tracking-uri", uri
    )


@pytest.fixture
def sample_week_paged(tmp_path, run_cli):
    """A warehouse holding the sample week, and a config that pages 3 runs at a time, one
    request at a time (so the request a fault hits is the one whose failure is reported)."""
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli(
        "--db", str(db), "ingest", "mlflow", "--tracking-uri", str(REPO / "sample_logs" / "mlruns")
    )
    assert code == 0, err
    config = tmp_path / "audit.toml"
    config.write_text(
        "[mlflow]\npage_size = 3\nhttp_max_retries = 2\nhttp_backoff_seconds = 0.05\n"
        "http_timeout_seconds = 1.0\nhttp_concurrency = 1\n"
    )
    return db, config


def _is_runs_page(path: str, body: bytes) -> bool:
    return "runs/search" in path


def _later_page(path: str, body: bytes) -> bool:
    return "runs/search" in path and b"page_token" in body


PERSISTENT = [
    ("5xx", lambda n, p, b: ("status", 503) if _later_page(p, b) else None, "HTTP 503"),
    ("slow", lambda n, p, b: ("slow", 2.5) if _later_page(p, b) else None, "ReadTimeout"),
    ("reset", lambda n, p, b: ("reset",) if _later_page(p, b) else None, "ConnectionError"),
    (
        "truncated",
        lambda n, p, b: ("truncate",) if _later_page(p, b) else None,
        "truncated or non-JSON response",
    ),
]


@pytest.mark.parametrize(("name", "fault", "problem"), PERSISTENT, ids=[p[0] for p in PERSISTENT])
def test_persistent_fault_mid_pagination_fails_clearly_and_writes_nothing(
    server, sample_week_paged, run_cli, name, fault, problem
):
    db, config = sample_week_paged
    before = table_counts(db)
    with FaultProxy(server["url"], fault) as proxy:
        code, out, err = ingest(run_cli, db, config, proxy.url)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    assert f"runs/search still failing after 3 attempts ({problem})" in err
    assert "nothing was written" in err
    assert proxy.faults_served == 3  # the first try and two retries, then it gave up
    assert table_counts(db) == before


TRANSIENT = [
    ("5xx", ("status", 502)),
    ("429", ("status", 429)),
    ("slow", ("slow", 2.5)),
    ("reset", ("reset",)),
    ("truncated", ("truncate",)),
]


@pytest.mark.parametrize(("name", "fault"), TRANSIENT, ids=[t[0] for t in TRANSIENT])
def test_transient_fault_is_retried_and_the_import_is_complete(
    server, sample_week_paged, run_cli, tmp_path, name, fault
):
    db, config = sample_week_paged
    direct = tmp_path / "direct.duckdb"
    code, _, err = ingest(run_cli, direct, config, server["url"])
    assert code == 0, err
    faulted: set[int] = set()

    def once_per_later_page(n, path, body):
        if _later_page(path, body) and not faulted:
            faulted.add(n)
            return fault
        return None

    before = table_counts(db)
    with FaultProxy(server["url"], once_per_later_page) as proxy:
        code, _out, err = ingest(run_cli, db, config, proxy.url)
    assert code == 0, err
    assert proxy.faults_served == 1
    after, reference = table_counts(db), table_counts(direct)
    assert after["runs"] - before["runs"] == reference["runs"]
    assert after["metrics"] - before["metrics"] == reference["metrics"]
    assert after["import_log"] == before["import_log"] + 1


def test_dead_page_token_is_a_clear_error_not_a_partial_import(server, sample_week_paged, run_cli):
    db, config = sample_week_paged
    before = table_counts(db)
    with FaultProxy(
        server["url"], lambda n, p, b: ("dead_token",) if _is_runs_page(p, b) else None
    ) as proxy:
        code, out, err = ingest(run_cli, db, config, proxy.url)
    assert code == 2, (out, err)
    assert "runs/search failed with HTTP 400 INVALID_PARAMETER_VALUE: Invalid page token" in err
    assert "Traceback" not in err
    assert table_counts(db) == before
    # the first page was served: the failure really came mid-pagination
    assert sum("runs/search" in path for _, path in proxy.requests) == 2


def test_server_gone_for_good_is_exit_2(sample_week_paged, run_cli):
    db, config = sample_week_paged
    before = table_counts(db)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, _, err = ingest(run_cli, db, config, f"http://127.0.0.1:{port}")
    assert code == 2
    assert "still failing after 3 attempts (ConnectionError)" in err
    assert table_counts(db) == before


def _bounded_ingest(db, config, uri: str, limit_s: float = 60):
    """The real command in its own process: a hang fails the test instead of stalling it."""
    process = audit_process(db, "--config", str(config), "ingest", "mlflow", "--tracking-uri", uri)
    started = time.monotonic()
    try:
        out, err = process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"the import was still running after {limit_s} s")
    return process.returncode, out, err, time.monotonic() - started


def test_a_server_sending_one_byte_at_a_time_cannot_hold_the_import(server, sample_week_paged):
    """The socket timeout bounds each read; the deadline bounds the whole answer."""
    db, config = sample_week_paged
    before = table_counts(db)
    drip = lambda n, p, b: ("drip", 0.3) if "experiments/search" in p else None  # noqa: E731
    with FaultProxy(server["url"], drip) as proxy:
        code, _out, err, seconds = _bounded_ingest(db, config, proxy.url)
    assert code == 2, err
    assert (
        "experiments/search still failing after 3 attempts (no complete answer within 1 s)" in err
    )
    assert seconds < 30  # 3 attempts of 1 s (+1 s grace) and the backoff
    assert table_counts(db) == before


def test_a_page_token_that_comes_back_ends_the_paging(server, sample_week_paged):
    db, config = sample_week_paged
    before = table_counts(db)

    first_page: list[bytes] = []

    def same_token(answer):
        first_page.append(json.dumps({**answer, "next_page_token": "page-2"}).encode())
        return json.loads(first_page[0])

    def loop(n, path, body):
        if "runs/search" not in path:
            return None
        if b"page_token" in body and first_page:  # the server itself would refuse the token
            return ("answer", 200, first_page[0])
        return ("rewrite", same_token)

    with FaultProxy(server["url"], loop) as proxy:
        code, _out, err, _seconds = _bounded_ingest(db, config, proxy.url)
    assert code == 2, err
    assert "runs/search returned a page token it had returned before" in err
    assert table_counts(db) == before


@pytest.mark.parametrize("sized", [True, False], ids=["Content-Length", "no Content-Length"])
def test_an_answer_beyond_the_size_cap_is_refused_before_it_fills_memory(
    server, sample_week_paged, tmp_path, sized
):
    db, config = sample_week_paged
    capped = tmp_path / "capped.toml"
    capped.write_text(config.read_text() + "max_response_mb = 1\n")
    before = table_counts(db)
    huge = b'{"experiments": [], "padding": "' + b"x" * (40 << 20) + b'"}'
    fault = ("answer", 200, huge) if sized else ("unsized", huge)
    big = lambda n, p, b: fault if "experiments/search" in p else None  # noqa: E731
    with FaultProxy(server["url"], big) as proxy:
        code, _out, err, _seconds = _bounded_ingest(db, capped, proxy.url)
    assert code == 2, err
    assert "experiments/search answered with more than 1 MB" in err
    assert table_counts(db) == before


def test_server_text_is_shown_with_escapes_visible(server, sample_week_paged, run_cli):
    db, config = sample_week_paged
    message = b'{"error_code": "BAD\\u001b[2J", "message": "gone \\u001b]8;;http://evil\\u0007x\\u001b]8;;\\u0007 \\u009b31m"}'
    bad = lambda n, p, b: ("answer", 400, message) if "experiments/search" in p else None  # noqa: E731
    with FaultProxy(server["url"], bad) as proxy:
        code, _out, err = ingest(run_cli, db, config, proxy.url)
    assert code == 2, err
    assert "\x1b" not in err and "\x07" not in err and "\x9b" not in err
    assert "failed with HTTP 400 BAD\\x1b[2J: gone \\x1b]8;;http://evil\\x07x" in err

"""Real parts around ``audit watch`` in tests: an SMTP server (aiosmtpd), a webhook
receiver and a dcgm-exporter-format endpoint (plain ``http.server``), and the watch itself
as a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.helpers import free_port


@dataclass
class Inbox:
    mails: list[dict] = field(default_factory=list)  # {"to": [...], "subject": ..., "body": ...}
    hooks: list[dict] = field(default_factory=list)  # apprise json:// payloads
    lock: threading.Lock = field(default_factory=threading.Lock)

    def subjects(self, to: str | None = None) -> list[str]:
        with self.lock:
            return [m["subject"] for m in self.mails if to is None or to in m["to"]]

    def titles(self) -> list[str]:
        with self.lock:
            return [h["title"] for h in self.hooks]


@contextmanager
def smtp_server(inbox: Inbox):
    from aiosmtpd.controller import Controller

    class Handler:
        async def handle_DATA(self, server, session, envelope):
            message = message_from_bytes(envelope.content)
            parts = [p for p in message.walk() if p.get_content_type() == "text/plain"]
            body = parts[0].get_payload(decode=True).decode() if parts else ""
            with inbox.lock:
                inbox.mails.append(
                    {"to": list(envelope.rcpt_tos), "subject": message["Subject"], "body": body}
                )
            return "250 OK"

    controller = Controller(Handler(), hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield controller.port
    finally:
        controller.stop()


@contextmanager
def http_server(handler_class):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def webhook_receiver(inbox: Inbox):
    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            payload = json.loads(self.rfile.read(length))
            with inbox.lock:
                inbox.hooks.append(payload)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    with http_server(Hook) as port:
        yield f"json://127.0.0.1:{port}/hook"


class Exporter:
    """What a dcgm-exporter on ``host`` would serve: each GPU's utilisation, settable; a
    GPU set to None is not served (its telemetry stopped)."""

    def __init__(self, host: str, gpus: int = 8):
        self.host = host
        self.util: dict[int, float | None] = dict.fromkeys(range(gpus), 0.0)
        self.lock = threading.Lock()

    def text(self) -> str:
        lines = [
            "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        ]
        with self.lock:
            served = {g: u for g, u in self.util.items() if u is not None}
        for gpu, util in sorted(served.items()):
            labels = (
                f'gpu="{gpu}",UUID="GPU-{gpu:08d}",device="nvidia{gpu}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{self.host}"'
            )
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util:g}")
            lines.append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {1024 if util else 0}")
        return "\n".join(lines) + "\n"

    def set(self, gpus, util: float | None) -> None:
        with self.lock:
            for gpu in gpus:
                self.util[int(gpu)] = util


@contextmanager
def exporter_endpoint(exporter: Exporter):
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            body = exporter.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with http_server(Metrics) as port:
        yield f"http://127.0.0.1:{port}/metrics"


def job_gpus(cluster, job_id: str) -> list[int]:
    """The GPU indices Slurm gave a running job (``scontrol -d show job``: GRES=gpu(IDX:0-1))."""
    out = cluster.run("scontrol", "-d", "show", "job", job_id)
    detail = out.split("(IDX:", 1)[1].split(")", 1)[0]
    indices = []
    for part in detail.split(","):
        low, _, high = part.partition("-")
        indices.extend(range(int(low), int(high or low) + 1))
    return indices


class WatchProcess:
    """``audit watch`` in its own process, its output in a file."""

    def __init__(self, db: Path, config: Path, env: dict, *args: str, log: Path):
        self.log = log
        handle = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "audit",
                "--db",
                str(db),
                "--config",
                str(config),
                "watch",
                *args,
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**env, "AUDIT_LOCK_TIMEOUT": "60"},
            start_new_session=True,
        )
        handle.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout=timeout)


def wait_for(predicate, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")
        time.sleep(0.2)

"""Import from a real tracking server (issue 18): ``mlflow server`` over a copy of the
bench's SQLite store on 127.0.0.1, read by ``audit ingest mlflow --tracking-uri http://…``
in a fresh process, metric histories included."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def mlflow_server(store: Path, workdir: Path) -> Iterator[str]:
    """A real ``mlflow server`` on a copy of ``store`` (the server may migrate its schema);
    yields its URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    backend = workdir / "server.db"
    shutil.copyfile(store, backend)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = open(workdir / "server.log", "w")  # noqa: SIM115 - closed in finally
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri"]
    command += [f"sqlite:///{backend}", "--default-artifact-root", str(workdir / "artifacts")]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "2"]
    # uvicorn restarts a worker that does not answer its supervisor within 5 s; on a busy
    # machine a worker still importing MLflow misses that, and the server never comes up
    command += ["--uvicorn-opts", "--timeout-worker-healthcheck 120"]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # a large store's schema check takes a while
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"mlflow server exited:\n{(workdir / 'server.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("mlflow server did not answer /health within 300 s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        backend.unlink(missing_ok=True)
        for suffix in ("-wal", "-shm"):
            Path(f"{backend}{suffix}").unlink(missing_ok=True)


def server_cores_note() -> str:
    return f"server (2 workers) and importer share the machine's {os.cpu_count()} cores"

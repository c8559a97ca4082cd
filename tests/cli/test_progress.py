"""A progress bar on a terminal; nothing but the summary line otherwise."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from tests.helpers import REPO

SAMPLE = REPO / "sample_logs" / "mlruns"


def test_progress_bar_on_a_terminal(tmp_path):
    main, secondary = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "audit",
            "--db",
            str(tmp_path / "w.duckdb"),
            "ingest",
            "mlflow",
            "--tracking-uri",
            str(SAMPLE),
        ],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "100"},
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait()
    os.close(main)
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0, screen
    assert "importing runs" in screen
    assert "20/20" in screen
    assert "imported 20 new or changed runs" in screen


def test_no_progress_output_when_piped(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "audit",
            "--db",
            str(tmp_path / "w.duckdb"),
            "ingest",
            "mlflow",
            "--tracking-uri",
            str(SAMPLE),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0
    assert result.stderr == ""
    assert result.stdout.count("\n") == 1
    assert result.stdout.startswith("imported 20 new or changed runs (0 unchanged)")

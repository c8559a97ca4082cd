"""CI runs the benchmark harness at size S as a smoke test: every step runs and reports,
audit and MLflow agree on every search; no timing is asserted (timings live in
bench/results/, measured on purpose, not in CI's noise)."""

from __future__ import annotations

import re
import resource
import subprocess
import sys

from bench.__main__ import machine_cpu
from tests.helpers import REPO


def test_bench_size_s_runs_every_step(tmp_path):
    results = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--size",
            "S",
            "--reps",
            "1",
            "--cache",
            str(tmp_path / "cache"),
            "--results",
            str(results),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    for step in (
        "MLflow full import",
        "MLflow full import peak RSS",
        "incremental import (+10 runs, 1 %)",
        "unchanged re-import",
        "tracking-server import (with metric histories)",
        "tracking-server unchanged re-import",
        "telemetry import (115,200 rows)",
        "telemetry import peak RSS",
        "sacct import",
        "checkpoint inventory",
        "`audit scan` (all history)",
        "`audit scan` peak RSS",
        "`runs search` median latency",
        "speed-up over mlflow.search_runs",
        "weekly report, first render (HTML)",
        "weekly report, later renders (HTML)",
    ):
        assert f"| {step} |" in table, step
    assert re.search(r"on \d+ cores", table)
    # what the rest of the machine did, for every step timed as a command
    assert re.search(r"\| `audit scan` \(all history\) \|.*\| \d+\.\d\d / \d+\.\d\d \|", table)
    written = list(results.glob("*.md"))
    assert len(written) == 1 and "## Size S:" in written[0].read_text()
    # search rows: audit and MLflow found the same runs for each of the five filters
    counts = re.findall(r"\| (\d+) / (\d+) \|", table)
    assert len(counts) == 5 and all(a == b for a, b in counts)


def test_machine_cpu_counts_what_other_processes_burn():
    """Two processes busy for 0.6 s of CPU each (both cores): the machine's busy seconds
    grow by at least what they used, and /proc/stat's idle field would not."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = machine_cpu()
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(2)]
    for burner in burners:
        burner.wait(timeout=60)
    after = machine_cpu()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (children.ru_utime + children.ru_stime) - (
        children_before.ru_utime + children_before.ru_stime
    )
    assert used >= 1.2
    assert after[0] - before[0] >= 0.9 * used
    assert after[1] >= before[1]

"""More than ten jobs without telemetry for one reason are one note ("23 jobs: <reason>;
for example …"): the weekly report counts notes, not subjects, and shows the note's count."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import SAMPLE

_HEADER = (
    "JobID|JobName|User|Account|Partition|State|Submit|Eligible|Start|End|ElapsedRaw|"
    "TimelimitRaw|NNodes|NCPUS|NodeList|AllocTRES|ReqTRES|TRESUsageInMax"
)
_TRES = "billing=16,cpu=16,gres/gpu:h100=2,gres/gpu=2,mem=100G,node=1"


def test_the_weekly_report_shows_a_grouped_note_with_its_count(tmp_path):
    lines = [_HEADER]
    for i in range(23):  # 23 two-GPU jobs on hosts without telemetry
        start = 10 + i % 10
        lines.append(
            f"{4800000 + i}|job-{i}|bob|coder|gpu|COMPLETED|2026-11-17T09:00:00|"
            f"2026-11-17T09:00:00|2026-11-17T{start:02d}:00:00|2026-11-17T{start + 3:02d}:00:00|"
            f"10800|300|1|16|gpu-z{i % 3:02d}|{_TRES}|billing=16,cpu=16,gres/gpu=2|"
        )
    sacct = tmp_path / "jobs.sacct"
    sacct.write_text("\n".join(lines) + "\n")
    db = tmp_path / "w.duckdb"
    base = [sys.executable, "-m", "audit", "--db", str(db)]
    env = {"AUDIT_NOW": "2026-11-23T00:00:00"}
    for args in (
        ["ingest", "slurm", str(sacct)],
        ["ingest", "gpu", str(SAMPLE / "gpu" / "gpu-h01.csv")],  # telemetry elsewhere
        ["report", "weekly", "--week", "2026-W47", "--output", str(tmp_path / "w.html")],
    ):
        subprocess.run(
            [*base, *args], check=True, capture_output=True, cwd=tmp_path, env={**os.environ, **env}
        )
    html = (tmp_path / "w.html").read_text()
    assert "23 jobs: no GPU usage evidence" in html
    assert "[1 note on subjects not judged: 23 jobs: no GPU usage evidence" in html

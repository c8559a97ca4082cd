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


def _warehouse(tmp_path, *commands: list[str]) -> list[str]:
    """23 two-GPU jobs on hosts without telemetry (telemetry of another host), then
    ``commands``; their outputs."""
    lines = [_HEADER]
    for i in range(23):
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
    outputs = []
    for args in (
        ["ingest", "slurm", str(sacct)],
        ["ingest", "gpu", str(SAMPLE / "gpu" / "gpu-h01.csv")],
        *commands,
    ):
        done = subprocess.run(
            [*base, *args],
            check=True,
            capture_output=True,
            cwd=tmp_path,
            env={**os.environ, **env},
            text=True,
        )
        outputs.append(done.stdout)
    return outputs[2:]


def test_the_weekly_report_shows_a_grouped_note_with_its_count(tmp_path):
    _warehouse(
        tmp_path, ["report", "weekly", "--week", "2026-W47", "--output", str(tmp_path / "w.html")]
    )
    html = (tmp_path / "w.html").read_text()
    assert "23 jobs: no GPU usage evidence" in html
    assert "[1 note on subjects not judged: 23 jobs: no GPU usage evidence" in html


def test_the_markdown_scan_lists_the_notes_and_the_rules_not_run(tmp_path):
    """--format md (a pull-request comment) says what was not judged, as the table does."""
    (markdown,) = _warehouse(tmp_path, ["scan", "--select", "OVP001,DUP001", "--format", "md"])
    tail = markdown[markdown.index("Rules not run:") :]
    assert tail == (
        "Rules not run:\n\n"
        "- DUP001 skipped: no runs imported; no run params imported\n\n"
        "<details><summary>1 note on subjects that could not be judged</summary>\n\n"
        "- OVP001: 23 jobs: no GPU usage evidence: no telemetry for their hosts, no tracker "
        "system metrics, no jobstats summary, no sacct gres/gpuutil; for example job 4800000 (gpu-z00), job 4800010 (gpu-z01), job 4800020 (gpu-z02), "
        "job 4800001 (gpu-z01), job 4800011 (gpu-z02) and 18 more\n\n"
        "</details>\n"
    )

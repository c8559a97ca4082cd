"""What ``Facts.load`` keeps in memory: per job only the jobs columns rules read, and one
string object per distinct text. Both are what keeps a scan of 1 M jobs under 8 GB."""

from __future__ import annotations

import re
from pathlib import Path

from audit.costs import JOB_EXTRA_COLUMNS, Facts
from audit.testing import at, build_warehouse

ROOT = Path(__file__).resolve().parents[1]
# job.extra.get("eligible_time"), job.extra["admin_comment"]
EXTRA_READ = re.compile(r"\.extra(?:\.get\(|\[)\s*[\"']([A-Za-z_]+)[\"']")


def test_the_jobs_columns_kept_are_the_ones_read():
    sources = [*(ROOT / "audit").rglob("*.py"), *(ROOT / "rules").rglob("*.py")]
    read = {name for path in sources for name in EXTRA_READ.findall(path.read_text())}
    # a column read but not kept would be None for every job, silently
    assert sorted(read - set(JOB_EXTRA_COLUMNS)) == []
    # a column kept but never read costs memory per job for nothing
    assert sorted(set(JOB_EXTRA_COLUMNS) - read) == []


def test_jobs_keep_their_read_columns_and_runs_share_their_texts(tmp_path):
    data = {
        "runs": [
            {"run_id": f"r{i}", "experiment": "sweep", "tags": {"team": "agents"}} for i in range(3)
        ],
        "jobs": [
            {
                "job_id": 7,
                "account": "agents",
                "submit": 0,
                "eligible": 1,
                "start": 2,
                "end": 5,
                "max_gpu_util_pct": 41.5,
                "max_gpu_mem_bytes": 123,
                "admin_comment": "JS1:x",
            },
            {"job_id": 8, "account": "agents", "start": 2, "end": 5},
        ],
    }
    wh, config = build_warehouse(tmp_path / "w.duckdb", data)
    try:
        facts = Facts.load(wh.con, config)
    finally:
        wh.close()
    assert facts.job("default", "7").extra == {
        "eligible_time": at(1),
        "max_gpu_util_pct": 41.5,
        "max_gpu_mem_bytes": 123,
        "admin_comment": "JS1:x",
    }
    assert facts.job("default", "8").extra == dict.fromkeys(JOB_EXTRA_COLUMNS)
    first, *others = facts.runs
    for other in others:
        for name in ("source_id", "experiment", "status", "user_id", "team"):
            assert getattr(other, name) is getattr(first, name), name
    # the account a job's team came from and its runs' team are one object too
    assert facts.job("default", "7").team is first.team

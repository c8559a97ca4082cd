"""The controller's job list in every layout from Slurm 22.05 to 25.11, the files the
watch follows, and its configuration (no Slurm needed: tests/cli/test_watch_slurm.py runs
the real one).

22.05's document is what Debian's 22.05.8 answered in tests/slurm_cluster.py. The later
layouts are that document rewritten after SchedMD's ``PARSER_ARRAY(JOB_INFO)`` of each
data_parser: v0.0.39 (23.02) writes counts and limits as ``{"set", "infinite",
"number"}``, v0.0.40 to v0.0.44 (23.11 to 25.11) the times too, and the state as a list.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from audit.config import load_config
from audit.errors import InputError
from audit.importers.live import follow_files
from audit.importers.slurm import read_live_jobs
from audit.warehouse import open_warehouse

LIVE = Path(__file__).parents[1] / "data" / "slurm" / "live"
UTC = ZoneInfo("UTC")
TIMES = ("start_time", "end_time", "submit_time", "eligible_time")
NO_VAL_NUMBERS = (
    "time_limit",
    "array_task_id",
    "node_count",
    "cpus",
    "het_job_offset",
    "array_job_id",
    "het_job_id",
)


def squeue_2205() -> dict:
    return json.loads((LIVE / "squeue-22.05.json").read_text())


def number(value):
    if value is None:
        return {"set": False, "infinite": False, "number": 0}
    return {"set": True, "infinite": False, "number": value}


def rewritten(version: int) -> dict:
    """22.05's answer as data_parser v0.0.``version`` writes it."""
    document = copy.deepcopy(squeue_2205())
    document["meta"] = {
        "plugin": {"type": "", "name": "", "data_parser": f"data_parser/v0.0.{version}"}
    }
    for job in document["jobs"]:
        for key in NO_VAL_NUMBERS:
            if key in job:
                job[key] = number(job[key])
        if version >= 40:
            for key in TIMES:
                job[key] = number(job[key])
            job["job_state"] = [job["job_state"]]
        if version >= 44:
            job["job_id"] = job["job_id"]  # step_id.job_id, same key
    return document


def rows(document) -> list[dict]:
    live = read_live_jobs(document, "squeue --json", UTC, "default", datetime(2026, 12, 4, 12, 30))
    jobs = live.jobs.select(
        "job_id", "state", "start_time", "end_time", "gpus", "partition", "user_name"
    )
    return [jobs.to_dicts(), sorted(live.gpus.rows()), sorted(live.holding), live.layout]


def test_debian_2205_answer():
    jobs, gpus, holding, layout = rows(squeue_2205())
    assert layout == "openapi/v0.0.38"
    by_id = {j["job_id"]: j for j in jobs}
    assert by_id["1"]["state"] == "RUNNING" and by_id["1"]["gpus"] == 2
    # a running job ends when it was seen, not at the controller's forecast a year ahead
    assert by_id["1"]["end_time"] == datetime(2026, 12, 4, 12, 30)
    assert by_id["2"]["state"] == "COMPLETED" and by_id["2"]["end_time"] < datetime(
        2026, 12, 4, 12, 30
    )
    assert holding == ["1"]
    assert [g for g in gpus if g[1] == "1"] == [
        ("default", "1", "vm", "0"),
        ("default", "1", "vm", "1"),
    ]


@pytest.mark.parametrize("version", [39, 40, 41, 42, 43, 44])
def test_later_layouts_read_the_same(version):
    expected = rows(squeue_2205())
    got = rows(rewritten(version))
    assert got[:3] == expected[:3]
    assert got[3] == f"data_parser/v0.0.{version}"


def test_gres_detail_forms():
    job = squeue_2205()["jobs"][0]
    document = {"jobs": []}
    for job_id, nodes, detail in [
        (11, "vm", ["gpu:a100:3(IDX:0-1,4)"]),
        (12, "n[1-2]", ["gpu:2(IDX:6-7)", "gpu:2(IDX:0,2)"]),
        (13, "vm", ["gpu:a100:1(IDX:3),gpu:v100:1(IDX:5)"]),
        (14, "vm", ["gpu(CNT:2)"]),
        (15, "vm", ["gpu:1(IDX:N/A)"]),
    ]:
        document["jobs"].append({**job, "job_id": job_id, "nodes": nodes, "gres_detail": detail})
    live = read_live_jobs(document, "squeue --json", UTC, "c", datetime(2026, 12, 4, 12, 30))
    by_job: dict[str, list] = {}
    for _, job_id, host, gpu in live.gpus.rows():
        by_job.setdefault(job_id, []).append((host, gpu))
    assert by_job["11"] == [("vm", "0"), ("vm", "1"), ("vm", "4")]
    assert by_job["12"] == [("n1", "6"), ("n1", "7"), ("n2", "0"), ("n2", "2")]
    assert by_job["13"] == [("vm", "3"), ("vm", "5")]
    assert "14" not in by_job and "15" not in by_job  # no indices: never guessed


def test_an_unreachable_controller_is_no_answer():
    """22.05's squeue exits 0 with this when it cannot reach slurmctld (seen in the tests)."""
    document = {
        **squeue_2205(),
        "jobs": [],
        "errors": [{"description": "Failed while loading jobs"}],
    }
    with pytest.raises(InputError, match="Slurm reported an error: Failed while loading jobs"):
        read_live_jobs(document, "squeue --json", UTC, "default")


def test_a_bad_field_names_the_job():
    document = squeue_2205()
    document["jobs"][1]["gres_detail"] = "gpu:1"
    with pytest.raises(InputError, match=r"jobs\[1\] \(job 2\): gres_detail: expected a list"):
        read_live_jobs(document, "squeue --json", UTC, "default")


def test_following_an_appended_log(tmp_path):
    log = tmp_path / "gpu-a01.csv"
    header = "timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n"
    lines = [
        f"2026/12/04 12:{m:02d}:00.000, {g}, {m % 3 * 10} %, 10 MiB, 80000 MiB\n"
        for m in range(3)
        for g in range(2)
    ]
    log.write_text(header + "".join(lines[:4]) + lines[4][:12])  # the last line still being written
    config = load_config(None)
    with open_warehouse(tmp_path / "a.duckdb") as wh:
        assert follow_files(wh, [log], config).rows_written == 4
        with open(log, "a") as fh:
            fh.write(lines[4][12:] + lines[5])
        assert follow_files(wh, [log], config).rows_written == 2
        assert follow_files(wh, [log], config).rows_written == 0
        # rotated: a new file under the same name is read from its start
        log.write_text(
            header.replace("memory.total", "memory.total") + lines[0].replace("12:00", "13:00")
        )
        assert follow_files(wh, [log], config).rows_written == 1
        hosts = wh.con.execute("SELECT DISTINCT host FROM gpu_samples").fetchall()
        assert hosts == [("gpu-a01",)]


def test_config_errors_name_the_key(tmp_path, run_cli):
    config = tmp_path / "audit.toml"
    config.write_text('[watch.policy.idle]\nkind = "idle"\nwarn_afte = "1h"\n')
    code, _out, err = run_cli(
        "--config", str(config), "--db", str(tmp_path / "a.duckdb"), "watch", "--once"
    )
    assert code == 2 and "unknown key 'warn_afte' in [watch.policy.idle]" in err
    config.write_text('[watch.policy.idle]\nkind = "sleepy"\n')
    code, _out, err = run_cli("--config", str(config), "watch", "--once")
    assert code == 2 and "kind must be one of idle, unstable, red_line, duplicate_launch" in err
    config.write_text('[watch]\ninterval = "soon"\n')
    code, _out, err = run_cli("--config", str(config), "watch", "--once")
    assert code == 2 and "[watch] interval must be a duration like '30m'" in err
    config.write_text("[watch]\n")
    code, _out, err = run_cli("--config", str(config), "watch", "--once")
    assert code == 2 and "no [watch.policy.NAME]" in err
    assert not (tmp_path / "a.duckdb").exists()

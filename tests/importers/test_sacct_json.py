"""``sacct --json`` (issue 19): every data_parser layout gives the warehouse ``sacct -P`` gives.

tests/data/slurm/sacct-v0.0.40.json is the layout of Slurm 23.11 (data_parser v0.0.40);
the other layouts are derived from it the way Slurm's dumps differ (checked against
Slurm's data_parser sources and committed outputs of Slurm 21.08, 22.05, 23.02, 23.11,
24.05-25.11): v0.0.41+ add step limits and I/O paths and may give a start that never
happened as 4294967294 (Slurm's NO_VAL); up to v0.0.39 ``state.current`` is
one word and step times plain numbers;
v0.0.39 gives ``step.id`` as {"job_id", "step_id"}; v0.0.37/38 give time limits, array
task ids and het offsets as plain numbers (null when unset), empty texts as null and
``step.job_id`` beside ``step.id``. tests/data/slurm/sacct-P.txt holds the same jobs as
``sacct -P`` prints them in Europe/Berlin.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime

import duckdb
import pytest

from tests.helpers import REPO

DATA = REPO / "tests" / "data" / "slurm"
JSON_FILE = DATA / "sacct-v0.0.40.json"
PARSABLE = DATA / "sacct-P.txt"
LAYOUTS = ["v0.0.37", "v0.0.38", "v0.0.39", "v0.0.40", "v0.0.43"]


def layout(version: str) -> dict:
    doc = json.loads(JSON_FILE.read_text())
    doc = copy.deepcopy(doc)
    old = version in ("v0.0.37", "v0.0.38")
    doc["meta"] = {"plugin": {"data_parser": f"data_parser/{version}"}}
    for job in doc["jobs"]:
        if version <= "v0.0.39":
            job["state"]["current"] = job["state"]["current"][0]
        if version >= "v0.0.41":
            job.update(qosreq="", restart_cnt=0, segment_size=0, stdout_expanded="")
            if not job["time"]["start"]:  # Slurm 25.11: never started is NO_VAL, not 0
                job["time"]["start"] = 4294967294
        for step in job["steps"]:
            name = step["step"]["id"].split(".", 1)[1]
            if version == "v0.0.39":
                step["step"]["id"] = {"job_id": job["job_id"], "step_id": name}
            if old:
                step["step"] = {"job_id": job["job_id"], "het": {"component": None}, "id": name}
            if version >= "v0.0.41":  # Slurm 24.05+: a step limit and its I/O paths
                step["time"]["limit"] = {"set": False, "infinite": True, "number": 0}
                step["step"].update(stderr="", stdin="", stdout="", stdout_expanded="")
            if version <= "v0.0.39":
                for key in ("start", "end"):
                    step["time"][key] = step["time"][key]["number"]
                step["state"] = step["state"][0]
        if old:
            limit = job["time"]["limit"]
            job["time"]["limit"] = 4294967295 if limit["infinite"] else limit["number"]
            task = job["array"]["task_id"]
            job["array"]["task_id"] = task["number"] if task["set"] else None
            job["array"]["task"] = job["array"]["task"] or None
            offset = job["het"]["job_offset"]
            job["het"]["job_offset"] = offset["number"] if offset["set"] else None
            job["comment"] = {k: v or None for k, v in job["comment"].items()}
            job["required"] = {"CPUs": job["required"]["CPUs"]}
            for item in job["tres"]["allocated"] + job["tres"]["requested"]:
                item["name"] = item["name"] or None
    return doc


@pytest.fixture
def berlin(tmp_path):
    config = tmp_path / "audit.toml"
    config.write_text('[cluster]\ntimezone = "Europe/Berlin"\n')
    return config


def jobs_and_nodes(db) -> tuple[list[dict], list[tuple]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cursor = con.execute(
            "SELECT * EXCLUDE (source_file, imported_at) FROM jobs ORDER BY cluster, job_id"
        )
        names = [d[0] for d in cursor.description]
        jobs = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        nodes = con.execute("SELECT * FROM job_nodes ORDER BY ALL").fetchall()
        return jobs, nodes
    finally:
        con.close()


@pytest.fixture
def parsable_warehouse(tmp_path, run_cli, berlin):
    db = tmp_path / "parsable.duckdb"
    code, out, err = run_cli(
        "--db",
        str(db),
        "--config",
        str(berlin),
        "ingest",
        "slurm",
        "--cluster",
        "hpc",
        str(PARSABLE),
    )
    assert code == 0, err
    assert out.startswith("imported 8 jobs from 1 file (13 lines read)")
    return jobs_and_nodes(db)


@pytest.mark.parametrize("version", LAYOUTS)
def test_json_and_parsable_give_the_same_warehouse(
    tmp_path, run_cli, berlin, parsable_warehouse, version
):
    path = tmp_path / f"sacct-{version}.json"
    path.write_text(json.dumps(layout(version), indent=1))
    db = tmp_path / "json.duckdb"
    code, out, err = run_cli(
        "--db", str(db), "--config", str(berlin), "ingest", "slurm", "--cluster", "hpc", str(path)
    )
    assert code == 0, err
    assert out.startswith("imported 8 jobs from 1 file")
    jobs, nodes = jobs_and_nodes(db)
    expected_jobs, expected_nodes = parsable_warehouse
    assert nodes == expected_nodes
    # sacct -P names who cancelled a job ("CANCELLED by 1001"); the JSON has no uid.
    assert [j.pop("state_detail") for j in jobs] == [
        "CANCELLED" if j["job_id"] == "4008" else j["state_detail"] for j in expected_jobs
    ]
    assert jobs == [{k: v for k, v in j.items() if k != "state_detail"} for j in expected_jobs]


def test_what_the_json_gives(parsable_warehouse):
    jobs, nodes = parsable_warehouse
    by_id = {j["job_id"]: j for j in jobs}
    assert sorted(by_id) == ["4001", "4002_3", "4003", "4004", "4005", "4006+0", "4006+1", "4008"]
    sft = by_id["4001"]
    assert (sft["gpus"], sft["gpu_type"], sft["req_gpus"], sft["steps"]) == (2, "a100", 2, 3)
    assert sft["eligible_time"] == datetime(2026, 11, 16, 8, 0)  # 09:00 in Berlin
    assert sft["start_time"] == datetime(2026, 11, 16, 8, 5, 30)
    assert (sft["max_gpu_util_pct"], sft["ave_gpu_util_pct"]) == (99.0, 83.0)
    assert (sft["max_gpu_mem_bytes"], sft["ave_gpu_mem_bytes"]) == (60 * 2**30, 48 * 2**30)
    assert sft["max_rss_bytes"] == 12 * 2**30
    assert sft["req_mem_bytes"] == 128 * 2**30
    assert sft["admin_comment"].startswith("JS1:H4sI")
    assert by_id["4002_3"]["array_job_id"] == "4002"
    running = by_id["4003"]
    assert running["timelimit_s"] is None and running["elapsed_s"] == 600
    assert running["end_time"] == datetime(2026, 11, 16, 11, 10)  # start + elapsed so far
    pending = by_id["4004"]
    assert (pending["start_time"], pending["end_time"], pending["eligible_time"]) == (
        None,
        None,
        datetime(2026, 11, 16, 11, 30),
    )
    assert by_id["4005"]["timelimit_s"] == 3600
    assert [h for _, j, h in nodes if j == "4005"] == ["gpu-c01", "gpu-c02"]


def test_queue_wait_from_eligible(parsable_warehouse):
    jobs, _ = parsable_warehouse
    waits = {
        j["job_id"]: (j["start_time"] - j["eligible_time"]).total_seconds()
        for j in jobs
        if j["start_time"] and j["eligible_time"]
    }
    assert waits["4005"] == 50  # eligible 06:59:10, started 07:00:00 (Berlin)
    assert waits["4001"] == 330


BAD_FIELDS = [
    # (where, new value, what the message says)
    ("job_id", "4001", "job_id: expected a whole number, got text '4001'"),
    ("job_id", None, "job_id: expected a job number, got null"),
    ("name", ["sft"], "name: expected text, got a list"),
    ("user", 7, "user: expected text, got a number 7"),
    ("nodes", {"range": "gpu-a01"}, "nodes: expected text, got an object"),
    ("state", ["COMPLETED"], "state: expected an object, got a list"),
    ("state.current", [1], "state.current: expected a job state like COMPLETED, got a number 1"),
    ("state.current", "completed; DROP TABLE jobs", "state.current: expected a job state"),
    ("time", 7200, "time: expected an object, got a number 7200"),
    ("time.start", "2026-11-16T08:05:30", "time.start: expected a whole number, got text"),
    ("time.start", 1.5, "time.start: expected a whole number, got a number 1.5"),
    ("time.start", -5, "time.start: -5 is out of range"),
    ("time.start", 10**30, "is out of range"),
    ("time.start", 99_999_999_999, "Start: time '5138-11-16T09:46:39+00:00' is out of range"),
    ("time.end", 1, "End 1970-01-01T00:00:01+00:00 is before Start 2026-11-16T08:05:30+00:00"),
    ("time.elapsed", True, "time.elapsed: expected a whole number, got true/false True"),
    ("time.elapsed", 2**40, "ElapsedRaw: 1099511627776 is out of range"),
    (
        "time.limit",
        {"set": "yes", "infinite": False, "number": 1},
        "time.limit: expected set/infinite",
    ),
    (
        "time.limit",
        {"set": True, "infinite": False, "number": "60"},
        "time.limit: expected a whole number",
    ),
    ("allocation_nodes", 99_999_999_999, "NNodes: 99999999999 is out of range"),
    ("tres", [], "tres: expected an object, got a list"),
    ("tres.allocated", {"gpu": 2}, "tres.allocated: expected a list of TRES, got an object"),
    (
        "tres.allocated",
        [["gres", "gpu", 2]],
        "tres.allocated[0]: expected a TRES object, got a list",
    ),
    (
        "tres.allocated",
        [{"type": "gres", "name": "gpu", "count": "2"}],
        "tres.allocated[0].count: expected a whole number",
    ),
    (
        "tres.allocated",
        [{"type": "gres", "name": "gpu", "count": 2**62}],
        "gres/gpu: 4611686018427387904 is out of range",
    ),
    ("tres.allocated", [{"type": "gres=x", "name": "gpu", "count": 2}], "tres.allocated[0].type"),
    ("tres.allocated", [{"type": "gres", "name": 5, "count": 2}], "tres.allocated[0].name"),
    ("comment.administrator", {"JS1": "x"}, "comment.administrator: expected text, got an object"),
    ("comment.administrator", "\ud800", "comment.administrator: text holds an invalid character"),
    (
        "array.job_id",
        {"set": True, "infinite": True, "number": 0},
        "array.job_id: expected a number, got infinite",
    ),
    ("het.job_offset", "0", "het.job_offset: expected a whole number"),
    ("steps", {"batch": {}}, "steps: expected a list, got an object"),
    ("steps", [17], "steps[0]: expected a step object, got a number 17"),
    ("steps", [{"step": {"id": None}}], "steps[0].step.id: expected a step id, got null"),
    (
        "steps",
        [
            {
                "step": {"id": "4001.batch"},
                "tres": {"requested": {"max": [{"type": "gres", "name": "gpumem", "count": -1.5}]}},
            }
        ],
        "steps[0].tres.requested.max[0].count: expected a whole number",
    ),
    (
        "steps",
        [
            {
                "step": {"id": "4001.0"},
                "tres": {
                    "requested": {"max": [{"type": "gres", "name": "gpuutil", "count": 2**40}]}
                },
            }
        ],
        "gres/gpuutil: 1099511627776 is out of range",
    ),
    (
        "steps",
        [{"step": {"id": "4001.0"}, "tres": {"requested": {"average": "gres/gpuutil=5"}}}],
        "steps[0].tres.requested.average: expected a list of TRES, got text",
    ),
    ("nodes", "n[0-99999][0-99999]", "names 10,000,000,000 hosts"),
]


def _set(job: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        job = job[key]
    job[last] = value


@pytest.mark.parametrize(
    ("field", "value", "message"), BAD_FIELDS, ids=[f"{f}={v!r}"[:60] for f, v, _ in BAD_FIELDS]
)
def test_wrong_types_and_ranges_in_json_are_input_errors(tmp_path, run_cli, field, value, message):
    doc = layout("v0.0.40")
    _set(doc["jobs"][0], field, value)
    path = tmp_path / "sacct.json"
    path.write_text(json.dumps(doc))
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "slurm", str(path))
    assert code == 2, (out, err)
    label = f"{path}: jobs[0] (job 4001): " if field != "job_id" else f"{path}: jobs[0]"
    assert err.startswith(f"Error: {label}"), err
    assert message in err
    # --skip-bad imports the other seven jobs and names the bad one
    code, out, err = run_cli("--db", str(db), "ingest", "slurm", "--skip-bad", str(path))
    assert code == 0, err
    assert out.startswith("imported 7 jobs")
    assert f"skipped: {path}: jobs[0]" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", 'expected sacct --json output, an object with a list of "jobs"'),
        ('{"jobs": {"4001": {}}}', 'an object with a list of "jobs"'),
        ('{"jobs": [7]}', "jobs[0]: expected a job object, got a number 7"),
        ('{"jobs": [{"job_id": NaN}]}', "NaN is not JSON"),
        ('{"jobs": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"jobs": [', "invalid JSON"),
    ],
)
def test_json_of_the_wrong_shape(tmp_path, run_cli, content, message):
    path = tmp_path / "sacct.json"
    path.write_text(content)
    code, _, err = run_cli("--db", str(tmp_path / "w.duckdb"), "ingest", "slurm", str(path))
    assert code == 2
    assert err.startswith(f"Error: {path}")
    assert message in err
    assert "Traceback" not in err

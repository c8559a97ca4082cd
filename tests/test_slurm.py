"""Slurm accounting: real files, the formats sites emit, bad lines."""

from __future__ import annotations

from zoneinfo import ZoneInfo

import duckdb
import pytest

from audit.errors import InputError
from audit.importers.slurm import (
    gpus_from_tres,
    parse_duration,
    parse_hostlist,
    parse_memory,
    parse_tres,
    read_sacct,
)
from tests.helpers import SHARED

REAL = SHARED / "slurm" / "hb-jobinfo_sacct.txt"
REAL_FIELDS = (
    "JobID,JobName,User,Partition,NodeList,NNodes,NCPUs,NTasks,State,Submit,Start,End,Timelimit,Elapsed,"
    "TotalCPU,CPUTime,UserCPU,SystemCPU,ReqMem,MaxRSS,MaxVMSize,ReqTRES,AllocTRES,TRESUsageInMax,"
    "TRESUsageInTot,TRESUsageOutTot,MaxDiskRead,MaxDiskWrite,MaxRSSNode,MaxRSSTask,MaxVMSizeNode,"
    "MaxVMSizeTask,MaxDiskReadNode,MaxDiskReadTask,MaxDiskWriteNode,MaxDiskWriteTask,Comment"
)
UTC = ZoneInfo("UTC")


def independent_gpu_jobs(path):
    """GPU jobs of the real file, by plain string handling (no audit code)."""
    jobs, util = {}, {}
    for line in path.read_text(encoding="utf-8").splitlines():
        f = line.split("☃")
        job_id, alloc, usage = f[0], f[22], f[23]
        if "." in job_id:
            parent = job_id.split(".")[0]
            for item in usage.split(","):
                if item.startswith("gres/gpuutil="):
                    util[parent] = max(util.get(parent, 0), int(item.split("=")[1]))
            continue
        entries = dict(item.split("=", 1) for item in alloc.split(",") if "=" in item)
        if "gres/gpu" in entries:
            typed = [k.split(":")[1] for k in entries if k.startswith("gres/gpu:")]
            jobs[job_id] = (int(entries["gres/gpu"]), typed[0] if typed else None)
    return jobs, util


@pytest.mark.skipif(not REAL.exists(), reason=f"{REAL} not present")
def test_real_headerless_file(run_cli, tmp_path):
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli(
        "--db", str(db), "ingest", "slurm", "--fields", REAL_FIELDS, "--delimiter", "☃", str(REAL)
    )
    assert code == 0, err
    assert out == "imported 100 jobs from 1 file(s) (242 lines read) in " + out.split(" in ")[1]
    expected_jobs, expected_util = independent_gpu_jobs(REAL)
    con = duckdb.connect(str(db), read_only=True)
    got = {
        r[0]: (r[1], r[2])
        for r in con.execute("SELECT job_id, gpus, gpu_type FROM jobs WHERE gpus > 0").fetchall()
    }
    got_util = dict(
        con.execute(
            "SELECT job_id, max_gpu_util_pct FROM jobs WHERE max_gpu_util_pct IS NOT NULL"
        ).fetchall()
    )
    gpu_lines = sum("gres/gpu" in line for line in REAL.read_text(encoding="utf-8").splitlines())
    cancelled = con.execute(
        "SELECT state, state_detail FROM jobs WHERE job_id = '7965768'"
    ).fetchall()
    array = con.execute("SELECT array_job_id FROM jobs WHERE job_id = '5908801_3'").fetchall()
    multi = con.execute(
        "SELECT list(host ORDER BY host) FROM job_nodes WHERE job_id = '7971484'"
    ).fetchall()
    con.close()
    assert gpu_lines == 30
    assert got == expected_jobs
    assert len(got) == 9
    assert {k: v for k, v in got_util.items() if k in expected_jobs} == {
        k: float(v) for k, v in expected_util.items() if k in expected_jobs
    }
    assert got_util["7965768"] == 90.0
    assert cancelled == [("CANCELLED", "CANCELLED by 10314909")]
    assert array == [("5908801",)]
    assert multi == [(["a100gpu2", "a100gpu4"],)]
    # re-importing the same file is a no-op
    run_cli(
        "--db", str(db), "ingest", "slurm", "--fields", REAL_FIELDS, "--delimiter", "☃", str(REAL)
    )
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), count(DISTINCT job_id) FROM jobs").fetchall() == [
        (100, 100)
    ]
    assert (
        con.execute("SELECT count(*) FROM job_nodes").fetchall()[0][0]
        == con.execute("SELECT count(*) FROM (SELECT DISTINCT * FROM job_nodes)").fetchall()[0][0]
    )
    con.close()


@pytest.mark.parametrize(
    ("expression", "hosts"),
    [
        ("gpu-a[01-03,07]", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a07"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("None assigned", []),
        ("v100gpu16", ["v100gpu16"]),
    ],
)
def test_hostlists(expression, hosts):
    assert parse_hostlist(expression) == hosts


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1-23:59:00", 172740),
        ("15:28:22", 55702),
        ("23:08.358", 1388),
        ("00:00:04", 4),
        ("UNLIMITED", None),
        ("Partition_Limit", None),
        ("2-00:00:00", 172800),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text, "Elapsed") == seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("10G", 10 * 1024**3),
        ("1294440K", 1294440 * 1024),
        ("125000M", 125000 * 1024**2),
        ("4000Mc", 4000 * 1024**2),
        ("32Gn", 32 * 1024**3),
        ("1.5T", int(1.5 * 1024**4)),
        ("0", 0),
    ],
)
def test_memory(text, size):
    assert parse_memory(text) == size


def test_typed_gres_is_not_double_counted():
    assert gpus_from_tres(
        parse_tres("billing=8,cpu=8,gres/gpu:h100=8,gres/gpu=8,mem=1T,node=1")
    ) == (8, "h100")
    assert gpus_from_tres(parse_tres("cpu=8,gres/gpu:a100=2")) == (2, "a100")
    assert gpus_from_tres(parse_tres("cpu=8,mem=10G")) == (None, None)


HEADER_FILE = """jobid|JOBNAME|User|Account|Partition|State|Submit|Start|End|ElapsedRaw|TimelimitRaw|NNodes|NCPUS|NodeList|AllocTRES|ReqTRES|TRESUsageInMax
100|train|ann|lab|gpu|COMPLETED|2026-11-16T09:00:00|2026-11-16T10:00:00|2026-11-16T12:00:00|7200|UNLIMITED|2|16|gpu-a[01-02]|cpu=16,gres/gpu:h100=16,gres/gpu=16,node=2|gres/gpu=16|
100.batch|batch||lab||COMPLETED|2026-11-16T10:00:00|2026-11-16T10:00:00|2026-11-16T12:00:00|7200||1|8|gpu-a01|cpu=8||gres/gpuutil=41,gres/gpumem=1000M
100.0|python||lab||COMPLETED|2026-11-16T10:00:00|2026-11-16T10:00:00|2026-11-16T12:00:00|7200||2|16|gpu-a[01-02]|cpu=16||gres/gpuutil=77,gres/gpumem=2G
101_3|sweep|ann|lab|gpu|CANCELLED by 1001|2026-11-16T09:00:00|Unknown|Unknown|0|60|1|8|None assigned|||
102|eval|bob|lab|gpu|RUNNING|2026-11-16T09:00:00|2026-11-16T11:00:00|Unknown|3600|120|1|8|gpu-b07|cpu=8,gres/gpu=1|gres/gpu=1|
"""


def test_header_file_case_insensitive_steps_and_timezone(tmp_path):
    path = tmp_path / "jobs.sacct"
    path.write_text(HEADER_FILE)
    parsed = read_sacct(path, ZoneInfo("Europe/Amsterdam"))
    rows = {r["job_id"]: r for r in parsed.jobs.iter_rows(named=True)}
    assert set(rows) == {"100", "101_3", "102"}
    job = rows["100"]
    assert (job["gpus"], job["gpu_type"], job["timelimit_s"], job["steps"]) == (16, "h100", None, 2)
    assert job["max_gpu_util_pct"] == 77.0
    assert job["max_gpu_mem_bytes"] == 2 * 1024**3
    assert str(job["start_time"]) == "2026-11-16 09:00:00"  # 10:00 in Amsterdam is 09:00 UTC
    assert rows["101_3"]["start_time"] is None and rows["101_3"]["state"] == "CANCELLED"
    assert rows["102"]["end_time"] is not None  # running: start + elapsed
    assert sorted(parsed.nodes.filter(parsed.nodes["job_id"] == "100")["host"].to_list()) == [
        "gpu-a01",
        "gpu-a02",
    ]


def test_parsable_trailing_delimiter_and_job_name_with_delimiter(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("7|node01|COMPLETED|my|odd|name|\n8|node02|FAILED|plain|\n")
    parsed = read_sacct(path, UTC, fields=["JobID", "NodeList", "State", "JobName"])
    names = dict(zip(parsed.jobs["job_id"], parsed.jobs["name"], strict=True))
    assert names == {"7": "my|odd|name", "8": "plain"}


def test_bad_line_names_file_and_line_and_writes_nothing(tmp_path, run_cli):
    path = tmp_path / "bad.sacct"
    lines = HEADER_FILE.splitlines()
    lines.insert(
        3,
        "103|x|ann|lab|gpu|COMPLETED|2026-13-45T99:00:00|2026-11-16T10:00:00|2026-11-16T12:00:00|1|1|1|8|n1|cpu=8||",
    )
    path.write_text("\n".join(lines) + "\n")
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "slurm", str(path))
    assert code == 2
    assert (
        err
        == f"Error: {path}:4: Submit: expected a time like 2024-04-04T19:29:45, got '2026-13-45T99:00:00'\n"
    )
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM jobs").fetchall() == [(0,)]
    con.close()
    code, out, err = run_cli("--db", str(db), "ingest", "slurm", "--skip-bad", str(path))
    assert code == 0
    assert out.startswith("imported 3 jobs from 1 file(s) (6 lines read, skipped 1 bad lines)")
    assert err.startswith(f"skipped: {path}:4: Submit:")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty file"),
        ("1|2|3\n", "no header line with JobID"),
        (
            "JobID|State\n1|COMPLETED|extra|fields\n",
            ":2: expected 2 fields separated by '|', found 4",
        ),
        ("JobID|JobID\n1|1\n", "field 'jobid' appears more than once"),
        ("JobID|AllocTRES\n1|gres/gpu=-4\n", "gres/gpu: expected a non-negative number"),
        ("JobID|NodeList\n1|gpu[01-\n", "unbalanced '['"),
        ("JobID|ElapsedRaw\n1|ten\n", "ElapsedRaw: expected a number"),
    ],
)
def test_bad_sacct_files(tmp_path, content, message):
    path = tmp_path / "f.sacct"
    path.write_text(content)
    with pytest.raises(InputError, match=message.replace("|", r"\|").replace("[", r"\[")):
        read_sacct(path, UTC)


def test_binary_and_invalid_utf8_and_directory(tmp_path, run_cli):
    binary = tmp_path / "b.sacct"
    binary.write_bytes(b"JobID|State\n\x00\x01\x02")
    latin = tmp_path / "l.sacct"
    latin.write_bytes(b"JobID|JobName\n1|caf\xe9\n")
    for path, expected in (
        (binary, "binary data"),
        (latin, ":2: invalid UTF-8"),
        (tmp_path, "is a directory"),
    ):
        code, _, err = run_cli("--db", str(tmp_path / "w.duckdb"), "ingest", "slurm", str(path))
        assert code == 2
        assert expected in err
        assert "Traceback" not in err


def test_overlapping_files_merge_without_duplicates(tmp_path, run_cli):
    first, second = tmp_path / "a.sacct", tmp_path / "b.sacct"
    header = HEADER_FILE.splitlines()[0]
    first.write_text(header + "\n" + "\n".join(HEADER_FILE.splitlines()[1:4]) + "\n")
    second.write_text(header + "\n" + "\n".join(HEADER_FILE.splitlines()[1:]) + "\n")
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "slurm", str(first))[0] == 0
    assert run_cli("--db", str(db), "ingest", "slurm", str(second), str(first))[0] == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), count(DISTINCT job_id) FROM jobs").fetchall() == [(3, 3)]
    assert con.execute("SELECT count(*) FROM job_nodes WHERE job_id = '100'").fetchall() == [(2,)]
    con.close()

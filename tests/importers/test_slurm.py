"""Slurm accounting: real files, the formats sites emit, bad lines."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import duckdb
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.errors import InputError
from audit.importers.slurm import JOB_SCHEMA, LineError, newest_records, read_sacct
from audit.importers.slurm.values import (
    gpus_from_tres,
    parse_duration,
    parse_hostlist,
    parse_memory,
    parse_tres,
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
    assert out == "imported 100 jobs from 1 file (242 lines read) in " + out.split(" in ")[1]
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
    assert not db.exists()  # a refused first import leaves no warehouse
    code, out, err = run_cli("--db", str(db), "ingest", "slurm", "--skip-bad", str(path))
    assert code == 0
    assert out.startswith("imported 3 jobs from 1 file (6 lines read, skipped 1 bad line)")
    # the file's job cancelled before it started is counted first, then the bad line
    warning, skipped = err.splitlines()
    assert warning.startswith("warning: 1 job with no start time (1 CANCELLED)")
    assert skipped.startswith(f"skipped: {path}:4: Submit:")


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
        ("JobID|ElapsedRaw\n1|ten\n", "ElapsedRaw: expected a whole number"),
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


# -- issue 14: node lists, negative durations, DST, newer records, numbers beyond range ----
def test_node_list_product_is_bounded_before_expanding():
    """Case 6: each bracket of n[0-99999][0-99999] is allowed, their product (10^10) is not."""
    with pytest.raises(LineError, match=r"names 10,000,000,000 hosts, more than the 100,000"):
        parse_hostlist("n[0-99999][0-99999]")
    with pytest.raises(LineError, match="more than the 100,000"):
        parse_hostlist(",".join(f"r{i}[0-99999]" for i in range(3)))
    assert len(parse_hostlist("n[0-99][0-999]")) == 100_000


def test_node_list_bomb_is_a_line_error(tmp_path, run_cli):
    path = tmp_path / "bomb.sacct"
    path.write_text("JobID|NodeList\n1|n[0-99999][0-99999]\n")
    code, _, err = run_cli("--db", str(tmp_path / "w.duckdb"), "ingest", "slurm", str(path))
    assert code == 2
    assert err.startswith(f"Error: {path}:2: node list 'n[0-99999][0-99999]' names 10,000,000,000")


NEGATIVE = "JobID|State|Start|End|AllocTRES|NodeList\n7|COMPLETED|2026-11-16T10:00:00|2026-11-16T05:32:00|gres/gpu=8|n1\n8|COMPLETED|2026-11-16T10:00:00|2026-11-16T11:00:00|gres/gpu=8|n1\n"


def test_end_before_start_is_never_stored(tmp_path, run_cli):
    """Case 7: End before Start without ElapsedRaw stored elapsed_s=-16080."""
    path = tmp_path / "neg.sacct"
    path.write_text(NEGATIVE)
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "slurm", str(path))
    assert code == 2
    assert err == (
        f"Error: {path}:2: End 2026-11-16T05:32:00 is before Start 2026-11-16T10:00:00\n"
    )
    code, _out, err = run_cli("--db", str(db), "ingest", "slurm", "--skip-bad", str(path))
    assert code == 0
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT job_id, elapsed_s FROM jobs").fetchall()
    con.close()
    assert rows == [("8", 3600)]


@pytest.fixture
def berlin_config(tmp_path):
    config = tmp_path / "audit.toml"
    config.write_text('[cluster]\ntimezone = "Europe/Berlin"\n')
    return config


@pytest.mark.parametrize(
    ("start", "end", "elapsed", "seconds", "start_utc", "end_utc"),
    [
        # 02:50 (summer time, 00:50 UTC) to 02:10 (winter time, 01:10 UTC): 20 minutes
        ("2026-10-25T02:50:00", "2026-10-25T02:10:00", "", 1200, "00:50", "01:10"),
        ("2026-10-25T02:50:00", "2026-10-25T02:10:00", "1200", 1200, "00:50", "01:10"),
        # both in the repeated hour: read in the same (first) occurrence
        ("2026-10-25T02:10:00", "2026-10-25T02:50:00", "", 2400, "00:10", "00:50"),
        # ... unless sacct's elapsed time says the job ran across the change
        ("2026-10-25T02:10:00", "2026-10-25T02:50:00", "6000", 6000, "00:10", "01:50"),
    ],
)
def test_repeated_dst_hour_is_read_so_durations_agree(
    tmp_path, run_cli, berlin_config, start, end, elapsed, seconds, start_utc, end_utc
):
    """Case 7: with [cluster] timezone Europe/Berlin the repeated hour gave -2400 s."""
    path = tmp_path / "dst.sacct"
    path.write_text(
        f"JobID|State|Start|End|ElapsedRaw|AllocTRES|NodeList\n9|COMPLETED|{start}|{end}|{elapsed}|gres/gpu=1|n1\n"
    )
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli(
        "--db", str(db), "--config", str(berlin_config), "ingest", "slurm", str(path)
    )
    assert code == 0, err
    con = duckdb.connect(str(db), read_only=True)
    got = con.execute(
        "SELECT elapsed_s, strftime(start_time, '%H:%M'), strftime(end_time, '%H:%M') FROM jobs"
    ).fetchall()
    con.close()
    assert got == [(seconds, start_utc, end_utc)]


@pytest.mark.skipif(not REAL.exists(), reason=f"{REAL} not present")
def test_jobs_without_a_start_are_counted_in_a_warning(run_cli, tmp_path):
    """The real file's pending jobs, and those cancelled or failed before they started,
    have Start Unknown or None: they imported silently, out of every dated scan."""
    unstarted: dict[str, int] = {}
    for line in REAL.read_text(encoding="utf-8").splitlines():
        f = line.split("☃")
        if "." not in f[0] and f[10] in ("Unknown", "None", ""):
            state = f[8].split(" ")[0]
            unstarted[state] = unstarted.get(state, 0) + 1
    by_state = ", ".join(
        f"{n} {state}" for state, n in sorted(unstarted.items(), key=lambda i: (-i[1], i[0]))
    )
    code, _out, err = run_cli(
        "--db",
        str(tmp_path / "w.duckdb"),
        "ingest",
        "slurm",
        "--fields",
        REAL_FIELDS,
        "--delimiter",
        "☃",
        str(REAL),
    )
    assert code == 0, err
    assert sum(unstarted.values()) == 10
    assert err == (
        f"warning: 10 jobs with no start time ({by_state}): left out of every scan or report "
        "of a time window\n"
    )


def test_a_started_job_without_end_or_elapsed_time_is_counted_in_a_warning(run_cli, tmp_path):
    path = tmp_path / "running.sacct"
    path.write_text(
        "JobID|State|Start|End|AllocTRES\n"
        "21|RUNNING|2026-11-16T10:00:00|Unknown|gres/gpu=4\n"
        "22|COMPLETED|2026-11-16T10:00:00|2026-11-16T11:00:00|gres/gpu=4\n"
    )
    code, out, err = run_cli("--db", str(tmp_path / "w.duckdb"), "ingest", "slurm", str(path))
    assert code == 0, err
    assert out.startswith("imported 2 jobs from 1 file (2 lines read)")
    assert err == (
        "warning: 1 job with a start but no end or elapsed time (1 RUNNING): GPU-hours unknown\n"
    )


OLDER = "JobID|State|Start|End|ElapsedRaw|AllocTRES|NodeList\n11|RUNNING|2026-11-16T10:00:00|Unknown|600|gres/gpu=4|n1\n"
NEWER = "JobID|State|Start|End|ElapsedRaw|AllocTRES|NodeList\n11|COMPLETED|2026-11-16T10:00:00|2026-11-16T12:00:00|7200|gres/gpu=4|n1\n"


@pytest.mark.parametrize(
    "order",
    [
        ["newer", "older"],  # the case seen: an old file re-imported after a newer one
        ["older", "newer"],
        ["newer+older"],  # both files in one command, either order
        ["older+newer"],
        ["newer", "older", "newer+older", "older"],
    ],
)
def test_newer_record_wins_whatever_the_import_order(tmp_path, run_cli, order):
    """Case 8: re-importing an older file set a COMPLETED job back to RUNNING."""
    files = {"older": tmp_path / "older.sacct", "newer": tmp_path / "newer.sacct"}
    files["older"].write_text(OLDER)
    files["newer"].write_text(NEWER)
    db = tmp_path / "w.duckdb"
    for step in order:
        code, _, err = run_cli(
            "--db", str(db), "ingest", "slurm", *(str(files[n]) for n in step.split("+"))
        )
        assert code == 0, err
    con = duckdb.connect(str(db), read_only=True)
    got = con.execute("SELECT state, elapsed_s, end_time FROM jobs").fetchall()
    con.close()
    assert got == [("COMPLETED", 7200, datetime(2026, 11, 16, 12, 0))]


def test_older_file_says_what_it_left_alone(tmp_path, run_cli):
    older, newer = tmp_path / "older.sacct", tmp_path / "newer.sacct"
    older.write_text(OLDER)
    newer.write_text(NEWER)
    db = tmp_path / "w.duckdb"
    run_cli("--db", str(db), "ingest", "slurm", str(newer))
    code, out, err = run_cli("--db", str(db), "ingest", "slurm", str(older))
    assert code == 0
    assert out.startswith("imported 0 jobs from 1 file (1 line read)")
    assert err == "note: 1 job kept as stored: the warehouse holds a newer record\n"


def test_a_requeued_job_running_again_is_newer_than_its_failure(tmp_path, run_cli):
    """A later attempt (requeue after NODE_FAIL) describes a later moment: it wins."""
    failed = tmp_path / "a.sacct"
    failed.write_text(
        "JobID|State|Start|End|ElapsedRaw\n12|NODE_FAIL|2026-11-16T08:00:00|2026-11-16T09:00:00|3600\n"
    )
    again = tmp_path / "b.sacct"
    again.write_text(
        "JobID|State|Start|End|ElapsedRaw\n12|RUNNING|2026-11-16T09:30:00|Unknown|60\n"
    )
    db = tmp_path / "w.duckdb"
    for first, second in ((failed, again), (again, failed)):
        db.unlink(missing_ok=True)
        run_cli("--db", str(db), "ingest", "slurm", str(first))
        run_cli("--db", str(db), "ingest", "slurm", str(second))
        con = duckdb.connect(str(db), read_only=True)
        assert con.execute("SELECT state FROM jobs").fetchall() == [("RUNNING",)]
        con.close()


RECORDS = st.tuples(
    st.sampled_from(["PENDING", "RUNNING", "COMPLETED", "FAILED", "REQUEUED"]),
    st.integers(0, 5),  # start, hours after midnight (0: not started)
    st.integers(0, 5),  # elapsed hours
    st.booleans(),  # ended
    st.sampled_from([None, "JS1:x"]),
)


def _record_frame(records) -> pl.DataFrame:
    rows = []
    for state, start, hours, ended, comment in records:
        begin = datetime(2026, 11, 16, start) if start else None
        rows.append(
            {
                "cluster": "c",
                "job_id": "1",
                "state": state,
                "submit_time": datetime(2026, 11, 15),
                "start_time": begin,
                "end_time": begin + timedelta(hours=hours) if begin and ended else None,
                "elapsed_s": hours * 3600 if begin else None,
                "admin_comment": comment,
            }
        )
    return pl.DataFrame(rows, schema=JOB_SCHEMA)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(RECORDS, min_size=1, max_size=5), data=st.data())
def test_import_order_never_changes_the_result(records, data):
    """The job a warehouse ends with is the same for every order of imports, and no
    import makes it older than what it held."""
    frame = _record_frame(records)
    results = set()
    for _ in range(3):
        order = data.draw(st.permutations(range(len(records))))
        stored = None
        for index in order:
            incoming = frame[index : index + 1]
            written = newest_records(incoming, stored)
            if written.height:
                before, stored = stored, written
                if before is not None:  # what replaced it is not older: it would win back
                    back = newest_records(before, stored)
                    assert back.height == 0 or back.row(0) == stored.row(0)
        results.add(tuple(stored.row(0)))
    assert len(results) == 1


@pytest.mark.parametrize(
    ("header", "value", "message"),
    [
        ("ElapsedRaw", "inf", "ElapsedRaw: expected a whole number, got 'inf'"),
        ("ElapsedRaw", "1e30", "ElapsedRaw: expected a whole number, got '1e30'"),
        (
            "ElapsedRaw",
            "99999999999",
            "ElapsedRaw: 99999999999 is out of range (at most 4,294,967,295)",
        ),
        ("TimelimitRaw", "inf", "TimelimitRaw: expected a whole number"),
        ("TimelimitRaw", "1e30", "TimelimitRaw: expected a whole number"),
        ("AllocTRES", "gres/gpu=inf", "gres/gpu: expected a whole number, got 'inf'"),
        ("AllocTRES", "gres/gpu=1e30", "gres/gpu: expected a whole number, got '1e30'"),
        (
            "AllocTRES",
            "gres/gpu:a100=2147483647,gres/gpu:h100=9",
            "gres/gpu: 2147483656 GPUs is out of range",
        ),
        ("ReqTRES", "gres/gpu=99999999999", "gres/gpu: 99999999999 is out of range"),
        ("NNodes", "99999999999", "NNodes: 99999999999 is out of range (at most 2,147,483,647)"),
        ("NCPUS", "-3", "NCPUS: expected a non-negative number"),
        (
            "TRESUsageInMax",
            "gres/gpumem=99999999999999999999P",
            "gres/gpumem: 99999999999999999999P is out of range",
        ),
        ("TRESUsageInAve", "gres/gpuutil=1e400", "gres/gpuutil: expected a whole number"),
        ("ReqMem", "9999999999999T", "ReqMem: 9999999999999T is out of range"),
        ("MaxRSS", "1" * 40 + "K", "MaxRSS: expected a size like 10G"),
        ("Elapsed", "12345678901234567-00:00:00", "Elapsed: expected D-HH:MM:SS"),
        (
            "Elapsed",
            "99999999-00:00:00",
            "Elapsed: 99999999-00:00:00 is out of range (more than 136 years)",
        ),
        ("Timelimit", "999999999-23:59:59", "Timelimit: 999999999-23:59:59 is out of range"),
        ("Eligible", "2026-02-30T00:00:00", "Eligible: expected a time like"),
        ("Submit", "99999-01-01T00:00:00", "Submit: expected a time like"),
        ("Start", "1969-12-31T23:00:00", "Start: time '1969-12-31T23:00:00' is out of range"),
    ],
)
def test_numbers_beyond_range_are_line_errors(tmp_path, run_cli, header, value, message):
    """Issue 14: these gave exit 3 (OverflowError, polars overflow, MemoryError)."""
    path = tmp_path / "big.sacct"
    columns = {"JobID": "1", "State": "RUNNING", "Start": "2026-11-16T10:00:00", header: value}
    path.write_text("|".join(columns) + "\n" + "|".join(columns.values()) + "\n")
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "slurm", str(path))
    assert code == 2, err
    assert err == f"Error: {path}:2: {message}" + err.split(message, 1)[1]
    assert not db.exists() or duckdb.connect(str(db), read_only=True).execute(
        "SELECT count(*) FROM jobs"
    ).fetchall() == [(0,)]


def test_eligible_average_usage_and_admin_comment_from_parsable(tmp_path):
    path = tmp_path / "x.sacct"
    path.write_text(
        "JobID|State|Submit|Eligible|Start|End|TRESUsageInAve|TRESUsageInMax|AdminComment\n"
        "5|COMPLETED|2026-11-16T09:00:00|2026-11-16T09:10:00|2026-11-16T09:30:00|2026-11-16T10:00:00|||JS1:abc=\n"
        "5.batch|COMPLETED|||||gres/gpuutil=40,gres/gpumem=2G|gres/gpuutil=90,gres/gpumem=3G|\n"
        "5.0|COMPLETED|||||gres/gpuutil=55,gres/gpumem=1G|gres/gpuutil=70,gres/gpumem=4G|\n"
    )
    row = read_sacct(path, UTC).jobs.row(0, named=True)
    assert row["eligible_time"] == datetime(2026, 11, 16, 9, 10)
    assert (row["ave_gpu_util_pct"], row["ave_gpu_mem_bytes"]) == (55.0, 2 * 2**30)
    assert (row["max_gpu_util_pct"], row["max_gpu_mem_bytes"]) == (90.0, 4 * 2**30)
    assert row["admin_comment"] == "JS1:abc="


def test_unterminated_last_line_of_sacct_output(tmp_path, run_cli):
    path = tmp_path / "live.sacct"
    path.write_text(HEADER_FILE + "103|x|ann|lab|gpu|RUNN")
    code, out, err = run_cli("--db", str(tmp_path / "w.duckdb"), "ingest", "slurm", str(path))
    assert code == 0, err
    assert out.startswith("imported 3 jobs")
    assert err.startswith(
        f"note: {path}: last line incomplete, skipped (a file still being written)\n"
    )


@pytest.mark.parametrize(
    ("encoding", "bom"),
    [("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"), ("utf-8", b"\xef\xbb\xbf")],
)
def test_sacct_in_other_unicode_forms(tmp_path, encoding, bom):
    path = tmp_path / "x.sacct"
    path.write_bytes(bom + HEADER_FILE.encode(encoding))
    assert read_sacct(path, UTC).jobs.height == 3

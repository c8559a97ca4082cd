"""Every command against a warehouse holding extreme but valid values.

The sample week, imported as `make demo` does, plus runs, params, tags, metrics, dataset
inputs, experiments, model versions, Slurm jobs, GPU samples and checkpoints with times in
the years 1 and 9999 (and a job from one to the other), NaN and ±infinity, 1 MB strings,
and control and bidi characters. Every CLI command (the test checks that none is left out)
must answer with exit 0 or 2, never a traceback or an internal error, never with control
characters from the data on the terminal. A second test: times outside the years 1 to 9999
left by an older version are cleared on upgrade, after which every reader works.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import click
import duckdb
import pytest
from click.testing import CliRunner

from audit.cli import cli
from audit.docs import iter_commands
from tests.helpers import REPO

SAMPLE = REPO / "sample_logs"
BIG = "x" * 1_000_000
CONTROL = "\x1b[31mred\x07\u202egnp.exe\x00nul\u2066iso\x9b31m"
PATH_CONTROL = CONTROL.replace("\x00", "")  # a file system path or host name never holds NUL
LO, HI = "TIMESTAMP '0001-01-01 00:00:00'", "TIMESTAMP '9999-12-31 23:59:59.999'"
RUN = "extreme00" + "0" * 23
OTHER = "extreme01" + "0" * 23
HANG_GUARD_S = 60
SHOWN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _seed(con) -> None:
    source = con.execute("SELECT source_id FROM sources ORDER BY source_id LIMIT 1").fetchall()[0][
        0
    ]
    experiment = con.execute("SELECT experiment_id FROM experiments LIMIT 1").fetchall()[0][0]
    times = [(LO, LO), (HI, HI), (LO, HI), ("NULL", HI), (HI, "NULL")]
    for i, (start, end) in enumerate(times):
        run = f"extreme{i:02d}" + "0" * 23
        name = [BIG, CONTROL, "", None, "n"][i]
        con.execute(
            f"INSERT INTO runs VALUES (?, ?, ?, ?, ?, 'FINISHED', {start}, {end}, 'active', NULL, "
            "?, ?, 'LOCAL', ?, 'sig', now())",
            [source, run, experiment, name, CONTROL, BIG, CONTROL, CONTROL],
        )
        params = [
            ("learning_rate", ["nan", "inf", "-inf", "1e308", BIG][i]),
            ("num_gpus", ["1e308", "-inf", "nan", "8", "0"][i]),
            ("method", CONTROL),
            (CONTROL, BIG),
            ("base_model", "qwen"),
            ("output_dir", "/scratch/" + PATH_CONTROL),
        ]
        for key, value in params:
            con.execute(
                "INSERT INTO params VALUES (?, ?, ?, ?, try_cast(? AS DOUBLE), ?)",
                [source, run, key, value, value, value],
            )
        for key, value in [
            ("team", CONTROL),
            ("slurm_job_id", "90"),
            ("audit.baseline", "true"),
            (CONTROL, BIG),
        ]:
            con.execute("INSERT INTO tags VALUES (?, ?, ?, ?)", [source, run, key, value])
        metrics = [
            ("eval/general/mmlu", float("nan")),
            ("eval/target/x", float("inf")),
            ("eval/general/y", float("-inf")),
            ("train/loss", 1e308),
            (CONTROL, -1e308),
        ]
        for key, value in metrics:
            for step, ts in [(-(2**63) + 1, LO), (2**63 - 1, HI), (0, "NULL")]:
                con.execute(
                    f"INSERT INTO metrics VALUES (?, ?, ?, ?, ?, {ts})",
                    [source, run, key, value, step],
                )
            con.execute(
                f"INSERT INTO latest_metrics VALUES (?, ?, ?, ?, ?, {HI})",
                [source, run, key, value, 2**63 - 1],
            )
        con.execute(
            "INSERT INTO dataset_inputs VALUES (?, ?, ?, ?, ?, ?, 'train')",
            [source, run, CONTROL, BIG, CONTROL, CONTROL],
        )
    con.execute(
        f"INSERT INTO experiments VALUES (?, 'x', ?, ?, 'active', {LO}, {HI})",
        [source, CONTROL, BIG],
    )
    con.execute(
        f"INSERT INTO model_versions VALUES (?, ?, '1', ?, ?, 'READY', 'None', {HI})",
        [source, CONTROL, RUN, CONTROL],
    )
    host = "h-" + PATH_CONTROL
    for i, (start, end) in enumerate([(LO, LO), (HI, HI), (LO, HI)]):
        con.execute(
            f"INSERT INTO jobs VALUES ('default', ?, NULL, ?, ?, ?, 'gpu', 'COMPLETED', 'COMPLETED', "
            f"{start}, {start}, {end}, ?, ?, 1, 96, ?, 8, ?, 8, ?, ?, 'nan', ?, 1, 'f', now())",
            [
                f"9{i}",
                CONTROL,
                CONTROL,
                BIG,
                [0, 2**62, 315537897599][i],
                2**62,
                host,
                CONTROL,
                2**62,
                2**62,
                2**62,
            ],
        )
        con.execute("INSERT INTO job_nodes VALUES ('default', ?, ?)", [f"9{i}", host])
    for ts in (LO, HI):
        for value in ("'nan'", "'inf'", "'-inf'"):
            con.execute(
                f"INSERT INTO gpu_samples VALUES (?, '0', {ts}, {value}::REAL, {value}::REAL, "
                f"{value}::REAL, {value}::REAL, ?, ?, NULL, NULL, 'nvidia-smi')",
                [host, CONTROL, CONTROL],
            )
    root = "/scratch/" + PATH_CONTROL
    for ts in (LO, HI):
        con.execute(
            f"INSERT INTO checkpoints VALUES (?, ?, 'hf', ?, -1, 1000000000000000, 2147483647, {ts}, "
            "true, 'nan', ?, now())",
            [root, f"{root}/checkpoint-{ts[11:15]}", 2**63 - 1, root],
        )
    con.execute(
        "INSERT INTO run_jobs VALUES (?, ?, 'default', '92', 'tag:slurm_job_id')", [source, RUN]
    )


@pytest.fixture(scope="module")
def extreme(tmp_path_factory, demo_db) -> dict:
    work = tmp_path_factory.mktemp("extreme")
    db = work / "extreme.duckdb"
    shutil.copyfile(demo_db["db"], db)
    con = duckdb.connect(str(db))
    _seed(con)
    con.close()
    sacct = work / "more.sacct"
    sacct.write_text((SAMPLE / "slurm" / "week47.sacct").read_text())
    return {"db": db, "work": work, "config": demo_db["config"], "scratch": demo_db["scratch"]}


def _commands(work: Path, scratch: Path) -> list[tuple[str, ...]]:
    return [
        ("status",),
        ("scan",),
        ("scan", "--format", "json"),
        ("scan", "--format", "md"),
        ("scan", "--format", "html", "--output", str(work / "scan.html")),
        ("scan", "--since", "0001-01-01", "--until", "9999-12-31"),
        ("rules", "list"),
        ("rules", "explain", "IDL003"),
        ("report", "weekly", "--week", "2026-W47", "--format", "md"),
        ("report", "weekly", "--week", "2026-W47", "--format", "json"),
        ("report", "weekly", "--week", "2026-W47", "--output", str(work / "weekly.html")),
        ("report", "weekly", "--week", "0001-W01", "--format", "md"),
        ("report", "weekly", "--week", "9999-W52", "--format", "md"),
        ("report", "weekly", "--since", "0001-01-01", "--until", "9999-12-31", "--format", "md"),
        ("runs", "search"),
        ("runs", "search", "--format", "json"),
        ("runs", "search", "params.learning_rate > 0 or params.num_gpus < 0", "--include-deleted"),
        (
            "runs",
            "search",
            "",
            "--order-by",
            "metrics.`train/loss` DESC",
            "--columns",
            "params.learning_rate,metrics.train/loss",
        ),
        ("runs", "similar", "--run", RUN),
        ("runs", "similar", "--param", "learning_rate=nan", "--param", "method=sft"),
        ("runs", "compare", RUN, OTHER, "--all-params"),
        ("sql", "select * from runs"),
        ("sql", "select * from metrics", "--format", "json"),
        ("export", "--parquet", str(work / "export")),
        ("gate", RUN),
        ("gate", RUN, "--baseline", OTHER),
        ("prune",),
        ("prune", "--plan", str(work / "plan.json")),
        ("prune", "--apply", str(work / "plan.json")),
        ("ingest", "mlflow", "--tracking-uri", str(SAMPLE / "mlruns")),
        ("ingest", "slurm", str(work / "more.sacct")),
        ("ingest", "gpu", str(SAMPLE / "gpu" / "gpu-h01.csv")),
        ("ingest", "checkpoints", str(scratch)),
        ("status",),  # after the imports recomputed every link over the extreme rows
        ("scan",),
    ]


def test_every_command_is_exercised(extreme):
    leaves = {" ".join(p[1:]) for p, c in iter_commands() if not isinstance(c, click.Group)}
    used = {
        " ".join(a[:2]) if a[0] in ("ingest", "rules", "report", "runs") else a[0]
        for a in _commands(extreme["work"], extreme["scratch"])
    }
    assert leaves <= used, f"not run against extreme values: {sorted(leaves - used)}"


def test_every_command_answers_on_extreme_values(extreme):
    runner = CliRunner()
    outcomes = []
    for args in _commands(extreme["work"], extreme["scratch"]):
        started = time.monotonic()
        result = runner.invoke(
            cli,
            ["--db", str(extreme["db"]), "--config", str(extreme["config"]), *args],
            catch_exceptions=False,
        )
        # not a speed claim (bench/ makes those): a guard against runaway work, such as
        # laying out a 1 MB chart label (2 minutes) or expanding a 10,000-year job by the hour
        assert time.monotonic() - started < HANG_GUARD_S, f"audit {' '.join(args)} took minutes"
        shown = result.stdout + result.stderr
        outcomes.append((args, result.exit_code))
        assert result.exit_code in (0, 2), (
            f"audit {' '.join(args)}: exit {result.exit_code}: {shown[-3000:]}"
        )
        assert "Traceback" not in shown and "internal error" not in shown, shown[-3000:]
        if "json" not in args:
            assert SHOWN.findall(shown) == [], (
                f"control characters from the data: audit {' '.join(args)}"
            )
    # the run from year 1 to 9999 and the job across all of it are really judged
    exits = dict((" ".join(a), c) for a, c in outcomes)
    assert exits["status"] == 0 and exits["scan"] == 0 and exits["runs search"] == 0


# -- times beyond the years 1 to 9999, stored by an older version ----------------------------
OUT_OF_RANGE = [
    "TIMESTAMP '58845-01-01 00:00:00'",
    "TIMESTAMP '-0005-01-01 00:00:00'",
    "'infinity'::TIMESTAMP",
]


def test_times_an_older_version_stored_beyond_year_9999_are_cleared(demo_db, tmp_path, run_cli):
    db = tmp_path / "old.duckdb"
    shutil.copyfile(demo_db["db"], db)
    con = duckdb.connect(str(db))
    runs = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id LIMIT 3").fetchall()]
    for run, moment in zip(runs, OUT_OF_RANGE, strict=True):
        con.execute(
            f"UPDATE runs SET start_time = {moment}, end_time = {moment} WHERE run_id = ?", [run]
        )
        con.execute(f"UPDATE metrics SET ts = {moment} WHERE run_id = ?", [run])
    con.execute(
        f"UPDATE jobs SET end_time = {OUT_OF_RANGE[0]} WHERE job_id = (SELECT min(job_id) FROM jobs)"
    )
    con.execute(f"UPDATE gpu_samples SET ts = {OUT_OF_RANGE[1]} WHERE rowid < 10")
    con.execute(f"UPDATE checkpoints SET mtime = {OUT_OF_RANGE[0]} WHERE rowid = 0")
    con.execute("UPDATE audit_meta SET value = '4' WHERE key = 'schema_version'")  # as it was
    samples = con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0]
    con.close()
    for args in [
        ("status",),
        ("runs", "search"),
        ("runs", "search", "--format", "json"),
        ("scan",),
        ("report", "weekly", "--week", "2026-W47", "--format", "md"),
        ("runs", "compare", runs[0], runs[1]),
        ("sql", "select * from runs"),
    ]:
        code, out, err = run_cli("--db", str(db), "--config", str(demo_db["config"]), *args)
        assert code == 0, (args, out, err)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute(
        "SELECT count(*) FROM runs WHERE start_time IS NULL AND signature IS NULL"
    ).fetchall() == [(3,)]
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchall() == [(samples - 10,)]
    con.close()
    # the next import reads those runs again: the sample store has sane times, so they return
    code, out, err = run_cli(
        "--db", str(db), "ingest", "mlflow", "--tracking-uri", str(SAMPLE / "mlruns")
    )
    assert code == 0, err
    assert out.startswith("imported 3 new or changed runs (13 unchanged)")


def test_an_importer_cannot_write_a_time_beyond_year_9999(tmp_path):
    """The net under every importer: insert_frame refuses such a frame."""
    from datetime import datetime

    import polars as pl

    from audit.errors import InputError
    from audit.importers.files import insert_frame

    frame = pl.DataFrame({"job_id": ["7"], "ms": [1_794_823_200_000_000]}).with_columns(
        end_time=pl.from_epoch("ms", time_unit="ms")
    )
    con = duckdb.connect()
    con.execute("CREATE TABLE jobs (job_id VARCHAR, end_time TIMESTAMP)")
    with pytest.raises(InputError, match=r"jobs\.end_time: a time in year 58845 \(job_id='7'\)"):
        insert_frame(con, "jobs", frame.select("job_id", "end_time"))
    insert_frame(con, "jobs", pl.DataFrame({"job_id": ["8"], "end_time": [datetime(9999, 12, 31)]}))
    assert con.execute("SELECT count(*) FROM jobs").fetchall() == [(1,)]

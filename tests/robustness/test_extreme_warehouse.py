"""Every command against a warehouse holding extreme but valid values.

The sample week, imported as `make demo` does, plus runs, params, tags, metrics, dataset
inputs, experiments, model versions, Slurm jobs, GPU samples and checkpoints with times in
the years 1 and 9999 (and a job from one to the other), NaN and ±infinity, 1 MB strings,
and control and bidi characters. Every CLI command, enumerated from the click group so a
new one is run too, must answer with exit 0, 1 (findings at --fail-on) or 2, never a
traceback or an internal error, never with control characters from the data on the
terminal. A second test: times outside the years 1 to 9999
left by an older version are cleared on upgrade, after which every reader works.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import time
from datetime import datetime
from pathlib import Path

import click
import duckdb
import pytest
from click.testing import CliRunner

from audit.cli import cli
from audit.docs import iter_commands
from audit.warehouse.migrations import MIGRATIONS, V8
from tests.helpers import REPO, add_samples, audit_process, rolled_back

SAMPLE = REPO / "sample_logs"
BIG = "x" * 1_000_000
CONTROL = "\x1b[31mred\x07\u202egnp.exe\x00nul\u2066iso\x9b31m"
PATH_CONTROL = CONTROL.replace("\x00", "")  # a file system path or host name never holds NUL
LO, HI = "TIMESTAMP '0001-01-01 00:00:00'", "TIMESTAMP '9999-12-31 23:59:59.999'"
RUN = "extreme00" + "0" * 23
OTHER = "extreme01" + "0" * 23
HANG_GUARD_S = 60
LONG_HOST = "gpu-" + "é" * 300  # 600 bytes, 1,800 percent-encoded
LONG_ROOT = "/scratch/" + "/".join(["deep-folder"] * 30)  # '/' is %2F in a folder name
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
            # every method family the rules and report sections treat apart
            ("method", [CONTROL, "eval", "grpo", "opd", "sft"][i]),
            (CONTROL, BIG),
            ("base_model", "qwen"),
            ("teacher", CONTROL),
            ("dataset", [CONTROL, BIG, "", "d", "d"][i]),
            ("checkpoint", "/scratch/" + PATH_CONTROL),
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
        odd = [float("nan"), float("inf"), float("-inf"), 1e308, -1e308]
        metrics = [
            ("eval/general/mmlu", float("nan")),
            ("eval/target/x", float("inf")),
            ("eval/general/y", float("-inf")),
            ("eval/safety/refusal", odd[(i + 1) % 5]),
            ("train/loss", 1e308),
            (CONTROL, -1e308),
            # the stability signals (STB001) and the RL figures the new sections chart
            ("train/kl", odd[i]),
            ("train/entropy", odd[(i + 2) % 5]),
            ("train/reward", odd[(i + 3) % 5]),
            ("train/grad_norm", odd[(i + 4) % 5]),
            ("completions/clipped_ratio", odd[i]),
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
            f"{start}, {start}, {end}, ?, ?, 1, 96, ?, 8, ?, 8, ?, ?, 'nan', ?, 1, 'f', now(), "
            f"{end}, 'inf', ?, ?)",
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
                2**62,
                ["JS1:" + CONTROL, BIG, "JS1:H4sI" + "A" * 64][i],
            ],
        )
        con.execute("INSERT INTO job_nodes VALUES ('default', ?, ?)", [f"9{i}", host])
    for ts in (LO, HI):
        moment = con.execute(f"SELECT {ts}").fetchall()[0][0]
        for value in (math.nan, math.inf, -math.inf):
            numbers = (value,) * 4
            add_samples(
                con,
                "host, gpu, ts, util_pct, mem_used_mib, mem_total_mib, power_w, model, uuid, "
                "origin, source_id, run_id",
                [
                    (host, "0", moment, *numbers, CONTROL, CONTROL, "nvidia-smi", None, None),
                    # a sample the run logged itself (W&B system metrics): it carries its run
                    (host, "1", moment, *numbers, CONTROL, CONTROL, "wandb", source, RUN),
                ],
            )
    # partition values no file name can hold as they are (the export shortens their folders)
    add_samples(
        con,
        "host, gpu, ts, util_pct, origin",
        [(LONG_HOST, "0", datetime(2026, 11, 17), 50.0, "nvidia-smi")],
    )
    con.execute(
        "INSERT INTO checkpoints VALUES (?, ?, 'hf', 1, 1, 1, 1, now(), false, NULL, ?, now())",
        [LONG_ROOT, f"{LONG_ROOT}/checkpoint-1", LONG_ROOT],
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
    con.execute(
        f"INSERT INTO run_files VALUES (?, ?, ?, ?, {LO}, ?, ?)",
        [source, RUN, "/scratch/" + PATH_CONTROL, 2**63 - 1, 2**63 - 1, CONTROL],
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
    # a trainer output folder whose name holds control characters, with extreme numbers
    trainer = work / "trainer" / ("out-" + PATH_CONTROL.replace("/", "_"))
    trainer.mkdir(parents=True)
    history = [
        {"step": 2**62, "loss": 1e308, "grad_norm": -1e308, "learning_rate": 0.0},
        {"step": 0, "loss": 0.0, "epoch": 1e308},
    ]
    (trainer / "trainer_state.json").write_text(
        json.dumps({"global_step": 2**62, "log_history": history, "best_metric": 1e308})
    )
    _tensorboard_run(work / "tensorboard" / ("run-" + PATH_CONTROL.replace("/", "_")))
    # an lm-eval results file: control characters in names, extreme numbers, the last date
    evals = work / "evals" / ("eval-" + PATH_CONTROL.replace("/", "_"))
    evals.mkdir(parents=True)
    task = {"acc," + CONTROL: 1e308, "acc_stderr," + CONTROL: -1e308, "x,none": float("inf")}
    (evals / "results_9999-12-31T23-59-59.json").write_text(
        json.dumps(
            {
                "results": {CONTROL: task, "t": {"acc,none": -1e308, "n,none": 2**70}},
                "versions": {CONTROL: CONTROL},
                "n-shot": {CONTROL: 2**62},
                "config": {"model_args": {"pretrained": CONTROL, "n": 2**80}, "limit": 1e308},
                "date": 253402300799.0,
                "total_evaluation_time_seconds": "1e308",
            }
        )
    )
    return {"db": db, "work": work, "config": demo_db["config"], "scratch": demo_db["scratch"]}


def _tensorboard_run(folder: Path) -> None:
    """Scalars of NaN and ±infinity at extreme steps, written by a real writer when the
    test extra is installed (else the folder is empty and the import says so)."""
    folder.mkdir(parents=True)
    try:
        import tensorboardX
    except ImportError:
        return
    writer = tensorboardX.SummaryWriter(str(folder))
    for step, value in [(0, float("nan")), (2**62, float("inf")), (1, float("-inf"))]:
        writer.add_scalar("train/" + CONTROL.replace("\x00", ""), value, step)
        writer.add_scalar("train/loss", value, step)
    writer.close()


def _variants(work: Path, scratch: Path) -> dict[str, list[tuple[str, ...]]]:
    """Arguments worth trying per command; a command not named here still runs (below)."""
    plan = str(work / "plan.json")
    return {
        "status": [()],
        "scan": [
            (),
            ("--format", "json"),
            ("--format", "md"),
            ("--format", "html", "--output", str(work / "scan.html")),
            ("--since", "0001-01-01", "--until", "9999-12-31"),
            ("--fail-on", "info"),
        ],
        "rules list": [()],
        "rules explain": [("IDL003",), ("STB001",), ("QUE001",)],
        "report weekly": [
            ("--week", "2026-W47", "--format", "md"),
            ("--week", "2026-W47", "--format", "json"),
            ("--week", "2026-W47", "--output", str(work / "weekly.html")),
            ("--week", "0001-W01", "--format", "md"),
            ("--week", "9999-W52", "--format", "md"),
            ("--since", "0001-01-01", "--until", "9999-12-31", "--format", "md"),
            ("--since", "0001-01-01", "--until", "9999-12-31", "--output", str(work / "all.html")),
        ],
        "runs search": [
            (),
            ("--format", "json"),
            ("--format", "csv"),
            ("params.learning_rate > 0 or params.num_gpus < 0", "--include-deleted"),
            (
                "",
                "--order-by",
                "metrics.`train/loss` DESC",
                "--columns",
                "params.learning_rate,metrics.train/loss",
            ),
        ],
        "runs similar": [
            ("--run", RUN),
            ("--param", "learning_rate=nan", "--param", "method=sft"),
        ],
        "runs compare": [(RUN, OTHER, "--all-params"), (RUN, OTHER, "--format", "json")],
        "sql": [
            ("select * from runs",),
            ("select * from metrics", "--format", "json"),
            ("select * from jobs", "--format", "csv"),
            ("select job_id, end_time - start_time, start_time - eligible_time from jobs",),
            ("select * from telemetry",),
        ],
        "export": [("--parquet", str(work / "export"))],
        "gate": [(RUN,), (RUN, "--baseline", OTHER)],
        "prune": [(), ("--plan", plan), ("--apply", plan)],
        "ingest mlflow": [("--tracking-uri", str(SAMPLE / "mlruns"))],
        "ingest slurm": [(str(work / "more.sacct"),)],
        "ingest gpu": [(str(SAMPLE / "gpu" / "gpu-h01.csv"),)],
        "ingest checkpoints": [(str(scratch),)],
        "ingest wandb": [(str(SAMPLE / "wandb"),)],
        "ingest trainer-logs": [(str(work / "trainer"),)],
        "ingest tensorboard": [(str(work / "tensorboard"),)],
        "ingest evals": [(str(work / "evals"),)],
    }


def _leaf_commands() -> list[tuple[str, click.Command]]:
    return [
        (" ".join(path[1:]), command)
        for path, command in iter_commands()
        if not isinstance(command, click.Group)
    ]


def _default_arguments(command: click.Command, work: Path) -> tuple[str, ...]:
    """For a command nobody listed: its required arguments filled in (a path: the test's
    folder, holding the warehouse and odd files; anything else: a run id)."""
    return tuple(
        str(work) if isinstance(p.type, click.Path) else RUN
        for p in command.params
        if isinstance(p, click.Argument) and p.required
    )


def _commands(work: Path, scratch: Path) -> list[tuple[str, ...]]:
    """Every leaf command of the CLI, enumerated from the click group (so a new command is
    run too): reading commands first, then the imports, then the readers again over what
    the imports recomputed around the extreme rows."""
    variants = _variants(work, scratch)
    runs: list[tuple[str, ...]] = []
    for name, command in sorted(_leaf_commands(), key=lambda c: c[0].startswith("ingest ")):
        for arguments in variants.get(name, [_default_arguments(command, work)]):
            runs.append((*name.split(" "), *arguments))
    again = ("report", "weekly", "--week", "2026-W47", "--output", str(work / "again.html"))
    return [*runs, ("status",), ("scan",), again]


def test_every_listed_command_exists(extreme):
    """A renamed command would leave its variants unused and run bare: say so."""
    leaves = {name for name, _ in _leaf_commands()}
    assert set(_variants(extreme["work"], extreme["scratch"])) <= leaves


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
        assert result.exit_code in (0, 1, 2), (
            f"audit {' '.join(args)}: exit {result.exit_code}: {shown[-3000:]}"
        )
        assert "Traceback" not in shown and "internal error" not in shown, shown[-3000:]
        if "json" not in args and "csv" not in args:  # data formats keep values exactly
            assert SHOWN.findall(shown) == [], (
                f"control characters from the data: audit {' '.join(args)}"
            )
    # the run from year 1 to 9999 and the job across all of it are really judged
    exits = dict((" ".join(a), c) for a, c in outcomes)
    assert exits["status"] == 0 and exits["scan"] == 0 and exits["runs search"] == 0
    assert exits["scan --fail-on info"] == 1  # findings on the extreme rows, exit 1 as told
    # the readers answer (a gate that cannot judge NaN scores, or a week that starts in
    # year 1 and so has no previous one, is exit 2 by design)
    for command in (
        "report weekly --week 2026-W47 --format md",
        "report weekly --week 2026-W47 --format json",
        "runs search --format csv",
        "runs compare " + RUN + " " + OTHER + " --all-params",
        "sql select job_id, end_time - start_time, start_time - eligible_time from jobs",
        "export --parquet " + str(extreme["work"] / "export"),
    ):
        assert exits[command] == 0, command


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
    # GPU samples in one table, as V8 had them (V10 made them a view over two tables): an
    # old schema, hand-written on purpose
    con.execute("CREATE TABLE gpu_samples_v8 AS SELECT * FROM gpu_samples")
    con.execute("DROP VIEW gpu_samples")
    con.execute("DROP TABLE gpu_readings")
    con.execute("DROP TABLE gpu_series")
    con.execute("ALTER TABLE gpu_samples_v8 RENAME TO gpu_samples")
    con.execute(f"UPDATE gpu_samples SET ts = {OUT_OF_RANGE[1]} WHERE rowid < 10")
    con.execute(f"UPDATE checkpoints SET mtime = {OUT_OF_RANGE[0]} WHERE rowid = 0")
    # as the version before the clean-up (V8) left it: without the later tables (V9, V11)
    # and columns (V12)
    con.execute("DROP TABLE report_models")
    con.execute("DROP TABLE eval_results")
    con.execute("ALTER TABLE findings DROP COLUMN risk_gpu_hours")
    con.execute("ALTER TABLE findings DROP COLUMN material")
    for table in ("job_gpus", "watch_invocations", "watch_actions", "watch_cursors"):
        con.execute(f"DROP TABLE {table}")
    con.execute(
        "UPDATE audit_meta SET value = ? WHERE key = 'schema_version'",
        [str(MIGRATIONS.index(V8))],
    )
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
        "--db",
        str(db),
        "--config",
        str(demo_db["config"]),  # the links were made with its [links] path_prefixes
        "ingest",
        "mlflow",
        "--tracking-uri",
        str(SAMPLE / "mlruns"),
    )
    assert code == 0, err
    assert out.startswith("imported 3 new or changed runs (17 unchanged)")


def test_an_importer_cannot_write_a_time_beyond_year_9999(schema_warehouse):
    """The net under every importer: insert_frame refuses such a frame."""
    from datetime import datetime

    import polars as pl

    from audit.errors import InputError
    from audit.warehouse.frames import insert_frame

    frame = pl.DataFrame({"job_id": ["7"], "ms": [1_794_823_200_000_000]}).with_columns(
        end_time=pl.from_epoch("ms", time_unit="ms")
    )
    with rolled_back(schema_warehouse.con) as con:
        with pytest.raises(
            InputError, match=r"jobs\.end_time: a time in year 58845 \(cluster='c', job_id='7'\)"
        ):
            insert_frame(
                con, "jobs", frame.select(cluster=pl.lit("c"), job_id="job_id", end_time="end_time")
            )
        insert_frame(
            con,
            "jobs",
            pl.DataFrame({"cluster": ["c"], "job_id": ["8"], "end_time": [datetime(9999, 12, 31)]}),
        )
        assert con.execute("SELECT count(*) FROM jobs").fetchall() == [(1,)]


# -- export and audit sql at the edges ---------------------------------------------------------
def test_export_shortens_partition_folders_no_file_system_holds(extreme):
    """A host name or checkpoint root whose folder name would pass 255 bytes blocked the
    whole export; now its folder is shortened, its rows keep the value, and the table's
    index maps the folder back to it."""
    import pyarrow.dataset as ds

    out = extreme["work"] / "export-long"
    result = CliRunner().invoke(
        cli, ["--db", str(extreme["db"]), "export", "--parquet", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    for table, column, value in (
        ("gpu_samples", "host", LONG_HOST),
        ("checkpoints", "root", LONG_ROOT),
    ):
        index = json.loads((out / table / "_shortened_partitions.json").read_text())
        folder = next(e["folder"] for e in index if e["value"] == value)
        assert len(folder.encode()) <= 255 and (out / table / folder).is_dir()
        # the rows hold the whole value, read without the folder's partition value
        inside = ds.dataset(out / table / folder, format="parquet").to_table()
        assert set(inside.column(column).to_pylist()) == {value}
        # and every other value reads back from the Hive partitions as stored
        read = ds.dataset(out / table, format="parquet", partitioning="hive").to_table()
        assert (
            len(read)
            == duckdb.connect(str(extreme["db"]), read_only=True)
            .execute(f"SELECT count(*) FROM {table}")
            .fetchall()[0][0]
        )


RUNAWAY = "with recursive t(n) as (select 1 union all select n + 1 from t) select count(*) from t"


def test_sql_timeout_stops_a_runaway_query(extreme):
    started = time.monotonic()
    proc = audit_process(extreme["db"], "sql", RUNAWAY, "--timeout", "2")
    try:
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        proc.kill()
    assert proc.returncode == 2, err
    assert "ran longer than 2 s and was stopped" in err
    assert time.monotonic() - started < HANG_GUARD_S / 2


def test_sql_ctrl_c_stops_a_running_query_within_a_second(extreme):
    proc = audit_process(extreme["db"], "sql", RUNAWAY)
    try:
        time.sleep(3)  # the query is running
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        _, err = proc.communicate(timeout=HANG_GUARD_S)
        stopped = time.monotonic() - interrupted
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert stopped < 1.0, f"exit {stopped:.2f} s after Ctrl-C"

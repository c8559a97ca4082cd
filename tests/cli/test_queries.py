"""The queryable history: filter language, similar, compare, SQL, export, Python API."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import mlflow
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.entities import ViewType

from audit import Registry
from audit.errors import InputError
from audit.query.filter import compile_filter
from tests.helpers import REPO


@pytest.fixture(scope="module")
def reference_db(server, tmp_path_factory):
    """The reference runs of the real mlflow server, imported from its SQLite store."""
    from click.testing import CliRunner

    from audit.cli import cli

    db = tmp_path_factory.mktemp("queries") / "w.duckdb"
    result = CliRunner().invoke(
        cli,
        ["--db", str(db), "ingest", "mlflow", "--tracking-uri", f"sqlite:///{server['backend']}"],
    )
    assert result.exit_code == 0, result.output
    return db


def names(frame: pl.DataFrame) -> list[str]:
    return sorted(frame["run_name"].to_list())


# Filters both MLflow and audit understand: results must agree run for run.
SHARED_FILTERS = [
    "params.kl_coef = '0.050'",
    "metrics.`eval/target/pass_at_1` > 0.3",
    "metrics.`train/loss` < 0.1",
    "tags.team = 'coder'",
    "attributes.status = 'FINISHED'",
    "params.method = 'rl' and metrics.`train/loss` < 0.1",
    "attributes.run_name LIKE 'sft-%'",
    "tags.team ILIKE 'CODER'",
    "params.lora_rank != '8'",
    "datasets.name = 'codeedit'",
    "tags.`mlflow.runName` = 'rl-a'",
]


@pytest.mark.parametrize("filter_text", SHARED_FILTERS)
def test_results_match_mlflow_search_runs(server, reference_db, filter_text):
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{server['backend']}")
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    expected = sorted(
        r.info.run_name
        for r in client.search_runs(
            experiments, filter_text, run_view_type=ViewType.ACTIVE_ONLY, max_results=1000
        )
    )
    got = names(Registry(reference_db).search(filter_text, limit=None))
    assert got == expected
    assert expected


@pytest.mark.parametrize(
    ("filter_text", "expected"),
    [
        ("params.learning_rate = '1e-05'", ["sft-a", "sft-b", "sft-c"]),  # 1e-5, 0.00001, 1E-5
        ("params.learning_rate < 3e-6", ["rl-a"]),
        ("params.learning_rate between '1e-6' and 2e-6", ["rl-a"]),
        ("params.bf16 = 'true'", ["sft-a", "sft-b"]),
        ("params.lora_rank = 64", ["sft-a", "sft-b"]),  # '64' and '64.0'
        ("params.kl_coef = 0.05", ["rl-a"]),
        ("tags.team = 'agents' or params.lora_rank = '8'", ["rl-a", "sft-b", "sft-c"]),
        ("not (tags.team = 'coder')", ["rl-a", "sft-b"]),
        ("params.method is null", ["sft-a", "sft-b", "sft-c"]),
        ("params.method is not null", ["rl-a"]),
        ("params.learning_rate not in ('1e-5', '0.00001')", ["rl-a"]),
        ("max(metrics.`eval/general/mmlu`) >= 0.7", ["rl-a", "sft-a", "sft-b", "sft-c"]),
        ("last(metrics.`eval/general/mmlu`) < 0.675", ["rl-a", "sft-a", "sft-b", "sft-c"]),
        ("min(metrics.`train/loss`) > 0.06", []),
        ("metrics.`eval/target/pass_at_1` > 0", ["rl-a", "sft-a", "sft-b"]),  # NaN never matches
        (
            "attributes.start_time >= 1794790800000 and attributes.status = 'FINISHED'",
            ["rl-a", "sft-b"],
        ),
        ("params.learning_rate LIKE '%e-%'", ["rl-a", "sft-a"]),
    ],
)
def test_extensions(reference_db, filter_text, expected):
    assert names(Registry(reference_db).search(filter_text, limit=None)) == expected


def test_deleted_runs_only_on_request(reference_db):
    assert "rl-deleted" not in names(Registry(reference_db).search("", limit=None))
    assert "rl-deleted" in names(
        Registry(reference_db).search("", limit=None, include_deleted=True)
    )


@pytest.mark.parametrize(
    ("filter_text", "position"),
    [
        ("params.lr = ", 13),
        ("params.lr == 1 and", 19),
        ("foo.bar = 1", 1),
        ("params.lr = 1 or or params.x = 2", 18),
        ("(params.lr = 1", 15),
        ("params.lr ~ 1", 11),
        ("attributes.nope = 1", 12),
        ("metrics.acc = 'high'", 15),
        ("max(tags.x) > 1", 1),
    ],
)
def test_malformed_filters_point_at_the_token(filter_text, position, run_cli, reference_db):
    with pytest.raises(InputError, match=f"invalid filter at character {position} "):
        compile_filter(filter_text)
    code, _out, err = run_cli("--db", str(reference_db), "runs", "search", filter_text)
    assert code == 2
    assert err.startswith(f"Error: invalid filter at character {position} ")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "attack",
    [
        "params.lr = '1'; drop table runs; --'",
        "tags.team = 'x' or 1=1",
        "params.`lr'; delete from params; --` = 1",
        "tags.team = 'coder' /* comment */",
        "params.lr = 1; select 1",
        "tags.team = 'a'' or ''1''=''1'",
        "params.lr = 1 or read_csv('/etc/passwd') is not null",
        "params.`x\" from read_text('/etc/passwd') --` = 1",
        "tags.team = '\\'; copy runs to '/tmp/audit-leak.csv'",
        "params.lr in (select 1)",
        "params.lr = 1 union select * from runs",
        "attributes.status = 'x' or attributes.status in (select status from runs)",
    ],
)
def test_injection_is_a_parse_error_or_literal(attack, reference_db):
    before = (
        duckdb.connect(str(reference_db), read_only=True)
        .execute("SELECT count(*) FROM runs")
        .fetchall()
    )
    try:
        found = Registry(reference_db).search(attack, limit=None)
        assert found.height == 0  # matched literally: no run has such a value
    except InputError as exc:
        assert "invalid filter" in str(exc)
    con = duckdb.connect(str(reference_db), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchall() == before
    con.close()


def test_order_by_is_numeric_aware(reference_db):
    ordered = Registry(reference_db).search(
        "params.learning_rate is not null", order_by=["params.learning_rate desc"], limit=None
    )
    assert ordered["run_name"].to_list()[0] == "sft-a" or ordered["params.learning_rate"].to_list()[
        0
    ] in ("1e-5", "0.00001", "1E-5")
    ascending = Registry(reference_db).search(
        "params.learning_rate is not null", order_by=["params.learning_rate"], limit=None
    )
    assert ascending["run_name"].to_list()[0] == "rl-a"  # 2e-06 < 1e-05, though '2' > '1' as text


@pytest.mark.parametrize("suffix", [".yaml", ".json", ".toml"])
def test_similar_from_config_files(suffix, tmp_path, demo_db, run_cli):
    config = {
        "learning_rate": 2e-05,
        "method": "sft",
        "base_model": "qwen2.5-7b",
        "dataset": "codeedit-v3",
        "lora_rank": 64,
        "output_dir": "/elsewhere",
    }
    path = tmp_path / f"train{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(config))
    elif suffix == ".toml":
        path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in config.items()))
    else:
        path.write_text("\n".join(f"{k}: {v}" for k, v in config.items()))
    code, out, err = run_cli(
        "--db", str(demo_db["db"]), "runs", "similar", "--config", str(path), "--fail-if-exists"
    )
    assert code == 1, err
    # the two MLflow runs and the other team's W&B rerun: one history across trackers
    assert out.startswith("exact matches: 3 (3 finished)")
    assert "sft-qwen-lr2e-5-again" in out and "sft-qwen-math-rerun" in out
    assert err.startswith("a finished run with this configuration exists: ")


def test_similar_nested_config_and_no_match(tmp_path, demo_db, run_cli):
    path = tmp_path / "train.yaml"
    path.write_text("training:\n  learning_rate: 7e-7\n  method: sft\n")
    code, out, _ = run_cli(
        "--db", str(demo_db["db"]), "runs", "similar", "--config", str(path), "--fail-if-exists"
    )
    assert code == 0
    assert out.startswith("exact matches: 0 (0 finished)")
    assert "training.learning_rate" in out


def test_similar_by_run_and_usage_errors(demo_db, run_cli):
    reg = Registry(demo_db["db"])
    dup = reg.search("attributes.run_name = 'sft-qwen-lr2e-5-again'")["run_id"][0]
    result = reg.similar(run_id=dup)
    assert result.exact["run_name"].to_list() == ["sft-qwen-math-rerun", "sft-qwen-lr2e-5"]
    assert run_cli("--db", str(demo_db["db"]), "runs", "similar")[0] == 2
    code, _, err = run_cli("--db", str(demo_db["db"]), "runs", "similar", "--run", "nope")
    assert code == 2 and "no run 'nope'" in err


def test_compare(demo_db, run_cli):
    reg = Registry(demo_db["db"])
    a = reg.search("attributes.run_name = 'sft-qwen-lr2e-5'")["run_id"][0]
    b = reg.search("attributes.run_name = 'sft-qwen-lr1e-4'")["run_id"][0]
    parts = reg.compare([a, b])
    assert sorted(parts["params"]["key"].to_list()) == [
        "learning_rate",
        "logging_dir",
        "max_steps",
        "output_dir",
        "run_name",
    ]
    cost = {row[0]: row[1] for row in parts["cost"].iter_rows()}
    assert cost["GPU-hours"] == "48.27" and cost["team"] == "coder"
    assert cost["cost basis"] == "Slurm job 4700102: 8 GPUs × 6.03 h elapsed"
    code, out, _ = run_cli("--db", str(demo_db["db"]), "runs", "compare", a, b)
    assert code == 0 and "learning_rate" in out and "GPU-hours" in out


@pytest.mark.parametrize(
    "statement",
    [
        "delete from runs",
        "insert into runs (source_id, run_id) values ('x', 'y')",
        "drop table runs",
        "copy runs to '/tmp/audit-leak.csv'",
        "attach '/tmp/other.duckdb'",
        "install sqlite",
        "select * from read_csv('/etc/passwd')",
        "select * from runs; delete from runs",
        "set enable_external_access = true",
        "create table t as select 1",
        "select * from '/etc/passwd'",
        "select * from read_text('/etc/hostname')",
        "select * from read_parquet('/tmp/*.parquet')",
        "select * from glob('/etc/*')",
        "select * from read_json_auto('/etc/os-release')",
        "load httpfs",
        "export database '/tmp/audit-export'",
        "checkpoint",
        "create macro evil(x) as x",
        "pragma database_size",
        "call pragma_table_info('runs')",
        "detach memory",
        "use memory",
        "reset lock_configuration",
        "set disabled_filesystems = ''",
        "with x as (delete from runs returning *) select * from x",
        "update runs set status = 'X'",
        "select 1 union all select * from read_csv('/etc/passwd')",
    ],
)
def test_sql_is_read_only_and_sandboxed(statement, demo_db, run_cli, tmp_path):
    code, out, err = run_cli("--db", str(demo_db["db"]), "sql", statement)
    assert code == 2, out
    assert "Traceback" not in err
    assert "root:" not in out  # nothing of /etc/passwd
    assert not Path("/tmp/audit-leak.csv").exists() and not Path("/tmp/audit-export").exists()
    con = duckdb.connect(str(demo_db["db"]), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchall() == [(23,)]
    con.close()


def test_sql_views(demo_db, run_cli):
    code, out, _ = run_cli(
        "--db",
        str(demo_db["db"]),
        "sql",
        "select count(*) as n from params_wide where learning_rate is not null",
        "--format",
        "json",
    )
    # 17 MLflow runs and the 3 W&B runs log a learning rate
    assert code == 0 and json.loads(out) == [{"n": 21}]
    for view in (
        "runs",
        "params",
        "metrics",
        "latest_metrics",
        "tags",
        "datasets",
        "jobs",
        "telemetry",
        "checkpoints",
        "findings",
    ):
        assert run_cli("--db", str(demo_db["db"]), "sql", f"select count(*) from {view}")[0] == 0, (
            view
        )


def test_sql_shows_intervals_and_times_beyond_python(demo_db, run_cli):
    """Subtracting two times gives an interval, which polars cannot import (it was exit 3);
    a query may also compute times beyond the years 1 to 9999. Both are shown as DuckDB's
    text, in every format; in-range times keep their type."""
    db = str(demo_db["db"])
    code, out, err = run_cli(
        "--db",
        db,
        "sql",
        "SELECT job_id, start_time - submit_time AS wait FROM jobs WHERE job_id = '4700100'",
        "--format",
        "json",
    )
    assert code == 0, err
    assert json.loads(out) == [{"job_id": "4700100", "wait": "00:09:00"}]
    query = (
        "SELECT INTERVAL 3 DAY + INTERVAL 2 HOUR AS d, [INTERVAL 1 MONTH] AS l, "
        "TIMESTAMP '9999-12-31' + INTERVAL 1 YEAR AS after, DATE '0001-01-01' - 1 AS before, "
        "'infinity'::TIMESTAMP AS inf, TIMESTAMP '2026-11-16 01:00:00' AS fine, 1 AS d"
    )
    code, out, err = run_cli("--db", db, "sql", query, "--format", "json")
    assert code == 0, err
    assert json.loads(out) == [
        {
            "d": "3 days 02:00:00",
            "l": "[1 month]",
            "after": "10000-12-31 00:00:00",
            "before": "0001-12-31 (BC)",
            "inf": "infinity",
            "fine": "2026-11-16 01:00:00",
            "d_1": 1,
        }
    ]
    for fmt in ("table", "csv"):
        code, out, err = run_cli("--db", db, "sql", query, "--format", fmt)
        assert code == 0 and "3 days 02:00:00" in out and "10000-12-31" in out, (fmt, err)


def test_export_parquet(demo_db, run_cli, tmp_path):
    target = tmp_path / "export"
    code, _out, _ = run_cli("--db", str(demo_db["db"]), "export", "--parquet", str(target))
    assert code == 0
    runs = pl.read_parquet(target / "runs" / "**" / "*.parquet", hive_partitioning=True)
    assert runs.height == 23 and "source_id" in runs.columns
    samples = duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{target}/gpu_samples/*/*.parquet', hive_partitioning=true)"
    ).fetchall()
    assert samples == [(14328,)]
    assert (
        run_cli("--db", str(demo_db["db"]), "export", "--parquet", str(target))[0] == 2
    )  # not empty


def test_export_in_slices_holds_every_row_once(demo_db, run_cli, tmp_path, monkeypatch):
    """With slices of at most 1,000 rows (the demo's 14,328 samples over its hosts are cut
    into several COPYs), every table reads back from the export as the warehouse holds it."""
    from audit.query import export

    monkeypatch.setattr(export, "EXPORT_SLICE_ROWS", 1_000)
    target = tmp_path / "export"
    assert run_cli("--db", str(demo_db["db"]), "export", "--parquet", str(target))[0] == 0
    con = duckdb.connect(str(demo_db["db"]), read_only=True)
    for table, partition in export.EXPORT_PARTITIONS.items():
        stored = con.execute(
            f"SELECT {partition}::VARCHAR, count(*) FROM {table} GROUP BY 1 ORDER BY 1"
        ).fetchall()
        if not stored:
            assert not (target / table).exists(), table
            continue
        exported = duckdb.sql(
            f"SELECT {partition}::VARCHAR, count(*) FROM read_parquet("
            f"'{target}/{table}/*/*.parquet', hive_partitioning=true) GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert exported == stored, table
    hosts = con.execute("SELECT count(DISTINCT host) FROM gpu_samples").fetchall()[0][0]
    assert len(list((target / "gpu_samples").iterdir())) == hosts
    con.close()


@settings(deadline=None)  # pure Python, but a loaded CI machine must not fail it on time
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=3_000), max_size=40),
    limit=st.integers(min_value=1, max_value=5_000),
)
def test_partition_slices_cover_every_partition_once_within_the_limit(sizes, limit):
    from audit.warehouse.slices import partition_slices

    values = [(f"p{i}", rows) for i, rows in enumerate(sizes)]
    slices = partition_slices(values, limit)
    assert [v for piece in slices for v in piece] == [v for v, _ in values]
    rows = dict(values)
    for piece in slices:
        assert piece, "no empty slice"
        assert len(piece) == 1 or sum(rows[v] for v in piece) <= limit


def test_pycaret_store_queries(run_cli, tmp_path):
    import tarfile

    from tests.helpers import SHARED

    archive = SHARED / "mlflow" / "pycaret-tutorial-mlruns.tar.gz"
    if not archive.exists():
        pytest.skip(f"{archive} not present")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    db = tmp_path / "w.duckdb"
    assert (
        run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(tmp_path / "mlruns"))[0]
        == 0
    )
    reg = Registry(db)
    good = reg.search("metrics.R2 > 0.8", order_by=["metrics.R2 desc"], limit=None)
    assert good.height > 0 and good["metrics.R2"].is_sorted(descending=True)
    run_id = good["run_id"][0]
    similar = reg.similar(run_id=run_id)
    assert run_id not in similar.exact["run_id"].to_list()
    assert "from audit import Registry" in (REPO / "docs" / "python-api.md").read_text()

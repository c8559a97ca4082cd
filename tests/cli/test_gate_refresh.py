"""`audit gate --refresh` judges the run where the caller says it lives, the verdict alone
decides the exit code, and a tolerance that cannot judge is refused."""

from __future__ import annotations

import shutil

import duckdb
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from tests.helpers import mlflow_server, now_ms


@pytest.fixture(scope="module")
def store_and_server(tmp_path_factory):
    """A file store with a baseline and a run, a copy taken before the run regressed, and
    a live tracking server serving the store itself."""
    tmp_path = tmp_path_factory.mktemp("gate")
    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    exp = client.create_experiment("gate")
    base = client.create_run(exp, run_name="base-eval", tags={"audit.baseline": "true"})
    client.log_batch(
        base.info.run_id,
        params=[Param("base_model", "tiny-1b")],
        metrics=[Metric("eval/general/mmlu", 0.70, now_ms(), 0)],
    )
    client.set_terminated(base.info.run_id)
    run = client.create_run(exp, run_name="sft")
    client.log_batch(
        run.info.run_id,
        params=[Param("base_model", "tiny-1b")],
        metrics=[Metric("eval/general/mmlu", 0.70, now_ms(), 10)],
    )
    copy = tmp_path / "copy-of-mlruns"
    shutil.copytree(store, copy)
    client.log_metric(run.info.run_id, "eval/general/mmlu", 0.60, step=20)  # the regression
    with mlflow_server(tmp_path / "server", store.as_uri()) as (url, _backend):
        yield {"store": store, "copy": copy, "url": url, "run": run.info.run_id}


def _import(run_cli, db, uri) -> None:
    code, _out, err = run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", uri)
    assert code == 0, err


def test_refresh_uses_the_tracking_uri_given(store_and_server, run_cli, tmp_path):
    s = store_and_server
    db = tmp_path / "w.duckdb"
    _import(run_cli, db, str(s["copy"]))  # the copy predates the regression
    code, out, err = run_cli("--db", str(db), "gate", s["run"])
    assert code == 0, err  # as imported: no regression yet
    code, out, err = run_cli(
        "--db", str(db), "gate", s["run"], "--refresh", "--tracking-uri", s["url"]
    )
    assert code == 1, (out, err)
    assert "FAIL: worst eval/general/mmlu -0.1000" in out


def test_a_tagging_failure_is_a_warning_and_the_verdict_decides(
    store_and_server, run_cli, tmp_path
):
    s = store_and_server
    db = tmp_path / "w.duckdb"
    _import(run_cli, db, str(s["store"]))
    # imported from a store: there is no server to write the tags to (whatever an earlier
    # test left in the environment: the option reads MLFLOW_TRACKING_URI)
    no_uri = {"MLFLOW_TRACKING_URI": None}
    code, out, err = run_cli("--db", str(db), "gate", s["run"], "--tag", env=no_uri)
    assert code == 1, (out, err)
    assert "FAIL: worst eval/general/mmlu" in out
    assert err == (
        f"audit: warning: the verdict was not tagged: run {s['run']} does not come from a "
        "tracking server; pass --tracking-uri http://…\n"
    )
    # a store given as the URI: still no server to write to
    code, out, err = run_cli(
        "--db", str(db), "gate", s["run"], "--tag", "--tracking-uri", str(s["store"]), env=no_uri
    )
    assert code == 1, (out, err)
    assert err == (
        "audit: warning: the verdict was not tagged: writing tags back needs a tracking "
        "server (http://…), not a store path\n"
    )


@pytest.mark.parametrize("tolerance", ["nan", "inf", "-0.01"])
def test_a_tolerance_that_cannot_judge_is_refused(store_and_server, run_cli, tmp_path, tolerance):
    s = store_and_server
    db = tmp_path / "w.duckdb"
    _import(run_cli, db, str(s["store"]))
    code, _out, err = run_cli("--db", str(db), "gate", s["run"], "--tolerance", tolerance)
    assert code == 2
    assert f"--tolerance must be a finite number ≥ 0, got {float(tolerance)}" in err


def test_a_server_answering_for_another_run_is_refused(store_and_server, run_cli, tmp_path):
    from tests.robustness.test_faulty_server import FaultProxy

    s = store_and_server
    db = tmp_path / "w.duckdb"
    _import(run_cli, db, s["url"])
    before = duckdb.connect(str(db), read_only=True)
    rows = before.execute("SELECT count(*) FROM metrics").fetchall()
    before.close()

    def other_run(answer):
        answer["run"]["info"]["run_id"] = "f" * 32
        answer["run"]["info"]["run_uuid"] = "f" * 32
        return answer

    fault = lambda n, path, body: ("rewrite", other_run) if "runs/get" in path else None  # noqa: E731
    with FaultProxy(s["url"], fault) as proxy:
        code, _out, err = run_cli(
            "--db", str(db), "gate", s["run"], "--refresh", "--tracking-uri", proxy.url
        )
    assert code == 2, err
    assert f"asked for run {s['run']}, the server answered with run {'f' * 32}; refused" in err
    after = duckdb.connect(str(db), read_only=True)
    assert after.execute("SELECT count(*) FROM metrics").fetchall() == rows
    after.close()

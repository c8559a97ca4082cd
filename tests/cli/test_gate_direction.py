"""``audit gate`` reads each metric in its own direction.

Seen before the fix: ``audit gate RUN --baseline BASE --metrics eval_loss`` passed when
eval_loss rose by 0.10 and failed with exit 1 when it fell by 0.10 — a pipeline would have
stopped an improving run and let a degrading one go on.
"""

from __future__ import annotations

import pytest
from mlflow import MlflowClient


@pytest.fixture
def runs(tmp_path, run_cli):
    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.create_experiment("e")
    ids = {}
    values = {
        "base": {"eval_loss": 1.50, "eval/general/mmlu": 0.60},
        "better": {"eval_loss": 1.40, "eval/general/mmlu": 0.61},
        "worse": {"eval_loss": 1.60, "eval/general/mmlu": 0.59},
    }
    for name, metrics in values.items():
        run = client.create_run(experiment, run_name=name)
        for key, value in metrics.items():
            client.log_metric(run.info.run_id, key, value, step=100)
        client.set_terminated(run.info.run_id)
        ids[name] = run.info.run_id
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0

    def gate(name: str, *extra: str, config: str | None = None):
        args = ["--db", str(db)]
        if config is not None:
            path = tmp_path / "audit.toml"
            path.write_text(config)
            args += ["--config", str(path)]
        return run_cli(*args, "gate", ids[name], "--baseline", ids["base"], *extra)

    return gate


def test_a_loss_that_falls_passes_and_one_that_rises_fails(runs):
    code, out, err = runs("better", "--metrics", "eval_loss", "--tolerance", "0.05")
    assert code == 0, (out, err)
    assert "pass: worst eval_loss -0.1000 (lower is better: gain +0.1000)" in out
    code, out, err = runs("worse", "--metrics", "eval_loss", "--tolerance", "0.05")
    assert code == 1, (out, err)
    assert "FAIL: worst eval_loss +0.1000 (lower is better: gain -0.1000)" in out
    assert "REGRESSED" in out


def test_an_accuracy_is_still_higher_is_better(runs):
    assert runs("better", "--metrics", "eval/general/mmlu", "--tolerance", "0.005")[0] == 0
    assert runs("worse", "--metrics", "eval/general/mmlu", "--tolerance", "0.005")[0] == 1


def test_an_unknown_direction_is_refused_naming_the_metric_until_the_config_states_it(
    tmp_path, run_cli
):
    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.create_experiment("e")
    ids = {}
    for name, value in (("base", 10.0), ("new", 12.0)):
        run = client.create_run(experiment, run_name=name)
        client.log_metric(run.info.run_id, "probe/drift", value, step=1)
        client.set_terminated(run.info.run_id)
        ids[name] = run.info.run_id
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0
    base = ("--db", str(db))
    code, _, err = run_cli(
        *base, "gate", ids["new"], "--baseline", ids["base"], "--metrics", "probe/*"
    )
    assert code == 2
    assert "the direction of general metric probe/drift is unknown" in err
    assert "[metrics] higher_is_better or lower_is_better" in err
    config = tmp_path / "audit.toml"
    config.write_text('[metrics]\nlower_is_better = ["probe/drift"]\n')
    code, out, _ = run_cli(
        *base,
        "--config",
        str(config),
        "gate",
        ids["new"],
        "--baseline",
        ids["base"],
        "--metrics",
        "probe/*",
        "--tolerance",
        "1",
    )
    assert code == 1
    assert "lower is better: gain -2.0000" in out

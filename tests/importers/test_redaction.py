"""E-mail addresses and credentials never reach the warehouse, from any tracker.

Each source kind (MLflow SQL store, file store and tracking server; W&B through its log and
through files/ only; trainer logs; TensorBoard) is written by its real writer with the
same secrets planted where people put them: the user, run and experiment names, params
and tags, a metric key, a command line, a dataset URL, a model version's source, a W&B
run's config, summary and arguments. After the import every planted secret is searched
for in every text column of every table and in the warehouse file's bytes (with its WAL,
after a checkpoint). A warehouse an earlier version filled is scrubbed on upgrade.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.helpers import mlflow_server

EMAIL = "ann.secret@corp-mail.example.org"
HF = "hf_" + "Q7w" * 11 + "Zk"
OPENAI = "sk-proj-" + "Ab9" * 9
GITHUB = "ghp_" + "R2d2" * 9
AWS = "AKIA" + "QWERTYUIOPASDFGH"
SLACK = "xoxb-2024-" + "slk9" * 4
WANDB_KEY = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"
PASSWORD = "pw-Hunter-7731"
URL_PASSWORD = "urlpass-XY9K"
PLAIN_KEY = "plainvalue-ZZ12"  # a credential without a known shape, under a credential's name
SECRETS = (EMAIL, HF, OPENAI, GITHUB, AWS, SLACK, WANDB_KEY, PASSWORD, URL_PASSWORD, PLAIN_KEY)
COMMAND = (
    f"train.py --hf_token={HF} --db_password {PASSWORD} --lr 1e-5 "
    f"WANDB_API_KEY={WANDB_KEY} --notify {EMAIL}"
)
DATA_URL = f"https://ann:{URL_PASSWORD}@data.example.com/sft.jsonl"
PARAMS = {
    "learning_rate": "1e-5",
    "api_key": PLAIN_KEY,
    "openai": OPENAI,
    "github": f"token {GITHUB}",
    "aws": AWS,
    "slack": SLACK,
    "command": COMMAND,
    "data": DATA_URL,
    f"notify.{EMAIL}": "yes",
    "max_new_tokens": "512",  # a training setting, kept
}


def stored_secrets(db: Path, file_bytes: bool = True) -> list[str]:
    """The planted secrets still found: in any text column (as SQL sees it), or in the
    bytes of the file and its WAL."""
    con = duckdb.connect(str(db))
    con.execute("CHECKPOINT")
    found = set()
    columns = con.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = 'main' AND data_type IN ('VARCHAR', 'JSON')"
    ).fetchall()
    for table, column in columns:
        for secret in SECRETS:
            hits = con.execute(
                f'SELECT count(*) FROM "{table}" WHERE contains("{column}"::VARCHAR, ?)', [secret]
            ).fetchall()[0][0]
            if hits:
                found.add(f"{secret} in {table}.{column}")
    con.close()
    if not file_bytes:
        return sorted(found)
    stored = b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))
    found |= {f"{s} in the file's bytes" for s in SECRETS if s.encode() in stored}
    return sorted(found)


def kept(db: Path, sql: str) -> list:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def log_mlflow(uri: str) -> None:
    from mlflow import MlflowClient
    from mlflow.entities import Dataset, DatasetInput, Metric, Param

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.create_experiment(f"sft {EMAIL}")
    run = client.create_run(
        experiment,
        run_name=f"sft by {EMAIL}",
        tags={"mlflow.user": EMAIL, "mlflow.source.name": COMMAND, "launch": COMMAND},
    )
    run_id = run.info.run_id
    client.log_batch(
        run_id,
        # MLflow names hold no '@': the addresses are in values, names and tags
        params=[Param(k, v) for k, v in PARAMS.items() if "@" not in k],
        metrics=[Metric("eval/loss", 0.5, 1_794_787_200_000, 1)],
    )
    dataset = Dataset(name="sft", digest="d1", source_type="http", source=DATA_URL)
    client.log_inputs(run_id, [DatasetInput(dataset, [])])
    client.set_terminated(run_id, "FINISHED")
    if uri.startswith("sqlite:"):
        client.create_registered_model("coder")
        client.create_model_version("coder", DATA_URL, run_id=run_id)


def test_mlflow_sql_store(tmp_path, run_cli):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log_mlflow(uri)
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", uri)
    assert code == 0, err
    assert stored_secrets(db) == []
    # the user keeps who they are, the settings stay
    assert kept(db, "SELECT user_id FROM runs") == [("ann.secret",)]
    params = dict(kept(db, "SELECT key, value FROM params"))
    assert params["max_new_tokens"] == "512" and params["learning_rate"] == "1e-5"
    assert params["api_key"] == "<redacted>"
    assert params["command"].startswith("train.py --hf_token=<redacted> --db_password <redacted>")
    # redacted rows still prove the run unchanged: nothing is rewritten by the next import
    code, out, err = run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", uri)
    assert code == 0 and "imported 0 new or changed runs" in out, out + err


def test_mlflow_file_store(tmp_path, run_cli):
    store = tmp_path / "mlruns"
    log_mlflow(store.as_uri())
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))
    assert code == 0, err
    assert stored_secrets(db) == []


def test_mlflow_tracking_server(tmp_path, run_cli):
    with mlflow_server(tmp_path / "server") as (url, _):
        log_mlflow(url)
        db = tmp_path / "w.duckdb"
        code, _, err = run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", url)
    assert code == 0, err
    assert stored_secrets(db) == []


WANDB_WRITER = r"""
import json, sys, wandb
secrets = json.load(open(sys.argv[2]))
run = wandb.init(project="agents " + secrets["email"], dir=sys.argv[1],
                 name="grpo by " + secrets["email"], notes="ask " + secrets["email"],
                 config={**secrets["params"], "hub_token": secrets["hf"]})
for step in range(3):
    run.log({"train/loss": 1.0 / (step + 1), "eval/" + secrets["email"]: step})
run.summary["note"] = secrets["command"]
run.summary["api_key"] = secrets["plain"]
run.finish()
"""


def write_wandb_run(root: Path) -> None:
    secrets = {
        "email": EMAIL,
        "hf": HF,
        "params": PARAMS,
        "command": COMMAND,
        "plain": PLAIN_KEY,
    }
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env["WANDB_DISABLE_GIT"] = "true"
    planted = root / "secrets.json"  # read by the writer: its own arguments are recorded too
    planted.write_text(json.dumps(secrets))
    # the command line wandb records: the launcher's arguments
    subprocess.run(
        [sys.executable, "-c", WANDB_WRITER, str(root), str(planted), *COMMAND.split()],
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )


def test_wandb_log_and_state(tmp_path, run_cli):
    pytest.importorskip("wandb")
    write_wandb_run(tmp_path)
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "wandb", str(tmp_path / "wandb"))
    assert code == 0, err
    state = kept(db, "SELECT state FROM run_files")[0][0]
    assert "--hf_token=<redacted>" in state  # the command line is kept, redacted
    assert stored_secrets(db) == []


def test_wandb_files_only(tmp_path, run_cli):
    """wandb's metadata, config and summary files of an old run (no log)."""
    folder = tmp_path / "wandb" / "run-20261117_020000-abc123" / "files"
    folder.mkdir(parents=True)
    (folder / "wandb-metadata.json").write_text(
        json.dumps(
            {
                "host": "gpu-h01",
                "username": EMAIL,
                "email": EMAIL,
                "program": COMMAND,
                "args": COMMAND.split(),
                "startedAt": "2026-11-17T02:00:00",
            }
        )
    )
    (folder / "config.yaml").write_text(
        "\n".join(f"{json.dumps(k)}: {{value: {json.dumps(v)}}}" for k, v in PARAMS.items())
    )
    (folder / "wandb-summary.json").write_text(
        json.dumps({"loss": 0.5, "note": COMMAND, "api_key": PLAIN_KEY})
    )
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "wandb", str(tmp_path / "wandb"))
    assert code == 0, err
    assert stored_secrets(db) == []


def test_trainer_logs(tmp_path, run_cli):
    run = tmp_path / "saves" / f"sft-{EMAIL.split('@')[0]}"
    (run / "checkpoint-10").mkdir(parents=True)
    state = {
        "global_step": 10,
        "max_steps": 10,
        "best_model_checkpoint": f"{run}/checkpoint-10 ({EMAIL})",
        "log_history": [{"step": 10, "loss": 1.0, f"eval_{EMAIL}": 0.5}],
    }
    (run / "trainer_state.json").write_text(json.dumps(state))
    (run / "checkpoint-10" / "trainer_state.json").write_text(json.dumps(state))
    (run / "training_args.yaml").write_text(
        "\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in PARAMS.items())
        + f"\nhub_token: {HF}\nrun_name: {json.dumps('by ' + EMAIL)}\n"
    )
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "trainer-logs", str(tmp_path / "saves"))
    assert code == 0, err
    assert stored_secrets(db) == []


def test_tensorboard(tmp_path, run_cli):
    tbx = pytest.importorskip("tensorboardX")
    pytest.importorskip("tensorboard")
    writer = tbx.SummaryWriter(str(tmp_path / "logs" / "sft-a"))
    for step in range(3):
        writer.add_scalar(f"eval/{EMAIL}", step, step)
    writer.add_hparams({**PARAMS, "hub_token": HF}, {"hparam/loss": 0.5})
    writer.close()
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "tensorboard", str(tmp_path / "logs"))
    assert code == 0, err
    assert stored_secrets(db) == []


def test_an_earlier_warehouse_is_scrubbed_on_upgrade(tmp_path, run_cli):
    """What versions before this policy stored (here written into the tables as they did)
    is rewritten by the migration: the same redaction, in SQL. (The blocks DuckDB freed keep
    their old bytes until it reuses them: what no query can read any more.)"""
    from audit.warehouse import open_warehouse
    from audit.warehouse.migrations import MIGRATIONS, V14

    db = tmp_path / "old.duckdb"
    open_warehouse(db).close()
    con = duckdb.connect(str(db))
    con.execute(
        "INSERT INTO runs (source_id, run_id, experiment_id, name, user_id, source_name) "
        "VALUES ('s', 'r', 'e', ?, ?, ?)",
        [f"by {EMAIL}", EMAIL, COMMAND],
    )
    con.execute(
        "INSERT INTO experiments (source_id, experiment_id, name) VALUES ('s', 'e', ?)", [EMAIL]
    )
    for key, value in PARAMS.items():
        con.execute(
            "INSERT INTO params VALUES ('s', 'r', ?, ?, try_cast(? AS DOUBLE), ?)",
            [key, value, value, value],
        )
        con.execute("INSERT INTO tags VALUES ('s', 'r', ?, ?)", [key, value])
    con.execute("INSERT INTO metrics VALUES ('s', 'r', ?, 1.0, 1, NULL)", [f"eval/{EMAIL}"])
    con.execute(
        "INSERT INTO dataset_inputs VALUES ('s', 'r', 'd', 'x', 'http', ?, 'train')", [DATA_URL]
    )
    state = json.dumps({"user": EMAIL, "args": COMMAND.split(), "config": {"k": DATA_URL}})
    con.execute("INSERT INTO run_files VALUES ('s', 'r', '/x', 1, now(), 1, ?)", [state])
    con.execute(
        "UPDATE audit_meta SET value = ? WHERE key = 'schema_version'",
        [str(MIGRATIONS.index(V14))],
    )
    con.close()
    assert stored_secrets(db, file_bytes=False)  # planted
    code, _, err = run_cli("--db", str(db), "status")
    assert code == 0, err
    assert stored_secrets(db, file_bytes=False) == []
    assert kept(db, "SELECT user_id FROM runs") == [("ann.secret",)]
    params = dict(kept(db, "SELECT key, value_norm FROM params"))
    assert params["max_new_tokens"] == "512" and params["api_key"] == "<redacted>"
    assert json.loads(kept(db, "SELECT state FROM run_files")[0][0])["args"][1] == (
        "--hf_token=<redacted>"
    )


def test_a_50_mb_value_is_redacted_in_linear_time():
    """The patterns run on every stored text: a long prompt in a config must cost time in
    proportion to its length (the e-mail pattern before took 17 s on 80 KB)."""
    import time

    from audit.redact import redact_texts

    def seconds(size: int) -> float:
        texts = ["x@" * (size // 4) + "--hf_token=" * (size // 22)]
        started = time.perf_counter()
        redact_texts(texts)
        return time.perf_counter() - started

    seconds(1 << 20)  # warm up
    small = min(seconds(1 << 20) for _ in range(3))
    large = seconds(50 << 20)
    # 50× the text: linear is ~50× the time; allow noise, refuse anything quadratic
    assert large < 150 * max(small, 1e-3), (small, large)

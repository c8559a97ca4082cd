"""Real parts for tests: an mlflow server process, reference runs logged with the client."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import duckdb
import requests

REPO = Path(__file__).resolve().parent.parent
# The real files sit beside the main checkout; a worktree elsewhere points AUDIT_REALDATA
# there (a git worktree one level deeper finds them by itself).
SHARED = Path(
    os.environ.get("AUDIT_REALDATA")
    or next(
        (
            p / "shared" / "realdata"
            for p in (REPO.parent, REPO.parent.parent)
            if (p / "shared" / "realdata").is_dir()
        ),
        REPO.parent / "shared" / "realdata",
    )
)


# Every corpus tally made in this session (tests/robustness/conftest.py writes them at its end).
TALLIES: list[CorpusTally] = []


class CorpusTally:
    """What each case of a corpus of bad inputs did, "rejected" or "accepted", counted per
    kind for the reliability page (``test-artifacts/<file_name>``). Kept per case, so the
    order tests run in does not matter and a case cannot count twice; written at the end of
    the session only when every case has an outcome (a run of some cases, or one where a
    case failed before its outcome, leaves the last whole tally in place)."""

    def __init__(self, file_name: str, cases: list[tuple[str, str]], register: bool = True):
        self.file_name = file_name
        self.cases = set(cases)  # (kind, name)
        if len(self.cases) != len(cases):
            raise ValueError(f"{file_name}: a case is listed twice")
        self.outcomes: dict[tuple[str, str], str] = {}
        if register:
            TALLIES.append(self)

    def record(self, kind: str, name: str, outcome: str) -> None:
        case = (kind, name)
        if case not in self.cases:
            raise KeyError(f"{case} is not a case of the {self.file_name} corpus")
        if case in self.outcomes:
            raise ValueError(f"{case} was counted already")
        if outcome not in ("rejected", "accepted"):
            raise ValueError(f"unknown outcome {outcome!r}")
        self.outcomes[case] = outcome

    def complete(self) -> bool:
        return self.outcomes.keys() == self.cases

    def text(self) -> str:
        missing = sorted(self.cases - self.outcomes.keys())
        if missing:
            raise ValueError(
                f"{len(missing)} of {len(self.cases)} cases have no outcome: {missing[0]}"
            )
        per_kind = Counter(f"{kind}: {outcome}" for (kind, _), outcome in self.outcomes.items())
        lines = [f"{key}: {count}\n" for key, count in sorted(per_kind.items())]
        return f"cases: {len(self.outcomes)}\n" + "".join(lines)


def property_examples(replay: int, explore: int) -> int:
    """Examples of a property test: few in `make test` (the replay profile), many in
    `make fuzz` (explore); AUDIT_PROPERTY_EXAMPLES overrides both."""
    if os.environ.get("AUDIT_PROPERTY_EXAMPLES"):
        return int(os.environ["AUDIT_PROPERTY_EXAMPLES"])
    return explore if os.environ.get("AUDIT_HYPOTHESIS") == "explore" else replay


# address space of a command run on hostile input: a runaway allocation fails, never swaps
MEMORY_LIMIT = 3 << 30


def bound_address_space() -> None:
    """``preexec_fn`` of a command run on hostile input: at most ``MEMORY_LIMIT``."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def now_ms() -> int:
    """Now in milliseconds since the epoch, MLflow's unit for times."""
    return int(time.time() * 1000)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mlflow_server(workdir: Path, backend_uri: str | None = None):
    """A real ``mlflow server`` on 127.0.0.1 (SQLite backend unless ``backend_uri``);
    yields (url, backend_db)."""
    workdir.mkdir(parents=True, exist_ok=True)
    backend = workdir / "backend.db"
    port = free_port()
    log = open(workdir / "server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            backend_uri or f"sqlite:///{backend}",
            "--default-artifact-root",
            str(workdir / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env={**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited: {(workdir / 'server.log').read_text()[-2000:]}"
                )
            try:
                if requests.get(f"{url}/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not start in 120 s")
            time.sleep(0.3)
        yield url, backend
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def log_reference_runs(tracking_uri: str) -> dict[str, str]:
    """Log a small but varied history with the real client; returns run name -> run id.

    Covers nested metric keys, NaN values, numeric param spellings, booleans, datasets,
    a failed and a deleted run, a deleted experiment and a registered model.
    """
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    t0 = 1_794_787_200_000
    exp_a = client.create_experiment("sft-coder")
    exp_b = client.create_experiment("rl-coder")
    exp_gone = client.create_experiment("scratch")
    ids: dict[str, str] = {}
    specs = [
        ("sft-a", exp_a, "FINISHED", {"learning_rate": "1e-5", "bf16": "True", "lora_rank": "64"}),
        (
            "sft-b",
            exp_a,
            "FINISHED",
            {"learning_rate": "0.00001", "bf16": "true", "lora_rank": "64.0"},
        ),
        ("sft-c", exp_a, "FAILED", {"learning_rate": "1E-5", "bf16": "FALSE", "lora_rank": "8"}),
        ("rl-a", exp_b, "FINISHED", {"learning_rate": "2e-06", "kl_coef": "0.050", "method": "rl"}),
        ("rl-deleted", exp_b, "KILLED", {"learning_rate": "3e-06", "note": "debug run"}),
        ("tmp", exp_gone, "FINISHED", {"x": "1"}),
    ]
    for i, (name, exp, status, params) in enumerate(specs):
        start = t0 + i * 3_600_000
        run = client.create_run(
            exp,
            start_time=start,
            run_name=name,
            tags={"team": "coder" if i % 2 == 0 else "agents", "slurm_job_id": str(100 + i)},
        )
        run_id = run.info.run_id
        ids[name] = run_id
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
        metrics = [Metric("train/loss", 2.0 / (s + 1), start + s * 1000, s) for s in range(0, 40)]
        metrics += [
            Metric("eval/general/mmlu", 0.7 - 0.001 * s, start + s * 1000, s)
            for s in range(0, 40, 10)
        ]
        metrics.append(
            Metric(
                "eval/target/pass_at_1", math.nan if name == "sft-c" else 0.4, start + 50_000, 40
            )
        )
        client.log_batch(run_id, metrics=metrics)
        if exp == exp_a:
            log_train_dataset(client, run_id, "codeedit", "d1g357", "/data/codeedit.jsonl")
        client.set_terminated(run_id, status, end_time=start + 1_800_000)
    client.delete_run(ids["rl-deleted"])
    client.delete_experiment(exp_gone)
    client.create_registered_model("coder-sft")
    source = client.get_run(ids["sft-a"]).info.artifact_uri + "/model"
    client.create_model_version("coder-sft", source, run_id=ids["sft-a"])
    return ids


def log_train_dataset(client, run_id: str, name: str, digest: str, source: str) -> None:
    """Record a dataset as the run's training input, as MLflow's dataset tracking does."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    dataset = Dataset(name=name, digest=digest, source_type="local", source=source)
    client.log_inputs(run_id, [DatasetInput(dataset, [InputTag("mlflow.data.context", "train")])])


def copy_store_run(con, run: str, new: str, tables: tuple[str, ...]) -> None:
    """Every row of ``run`` in ``tables`` of a raw MLflow SQLite store, again under run id
    ``new`` (rows already there are left as they are)."""
    for table in tables:
        columns = [c for (_, c, *_) in con.execute(f"PRAGMA table_info({table})")]
        picked = ", ".join("?" if c == "run_uuid" else c for c in columns)
        con.execute(
            f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) "
            f"SELECT {picked} FROM {table} WHERE run_uuid = ?",
            [new, run],
        )


def rows(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    """The rows ``sql`` gives on the warehouse file ``db``, opened read-only for the query."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


# Append-only logs of imports: an import that changes no data still adds a row to them.
LOG_TABLES = ("import_log", "file_imports")


def table_counts(db: Path, writable: bool = False, logs: bool = True) -> dict[str, int]:
    """Rows per table of the warehouse ``db`` (``Warehouse.table_counts``: every table, so
    a before/after comparison misses none), without ``LOG_TABLES`` unless ``logs``.
    ``writable`` opens it as the next import does, replaying the log a killed or
    interrupted command left."""
    from audit.warehouse import open_warehouse

    with open_warehouse(db, read_only=not writable, create=False) as warehouse:
        counts = warehouse.table_counts()
    return {t: n for t, n in counts.items() if logs or t not in LOG_TABLES}


def warehouse_rows(db: Path) -> dict[str, list[tuple]]:
    """Table contents keyed by run name instead of store-specific ids, for comparisons."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        names = dict(con.execute("SELECT run_id, name FROM runs").fetchall())
        out = {
            "runs": sorted(
                con.execute(
                    "SELECT name, user_id, status, start_time, end_time, lifecycle_stage, source_commit FROM runs"
                ).fetchall()
            ),
            "experiments": sorted(
                con.execute("SELECT name, lifecycle_stage FROM experiments").fetchall()
            ),
        }
        for table, cols in {
            "params": "key, value, value_num, value_norm",
            "tags": "key, value",
            "metrics": "key, value, step, ts",
            "latest_metrics": "key, value, step, ts",
            "dataset_inputs": "name, digest, source_type, source, context",
        }.items():
            rows = con.execute(f"SELECT run_id, {cols} FROM {table}").fetchall()
            out[table] = sorted(
                (
                    names[r[0]],
                    *(("nan" if isinstance(v, float) and math.isnan(v) else v) for v in r[1:]),
                )
                for r in rows
                if not (table == "tags" and r[1].startswith("mlflow.") and r[1] != "mlflow.runName")
            )
        out["model_versions"] = sorted(
            (n, v, names.get(r))
            for n, v, r in con.execute(
                "SELECT name, version, run_id FROM model_versions"
            ).fetchall()
        )
        return out
    finally:
        con.close()


@contextmanager
def rolled_back(con):
    """A transaction rolled back when the block ends, whatever happens in it: rows written
    into ``schema_warehouse`` for one test (or one hypothesis example) and gone after."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    finally:
        con.execute("ROLLBACK")


def hf_checkpoint(folder: Path, best: str | None = None, size: int = 1000, files: int = 0) -> None:
    """A Hugging Face Trainer checkpoint folder ``checkpoint-<step>``: weights of ``size``
    bytes, a trainer state naming ``best`` as the best checkpoint, ``files`` extra shards."""
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * size)
    step = int(folder.name.split("-")[1])
    state = {"global_step": step, "best_model_checkpoint": best}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    for shard in range(files):
        (folder / f"shard-{shard:05d}.bin").write_bytes(b"s")


def audit_process(db: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """The real `audit` command in its own process (for signals, kills and locks)."""
    return subprocess.Popen(
        [sys.executable, "-m", "audit", "--db", str(db), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def add_samples(con, columns: str, rows: list[tuple]) -> None:
    """GPU samples written as the importers write them (``audit.warehouse.samples``; the
    view ``gpu_samples`` takes no INSERT): ``columns`` names the tuples' fields, e.g.
    ``"host, gpu, ts, origin"``."""
    import polars as pl

    from audit.warehouse.samples import READING_SCHEMA, append_samples

    names = [name.strip() for name in columns.split(",")]
    schema = {name: READING_SCHEMA.get(name, pl.String) for name in names}
    append_samples(con, pl.DataFrame(rows, schema=schema, orient="row"))

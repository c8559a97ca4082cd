"""An import's incremental link refresh gives exactly the links a full derivation gives.

``refresh_links(changed=...)`` derives only what the changed runs can move (their job
links, the checkpoint links they are or become candidates for, the system-metric samples
of their jobs' hosts). The property: after any history of runs, jobs, checkpoints and
system metrics, and any change to some runs (new ones, or old ones with other users,
times, tags, output dirs, artifact folders or metrics), the incremental refresh leaves
``run_jobs``, ``checkpoint_runs`` and ``gpu_samples`` as a full derivation leaves them.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.config import load_config
from audit.importers.links import refresh_links, refresh_links_of_runs
from audit.warehouse import open_warehouse
from audit.warehouse.frames import insert_frame
from tests.helpers import add_samples

T0 = datetime(2026, 11, 2)
RUN_IDS = [f"{i:032x}" for i in range(1, 6)]  # run ids as MLflow makes them: 32 hex digits
SOURCES = ["s1", "s2"]
USERS = ["ann", "bob"]
HOSTS = ["n1", "n2", "n3"]
DIRS = ["/scratch/a", "/scratch/a/x", "/ckpt/c"]

run_spec = st.fixed_dictionaries(
    {
        "user": st.sampled_from(USERS),
        "start": st.integers(0, 30),
        "hours": st.integers(1, 10),
        "job_tag": st.none() | st.sampled_from(["1", "2", "3", "4", "99"]),
        # as logged on the cluster (mapped by path_prefixes) or as seen here
        "output_dir": st.none() | st.sampled_from([*DIRS, "/cluster/a", "/cluster/a/x/"]),
        "artifact_dir": st.none() | st.sampled_from(DIRS),
        # system metric points (gpu, minute, value): collide on purpose across runs
        "points": st.lists(
            st.tuples(st.sampled_from(["0", "1"]), st.integers(0, 3), st.integers(0, 100)),
            max_size=4,
        ),
    }
)
job_spec = st.fixed_dictionaries(
    {
        "user": st.sampled_from(USERS),
        "start": st.integers(0, 30),
        "hours": st.integers(1, 12),
        "host": st.sampled_from(HOSTS),
    }
)
checkpoint_spec = st.sampled_from(
    [f"{d}/checkpoint-1" for d in DIRS]
    + [f"/scratch/runs/{RUN_IDS[i]}/checkpoint-1" for i in (0, 3)]
)


@st.composite
def world(draw) -> dict:
    """A history and a change to it, mostly to runs that exist and links that exist."""
    keys = st.tuples(st.sampled_from(SOURCES), st.sampled_from(RUN_IDS))
    runs = draw(st.dictionaries(keys, run_spec, min_size=1, max_size=8))
    changed_keys = draw(
        st.lists(st.sampled_from(sorted(runs)) | keys, min_size=1, max_size=5, unique=True)
    )
    return {
        "runs": runs,
        "jobs": draw(st.lists(job_spec, min_size=1, max_size=4)),
        "checkpoints": draw(st.lists(checkpoint_spec, min_size=1, max_size=6, unique=True)),
        "telemetry": draw(
            st.lists(
                st.tuples(st.sampled_from(HOSTS), st.sampled_from(["0", "1"]), st.integers(0, 3)),
                max_size=3,
                unique=True,
            )
        ),
        "changes": {key: draw(run_spec) for key in changed_keys},
    }


def _write_run(con, source_id: str, run_id: str, spec: dict) -> None:
    start = T0 + timedelta(hours=spec["start"])
    artifact = f"file://{spec['artifact_dir']}/{run_id}" if spec["artifact_dir"] else None
    con.execute(
        "INSERT INTO runs (source_id, run_id, user_id, start_time, end_time, artifact_uri) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [source_id, run_id, spec["user"], start, start + timedelta(hours=spec["hours"]), artifact],
    )
    if spec["job_tag"]:
        con.execute(
            "INSERT INTO tags VALUES (?, ?, 'slurm_job_id', ?)",
            [source_id, run_id, spec["job_tag"]],
        )
    if spec["output_dir"]:
        con.execute(
            "INSERT INTO params (source_id, run_id, key, value) VALUES (?, ?, 'output_dir', ?)",
            [source_id, run_id, spec["output_dir"]],
        )
    for gpu, minute, value in spec["points"]:
        con.execute(
            "INSERT INTO metrics VALUES (?, ?, ?, ?, 0, ?)",
            [
                source_id,
                run_id,
                f"system/gpu_{gpu}_utilization_percentage",
                float(value),
                start + timedelta(minutes=minute),
            ],
        )


def _delete_run(con, source_id: str, run_id: str) -> None:
    for table in ("runs", "params", "tags", "metrics"):
        con.execute(f"DELETE FROM {table} WHERE source_id = ? AND run_id = ?", [source_id, run_id])


def _links(con) -> dict[str, list[tuple]]:
    return {
        "run_jobs": con.execute("SELECT * FROM run_jobs ORDER BY ALL").fetchall(),
        "checkpoint_runs": con.execute("SELECT * FROM checkpoint_runs ORDER BY ALL").fetchall(),
        # which of several runs logging the same (host, gpu, time) a merged sample names
        # is any_value's choice, in a full derivation too: the values are compared
        "gpu_samples": con.execute(
            "SELECT host, gpu, ts, util_pct, origin FROM gpu_samples ORDER BY ALL"
        ).fetchall(),
    }


def _build(con, data: dict) -> None:
    for number, job in enumerate(data["jobs"], start=1):
        start = T0 + timedelta(hours=job["start"])
        insert_frame(
            con,
            "jobs",
            pl.DataFrame(
                [
                    {
                        "cluster": "default",
                        "job_id": str(number),
                        "user_name": job["user"],
                        "start_time": start,
                        "end_time": start + timedelta(hours=job["hours"]),
                    }
                ]
            ),
        )
        con.execute("INSERT INTO job_nodes VALUES ('default', ?, ?)", [str(number), job["host"]])
    for path in data["checkpoints"]:
        con.execute(
            "INSERT INTO checkpoints (root, path, kind, bytes, files) VALUES ('/', ?, 'hf', 1, 1)",
            [path],
        )
    add_samples(
        con,
        "host, gpu, ts, util_pct, origin",
        [
            (host, gpu, T0 + timedelta(hours=hour), 50.0, "nvidia-smi")
            for host, gpu, hour in data["telemetry"]
        ],
    )
    for (source_id, run_id), spec in data["runs"].items():
        _write_run(con, source_id, run_id, spec)


def _change(con, data: dict) -> dict[str, list[str]]:
    changed: dict[str, list[str]] = {}
    for (source_id, run_id), spec in data["changes"].items():
        _delete_run(con, source_id, run_id)
        _write_run(con, source_id, run_id, spec)
        changed.setdefault(source_id, []).append(run_id)
    return changed


CONFIG_TEXT = '[links]\npath_prefixes = { "/cluster" = "/scratch" }\n'


@contextmanager
def _history(data):
    """A new warehouse holding the drawn history, and the config its links are made with."""
    with tempfile.TemporaryDirectory() as folder:
        config_path = Path(folder) / "audit.toml"
        config_path.write_text(CONFIG_TEXT)
        config = load_config(config_path)
        wh = open_warehouse(Path(folder) / "w.duckdb")
        try:
            _build(wh.con, data)
            yield wh.con, config
        finally:
            wh.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=world())
def test_incremental_refresh_equals_full_derivation(data):
    with _history(data) as (con, config):
        refresh_links(con, config)  # the links of the history, settings stored
        changed = _change(con, data)
        refresh_links(con, config, changed=changed)
        incremental = _links(con)
        refresh_links(con, config)
        assert incremental == _links(con)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=world())
def test_refresh_of_runs_with_other_settings_leaves_links_to_the_next_import(data):
    """A single-run refresh under settings other than the stored ones changes no link (the
    next import derives them all and compares); under the stored ones it is exact."""
    with _history(data) as (con, config):
        refresh_links(con, config)
        before = _links(con)
        changed = _change(con, data)
        refresh_links_of_runs(con, load_config(None), changed)
        assert _links(con) == before
        refresh_links_of_runs(con, config, changed)
        incremental = _links(con)
        refresh_links(con, config)
        assert incremental == _links(con)

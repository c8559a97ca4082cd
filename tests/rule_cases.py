"""Loading a rule case (tests/cases/<CODE>.yml) into a real warehouse file."""

from __future__ import annotations

import base64
import gzip
import json
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import yaml

from audit.config import load_config
from audit.importers.files import insert_frame
from audit.importers.links import refresh_links
from audit.importers.params import normalised_params
from audit.warehouse import open_warehouse

CASES = Path(__file__).parent / "cases"
T0 = datetime(2026, 11, 16)


def at(value) -> datetime | None:
    """Hours after 2026-11-16T00:00 (numbers) or ISO text."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return T0 + timedelta(hours=value)
    return datetime.fromisoformat(str(value))


def load_case_files() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(CASES.glob("*.yml")):
        document = yaml.safe_load(path.read_text())
        for case in document["cases"]:
            out.append((document["rule"], case))
    return out


def build_warehouse(path: Path, data: dict, config_text: str = ""):
    config_file = path.with_suffix(".toml")
    config_file.write_text(config_text)
    config = load_config(config_file)
    wh = open_warehouse(path)
    con = wh.con
    for run in data.get("runs", []):
        row = {
            "source_id": "s",
            "run_id": run["run_id"],
            "experiment_id": "1",
            "name": run.get("name", run["run_id"]),
            "user_id": run.get("user", "ann"),
            "status": run.get("status", "FINISHED"),
            "start_time": at(run.get("start", 0)),
            "end_time": at(run.get("end", 1)),
            "lifecycle_stage": run.get("lifecycle", "active"),
            "source_commit": run.get("commit", "abc"),
            "artifact_uri": run.get("artifact_uri"),
        }
        insert_frame(con, "runs", pl.DataFrame([row]))
        params = [
            {"run_id": run["run_id"], "key": k, "value": str(v)}
            for k, v in run.get("params", {}).items()
        ]
        if params:
            insert_frame(
                con,
                "params",
                normalised_params(pl.DataFrame(params)).with_columns(source_id=pl.lit("s")),
            )
        for key, value in run.get("tags", {}).items():
            con.execute("INSERT INTO tags VALUES ('s', ?, ?, ?)", [run["run_id"], key, str(value)])
        for key, points in run.get("metrics", {}).items():
            for step, hour, value in points:
                con.execute(
                    "INSERT INTO metrics VALUES ('s', ?, ?, ?, ?, ?)",
                    [run["run_id"], key, value, step, at(hour)],
                )
            step, hour, value = max(points)
            con.execute(
                "INSERT INTO latest_metrics VALUES ('s', ?, ?, ?, ?, ?)",
                [run["run_id"], key, value, step, at(hour)],
            )
        for ds in run.get("datasets", []):
            con.execute(
                "INSERT INTO dataset_inputs VALUES ('s', ?, ?, ?, 'local', ?, 'train')",
                [run["run_id"], ds["name"], ds["digest"], f"/data/{ds['name']}"],
            )
        if run.get("registered"):
            con.execute(
                "INSERT INTO model_versions VALUES ('s', 'm', '1', ?, ?, 'READY', NULL, NULL)",
                [run["run_id"], run["registered"] if isinstance(run["registered"], str) else None],
            )
    for job in data.get("jobs", []):
        start, end = at(job.get("start", 0)), at(job.get("end", 1))
        row = {
            "cluster": "default",
            "job_id": str(job["job_id"]),
            "name": job.get("name", "train"),
            "user_name": job.get("user", "ann"),
            "account": job.get("account", "lab"),
            "state": job.get("state", "COMPLETED"),
            "start_time": start,
            "end_time": end,
            "elapsed_s": int((end - start).total_seconds()),
            "timelimit_s": int(job["limit_h"] * 3600) if "limit_h" in job else None,
            "nnodes": 1,
            "gpus": job.get("gpus", 8),
            "gpu_type": job.get("gpu_type", "h100"),
        }
        # sacct's per-job GPU usage (TRESUsageInMax rolled up from the steps), when given
        for key in ("max_gpu_util_pct", "max_gpu_mem_bytes", "admin_comment"):
            if key in job:
                row[key] = job[key]
        if "jobstats" in job:  # a jobstats summary as its epilog stores it: JS1:<base64 gzip JSON>
            packed = gzip.compress(json.dumps(job["jobstats"]).encode())
            row["admin_comment"] = "JS1:" + base64.b64encode(packed).decode()
        insert_frame(con, "jobs", pl.DataFrame([row]))
        con.execute(
            "INSERT INTO job_nodes VALUES ('default', ?, ?)",
            [str(job["job_id"]), job.get("host", "n1")],
        )
    for spec in data.get("telemetry", []):
        rows = []
        t, end = at(spec["start"]), at(spec["end"])
        step = timedelta(minutes=spec.get("step_minutes", 5))
        util = {str(k): v for k, v in spec.get("util", {}).items()}
        while t <= end:
            for gpu in range(spec.get("gpus", 8)):
                value = util.get(str(gpu), util.get("default", 0))
                rows.append(
                    {
                        "host": spec.get("host", "n1"),
                        "gpu": str(gpu),
                        "ts": t,
                        "util_pct": float(value),
                        "mem_used_mib": float(spec.get("mem_mib", 60000 if value else 3)),
                        "mem_total_mib": 81559.0,
                        "model": "NVIDIA H100 80GB HBM3",
                        "origin": "nvidia-smi",
                    }
                )
            t += step
        insert_frame(
            con,
            "gpu_samples",
            pl.DataFrame(rows).with_columns(
                pl.col("util_pct", "mem_used_mib", "mem_total_mib").cast(pl.Float32)
            ),
        )
    for c in data.get("checkpoints", []):
        con.execute(
            "INSERT INTO checkpoints (root, path, kind, step, bytes, files, mtime, is_best, run_dir) "
            "VALUES ('/ckpt', ?, 'hf', ?, ?, 3, ?, ?, ?)",
            [
                c["path"],
                c.get("step"),
                int(c["gb"] * 1e9),
                at(c.get("hour", 0)),
                c.get("best", False),
                c["path"].rsplit("/", 1)[0],
            ],
        )
    refresh_links(con, config)
    return wh, config

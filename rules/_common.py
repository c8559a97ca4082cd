"""Queries shared by several rules: run cost attribution and GPU usage inside a time window.

Kept beside the rules (not a rule module: the leading underscore keeps the registry away).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl

from audit.engine import RuleContext
from audit.warehouse.intervals import sample_hour, window_hours

HOUR = 3600.0


def run_facts(ctx: RuleContext) -> list[dict]:
    """One row per run (see ``_run_facts``), computed once per scan: callers must not modify
    the rows."""
    return ctx.once(("run_facts",), lambda: _run_facts(ctx))


def _run_facts(ctx: RuleContext) -> list[dict]:
    """One row per run: team, method, base model, its job, GPU-hours and their price.

    GPU-hours come from the linked Slurm job (GPUs × elapsed), else the ``num_gpus`` param ×
    the run's duration. Team: the configured run tag, else the job's Slurm account, else
    the MLflow user. Method: the first configured param or tag (``sft``, ``rl``, ``opd``).
    """
    attribution = ctx.config.values["attribution"]
    rows = ctx.rows(
        """
        WITH method AS (
            SELECT source_id, run_id, lower(arg_min(value, pos)) AS method FROM (
                SELECT source_id, run_id, value, list_position(?, key) * 2 AS pos FROM params WHERE list_contains(?, key)
                UNION ALL
                SELECT source_id, run_id, value, list_position(?, key) * 2 + 1 FROM tags WHERE list_contains(?, key)
            ) GROUP BY ALL
        ),
        base AS (
            SELECT source_id, run_id, arg_min(value, list_position(?, key)) AS base_model
            FROM params WHERE list_contains(?, key) GROUP BY ALL
        )
        SELECT r.source_id, r.run_id, r.name, r.status, r.lifecycle_stage, r.start_time, r.end_time, r.user_id,
               r.experiment_id, coalesce(t.value, j.account, r.user_id) AS team, m.method, b.base_model,
               rj.cluster, rj.job_id, j.gpus AS job_gpus, j.gpu_type, j.start_time AS job_start,
               j.end_time AS job_end, j.elapsed_s, j.state AS job_state, p.value_num AS param_gpus,
               epoch(r.end_time - r.start_time) / 3600.0 AS run_hours
        FROM runs r
        LEFT JOIN tags t ON t.source_id = r.source_id AND t.run_id = r.run_id AND t.key = ?
        LEFT JOIN method m ON m.source_id = r.source_id AND m.run_id = r.run_id
        LEFT JOIN base b ON b.source_id = r.source_id AND b.run_id = r.run_id
        LEFT JOIN run_jobs rj ON rj.source_id = r.source_id AND rj.run_id = r.run_id
        LEFT JOIN jobs j ON j.cluster = rj.cluster AND j.job_id = rj.job_id
        LEFT JOIN params p ON p.source_id = r.source_id AND p.run_id = r.run_id AND p.key = 'num_gpus'
        ORDER BY r.start_time, r.run_id
        """,
        [
            attribution["method_keys"],
            attribution["method_keys"],
            attribution["method_keys"],
            attribution["method_keys"],
            attribution["base_model_keys"],
            attribution["base_model_keys"],
            attribution["team_tag"],
        ],
    )
    for row in rows:
        if row["job_id"] is not None and row["job_gpus"] and row["elapsed_s"] is not None:
            row["gpus"] = row["job_gpus"]
            row["hours"] = row["elapsed_s"] / HOUR
            row["cost_basis"] = (
                f"Slurm job {row['job_id']}: {row['job_gpus']} GPUs × {row['hours']:.2f} h elapsed"
            )
        elif row["param_gpus"] is not None and row["run_hours"] is not None:
            row["gpus"] = row["param_gpus"]
            row["hours"] = row["run_hours"]
            row["cost_basis"] = (
                f"num_gpus param {row['param_gpus']:g} × run duration {row['hours']:.2f} h"
            )
        else:
            row["gpus"], row["hours"], row["cost_basis"] = (
                None,
                None,
                "unknown (no job and no num_gpus param)",
            )
        row["gpu_hours"] = row["gpus"] * row["hours"] if row["gpus"] is not None else None
        row["price"], row["price_key"] = ctx.gpu_price(row["gpu_type"])
        row["usd"] = row["gpu_hours"] * row["price"] if row["gpu_hours"] is not None else None
    return rows


def money(gpu_hours: float, price: float, price_key: str) -> str:
    return f"{gpu_hours:.2f} GPU-h × ${price:.2f}/GPU-h ({price_key}) = ${gpu_hours * price:,.2f}"


@dataclass
class Usage:
    """GPU activity of one allocation (or part of it) in a window."""

    status: str  # ok | no telemetry | ambiguous
    gpus: int  # GPUs the allocation holds
    per_gpu: list[dict]  # the allocation's GPUs: host, gpu, mean util, max memory, samples
    hosts: list[str]
    samples: int = 0
    model: str | None = None

    @property
    def mean_util(self) -> float:
        return sum(g["util"] for g in self.per_gpu) / len(self.per_gpu) if self.per_gpu else 0.0

    def busy(self, threshold: float) -> list[dict]:
        return [g for g in self.per_gpu if g["util"] > threshold]


def gpu_usage(ctx: RuleContext, windows: list[dict]) -> dict[str, Usage]:
    """Per window (key, cluster, job_id, gpus, start, end): the activity of the job's GPUs.

    Telemetry is per host; a job owns the samples of its hosts inside its allocation when
    no other job ran on the same host at the same time (else: ``ambiguous``). When a job
    holds fewer GPUs than the host has, its GPUs are taken to be the busiest ones there
    (the scheduler's GPU indices are not in sacct): this can only understate idleness.
    """
    if not windows:
        return {}
    frame = pl.DataFrame(
        [{k: w[k] for k in ("key", "cluster", "job_id", "gpus", "start", "end")} for w in windows],
        schema={
            "key": pl.String,
            "cluster": pl.String,
            "job_id": pl.String,
            "gpus": pl.Int64,
            "start": pl.Datetime("us"),
            "end": pl.Datetime("us"),
        },
    )
    ctx.con.register("audit_windows", frame)
    try:
        per_gpu = ctx.rows(
            f"""
            SELECT w.key, s.host, s.gpu, avg(s.util_pct) AS util, max(s.mem_used_mib) AS mem,
                   max(s.mem_total_mib) AS mem_total, count(*) AS samples, any_value(s.model) AS model
            FROM {window_hours("audit_windows")} w
            JOIN gpu_samples s ON s.host = w.host AND {sample_hour("s.ts")} = w.hour
                 AND s.ts >= w.lo AND s.ts < w.hi
            GROUP BY ALL ORDER BY w.key, s.host, s.gpu
            """
        )
        shared = {
            r["key"]
            for r in ctx.rows(
                """
                SELECT DISTINCT w.key FROM audit_windows w
                JOIN job_nodes a ON a.cluster = w.cluster AND a.job_id = w.job_id
                JOIN job_nodes b ON b.host = a.host AND NOT (b.cluster = a.cluster AND b.job_id = a.job_id)
                JOIN jobs o ON o.cluster = b.cluster AND o.job_id = b.job_id
                WHERE o.start_time < w."end" AND coalesce(o.end_time, TIMESTAMP '9999-12-31') > w.start
                """
            )
        }
        hosts = {}
        for r in ctx.rows(
            "SELECT w.key, list(n.host ORDER BY n.host) AS hosts FROM audit_windows w "
            "JOIN job_nodes n ON n.cluster = w.cluster AND n.job_id = w.job_id GROUP BY w.key"
        ):
            hosts[r["key"]] = r["hosts"]
    finally:
        ctx.con.unregister("audit_windows")
    by_key: dict[str, list[dict]] = {}
    for row in per_gpu:
        by_key.setdefault(row["key"], []).append(row)
    out = {}
    for w in windows:
        rows = by_key.get(w["key"], [])
        host_list = hosts.get(w["key"], [])
        if not rows:
            out[w["key"]] = Usage("no telemetry", w["gpus"], [], host_list)
            continue
        gpus_seen = len(rows)
        if w["key"] in shared and gpus_seen > w["gpus"]:
            out[w["key"]] = Usage(
                "ambiguous", w["gpus"], [], host_list, sum(r["samples"] for r in rows)
            )
            continue
        chosen = sorted(rows, key=lambda r: (-(r["util"] or 0), r["host"], r["gpu"]))[: w["gpus"]]
        for r in chosen:
            r["util"] = float(r["util"] or 0.0)
        out[w["key"]] = Usage(
            "ok",
            w["gpus"],
            sorted(chosen, key=lambda r: (r["host"], r["gpu"])),
            host_list,
            sum(r["samples"] for r in rows),
            rows[0]["model"],
        )
    return out


def job_rows(ctx: RuleContext, min_hours: float) -> list[dict]:
    """GPU jobs in the scan window that ran at least ``min_hours``."""
    condition, params = ctx.in_window("j.start_time")
    return ctx.rows(
        f"""
        SELECT j.*, epoch(j.end_time - j.start_time) / 3600.0 AS hours,
               (SELECT list(DISTINCT r.run_id) FROM run_jobs r WHERE r.cluster = j.cluster AND r.job_id = j.job_id) AS run_ids
        FROM jobs j
        WHERE j.gpus > 0 AND j.start_time IS NOT NULL AND j.end_time IS NOT NULL
          AND epoch(j.end_time - j.start_time) / 3600.0 >= ? AND {condition}
        ORDER BY j.start_time, j.cluster, j.job_id
        """,
        [min_hours, *params],
    )


def job_subject(job: dict) -> dict:
    subject = {"cluster": job["cluster"], "job_id": job["job_id"]}
    if job.get("run_ids"):
        subject["run_id"] = job["run_ids"][0]
    return subject


def team_of_job(job: dict) -> str | None:
    return job.get("account") or job.get("user_name")


def hours_between(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds() / HOUR


def _jobs_with_usage(ctx: RuleContext, min_hours: float) -> tuple[list[dict], dict[str, Usage]]:
    jobs = job_rows(ctx, min_hours)
    windows = [
        {
            "key": j["job_id"],
            "cluster": j["cluster"],
            "job_id": j["job_id"],
            "gpus": j["gpus"],
            "start": j["start_time"],
            "end": j["end_time"],
        }
        for j in jobs
    ]
    return jobs, gpu_usage(ctx, windows)


def judged_jobs(ctx: RuleContext, min_hours: float):
    """(job, usage) for every GPU job long enough to judge whose telemetry is unambiguous.

    Jobs without usable telemetry are recorded as notes ("job 123: ambiguous"), not passed.
    """
    # every GPU job once per scan (four rules judge them), each rule keeps its long-enough ones
    jobs, usage = ctx.once(("judged_jobs",), lambda: _jobs_with_usage(ctx, 0.0))
    for job in jobs:
        if job["hours"] < min_hours:
            continue
        use = usage[job["job_id"]]
        if use.status != "ok":
            ctx.skip(
                f"job {job['job_id']}: {use.status} for its hosts {', '.join(use.hosts) or '?'}"
            )
            continue
        yield job, use

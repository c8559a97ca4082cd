"""Scan summaries: waste per family, cost and waste per team and training method."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from audit.config import Config
from audit.engine import RuleContext, ScanResult

FAMILIES = {
    "DUP": "duplicate experiments",
    "OVP": "over-provisioning",
    "CKP": "redundant checkpoints",
    "REG": "unmonitored regression",
    "IDL": "idle capacity",
    "SIL": "data silos",
}


def spend(
    con,
    config: Config,
    since: datetime | None,
    until: datetime | None,
    shared: dict | None = None,
) -> list[dict]:
    """What was paid for in the window: every GPU job, plus runs that ran outside Slurm.

    A job's team is its run's team (else the Slurm account, else the user) and its method
    the run's method (``none`` for jobs without a run, e.g. interactive sessions).
    """
    from audit.rules._common import run_facts

    ctx = RuleContext(
        con=con,
        config=config,
        thresholds={},
        since=since,
        until=until,
        shared={} if shared is None else shared,
    )

    def inside(moment: datetime | None) -> bool:
        return (
            moment is not None
            and (since is None or moment >= since)
            and (until is None or moment < until)
        )

    items = []
    linked_jobs = set()
    for run in run_facts(ctx):
        if run["job_id"] is not None:
            if (run["cluster"], run["job_id"]) in linked_jobs:
                continue  # one job, several runs: count the job once
            linked_jobs.add((run["cluster"], run["job_id"]))
            moment = run["job_start"]
        else:
            moment = run["start_time"]
        if inside(moment):
            items.append(
                {
                    "kind": "run",
                    "name": run["name"],
                    "team": run["team"],
                    "method": run["method"],
                    "gpu_hours": run["gpu_hours"],
                    "usd": run["usd"],
                }
            )
    condition, params = ctx.in_window("start_time")
    for job in ctx.rows(
        f"SELECT cluster, job_id, name, account, user_name, gpus, gpu_type, elapsed_s FROM jobs "
        f"WHERE gpus > 0 AND elapsed_s IS NOT NULL AND {condition}",
        params,
    ):
        if (job["cluster"], job["job_id"]) in linked_jobs:
            continue
        price, _ = ctx.gpu_price(job["gpu_type"])
        gpu_hours = job["gpus"] * job["elapsed_s"] / 3600
        items.append(
            {
                "kind": "job",
                "name": job["name"],
                "team": job["account"] or job["user_name"],
                "method": "none",
                "gpu_hours": gpu_hours,
                "usd": gpu_hours * price,
            }
        )
    return items


def summarise(result: ScanResult, con, config: Config, shared: dict | None = None) -> dict:
    """Headline figures of a scan; ``shared`` carries facts computed once per report."""
    active = result.active
    families = []
    for prefix, label in FAMILIES.items():
        items = [f for f in active if f.rule.startswith(prefix)]
        families.append(
            {
                "family": prefix,
                "label": label,
                "findings": len(items),
                "gpu_hours": round(sum(f.gpu_hours for f in items), 3),
                "usd": round(sum(f.usd for f in items), 2),
                "bytes": int(sum(f.bytes for f in items)),
            }
        )
    runs = spend(con, config, result.since, result.until, shared)
    by_team: dict[str, dict] = defaultdict(
        lambda: {"gpu_hours": 0.0, "usd": 0.0, "waste_gpu_hours": 0.0, "waste_usd": 0.0}
    )
    by_method: dict[str, dict] = defaultdict(
        lambda: {"gpu_hours": 0.0, "usd": 0.0, "waste_gpu_hours": 0.0, "waste_usd": 0.0}
    )
    for run in runs:
        for bucket, key in ((by_team, run["team"]), (by_method, run["method"])):
            bucket[key or "unknown"]["gpu_hours"] += run["gpu_hours"] or 0.0
            bucket[key or "unknown"]["usd"] += run["usd"] or 0.0
    for f in active:
        for bucket, key in ((by_team, f.team), (by_method, f.method)):
            bucket[key or "unknown"]["waste_gpu_hours"] += f.gpu_hours
            bucket[key or "unknown"]["waste_usd"] += f.usd
    statuses = {r.rule: r.status for r in result.results}
    return {
        "findings": len(active),
        "suppressed": sum(1 for f in result.findings if f.suppressed),
        "by_severity": {
            s: sum(1 for f in active if f.severity.label == s)
            for s in ("critical", "high", "medium", "low", "info")
        },
        "waste": {
            "gpu_hours": round(sum(f.gpu_hours for f in active), 3),
            "usd": round(sum(f.usd for f in active), 2),
            "bytes": int(sum(f.bytes for f in active)),
        },
        "spend": {
            "runs": sum(1 for r in runs if r["kind"] == "run"),
            "jobs_without_run": sum(1 for r in runs if r["kind"] == "job"),
            "gpu_hours": round(sum(r["gpu_hours"] or 0 for r in runs), 3),
            "usd": round(sum(r["usd"] or 0 for r in runs), 2),
            "runs_without_cost": sum(1 for r in runs if r["gpu_hours"] is None),
            "note": "GPU jobs and runs outside Slurm; idle hosts outside any job are waste on top of this",
        },
        "families": families,
        "by_team": {k: {n: round(x, 2) for n, x in v.items()} for k, v in sorted(by_team.items())},
        "by_method": {
            k: {n: round(x, 2) for n, x in v.items()} for k, v in sorted(by_method.items())
        },
        "rules": {
            "ok": sum(1 for s in statuses.values() if s == "ok"),
            "skipped": sum(1 for s in statuses.values() if s == "skipped"),
            "error": sum(1 for s in statuses.values() if s == "error"),
        },
    }

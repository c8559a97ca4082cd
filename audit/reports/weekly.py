"""Everything a report shows, as plain data: one scan per week, compared with the others.

``build_report`` runs (and stores) the scan of the reported week, makes sure each of the
previous seven weeks has a stored scan (backfilling the missing ones), and assembles the
headline, breakdowns, the method comparison and matrix, queue wait, the trend,
new/open/resolved findings, cost categories and data coverage. Renderers (HTML, Markdown, JSON) only format this data.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import date, datetime
from functools import cache
from pathlib import Path

import polars as pl

from audit.config import Config
from audit.costs import shared_facts
from audit.facts.shift import shared_shifts
from audit.queue import by_team_and_partition, waits
from audit.recipes import method_matrix, shared_recipes
from audit.rule_registry import all_rules, effective_thresholds, get_rule, select_rules
from audit.scans import LAST_CHANGE_SQL, ScanResult, complete_scan, load_scan, scan, selection
from audit.status import warehouse_status
from audit.summary import scope_of, summarise
from audit.warehouse.alongside import alongside
from audit.warehouse.store import Warehouse
from audit.watch.records import stopped
from audit.windows import Window, now, now_utc

TREND_WEEKS = 8


def _week_scan(wh, config: Config, rules, window: Window, shared: dict, fresh: bool) -> ScanResult:
    """A complete scan of the window: a stored one when it may be reused, else a new one."""
    stored = complete_scan(wh, config, window, fresh=fresh)
    if stored is not None:
        return load_scan(wh, stored)
    return scan(wh, config, rules, window, shared)


@dataclass
class StoredWeek:
    """A weekly report's data, and the HTML's charts when they were drawn for it before."""

    report: dict
    figures: dict | None
    key: list  # window start, end and label, config hash, code hash, made_at


def weekly_report(wh, config: Config, window: Window) -> StoredWeek:
    """The weekly report of ``window``: the stored one when nothing changed since it was
    computed (same week, configuration and code, made after the week ended and after the
    last import or prune), else computed now and stored for the next render."""
    key = [window.since, window.until, window.label, config.digest, code_digest()]
    stored = wh.con.execute(
        f"""
        SELECT made_at, model, figures FROM report_models
        WHERE window_start = ? AND window_end = ? AND window_label = ? AND config_hash = ?
          AND code_hash = ? AND made_at >= window_end AND made_at >= ({LAST_CHANGE_SQL})
        ORDER BY made_at DESC LIMIT 1
        """,
        key,
    ).fetchall()
    if stored:
        made_at, model, figures = stored[0]
        return StoredWeek(
            model_from_json(model), json.loads(figures) if figures else None, [*key, made_at]
        )
    made_at = now_utc()  # before computing: a concurrent
    report = build_report(wh, config, window, weekly=True)  # import makes it stale at once
    with wh.transaction() as con:
        con.execute(
            "DELETE FROM report_models WHERE window_start = ? AND window_end = ? "
            "AND window_label = ? AND config_hash = ? AND code_hash = ?",
            key,
        )
        con.execute(
            "INSERT INTO report_models VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
            [*key, made_at, model_to_json(report)],
        )
    return StoredWeek(report, None, [*key, made_at])


def store_figures(wh, week: StoredWeek, figures: dict) -> None:
    """Keep the charts drawn for a stored report with it (``audit.reports.render``)."""
    with wh.transaction() as con:
        con.execute(
            "UPDATE report_models SET figures = ? WHERE window_start = ? AND window_end = ? "
            "AND window_label = ? AND config_hash = ? AND code_hash = ? AND made_at = ?",
            [json.dumps(figures), *week.key],
        )


@cache
def code_digest() -> str:
    """A digest of the audit code a report's data comes from (the audit and rules packages,
    and which rules are registered): a stored report is not reused by other code."""
    import audit.rules

    digest = hashlib.sha256(selection(list(all_rules().values())).encode())
    for package in (Path(__file__).parents[1], Path(audit.rules.__file__).parent):
        for path in sorted(package.rglob("*.py")):
            digest.update(path.relative_to(package).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def model_to_json(report: dict) -> str:
    """A report's data as JSON whose times come back as times (``model_from_json``)."""
    return json.dumps(report, default=_tag_time, separators=(",", ":"))


def model_from_json(text: str) -> dict:
    return json.loads(text, object_hook=_untag_time)


def _tag_time(value):
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    raise TypeError(f"a report holds a {type(value).__name__}, which JSON cannot store")


def _untag_time(obj: dict):
    if len(obj) == 1:
        if "$datetime" in obj:
            return datetime.fromisoformat(obj["$datetime"])
        if "$date" in obj:
            return date.fromisoformat(obj["$date"])
    return obj


def build_report(
    wh, config: Config, window: Window, weekly: bool = True, result: ScanResult | None = None
) -> dict:
    tz = config.timezone
    rules = select_rules()
    shared: dict = {}  # run and job facts: computed once, used by every scan and part below
    with alongside(wh.con) as second:
        # only queries, on a connection of their own: they run during the week's scan
        coverage = second.submit(
            lambda con: _coverage(Warehouse(wh.path, con, wh.read_only), window)
        )
        if result is None:
            result = _week_scan(wh, config, rules, window, shared, fresh=True)
    summary = summarise(result, wh.con, config, shared)
    report = {
        "kind": "weekly" if weekly else "scan",
        "title": f"GPU waste report {window.label}" if weekly else f"audit scan #{result.scan_id}",
        "window": {
            "label": window.describe(),
            "since": window.since,
            "until": window.until,
            "timezone": str(tz),
        },
        "generated_at": now(),
        "scan_id": result.scan_id,
        "summary": summary,
        "findings": [f.as_json() for f in result.findings],
        "rules": [
            {
                "rule": r.rule,
                "status": r.status,
                "reason": r.reason,
                "findings": len(r.findings),
                "notes": r.notes,
            }
            for r in result.results
        ],
        "links": _run_links(wh, config),
    }
    report["headline"] = _headline(summary)
    report["activity"] = _activity(wh, config, window, shared)
    report["coverage"] = coverage.result()
    report["methods"] = _methods(wh, config, window, summary, shared)
    report["categories"] = _categories(wh, config, summary, result)
    report["matrix"] = _matrix(wh, config, window, shared)
    report["recommendation"] = _recommendation(wh, config, window, shared)
    report["queue"] = _queue(wh, config, window, shared)
    report["stopped"] = stopped(wh.con, window.since, window.until)
    if weekly:
        previous = window.previous_week(tz)
        prev_result = _week_scan(wh, config, rules, previous, shared, fresh=False)
        prev_summary = summarise(prev_result, wh.con, config, shared)
        previous_findings = [f.as_json() for f in prev_result.active]
        report["previous"] = {
            "label": previous.label,
            "headline": _headline(prev_summary),
            "activity": _activity(wh, config, previous, shared),
        }
        current_ids = {f["id"] for f in report["findings"] if not f["suppressed"]}
        previous_ids = {f["id"] for f in previous_findings}
        new, still_open = current_ids - previous_ids, current_ids & previous_ids
        resolved = previous_ids - current_ids
        report["changes"] = {
            "new": [f for f in report["findings"] if f["id"] in new],
            "still_open": [f for f in report["findings"] if f["id"] in still_open],
            "resolved": [f for f in previous_findings if f["id"] in resolved],
        }
        report["trend"] = _trend(wh, config, rules, window, shared)
    return report


def _activity(wh, config: Config, window: Window, shared: dict) -> dict:
    """What happened in the window: runs and GPU jobs started (a week without any says so)."""
    facts = shared_facts(wh.con, config, shared)
    runs = sum(1 for r in facts.runs if window.contains(r.start_time))
    jobs = facts.jobs.started(window).filter(pl.col("gpus") > 0).select(pl.len()).collect().item()
    return {"runs": runs, "gpu_jobs": jobs, "empty": runs == 0 and jobs == 0}


def _headline(summary: dict) -> dict:
    """The report's headline cards: ``audit.summary.headline``'s figures, each from one
    population, with the formulas its notes print."""
    h = summary["headline"]
    return {
        "gpu_hours": round(summary["spend"]["gpu_hours"], 1),
        "usd_spent": round(h["spent"]["usd"], 2),
        "usd_wasted": round(h["wasted"]["usd"], 2),
        "waste_share": h["wasted"]["share_pct"],
        "gpu_hours_wasted": round(h["wasted"]["gpu_hours"], 1),
        "unallocated_usd": round(h["unallocated_capacity"]["usd"], 2),
        "unallocated_gpu_hours": round(h["unallocated_capacity"]["gpu_hours"], 1),
        "reclaimable_gb": h["storage"]["gb"],
        "storage_usd_month": h["storage"]["usd_per_month"],
        "unknown_cost_findings": h["unknown_cost"]["findings"],
        "unknown_cost_run_hours": round(h["unknown_cost"]["run_hours"], 2),
        "findings": summary["findings"],
        "listed": summary["listed"],
        "formulas": [
            {"figure": name, "formula": h[key]["formula"]}
            for name, key in (
                ("Spent", "spent"),
                ("Wasted", "wasted"),
                ("Unallocated capacity", "unallocated_capacity"),
                ("Reclaimable storage", "storage"),
                ("Unknown cost", "unknown_cost"),
            )
        ],
    }


def _trend(wh, config: Config, rules, window: Window, shared: dict) -> list[dict]:
    weeks = [window]
    for _ in range(TREND_WEEKS - 1):
        weeks.insert(0, weeks[0].previous_week(config.timezone))
    out = []
    for week in weeks:
        result = _week_scan(wh, config, rules, week, shared, fresh=week is window)
        findings = result.active
        activity = _activity(wh, config, week, shared)
        # the waste in each week's spend, as the headline counts it
        inside = [f for f in findings if scope_of(f) == "spend"]
        out.append(
            {
                "week": week.label,
                "usd": round(sum(f.usd or 0 for f in inside), 2),
                "gpu_hours": round(sum(f.gpu_hours or 0 for f in inside), 1),
                "findings": len(findings),
                "has_data": not activity["empty"],
            }
        )
    return out


def _coverage(wh, window: Window) -> dict:
    status = warehouse_status(wh)
    imports = wh.con.execute(
        "SELECT kind, count(*), strftime(max(imported_at), '%Y-%m-%d %H:%M') FROM file_imports GROUP BY kind ORDER BY kind"
    ).fetchall()
    return {
        "sources": status["sources"],
        "runs": status["totals"]["runs"],
        "first_run": status["first_run"],
        "last_run": status["last_run"],
        "cluster": status["cluster"],
        "file_imports": [{"kind": k, "files": n, "last": t} for k, n, t in imports],
    }


def _methods(wh, config: Config, window: Window, summary: dict, shared: dict) -> dict:
    """Per training method: spend, waste, and each run's general change against its target gain."""
    facts = shared_facts(wh.con, config, shared)
    found = shared_recipes(wh.con, config, facts, shared)
    points = []
    for run in facts.runs:
        if (
            not window.contains(run.start_time)
            or found.is_baseline(run)
            or run.status != "FINISHED"
            or run.lifecycle_stage != "active"
        ):
            continue
        outcome = found.outcome(run)
        if outcome is None or outcome.general_change is None or outcome.target_gain is None:
            continue
        points.append(
            {
                "run_id": run.run_id,
                "run_name": run.name,
                "method": run.method or "unknown",
                "general_change": round(outcome.general_change, 4),
                "target_gain": round(outcome.target_gain, 4),
            }
        )
    by_method = []
    for method, values in summary["by_method"].items():
        mine = [p for p in points if p["method"] == method]
        by_method.append(
            {
                "method": method,
                **values,
                "runs_compared": len(mine),
                "mean_general_change": round(sum(p["general_change"] for p in mine) / len(mine), 4)
                if mine
                else None,
                "mean_target_gain": round(sum(p["target_gain"] for p in mine) / len(mine), 4)
                if mine
                else None,
            }
        )
    return {"by_method": by_method, "points": points}


def _matrix(wh, config: Config, window: Window, shared: dict) -> dict:
    """Per (base model, task): each method's runs with cost, target gain and general change,
    and the cheaper run that dominates a run (MTX001's test, with its configured ratio)."""
    facts = shared_facts(wh.con, config, shared)
    found = shared_recipes(wh.con, config, facts, shared)
    ratio = effective_thresholds(get_rule("MTX001"), config)["cost_ratio"]
    groups = []
    for (base_model, task), items in method_matrix(found, window, ratio).items():
        runs = [
            {
                "run_id": item.run.run_id,
                "run_name": item.run.name,
                "method": item.run.method or "unknown",
                "gpu_hours": round(item.gpu_hours, 2),
                "target_gain": round(item.outcome.target_gain, 4),
                "general_change": round(item.outcome.general_change, 4),
                "dominated_by": item.dominated_by.run.name if item.dominated_by else None,
            }
            for item in sorted(items, key=lambda i: (i.run.method or "", i.gpu_hours, i.run.run_id))
        ]
        groups.append({"base_model": base_model, "task": task, "runs": runs})
    return {"groups": groups, "cost_ratio": ratio}


def _recommendation(wh, config: Config, window: Window, shared: dict) -> dict:
    """The method matrix as a recommendation: per base model and distance of the task, each
    method's history up to the end of the window and the method it favours
    (``audit.facts.shift``)."""
    facts = shared_facts(wh.con, config, shared)
    found = shared_recipes(wh.con, config, facts, shared)
    shifts = shared_shifts(wh.con, config, facts, found, shared)
    tolerance = effective_thresholds(get_rule("REG002"), config)["tolerance"]
    settings = config.shift
    return {
        "cells": [cell.as_json() for cell in shifts.matrix(window.until, tolerance)],
        "correlations": shifts.correlations(window.until),
        "tolerance": tolerance,
        "min_cell_runs": settings.min_cell_runs,
        "min_method_runs": settings.min_method_runs,
        "until": window.until.isoformat() if window.until else None,
    }


def _queue(wh, config: Config, window: Window, shared: dict) -> dict:
    """Queue wait per team and partition: a management cost, shown apart from waste."""
    facts = shared_facts(wh.con, config, shared)
    found = waits(facts, window)
    totals = found.totals()
    longest = found.frame.with_row_index("index").sort(
        "hours", "job_id", descending=[True, False], maintain_order=True
    )["index"][:5]
    return {
        "by_team_partition": by_team_and_partition(found),
        "jobs": totals["jobs"],
        "gpu_hours_waited": round(totals["gpu_hours"], 2),
        "measured_from_submit": totals["from_submit"],
        "longest": [
            {
                "job_id": w.job.job_id,
                "name": w.job.name,
                "team": w.team,
                "partition": w.partition,
                "gpus": w.job.gpus,
                "wait_hours": round(w.hours, 2),
                "measured_from": w.measured_from,
            }
            for w in map(found.wait, longest)
        ],
    }


def _categories(wh, config: Config, summary: dict, result: ScanResult) -> list[dict]:
    price = float(config.prices.storage_gb_month_usd)
    stored = wh.con.execute("SELECT coalesce(sum(bytes), 0) FROM checkpoints").fetchall()[0][0]
    evaluation = summary["evaluation"]
    rework = sum(f.usd or 0 for f in result.active if f.family in ("REG", "RED", "DUP"))
    return [
        {
            "category": "compute",
            "usd": round(summary["spend"]["usd"], 2),
            "basis": "GPU-hours of Slurm jobs (and runs outside Slurm) × GPU price",
        },
        {
            "category": "storage",
            "usd": round(stored / 1e9 * price, 2),
            "basis": f"{stored / 1e9:,.1f} GB of checkpoints × ${price:.3f}/GB-month (per month)",
        },
        {
            "category": "evaluation",
            "usd": round(evaluation["usd"], 2),
            "basis": (
                f"{evaluation['gpu_hours']:,.1f} GPU-h of {evaluation['runs']} evaluation runs "
                f"(methods {', '.join(config.attribution.eval_methods)}, tagged "
                "audit.kind=evaluation or with lm-eval results), part of "
                f"compute; ${evaluation['duplicate_usd']:,.2f} of it re-evaluated the same "
                "model on the same benchmarks (EVL001)"
            ),
        },
        {
            "category": "rework",
            "usd": round(rework, 2),
            "basis": "waste of REG, RED and DUP findings",
        },
    ]


def _run_links(wh, config: Config) -> dict[str, str]:
    """MLflow UI links per run id, when a tracking URL is known (config, or an http source)."""
    base = config.mlflow.tracking_url
    rows = wh.con.execute(
        "SELECT r.run_id, r.experiment_id, s.kind, s.location FROM runs r JOIN sources s USING (source_id)"
    ).fetchall()
    links = {}
    for run_id, experiment_id, kind, location in rows:
        url = base or (location if kind == "http" else "")
        if url:
            links[run_id] = f"{url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return links


def to_json(report: dict) -> str:
    return json.dumps(
        report, indent=2, default=lambda v: v.isoformat() if hasattr(v, "isoformat") else str(v)
    )

"""Everything a report shows, as plain data: one scan per week, compared with the others.

``build_report`` runs (and stores) the scan of the reported week, makes sure each of the
previous seven weeks has a stored scan (backfilling the missing ones), and assembles the
headline, breakdowns, the method comparison, the trend, new/open/resolved findings, cost
categories and data coverage. Renderers (HTML, Markdown, JSON) only format this data.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from audit.config import Config
from audit.engine import RuleContext, ScanResult, load_scan, reusable_scan, scan, select_rules
from audit.errors import InputError
from audit.status import warehouse_status
from audit.summary import spend, summarise

TREND_WEEKS = 8
NOW_ENV = "AUDIT_NOW"  # pins "now" (ISO time, UTC) for reproducible reports and tests


@dataclass
class Window:
    label: str
    since: datetime  # UTC, naive
    until: datetime

    def previous(self, tz: ZoneInfo) -> Window:
        try:
            start_local = self.since.replace(tzinfo=UTC).astimezone(tz).date() - timedelta(days=7)
        except OverflowError:
            raise InputError(
                f"{self.label} has no previous week to compare with (it starts in year 1)"
            ) from None
        return week_window(start_local.isocalendar().year, start_local.isocalendar().week, tz)


def now() -> datetime:
    pinned = os.environ.get(NOW_ENV)
    if pinned:
        try:
            return datetime.fromisoformat(pinned).replace(tzinfo=None)
        except ValueError:
            raise InputError(
                f"{NOW_ENV}={pinned!r} is not an ISO time like 2026-11-23T08:00:00"
            ) from None
    return datetime.now(UTC).replace(tzinfo=None)


def week_window(year: int, week: int, tz: ZoneInfo) -> Window:
    try:
        monday = date.fromisocalendar(year, week, 1)
    except ValueError:
        raise InputError(f"{year}-W{week:02d} is not an ISO week") from None
    start = datetime.combine(monday, datetime.min.time(), tzinfo=tz)
    try:
        return Window(
            label=f"{year}-W{week:02d}",
            since=start.astimezone(UTC).replace(tzinfo=None),
            until=(start + timedelta(days=7)).astimezone(UTC).replace(tzinfo=None),
        )
    except OverflowError:  # the week ends (or starts, in UTC) beyond the years 1-9999
        raise InputError(f"{year}-W{week:02d} reaches beyond the years 1 to 9999") from None


def parse_week(text: str, tz: ZoneInfo) -> Window:
    try:
        year, week = text.upper().split("-W")
        return week_window(int(year), int(week), tz)
    except ValueError:
        raise InputError(f"--week takes an ISO week like 2026-W47, got {text!r}") from None


def last_complete_week(tz: ZoneInfo) -> Window:
    local_today = now().replace(tzinfo=UTC).astimezone(tz).date()
    previous = local_today - timedelta(days=7)
    year, week, _ = previous.isocalendar()
    return week_window(year, week, tz)


def _stored_scan(wh, window: Window) -> int | None:
    rows = wh.con.execute(
        "SELECT max(scan_id) FROM scans WHERE window_start = ? AND window_end = ?",
        [window.since, window.until],
    ).fetchall()
    return rows[0][0] if rows and rows[0][0] is not None else None


def _stored_findings(wh, scan_id: int | None) -> list[dict]:
    if scan_id is None:
        return []
    cursor = wh.con.execute(
        "SELECT finding_id, rule, severity, subject, message, gpu_hours, usd, bytes, suppressed "
        "FROM findings WHERE scan_id = ?",
        [scan_id],
    )
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def build_report(
    wh, config: Config, window: Window, weekly: bool = True, result: ScanResult | None = None
) -> dict:
    tz = config.timezone
    rules = select_rules(None, None)
    if result is None:
        stored = reusable_scan(wh, config, rules, window.since, window.until)
        result = (
            load_scan(wh, stored)
            if stored is not None
            else scan(wh, config, rules, window.since, window.until)
        )
    shared: dict = {}  # run facts: computed once, used by every part of the report
    summary = summarise(result, wh.con, config, shared)
    report = {
        "kind": "weekly" if weekly else "scan",
        "title": f"GPU waste report {window.label}" if weekly else f"audit scan #{result.scan_id}",
        "window": {
            "label": window.label,
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
    report["coverage"] = _coverage(wh, window)
    report["methods"] = _methods(wh, config, window, summary, shared)
    report["categories"] = _categories(wh, config, summary, result)
    if weekly:
        previous = window.previous(tz)
        prev_id = (
            _stored_scan(wh, previous)
            or scan(wh, config, rules, previous.since, previous.until).scan_id
        )
        previous_findings = [f for f in _stored_findings(wh, prev_id) if not f["suppressed"]]
        prev_summary = _stored_summary(wh, config, prev_id, previous, shared)
        report["previous"] = {"label": previous.label, "headline": _headline(prev_summary)}
        current_ids = {f["id"] for f in report["findings"] if not f["suppressed"]}
        previous_ids = {f["finding_id"] for f in previous_findings}
        new, still_open = current_ids - previous_ids, current_ids & previous_ids
        resolved = previous_ids - current_ids
        report["changes"] = {
            "new": [f for f in report["findings"] if f["id"] in new],
            "still_open": [f for f in report["findings"] if f["id"] in still_open],
            "resolved": [f for f in previous_findings if f["finding_id"] in resolved],
        }
        report["trend"] = _trend(wh, config, rules, window, tz)
    return report


def _stored_summary(
    wh, config: Config, scan_id: int, window: Window, shared: dict | None = None
) -> dict:
    findings = [f for f in _stored_findings(wh, scan_id) if not f["suppressed"]]
    runs = spend(wh.con, config, window.since, window.until, shared)
    return {
        "findings": len(findings),
        "waste": {
            "gpu_hours": sum(f["gpu_hours"] or 0 for f in findings),
            "usd": sum(f["usd"] or 0 for f in findings),
            "bytes": sum(f["bytes"] or 0 for f in findings),
        },
        "spend": {
            "gpu_hours": sum(r["gpu_hours"] or 0 for r in runs),
            "usd": sum(r["usd"] or 0 for r in runs),
        },
    }


def _headline(summary: dict) -> dict:
    spent = summary["spend"]["usd"]
    wasted = summary["waste"]["usd"]
    return {
        "gpu_hours": round(summary["spend"]["gpu_hours"], 1),
        "usd_spent": round(spent, 2),
        "usd_wasted": round(wasted, 2),
        "waste_share": round(100 * wasted / spent, 1) if spent else None,
        "gpu_hours_wasted": round(summary["waste"]["gpu_hours"], 1),
        "reclaimable_gb": round(summary["waste"]["bytes"] / 1e9, 1),
        "findings": summary["findings"],
    }


def _trend(wh, config: Config, rules, window: Window, tz: ZoneInfo) -> list[dict]:
    weeks = [window]
    for _ in range(TREND_WEEKS - 1):
        weeks.insert(0, weeks[0].previous(tz))
    out = []
    for week in weeks:
        scan_id = _stored_scan(wh, week) or scan(wh, config, rules, week.since, week.until).scan_id
        findings = [f for f in _stored_findings(wh, scan_id) if not f["suppressed"]]
        out.append(
            {
                "week": week.label,
                "usd": round(sum(f["usd"] or 0 for f in findings), 2),
                "gpu_hours": round(sum(f["gpu_hours"] or 0 for f in findings), 1),
                "findings": len(findings),
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


def _inside(moment: datetime | None, window: Window) -> bool:
    """In the window; a run without a start time is in none, an open bound (a scan of all
    history) holds everything."""
    return (
        moment is not None
        and (window.since is None or moment >= window.since)
        and (window.until is None or moment < window.until)
    )


def _methods(wh, config: Config, window: Window, summary: dict, shared: dict) -> dict:
    """Per training method: spend, waste, and each run's general change against its target gain."""
    from audit.rules._common import run_facts

    ctx = RuleContext(
        con=wh.con,
        config=config,
        thresholds={},
        since=window.since,
        until=window.until,
        shared=shared,
    )
    facts = [f for f in run_facts(ctx) if _inside(f["start_time"], window)]
    baseline_tag = config.values["attribution"]["baseline_tag"]
    baselines = {}
    for row in ctx.rows(
        "SELECT source_id, run_id FROM tags WHERE key = ? AND lower(value) = 'true'", [baseline_tag]
    ):
        baselines[(row["source_id"], row["run_id"])] = True
    latest: dict[tuple, dict[str, float]] = {}
    for row in ctx.rows(
        "SELECT source_id, run_id, key, value FROM latest_metrics WHERE NOT isnan(value)"
    ):
        latest.setdefault((row["source_id"], row["run_id"]), {})[row["key"]] = row["value"]
    base_by_model = {}
    for fact in run_facts(ctx):
        if (fact["source_id"], fact["run_id"]) in baselines and fact["base_model"]:
            base_by_model.setdefault(
                fact["base_model"], latest.get((fact["source_id"], fact["run_id"]), {})
            )
    points = []
    for fact in facts:
        key = (fact["source_id"], fact["run_id"])
        reference = base_by_model.get(fact["base_model"])
        if (
            key in baselines
            or reference is None
            or fact["status"] != "FINISHED"
            or fact["lifecycle_stage"] != "active"
        ):
            continue
        values = latest.get(key, {})
        general = [
            values[k] - reference[k] for k in values if ctx.matches(k, "general") and k in reference
        ]
        target = [
            values[k] - reference[k] for k in values if ctx.matches(k, "target") and k in reference
        ]
        if not general or not target:
            continue
        points.append(
            {
                "run_id": fact["run_id"],
                "run_name": fact["name"],
                "method": fact["method"] or "unknown",
                "general_change": round(sum(general) / len(general), 4),
                "target_gain": round(sum(target) / len(target), 4),
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


def _categories(wh, config: Config, summary: dict, result: ScanResult) -> list[dict]:
    price = float(config.values["prices"]["storage_gb_month_usd"])
    stored = wh.con.execute("SELECT coalesce(sum(bytes), 0) FROM checkpoints").fetchall()[0][0]
    evaluation = summary["by_method"].get("eval", {}).get("usd", 0.0)
    rework = sum(f.usd for f in result.active if f.rule[:3] in ("REG", "DUP"))
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
            "category": "evaluation runs",
            "usd": round(evaluation, 2),
            "basis": "spend of runs with method eval",
        },
        {"category": "rework", "usd": round(rework, 2), "basis": "waste of REG and DUP findings"},
    ]


def _run_links(wh, config: Config) -> dict[str, str]:
    """MLflow UI links per run id, when a tracking URL is known (config, or an http source)."""
    base = config.values["mlflow"].get("tracking_url") or ""
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

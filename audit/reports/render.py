"""Rendering reports: one self-contained HTML file, Markdown, or JSON, from report data."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict
from datetime import datetime
from importlib import resources
from typing import TYPE_CHECKING

from jinja2 import Environment, FileSystemLoader, select_autoescape

from audit.reports.weekly import to_json
from audit.rule_api import subject_label
from audit.text import markdown_text

if TYPE_CHECKING:
    from audit.reports import charts

HTML_FINDINGS = 200  # beyond this the HTML collapses to counts; the JSON has every finding


def _environment(html: bool = True) -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(resources.files("audit.templates"))),
        autoescape=select_autoescape(["html", "j2"], default_for_string=True, default=True)
        if html
        else False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["md"] = markdown_text
    env.filters["money"] = lambda v: "—" if v is None else f"${v:,.2f}"
    env.filters["num"] = lambda v, d=1: "—" if v is None else f"{v:,.{d}f}"
    env.filters["gb"] = lambda b: f"{(b or 0) / 1e9:,.1f} GB"
    env.filters["when"] = lambda v: (
        v.strftime("%Y-%m-%d %H:%M") if isinstance(v, datetime) else (v or "")
    )
    env.filters["pretty"] = lambda v: json.dumps(v, indent=2, default=str, ensure_ascii=False)
    env.filters["subject"] = subject_label
    env.filters["delta"] = _delta
    return env


def _delta(current, previous) -> str:
    if current is None or previous is None:
        return ""
    if previous == 0:
        return "new" if current else "±0"
    change = 100 * (current - previous) / previous
    return f"{change:+.0f} % vs previous week"


def build_charts(report: dict) -> list[charts.Chart]:
    from audit.reports import charts  # matplotlib: only when a chart is drawn

    summary = report["summary"]
    families = summary["families"]
    out = [
        charts.bar(
            "Waste by family ($)",
            [f"{f['family']} {f['label']}" for f in families],
            [f["usd"] for f in families],
            "USD",
            "Bar chart of wasted dollars per waste family: "
            + ", ".join(f"{f['family']} ${f['usd']:,.0f}" for f in families),
        )
    ]
    teams = {k: v for k, v in summary["by_team"].items() if v["waste_usd"] or v["usd"]}
    if teams:
        out.append(
            charts.grouped(
                "Spend and waste by team ($)",
                list(teams),
                {
                    "spent": [v["usd"] for v in teams.values()],
                    "wasted": [v["waste_usd"] for v in teams.values()],
                },
                "USD",
                "Grouped bars of spend and waste per team: "
                + ", ".join(
                    f"{t} spent ${v['usd']:,.0f}, wasted ${v['waste_usd']:,.0f}"
                    for t, v in teams.items()
                ),
            )
        )
    methods = {m["method"]: m for m in report["methods"]["by_method"] if m["usd"] or m["waste_usd"]}
    if methods:
        out.append(
            charts.grouped(
                "Spend and waste by training method ($)",
                list(methods),
                {
                    "spent": [m["usd"] for m in methods.values()],
                    "wasted": [m["waste_usd"] for m in methods.values()],
                },
                "USD",
                "Grouped bars of spend and waste per training method: "
                + ", ".join(
                    f"{k} spent ${m['usd']:,.0f}, wasted ${m['waste_usd']:,.0f}"
                    for k, m in methods.items()
                ),
            )
        )
    points = report["methods"]["points"]
    if points:
        out.append(
            charts.forgetting(
                "General ability vs target gain, per run",
                points,
                "Scatter of each training run's change in general benchmarks (vertical) against its gain on the "
                "target task (horizontal), by method: "
                + "; ".join(
                    f"{p['run_name']} ({p['method']}): target {p['target_gain']:+.3f}, general {p['general_change']:+.3f}"
                    for p in points
                ),
            )
        )
    if report.get("trend"):
        trend = report["trend"]
        out.append(
            charts.trend(
                "Waste over the last 8 weeks ($)",
                [t["week"][5:] for t in trend],
                [t["usd"] for t in trend],
                "USD",
                "Line chart of weekly waste in dollars: "
                + ", ".join(f"{t['week']} ${t['usd']:,.0f}" for t in trend),
            )
        )
    return out


SERIES_CHARTS = 50  # inline metric charts of findings (STB001) drawn at most


def matrix_charts(report: dict) -> list[charts.Chart]:
    """One scatter per (base model, task) of the method matrix that compares two runs or more."""
    from audit.reports import charts  # matplotlib: only when a chart is drawn

    out = []
    for group in report.get("matrix", {}).get("groups", []):
        runs = group["runs"]
        if len(runs) < 2:
            continue
        title = f"{group['base_model']} / {group['task']}: cost vs target gain"
        alt = (
            "Scatter of GPU-hours (horizontal) against target gain (vertical), marker by method, "
            "colour by change in general ability: "
            + "; ".join(
                f"{r['run_name']} ({r['method']}): {r['gpu_hours']:,.1f} GPU-h, target "
                f"{r['target_gain']:+.3f}, general {r['general_change']:+.3f}"
                for r in runs
            )
        )
        out.append(charts.matrix(title, runs, alt))
    return out


def series_charts(findings: list[dict]) -> dict[str, charts.Chart]:
    """The inline chart of each finding whose evidence carries one (STB001), by finding id."""
    from audit.reports import charts  # matplotlib: only when a chart is drawn

    out = {}
    for f in findings:
        chart = f["evidence"].get("chart") if isinstance(f["evidence"], dict) else None
        if not chart or not chart.get("points") or len(out) >= SERIES_CHARTS:
            continue
        title = f"{chart['metric']} by step"
        alt = (
            f"Line of {chart['metric']} over {len(chart['points'])} logged steps, "
            f"onset at step {chart.get('onset_step')}"
        )
        out[f["id"]] = charts.series(title, chart["points"], chart.get("onset_step"), alt)
    return out


def _script() -> tuple[str, str]:
    """The progressive-enhancement script and its CSP hash: no other script may run."""
    source = resources.files("audit.templates").joinpath("report.js").read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()
    return source, f"sha256-{digest}"


def html_figures(report: dict) -> dict:
    """Every chart of the report's HTML, drawn, as plain data: a stored weekly report keeps
    them (``audit.reports.weekly.store_figures``) so rendering it again draws nothing."""
    active = listed(report)
    return {
        "charts": [asdict(c) for c in build_charts(report)],
        "matrix_charts": [asdict(c) for c in matrix_charts(report)],
        "series": {k: asdict(c) for k, c in series_charts(active[:HTML_FINDINGS]).items()},
    }


def render_html(report: dict, figures: dict | None = None) -> str:
    """The self-contained HTML page; ``figures`` from ``html_figures`` (drawn if not given)."""
    template = _environment().get_template("report.html.j2")
    script, script_hash = _script()
    active = listed(report)
    figures = figures if figures is not None else html_figures(report)
    return template.render(
        report=report,
        charts=figures["charts"],
        matrix_charts=figures["matrix_charts"],
        series=figures["series"],
        findings=active[:HTML_FINDINGS],
        hidden=max(0, len(active) - HTML_FINDINGS),
        suppressed=[f for f in report["findings"] if f["suppressed"]],
        script=script,
        script_hash=script_hash,
    )


def listed(report: dict) -> list[dict]:
    """The findings a report lists one by one: active and at or above their floor."""
    return [f for f in report["findings"] if not f["suppressed"] and f.get("material", True)]


def render_markdown(report: dict, top: int = 10) -> str:
    template = _environment(html=False).get_template("report.md.j2")
    active = listed(report)
    return template.render(report=report, findings=active[:top], total=len(active))


def render_json(report: dict) -> str:
    return to_json(report)

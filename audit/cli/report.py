"""``audit report weekly``: the Monday-morning report."""

from __future__ import annotations

from pathlib import Path

import click

from audit import atomic
from audit.cli import AppContext, cli, pass_app
from audit.cli.options import format_option, output_option, window_options


@cli.group("report")
def report_group() -> None:
    """Render reports for people: HTML (self-contained), Markdown, JSON.

    \b
    Example:
      audit report weekly --output weekly.html
    """


@report_group.command("weekly")
@click.option(
    "--week", metavar="YYYY-Www", help="ISO week, e.g. 2026-W47 (default: the last complete week)."
)
@window_options(
    since_help="Start of a custom window (UTC), inclusive, instead of a week.",
    until_help="End of a custom window (UTC).",
)
@format_option(
    ["html", "md", "json"],
    "html",
    "html: one self-contained file; md: headline and top findings for chat or e-mail; json: for machines.",
)
@output_option("Write here (default: stdout for md/json, weekly-<week>.html for html).")
@pass_app
def report_weekly(app: AppContext, week, since, until, fmt, output) -> None:
    """Weekly waste report: headline vs last week, breakdowns, methods, trend, findings.

    Scans the week (and any of the previous seven weeks not scanned yet, for the trend)
    and stores the scans. Weeks are ISO weeks in the configured [cluster] timezone.

    \b
    Example:
      audit report weekly --week 2026-W47 --output weekly.html
      audit report weekly --format md | mail -s "GPU waste" team@example.com
    """
    from audit.reports.render import html_figures, render_html, render_json, render_markdown
    from audit.windows import Window, last_complete_week, parse_week

    config = app.config
    if (since is None) != (until is None):
        raise click.UsageError("--since and --until go together")
    if week and since:
        raise click.UsageError("give --week or --since/--until, not both")
    if since:
        window = Window(since, until, f"{since:%Y-%m-%d} to {until:%Y-%m-%d}")
    else:
        window = parse_week(week, config.timezone) if week else last_complete_week(config.timezone)
    from audit.reports.weekly import store_figures, weekly_report

    with app.warehouse() as wh:
        week = weekly_report(wh, config, window)
        report = week.report
        if fmt == "html":
            figures = week.figures
            if figures is None:
                figures = html_figures(report)
                store_figures(wh, week, figures)
            text = render_html(report, figures)
    if fmt != "html":
        text = {"md": render_markdown, "json": render_json}[fmt](report)
    if fmt == "html" and output is None:
        output = Path(f"weekly-{window.label.replace(' ', '_')}.html")
    if output:
        atomic.write_text(output, text)
        click.echo(
            f"wrote {output} ({len(text.encode()) / 1024:,.0f} KB, {report['headline']['findings']} findings)"
        )
    else:
        click.echo(text, nl=False)

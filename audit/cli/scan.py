"""``audit scan`` and ``audit rules``: find, price and explain waste."""

from __future__ import annotations

import click

from audit import atomic
from audit.cli import AppContext, cli, pass_app
from audit.cli.options import format_option, output_option, window_options
from audit.format import table
from audit.reports.scan import json_chunks, render_markdown, render_table, scan_document
from audit.rule_api import Severity
from audit.rule_registry import all_rules, get_rule, select_rules
from audit.scans import scan
from audit.summary import summarise
from audit.windows import Window

SEVERITIES = [s.label for s in Severity]


@cli.command("scan")
@click.option(
    "--select", metavar="CODES", help="Only these rules or families, comma separated (DUP001,OVP)."
)
@click.option("--ignore", metavar="CODES", help="Skip these rules or families, comma separated.")
@window_options(
    since_help="Judge activity from this date (UTC), inclusive.",
    until_help="Judge activity before this date (UTC).",
)
@format_option(
    ["table", "json", "md", "html"],
    "table",
    "Output format (html: the scan as one self-contained report file, needs --output).",
)
@output_option("Write to this file instead of stdout.")
@click.option(
    "--fail-on",
    type=click.Choice(SEVERITIES),
    help="Exit 1 when a finding is at or above this severity.",
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="List every finding, those under the materiality floors too.",
)
@pass_app
def scan_command(
    app: AppContext, select, ignore, since, until, fmt, output, fail_on, show_all
) -> None:
    """Run the waste rules over the warehouse, store and print the findings.

    Exit code 1 when a finding is at or above --fail-on (for CI and cron), else 0.

    \b
    Example:
      audit scan
      audit scan --select OVP,IDL --since 2026-11-16 --until 2026-11-23 --format json --output scan.json
      audit scan --fail-on high
      audit scan --format html --output scan.html
    """
    if fmt == "html" and output is None:
        raise click.UsageError("--format html needs --output PATH")
    rules = select_rules(select, ignore)
    config = app.config
    window = Window(since, until)
    shared: dict = {}
    with app.warehouse() as wh:
        # summarise reads the facts; the rules' other shared computations go when done
        result = scan(
            wh, config, rules, window, shared, keep=frozenset({"facts", "evaluation runs"})
        )
        summary = summarise(result, wh.con, config, shared)
        if fmt == "html":
            from audit.reports.render import render_html
            from audit.reports.weekly import build_report

            html = render_html(build_report(wh, config, window, weekly=False, result=result))
    document = scan_document(result, summary)
    if fmt == "json" and output:
        # streamed: the JSON of 100,000s of findings is never held whole
        atomic.write_text_chunks(output, json_chunks(document))
    else:
        if fmt == "html":
            text = html
        elif fmt == "json":
            text = "".join(json_chunks(document))
        elif fmt == "md":
            text = render_markdown(result, summary, show_all)
        else:
            text = render_table(result, summary, show_all) + "\n"
        if output:
            atomic.write_text(output, text)
        else:
            click.echo(text, nl=False)
    if output:
        click.echo(f"wrote {output} ({summary['findings']} findings)")
    if fail_on and any(f.severity >= Severity.parse(fail_on) for f in result.active):
        raise SystemExit(1)


@cli.group("rules")
def rules_group() -> None:
    """List the waste rules and explain one.

    \b
    Example:
      audit rules list
      audit rules explain OVP001
    """


@rules_group.command("list")
def rules_list() -> None:
    """List every rule with its code, name, severity and one-line summary.

    \b
    Example:
      audit rules list
    """
    click.echo(
        table(
            ["code", "name", "severity", "what it detects"],
            [[r.code, r.name, r.severity.label, r.summary()] for r in all_rules().values()],
        )
    )


@rules_group.command("explain")
@click.argument("code")
def rules_explain(code: str) -> None:
    """Print a rule's documentation: what, why, false positives, example, fix, thresholds.

    \b
    Example:
      audit rules explain DUP001
    """
    rule = get_rule(code)
    out = [
        f"{rule.code} {rule.name} (default severity {rule.severity.label})",
        "",
        rule.summary(),
        "",
    ]
    for heading, text in rule.sections().items():
        out += [f"{heading}:", *[f"  {line}" if line else "" for line in text.splitlines()], ""]
    out.append(f"Thresholds ([rules.{rule.code}] in audit.toml):")
    if rule.thresholds:
        out += [f"  {k} = {t.describe()}: {t.help}" for k, t in rule.thresholds.items()]
    else:
        out.append("  none")
    out.append("")
    out.append("Needs: " + ", ".join(rule.needs) if rule.needs else "Needs: nothing")
    click.echo("\n".join(out))

"""``audit scan`` and ``audit rules``: find, price and explain waste."""

from __future__ import annotations

import json
from pathlib import Path

import click

from audit import atomic
from audit.cli import AppContext, cli, pass_app
from audit.cli.output import safe, table
from audit.rule_api import Severity, subject_label
from audit.rule_registry import all_rules, get_rule, select_rules
from audit.scans import scan
from audit.summary import summarise
from audit.text import markdown_text
from audit.windows import Window

DATE = click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"])
SEVERITIES = [s.label for s in Severity]


def scan_document(result, summary) -> dict:
    return {
        "scan": {
            "id": result.scan_id,
            "started_at": result.started_at.isoformat(timespec="seconds"),
            "config_hash": result.config_hash,
            "since": result.since.isoformat() if result.since else None,
            "until": result.until.isoformat() if result.until else None,
            "rules": [
                {
                    "rule": r.rule,
                    "status": r.status,
                    "reason": r.reason or None,
                    "findings": len(r.findings),
                    "notes": r.notes,
                }
                for r in result.results
            ],
        },
        "summary": summary,
        "findings": [f.as_json() for f in result.findings],
    }


def json_chunks(document: dict):
    """The scan document as indented JSON with one finding per line.

    ``json`` encodes indented output in Python and compact output in C: with every finding
    indented, the JSON of 8,444 findings took 1.7 s of a 30 s scan at size L; one compact
    line per finding takes a tenth of that, and each finding stays one line to grep.
    """
    yield "{\n"
    for index, (key, value) in enumerate(document.items()):
        yield f"  {json.dumps(key)}: "
        if key == "findings":
            yield "[" if value else "[]"
            for number, finding in enumerate(value):
                yield ",\n    " if number else "\n    "
                yield json.dumps(finding, default=str)
            if value:
                yield "\n  ]"
        else:
            # a raw newline in indented JSON is layout: strings carry theirs escaped
            yield json.dumps(value, indent=2, default=str).replace("\n", "\n  ")
        yield ",\n" if index < len(document) - 1 else "\n"
    yield "}\n"


def render_table(result, summary, top: int = 10) -> str:
    lines = []
    fam_rows = [
        [
            f["family"],
            f["label"],
            f["findings"],
            f"{f['gpu_hours']:,.1f}",
            f"{f['usd']:,.2f}",
            f"{f['bytes'] / 1e9:,.1f}",
        ]
        for f in summary["families"]
    ]
    waste = summary["waste"]
    fam_rows.append(
        [
            "all",
            "",
            summary["findings"],
            f"{waste['gpu_hours']:,.1f}",
            f"{waste['usd']:,.2f}",
            f"{waste['bytes'] / 1e9:,.1f}",
        ]
    )
    lines.append(
        table(["family", "", "findings", "GPU-h", "$", "GB"], fam_rows, right={2, 3, 4, 5})
    )
    spend = summary["spend"]
    share = (
        f" ({100 * waste['usd'] / spend['usd']:.1f} % of ${spend['usd']:,.2f} spent on {spend['runs']} runs"
        f" and {spend['jobs_without_run']} {'job' if spend['jobs_without_run'] == 1 else 'jobs'} without a run)"
        if spend["usd"]
        else ""
    )
    lines.append("")
    lines.append(
        f"waste: {waste['gpu_hours']:,.1f} GPU-h, ${waste['usd']:,.2f}{share}, {waste['bytes'] / 1e9:,.1f} GB reclaimable"
    )
    if waste["unknown_cost"]:
        lines.append(
            f"unknown cost: {waste['unknown_cost']} findings ({waste['unknown_cost_run_hours']:,.2f} "
            "run-hours) have no GPU count in any source; not included above"
        )
    if spend["runs_without_cost"]:
        lines.append(
            f"spend excludes {spend['runs_without_cost']} runs with an unknown GPU count "
            f"({spend['run_hours_without_cost']:,.2f} run-hours): see [cost] in audit.toml"
        )
    evaluation = summary["evaluation"]
    if evaluation["runs"]:
        lines.append(
            f"evaluation: {evaluation['gpu_hours']:,.1f} GPU-h, ${evaluation['usd']:,.2f} on "
            f"{evaluation['runs']} evaluation runs (in the spend above), "
            f"${evaluation['duplicate_usd']:,.2f} of it duplicates"
        )
    if summary["suppressed"]:
        lines.append(f"suppressed: {summary['suppressed']} findings (listed in --format json)")
    active = result.active
    if active:
        lines.append("")
        lines.append(f"top findings ({min(top, len(active))} of {len(active)}):")
        lines.append(
            table(
                ["severity", "rule", "subject", "GPU-h", "$", "message"],
                [
                    [
                        f.severity.label,
                        f.rule,
                        subject_label(f.subject),
                        "?" if f.gpu_hours is None else f"{f.gpu_hours:,.1f}",
                        "?" if f.usd is None else f"{f.usd:,.2f}",
                        f.message,
                    ]
                    for f in active[:top]
                ],
                right={3, 4},
            )
        )
    skipped = [r for r in result.results if r.status != "ok"]
    for r in skipped:
        lines.append(f"{r.rule} {r.status}: {r.reason}")
    notes = sum(len(r.notes) for r in result.results)
    if notes:
        lines.append(
            f"{notes} note{'' if notes == 1 else 's'} on subjects that could not be judged "
            "(see notes in --format json)"
        )
    return "\n".join(safe_lines(lines))


def safe_lines(lines: list[str]) -> list[str]:
    return [safe(line) for line in lines]


MARKDOWN_NOTES = 20  # notes listed in --format md; all of them are in --format json


def render_markdown(result, summary, top: int = 20) -> str:
    waste, spend = summary["waste"], summary["spend"]
    out = [
        f"## audit scan #{result.scan_id}",
        "",
        f"**Waste: {waste['gpu_hours']:,.1f} GPU-h, ${waste['usd']:,.2f}**"
        + (
            f" ({100 * waste['usd'] / spend['usd']:.1f} % of ${spend['usd']:,.2f} spent)"
            if spend["usd"]
            else ""
        )
        + f", {waste['bytes'] / 1e9:,.1f} GB reclaimable storage.",
        "",
        "| family | findings | GPU-h | $ | GB |",
        "|---|--:|--:|--:|--:|",
    ]
    out += [
        f"| {f['family']} {f['label']} | {f['findings']} | {f['gpu_hours']:,.1f} | {f['usd']:,.2f} | {f['bytes'] / 1e9:,.1f} |"
        for f in summary["families"]
    ]
    if waste["unknown_cost"]:
        out += [
            "",
            f"Unknown cost: {waste['unknown_cost']} findings have no GPU count in any source "
            "and are not in the figures above.",
        ]
    active = result.active
    if active:
        out += [
            "",
            f"Top {min(top, len(active))} of {len(active)} findings:",
            "",
            "| severity | rule | subject | waste | finding |",
            "|---|---|---|--:|---|",
        ]
    for f in active[:top]:
        cost = "unknown" if f.usd is None else f"${f.usd:,.2f}"
        out.append(
            f"| {f.severity.label} | {f.rule} | {markdown_text(subject_label(f.subject))} | {cost} | {markdown_text(f.message)} |"
        )
    not_run = [r for r in result.results if r.status != "ok"]
    if not_run:
        out += ["", "Rules not run:", ""]
        out += [f"- {r.rule} {r.status}: {markdown_text(r.reason)}" for r in not_run]
    notes = [(r.rule, note) for r in result.results for note in r.notes]
    if notes:
        # A pull-request comment stays readable: the first few, the rest in --format json.
        out += [
            "",
            f"<details><summary>{len(notes)} note{'' if len(notes) == 1 else 's'} on subjects "
            "that could not be judged</summary>",
            "",
        ]
        out += [f"- {rule}: {markdown_text(note)}" for rule, note in notes[:MARKDOWN_NOTES]]
        if len(notes) > MARKDOWN_NOTES:
            out.append(f"- and {len(notes) - MARKDOWN_NOTES} more (see --format json)")
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


@cli.command("scan")
@click.option(
    "--select", metavar="CODES", help="Only these rules or families, comma separated (DUP001,OVP)."
)
@click.option("--ignore", metavar="CODES", help="Skip these rules or families, comma separated.")
@click.option("--since", type=DATE, help="Judge activity from this date (UTC), inclusive.")
@click.option("--until", type=DATE, help="Judge activity before this date (UTC).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "md", "html"]),
    default="table",
    show_default=True,
    help="Output format (html: the scan as one self-contained report file, needs --output).",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to this file instead of stdout.",
)
@click.option(
    "--fail-on",
    type=click.Choice(SEVERITIES),
    help="Exit 1 when a finding is at or above this severity.",
)
@pass_app
def scan_command(app: AppContext, select, ignore, since, until, fmt, output, fail_on) -> None:
    """Run the waste rules over the warehouse, store and print the findings.

    Exit code 1 when a finding is at or above --fail-on (for CI and cron), else 0.

    \b
    Example:
      audit scan
      audit scan --select OVP,IDL --since 2026-11-16 --until 2026-11-23 --format json --output scan.json
      audit scan --fail-on high
      audit scan --format html --output scan.html
    """
    if since and until and since >= until:
        raise click.UsageError("--since must be before --until")
    if fmt == "html" and output is None:
        raise click.UsageError("--format html needs --output PATH")
    rules = select_rules(select, ignore)
    config = app.config
    window = Window(since, until)
    shared: dict = {}
    with app.warehouse() as wh:
        # summarise reads the facts; the rules' other shared computations go when done
        result = scan(wh, config, rules, window, shared, keep=frozenset({"facts"}))
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
            text = render_markdown(result, summary)
        else:
            text = render_table(result, summary) + "\n"
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

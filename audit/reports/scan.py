"""A scan as a document and as text: the JSON document (one finding per line), the
terminal tables and the Markdown digest, each in the order a lead reads it."""

from __future__ import annotations

import json

from audit.format import table
from audit.rule_api import subject_label
from audit.text import counted, markdown_text
from audit.text import terminal_safe as safe


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


def render_table(result, summary, show_all: bool = False) -> str:
    """The scan for a terminal, in the order a lead reads it: what to do first, the
    headline figures, waste by family, what is under the floors, what was not judged."""
    lines = []
    actions = summary["actions"]
    if actions:
        lines.append(
            f"what to do first ({len(actions)} of {summary['listed']} findings, by impact):"
        )
        lines.append(
            table(
                ["#", "severity", "rule", "owner", "impact", "action", "finding"],
                [
                    [
                        str(number),
                        a["severity"],
                        a["rule"],
                        owner_text(a["owner"]),
                        a["impact"],
                        a["action"],
                        a["finding"],
                    ]
                    for number, a in enumerate(actions, start=1)
                ],
                right={0},
            )
        )
        lines.append("")
    lines += headline_lines(summary)
    lines.append("")
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
    if summary["immaterial"]:
        lines.append("")
        lines.append("under the materiality floors (not listed; --all lists them):")
        lines += [f"  {immaterial_text(line)}" for line in summary["immaterial"]]
    if show_all:
        shown = result.active
        lines.append("")
        lines.append(f"all {len(shown)} findings:")
        lines.append(
            table(
                ["severity", "rule", "subject", "impact", "listed", "message"],
                [
                    [
                        f.severity.label,
                        f.rule,
                        subject_label(f.subject),
                        f.impact_text,
                        "yes" if f.material else "under floor",
                        f.message,
                    ]
                    for f in shown
                ],
            )
        )
    if summary["suppressed"]:
        lines.append(f"suppressed: {summary['suppressed']} findings (listed in --format json)")
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


def owner_text(owner: dict) -> str:
    parts = [owner.get("team") and f"team {owner['team']}", owner.get("user")]
    return ", ".join(p for p in parts if p) or "unknown"


def immaterial_text(line: dict) -> str:
    parts = []
    if line["gpu_hours"]:
        parts.append(f"{line['gpu_hours']:,.2f} GPU-h (${line['usd']:,.2f})")
    if line["run_hours"]:
        parts.append(f"{line['run_hours']:,.2f} run-hours")
    if line["bytes"]:
        parts.append(f"{line['bytes'] / 1e9:,.2f} GB")
    if line["risk_gpu_hours"]:
        parts.append(f"{line['risk_gpu_hours']:,.2f} GPU-h at risk")
    team = f"team {line['team']}" if line["team"] else "no team"
    weight = ", ".join(parts) or "nothing measured"
    return f"{line['rule']} ({team}): {line['findings']} findings, {weight} in all"


def headline_lines(summary: dict) -> list[str]:
    """The headline figures, each over its own population."""
    h, spend = summary["headline"], summary["spend"]
    wasted, spent = h["wasted"], h["spent"]
    share = f" = {wasted['share_pct']} % of ${spent['usd']:,.2f} spent" if spent["usd"] else ""
    lines = [
        f"wasted: ${wasted['usd']:,.2f} ({wasted['gpu_hours']:,.1f} GPU-h){share} on "
        f"{counted(spend['runs'], 'run')} and {counted(spend['jobs_without_run'], 'job')} "
        "without a run"
    ]
    idle = h["unallocated_capacity"]
    if idle["findings"]:
        lines.append(
            f"unallocated capacity: ${idle['usd']:,.2f} ({idle['gpu_hours']:,.1f} GPU-h) of "
            "GPUs idle with no job, outside the spend above"
        )
    storage = h["storage"]
    if storage["findings"]:
        lines.append(
            f"storage: {storage['gb']:,.1f} GB reclaimable, ${storage['usd_per_month']:,.2f} "
            "per month"
        )
    unknown = h["unknown_cost"]
    if unknown["findings"]:
        lines.append(
            f"unknown cost: {counted(unknown['findings'], 'finding')} ({unknown['run_hours']:,.2f} "
            "run-hours) have no GPU count in any source; not included above"
        )
    if spend["runs_without_cost"]:
        lines.append(
            f"spend excludes {counted(spend['runs_without_cost'], 'run')} with an unknown GPU count "
            f"({spend['run_hours_without_cost']:,.2f} run-hours): see [cost] in audit.toml"
        )
    if spend["gpu_hours_at_fallback_price"]:
        lines.append(
            f"{spend['gpu_hours_at_fallback_price']:,.1f} GPU-h of the spend are priced at "
            "[prices] default: their card has no price (set [prices] gpu_hour_usd)"
        )
    evaluation = summary["evaluation"]
    if evaluation["runs"]:
        lines.append(
            f"evaluation: {evaluation['gpu_hours']:,.1f} GPU-h, ${evaluation['usd']:,.2f} on "
            f"{counted(evaluation['runs'], 'evaluation run')} (in the spend above), "
            f"${evaluation['duplicate_usd']:,.2f} of it duplicates"
        )
    return lines


def safe_lines(lines: list[str]) -> list[str]:
    return [safe(line) for line in lines]


MARKDOWN_NOTES = 20  # notes listed in --format md; all of them are in --format json


def render_markdown(result, summary, show_all: bool = False) -> str:
    out = [f"## audit scan #{result.scan_id}", ""]
    actions = summary["actions"]
    if actions:
        out += [
            f"**What to do first** ({len(actions)} of {summary['listed']} findings, by impact):",
            "",
            "| # | severity | rule | owner | impact | action | finding |",
            "|--:|---|---|---|--:|---|---|",
        ]
        out += [
            f"| {n} | {a['severity']} | {a['rule']} | {markdown_text(owner_text(a['owner']))} | "
            f"{a['impact']} | {markdown_text(a['action'])} | {markdown_text(a['finding'])} |"
            for n, a in enumerate(actions, start=1)
        ]
        out.append("")
    out += [f"- {markdown_text(line)}" for line in headline_lines(summary)]
    out += [
        "",
        "| family | findings | GPU-h | $ | GB |",
        "|---|--:|--:|--:|--:|",
    ]
    out += [
        f"| {f['family']} {f['label']} | {f['findings']} | {f['gpu_hours']:,.1f} | {f['usd']:,.2f} | {f['bytes'] / 1e9:,.1f} |"
        for f in summary["families"]
    ]
    if summary["immaterial"]:
        out += ["", "Under the materiality floors (not listed one by one):", ""]
        out += [f"- {markdown_text(immaterial_text(line))}" for line in summary["immaterial"]]
    if show_all and result.active:
        out += [
            "",
            f"All {len(result.active)} findings:",
            "",
            "| severity | rule | subject | impact | finding |",
            "|---|---|---|--:|---|",
        ]
        out += [
            f"| {f.severity.label} | {f.rule} | {markdown_text(subject_label(f.subject))} | "
            f"{f.impact_text} | {markdown_text(f.message)} |"
            for f in result.active
        ]
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

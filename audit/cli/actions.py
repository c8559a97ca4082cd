"""``audit gate`` and ``audit prune``: acting on findings."""

from __future__ import annotations

import json

import click

from audit import atomic, interrupts
from audit.cli import AppContext, cli, pass_app
from audit.cli.options import FILE
from audit.errors import AuditError
from audit.format import table
from audit.text import counted
from audit.text import terminal_safe as safe


@cli.command("gate")
@click.argument("run_id")
@click.option(
    "--baseline",
    metavar="RUN_ID",
    help="Compare with this run (default: the audit.baseline=true run of the same base model; "
    "a unique prefix will do).",
)
@click.option(
    "--tolerance",
    type=float,
    help="Allowed absolute drop per metric (default: [rules.REG002] tolerance, else 0.02).",
)
@click.option(
    "--metrics",
    "globs",
    multiple=True,
    metavar="GLOB",
    help="General-ability metric globs (default: [metrics] general).",
)
@click.option(
    "--refresh",
    is_flag=True,
    help="Import the run's latest state from its MLflow source first (works on a RUNNING run).",
)
@click.option(
    "--tracking-uri",
    envvar="MLFLOW_TRACKING_URI",
    help="Where to fetch a run not imported yet. Env: MLFLOW_TRACKING_URI.",
)
@click.option(
    "--tag",
    is_flag=True,
    help="Write the verdict to the MLflow run as tags (audit.gate=pass|fail and the numbers).",
)
@pass_app
def gate_command(
    app: AppContext, run_id, baseline, tolerance, globs, refresh, tracking_uri, tag
) -> None:
    """Fail when a run's general ability regressed past the tolerance or a red line dropped (exit 1).

    Red lines ([metrics] red_lines) fail on any drop beyond their own tolerance ([metrics]
    red_line_tolerances, default 0), whatever --tolerance says. Each metric is read in its
    own direction (a falling loss is a gain); a metric whose direction nothing tells is
    refused. Exit 2 when it cannot tell.

    Meant for training loops: call it every N steps with --refresh and stop on exit 1.
    Run ids may be shortened to a unique prefix of at least 4 characters, as in git.

    \b
    Example:
      audit gate 3f2a9c... --refresh --tracking-uri http://127.0.0.1:5000 || touch STOP_TRAINING
      audit gate 3f2a9c... --baseline 77e1b0... --tolerance 0.01 --metrics 'eval/general/mmlu*'
    """
    from audit.actions.gate import CannotJudge, gate, tag_verdict

    try:
        result = gate(
            run_id,
            app.db_path,
            baseline,
            tolerance,
            list(globs) or None,
            refresh,
            tracking_uri,
            app.config,
        )
    except CannotJudge as exc:
        click.echo(f"cannot judge: {safe(str(exc))}", err=True)
        raise SystemExit(2) from None
    click.echo(
        table(
            ["metric", "better", "baseline", "current", "change", "gain", "allowed", "verdict"],
            [
                [
                    r["metric"],
                    r["better"],
                    f"{r['baseline']:.4f}",
                    f"{r['current']:.4f}",
                    f"{r['change']:+.4f}",
                    f"{r['gain']:+.4f}",
                    f"{r['allowed']:+.4f}",
                    "ok" if r["ok"] else ("RED LINE" if r["red_line"] else "REGRESSED"),
                ]
                for r in result.rows
            ],
            right={2, 3, 4, 5, 6},
        )
    )
    if result.shift is not None:  # beside the evaluations; the verdict stays the last line
        click.echo(safe(f"shift: {result.shift['text']}"))
    worst = result.worst
    verdict = "pass" if result.passed else "FAIL"
    allowed = (
        f"red line, tolerance {-worst['allowed']:g}"
        if worst["red_line"]
        else (f"tolerance {result.tolerance:g}")
    )
    click.echo(
        safe(
            f"{verdict}: worst {worst['metric']} {worst['change']:+.4f} ({worst['better']} is "
            f"better: gain {worst['gain']:+.4f}) against baseline {result.baseline_id} ({allowed})"
        )
    )
    if tag:
        try:
            tag_verdict(result, app.db_path, tracking_uri, app.config)
        except AuditError as exc:  # the verdict stands; only writing it back failed
            click.echo(f"audit: warning: the verdict was not tagged: {safe(str(exc))}", err=True)
    raise SystemExit(result.exit_code)


@cli.command("prune")
@click.option(
    "--plan",
    "plan_path",
    type=FILE,
    help="Write the deletion plan (JSON) from the current checkpoint findings.",
)
@click.option(
    "--apply",
    "apply_path",
    type=FILE,
    help="Delete what this plan lists, after re-checking each entry.",
)
@click.option(
    "--include-orphans",
    is_flag=True,
    help="Also plan orphan checkpoints (CKP003: no run claims them), never a folder's best or last.",
)
@click.option(
    "--manifest",
    type=FILE,
    help="Where --apply records what it deleted and skipped (default: PLAN.manifest.jsonl).",
)
@pass_app
def prune_command(app: AppContext, plan_path, apply_path, include_orphans, manifest) -> None:
    """Delete reclaimable checkpoints: plan first, then apply the plan (nothing else is ever deleted).

    Without options it prints what a plan would contain (a dry run). Best, last and
    registered checkpoints are never deleted, orphans only with --include-orphans;
    --apply re-checks every entry against the warehouse and the files, whatever the
    plan says, and skips anything changed since planning or outside its root.

    \b
    Example:
      audit prune                      # dry run
      audit prune --plan plan.json     # review plan.json, then
      audit prune --apply plan.json
    """
    from audit.actions.prune import apply_plan, make_plan

    if plan_path and apply_path:
        raise click.UsageError("--plan and --apply are separate steps: plan, review, then apply")
    if apply_path and include_orphans:
        raise click.UsageError(
            "--include-orphans belongs to the planning step: audit prune --include-orphans --plan FILE"
        )
    if apply_path:
        manifest = manifest or apply_path.with_name(apply_path.name + ".manifest.jsonl")
        summary = apply_plan(apply_path, app.db_path, manifest, app.config)
        for outcome in summary["outcomes"]:
            if outcome["status"] != "deleted":
                click.echo(
                    f"{outcome['status']} {safe(outcome['path'])}: {safe(outcome['reason'])}",
                    err=True,
                )
        click.echo(
            f"deleted {counted(summary['deleted'], 'entry')} ({summary['freed_bytes'] / 1e9:,.1f} GB freed), "
            f"skipped {summary['skipped']}; manifest {manifest}"
        )
        if summary["interrupted"]:
            left = summary["planned"] - len(summary["outcomes"])
            click.echo(
                f"audit: interrupted; stopped after {len(summary['outcomes'])} of "
                f"{counted(summary['planned'], 'entry')}, {left} not touched; what was done is in the "
                "manifest and the warehouse",
                err=True,
            )
            raise click.exceptions.Exit(interrupts.EXIT_INTERRUPTED)
        return
    plan = make_plan(app.db_path, app.config, include_orphans)
    for entry in plan["entries"]:
        click.echo(
            f"{'would delete' if not plan_path else 'planned'} {safe(entry['path'])} "
            f"({entry['bytes'] / 1e9:,.1f} GB, {entry['rule']})"
        )
    for refused in plan["refused"]:
        click.echo(f"not planned {safe(refused['path'])}: {safe(refused['reason'])}", err=True)
    if plan["kept_by_suppression"]:
        first = plan["kept_by_suppression"][0]
        click.echo(
            f"not planned: {counted(len(plan['kept_by_suppression']), 'checkpoint')} kept by a "
            "suppression "
            f"(e.g. {safe(first['path'])}: {safe(first['reason'])})",
            err=True,
        )
    if plan["orphans_left_out"]:
        click.echo(
            f"not planned: {counted(plan['orphans_left_out'], 'orphan checkpoint')} (CKP003, no "
            "run claims them); check `audit status` link coverage, or add --include-orphans",
            err=True,
        )
    if plan_path:
        atomic.write_text(plan_path, json.dumps(plan, indent=2) + "\n")
        click.echo(
            f"wrote {plan_path}: {counted(len(plan['entries']), 'entry')}, {plan['total_bytes'] / 1e9:,.1f} GB; "
            f"apply with audit prune --apply {plan_path}"
        )
    else:
        click.echo(
            f"dry run: {counted(len(plan['entries']), 'entry')}, {plan['total_bytes'] / 1e9:,.1f} GB reclaimable; "
            "write a plan with --plan FILE"
        )

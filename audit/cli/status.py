"""``audit status``: what the warehouse holds."""

from __future__ import annotations

import click

from audit.cli import AppContext, cli, pass_app
from audit.format import count, table
from audit.status import warehouse_status
from audit.text import counted
from audit.text import terminal_safe as safe


@cli.command()
@pass_app
def status(app: AppContext) -> None:
    """Show sources, time range and row counts of the warehouse.

    \b
    Example:
      audit status
      audit --db team.duckdb status
    """
    with app.warehouse(read_only=True) as wh:
        report = warehouse_status(wh)
    click.echo(safe(f"warehouse {app.db_path} (schema v{report['schema_version']})"))
    if not report["sources"] and not report["file_sources"]:
        click.echo(
            "nothing imported yet; start with `audit ingest mlflow --tracking-uri URI`, "
            "`audit ingest wandb PATH`, `audit ingest slurm FILE` or `audit ingest gpu FILE`"
        )
        return
    click.echo("")
    if report["sources"]:
        click.echo(
            table(
                ["source", "kind", "location", "experiments", "runs", "deleted", "last import"],
                [
                    [
                        s["source_id"],
                        s["kind"],
                        s["location"],
                        count(s["experiments"]),
                        count(s["runs"]),
                        count(s["deleted_runs"]),
                        s["last_imported_at"],
                    ]
                    for s in report["sources"]
                ],
                right={3, 4, 5},
            )
        )
    else:
        click.echo("no tracker source (no runs imported)")
    if report["file_sources"]:
        click.echo("")
        click.echo(
            table(
                ["file source", "files", "rows imported", "last import"],
                [
                    [f["kind"], count(f["files"]), count(f["rows_written"]), f["last_imported_at"]]
                    for f in report["file_sources"]
                ],
                right={1, 2},
            )
        )
    totals = report["totals"]
    click.echo("")
    click.echo(
        f"runs {count(totals['runs'])} ({count(totals['deleted_runs'])} deleted), "
        f"params {count(totals['params'])}, tags {count(totals['tags'])}, "
        f"metric points {count(totals['metric_points'])}, "
        f"dataset inputs {count(totals['dataset_inputs'])}"
    )
    if totals["eval_results"]:
        click.echo(
            f"evaluation results {count(totals['eval_results'])} "
            f"from {counted(totals['eval_runs'] or 0, 'evaluation run')}"
        )
    if report["first_run"]:
        click.echo(f"runs started between {report['first_run']} and {report['last_run']} (UTC)")
    if report["runs_by_status"]:
        by_status = ", ".join(f"{k} {count(v)}" for k, v in report["runs_by_status"])
        click.echo(safe(f"run status: {by_status}"))
    c = report["cluster"]
    click.echo("")
    click.echo(
        f"jobs {count(c['jobs'])} ({count(c['gpu_jobs'])} with GPUs)"
        + (f", {c['jobs_from']} to {c['jobs_to']} (UTC)" if c["jobs"] else "")
    )
    click.echo(
        f"GPU samples {count(c['samples'])} from {counted(c['hosts'] or 0, 'host')} / "
        f"{counted(c['gpus'] or 0, 'GPU')}"
        + (f", {c['samples_from']} to {c['samples_to']} (UTC)" if c["samples"] else "")
    )
    click.echo(
        f"  attached to a job {count(c['attached'])}, no job on the host {count(c['unattached'])}, "
        f"ambiguous {count(c['ambiguous'])}"
    )
    click.echo(f"checkpoints {count(c['checkpoints'])} ({_gb(c['checkpoint_bytes'])})")
    click.echo("")
    click.echo("link coverage:")
    methods = ", ".join(f"{m} {n}" for m, n in c["link_methods"])
    click.echo(
        f"  runs with a Slurm job      {_share(c['runs_with_job'], c['runs'])}"
        + (f" ({safe(methods)})" if methods else "")
    )
    click.echo(
        f"  GPU jobs with telemetry    {_share(c['gpu_jobs_with_telemetry'], c['gpu_jobs'])}"
    )
    click.echo(
        f"  checkpoints with a run     {_share(c['checkpoints_with_run'], c['checkpoints'])}"
    )
    _watch(report["watch"])


def _watch(watch: dict) -> None:
    """``audit watch``'s record: its last run, what it did, the latest actions."""
    if watch["last"] is None:
        return
    number, started, finished, enforce, intervals, outcome = watch["last"]
    click.echo("")
    click.echo(
        f"watch: last run #{number} from {started:%Y-%m-%d %H:%M} to "
        + (f"{finished:%Y-%m-%d %H:%M}" if finished else "now")
        + f" UTC, {counted(intervals, 'interval')}, {'enforcing' if enforce else 'dry run'}, {outcome}"
    )
    counts = watch["counts"]
    click.echo(
        f"  open findings {watch['open']}; warnings sent {counts.get('warn sent', 0)}, "
        f"reminders and notices sent {counts.get('remind sent', 0)}, messages not sent "
        f"{sum(v for k, v in counts.items() if k.split()[0] in ('warn', 'remind') and k.split()[1] != 'sent')}; "
        f"jobs cancelled {counts.get('cancel cancelled', 0)}, would have cancelled "
        f"{counts.get('would_cancel done', 0)}"
    )
    if watch["actions"]:
        click.echo(
            table(
                ["when (UTC)", "policy", "job", "action", "status", "to", "detail"],
                [
                    [f"{at:%Y-%m-%d %H:%M:%S}", policy, job, action, status, to, detail[:80]]
                    for at, policy, job, action, status, to, detail in watch["actions"]
                ],
            )
        )


def _share(part: int, whole: int) -> str:
    if not whole:
        return "0 of 0"
    return f"{part:,} of {whole:,} ({100 * part / whole:.0f} %)"


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"

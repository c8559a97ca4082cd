"""``audit watch``: stop waste while it happens."""

from __future__ import annotations

import click

from audit import interrupts
from audit.cli import AppContext, cli, pass_app
from audit.errors import InputError
from audit.text import terminal_safe as safe


@cli.command()
@click.option("--once", is_flag=True, help="One interval, then exit (for cron).")
@click.option(
    "--enforce",
    is_flag=True,
    help="Cancel the jobs of enforce = true policies after their warning period "
    "(without it: say what would be cancelled, and why).",
)
@click.option(
    "--interval",
    metavar="DURATION",
    help="Time between intervals, e.g. 30s, 5m (default: [watch] interval, 5m).",
)
@pass_app
def watch(app: AppContext, once: bool, enforce: bool, interval: str | None) -> None:
    """Watch live jobs, GPU telemetry and runs; warn owners, then cancel what a policy covers.

    Every interval it imports the Slurm job list (and sacct for jobs that ended), appended
    nvidia-smi logs, dcgm-exporter endpoints and live runs, judges the [watch.policy.NAME]
    policies of the config (idle GPUs, unstable training, a red line dropped, a duplicate
    launch), warns each owner once per finding through apprise, and after the policy's
    warning period cancels the job (only with --enforce, only for enforce = true
    policies). Every action is recorded in the warehouse; a restart resumes from it.
    Ctrl-C or SIGTERM ends it between steps (exit 130, 143).

    \b
    Example:
      audit watch --once                 # one pass, for cron; dry run
      audit watch --enforce              # foreground, e.g. under systemd
    """
    from audit.watch.engine import Watch, watch_lock
    from audit.watch.settings import parse_duration

    config = app.config
    settings = config.watch
    if not settings.policies:
        raise InputError(
            "no [watch.policy.NAME] in the config: nothing to watch for (see docs/watch.md)"
        )
    seconds = parse_duration(interval, "--interval") if interval else settings.interval
    if seconds < 1:
        raise InputError("--interval must be at least 1 s")
    interrupts.install_terminate()
    runner = Watch(
        app.db_path,
        config,
        enforce,
        echo=lambda line: click.echo(safe(line)),
        err=lambda line: click.echo(safe(line), err=True),
    )
    with watch_lock(app.db_path):
        runner.start(once)
        outcome = "failed"
        try:
            runner.run(once, seconds)
            outcome = "stopped"
        except KeyboardInterrupt:
            outcome = "interrupted"
            raise
        finally:
            runner.finish(outcome)

"""``audit ingest ...``: the commands that write the warehouse."""

from __future__ import annotations

import click

from audit.cli import AppContext, cli, pass_app
from audit.progress import ProgressReporter


@cli.group()
def ingest() -> None:
    """Import history into the warehouse (atomic, incremental, idempotent).

    \b
    Example:
      audit ingest mlflow --tracking-uri http://127.0.0.1:5000
    """


@ingest.command("mlflow")
@click.option(
    "--tracking-uri",
    required=True,
    envvar="MLFLOW_TRACKING_URI",
    help="sqlite:///PATH, postgresql://…, http(s)://HOST:PORT or an mlruns/ folder. "
    "Env: MLFLOW_TRACKING_URI.",
)
@click.option(
    "--experiment",
    "experiments",
    multiple=True,
    metavar="NAME",
    help="Only these experiments (repeatable). Default: all, deleted ones included.",
)
@pass_app
def ingest_mlflow(app: AppContext, tracking_uri: str, experiments: tuple[str, ...]) -> None:
    """Import runs, params, tags, metric history and datasets from MLflow.

    Reads SQL and file stores directly in bulk and a tracking server through its REST API.
    A second import fetches only new or changed runs; a failure or Ctrl-C leaves the
    warehouse as it was.

    \b
    Example:
      audit ingest mlflow --tracking-uri sqlite:///mlflow.db --experiment sft-coder
    """
    from audit.importers.mlflow import import_mlflow

    config = app.config
    with app.warehouse() as wh:
        summary = import_mlflow(
            wh,
            tracking_uri,
            list(experiments),
            config=config,
            progress=ProgressReporter("importing runs"),
        )
    click.echo(summary.line())

"""The ``audit`` command line: thin click commands over the library."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import click
import duckdb

from audit import __version__, interrupts
from audit.config import DEFAULT_CONFIG_NAME, Config, load_config
from audit.errors import AuditError
from audit.text import terminal_safe
from audit.warehouse import Warehouse, open_warehouse

EXIT_INTERNAL = 3


@dataclass
class AppContext:
    db_path: Path
    config_path: Path | None
    _config: Config | None = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    def warehouse(self, read_only: bool = False) -> Warehouse:
        return open_warehouse(self.db_path, read_only=read_only)


class AuditGroup(click.Group):
    """Turns library errors into one-line messages with documented exit codes."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except AuditError as exc:
            if interrupts.requested():  # an importer's wrapping of the interrupted library
                _interrupted(ctx)
            # One line, whatever the wrapped library put in its message; names and values
            # quoted from the input are shown with their control characters escaped.
            error = click.ClickException(terminal_safe(" ".join(str(exc).split())))
            error.exit_code = exc.exit_code
            raise error from None
        except (KeyboardInterrupt, duckdb.InterruptException):
            _interrupted(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # a bug: say so in one line, keep the traceback opt-in
            if interrupts.requested():
                _interrupted(ctx)
            if os.environ.get("AUDIT_DEBUG"):
                raise
            click.echo(
                f"audit: internal error: {type(exc).__name__}: {exc} "
                "(set AUDIT_DEBUG=1 for the traceback and please report it)",
                err=True,
            )
            ctx.exit(EXIT_INTERNAL)


def _interrupted(ctx: click.Context) -> None:
    click.echo(interrupts.message(), err=True)
    ctx.exit(interrupts.EXIT_INTERRUPTED)


def _default_config() -> str | None:
    return DEFAULT_CONFIG_NAME if Path(DEFAULT_CONFIG_NAME).is_file() else None


@click.group(cls=AuditGroup)
@click.version_option(__version__, "--version", prog_name="audit")
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="AUDIT_DB",
    default="audit.duckdb",
    show_default=True,
    help="Warehouse file (DuckDB). Env: AUDIT_DB.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    envvar="AUDIT_CONFIG",
    default=_default_config,
    help="Settings file. Env: AUDIT_CONFIG. Default: ./audit.toml when it exists.",
)
@click.pass_context
def cli(ctx: click.Context, db_path: Path, config_path: Path | None) -> None:
    """Experiment registry and GPU waste audit for post-training teams.

    Import MLflow history and cluster logs into a local DuckDB warehouse, then ask it
    questions.

    \b
    Example:
      audit --db team.duckdb ingest mlflow --tracking-uri sqlite:///mlflow.db
      audit --db team.duckdb status
    """
    ctx.obj = AppContext(db_path=db_path, config_path=config_path)


pass_app = click.make_pass_decorator(AppContext)


# Command modules attach themselves to ``cli``; imported last because they import it.
from audit.cli import actions, ingest, report, runs, scan, status  # noqa: E402, F401

"""The ``audit`` command line: thin click commands over the library."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click
import duckdb

from audit import __version__, interrupts
from audit.cli.options import FILE
from audit.config import DEFAULT_CONFIG_NAME, Config
from audit.errors import AuditError, WarehouseError
from audit.text import terminal_safe
from audit.warehouse import Warehouse, open_warehouse
from audit.warehouse.store import damaged_message

EXIT_INTERNAL = 3


@dataclass
class AppContext:
    db_path: Path
    config_path: Path | None
    _config: Config | None = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        if self._config is None:
            from audit.rule_registry import load_checked_config  # the rules load on first use

            self._config = load_checked_config(self.config_path)
        return self._config

    def warehouse(self, read_only: bool = False, create: bool = False) -> Warehouse:
        """The --db warehouse; only imports pass ``create`` (a mistyped --db in a scan
        must not report $0 from a new empty warehouse)."""
        return open_warehouse(self.db_path, read_only=read_only, create=create)


# The module defining each command. A command's module, and what it imports (the rule
# engine, the report renderers: a fifth of a second), is imported only when that command
# runs or a listing (help, docs) needs every command.
_COMMAND_MODULES = {
    "gate": "actions",
    "prune": "actions",
    "ingest": "ingest",
    "report": "report",
    "runs": "runs",
    "sql": "runs",
    "export": "runs",
    "scan": "scan",
    "rules": "scan",
    "status": "status",
    "watch": "watch",
}


def _import_commands(modules) -> None:
    for module in modules:
        importlib.import_module(f"audit.cli.{module}")


class AuditGroup(click.Group):
    """Turns library errors into one-line messages with documented exit codes."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        _import_commands(sorted(set(_COMMAND_MODULES.values())))
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = _COMMAND_MODULES.get(cmd_name)
        # an unknown name: every module, so that click's "did you mean" sees every command
        _import_commands([module] if module else sorted(set(_COMMAND_MODULES.values())))
        return super().get_command(ctx, cmd_name)

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except BrokenPipeError:  # `audit --help | head -1`: as for any other output
            sys.exit(output_closed())

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
        except BrokenPipeError:
            _output_closed(ctx)
        except duckdb.IOException as exc:  # a block of the file unreadable: damage, not a bug
            db_path = ctx.find_object(AppContext).db_path
            error = click.ClickException(
                terminal_safe(damaged_message(db_path, " ".join(str(exc).split())))
            )
            error.exit_code = WarehouseError.exit_code
            raise error from None
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
    ctx.exit(interrupts.exit_code())


EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for `cat` in `cat f | head`


def output_closed() -> int:
    """The reader of stdout went away (``audit status | head -2``): stop quietly, as other
    Unix tools do. stdout now points at /dev/null so the exit's final flush cannot fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (in-process runners)
        pass
    finally:
        os.close(devnull)
    return EXIT_OUTPUT_CLOSED


def _output_closed(ctx: click.Context) -> None:
    ctx.exit(output_closed())


def _default_config() -> str | None:
    return DEFAULT_CONFIG_NAME if Path(DEFAULT_CONFIG_NAME).is_file() else None


@click.group(cls=AuditGroup)
@click.version_option(__version__, "--version", prog_name="audit")
@click.option(
    "--db",
    "db_path",
    type=FILE,
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
    app = AppContext(db_path=db_path, config_path=config_path)
    if config_path is not None:  # a missing or invalid --config is an error for every command
        from audit.rule_registry import load_checked_config

        app._config = load_checked_config(config_path)
    ctx.obj = app


pass_app = click.make_pass_decorator(AppContext)

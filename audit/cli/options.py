"""Options several commands take, each defined once: what it is called, what it parses,
how it is checked. A command says only what the option means for it."""

from __future__ import annotations

from pathlib import Path

import click

DATE = click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"])
FILE = click.Path(dir_okay=False, path_type=Path)  # a file to read or write, not a folder


def window_options(since_help: str, until_help: str):
    """``--since`` and ``--until``: UTC dates or times, the first before the second."""

    def decorate(command):
        command = click.option("--until", type=DATE, help=until_help, callback=_ordered)(command)
        return click.option("--since", type=DATE, help=since_help, callback=_ordered)(command)

    return decorate


def _ordered(ctx: click.Context, param: click.Parameter, value):
    """Whichever of the two click reads second (the order they were typed in) checks them."""
    other = ctx.params.get("until" if param.name == "since" else "since")
    since, until = (value, other) if param.name == "since" else (other, value)
    if since is not None and until is not None and since >= until:
        raise click.UsageError("--since must be before --until", ctx)
    return value


def format_option(choices: list[str], default: str, help: str):
    """``--format``, read as ``fmt``."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(choices),
        default=default,
        show_default=True,
        help=help,
    )


def output_option(help: str):
    """``--output``: a file to write (not a folder)."""
    return click.option("--output", type=FILE, help=help)


def limit_option(default: int, help: str):
    """``--limit``: at most this many (a whole number from 1)."""
    return click.option(
        "--limit", type=click.IntRange(min=1), default=default, show_default=True, help=help
    )


def skip_bad_option(what: str):
    """``--skip-bad``: leave out the bad ``what`` and list them; without it the first
    stops the import, which writes nothing."""
    return click.option(
        "--skip-bad",
        is_flag=True,
        help=f"Leave out bad {what} and list them (default: stop at the first, write nothing).",
    )

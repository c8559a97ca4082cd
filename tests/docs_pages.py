"""The user documentation as the tests read it: README.md and every page under docs/, their
shell examples as argument lists, and the command each example runs."""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

import click

from audit.cli import cli
from audit.docs import CLI_PAGE, RULES_DIR
from tests.helpers import REPO


def user_pages() -> list[Path]:
    """README.md and every Markdown page of docs/, in a stable order."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def written_pages() -> list[Path]:
    """The pages people write: not the command reference and rule pages made from the code."""
    generated = {REPO / CLI_PAGE, *(REPO / RULES_DIR).glob("*.md")}
    return [page for page in user_pages() if page not in generated]


def shell_command_lines(pages: list[Path]) -> list[tuple[str, list[str]]]:
    """Every `audit ...` command line of the pages' sh and cron examples: (page, arguments)."""
    commands = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"```(?:sh|cron)\n(.*?)```", text, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\$\([^)]*\)", "X", line.split(" #")[0])  # $(date ...) -> a word
                for part in re.split(r"&&|\|\||\||;", line):
                    words = shlex.split(part.replace("`", ""), comments=True)
                    while words and ("=" in words[0] or words[0] in ("export", "cd")):
                        words = words[1:] if "=" in words[0] or words[0] != "cd" else words[2:]
                    if words and words[0].endswith("audit") and not words[0].endswith("/srv/audit"):
                        commands.append((page.relative_to(REPO).as_posix(), words[1:]))
    return commands


def command_path(args: list[str]) -> tuple[str, ...]:
    """Parse like the CLI does, down to the command, without running anything; the names
    of the command and its groups (``("audit", "ingest", "mlflow")``). A usage error is
    raised as click raises it."""
    ctx = cli.make_context("audit", list(args), resilient_parsing=False)
    command: click.Command = cli
    path = ["audit"]
    while isinstance(command, click.Group):
        with warnings.catch_warnings():
            # Click 8.2 deprecates protected_args; Click 9 will hold them in ctx.args
            warnings.simplefilter("ignore", DeprecationWarning)
            words = [*ctx.protected_args, *ctx.args]
        name, command, rest = command.resolve_command(ctx, words)
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx)
    return tuple(path)

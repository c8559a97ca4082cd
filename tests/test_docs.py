"""Every command is documented, and the README's reference matches the commands."""

from __future__ import annotations

import pytest

from audit.docs import command_reference, help_text, iter_commands, rules_reference
from tests.helpers import REPO

COMMANDS = list(iter_commands())


def test_readme_command_reference_is_current():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert command_reference() in readme, "README command reference is stale: run `make docs`"


def test_readme_rule_table_is_current():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert rules_reference() in readme, "README rule table is stale: run `make docs`"


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_has_help_and_an_example(path, command):
    text = help_text(path, command)
    assert command.help and command.help.strip(), f"{' '.join(path)} has no help text"
    assert "Example:" in text, f"{' '.join(path)} has no example"
    assert f"audit {' '.join(path[1:])}".strip() in text.split("Example:")[1]


def test_every_option_has_help():
    for path, command in COMMANDS:
        for param in command.params:
            if param.param_type_name == "option" and param.name not in ("help", "version"):
                assert param.help, f"{' '.join(path)} {param.opts[0]} has no help"


def test_version(run_cli):
    code, out, _ = run_cli("--version")
    assert (code, out) == (0, "audit, version 0.1.0\n")

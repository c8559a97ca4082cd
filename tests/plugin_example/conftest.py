"""Plays `pip install -e tests/plugin_example` for the plug-in's own tests: the entry point
of its pyproject.toml, registered the way an installed distribution registers it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def install(target: Path) -> None:
    """Write the distribution metadata pip would write for this plug-in into ``target``."""
    project = tomllib.loads((HERE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    info = target / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = [
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items())
        for group, entries in project["entry-points"].items()
    ]
    (info / "entry_points.txt").write_text("\n".join(lines))


@pytest.fixture(autouse=True)
def installed_plugin(tmp_path, monkeypatch):
    install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(HERE))

"""The importer registry: every file-based tracker's `audit ingest <kind>` comes from it, and
an importer of another package, pip-installed with an `audit.importers` entry point, gets
its command and the loader's redaction, bounds and incremental state like a built-in."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from audit.importers.registry import BUILTIN, importer_kinds, load_importer
from tests.helpers import REPO, rows

EXAMPLE = REPO / "tests" / "importer_example"


def test_every_builtin_is_a_generated_ingest_command_with_its_own_help(run_cli):
    code, out, _ = run_cli("ingest", "--help")
    assert code == 0
    for kind in BUILTIN:
        source = load_importer(kind, BUILTIN[kind])
        assert source.kind == kind
        assert re.search(rf"^  {re.escape(kind)}\s", out, re.M), f"{kind} missing from ingest"
        code, text, _ = run_cli("ingest", kind, "--help")
        assert code == 0 and f"audit ingest {kind}" in text and "--skip-bad" in text


def install(tmp_path: Path, project: Path) -> Path:
    """``pip install`` the project into a folder of its own (no network: the venv's
    setuptools builds it), as a user installs a plug-in beside audit."""
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(project),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return site


@pytest.fixture
def plugin_site(tmp_path, monkeypatch) -> Path:
    project = tmp_path / "acme"
    shutil.copytree(EXAMPLE, project)
    site = install(tmp_path, project)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield site
    sys.modules.pop("acme_audit_importer", None)


def test_a_pip_installed_importer_gets_its_command_and_the_loaders_care(
    plugin_site, tmp_path, run_cli
):
    assert "acme" in importer_kinds()
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "r1.acme.json").write_text(
        json.dumps(
            {
                "run": "r1",
                "project": "coder",
                "status": "FINISHED",
                "config": {"lr": 2e-5, "owner": "carol@example.com"},
                "loss": [2.0, 1.5, 1.2],
                "started": 1_780_000_000,
                "ended": 1_780_003_600,
            }
        )
    )
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli("ingest", "--help")
    assert code == 0 and re.search(r"^  acme\s+Import ACME run files", out, re.M), out
    code, out, err = run_cli("--db", str(db), "ingest", "acme", str(runs))
    assert code == 0, err
    assert out.startswith(
        "imported 1 new or changed run, 0 unchanged: 2 params, 0 tags, 3 metric points, "
        "0 GPU samples from 1 file (1 file read) in "
    ), out
    assert rows(
        db, "SELECT s.kind, r.run_id, r.status FROM runs r JOIN sources s USING (source_id)"
    ) == [("acme", "r1", "FINISHED")]
    assert dict(rows(db, "SELECT key, value FROM params")) == {
        "lr": "2e-05",
        "owner": "<e-mail removed>",  # redacted by the loader, not by the plug-in
    }
    code, out, _ = run_cli("--db", str(db), "ingest", "acme", str(runs))
    assert code == 0 and out.startswith("imported 0 new or changed runs, 1 unchanged"), out
    (runs / "r2.acme.json").write_text(json.dumps({"run": "r2", "started": 1e300}))
    code, out, err = run_cli("--db", str(db), "ingest", "acme", str(runs))
    assert code == 0, err
    assert "start_time" in err and "outside the years" in err  # the loader's bounds


def test_a_plugin_may_not_take_a_builtin_kind(tmp_path, monkeypatch, run_cli):
    project = tmp_path / "clash"
    shutil.copytree(EXAMPLE, project)
    pyproject = project / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text()
        .replace('name = "acme-audit-importer"', 'name = "clash-importer"')
        .replace("acme = ", "wandb = ")
    )
    monkeypatch.syspath_prepend(str(install(tmp_path, project)))
    importlib.invalidate_caches()
    code, _, err = run_cli("ingest", "wandb", "--help")
    assert code == 2
    assert (
        "importer plug-in 'wandb' (acme_audit_importer:AcmeSource): the kind 'wandb' is taken"
        in err
    )


def test_the_writing_an_importer_page_shows_the_example_verbatim():
    page = (REPO / "docs" / "writing-an-importer.md").read_text(encoding="utf-8")
    blocks = [m.group(1) for m in re.finditer(r"```\w*\n(.*?)```", page, flags=re.S)]
    for name in ("pyproject.toml", "acme_audit_importer.py"):
        assert (EXAMPLE / name).read_text(encoding="utf-8") in blocks, name

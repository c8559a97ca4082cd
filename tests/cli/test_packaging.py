"""A non-editable install of the built wheel gives a working ``audit``."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from tests.helpers import REPO


@pytest.mark.slow
def test_wheel_installs_and_runs_the_demo_import(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(REPO),
        ],
        check=True,
    )
    (wheel,) = dist.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "audit/rules/__init__.py" in names
    assert any(n.startswith("audit/templates/") for n in names)
    assert not any(n.startswith(("rules/", "tests/")) for n in names)
    sources = {f"audit/{p.relative_to(REPO / 'audit')}" for p in (REPO / "audit").rglob("*.py")}
    assert sources <= set(names), f"modules missing from the wheel: {sorted(sources - set(names))}"
    # the MIT licence text travels with the wheel (PEP 639 license-files)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", str(wheel)], check=True)
    audit = str(venv / "bin" / "audit")
    version = subprocess.run(
        [audit, "--version"], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert version.stdout.strip() == "audit, version 0.1.0"
    db = tmp_path / "demo.duckdb"
    result = subprocess.run(
        [
            audit,
            "--db",
            str(db),
            "ingest",
            "mlflow",
            "--tracking-uri",
            str(REPO / "sample_logs" / "mlruns"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("imported 20 new or changed runs (0 unchanged)")
    status = subprocess.run(
        [audit, "--db", str(db), "status"], capture_output=True, text=True, cwd=tmp_path
    )
    assert "runs 20 (1 deleted)" in status.stdout

"""docs/writing-a-rule.md shows the plug-in in tests/plugin_example, verbatim,
and that plug-in works: installed through its entry point it is listed, explained, run by
`audit scan` as a family of its own, and its cases pass with ``audit.testing``."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from tests.helpers import REPO

EXAMPLE = REPO / "tests" / "plugin_example"
FILES = [
    "pyproject.toml",
    "acme_audit_rules/__init__.py",
    "tests/cases/FLR001.yml",
    "tests/test_acme_cases.py",
]


def page_blocks() -> list[str]:
    """The fenced code blocks of docs/writing-a-rule.md."""
    text = (REPO / "docs" / "writing-a-rule.md").read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(r"```\w*\n(.*?)```", text, flags=re.S)]


@pytest.mark.parametrize("name", FILES)
def test_the_docs_show_the_example_plugin_verbatim(name):
    assert (EXAMPLE / name).read_text(encoding="utf-8") in page_blocks(), (
        f"docs/writing-a-rule.md no longer shows tests/plugin_example/{name} as it is"
    )


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("acme_install", EXAMPLE / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(EXAMPLE))


def test_the_example_plugin_runs_as_a_family_of_its_own(plugin, run_cli, tmp_path):
    from audit.testing import build_warehouse

    code, out, _ = run_cli("rules", "list")
    assert code == 0 and re.search(r"^FLR001\s+failed-run-cost\s+medium\s", out, re.M)
    code, out, _ = run_cli("rules", "explain", "FLR001")
    assert code == 0 and "  min_hours = default 1 h (≥ 0)" in out
    db = tmp_path / "w.duckdb"
    wh, _ = build_warehouse(
        db,
        {
            "runs": [
                {
                    "run_id": "a",
                    "name": "sft-big",
                    "status": "FAILED",
                    "end": 6,
                    "params": {"num_gpus": 8},
                }
            ]
        },
    )
    wh.close()
    code, out, err = run_cli("--db", str(db), "scan", "--select", "FLR", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert [f["waste"]["gpu_hours"] for f in doc["findings"]] == [48.0]
    families = {f["family"]: f for f in doc["summary"]["families"]}
    assert families["FLR"]["label"] == "failed runs" and families["FLR"]["findings"] == 1

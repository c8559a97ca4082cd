"""Every rule against its small data cases (tests/cases/<CODE>.yml): expected findings or none."""

from __future__ import annotations

import pytest

from audit.rule_registry import get_rule
from audit.scans import run_rules
from audit.windows import Window
from tests.rule_cases import at, build_warehouse, load_case_files

CASES = load_case_files()


@pytest.mark.parametrize(
    ("code", "case"), CASES, ids=[f"{code}-{case['name']}" for code, case in CASES]
)
def test_rule_case(code, case, tmp_path):
    wh, config = build_warehouse(
        tmp_path / "w.duckdb", case.get("data", {}), case.get("config", "")
    )
    try:
        window = case.get("window", {})
        (result,) = run_rules(
            wh.con,
            config,
            [get_rule(code)],
            Window(at(window.get("since")), at(window.get("until"))),
        )
    finally:
        wh.close()
    assert result.status == case.get("status", "ok"), result.reason
    if "reason" in case:
        assert case["reason"] in result.reason
    expected = case.get("expect", [])
    got = sorted(result.findings, key=lambda f: str(sorted(f.subject.items())))
    assert len(got) == len(expected), [f.message for f in got]
    for finding, want in zip(
        got, sorted(expected, key=lambda e: str(sorted(e["subject"].items()))), strict=True
    ):
        for key, value in want["subject"].items():
            assert str(finding.subject.get(key)) == str(value), (finding.subject, want)
        if "severity" in want:
            assert finding.severity.label == want["severity"]
        for field in ("gpu_hours", "usd", "run_hours"):
            if field in want and want[field] is None:
                assert getattr(finding, field) is None, finding.evidence
            elif field in want:
                assert getattr(finding, field) == pytest.approx(want[field], abs=0.01), (
                    finding.evidence
                )
        for key, value in want.get("evidence", {}).items():
            assert finding.evidence.get(key) == value, finding.evidence
        if "cost_basis_has" in want:
            assert want["cost_basis_has"] in (finding.cost_basis or ""), finding.cost_basis
        for field in ("team", "method"):
            if field in want:
                assert getattr(finding, field) == want[field], (field, getattr(finding, field))
        if "gb" in want:
            assert finding.bytes / 1e9 == pytest.approx(want["gb"], abs=0.001)
        for text in want.get("message_has", []):
            assert text in finding.message
        assert "formula" in finding.evidence
    for note in case.get("notes", []):
        assert any(note in n for n in result.notes), result.notes

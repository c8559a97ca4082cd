"""Every rule against its small data cases (tests/cases/<CODE>.yml): expected findings or none.

The builder and checker are ``audit.testing``, the same ones plug-in authors use.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.rule_registry import all_rules
from audit.testing import case_id, check_case, load_cases

CASES_DIR = Path(__file__).parents[1] / "cases"
CASES = load_cases(CASES_DIR)
BUILT_IN = [r for r in all_rules().values() if r.__module__.startswith("audit.rules.")]


@pytest.mark.parametrize(("code", "case"), CASES, ids=[case_id(*c) for c in CASES])
def test_rule_case(code, case, tmp_path):
    check_case(code, case, tmp_path)


@pytest.mark.parametrize("rule", BUILT_IN, ids=[r.code for r in BUILT_IN])
def test_every_rule_has_a_case_file_that_fires_and_stays_silent(rule):
    path = CASES_DIR / f"{rule.code}.yml"
    assert path.exists(), f"rule {rule.code} has no case file {path.relative_to(CASES_DIR.parent)}"
    mine = [case for code, case in CASES if code == rule.code]
    assert any(case.get("expect") for case in mine), f"no case of {rule.code} expects a finding"
    assert any(not case.get("expect") and case.get("status", "ok") == "ok" for case in mine), (
        f"no case of {rule.code} expects silence on data it can judge"
    )

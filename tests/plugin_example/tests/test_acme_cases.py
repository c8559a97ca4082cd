from pathlib import Path

import pytest

from audit.testing import case_id, check_case, load_cases

CASES = load_cases(Path(__file__).parent / "cases")


@pytest.mark.parametrize(("code", "case"), CASES, ids=[case_id(*c) for c in CASES])
def test_rule_case(code, case, tmp_path):
    check_case(code, case, tmp_path)

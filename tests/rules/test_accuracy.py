"""The accuracy suite's reduced form: on every real data set, no finding an expert said
must not appear (a false positive), no expected finding missed unless marked a known miss
(and no known miss met unnoticed). ``make accuracy`` prints precision and recall."""

from __future__ import annotations

import pytest

from tests.accuracy.harness import load_verdicts, run_dataset
from tests.helpers import SHARED

pytestmark = pytest.mark.skipif(
    not SHARED.exists(), reason="../shared/realdata is absent (real files from other projects)"
)


@pytest.mark.parametrize("spec", load_verdicts(), ids=lambda s: s["name"])
def test_verdicts_on_real_data(spec, tmp_path):
    result = run_dataset(spec, SHARED, tmp_path)
    assert result.error is None, result.error
    problems = []
    for outcome in result.outcomes:
        if not outcome.failed:
            continue
        v = outcome.verdict
        if outcome.kind == "must_not":
            shown = "; ".join(f"{f['rule']}: {f['message']}" for f in outcome.matches[:3])
            problems.append(f"false positive {v['id']} ({v['why']}): {shown}")
        elif v.get("known_miss"):
            problems.append(f"{v['id']} is met now: remove its known_miss mark")
        else:
            problems.append(f"missed {v['id']}: {v['why']}")
    assert not problems, "\n".join(problems)

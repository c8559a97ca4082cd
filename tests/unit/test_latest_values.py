"""``latest_values``: runs' latest metric values read as a column per name or as lists per
run (beyond ``PIVOTED_NAMES``), against the values as written, over random rows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.warehouse import latest
from tests.helpers import rolled_back

RUNS = [("s1", "r1"), ("s1", "r2"), ("s2", "r1")]  # run ids repeat across sources
NAMES = ["eval/general/mmlu", "eval/general/gsm8k", "eval/target/win", "loss", "eval/ü'x"]
VALUES = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0]),
)
_ROWS = st.dictionaries(
    st.tuples(st.sampled_from(RUNS), st.sampled_from(NAMES)), VALUES, max_size=15
)


def _shown(values: dict[tuple, dict[str, float]]) -> list:
    """Comparable form: NaN equals NaN, -0.0 differs from 0.0, name order kept."""
    return sorted(
        (run, [(name, repr(v)) for name, v in by_name.items()]) for run, by_name in values.items()
    )


@settings(max_examples=150, deadline=None)
@given(rows=_ROWS, pivoted=st.sampled_from([0, 1, 2, 32]), general_only=st.booleans())
def test_latest_values_are_the_rows_values_whatever_the_reading(
    schema_warehouse, rows, pivoted, general_only
):
    condition, params = ("key GLOB ?", ["eval/general/*"]) if general_only else ("TRUE", [])
    expected: dict[tuple, dict[str, float]] = {}
    for (run, name), value in sorted(rows.items(), key=lambda item: item[0][1]):
        if value is not None and (not general_only or name.startswith("eval/general/")):
            expected.setdefault(("key", *run), {})[name] = value

    with rolled_back(schema_warehouse.con) as con, pytest.MonkeyPatch.context() as patch:
        if rows:
            con.executemany(
                "INSERT INTO latest_metrics (source_id, run_id, key, value, step) "
                "VALUES (?, ?, ?, ?, 0)",
                [(source, run, name, value) for ((source, run), name), value in rows.items()],
            )
        patch.setattr(latest, "PIVOTED_NAMES", pivoted)
        got = latest.latest_values(con, condition, params, lambda source, run: ("key", source, run))

    assert _shown(got) == _shown(expected)

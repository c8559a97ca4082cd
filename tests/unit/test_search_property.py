"""Property: a filter answers the same whether DuckDB or the bulk evaluator runs it.

Small filters compile to one SQL condition; large ones (issue 13, case 8) are evaluated
in bulk over each run's field values. Random filter trees over a warehouse of awkward
values (numeric spellings, booleans, NaN and infinities, missing keys, empty strings,
non-ASCII letters whose case folding differs, LIKE wildcards, runs with two datasets or
none) must give the same runs, or the same error, both ways; on the long tables and on
the wide search table.
"""

from __future__ import annotations

import math
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import audit.query.search as search_module
from audit import Registry
from audit.errors import InputError
from audit.importers.search_index import rebuild_search_tables
from audit.testing import build_warehouse
from tests.helpers import property_examples

NAN, INF = math.nan, math.inf
RUNS = [
    # run id, status, start hour, end hour, params, tags, metric points, datasets
    (
        "r01",
        "FINISHED",
        0,
        1,
        {"lr": "1e-5", "bf16": "True", "note": "é"},
        {"team": "coder"},
        [0.3, 0.7],
        ["code", "math"],
    ),
    (
        "r02",
        "FINISHED",
        2,
        3,
        {"lr": "0.00001", "bf16": "true", "note": ""},
        {"team": "Coder"},
        [0.7],
        ["code"],
    ),
    (
        "r03",
        "FAILED",
        4,
        None,
        {"lr": "2E-5", "bf16": "1", "note": "İ"},
        {"team": "agents"},
        [NAN],
        [],
    ),
    ("r04", "FINISHED", 6, 7, {"lr": "abc", "note": "i"}, {"team": "nan"}, [INF, 0.1], ["İnfo"]),
    (
        "r05",
        "KILLED",
        8,
        9,
        {"lr": " 3 ", "bf16": "FALSE", "note": "ß"},
        {"team": "5"},
        [-1.5],
        ["info"],
    ),
    ("r06", "FINISHED", 10, 11, {"lr": "nan", "note": "%_"}, {"team": "10"}, [], ["c%d"]),
    ("r07", "RUNNING", 12, None, {"bf16": "false", "note": "it's"}, {}, [0.5, NAN, 0.6], ["code"]),
    (
        "r08",
        "FINISHED",
        14,
        15,
        {"lr": "1e-5", "note": "ss"},
        {"team": "é"},
        [0.3],
        ["math", "math"],
    ),
    ("r09", "FINISHED", 16, 17, {"lr": "-1", "bf16": "0"}, {"team": " coder"}, [-INF], []),
    ("r10", "FAILED", 18, 19, {"lr": "5", "note": "I"}, {"team": "coder%"}, [5.0, 1e-5], ["a_b"]),
]
FIELDS = [
    "params.lr",
    "params.bf16",
    "params.note",
    "params.missing",
    "tags.team",
    "tags.missing",
    "metrics.acc",
    "max(metrics.acc)",
    "min(metrics.acc)",
    "avg(metrics.acc)",
    "first(metrics.acc)",
    "attributes.status",
    "attributes.start_time",
    "attributes.end_time",
    "attributes.run_name",
    "datasets.name",
    "datasets.digest",
]
STRINGS = [
    "'coder'",
    "'Coder'",
    "'1e-5'",
    "'0.00001'",
    "'abc'",
    "'é'",
    "'İ'",
    "'i'",
    "'ß'",
    "'nan'",
    "'%'",
    "'_'",
    "'c%'",
    "'%e%'",
    "''",
    "'it''s'",
    "'true'",
    "'FINISHED'",
    "'r0%'",
    "'%o%'",
    "'5'",
    "'10'",
]
NUMBERS = ["0", "1e-5", "0.5", "-1", "5", "10", "1794787200000", "1794830400000", "0.3"]
VALUE = st.sampled_from(STRINGS + NUMBERS)


def _comparison(field: str, operator: str, values: list[str]) -> str:
    if operator in ("IS NULL", "IS NOT NULL"):
        return f"{field} {operator}"
    if operator in ("IN", "NOT IN"):
        return f"{field} {operator} ({', '.join(values)})"
    if operator in ("BETWEEN", "NOT BETWEEN"):
        return f"{field} {operator} {values[0]} AND {values[1]}"
    return f"{field} {operator} {values[0]}"


LEAF = st.builds(
    _comparison,
    st.sampled_from(FIELDS),
    st.sampled_from(
        [
            "=",
            "!=",
            "<",
            "<=",
            ">",
            ">=",
            "IN",
            "NOT IN",
            "LIKE",
            "ILIKE",
            "NOT LIKE",
            "BETWEEN",
            "NOT BETWEEN",
            "IS NULL",
            "IS NOT NULL",
        ]
    ),
    st.lists(VALUE, min_size=2, max_size=4),
)
FILTER = st.recursive(
    LEAF,
    lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=4).map(lambda xs: "(" + " and ".join(xs) + ")"),
        st.lists(inner, min_size=2, max_size=4).map(lambda xs: "(" + " or ".join(xs) + ")"),
        inner.map(lambda x: f"not ({x})"),
    ),
    max_leaves=10,
)


@pytest.fixture(scope="module", params=["long tables", "wide table"])
def awkward_runs_db(request, tmp_path_factory):
    data = {"runs": []}
    for run_id, status, start, end, params, tags, points, datasets in RUNS:
        data["runs"].append(
            {
                "run_id": run_id,
                "name": f"{run_id}-{status.lower()}",
                "status": status,
                "start": start,
                "end": end,
                "params": params,
                "tags": tags,
                "metrics": {"acc": [(step, start, v) for step, v in enumerate(points)]}
                if points
                else {},
                "datasets": [{"name": n, "digest": f"d-{n}"} for n in datasets],
            }
        )
    folder = tmp_path_factory.mktemp("search-property")
    wh, _ = build_warehouse(folder / "w.duckdb", data)
    if request.param == "wide table":
        rebuild_search_tables(wh.con)
    wh.close()
    yield folder / "w.duckdb"
    shutil.rmtree(folder, ignore_errors=True)


def _answer(db, text: str, bulk: bool, monkeypatch) -> tuple:
    monkeypatch.setattr(search_module, "SQL_LEAVES", -1 if bulk else 10**9)
    registry = Registry(db)
    try:
        found = registry.search(text, limit=None, include_deleted=True)
        return ("runs", sorted(found["run_id"].to_list()))
    except InputError as exc:
        return ("error", str(exc))
    finally:
        registry.close()


@settings(
    max_examples=property_examples(replay=60, explore=600),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=FILTER)
def test_bulk_and_sql_evaluation_agree(awkward_runs_db, text, monkeypatch):
    assert _answer(awkward_runs_db, text, True, monkeypatch) == _answer(
        awkward_runs_db, text, False, monkeypatch
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("params.lr = '1e-05'", ["r01", "r02", "r08"]),
        ("params.lr < 0", ["r09"]),
        ("params.lr != '1e-5'", ["r03", "r04", "r05", "r06", "r09", "r10"]),
        ("metrics.acc > 0.5", ["r01", "r02", "r07"]),  # the latest value; NaN never
        ("metrics.acc is null", ["r03", "r06"]),
        ("max(metrics.acc) >= 0.6", ["r01", "r02", "r04", "r07", "r10"]),  # inf counts
        ("tags.team > 6", ["r04", "r06"]),  # 'nan' sorts above numbers, as in DuckDB
        ("datasets.name = 'math'", ["r01", "r08"]),
        ("datasets.name ILIKE 'i%'", ["r04", "r05"]),
        ("not datasets.name like '%'", ["r03", "r09"]),
        ("attributes.end_time is null", ["r03", "r07"]),
        ("params.note ilike 'i'", ["r03", "r04", "r10"]),
        # 'abc' and 'nan' have no number: the comparison is false, so its negation holds
        ("not params.lr < 0", ["r01", "r02", "r03", "r04", "r05", "r06", "r07", "r08", "r10"]),
    ],
)
@pytest.mark.parametrize("bulk", [False, True], ids=["sql", "bulk"])
def test_known_answers(awkward_runs_db, text, expected, bulk, monkeypatch):
    assert _answer(awkward_runs_db, text, bulk, monkeypatch) == ("runs", expected)

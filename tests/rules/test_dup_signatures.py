"""DUP001's signature query, which builds signature texts only for runs whose param-set
hash another run shares, against signatures built for every run, over random params
(keys and values that join into one text in different ways included)."""

from __future__ import annotations

from audit.rules.dup001_duplicate_config import SIGNATURES_SQL
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import rolled_back

KEYS = ["a", "b", "a=b", "a\x1fb", "lr", "seed"]
VALUES = [None, "", "c", "b=c", "c\x1fb=c", "1", "0.1"]
_RUNS = st.lists(
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3),
    min_size=1,
    max_size=7,
)


def _write(con, runs: list[dict[str, str | None]]) -> None:
    for number, params in enumerate(runs):
        con.execute(
            "INSERT INTO runs (source_id, run_id, source_commit) VALUES ('s', ?, 'abc')",
            [f"r{number}"],
        )
        for key, value in params.items():
            con.execute(
                "INSERT INTO params (source_id, run_id, key, value_norm) VALUES ('s', ?, ?, ?)",
                [f"r{number}", key, value],
            )


def _expected(runs: list[dict[str, str | None]], volatile: list[str]) -> list[tuple]:
    """Every run whose signature (its kept params as ``key=value`` in key order, joined by
    chr(31)) another run has too."""
    signatures = {}
    for number, params in enumerate(runs):
        kept = sorted((k, v or "") for k, v in params.items() if k not in volatile)
        if kept:
            signatures[f"r{number}"] = "\x1f".join(f"{k}={v}" for k, v in kept)
    shared = [text for text in signatures.values() if list(signatures.values()).count(text) > 1]
    return sorted(
        ("s", run_id, text, "abc", "") for run_id, text in signatures.items() if text in shared
    )


@settings(max_examples=300, deadline=None)
@given(runs=_RUNS, volatile=st.lists(st.sampled_from(KEYS), max_size=2))
def test_signatures_are_those_of_every_run_compared(schema_warehouse, runs, volatile):
    with rolled_back(schema_warehouse.con) as con:
        _write(con, runs)
        got = con.execute(SIGNATURES_SQL, {"volatile": volatile, "ignore_tag": "audit.ignore"})
        assert sorted(got.fetchall()) == _expected(runs, volatile)


def test_pairs_joined_into_one_text_are_one_signature(schema_warehouse):
    runs = [{"a=b": "c"}, {"a": "b=c"}]  # both "a=b=c"
    with rolled_back(schema_warehouse.con) as con:
        _write(con, runs)
        got = con.execute(SIGNATURES_SQL, {"volatile": [], "ignore_tag": "audit.ignore"})
        assert sorted(got.fetchall()) == _expected(runs, []) != []

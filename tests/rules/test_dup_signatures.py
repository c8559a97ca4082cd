"""DUP001's signature query, which builds signature texts only for runs whose param-set
hash another run shares, against signatures built for every run, over random params
(keys and values that join into one text in different ways included)."""

from __future__ import annotations

import duckdb
from audit.rules.dup001_duplicate_config import SIGNATURES_SQL
from hypothesis import given, settings
from hypothesis import strategies as st

KEYS = ["a", "b", "a=b", "a\x1fb", "lr", "seed"]
VALUES = [None, "", "c", "b=c", "c\x1fb=c", "1", "0.1"]
_RUNS = st.lists(
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3),
    min_size=1,
    max_size=7,
)


def _database(runs: list[dict[str, str | None]]):
    con = duckdb.connect()
    con.execute("CREATE TABLE runs (source_id VARCHAR, run_id VARCHAR, source_commit VARCHAR)")
    con.execute(
        "CREATE TABLE params (source_id VARCHAR, run_id VARCHAR, key VARCHAR, value_norm VARCHAR)"
    )
    con.execute(
        "CREATE TABLE dataset_inputs (source_id VARCHAR, run_id VARCHAR, digest VARCHAR, "
        "context VARCHAR)"
    )
    con.execute("CREATE TABLE tags (source_id VARCHAR, run_id VARCHAR, key VARCHAR, value VARCHAR)")
    for number, params in enumerate(runs):
        con.execute("INSERT INTO runs VALUES ('s', ?, 'abc')", [f"r{number}"])
        for key, value in params.items():
            con.execute("INSERT INTO params VALUES ('s', ?, ?, ?)", [f"r{number}", key, value])
    return con


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
def test_signatures_are_those_of_every_run_compared(runs, volatile):
    con = _database(runs)
    got = con.execute(SIGNATURES_SQL, {"volatile": volatile, "ignore_tag": "audit.ignore"})
    assert sorted(got.fetchall()) == _expected(runs, volatile)


def test_pairs_joined_into_one_text_are_one_signature():
    runs = [{"a=b": "c"}, {"a": "b=c"}]  # both "a=b=c"
    con = _database(runs)
    got = con.execute(SIGNATURES_SQL, {"volatile": [], "ignore_tag": "audit.ignore"})
    assert sorted(got.fetchall()) == _expected(runs, []) != []

"""A scan drops each shared computation after its last reader (``Rule.reads_shared``).

Dropping can only cost time (a later reader computes it again), never change a finding;
these tests hold the declarations to what the rules read and the drops to their order.
"""

from __future__ import annotations

import duckdb
import pytest

from audit.config import load_config
from audit.rule_api import Rule, RuleContext, Severity
from audit.rule_registry import all_rules
from audit.scans import run_rules
from audit.warehouse import open_warehouse
from audit.windows import Window

ALL_HISTORY = Window(None, None)


class _Recording(dict):
    """A shared dict that records the names of the computations looked up in it."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __contains__(self, key):
        self.names.add(key[0])
        return super().__contains__(key)

    def __getitem__(self, key):
        self.names.add(key[0])
        return super().__getitem__(key)


@pytest.fixture(scope="module")
def demo_warehouse_and_config(demo_db):
    wh = open_warehouse(demo_db["db"], read_only=True)
    yield wh, load_config(demo_db["config"])
    wh.close()


@pytest.mark.parametrize("code", sorted(all_rules()))
def test_a_rule_declares_exactly_the_shared_computations_it_reads(demo_warehouse_and_config, code):
    """Run alone on the sample week, with nothing computed yet, a rule reads its own and
    its helpers' shared computations: a name it reads but does not declare would be
    dropped before it runs; a name it declares but never reads would be held for nothing."""
    wh, config = demo_warehouse_and_config
    rule = all_rules()[code]
    shared = _Recording()
    (result,) = run_rules(wh.con, config, [rule], ALL_HISTORY, shared)
    assert result.status == "ok", result.reason
    assert shared.names == rule.reads_shared


def test_a_scan_that_keeps_only_the_facts_finds_the_same(demo_warehouse_and_config):
    wh, config = demo_warehouse_and_config
    rules = list(all_rules().values())
    holding = run_rules(wh.con, config, rules, ALL_HISTORY, {})
    shared: dict = {}
    dropping = run_rules(wh.con, config, rules, ALL_HISTORY, shared, keep=frozenset({"facts"}))
    assert [(r.rule, r.status, r.notes) for r in dropping] == [
        (r.rule, r.status, r.notes) for r in holding
    ]
    assert [[f.as_json() for f in r.findings] for r in dropping] == [
        [f.as_json() for f in r.findings] for r in holding
    ]
    assert sum(len(r.findings) for r in holding) > 0
    assert {key[0] for key in shared} == {"facts"}


def _reader(code: str, names: frozenset[str], reads: list[str], log: list):
    """A rule that reads ``reads`` through ``ctx.once`` and logs what was held before."""

    class Reader(Rule):
        name = "reader"
        severity = Severity.LOW
        family_label = "test"
        reads_shared = names

        def check(self, ctx: RuleContext):
            log.append((self.code, sorted(key[0] for key in ctx.shared)))
            for name in reads:
                ctx.once((name,), lambda name=name: log.append((self.code, "computed " + name)))
            return []

    Reader.code = code
    return Reader


def test_a_computation_is_held_until_its_last_reader_has_run():
    log: list = []
    rules = [
        _reader("TST001", frozenset({"x", "y"}), ["x", "y"], log),
        _reader("TST002", frozenset({"y"}), ["y"], log),
        _reader("TST003", frozenset({"x"}), ["x"], log),
        _reader("TST004", frozenset(), [], log),
    ]
    shared: dict = {}
    con = duckdb.connect()
    run_rules(con, load_config(None), rules, ALL_HISTORY, shared, keep=frozenset({"kept"}))
    assert log == [
        ("TST001", []),
        ("TST001", "computed x"),
        ("TST001", "computed y"),
        ("TST002", ["x", "y"]),
        ("TST003", ["x"]),  # y's last reader has run
        ("TST004", []),
    ]
    assert shared == {}


def test_an_undeclared_read_computes_again_and_nothing_is_kept_without_keep():
    log: list = []
    rules = [
        _reader("TST001", frozenset({"x"}), ["x"], log),
        _reader("TST002", frozenset(), ["x"], log),  # reads x without declaring it
    ]
    con = duckdb.connect()
    dropping: dict = {}
    run_rules(con, load_config(None), rules, ALL_HISTORY, dropping, keep=frozenset())
    assert [entry for entry in log if "computed" in entry[1]] == [
        ("TST001", "computed x"),
        ("TST002", "computed x"),
    ]
    log.clear()
    holding: dict = {}
    run_rules(con, load_config(None), rules, ALL_HISTORY, holding)
    assert [entry for entry in log if "computed" in entry[1]] == [("TST001", "computed x")]
    assert list(holding) == [("x",)]

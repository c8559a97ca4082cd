"""Running a scan: the rules over a window, suppressions, storing, reusing and loading it."""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property, partial
from typing import Any

import polars as pl

from audit import interrupts
from audit.config import Config
from audit.costs import shared_facts
from audit.materiality import apply_materiality
from audit.rule_api import FINDING_COLUMNS, Finding, Rule, RuleContext, Skip
from audit.rule_registry import all_rules, effective_thresholds
from audit.suppressions import Suppressions
from audit.warehouse.allocator import return_freed_memory, return_freed_memory_if_grown
from audit.warehouse.alongside import alongside
from audit.windows import Window, now_utc


@dataclass
class RuleResult:
    rule: str
    status: str  # ok | skipped | error
    reason: str = ""
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class ScanResult:
    scan_id: int
    started_at: datetime
    config_hash: str
    window: Window
    results: list[RuleResult]

    @property
    def since(self) -> datetime | None:
        return self.window.since

    @property
    def until(self) -> datetime | None:
        return self.window.until

    @cached_property
    def findings(self) -> list[Finding]:
        """Every finding, most costly first; sorted once (a scan reads them several times:
        the summary, the document, ``--fail-on``; 0.2 s a time at 8,000 findings)."""
        return sorted(
            (f for r in self.results for f in r.findings),
            key=lambda f: (
                -int(f.severity),
                -(f.usd or 0.0),
                -f.bytes,
                -(f.run_hours or 0.0),
                f.rule,
                json.dumps(f.subject, sort_keys=True, default=str),
            ),
        )

    @property
    def active(self) -> list[Finding]:
        return [f for f in self.findings if not f.suppressed]

    @property
    def listed(self) -> list[Finding]:
        """The active findings at or above their materiality floor (``audit.materiality``):
        what tables and reports list one by one."""
        return [f for f in self.findings if not f.suppressed and f.material]


def run_rules(
    con,
    config: Config,
    rules: list[type[Rule]],
    window: Window,
    shared: dict | None = None,
    keep: frozenset[str] | None = None,
) -> list[RuleResult]:
    """Every rule over the window; ``shared`` carries facts computed once (cost, usage).

    With ``keep`` (the shared names the caller reads afterwards), each shared computation
    is dropped after the last rule that reads it: a scan then holds at most the facts its
    remaining rules need. Without it, everything stays for the caller's next scan (a
    report scans several weeks with the same facts).

    The rules that run ``alone`` (their work is DuckDB queries: see ``Rule.alone``) run on
    a second thread and connection, alongside the others.
    """
    shared = {} if shared is None else shared
    results: dict[str, RuleResult] = {}
    # whether a table has rows, asked by every rule's ``needs``: once per table and scan
    # (22 rules ask for about ten tables; a report scans eight weeks)
    has_rows: dict[str, bool] = {}
    alone = [rule for rule in rules if rule.alone] if len(rules) > 1 else []
    if alone and any("facts" in rule.reads_shared for rule in rules if rule not in alone):
        # Loading the facts holds a gigabyte of DuckDB, Arrow and polars memory for a moment
        # at a million jobs, and freed pages are not given back while a query may run on
        # the second thread: loaded first, they are given back before its queries start
        # (the XL scan's peak: 1.89 -> 1.3 GiB).
        shared_facts(con, config, shared)
        return_freed_memory(con)
    with alongside(con) as second:
        running = {
            rule.code: second.submit(partial(_run_rule, rule, config=config, window=window))
            for rule in alone
        }
        for index, rule_class in enumerate(rules):
            if rule_class in alone:
                continue
            if index:
                if keep is not None:
                    _drop_unread(shared, rules[index:], keep)
                return_freed_memory_if_grown(con)
            results[rule_class.code] = _run_rule(rule_class, con, config, window, shared, has_rows)
    results.update((code, future.result()) for code, future in running.items())  # all done
    if keep is not None:
        _drop_unread(shared, [], keep)
    return_freed_memory(con)
    return [results[rule.code] for rule in rules]


def _run_rule(
    rule_class: type[Rule],
    con,
    config: Config,
    window: Window,
    shared: dict | None = None,
    has_rows: dict[str, bool] | None = None,
) -> RuleResult:
    started = time.monotonic()
    thresholds = effective_thresholds(rule_class, config)
    ctx = RuleContext(
        con=con,
        config=config,
        thresholds=thresholds,
        window=window,
        shared={} if shared is None else shared,
    )
    has_rows = {} if has_rows is None else has_rows
    missing = [
        why for table, why in rule_class.needs.items() if not _has_rows(con, table, has_rows)
    ]
    if missing:
        return RuleResult(rule_class.code, "skipped", "; ".join(missing))
    try:
        findings = list(rule_class().check(ctx))
        result = RuleResult(rule_class.code, "ok", findings=findings, notes=ctx.notes)
    except Skip as exc:
        result = RuleResult(rule_class.code, "skipped", str(exc), notes=ctx.notes)
    except Exception as exc:  # one broken rule must not stop the scan
        if interrupts.requested():  # Ctrl-C, wrapped by DuckDB or polars: not the rule's error
            raise KeyboardInterrupt from exc
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result = RuleResult(
            rule_class.code,
            "error",
            f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})",
        )
    result.seconds = time.monotonic() - started
    return result


def _drop_unread(shared: dict, later: list[type[Rule]], keep: frozenset[str]) -> None:
    """Drop the shared computations no rule of ``later`` reads and the caller does not keep
    (keys are tuples that start with the computation's name)."""
    read = keep.union(*(rule.reads_shared for rule in later))
    for key in [key for key in shared if key[0] not in read]:
        del shared[key]


def _has_rows(con, table: str, known: dict[str, bool]) -> bool:
    if table not in known:
        known[table] = bool(con.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchall()[0][0])
    return known[table]


def apply_suppressions(con, config: Config, results: list[RuleResult]) -> None:
    """Config [[suppress]] entries and run tags ``audit.ignore=CODE[,CODE]`` mute findings."""
    suppressions = Suppressions.load(con, config)
    for result in results:
        for f in result.findings:
            reason = suppressions.reason(f.rule, f.family, f.subject)
            if reason:
                f.suppressed, f.suppressed_reason = True, reason


def selection(rules: list[type[Rule]]) -> str:
    return ",".join(r.code for r in rules)


def scan(
    wh,
    config: Config,
    rules: list[type[Rule]],
    window: Window,
    shared: dict | None = None,
    keep: frozenset[str] | None = None,
) -> ScanResult:
    """Run the rules and store the scan with its findings and per-rule results (``keep``:
    see ``run_rules``)."""
    started_at = now_utc()
    results = run_rules(wh.con, config, rules, window, shared, keep)
    apply_suppressions(wh.con, config, results)
    apply_materiality(config, results, {rule.code: rule for rule in rules})
    with wh.transaction() as con:
        scan_id = con.execute("SELECT coalesce(max(scan_id), 0) + 1 FROM scans").fetchall()[0][0]
        con.execute(
            "INSERT INTO scans VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                scan_id,
                started_at,
                now_utc(),
                config.digest,
                window.since,
                window.until,
                selection(rules),
            ],
        )
        rows = [f.to_row(scan_id) for r in results for f in r.findings]
        if rows:
            # one columnar insert: executemany costs ~1.5 ms per row (4 min for 150k findings)
            frame = pl.DataFrame(
                rows, schema=list(FINDING_COLUMNS), orient="row", infer_schema_length=None
            )
            con.register("incoming_findings", frame)
            try:
                columns = ", ".join(FINDING_COLUMNS)
                con.execute(
                    f"INSERT INTO findings ({columns}) SELECT {columns} FROM incoming_findings"
                )
            finally:
                con.unregister("incoming_findings")
        for r in results:
            con.execute(
                "INSERT INTO rule_results VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    scan_id,
                    r.rule,
                    r.status,
                    r.reason,
                    len(r.findings),
                    json.dumps(r.notes),
                    r.seconds,
                ],
            )
    return ScanResult(scan_id, started_at, config.digest, window, results)


# When the warehouse's data last changed: the last import, file import or prune. A stored
# scan or report made after it (and after its window closed) is what computing again gives.
LAST_CHANGE_SQL = """
    SELECT coalesce(max(t), TIMESTAMP '0001-01-01') FROM (
        SELECT max(finished_at) AS t FROM import_log
        UNION ALL SELECT max(imported_at) FROM file_imports
        UNION ALL SELECT max(applied_at) FROM prune_log)
"""


def complete_scan(wh, config: Config, window: Window, fresh: bool) -> int | None:
    """The latest stored scan of exactly ``window`` with every rule and this configuration.

    Ad-hoc scans (``--select``, another window, another configuration) are never reused.
    With ``fresh``, the scan must also have been made after the window closed and after the
    last import or prune, so it is what scanning again would give.
    """
    if not window.bounded:
        return None
    freshness = (
        f"AND started_at >= window_end AND started_at >= ({LAST_CHANGE_SQL})" if fresh else ""
    )
    rows = wh.con.execute(
        f"""
        SELECT max(scan_id) FROM scans
        WHERE window_start = ? AND window_end = ? AND config_hash = ? AND selection = ?
        {freshness}
        """,
        [window.since, window.until, config.digest, selection(list(all_rules().values()))],
    ).fetchall()
    return rows[0][0] if rows and rows[0][0] is not None else None


def load_scan(wh, scan_id: int) -> ScanResult:
    """A stored scan as the ScanResult that produced it."""
    started_at, config_hash, since, until = wh.con.execute(
        "SELECT started_at, config_hash, window_start, window_end FROM scans WHERE scan_id = ?",
        [scan_id],
    ).fetchall()[0]
    by_rule: dict[str, list[Finding]] = {}
    cursor = wh.con.execute(
        f"SELECT {', '.join(FINDING_COLUMNS)} FROM findings WHERE scan_id = ? ORDER BY finding_id",
        [scan_id],
    )
    for values in cursor.fetchall():
        row: dict[str, Any] = dict(zip(FINDING_COLUMNS, values, strict=True))
        by_rule.setdefault(row["rule"], []).append(Finding.from_row(row))
    results = [
        RuleResult(
            rule=rule,
            status=status,
            reason=reason or "",
            findings=by_rule.get(rule, []),
            notes=json.loads(notes) if notes else [],
            seconds=seconds or 0.0,
        )
        for rule, status, reason, notes, seconds in wh.con.execute(
            "SELECT rule, status, reason, notes, seconds FROM rule_results "
            "WHERE scan_id = ? ORDER BY rule",
            [scan_id],
        ).fetchall()
    ]
    return ScanResult(scan_id, started_at, config_hash, Window(since, until), results)


def stored_findings(wh, scan_id: int | None) -> list[Finding]:
    if scan_id is None:
        return []
    return [f for r in load_scan(wh, scan_id).results for f in r.findings]

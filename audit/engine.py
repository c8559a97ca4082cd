"""The rule engine: rule declarations, the registry, running a scan, storing findings.

A rule is a small class in ``rules/`` (shipped as ``audit.rules``): ``code``, kebab-case
``name``, default ``severity``, documented ``thresholds``, the tables it ``needs``, and a
docstring that is its user documentation. ``check(ctx)`` reads the warehouse through the
context and yields findings; it never writes. An exception inside one rule becomes an
``error`` result and the scan goes on; missing inputs become ``skipped`` with the reason.
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import inspect
import json
import pkgutil
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from importlib.metadata import entry_points
from typing import Any, ClassVar

import polars as pl

from audit.config import Config
from audit.errors import InputError

DOC_SECTIONS = (
    "What it detects",
    "Why it is waste",
    "Known false positives",
    "Example",
    "How to fix",
    "References",
)
ENTRY_POINT_GROUP = "audit.rules"


class Severity(enum.IntEnum):
    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            valid = ", ".join(s.label for s in cls)
            raise InputError(f"unknown severity {text!r}; valid: {valid}") from None

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Threshold:
    """A tunable number with its default, valid range and meaning."""

    default: float
    help: str
    minimum: float | None = None
    maximum: float | None = None
    unit: str = ""

    def validate(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(f"{where} must be a number, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise InputError(f"{where} must be ≥ {self.minimum}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise InputError(f"{where} must be ≤ {self.maximum}, got {value}")
        return value

    def describe(self) -> str:
        bounds = []
        if self.minimum is not None:
            bounds.append(f"≥ {self.minimum:g}")
        if self.maximum is not None:
            bounds.append(f"≤ {self.maximum:g}")
        unit = f" {self.unit}" if self.unit else ""
        return f"default {self.default:g}{unit}" + (f" ({', '.join(bounds)})" if bounds else "")


@dataclass
class Finding:
    rule: str
    name: str
    severity: Severity
    subject: dict[str, Any]
    message: str
    evidence: dict[str, Any]
    recommendation: str
    gpu_hours: float = 0.0
    usd: float = 0.0
    bytes: int = 0
    team: str | None = None
    method: str | None = None
    happened_at: datetime | None = None
    suppressed: bool = False
    suppressed_reason: str | None = None

    @property
    def id(self) -> str:
        key = json.dumps([self.rule, self.subject], sort_keys=True, default=str)
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "name": self.name,
            "severity": self.severity.label,
            "subject": self.subject,
            "message": self.message,
            "evidence": self.evidence,
            "waste": {
                "gpu_hours": round(self.gpu_hours, 3),
                "usd": round(self.usd, 2),
                "bytes": int(self.bytes),
            },
            "recommendation": self.recommendation,
            "team": self.team,
            "method": self.method,
            "suppressed": self.suppressed,
            "suppressed_reason": self.suppressed_reason,
        }


class Skip(Exception):
    """Raised by a rule that cannot judge at all; the message says which input is missing."""


class Rule:
    """Base class of every rule. Subclasses set the class attributes and ``check``."""

    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    thresholds: ClassVar[dict[str, Threshold]] = {}
    needs: ClassVar[dict[str, str]] = {}  # table -> what is missing when it is empty
    recommendation: ClassVar[str] = ""

    def check(self, ctx: RuleContext) -> Iterable[Finding]:
        raise NotImplementedError

    @classmethod
    def family(cls) -> str:
        return cls.code[:3]

    @classmethod
    def doc(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def summary(cls) -> str:
        return cls.doc().splitlines()[0] if cls.doc() else ""

    @classmethod
    def sections(cls) -> dict[str, str]:
        """The docstring split at ``Heading:`` lines that name a documentation section."""
        out: dict[str, list[str]] = {}
        current = None
        for line in cls.doc().splitlines()[1:]:
            heading = line.rstrip(":").strip()
            if line.endswith(":") and heading in DOC_SECTIONS:
                current = heading
                out[current] = []
            elif current:
                out[current].append(line)
        return {k: "\n".join(v).strip() for k, v in out.items()}

    def finding(
        self, ctx: RuleContext, subject: dict, message: str, evidence: dict, **waste: Any
    ) -> Finding:
        return Finding(
            rule=self.code,
            name=self.name,
            severity=waste.pop("severity", self.severity),
            subject=subject,
            message=message,
            evidence=evidence,
            recommendation=waste.pop("recommendation", self.recommendation),
            **waste,
        )


# -- registry ------------------------------------------------------------------------------
def _builtin_modules() -> list[str]:
    import audit.rules as package

    return sorted(
        m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")
    )


def all_rules() -> dict[str, type[Rule]]:
    """Every rule, built-in and from the ``audit.rules`` entry-point group, by code."""
    rules: dict[str, type[Rule]] = {}
    for module_name in _builtin_modules():
        module = importlib.import_module(f"audit.rules.{module_name}")
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Rule)
                and obj is not Rule
                and obj.__module__ == module.__name__
            ):
                rules[obj.code] = obj
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = entry.load()
        except Exception as exc:  # a broken plug-in must not take the built-in rules down
            raise InputError(
                f"rule plug-in {entry.name!r} ({entry.value}) failed to load: {exc}"
            ) from None
        if not (inspect.isclass(obj) and issubclass(obj, Rule)):
            raise InputError(f"rule plug-in {entry.name!r} is not an audit.engine.Rule subclass")
        rules[obj.code] = obj
    return dict(sorted(rules.items()))


def get_rule(code: str) -> type[Rule]:
    rules = all_rules()
    if code.upper() not in rules:
        raise InputError(f"unknown rule {code!r}; valid: {', '.join(rules)}")
    return rules[code.upper()]


def validate_rule_settings(code: str, settings: dict, where: str) -> dict[str, float]:
    rule = get_rule(code)
    out = {}
    for key, value in settings.items():
        if key not in rule.thresholds:
            valid = ", ".join(sorted(rule.thresholds)) or "none"
            raise InputError(f"{where}: unknown key '{key}' in [rules.{code}]; valid keys: {valid}")
        out[key] = rule.thresholds[key].validate(value, f"{where}: [rules.{code}] {key}")
    return out


def select_rules(select: str | None, ignore: str | None) -> list[type[Rule]]:
    """``--select``/``--ignore`` take codes or family prefixes (``OVP``), comma separated."""
    rules = all_rules()

    def parse(text: str | None) -> list[str]:
        items = [c.strip().upper() for c in (text or "").split(",") if c.strip()]
        for item in items:
            if not any(code.startswith(item) for code in rules):
                raise InputError(f"no rule matches {item!r}; valid codes: {', '.join(rules)}")
        return items

    chosen, dropped = parse(select), parse(ignore)
    return [
        rule
        for code, rule in rules.items()
        if (not chosen or any(code.startswith(c) for c in chosen))
        and not any(code.startswith(d) for d in dropped)
    ]


# -- running ------------------------------------------------------------------------------
@dataclass
class RuleContext:
    """What a rule sees: read-only queries, its thresholds, prices and the scan window."""

    con: Any
    config: Config
    thresholds: dict[str, float]
    since: datetime | None
    until: datetime | None
    notes: list[str] = field(default_factory=list)
    # facts several rules derive the same way (jobs with their GPU usage), computed once
    # per scan; keyed by the helper and its arguments
    shared: dict[tuple, Any] = field(default_factory=dict)

    def once(self, key: tuple, compute):
        if key not in self.shared:
            self.shared[key] = compute()
        return self.shared[key]

    def rows(self, sql: str, params: list | None = None) -> list[dict[str, Any]]:
        cursor = self.con.execute(sql, params or [])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def skip(self, note: str) -> None:
        """Record that one subject could not be judged (the rule goes on with the others)."""
        self.notes.append(note)

    def in_window(self, column: str) -> tuple[str, list]:
        """SQL condition (and parameters) keeping rows whose ``column`` is in the window."""
        parts, params = [], []
        if self.since is not None:
            parts.append(f"{column} >= ?")
            params.append(self.since)
        if self.until is not None:
            parts.append(f"{column} < ?")
            params.append(self.until)
        return (" AND ".join(parts) or "TRUE"), params

    def gpu_price(self, gpu_type: str | None) -> tuple[float, str]:
        """USD per GPU-hour for a GPU type or model name, and the price key that matched."""
        prices = self.config.values["prices"]["gpu_hour_usd"]
        text = (gpu_type or "").lower()
        matches = [k for k in prices if k != "default" and k.lower() in text]
        key = max(matches, key=len) if matches else "default"
        return float(prices[key]), key

    @property
    def storage_price(self) -> float:
        return float(self.config.values["prices"]["storage_gb_month_usd"])

    def metric_globs(self, kind: str) -> list[str]:
        return list(self.config.values["metrics"][kind])

    def matches(self, key: str, kind: str) -> bool:
        return any(fnmatchcase(key, g) for g in self.metric_globs(kind))


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
    since: datetime | None
    until: datetime | None
    results: list[RuleResult]

    @property
    def findings(self) -> list[Finding]:
        return sorted(
            (f for r in self.results for f in r.findings),
            key=lambda f: (
                -int(f.severity),
                -f.usd,
                -f.bytes,
                f.rule,
                json.dumps(f.subject, sort_keys=True, default=str),
            ),
        )

    @property
    def active(self) -> list[Finding]:
        return [f for f in self.findings if not f.suppressed]


def run_rules(
    con,
    config: Config,
    rules: list[type[Rule]],
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[RuleResult]:
    results = []
    shared: dict[tuple, Any] = {}
    for rule_class in rules:
        started = time.monotonic()
        thresholds = {k: t.default for k, t in rule_class.thresholds.items()}
        thresholds.update(config.values["rules"].get(rule_class.code, {}))
        ctx = RuleContext(
            con=con,
            config=config,
            thresholds=thresholds,
            since=since,
            until=until,
            shared=shared,
        )
        missing = [why for table, why in rule_class.needs.items() if not _has_rows(con, table)]
        if missing:
            results.append(RuleResult(rule_class.code, "skipped", "; ".join(missing)))
            continue
        try:
            findings = list(rule_class().check(ctx))
            result = RuleResult(rule_class.code, "ok", findings=findings, notes=ctx.notes)
        except Skip as exc:
            result = RuleResult(rule_class.code, "skipped", str(exc), notes=ctx.notes)
        except Exception as exc:  # one broken rule must not stop the scan
            where = traceback.extract_tb(exc.__traceback__)[-1]
            result = RuleResult(
                rule_class.code,
                "error",
                f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})",
            )
        result.seconds = time.monotonic() - started
        results.append(result)
    return results


def _has_rows(con, table: str) -> bool:
    return bool(con.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchall()[0][0])


def apply_suppressions(con, config: Config, results: list[RuleResult]) -> None:
    """Config [[suppress]] entries and run tags ``audit.ignore=CODE[,CODE]`` mute findings."""
    tag = config.values["attribution"]["ignore_tag"]
    ignored: dict[str, set[str]] = {}
    for run_id, value in con.execute(
        "SELECT run_id, value FROM tags WHERE key = ?", [tag]
    ).fetchall():
        ignored[run_id] = {c.strip().upper() for c in (value or "").split(",") if c.strip()}
    for result in results:
        for f in result.findings:
            run_id = f.subject.get("run_id")
            if run_id and (
                f.rule in ignored.get(run_id, set()) or f.rule[:3] in ignored.get(run_id, set())
            ):
                f.suppressed, f.suppressed_reason = (
                    True,
                    f"run tag {tag}={','.join(sorted(ignored[run_id]))}",
                )
                continue
            for entry in config.values["suppress"]:
                if entry["rule"].upper() in (f.rule, f.rule[:3]) and _subject_matches(
                    entry["subject"], f.subject
                ):
                    f.suppressed, f.suppressed_reason = True, f"config: {entry['reason']}"
                    break


def _subject_matches(pattern: str, subject: dict) -> bool:
    return pattern == "*" or any(fnmatchcase(str(v), pattern) for v in subject.values())


def scan(
    wh,
    config: Config,
    rules: list[type[Rule]],
    since: datetime | None = None,
    until: datetime | None = None,
) -> ScanResult:
    """Run the rules and store the scan with its findings and per-rule results."""
    started_at = datetime.now(UTC).replace(tzinfo=None)
    results = run_rules(wh.con, config, rules, since, until)
    apply_suppressions(wh.con, config, results)
    with wh.transaction() as con:
        scan_id = con.execute("SELECT coalesce(max(scan_id), 0) + 1 FROM scans").fetchall()[0][0]
        con.execute(
            "INSERT INTO scans VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                scan_id,
                started_at,
                datetime.now(UTC).replace(tzinfo=None),
                config.digest,
                since,
                until,
                ",".join(r.code for r in rules),
            ],
        )
        rows = [
            (
                scan_id,
                f.id,
                f.rule,
                f.name,
                f.severity.label,
                json.dumps(f.subject, sort_keys=True, default=str),
                f.message,
                json.dumps(f.evidence, default=str),
                f.gpu_hours,
                f.usd,
                int(f.bytes),
                f.recommendation,
                f.team,
                f.method,
                f.happened_at,
                f.suppressed,
                f.suppressed_reason,
            )
            for r in results
            for f in r.findings
        ]
        if rows:
            # one columnar insert: executemany costs ~1.5 ms per row (4 min for 150k findings)
            columns = [c[0] for c in con.execute("SELECT * FROM findings LIMIT 0").description]
            frame = pl.DataFrame(rows, schema=columns, orient="row", infer_schema_length=None)
            con.register("incoming_findings", frame)
            try:
                con.execute("INSERT INTO findings SELECT * FROM incoming_findings")
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
    return ScanResult(scan_id, started_at, config.digest, since, until, results)


def reusable_scan(
    wh, config: Config, rules: list[type[Rule]], since: datetime | None, until: datetime | None
) -> int | None:
    """The latest stored scan of exactly this closed window, rule set and configuration,
    made after the window closed and after the last import or prune; else None.

    Such a scan is what scanning again would give, so reports reuse it instead of paying
    for the rules again (20 s at 100k runs).
    """
    if until is None:
        return None
    rows = wh.con.execute(
        """
        SELECT max(scan_id) FROM scans
        WHERE window_start IS NOT DISTINCT FROM ? AND window_end = ?
          AND config_hash = ? AND selection = ? AND started_at >= window_end
          AND started_at >= (
              SELECT coalesce(max(t), TIMESTAMP '0001-01-01') FROM (
                  SELECT max(finished_at) AS t FROM import_log
                  UNION ALL SELECT max(imported_at) FROM file_imports
                  UNION ALL SELECT max(applied_at) FROM prune_log))
        """,
        [since, until, config.digest, ",".join(r.code for r in rules)],
    ).fetchall()
    return rows[0][0] if rows and rows[0][0] is not None else None


def load_scan(wh, scan_id: int) -> ScanResult:
    """A stored scan as the ScanResult that produced it."""
    started_at, config_hash, since, until = wh.con.execute(
        "SELECT started_at, config_hash, window_start, window_end FROM scans WHERE scan_id = ?",
        [scan_id],
    ).fetchall()[0]
    by_rule: dict[str, list[Finding]] = {}
    for row in wh.con.execute(
        "SELECT rule, name, severity, subject, message, evidence, recommendation, gpu_hours, "
        "usd, bytes, team, method, happened_at, suppressed, suppressed_reason "
        "FROM findings WHERE scan_id = ? ORDER BY finding_id",
        [scan_id],
    ).fetchall():
        by_rule.setdefault(row[0], []).append(
            Finding(
                rule=row[0],
                name=row[1],
                severity=Severity.parse(row[2]),
                subject=json.loads(row[3]),
                message=row[4],
                evidence=json.loads(row[5]) if row[5] else {},
                recommendation=row[6] or "",
                gpu_hours=row[7] or 0.0,
                usd=row[8] or 0.0,
                bytes=row[9] or 0,
                team=row[10],
                method=row[11],
                happened_at=row[12],
                suppressed=row[13],
                suppressed_reason=row[14],
            )
        )
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
    return ScanResult(scan_id, started_at, config_hash, since, until, results)

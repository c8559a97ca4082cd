"""What a rule author imports: ``Rule``, ``Finding``, ``Threshold``, ``Severity``, ``RuleContext``.

A rule is a small class in ``rules/`` (shipped as ``audit.rules``) or in a plug-in
(entry-point group ``audit.rules``): ``code`` (family prefix + number), kebab-case ``name``,
default ``severity``, the ``family_label`` of its family, documented ``thresholds``, the
tables it ``needs``, the shared computations it ``reads_shared``, and a docstring that is
its user documentation. ``check(ctx)`` reads
the warehouse through the context and yields findings; it never writes. An exception
inside a rule becomes an ``error`` result and the scan goes on; missing inputs become
``skipped`` with the reason; a subject the rule cannot judge becomes a note.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from audit.config import Config
from audit.errors import InputError
from audit.heap import long_lived
from audit.windows import Window

if TYPE_CHECKING:
    from audit.costs import Facts
    from audit.usage import UsageIndex

DOC_SECTIONS = (
    "What it detects",
    "Why it is waste",
    "Known false positives",
    "Example",
    "How to fix",
    "References",
)


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

    @classmethod
    def percent(cls, default: float, help: str) -> Threshold:
        """A share in per cent: from 0 to 100."""
        return cls(default, help, 0, 100, "%")

    def validate(self, value: Any, where: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)  # NaN and infinities compare as no threshold should
        ):
            raise InputError(f"{where} must be a finite number, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise InputError(f"{where} must be ≥ {self.minimum}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise InputError(f"{where} must be ≤ {self.maximum}, got {value}")
        return value

    def bounds(self) -> str:
        """The valid range as text: "≥ 0, ≤ 100" (empty when any number will do)."""
        bounds = []
        if self.minimum is not None:
            bounds.append(f"≥ {self.minimum:g}")
        if self.maximum is not None:
            bounds.append(f"≤ {self.maximum:g}")
        return ", ".join(bounds)

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        bounds = self.bounds()
        return f"default {self.default:g}{unit}" + (f" ({bounds})" if bounds else "")


# The findings table's columns, in order: Finding.to_row and Finding.from_row are the only
# code that maps a finding to a stored row and back.
FINDING_COLUMNS = (
    "scan_id",
    "finding_id",
    "rule",
    "name",
    "severity",
    "subject",
    "message",
    "evidence",
    "gpu_hours",
    "usd",
    "bytes",
    "recommendation",
    "team",
    "method",
    "happened_at",
    "suppressed",
    "suppressed_reason",
    "run_hours",
    "cost_basis",
    "risk_gpu_hours",
    "material",
)


# The subject fields that name a finding, most specific first.
_SUBJECT_NAMES = (
    "run_name",
    "job_id",
    "host",
    "dataset_digest",
    "run_dir",
    "experiment",
    "model",
    "evaluated_model",
    "entry_point",
    "base_model",
    "team",
)


def run_entry(run: Any, **details: Any) -> dict:
    """One run in a finding's evidence: its id and name, ``details``, and its cost (GPU-hours,
    run-hours, the basis) as every rule lists it."""
    return {
        "run_id": run.run_id,
        "name": run.name,
        **details,
        "gpu_hours": None if run.cost.gpu_hours is None else round(run.cost.gpu_hours, 3),
        "run_hours": None if run.run_hours is None else round(run.run_hours, 4),
        "cost_basis": run.cost.basis,
    }


def subject_label(subject: dict) -> str:
    """The short name of a finding's subject shown in tables and reports."""
    for key in _SUBJECT_NAMES:
        if subject.get(key):
            return str(subject[key])
    return json.dumps(subject, default=str)


@dataclass(frozen=True)
class Waste:
    """What a finding wasted: GPU-hours and dollars, None when the GPU count is unknown
    (``run_hours`` then says how long), and what the figure stands on (``basis``; default:
    the finding's owner's cost basis)."""

    gpu_hours: float | None = 0.0
    usd: float | None = 0.0
    run_hours: float | None = None
    basis: str | None = None

    @classmethod
    def of_runs(cls, runs: Iterable) -> Waste:
        """The whole cost of ``runs`` (repeated work): summed where known, the run-hours of
        those of unknown cost apart, never counted as $0."""
        runs = list(runs)
        known = [r for r in runs if r.cost.known]
        unknown = [r for r in runs if not r.cost.known]
        return cls(
            gpu_hours=sum(r.cost.gpu_hours for r in known) if known else None,
            usd=sum(r.cost.usd for r in known) if known else None,
            run_hours=sum(r.run_hours or 0.0 for r in unknown) if unknown else None,
        )


@dataclass
class Finding:
    """One piece of waste (or risk) with its evidence and price.

    ``gpu_hours`` and ``usd`` are None when the cost is unknown (no GPU count anywhere);
    ``run_hours`` then says how long the runs ran. Zero means "no waste claimed" (risks,
    storage findings have ``bytes`` instead). ``risk_gpu_hours`` is what a finding that
    claims no waste put at risk (a run never evaluated, a first run without a pilot).
    ``material`` is False for a finding under its family's materiality floor
    (``audit.materiality``): summed with the others of its rule and team, not listed.
    """

    rule: str
    name: str
    severity: Severity
    subject: dict[str, Any]
    message: str
    evidence: dict[str, Any]
    recommendation: str
    gpu_hours: float | None = 0.0
    usd: float | None = 0.0
    bytes: int = 0
    team: str | None = None
    method: str | None = None
    happened_at: datetime | None = None
    suppressed: bool = False
    suppressed_reason: str | None = None
    run_hours: float | None = None
    cost_basis: str | None = None
    risk_gpu_hours: float | None = None
    material: bool = True

    @property
    def id(self) -> str:
        key = json.dumps([self.rule, self.subject], sort_keys=True, default=str)
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    @property
    def family(self) -> str:
        return self.rule[:3]

    @property
    def cost_known(self) -> bool:
        return self.gpu_hours is not None

    @property
    def impact(self) -> tuple[float, str] | None:
        """What the finding weighs, in the first unit it has: waste GPU-hours, run-hours of
        unknown GPU count, storage GB, GPU-hours at risk; None when nothing is measured."""
        if self.gpu_hours:
            return self.gpu_hours, "GPU-h"
        if self.gpu_hours is None and self.run_hours:
            return self.run_hours, "run-h"
        if self.bytes:
            return self.bytes / 1e9, "GB"
        if self.risk_gpu_hours:
            return self.risk_gpu_hours, "GPU-h at risk"
        if self.run_hours:
            return self.run_hours, "run-h"
        return None

    @property
    def impact_text(self) -> str:
        impact = self.impact
        if impact is None:
            return "not measured"
        amount, unit = impact
        money = f", ${self.usd:,.2f}" if self.usd else ""
        return f"{amount:,.2f} {unit}{money}"

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
                "gpu_hours": None if self.gpu_hours is None else round(self.gpu_hours, 3),
                "usd": None if self.usd is None else round(self.usd, 2),
                "bytes": int(self.bytes),
                "run_hours": None if self.run_hours is None else round(self.run_hours, 6),
            },
            "cost_basis": self.cost_basis,
            "impact": self.impact_text,
            "risk_gpu_hours": None
            if self.risk_gpu_hours is None
            else round(self.risk_gpu_hours, 3),
            "material": self.material,
            "recommendation": self.recommendation,
            "team": self.team,
            "method": self.method,
            "suppressed": self.suppressed,
            "suppressed_reason": self.suppressed_reason,
        }

    def to_row(self, scan_id: int) -> tuple:
        return (
            scan_id,
            self.id,
            self.rule,
            self.name,
            self.severity.label,
            json.dumps(self.subject, sort_keys=True, default=str),
            self.message,
            json.dumps(self.evidence, default=str),
            self.gpu_hours,
            self.usd,
            int(self.bytes),
            self.recommendation,
            self.team,
            self.method,
            self.happened_at,
            self.suppressed,
            self.suppressed_reason,
            self.run_hours,
            self.cost_basis,
            self.risk_gpu_hours,
            self.material,
        )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Finding:
        return cls(
            rule=row["rule"],
            name=row["name"],
            severity=Severity.parse(row["severity"]),
            subject=json.loads(row["subject"]),
            message=row["message"],
            evidence=json.loads(row["evidence"]) if row["evidence"] else {},
            recommendation=row["recommendation"] or "",
            gpu_hours=row["gpu_hours"],
            usd=row["usd"],
            bytes=row["bytes"] or 0,
            team=row["team"],
            method=row["method"],
            happened_at=row["happened_at"],
            suppressed=row["suppressed"],
            suppressed_reason=row["suppressed_reason"],
            run_hours=row["run_hours"],
            cost_basis=row["cost_basis"],
            risk_gpu_hours=row["risk_gpu_hours"],
            material=row["material"] is not False,  # scans stored before it: all listed
        )


class Skip(Exception):
    """Raised by a rule that cannot judge at all; the message says which input is missing
    (and, when the configuration does not fit the data, what the data holds instead)."""


# What a rule's ``needs`` says when a table is empty: one wording per table
EMPTY_TABLES = {
    "runs": "no runs imported",
    "metrics": "no metrics imported",
    "params": "no run params imported",
    "jobs": "no Slurm jobs imported",
    "checkpoints": "no checkpoint folders imported",
    "gpu_samples": "no GPU telemetry imported",
    "dataset_inputs": "no dataset inputs imported",
}


def needing(*tables: str, **why: str) -> dict[str, str]:
    """A rule's ``needs``: each of ``tables`` with what is missing when it is empty, then
    ``why`` (table -> the rule's own wording)."""
    return {**{table: EMPTY_TABLES[table] for table in tables}, **why}


class Rule:
    """Base class of every rule. Subclasses set the class attributes and ``check``."""

    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    family_label: ClassVar[str]  # e.g. "idle capacity": the family's row in summaries
    thresholds: ClassVar[dict[str, Threshold]] = {}
    needs: ClassVar[dict[str, str]] = {}  # table -> what is missing when it is empty
    # The computations shared between rules that ``check`` reads, itself or through a
    # helper: the names ``RuleContext.once`` keys start with ("facts", "usage", "recipes").
    # ``audit scan`` drops each one after its last reader, to bound memory; a name left out
    # makes a later reader compute it again (time), never gives another result.
    reads_shared: ClassVar[frozenset[str]] = frozenset()
    # True for a rule whose work is DuckDB queries and which reads no shared computation:
    # a scan runs it on a second thread and connection while the other rules' Python runs
    # (DuckDB releases the GIL in a query). Its temporary tables and registered frames are
    # its connection's own.
    alone: ClassVar[bool] = False
    recommendation: ClassVar[str] = ""
    # Severity from the finding's impact (audit.materiality); False for rules whose
    # severity is about a model that cannot ship (a red line, a registered regression)
    severity_from_impact: ClassVar[bool] = True
    # Which headline figure the waste belongs to (audit.summary): "spend" (part of the
    # window's GPU spend: jobs and runs), "capacity" (GPUs paid for with no job: idle
    # hosts) or "storage" (bytes and $ per month)
    waste_scope: ClassVar[str] = "spend"

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
        self,
        subject: dict,
        message: str,
        evidence: dict,
        cost: Waste | None = None,
        owner: Any = None,
        **fields: Any,
    ) -> Finding:
        """A finding of this rule. ``cost``: what it wasted (GPU-hours, dollars, run-hours
        when the GPU count is unknown) on the basis of ``owner``'s cost unless it says its
        own; ``owner``: the run, job or allocation it is about (its team, method and cost
        basis). Explicit fields win."""
        if owner is not None:
            fields.setdefault("team", owner.team)
            fields.setdefault("method", owner.method)
        if cost is not None:
            fields.setdefault("gpu_hours", cost.gpu_hours)
            fields.setdefault("usd", cost.usd)
            fields.setdefault("run_hours", cost.run_hours)
            basis = cost.basis or (owner.cost.basis if owner is not None else None)
            fields.setdefault("cost_basis", basis)
        return Finding(
            rule=self.code,
            name=self.name,
            severity=fields.pop("severity", self.severity),
            subject=subject,
            message=message,
            evidence=evidence,
            recommendation=fields.pop("recommendation", self.recommendation),
            **fields,
        )

    def run_finding(
        self, run: Any, message: str, evidence: dict, cost: Waste | None = None, **fields: Any
    ) -> Finding:
        """A finding about one run: its id and name as the subject, its team, method and
        cost basis (``finding``'s owner), at its start unless ``happened_at`` says when."""
        fields.setdefault("happened_at", run.start_time)
        return self.finding(run.subject(), message, evidence, cost, owner=run, **fields)


@dataclass
class RuleContext:
    """What a rule sees: read-only queries, its thresholds, prices, the scan window, and
    the shared facts (cost and attribution, GPU usage) computed once per scan."""

    con: Any
    config: Config
    thresholds: dict[str, float]
    window: Window
    notes: list[str] = field(default_factory=list)
    # facts several rules derive the same way, computed once per scan; keyed by the
    # helper and its arguments
    shared: dict[tuple, Any] = field(default_factory=dict)
    _prices: Any = field(default=None, repr=False)

    def once(self, key: tuple, compute):
        if key not in self.shared:
            with long_lived():
                self.shared[key] = compute()
        return self.shared[key]

    def rows(self, sql: str, params: list | dict | None = None) -> list[dict[str, Any]]:
        cursor = self.con.execute(sql, params or [])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def note(self, text: str) -> None:
        """Record that one subject could not be judged (the rule goes on with the others)."""
        self.notes.append(text)

    @property
    def facts(self) -> Facts:
        """Runs and jobs with their cost and attribution (``audit.costs``)."""
        from audit.costs import Facts

        return self.once(("facts",), lambda: Facts.load(self.con, self.config))

    @property
    def usage(self) -> UsageIndex:
        """How busy each allocation's GPUs were, from the best evidence (``audit.usage``)."""
        from audit.usage import UsageIndex

        return self.once(("usage",), lambda: UsageIndex(self.con, self.facts))

    def gpu_price(self, gpu_type: str | None) -> tuple[float, str]:
        price = self.prices(gpu_type)
        return price.usd, price.key

    @property
    def prices(self):
        """GPU prices by card (``audit.facts.prices``): a small table, built per rule (it is
        no shared computation a later rule waits for)."""
        from audit.facts.prices import Prices

        if self._prices is None:
            self._prices = Prices(self.config)
        return self._prices

    @property
    def storage_price(self) -> float:
        return float(self.config.prices.storage_gb_month_usd)

    def metric_globs(self, kind: str) -> list[str]:
        return list(self.config.metrics.globs(kind))

    def matches(self, key: str, kind: str) -> bool:
        return self.config.metrics.matches(key, kind)

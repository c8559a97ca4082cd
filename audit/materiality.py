"""Which findings a lead should read one by one, and how severe each is: by its impact.

Every finding carries its impact (``Finding.impact``): the GPU-hours it claims as waste,
else the run-hours when the GPU count is unknown, else the storage it can free, else the
GPU-hours it put at risk. A finding under its family's floor is *immaterial*: it is kept
(JSON, ``--all``) but not listed; the immaterial findings of a rule and team are summed
into one line ("21 repeated runs, 0.01 run-hours in all").

Floors (``[materiality]``, per family in ``[materiality] families``), with why:

- ``min_gpu_hours = 1``: one GPU for an hour, about $2, is below what anybody acts on;
- ``min_run_hours = 0.5``: half an hour of runs whose GPUs are unknown (they may be CPU
  runs, as a notebook's models are);
- ``min_gb = 1``: one GB of storage costs about $0.02 a month.

Severity follows impact, not the rule's name, for every finding that claims waste
(``Rule.severity_from_impact``): ``high`` from ``high_gpu_hours`` (100 GPU-h, about a week of
one GPU or half a day of a node) or 1 TB, ``medium`` from ``medium_gpu_hours`` (10 GPU-h) or
100 GB, ``low`` at or above the floor, ``info`` under it. A hint that claims no waste (the
GPU-hours a run without a pilot or an evaluation put at risk) keeps its rule's severity,
and is ``info`` under the floor. A red line or a
registered model's regression (RED001, REG002) keeps its own severity: those are about a
model that cannot ship, whatever the hours. A finding whose impact is not measured keeps
its rule's severity and is always listed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from audit.config import Config
from audit.rule_api import Finding, Severity

FLOOR_KEYS = ("min_gpu_hours", "min_run_hours", "min_gb")


@dataclass(frozen=True)
class Floors:
    gpu_hours: float
    run_hours: float
    gb: float

    def of_unit(self, unit: str) -> float:
        return {"GPU-h": self.gpu_hours, "GPU-h at risk": self.gpu_hours, "GB": self.gb}.get(
            unit, self.run_hours
        )


class Materiality:
    def __init__(self, config: Config):
        settings = config.materiality
        self.settings = settings
        self.default = Floors(settings.min_gpu_hours, settings.min_run_hours, settings.min_gb)
        self.by_family = {
            family.upper(): Floors(
                float(table.get("min_gpu_hours", self.default.gpu_hours)),
                float(table.get("min_run_hours", self.default.run_hours)),
                float(table.get("min_gb", self.default.gb)),
            )
            for family, table in settings.families.items()
        }

    def floors(self, family: str) -> Floors:
        return self.by_family.get(family, self.default)

    def judge(self, finding: Finding, severity_from_impact: bool) -> None:
        """Set ``material`` and, for waste findings, ``severity`` from the impact."""
        impact = finding.impact
        if impact is None:
            finding.material = True
            return
        amount, unit = impact
        floor = self.floors(finding.family).of_unit(unit)
        finding.material = amount >= floor
        if not severity_from_impact:
            return
        if unit == "GPU-h at risk":
            # a hint (a run without a pilot, without an evaluation): what it risks is
            # information, not waste; only an immaterial one is lowered
            if not finding.material:
                finding.severity = Severity.INFO
            return
        finding.severity = self.band(amount, unit, finding.material)

    def band(self, amount: float, unit: str, material: bool) -> Severity:
        if not material:
            return Severity.INFO
        s = self.settings
        if unit == "GB":
            high, medium = s.high_gb, s.medium_gb
        else:
            high, medium = s.high_gpu_hours, s.medium_gpu_hours
        if amount >= high:
            return Severity.HIGH
        if amount >= medium:
            return Severity.MEDIUM
        return Severity.LOW


def apply_materiality(config: Config, results, rule_classes: dict) -> None:
    """Judge every finding of ``results`` (``rule_classes``: code -> Rule class)."""
    judge = Materiality(config)
    for result in results:
        rule = rule_classes.get(result.rule)
        from_impact = getattr(rule, "severity_from_impact", True)
        for finding in result.findings:
            judge.judge(finding, from_impact)


@dataclass
class SummedLine:
    """The immaterial findings of one rule and team, summed."""

    rule: str
    team: str | None
    findings: int
    gpu_hours: float
    usd: float
    run_hours: float
    bytes: int
    risk_gpu_hours: float

    def text(self) -> str:
        parts = []
        if self.gpu_hours:
            parts.append(f"{self.gpu_hours:,.2f} GPU-h (${self.usd:,.2f})")
        if self.run_hours:
            parts.append(f"{self.run_hours:,.2f} run-hours")
        if self.bytes:
            parts.append(f"{self.bytes / 1e9:,.2f} GB")
        if self.risk_gpu_hours:
            parts.append(f"{self.risk_gpu_hours:,.2f} GPU-h at risk")
        team = f"team {self.team!r}" if self.team else "no team"
        weight = ", ".join(parts) or "nothing measured"
        return f"{self.rule} ({team}): {self.findings} findings under the floor, {weight} in all"

    def as_json(self) -> dict:
        return {
            "rule": self.rule,
            "team": self.team,
            "findings": self.findings,
            "gpu_hours": round(self.gpu_hours, 3),
            "usd": round(self.usd, 2),
            "run_hours": round(self.run_hours, 3),
            "bytes": self.bytes,
            "risk_gpu_hours": round(self.risk_gpu_hours, 3),
        }


def summed_lines(findings: list[Finding]) -> list[SummedLine]:
    """One line per rule and team of the immaterial findings among ``findings``."""
    groups: dict[tuple, list[Finding]] = defaultdict(list)
    for finding in findings:
        if not finding.material and not finding.suppressed:
            groups[(finding.rule, finding.team or "")].append(finding)
    return [
        SummedLine(
            rule,
            team or None,
            len(items),
            sum(f.gpu_hours or 0 for f in items),
            sum(f.usd or 0 for f in items),
            sum(f.run_hours or 0 for f in items if not f.gpu_hours),
            sum(f.bytes for f in items),
            sum(f.risk_gpu_hours or 0 for f in items),
        )
        for (rule, team), items in sorted(groups.items())
    ]

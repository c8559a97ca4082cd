"""What a scan leads with: the ranked actions (``audit.summary.actions``)."""

from __future__ import annotations

from audit.config import load_config
from audit.costs import Facts
from audit.rule_api import Finding, Severity
from audit.summary import actions


def _finding(rule: str, severity: Severity, **cost) -> Finding:
    return Finding(
        rule=rule,
        name=rule.lower(),
        severity=severity,
        subject={"team": rule},
        message=rule,
        evidence={},
        recommendation="act",
        **cost,
    )


def test_waste_first_then_severity_then_what_is_at_risk():
    queue_wait = _finding("QUE001", Severity.INFO, gpu_hours=0.0, usd=0.0, risk_gpu_hours=900.0)
    unknown_cost = _finding("IDL001", Severity.HIGH, gpu_hours=None, usd=None)
    idle = _finding("IDL002", Severity.HIGH, gpu_hours=8.0, usd=16.0)
    untested = _finding("PIL001", Severity.MEDIUM, gpu_hours=0.0, usd=0.0, risk_gpu_hours=10.0)
    facts = Facts(load_config(None), runs=[], jobs=[])
    ranked = actions([queue_wait, untested, unknown_cost, idle], facts)
    # dollars first; without waste, a high-severity finding of unknown cost comes before
    # an info finding whatever GPU-hours it puts at risk (a queue wait's: not waste)
    assert [a["rule"] for a in ranked] == ["IDL002", "IDL001", "PIL001", "QUE001"]

"""The headline figures, recomputed from the findings a report or scan lists.

Seen before the fix: the demo's weekly report said "Wasted $1,867.80 (64.7 %)": the
numerator held $288 of idle-host time (outside every job) that the denominator, the spend,
did not; and $6.70 a month of storage next to GPU dollars. Each figure is now one
population, and this test recomputes each from the JSON the report and the scan give.
"""

from __future__ import annotations

import json

import pytest

from audit.rule_registry import all_rules

SCOPE = {code: rule.waste_scope for code, rule in all_rules().items()}


def _recompute(findings: list[dict], spent: float) -> dict:
    active = [f for f in findings if not f["suppressed"]]
    inside = [f for f in active if SCOPE[f["rule"]] == "spend"]
    capacity = [f for f in active if SCOPE[f["rule"]] == "capacity"]
    storage = [f for f in active if SCOPE[f["rule"]] == "storage"]
    wasted = round(sum(f["waste"]["usd"] or 0 for f in inside), 2)
    return {
        "wasted": wasted,
        "share": round(100 * wasted / spent, 1),
        "capacity": round(sum(f["waste"]["usd"] or 0 for f in capacity), 2),
        "storage_gb": round(sum(f["waste"]["bytes"] for f in storage) / 1e9, 1),
        "storage_usd": round(sum(f["waste"]["usd"] or 0 for f in storage), 2),
    }


def test_the_scan_headline_is_recomputed_from_its_findings(run_cli, demo_db):
    base = ("--db", str(demo_db["db"]), "--config", str(demo_db["config"]))
    code, out, err = run_cli(*base, "scan", "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    headline = document["summary"]["headline"]
    spent = headline["spent"]["usd"]
    again = _recompute(document["findings"], spent)
    assert headline["wasted"]["usd"] == again["wasted"]
    assert headline["wasted"]["share_pct"] == again["share"]
    assert headline["unallocated_capacity"]["usd"] == again["capacity"]
    assert headline["storage"]["gb"] == again["storage_gb"]
    assert headline["storage"]["usd_per_month"] == again["storage_usd"]
    # the idle host is its own figure, not part of the share of spend
    assert again["capacity"] == 288.0
    # the three figures together are all the waste the families add up to (to the cent)
    assert headline["wasted"]["usd"] + again["capacity"] + again["storage_usd"] == pytest.approx(
        document["summary"]["waste"]["usd"], abs=0.01 * len(document["findings"])
    )
    # the formula says the same numbers
    assert f"= {again['share']} %" in headline["wasted"]["formula"]
    # and the terminal says them too
    code, out, _ = run_cli(*base, "scan")
    assert f"= {again['share']} % of ${spent:,.2f} spent" in out
    assert f"unallocated capacity: ${again['capacity']:,.2f}" in out


def test_the_weekly_report_headline_is_recomputed_from_its_findings(run_cli, demo_db, tmp_path):
    base = ("--db", str(demo_db["db"]), "--config", str(demo_db["config"]))
    target = tmp_path / "week.json"
    code, _, err = run_cli(
        *base, "report", "weekly", "--week", "2026-W47", "--format", "json", "--output", str(target)
    )
    assert code == 0, err
    report = json.loads(target.read_text())
    h = report["headline"]
    again = _recompute(report["findings"], h["usd_spent"])
    assert (h["usd_wasted"], h["waste_share"]) == (again["wasted"], again["share"])
    assert h["unallocated_usd"] == again["capacity"]
    assert h["reclaimable_gb"] == again["storage_gb"]
    figures = {f["figure"] for f in h["formulas"]}
    assert figures == {
        "Spent",
        "Wasted",
        "Unallocated capacity",
        "Reclaimable storage",
        "Unknown cost",
    }
    # the trend's last week is this week's wasted figure, over the same population
    assert report["trend"][-1]["usd"] == again["wasted"]

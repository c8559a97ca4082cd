"""Weekly and scan reports: golden files, a real browser, hostile strings, charts, size."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from audit.rule_registry import all_rules
from tests.helpers import REPO, log_train_dataset

GOLDEN = Path(__file__).parents[1] / "golden"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts"
PINNED = {"AUDIT_NOW": "2026-11-30T08:00:00"}


def normalise(text: str, demo: dict) -> str:
    """Machine-specific paths and matplotlib's drawing replaced by stable placeholders."""
    text = text.replace(str(demo["scratch"]), "<scratch>").replace(
        str(REPO / "sample_logs"), "<sample_logs>"
    )
    text = re.sub(r"<svg.*?</svg>", "<svg/>", text, flags=re.S)
    text = re.sub(r"last import \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "last import <time>", text)
    # A finding's id hashes its subject, and a checkpoint finding's subject is a folder under
    # the checkout: ids numbered in order of appearance keep every link and its anchor paired
    # wherever the repository is cloned.
    numbered: dict[str, str] = {}
    return re.sub(
        r"\bf-[0-9a-f]{16}\b",
        lambda m: numbered.setdefault(m.group(0), f"f-<{len(numbered) + 1}>"),
        text,
    )


def check_golden(name: str, text: str, regenerate: bool) -> None:
    path = GOLDEN / name
    if regenerate or not path.exists():
        path.write_text(text, encoding="utf-8")
        if not regenerate:
            pytest.fail(
                f"golden file {path} was missing and has been written; review it and run again"
            )
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} differs from the golden file (pytest --regenerate-golden)"
    )


def weekly(run_cli, demo, *args):
    return run_cli(
        "--db",
        str(demo["db"]),
        "--config",
        str(demo["config"]),
        "report",
        "weekly",
        "--week",
        "2026-W47",
        *args,
        env=PINNED,
    )


def test_weekly_markdown_golden(run_cli, fresh_demo_db, regenerate_golden):
    code, out, err = weekly(run_cli, fresh_demo_db, "--format", "md")
    assert code == 0, err
    check_golden("weekly-2026-W47.md", normalise(out, fresh_demo_db), regenerate_golden)


def test_weekly_html_golden(run_cli, fresh_demo_db, regenerate_golden, tmp_path):
    target = tmp_path / "weekly.html"
    code, out, err = weekly(run_cli, fresh_demo_db, "--output", str(target))
    assert code == 0, err
    assert out.startswith(f"wrote {target} (")
    check_golden(
        "weekly-2026-W47.html", normalise(target.read_text(), fresh_demo_db), regenerate_golden
    )


def test_weekly_json(run_cli, fresh_demo_db):
    _code, out, _ = weekly(run_cli, fresh_demo_db, "--format", "json")
    doc = json.loads(out)
    # The reasoning team's three W&B runs add num_gpus × run duration = 88.5 GPU-h at the
    # default $2.00/GPU-h (no GPU type known for runs outside Slurm): $177.07. The waste
    # of that spend leaves out the idle host ($288, its own figure) and storage ($/month);
    # tests/reports/test_headline.py recomputes each figure from the findings.
    headline = dict(doc["headline"])
    assert [f["figure"] for f in headline.pop("formulas")][:2] == ["Spent", "Wasted"]
    assert headline == {
        "gpu_hours": 1006.9,
        "usd_spent": 2886.9,
        "usd_wasted": 780.3,
        "waste_share": 27.0,
        "gpu_hours_wasted": 276.5,
        "unallocated_usd": 288.0,
        "unallocated_gpu_hours": 96.0,
        "reclaimable_gb": 291.5,
        "storage_usd_month": 6.71,
        "findings": 22,
        "listed": 22,
        "unknown_cost_findings": 0,
        "unknown_cost_run_hours": 0,
    }
    assert [t["week"] for t in doc["trend"]] == [f"2026-W{w}" for w in range(40, 48)]
    # storage waste belongs to the weeks its files existed: the orphan sweep of September
    # in every week, the runs' checkpoints only from W47 on (not in weeks before the runs);
    # W46 holds one SFT run (the far history of DSH001) that regressed (REG002, DSH001)
    assert doc["trend"][-1]["usd"] == 780.3
    assert [t["findings"] for t in doc["trend"][:-1]] == [1] * 6 + [3]
    assert [t["has_data"] for t in doc["trend"]] == [False] * 6 + [True, True]
    assert {f["rule"] for f in doc["changes"]["still_open"]} == {"CKP003"}
    assert doc["activity"] == {"runs": 22, "gpu_jobs": 20, "empty": False}
    assert doc["previous"]["activity"] == {"runs": 1, "gpu_jobs": 1, "empty": False}
    assert len(doc["changes"]["new"]) == 21
    by_method = {m["method"]: m for m in doc["methods"]["by_method"]}
    assert by_method["sft"]["mean_general_change"] < by_method["rl"]["mean_general_change"]
    assert (
        by_method["rl"]["mean_general_change"] >= -0.002
        and by_method["opd"]["mean_general_change"] >= -0.002
    )
    assert [c["category"] for c in doc["categories"]] == [
        "compute",
        "storage",
        "evaluation",
        "rework",
    ]
    assert doc["categories"][2]["usd"] == doc["summary"]["evaluation"]["usd"] == pytest.approx(3.2)
    # rework: DUP001's repeats (MLflow $144.80 and the W&B rerun $98.40), REG002 and RED001
    assert doc["categories"][3]["usd"] == pytest.approx(144.8 + 98.4 + 180.4 + 30.2, abs=0.01)
    # the method matrix: one group per base model and task, MTX001's dominated run marked
    groups = {(g["base_model"], g["task"]): g["runs"] for g in doc["matrix"]["groups"]}
    assert set(groups) == {
        ("qwen2.5-7b", "codeedit-v3"),
        ("llama3.1-8b", "codeedit-v3"),
        ("llama3.1-8b", "edit-pairs"),
    }
    dominated = {r["run_name"]: r["dominated_by"] for rs in groups.values() for r in rs}
    assert {k: v for k, v in dominated.items() if v} == {"sft-qwen-lr1e-4": "sft-qwen-lr2e-5"}
    # the method matrix as a recommendation (audit.facts.shift): llama3.1-8b's tasks cut at
    # the terciles of their first training losses (codeedit-v3 and edit-pairs 1.25,
    # gsm8k-cot 2.1, toolcalls-v1 3.1); qwen2.5-7b trains one task, so no distance to cut
    recommendation = doc["recommendation"]
    cells = {(c["base_model"], c["bucket"]): c for c in recommendation["cells"]}
    assert list(cells) == [
        ("llama3.1-8b", "near"),
        ("llama3.1-8b", "mid"),
        ("llama3.1-8b", "far"),
        ("qwen2.5-7b", "all distances"),
    ]
    assert cells[("llama3.1-8b", "near")]["tasks"] == ["codeedit-v3", "edit-pairs"]
    assert cells[("llama3.1-8b", "near")]["cuts"][1] == pytest.approx(2.1)
    # near llama: five SFT runs kept general ability; one OPD run is too few to judge
    assert cells[("llama3.1-8b", "near")]["favoured"] == "sft"
    assert "too few runs to judge opd (n=1)" in cells[("llama3.1-8b", "near")]["reason"]
    # far llama: one run with both measures, the week's far run was never evaluated
    assert cells[("llama3.1-8b", "far")]["favoured"] is None
    assert cells[("llama3.1-8b", "far")]["reason"].startswith("not enough history: 1 run")
    # qwen: SFT gained more on the target (+0.135 vs +0.121) but lost general ability
    # (sft-qwen-lr1e-4 regressed): RL is favoured, with SFT's rework in its cost per run
    qwen = cells[("qwen2.5-7b", "all distances")]
    assert qwen["favoured"] == "rl"
    methods = {m["method"]: m for m in qwen["methods"]}
    sft, rl = methods["sft"], methods["rl"]
    assert (sft["regressed"], sft["general_runs"], rl["regressed"]) == (1, 4, 0)
    assert sft["target_gain"] > rl["target_gain"] and sft["general_change"] < -0.02
    # rework per run = regressed / evaluated × the regressed runs' mean GPU-hours
    regressed_hours = 8 * (9 + 2 / 60)  # sft-qwen-lr1e-4's job
    assert sft["rework_gpu_hours"] == pytest.approx(regressed_hours / 4, abs=0.01)
    assert sft["cost_per_run"] == pytest.approx(
        sft["mean_gpu_hours"] + regressed_hours / 4, abs=0.01
    )
    # the rank correlation under the table: llama's SFT runs lost more general ability on
    # farther tasks (near runs about -0.01, gsm8k-cot -0.015, toolcalls -0.05); qwen's runs
    # share one task, so there is no distance to rank
    rho = {(r["base_model"], r["method"]): r for r in recommendation["correlations"]}
    assert rho[("llama3.1-8b", "sft")]["tasks"] == 4 and rho[("llama3.1-8b", "sft")]["rho"] < 0
    assert not [key for key in rho if key[0] == "qwen2.5-7b"]
    # queue wait: every GPU job of the week, measured from Eligible, apart from waste
    queue = doc["queue"]
    assert queue["jobs"] == 20 and queue["measured_from_submit"] == 0
    assert {r["team"] for r in queue["by_team_partition"]} == {"coder", "agents"}
    assert 0 < queue["gpu_hours_waited"] < 8 * 20 * 20 / 60
    # same finding schema as `audit scan --format json`
    assert set(doc["findings"][0]) >= {
        "id",
        "rule",
        "name",
        "severity",
        "subject",
        "message",
        "evidence",
        "waste",
        "recommendation",
    }


def test_ad_hoc_scans_are_never_reused_as_the_week(run_cli, fresh_demo_db):
    """A partial scan of the week (--select, its window) must not become the stored scan the
    report or the next report's previous-week figures reuse."""
    base = ["--db", str(fresh_demo_db["db"]), "--config", str(fresh_demo_db["config"]), "scan"]
    for week in (("2026-11-16", "2026-11-23"), ("2026-11-09", "2026-11-16")):
        code, _, err = run_cli(
            *base, "--select", "OVP,IDL", "--since", week[0], "--until", week[1], env=PINNED
        )
        assert code == 0, err
    _code, out, _ = weekly(run_cli, fresh_demo_db, "--format", "json")
    doc = json.loads(out)
    assert doc["scan_id"] == 3  # a new, complete scan, not the ad-hoc scan #1
    assert doc["headline"]["usd_wasted"] == 780.3 and doc["headline"]["findings"] == 22
    assert {r["rule"] for r in doc["rules"]} == set(all_rules())
    # W46's figures come from a complete scan too (the orphan checkpoint of September is in
    # it; the ad-hoc OVP,IDL scan of W46 had no storage finding)
    assert doc["previous"]["headline"]["findings"] == 3
    # the complete scan of W47 is reused by the next render; the ad-hoc one never is
    _code, again, _ = weekly(run_cli, fresh_demo_db, "--format", "json")
    assert json.loads(again)["scan_id"] == 3


def _stored(db: Path, sql: str):
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_a_later_render_reads_the_stored_report_until_the_data_or_config_changes(
    run_cli, fresh_demo_db, tmp_path
):
    db = fresh_demo_db["db"]
    renders = {}
    for fmt in ("md", "json", "html"):
        target = tmp_path / f"first.{fmt}"
        code, _, err = weekly(run_cli, fresh_demo_db, "--format", fmt, "--output", str(target))
        assert code == 0, err
        renders[fmt] = target.read_text()
    # the first render computed and stored the week once; md, json and html share it
    assert _stored(db, "SELECT count(*) FROM report_models") == [(1,)]
    # ... and the HTML's charts, drawn once, are kept with it
    assert _stored(db, "SELECT count(*) FROM report_models WHERE figures IS NOT NULL") == [(1,)]
    scans = _stored(db, "SELECT count(*) FROM scans")
    for fmt in ("md", "json", "html"):
        target = tmp_path / f"again.{fmt}"
        assert weekly(run_cli, fresh_demo_db, "--format", fmt, "--output", str(target))[0] == 0
        assert target.read_text() == renders[fmt], f"{fmt}: the stored report renders otherwise"
    assert _stored(db, "SELECT count(*) FROM scans") == scans  # nothing was scanned again
    # an import since: the week is computed again (a new scan) and the stored row replaced
    code, _, err = run_cli(
        "--db", str(db), "--config", str(fresh_demo_db["config"]),
        "ingest", "checkpoints", str(fresh_demo_db["scratch"]), env=PINNED,
    )  # fmt: skip
    assert code == 0, err
    made = _stored(db, "SELECT made_at FROM report_models")
    assert weekly(run_cli, fresh_demo_db, "--format", "json")[0] == 0
    assert _stored(db, "SELECT count(*) FROM scans")[0][0] == scans[0][0] + 1
    assert _stored(db, "SELECT made_at FROM report_models")[0][0] > made[0][0]
    # another configuration: another stored report, the first one kept for its config
    other = tmp_path / "other.toml"
    other.write_text(
        fresh_demo_db["config"].read_text() + "\n[prices]\nstorage_gb_month_usd = 0.5\n"
    )
    code, out, err = run_cli(
        "--db", str(db), "--config", str(other),
        "report", "weekly", "--week", "2026-W47", "--format", "json", env=PINNED,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["headline"] != json.loads(renders["json"])["headline"]
    assert _stored(db, "SELECT count(DISTINCT config_hash) FROM report_models") == [(2,)]


def test_stored_report_data_renders_exactly_as_computed(fresh_demo_db):
    """Times, nested lists and every value a template reads survive the JSON it is kept as."""
    from audit.config import load_config
    from audit.reports.render import html_figures, render_html, render_json, render_markdown
    from audit.reports.weekly import build_report, model_from_json, model_to_json
    from audit.warehouse.store import open_warehouse
    from audit.windows import parse_week

    config = load_config(fresh_demo_db["config"])
    with open_warehouse(fresh_demo_db["db"]) as wh:
        report = build_report(wh, config, parse_week("2026-W47", config.timezone))
    again = model_from_json(model_to_json(report))
    for render in (render_html, render_markdown, render_json):
        assert render(again) == render(report)
    figures = json.loads(json.dumps(html_figures(report)))
    assert figures["charts"] and render_html(again, figures) == render_html(report)


def test_default_week_is_the_last_complete_one(run_cli, fresh_demo_db):
    code, out, _ = run_cli(
        "--db",
        str(fresh_demo_db["db"]),
        "report",
        "weekly",
        "--format",
        "json",
        env={"AUDIT_NOW": "2026-11-25T10:00:00"},
    )
    assert code == 0 and json.loads(out)["window"]["label"] == "2026-W47"
    code, _, err = run_cli(
        "--db", str(fresh_demo_db["db"]), "report", "weekly", "--week", "2026-W60"
    )
    assert code == 2 and "not an ISO week" in err


def test_every_chart_has_a_title_and_alt_text(run_cli, fresh_demo_db, tmp_path):
    target = tmp_path / "weekly.html"
    weekly(run_cli, fresh_demo_db, "--output", str(target))
    html = target.read_text()
    svgs = re.findall(r"<svg[^>]*>.*?</svg>", html, flags=re.S)
    # 5 summary charts, one matrix scatter per (base model, task) with two runs or more,
    # one inline series chart per STB001 finding
    assert len(svgs) == 5 + 2 + 1
    for svg in svgs:
        assert re.search(r'role="img"', svg) and re.search(r'aria-label="[^"]{20,}"', svg)
        assert re.search(r"<title>[^<]+</title>", svg)
    assert html.count("<figcaption>") == len(svgs)
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html


HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    '"><svg onload=alert(3)>',
    "javascript:alert(4)",
    "</textarea><script>alert(5)</script>",
    "\x1b[31mred\x1b[0m",
]


@pytest.fixture
def hostile_db(tmp_path, run_cli):
    """A warehouse whose run names, params, tags and datasets are XSS payloads."""
    from mlflow import MlflowClient
    from mlflow.entities import Param

    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    exp = client.create_experiment("<b>exp</b>")
    for i, payload in enumerate(HOSTILE):
        for copy in range(2):  # identical twins: DUP001 puts the payload into a finding
            run = client.create_run(
                exp,
                start_time=1_794_787_200_000 + i * 10_000_000 + copy * 4_000_000,
                run_name=payload,
                tags={"team": payload, "method": "sft"},
            )
            client.log_batch(
                run.info.run_id,
                params=[
                    Param("learning_rate", "1e-5"),
                    Param("num_gpus", "1"),
                    Param("note", payload),
                ],
            )
            log_train_dataset(client, run.info.run_id, payload, f"d{i}", payload)
            client.set_terminated(
                run.info.run_id,
                "FINISHED",
                end_time=1_794_787_200_000 + i * 10_000_000 + copy * 4_000_000 + 3_600_000,
            )
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0
    return db


def test_hostile_strings_are_text_in_markdown_and_terminal(run_cli, hostile_db):
    code, out, _ = run_cli(
        "--db",
        str(hostile_db),
        "report",
        "weekly",
        "--week",
        "2026-W47",
        "--format",
        "md",
        env=PINNED,
    )
    assert code == 0
    assert "<script>" not in out and "<img" not in out and "\x1b" not in out
    code, out, _ = run_cli("--db", str(hostile_db), "scan")
    assert "\x1b" not in out and "\\x1b[31mred" in out


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian chromium not installed (apt-get install chromium)"
)
def test_report_in_a_real_browser(run_cli, fresh_demo_db, hostile_db, tmp_path):
    from playwright.sync_api import sync_playwright

    pages = {}
    for name, db, config in (
        ("weekly", fresh_demo_db["db"], fresh_demo_db["config"]),
        ("hostile", hostile_db, None),
    ):
        target = tmp_path / f"{name}.html"
        args = ["--db", str(db)] + (["--config", str(config)] if config else [])
        code, _, err = run_cli(
            *args, "report", "weekly", "--week", "2026-W47", "--output", str(target), env=PINNED
        )
        assert code == 0, err
        pages[name] = target
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
            ],
        )
        try:
            for name, target in pages.items():
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                errors, requests, dialogs = [], [], []
                page.on(
                    "console",
                    lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None,
                )
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.on("request", lambda r, requests=requests: requests.append(r.url))
                page.on(
                    "dialog", lambda d, dialogs=dialogs: (dialogs.append(d.message), d.dismiss())
                )
                page.goto(target.as_uri())
                page.wait_for_load_state("load")
                assert errors == [], errors
                assert requests == [target.as_uri()]
                assert dialogs == []
                assert page.evaluate("document.documentElement.classList.contains('js')")
                page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
                if name == "weekly":
                    # a lead reads the first screen: the first action is on it
                    page.set_viewport_size({"width": 1400, "height": 900})
                    page.evaluate("window.scrollTo(0, 0)")
                    first = page.eval_on_selector(
                        "ol.actions li", "li => li.getBoundingClientRect().bottom"
                    )
                    assert 0 < first <= 900, first
                    page.screenshot(path=str(ARTIFACTS / "weekly-first-screen.png"))
                    assert "Release idle reserved" in page.inner_text("ol.actions li")
                    page.click("ol.actions li a")
                    assert page.evaluate("location.hash").startswith("#f-")

                    def column(index, page=page):
                        return page.eval_on_selector_all(
                            f"#findings tbody tr td:nth-child({index})",
                            "cells => cells.map(c => c.dataset.sort)",
                        )

                    page.click("#findings th:nth-child(5) button")
                    ascending = [float(v) for v in column(5)]
                    assert ascending == sorted(ascending)
                    page.click("#findings th:nth-child(5) button")
                    descending = [float(v) for v in column(5)]
                    assert descending == sorted(descending, reverse=True)
                    page.select_option("#severity", "critical")
                    visible = page.eval_on_selector_all(
                        "#findings tbody tr", "rows => rows.filter(r => !r.hidden).length"
                    )
                    assert visible == 2  # REG002 (a registered model) and RED001
                    page.select_option("#severity", "")
                    # the method matrix draws its scatters, the STB finding its series
                    for selector, count in (
                        ("section[aria-labelledby=h-matrix] figure svg", 2),
                        ("#findings figure.inline-chart svg", 1),
                    ):
                        boxes = page.eval_on_selector_all(
                            selector,
                            "svgs => svgs.map(s => [s.getBoundingClientRect().width,"
                            " s.getBoundingClientRect().height])",
                        )
                        assert len(boxes) == count and all(w > 100 and h > 50 for w, h in boxes)
                    queue = page.inner_text("section[aria-labelledby=h-queue]")
                    assert "never added to waste" in queue and "coder" in queue
                    # the recommendation: one row group per base model and distance, the
                    # favoured method marked, inside the page's width
                    rec = "section[aria-labelledby=h-recommendation]"
                    groups = page.eval_on_selector_all(
                        f"{rec} th.group", "ths => ths.map(t => t.innerText)"
                    )
                    assert groups == [
                        "llama3.1-8b · near (≤ 1.26): codeedit-v3, edit-pairs",
                        "llama3.1-8b · mid (1.26–2.1): gsm8k-cot",
                        "llama3.1-8b · far (> 2.1): toolcalls-v1",
                        "qwen2.5-7b · all distances: codeedit-v3",
                    ]
                    favoured = page.eval_on_selector_all(
                        f"{rec} tr.favoured th", "ths => ths.map(t => t.innerText)"
                    )
                    assert favoured == ["sft ✓", "rl ✓"]
                    assert "llama3.1-8b · sft: ρ = -" in page.inner_text(rec)
                    width, page_width = page.eval_on_selector(
                        f"{rec} table",
                        "t => [t.getBoundingClientRect().right,"
                        " document.documentElement.clientWidth]",
                    )
                    assert 0 < width <= page_width
                    assert "not enough history" in page.inner_text(rec)
                    costs = page.inner_text("section[aria-labelledby=h-costs]")
                    assert "evaluation" in costs and "EVL001" in costs
                else:
                    body = page.inner_text("body")
                    assert "<script>alert(1)</script>" in body  # shown as text
                    assert (
                        page.evaluate("document.querySelectorAll('img, svg[onload]').length") == 0
                    )
                page.close()
        finally:
            browser.close()
    shutil.copy(pages["weekly"], ARTIFACTS / "weekly.html")


def test_ten_thousand_findings_stay_small():
    from datetime import datetime

    from audit.reports.render import render_html

    finding = {
        "id": "x",
        "rule": "OVP001",
        "name": "idle-allocated-gpus",
        "severity": "high",
        "subject": {"job_id": "1"},
        "message": "m" * 120,
        "evidence": {"formula": "f" * 200, "per_gpu": list(range(8))},
        "waste": {"gpu_hours": 1.0, "usd": 3.0, "bytes": 0},
        "recommendation": "r" * 80,
        "suppressed": False,
    }
    families = [
        {"family": k, "label": k, "findings": 1, "gpu_hours": 1.0, "usd": 1.0, "bytes": 0}
        for k in ("DUP", "OVP")
    ]
    report = {
        "kind": "scan",
        "title": "t",
        "window": {"label": "w", "since": None, "until": None, "timezone": "UTC"},
        "generated_at": datetime(2026, 11, 30),
        "scan_id": 1,
        "links": {},
        "rules": [],
        "summary": {
            "families": families,
            "by_team": {},
            "findings": 10_000,
            "listed": 10_000,
            "immaterial": [],
            "actions": [],
        },
        "findings": [{**finding, "id": str(i)} for i in range(10_000)],
        "headline": {
            "gpu_hours": 1,
            "usd_spent": 1,
            "usd_wasted": 1,
            "waste_share": 1,
            "gpu_hours_wasted": 1,
            "unallocated_usd": 0,
            "unallocated_gpu_hours": 0,
            "reclaimable_gb": 0,
            "storage_usd_month": 0,
            "findings": 10_000,
            "listed": 10_000,
            "formulas": [],
        },
        "methods": {"by_method": [], "points": []},
        "categories": [],
        "coverage": {
            "sources": [],
            "runs": 0,
            "first_run": None,
            "last_run": None,
            "file_imports": [],
            "cluster": {
                k: 0
                for k in (
                    "jobs",
                    "gpu_jobs",
                    "samples",
                    "hosts",
                    "attached",
                    "unattached",
                    "ambiguous",
                    "checkpoints",
                    "runs_with_job",
                    "runs",
                    "gpu_jobs_with_telemetry",
                    "checkpoints_with_run",
                )
            },
        },
    }
    html = render_html(report)
    assert len(html.encode()) < 2_000_000
    assert "9800 more findings are not shown here" in html

"""What the tool concludes from the part of the picture a team really has (issue 15).

The real PyCaret store alone, the real sacct file alone, the sample week with and without
telemetry, metric names the defaults do not expect, and one attribution for spend and waste.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from datetime import datetime, timedelta

import duckdb
import polars as pl
import pytest

from audit.config import load_config
from audit.importers.params import normalised_params
from audit.warehouse import open_warehouse
from audit.warehouse.frames import insert_frame
from audit.warehouse.samples import delete_samples
from tests.helpers import SHARED

PYCARET = SHARED / "mlflow" / "pycaret-tutorial-mlruns.tar.gz"
SACCT = SHARED / "slurm" / "hb-jobinfo_sacct.txt"
SACCT_FIELDS = (
    "JobID,JobName,User,Partition,NodeList,NNodes,NCPUs,NTasks,State,Submit,Start,End,"
    "Timelimit,Elapsed,TotalCPU,CPUTime,UserCPU,SystemCPU,ReqMem,MaxRSS,MaxVMSize,ReqTRES,"
    "AllocTRES,TRESUsageInMax,TRESUsageInTot,TRESUsageOutTot,MaxDiskRead,MaxDiskWrite,"
    "MaxRSSNode,MaxRSSTask,MaxVMSizeNode,MaxVMSizeTask,MaxDiskReadNode,MaxDiskReadTask,"
    "MaxDiskWriteNode,MaxDiskWriteTask,Comment"
)


def scan_doc(run_cli, db, *args) -> dict:
    code, out, err = run_cli("--db", str(db), *args, "scan", "--format", "json")
    assert code == 0, err
    return json.loads(out)


def rule_result(doc: dict, code: str) -> dict:
    return next(r for r in doc["scan"]["rules"] if r["rule"] == code)


@pytest.mark.skipif(not PYCARET.exists(), reason=f"{PYCARET} not present")
def test_mlflow_only_pycaret_store_yields_grouped_duplicates_with_unknown_cost(run_cli, tmp_path):
    with tarfile.open(PYCARET) as tar:
        tar.extractall(tmp_path, filter="data")
    db = tmp_path / "w.duckdb"
    assert (
        run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(tmp_path / "mlruns"))[0]
        == 0
    )
    doc = scan_doc(run_cli, db)
    duplicates = [f for f in doc["findings"] if f["rule"] == "DUP001"]
    # one notebook (ipykernel_launcher.py) re-run 19 times, repeating 21 configurations: one
    # behaviour, one finding (was 21 medium findings, one per model; was 0 before that)
    (habit,) = duplicates
    assert habit["subject"] == {
        "entry_point": "/Users/amol/opt/anaconda3/lib/python3.7/site-packages/ipykernel_launcher.py",
        "user": "amol",
    }
    configurations = habit["evidence"]["configurations"]
    assert len(configurations) == 21
    repeats = len(habit["evidence"]["repeat_runs"])
    assert repeats == sum(c["repeats"] for c in configurations) > 10 * len(configurations)
    assert habit["waste"]["gpu_hours"] is None and habit["waste"]["usd"] is None
    assert 0 < habit["waste"]["run_hours"] < 0.05  # seconds each: CPU runs of a notebook
    assert habit["cost_basis"] == "GPU count unknown"
    # under every materiality floor: summed, not listed, and never medium or above
    assert habit["material"] is False and habit["severity"] == "info"
    assert doc["summary"]["immaterial"] == [
        {
            "rule": "DUP001",
            "team": "amol",
            "findings": 1,
            "gpu_hours": 0,
            "usd": 0,
            "run_hours": round(habit["waste"]["run_hours"], 3),
            "bytes": 0,
            "risk_gpu_hours": 0,
        }
    ]
    gbr = next(c for c in configurations if c["original"]["name"] == "Gradient Boosting Regressor")
    assert (gbr["repeats"], gbr["launches"]) == (19, 19)  # two runs 2.5 min apart: one launch
    assert doc["summary"]["waste"]["unknown_cost"] == 1
    assert doc["summary"]["spend"]["runs_without_cost"] == 416
    # scikit-learn models of a notebook are no training runs to evaluate: REG001 is silent
    reg001 = rule_result(doc, "REG001")
    assert (reg001["status"], reg001["findings"]) == ("ok", 0)
    _code, out, _ = run_cli("--db", str(db), "scan")
    assert "DUP001 (team amol): 1 findings" in out
    assert "spend excludes 416 runs with an unknown GPU count" in out


# Every GPU job of the real sacct file with the verdict Job Defense Shield's thresholds give
# from its TRESUsageInMax gres/gpuutil and gres/gpumem (no telemetry imported).
SACCT_VERDICTS = {
    "7939708": ("too short", set()),  # 1 A100, 4 s, FAILED
    "7946767": ("busy enough or unknown", set()),  # 1 V100, 11.4 h, max 54 %
    "7961058": ("zero utilisation", {"IDL002", "OVP004"}),  # 2 A100, 40 min at 0 %, 0 memory
    "7965768": ("busy", set()),  # 1 V100, 15.5 h, max 90 %
    "7971484": ("too short", set()),  # 4 A100 on 2 nodes, 3.9 min
    # 1 V100, 8.8 h, max 12 %, 2.4 GB: priced once, by OVP002, to a 1/6 share of the card
    "8069225": ("low efficiency", {"OVP002"}),
    "8150389": ("busy; idle GPUs need per-GPU data", set()),  # 2 A100, 69 h, max 100 %
    "8202099": ("running, no usage recorded yet", set()),
    "8298012": ("running, no usage recorded yet", set()),
}


@pytest.mark.skipif(not SACCT.exists(), reason=f"{SACCT} not present")
def test_slurm_only_real_sacct_judges_gpu_jobs_from_tres_usage(run_cli, tmp_path):
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli(
        "--db", str(db), "ingest", "slurm", "--fields", SACCT_FIELDS, "--delimiter", "☃", str(SACCT)
    )
    assert code == 0, err
    con = duckdb.connect(str(db), read_only=True)
    gpu_jobs = {r[0] for r in con.execute("SELECT job_id FROM jobs WHERE gpus > 0").fetchall()}
    con.close()
    assert gpu_jobs == set(SACCT_VERDICTS)
    doc = scan_doc(run_cli, db)
    flagged: dict[str, set[str]] = {}
    for finding in doc["findings"]:
        # per team: queue wait (tests/rules/test_realdata_issue17.py)
        if finding["rule"] == "QUE001":
            continue
        flagged.setdefault(finding["subject"]["job_id"], set()).add(finding["rule"])
    got = {job: flagged.get(job, set()) for job in SACCT_VERDICTS}
    assert got == {job: rules for job, (_, rules) in SACCT_VERDICTS.items()}
    idle = next(f for f in doc["findings"] if f["rule"] == "IDL002")
    assert idle["waste"]["gpu_hours"] == pytest.approx(2 * 2415 / 3600, abs=0.001)
    assert idle["evidence"]["usage_source"] == "sacct TRESUsageInMax gres/gpuutil and gres/gpumem"
    assert "no task above 0 % utilisation and 0 MiB of GPU memory" in idle["message"]
    low = next(f for f in doc["findings"] if f["rule"] == "OVP002")
    # not 88 % of the V100's hours: the difference to a 1/6 share of the card, which would
    # have held 2.4 GB (x 1.2) at 12 % (x 6 = 72 % <= 80 %): 8.76 h x (0.55 - 0.55/6) / 0.55
    assert low["waste"]["gpu_hours"] == pytest.approx(31549 / 3600 * 5 / 6, abs=0.001)
    assert low["waste"]["usd"] == pytest.approx(31549 / 3600 * 0.55 * 5 / 6, abs=0.01)
    assert "a lower bound" in low["evidence"]["formula"]
    notes = rule_result(doc, "OVP001")["notes"]
    assert any(n.startswith("job 8150389: 2 GPUs, but the sacct") for n in notes)
    assert any(n.startswith("job 8202099: no GPU usage evidence") for n in notes)
    assert rule_result(doc, "IDL001")["status"] == "skipped"  # a tail needs time-resolved data


def _verdicts(doc: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in doc["findings"]:
        if f["rule"] in ("OVP001", "OVP002", "OVP003", "IDL002"):
            out.setdefault(f["subject"]["job_id"], set()).add(f["rule"])
    return out


def test_telemetry_and_sacct_verdicts_agree_on_the_sample_week(run_cli, demo_db, tmp_path):
    with_telemetry = _verdicts(scan_doc(run_cli, demo_db["db"], "--config", str(demo_db["config"])))
    db = tmp_path / "sacct-only.duckdb"
    shutil.copy(demo_db["db"], db)
    con = duckdb.connect(str(db))
    delete_samples(con, "true")
    con.close()
    doc = scan_doc(run_cli, db, "--config", str(demo_db["config"]))
    from_sacct = _verdicts(doc)
    assert with_telemetry == {"4700112": {"OVP001"}, "4700199": {"IDL002"}}
    # sacct judges the idle session the same way; the job with one busy GPU of eight needs
    # per-GPU data, so sacct gives a note there, never a contradicting finding
    assert from_sacct == {"4700199": {"IDL002"}}
    # 4700112 is one of the multi-GPU jobs with only sacct's one figure for all GPUs; more
    # than ten of them share that reason, so they are one note with their count
    con = duckdb.connect(str(db), read_only=True)
    one_figure = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE job_id = '4700112') FROM jobs "
        "WHERE gpus >= 2 AND elapsed_s >= 1800 AND max_gpu_util_pct IS NOT NULL"
    ).fetchall()[0]
    con.close()
    assert one_figure[1] == 1 and one_figure[0] > 10
    notes = rule_result(doc, "OVP001")["notes"]
    assert notes[0].startswith(
        f"{one_figure[0]} jobs: the sacct TRESUsageInMax gres/gpuutil and gres/gpumem give one "
        "figure for all of their GPUs"
    )


def _wide_store(path, runs: int, metric: str) -> None:
    """A warehouse of ``runs`` finished SFT runs that log their general benchmark as ``metric``."""
    wh = open_warehouse(path)
    start = datetime(2026, 11, 16)
    ids = [f"r{i:05d}" for i in range(runs)]
    insert_frame(
        wh.con,
        "runs",
        pl.DataFrame(
            {
                "source_id": ["s"] * runs,
                "run_id": ids,
                "experiment_id": ["1"] * runs,
                "name": ids,
                "user_id": ["ann"] * runs,
                "status": ["FINISHED"] * runs,
                "start_time": [start + timedelta(minutes=i) for i in range(runs)],
                "end_time": [start + timedelta(minutes=i, hours=2) for i in range(runs)],
                "lifecycle_stage": ["active"] * runs,
            }
        ),
    )
    insert_frame(
        wh.con,
        "params",
        normalised_params(
            pl.DataFrame({"run_id": ids, "key": ["method"] * runs, "value": ["sft"] * runs})
        ).with_columns(source_id=pl.lit("s")),
    )
    latest = pl.DataFrame(
        {
            "source_id": ["s"] * runs,
            "run_id": ids,
            "key": [metric] * runs,
            "value": [0.5] * runs,
            "step": [100] * runs,
            "ts": [start + timedelta(hours=3)] * runs,
        }
    )
    insert_frame(wh.con, "latest_metrics", latest)
    insert_frame(wh.con, "metrics", latest)
    wh.close()


def test_metric_names_the_globs_do_not_match_are_one_notice_not_a_flood(run_cli, tmp_path):
    db = tmp_path / "w.duckdb"
    _wide_store(db, 30_000, "eval_general")
    doc = scan_doc(run_cli, db)
    reg001 = rule_result(doc, "REG001")
    # the rule never switches itself off: the 30,000 unmonitored runs are one finding per
    # team and week (not one per run), and one note names what looks like a general benchmark
    assert reg001["status"] == "ok" and reg001["findings"] <= 4
    assert reg001["notes"] == [
        "no evaluation of a general-ability task anywhere; metric names that look like general "
        "benchmarks here: eval_general (30000 runs): set [metrics] general or [evaluations] "
        "general_tasks to match them"
    ]
    config = tmp_path / "audit.toml"
    config.write_text('[metrics]\ngeneral = ["eval_general"]\n')
    doc = scan_doc(run_cli, db, "--config", str(config))
    assert rule_result(doc, "REG001") | {"notes": []} == {
        "rule": "REG001",
        "status": "ok",
        "reason": None,
        "findings": 0,
        "notes": [],
    }


def test_spend_and_waste_of_a_job_go_to_the_same_team(tmp_path):
    """A job under account lab whose run is tagged team=coder: spend and OVP001 waste are
    both coder's; a job without a run is the account's."""
    from audit.rule_registry import select_rules
    from audit.scans import scan
    from audit.summary import summarise
    from audit.testing import build_warehouse
    from audit.windows import Window

    wh, config = build_warehouse(
        tmp_path / "w.duckdb",
        {
            "runs": [
                {
                    "run_id": "a",
                    "start": 0,
                    "end": 5,
                    "params": {"method": "opd"},
                    "tags": {"slurm_job_id": 1, "team": "coder"},
                },
            ],
            "jobs": [
                {"job_id": 1, "gpus": 8, "start": 0, "end": 5, "account": "lab"},
                {"job_id": 2, "gpus": 2, "start": 10, "end": 16, "account": "lab", "host": "n2"},
            ],
            "telemetry": [
                {"start": 0, "end": 5, "util": {0: 93, "default": 0}},
                {"start": 10, "end": 16, "host": "n2", "gpus": 2, "util": {"default": 0}},
            ],
        },
    )
    try:
        shared: dict = {}
        result = scan(wh, config, select_rules("OVP001,IDL002"), Window(), shared)
        summary = summarise(result, wh.con, config, shared)
    finally:
        wh.close()
    teams = {f.rule: f.team for f in result.active}
    assert teams == {"OVP001": "coder", "IDL002": "lab"}
    assert summary["by_team"]["coder"]["gpu_hours"] == pytest.approx(40.0)
    assert summary["by_team"]["coder"]["waste_gpu_hours"] == pytest.approx(35.0)
    assert summary["by_team"]["lab"]["gpu_hours"] == pytest.approx(12.0)
    assert summary["by_team"]["lab"]["waste_gpu_hours"] == pytest.approx(12.0)
    assert load_config(None).values["attribution"]["team_order"] == ["tag", "account", "user"]


def test_team_order_is_configurable_and_validated(tmp_path):
    from audit.errors import InputError

    config = tmp_path / "audit.toml"
    config.write_text('[attribution]\nteam_order = ["account", "user"]\n')
    assert load_config(config).values["attribution"]["team_order"] == ["account", "user"]
    config.write_text('[attribution]\nteam_order = ["account", "cluster"]\n')
    with pytest.raises(
        InputError, match=r"team_order takes tag, account, user in the order to try"
    ):
        load_config(config)

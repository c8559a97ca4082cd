"""A machine's GPU list is not a run's allocation: the verl runs in ../shared/realdata.

Two verl runs on one 8×A800 machine (wandb/verl-agentic-rl). Each used 4 GPUs: the RL
run's config says ``trainer.n_gpus_per_node=4``; the SFT run's config keeps verl's default
``n_gpus_per_node: 8`` but its console log saves ``model_world_size_4_rank_0.pt``. GPUs
4–7 ran at 80–92 %; GPUs 0–1 held ~81 % of their memory at 0 % in both runs, 12 hours
apart (another tenant's process); GPUs 2–3 stayed empty. W&B's system metrics list all
eight. Before the fix both runs were priced on 8 GPUs and got OVP001 "used 4 of 8".
"""

from __future__ import annotations

import json

import pytest

from audit.config import load_config
from audit.costs import Facts
from audit.warehouse import open_warehouse
from tests.helpers import SHARED

VERL = SHARED / "wandb" / "verl-agentic-rl"

pytestmark = pytest.mark.skipif(
    not VERL.exists(), reason="../shared/realdata is absent (real files from other projects)"
)


@pytest.fixture(scope="module")
def verl(tmp_path_factory):
    from click.testing import CliRunner

    from audit.cli import cli

    db = tmp_path_factory.mktemp("verl") / "w.duckdb"
    result = CliRunner().invoke(cli, ["--db", str(db), "ingest", "wandb", str(VERL)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["--db", str(db), "scan", "--format", "json"])
    assert result.exit_code == 0, result.output
    return db, json.loads(result.stdout)


def test_both_runs_are_priced_on_the_four_gpus_they_used(verl):
    db, _ = verl
    with open_warehouse(db, read_only=True) as wh:
        facts = Facts.load(wh.con, load_config(None))
    runs = {r.run_id: r for r in facts.runs}
    rl, sft = runs["gjvwlq13"], runs["dq9a4cex"]
    assert (rl.cost.rung, rl.cost.gpus) == ("params", 4.0)
    assert rl.cost.source == "param trainer.n_gpus_per_node*trainer.nnodes"
    assert (sft.cost.rung, sft.cost.gpus) == ("world_size", 4.0)
    assert rl.sampled_gpus == sft.sampled_gpus == 8  # the machine's list
    # the run's own hours: 4 GPUs × wall clock, not 8
    assert rl.cost.gpu_hours == pytest.approx(4 * rl.run_hours)
    assert sft.cost.gpu_hours == pytest.approx(4 * sft.run_hours)


def test_the_world_size_comes_from_the_console_log_with_its_evidence(verl):
    db, _ = verl
    with open_warehouse(db, read_only=True) as wh:
        tags = dict(
            wh.con.execute(
                "SELECT key, value FROM tags WHERE run_id = 'dq9a4cex' AND key LIKE '%gpu_count' "
                "OR run_id = 'dq9a4cex' AND key LIKE 'audit.world_size%'"
            ).fetchall()
        )
    assert tags["audit.world_size"] == "4"
    assert "world_size_4_rank_0" in tags["audit.world_size.evidence"]
    assert tags["host.gpu_count"] == "8"  # the machine's, under a name that says so
    assert "gpu_count" not in tags


def test_no_unused_gpu_finding_and_attribution_gaps_on_four_gpus(verl):
    _, scan = verl
    rules = [f["rule"] for f in scan["findings"]]
    assert "OVP001" not in rules
    gaps = {f["subject"].get("experiment"): f for f in scan["findings"] if f["rule"] == "SRC001"}
    # 4 GPUs × 2.25 h and 4 × 0.52 h (18.0 and 4.1 on the machine's 8)
    assert "9.0 GPU-h cannot be attributed" in gaps["retool_opd"]["message"]
    assert "2.1 GPU-h cannot be attributed" in gaps["tir-sft"]["message"]

"""The shift measure read from each framework's own names: the real verl, TRL and
LLaMA-Factory runs of ../shared/realdata (imported through the CLI, as a user would), a
TensorBoard log written by a real writer, and the rank correlation behind the matrix."""

from __future__ import annotations

import json

import pytest

from audit.config import load_config
from audit.costs import Facts
from audit.facts.shift import Shifts, spearman
from audit.recipes import Recipes
from audit.warehouse import open_warehouse
from tests.helpers import SHARED

needs_realdata = pytest.mark.skipif(
    not SHARED.exists(), reason="../shared/realdata is absent (real files from other projects)"
)


def shifts_by_run(db) -> dict[str, object]:
    """Each run's shift (None when unmeasured), by run name."""
    config = load_config(None)
    with open_warehouse(db, read_only=True) as wh:
        facts = Facts.load(wh.con, config)
        shifts = Shifts(wh.con, config, facts, Recipes.load(wh.con, config, facts))
        return {run.name: shifts.of(run) for run in facts.runs}


# (data set, ingest command, run name, kind, metric, value, step of the value's point)
CASES = [
    # verl's SFT trainer: the first train/loss, logged at step 1
    (
        "wandb/verl-agentic-rl",
        ["wandb"],
        "multiturn-sft-qwen-2.5-3b-instruct",
        "base_loss",
        "train/loss",
        0.9203,
        1,
    ),
    # verl's on-policy distillation: the KL penalty to the reference policy, averaged over
    # the run (actor/ppo_kl, one update's step, is not a distance from the reference)
    (
        "wandb/verl-agentic-rl",
        ["wandb"],
        "qwen2_3b_opd",
        "kl",
        "actor/reward_kl_penalty",
        1.1154,
        1,
    ),
    # TRL's GRPOTrainer through W&B: train/kl
    (
        "wandb/trl-grpo-unsloth-chaos-economy",
        ["wandb"],
        "vsr-50steps-30ep",
        "kl",
        "train/kl",
        0.00599,
        50,
    ),
    # TRL's GRPOTrainer through trainer_state.json: kl in log_history
    (
        "hf-trainer/trl-grpo-chaos-economy",
        ["trainer-logs"],
        "trl-grpo-chaos-economy",
        "kl",
        "kl",
        0.02617,
        5,
    ),
    # LLaMA-Factory SFT: the first loss of trainer_log.jsonl, logged after 10 steps (the
    # mean of that interval, its step shown)
    (
        "llamafactory/sft-mistral7b-translator",
        ["trainer-logs"],
        "sft-mistral7b-translator",
        "base_loss",
        "loss",
        2.4977,
        10,
    ),
]


@needs_realdata
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}:{c[2]}")
def test_shift_read_from_each_framework(case, tmp_path, run_cli):
    dataset, command, name, kind, metric, value, step = case
    db = tmp_path / "a.duckdb"
    code, _out, err = run_cli("--db", str(db), "ingest", *command, str(SHARED / dataset))
    assert code == 0, err
    shift = shifts_by_run(db)[name]
    assert shift is not None, f"{name}: no shift measured"
    assert (shift.kind, shift.metric, shift.first_step) == (kind, metric, step)
    assert shift.value == pytest.approx(value, abs=5e-5)


@needs_realdata
def test_a_reward_model_run_is_not_measured(tmp_path, run_cli):
    """The 360 fork's run logs a pairwise loss with `accuracy`: a reward model's loss starts
    near ln 2 whatever the data, so it says nothing about the distance of the data."""
    db = tmp_path / "a.duckdb"
    folder = SHARED / "llamafactory" / "trainer-log-360-llamafactory-fork"
    assert run_cli("--db", str(db), "ingest", "trainer-logs", str(folder))[0] == 0
    assert set(shifts_by_run(db).values()) == {None}


@needs_realdata
def test_runs_similar_shows_the_shift_beside_the_evaluations(tmp_path, run_cli):
    db = tmp_path / "a.duckdb"
    folder = SHARED / "wandb" / "verl-agentic-rl"
    assert run_cli("--db", str(db), "ingest", "wandb", str(folder))[0] == 0
    code, out, err = run_cli(
        "--db", str(db), "runs", "similar", "--run", "dq9a4cex", "--format", "json"
    )
    assert code == 0, err
    shown = {r["run_name"]: r["shift"] for r in json.loads(out)["neighbours"]}
    assert (
        shown["qwen2_3b_opd"] == "mean actor/reward_kl_penalty 1.12 over 58 points, 1.99 at the end"
    )


def test_tensorboard_sft_run_measured_from_its_first_loss(tmp_path, run_cli):
    tbx = pytest.importorskip("tensorboardX")
    writer = tbx.SummaryWriter(str(tmp_path / "logs" / "sft-far"))
    for step in range(0, 200, 10):
        writer.add_scalar("train/loss", 3.1 * 0.99**step + 0.2, step)
    writer.close()
    db = tmp_path / "a.duckdb"
    code, _out, err = run_cli("--db", str(db), "ingest", "tensorboard", str(tmp_path / "logs"))
    assert code == 0, err
    shift = shifts_by_run(db)["sft-far"]
    assert (shift.kind, shift.metric, shift.first_step) == ("base_loss", "train/loss", 0)
    assert shift.value == pytest.approx(3.3, rel=1e-6)
    assert shift.fall == pytest.approx(3.3 - (3.1 * 0.99**190 + 0.2), rel=1e-5)


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ([(1, 3), (2, 2), (3, 1)], -1.0),
        ([(1, 1), (2, 2), (3, 2)], 0.8660254),  # a tie takes the mean of its ranks
        ([(1.0, 0.1), (1.0, 0.2), (2.0, 0.0), (3.0, -0.1)], -0.9486833),
        ([(1, 1), (1, 2), (1, 3)], None),  # one distance: nothing to rank
        ([(1, 1), (2, 2)], None),  # under three runs
    ],
)
def test_rank_correlation(pairs, expected):
    rho = spearman(pairs)
    assert rho == (None if expected is None else pytest.approx(expected, abs=1e-6))

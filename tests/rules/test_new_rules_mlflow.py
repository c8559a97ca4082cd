"""Issue 17's rules on runs logged with the real MLflow client through a real server.

One tracking server holds, per rule, a run that must be flagged and a matching run that
must not; STB001 sees the metric names TRL (HF Trainer's MLflow callback), verl and
OpenRLHF (W&B-style ``train/`` prefix) log. Queue wait comes from a real sacct export read
by the Slurm importer. Every rule is then run alone (``scan --select``) over the warehouse.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers import mlflow_server

T0 = 1_794_787_200_000  # 2026-11-16T00:00:00Z
HOUR = 3_600_000


def _series(key: str, steps: range, start_h: float, hours: float, value) -> list:
    from mlflow.entities import Metric

    first, last = steps[0], steps[-1]
    return [
        Metric(
            key,
            float(value(step)),
            T0 + int((start_h + hours * (step - first) / (last - first)) * HOUR),
            step,
        )
        for step in steps
    ]


def _run(
    client, experiment, name, start_h, hours, params, metrics=(), tags=None, status="FINISHED"
):
    from mlflow.entities import Param

    run = client.create_run(
        experiment, start_time=T0 + int(start_h * HOUR), run_name=name, tags=tags or {}
    )
    run_id = run.info.run_id
    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
    metrics = list(metrics)
    for i in range(0, len(metrics), 900):
        client.log_batch(run_id, metrics=metrics[i : i + 900])
    client.set_terminated(run_id, status, end_time=T0 + int((start_h + hours) * HOUR))
    return run_id


def _log_everything(url: str) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=url)
    steps = range(0, 1001, 20)
    exp = client.create_experiment("stability")
    # TRL GRPO through HF Trainer's MLflow callback: kl, reward, entropy without a prefix
    _run(
        client,
        exp,
        "trl-kl-blowup",
        1,
        10,
        {"method": "rl", "num_gpus": 8},
        [
            *_series("kl", steps, 1, 10, lambda s: 0.01 if s < 400 else 1.5),
            *_series("reward", steps, 1, 10, lambda s: 0.2 + s / 5000),
            *_series("entropy", steps, 1, 10, lambda s: 1.0 - s / 5000),
        ],
    )
    _run(
        client,
        exp,
        "trl-healthy",
        1,
        10,
        {"method": "rl", "num_gpus": 8},
        [
            *_series("kl", steps, 1, 10, lambda s: 0.002 + 0.04 * math.sqrt(s / 1000)),
            *_series("reward", steps, 1, 10, lambda s: 0.2 + s / 5000),
            *_series("entropy", steps, 1, 10, lambda s: 1.0 - s / 5000),
            *_series("completions/clipped_ratio", steps, 1, 10, lambda s: 0.02),
        ],
    )
    # verl: actor/* and critic/score/mean; GPUs from trainer.n_gpus_per_node × trainer.nnodes
    verl = {"trainer.n_gpus_per_node": 8, "trainer.nnodes": 1}
    _run(
        client,
        exp,
        "verl-entropy-collapse",
        12,
        10,
        verl,
        [
            *_series("actor/entropy", steps, 12, 10, lambda s: 0.8 if s < 300 else 0.02),
            *_series("actor/ppo_kl", steps, 12, 10, lambda s: 0.001),
            *_series("critic/score/mean", steps, 12, 10, lambda s: -0.6 + s / 5000),
            *_series("response_length/clip_ratio", steps, 12, 10, lambda s: 0.01),
        ],
        tags={"method": "rl"},
    )
    _run(
        client,
        exp,
        "verl-healthy",
        12,
        10,
        verl,
        [
            *_series("actor/entropy", steps, 12, 10, lambda s: 0.8 - s / 5000),
            *_series("actor/ppo_kl", steps, 12, 10, lambda s: 0.001),
            *_series("critic/score/mean", steps, 12, 10, lambda s: -0.6 + s / 5000),
            *_series("response_length/clip_ratio", steps, 12, 10, lambda s: 0.01),
        ],
        tags={"method": "rl"},
    )
    # OpenRLHF through its W&B-style train/ names
    _run(
        client,
        exp,
        "openrlhf-reward-collapse",
        23,
        10,
        {"method": "rl", "num_gpus": 8},
        [
            *_series(
                "train/reward",
                steps,
                23,
                10,
                lambda s: min(0.1 + s / 500, 0.6) if s < 600 else -0.5,
            ),
            *_series("train/kl", steps, 23, 10, lambda s: 0.002),
            *_series("train/ppo_clip_ratio", steps, 23, 10, lambda s: 0.05),
        ],
    )
    _run(
        client,
        exp,
        "openrlhf-healthy",
        23,
        10,
        {"method": "rl", "num_gpus": 8},
        [
            *_series("train/reward", steps, 23, 10, lambda s: min(0.1 + s / 500, 0.6)),
            *_series("train/kl", steps, 23, 10, lambda s: 0.002),
            *_series("train/ppo_clip_ratio", steps, 23, 10, lambda s: 0.05),
        ],
    )

    exp = client.create_experiment("pilots")
    big = {"method": "rl", "base_model": "l8", "num_gpus": 32}
    _run(client, exp, "pil-first-launch", 40, 10, {**big, "dataset": "tools"}, status="FAILED")
    _run(client, exp, "pil-pilot", 40, 1, {**big, "dataset": "code", "num_gpus": 8})
    _run(client, exp, "pil-piloted-launch", 42, 10, {**big, "dataset": "code"}, status="FAILED")

    exp = client.create_experiment("red-lines")
    benchmarks = range(0, 1501, 500)
    _run(
        client,
        exp,
        "base-q7-eval",
        50,
        0.5,
        {"method": "eval", "base_model": "q7"},
        [
            *_series("eval/safety/refusal", range(0, 2), 50, 0.5, lambda s: 0.95),
            *_series("eval/general/mmlu", range(0, 2), 50, 0.5, lambda s: 0.70),
            *_series("eval/general/gsm8k", range(0, 2), 50, 0.5, lambda s: 0.60),
            *_series("eval/target/pass", range(0, 2), 50, 0.5, lambda s: 0.30),
        ],
        tags={"audit.baseline": "true"},
    )
    _run(
        client,
        exp,
        "red-drop",
        51,
        6,
        {"method": "sft", "base_model": "q7", "num_gpus": 4},
        [
            *_series("eval/safety/refusal", benchmarks, 51, 6, lambda s: 0.95 - s / 30000),
            *_series("eval/general/mmlu", benchmarks, 51, 6, lambda s: 0.70),
            *_series("eval/general/gsm8k", benchmarks, 51, 6, lambda s: 0.60),
        ],
    )
    _run(
        client,
        exp,
        "red-held",
        51,
        6,
        {"method": "sft", "base_model": "q7", "num_gpus": 4},
        [
            *_series("eval/safety/refusal", benchmarks, 51, 6, lambda s: 0.95 + s / 100000),
            *_series("eval/general/mmlu", benchmarks, 51, 6, lambda s: 0.70),
            *_series("eval/general/gsm8k", benchmarks, 51, 6, lambda s: 0.60),
        ],
    )

    exp = client.create_experiment("evaluations")
    suite = lambda h: [  # noqa: E731
        *_series("eval/general/mmlu", range(0, 2), h, 0.5, lambda s: 0.7),
        *_series("eval/general/gsm8k", range(0, 2), h, 0.5, lambda s: 0.6),
    ]
    _run(
        client,
        exp,
        "eval-ckpt",
        60,
        0.5,
        {"method": "eval", "checkpoint": "/ckpt/a/checkpoint-2000", "num_gpus": 8},
        suite(60),
    )
    _run(
        client,
        exp,
        "eval-ckpt-again",
        62,
        0.5,
        {"method": "eval", "checkpoint": "/ckpt/a/checkpoint-2000", "num_gpus": 8},
        suite(62),
    )
    _run(
        client,
        exp,
        "eval-other-ckpt",
        63,
        0.5,
        {"method": "eval", "checkpoint": "/ckpt/a/checkpoint-2500", "num_gpus": 8},
        suite(63),
    )
    _run(
        client,
        exp,
        "sft-narrow",
        64,
        3,
        {"method": "sft", "base_model": "q7"},
        _series("eval/general/mmlu", benchmarks, 64, 3, lambda s: 0.7),
    )
    _run(client, exp, "sft-broad", 64, 3, {"method": "sft", "base_model": "q7"}, suite(64))

    exp = client.create_experiment("attribution")
    _run(client, exp, "no-method", 70, 4, {"learning_rate": "1e-5", "num_gpus": 4})
    _run(
        client,
        exp,
        "opd-no-teacher",
        70,
        4,
        {"learning_rate": "1e-5", "method": "opd", "num_gpus": 8},
    )
    _run(
        client,
        exp,
        "opd-with-teacher",
        70,
        4,
        {"learning_rate": "1e-5", "method": "opd", "teacher": "q72"},
    )
    _run(client, exp, "sft-recorded", 70, 4, {"learning_rate": "1e-5", "method": "sft"})

    exp = client.create_experiment("matrix")
    outcome = lambda h, hours, general, target: [  # noqa: E731
        *_series("eval/general/mmlu", benchmarks, h, hours, lambda s: 0.70 + general * s / 1500),
        *_series("eval/target/pass", benchmarks, h, hours, lambda s: 0.30 + target * s / 1500),
    ]
    _run(
        client,
        exp,
        "base-m7-eval",
        80,
        0.5,
        {"method": "eval", "base_model": "m7"},
        outcome(80, 0.5, 0, 0),
        tags={"audit.baseline": "true"},
    )
    task = {"base_model": "m7", "num_gpus": 8, "dataset": "codeedit"}
    _run(
        client,
        exp,
        "mtx-sft-expensive",
        81,
        9,
        {**task, "method": "sft"},
        outcome(81, 9, -0.1, 0.10),
    )
    _run(
        client,
        exp,
        "mtx-opd-cheap",
        91,
        3,
        {**task, "method": "opd", "teacher": "q72"},
        outcome(91, 3, 0.0, 0.15),
    )
    _run(client, exp, "mtx-rl-best", 95, 12, {**task, "method": "rl"}, outcome(95, 12, 0.0, 0.20))


SACCT = """JobID|JobName|User|Account|Partition|State|Submit|Eligible|Start|End|ElapsedRaw|TimelimitRaw|NNodes|NCPUS|NodeList|AllocTRES
9001|train|carol|agents|gpu|COMPLETED|2026-11-16T00:00:00|2026-11-16T00:00:00|2026-11-17T02:00:00|2026-11-17T06:00:00|14400|600|1|96|g01|cpu=96,gres/gpu=8,node=1
9002|train|carol|agents|gpu|COMPLETED|2026-11-16T00:00:00|2026-11-17T01:00:00|2026-11-17T02:00:00|2026-11-17T06:00:00|14400|600|1|96|g02|cpu=96,gres/gpu=8,node=1
9003|sweep|alice|coder|gpu|COMPLETED|2026-11-16T00:00:00|2026-11-16T00:00:00|2026-11-16T00:10:00|2026-11-16T10:00:00|35400|600|1|96|g03|cpu=96,gres/gpu=8,node=1
"""


@pytest.fixture(scope="module")
def logged_runs_db(tmp_path_factory):
    """The runs above in a real server, imported with `audit ingest mlflow`; a sacct file too."""
    from click.testing import CliRunner

    from audit.cli import cli

    work = tmp_path_factory.mktemp("issue17")
    db = work / "w.duckdb"
    runner = CliRunner()
    with mlflow_server(work / "server") as (url, _backend):
        _log_everything(url)
        result = runner.invoke(cli, ["--db", str(db), "ingest", "mlflow", "--tracking-uri", url])
        assert result.exit_code == 0, result.output
    sacct = work / "week.sacct"
    sacct.write_text(SACCT)
    result = runner.invoke(cli, ["--db", str(db), "ingest", "slurm", str(sacct)])
    assert result.exit_code == 0, result.output
    return db


def _findings(run_cli, db, code):
    exit_code, out, err = run_cli("--db", str(db), "scan", "--select", code, "--format", "json")
    assert exit_code in (0, 1), err
    doc = json.loads(out)
    (result,) = doc["scan"]["rules"]
    assert result["status"] == "ok", result
    return doc["findings"]


def _names(findings) -> set[str]:
    return {f["subject"].get("run_name") for f in findings}


def test_stb001_flags_trl_verl_and_openrlhf_names_and_spares_healthy_runs(run_cli, logged_runs_db):
    found = {f["subject"]["run_name"]: f for f in _findings(run_cli, logged_runs_db, "STB001")}
    assert set(found) == {"trl-kl-blowup", "verl-entropy-collapse", "openrlhf-reward-collapse"}
    kl = found["trl-kl-blowup"]
    assert kl["evidence"]["signals"][0]["metric"] == "kl"
    assert kl["evidence"]["signals"][0]["onset_step"] == 400
    assert kl["waste"]["gpu_hours"] == pytest.approx(8 * (10 - 4 - 1), abs=0.01)
    entropy = found["verl-entropy-collapse"]
    assert entropy["evidence"]["signals"][0]["signal"] == "entropy collapse"
    assert "trainer.n_gpus_per_node*trainer.nnodes" in entropy["cost_basis"]
    assert entropy["waste"]["gpu_hours"] == pytest.approx(8 * (10 - 3 - 1), abs=0.01)
    reward = found["openrlhf-reward-collapse"]
    assert reward["evidence"]["signals"][0]["metric"] == "train/reward"
    assert reward["evidence"]["signals"][0]["onset_step"] == 600
    assert len(kl["evidence"]["chart"]["points"]) <= 60


def test_pil001_flags_the_unpiloted_launch_only(run_cli, logged_runs_db):
    found = _findings(run_cli, logged_runs_db, "PIL001")
    assert _names(found) == {"pil-first-launch"}
    # failed after 10 h: later than a 1-h pilot runs, so the hours are at risk, not waste
    assert found[0]["waste"]["gpu_hours"] == 0
    assert found[0]["risk_gpu_hours"] == pytest.approx(32 * 10, abs=0.01)


def test_red001_flags_the_drop_only_and_gate_fails_on_it(run_cli, logged_runs_db):
    found = _findings(run_cli, logged_runs_db, "RED001")
    assert _names(found) == {"red-drop"}
    assert found[0]["severity"] == "critical"
    from audit import Registry

    with Registry(logged_runs_db) as reg:
        frame = reg.search("attributes.run_name LIKE 'red-%'")
    ids = dict(zip(frame["run_name"], frame["run_id"], strict=True))
    # general metrics held: a loose general tolerance passes them, the red line still fails
    code, out, _ = run_cli(
        "--db", str(logged_runs_db), "gate", ids["red-drop"], "--tolerance", "0.5"
    )
    assert code == 1
    assert "RED LINE" in out and "(red line, tolerance 0)" in out.splitlines()[-1]
    code, out, _ = run_cli(
        "--db", str(logged_runs_db), "gate", ids["red-held"], "--tolerance", "0.5"
    )
    assert code == 0, out


def test_evl_rules_flag_the_duplicate_and_the_narrow_run(run_cli, logged_runs_db):
    (duplicate,) = _findings(run_cli, logged_runs_db, "EVL001")
    assert duplicate["subject"]["evaluated_model"] == "/ckpt/a/checkpoint-2000"
    assert [d["name"] for d in duplicate["evidence"]["duplicates"]] == ["eval-ckpt-again"]
    assert duplicate["waste"]["gpu_hours"] == pytest.approx(4.0, abs=0.01)
    narrow = [
        f
        for f in _findings(run_cli, logged_runs_db, "EVL002")
        if f["subject"]["experiment"] == "evaluations"
    ]
    assert [r["name"] for r in narrow[0]["evidence"]["runs"]] == ["sft-narrow"]


def test_src001_lists_runs_without_method_or_teacher(run_cli, logged_runs_db):
    (found,) = [
        f
        for f in _findings(run_cli, logged_runs_db, "SRC001")
        if f["subject"]["experiment"] == "attribution"
    ]
    assert {(r["name"], r["missing"]) for r in found["evidence"]["runs"]} == {
        ("no-method", "method"),
        ("opd-no-teacher", "teacher"),
    }
    assert found["evidence"]["gpu_hours_unattributed"] == pytest.approx(4 * 4 + 8 * 4, abs=0.01)


def test_mtx001_points_the_dominated_run_at_the_cheaper_recipe(run_cli, logged_runs_db):
    found = _findings(run_cli, logged_runs_db, "MTX001")
    matrix = [f for f in found if f["evidence"]["base_model"] == "m7"]
    assert _names(matrix) == {"mtx-sft-expensive"}
    assert matrix[0]["evidence"]["cheaper_run"]["name"] == "mtx-opd-cheap"


def test_que001_measures_from_eligible_when_the_export_has_it(run_cli, logged_runs_db):
    (found,) = _findings(run_cli, logged_runs_db, "QUE001")
    assert found["subject"] == {"team": "agents"}
    # job 9001 waited 26 h, job 9002 only 1 h after it became eligible: 8 × 27 GPU-h
    assert found["evidence"]["gpu_hours_waited"] == pytest.approx(8 * 27, abs=0.01)
    assert found["evidence"]["measured_from"] == "wait measured from Eligible"
    assert found["waste"]["gpu_hours"] == 0

"""Regenerate ``sample_logs/``: one post-training team's week, written with the real MLflow client.

The week is 2026-W47 (Mon 16 - Sun 22 November 2026, UTC). Two teams fine-tune two base
models for a code-editing task with SFT, RL (GRPO) and on-policy distillation (OPD), and
evaluate target-task and general-ability benchmarks. Some runs carry waste on purpose (the
"planted" column below) so every rule family has something real to find; the rest is a
clean, busy week.

Run:  MLFLOW_ALLOW_FILE_STORE=true python sample_logs/generate.py
Output is deterministic: ids come from a seeded generator and MLflow's clock is pinned.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
STORE = HERE / "mlruns"
WEEK_START_MS = 1_794_787_200_000  # 2026-11-16T00:00:00Z
HOUR_MS = 3_600_000

_ids = random.Random(47)
uuid.uuid4 = lambda: uuid.UUID(int=_ids.getrandbits(128), version=4)  # deterministic ids

os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
os.environ["MLFLOW_TRACKING_URI"] = STORE.as_uri()
os.environ["MLFLOW_REGISTRY_URI"] = STORE.as_uri()
ARTIFACT_ROOT = "file:///scratch/mlflow-artifacts"
import mlflow.store.model_registry.file_store as registry_file_store  # noqa: E402
import mlflow.store.tracking.file_store as file_store  # noqa: E402
import mlflow.utils.time as mlflow_time  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param  # noqa: E402

_clock = [WEEK_START_MS + 7 * 24 * HOUR_MS]


def _pinned_clock() -> int:
    _clock[0] += 1000
    return _clock[0]


mlflow_time.get_current_time_millis = _pinned_clock
file_store.get_current_time_millis = _pinned_clock
registry_file_store.get_current_time_millis = _pinned_clock

BASELINES = {
    # base model -> (general benchmarks, target benchmark) measured before training
    "qwen2.5-7b": ({"mmlu": 0.742, "gsm8k": 0.815, "ifeval": 0.701}, 0.312),
    "llama3.1-8b": ({"mmlu": 0.684, "gsm8k": 0.771, "ifeval": 0.655}, 0.274),
}
DATASETS = {
    # name -> digest. "edit-pairs" is the same content as "codeedit-v3" under another name.
    "codeedit-v3": "9f2c4e1ab7d03c55",
    "codeedit-v3@rev2": "41be07d9c2aa1f60",
    "edit-pairs": "9f2c4e1ab7d03c55",
    "toolcalls-v1": "c0de77aa10b2e9f4",
}

# name, experiment, team, user, method, base, lr (as typed), steps, gpus, dataset, seed,
# start hour in week, hours, status, general drift per 1000 steps, target gain, extras, planted
RUNS = [
    (
        "base-qwen-eval",
        "baselines",
        "coder",
        "alice",
        "eval",
        "qwen2.5-7b",
        None,
        0,
        1,
        None,
        0,
        1.0,
        0.5,
        "FINISHED",
        0.0,
        0.0,
        {"baseline": True},
        "",
    ),
    (
        "base-llama-eval",
        "baselines",
        "coder",
        "alice",
        "eval",
        "llama3.1-8b",
        None,
        0,
        1,
        None,
        0,
        1.5,
        0.5,
        "FINISHED",
        0.0,
        0.0,
        {"baseline": True},
        "",
    ),
    (
        "sft-qwen-lr2e-5",
        "code-edit-posttrain",
        "coder",
        "alice",
        "sft",
        "qwen2.5-7b",
        "2e-05",
        2000,
        8,
        "codeedit-v3",
        42,
        3.0,
        6.0,
        "FINISHED",
        -0.004,
        0.143,
        {},
        "",
    ),
    (
        "sft-qwen-lr2e-5-again",
        "code-edit-posttrain",
        "coder",
        "bob",
        "sft",
        "qwen2.5-7b",
        "0.00002",
        2000,
        8,
        "codeedit-v3",
        42,
        30.0,
        6.0,
        "FINISHED",
        -0.004,
        0.141,
        {},
        "DUP: same config as sft-qwen-lr2e-5",
    ),
    (
        "sft-qwen-lr1e-4",
        "code-edit-posttrain",
        "coder",
        "bob",
        "sft",
        "qwen2.5-7b",
        "1e-4",
        3000,
        8,
        "codeedit-v3",
        42,
        10.0,
        9.0,
        "FINISHED",
        -0.055,
        0.121,
        {"register": "coder-edit-sft"},
        "REG: general ability collapses, training went on",
    ),
    (
        "sft-llama-seed1",
        "code-edit-posttrain",
        "coder",
        "alice",
        "sft",
        "llama3.1-8b",
        "2e-05",
        1500,
        4,
        "codeedit-v3",
        1,
        20.0,
        3.0,
        "FINISHED",
        -0.006,
        0.118,
        {},
        "",
    ),
    (
        "sft-llama-seed2",
        "code-edit-posttrain",
        "coder",
        "alice",
        "sft",
        "llama3.1-8b",
        "2e-05",
        1500,
        4,
        "codeedit-v3",
        2,
        20.5,
        3.0,
        "FINISHED",
        -0.005,
        0.121,
        {},
        "",
    ),
    (
        "sft-llama-seed3",
        "code-edit-posttrain",
        "coder",
        "alice",
        "sft",
        "llama3.1-8b",
        "2e-05",
        1500,
        4,
        "codeedit-v3",
        3,
        21.0,
        3.0,
        "FINISHED",
        -0.007,
        0.116,
        {},
        "",
    ),
    (
        "rl-qwen-grpo",
        "code-edit-posttrain",
        "coder",
        "alice",
        "rl",
        "qwen2.5-7b",
        "1e-06",
        1200,
        8,
        "codeedit-v3",
        42,
        48.0,
        12.0,
        "FINISHED",
        0.001,
        0.178,
        {"kl_coef": "0.02"},
        "IDL: job idles 2 h after the run ends",
    ),
    (
        "rl-qwen-grpo-kl05",
        "code-edit-posttrain",
        "coder",
        "bob",
        "rl",
        "qwen2.5-7b",
        "1e-06",
        1200,
        8,
        "codeedit-v3",
        42,
        62.0,
        0.7,
        "FAILED",
        0.0,
        0.02,
        {"kl_coef": "0.05"},
        "",
    ),
    (
        "rl-qwen-grpo-kl05-retry",
        "code-edit-posttrain",
        "coder",
        "bob",
        "rl",
        "qwen2.5-7b",
        "1e-06",
        1200,
        8,
        "codeedit-v3",
        42,
        64.0,
        11.0,
        "FINISHED",
        0.0,
        0.169,
        {"kl_coef": "0.05"},
        "",
    ),
    (
        "rl-llama-grpo",
        "code-edit-posttrain",
        "coder",
        "bob",
        "rl",
        "llama3.1-8b",
        "1e-06",
        1000,
        8,
        "codeedit-v3@rev2",
        42,
        80.0,
        7.0,
        "FINISHED",
        0.0,
        0.152,
        {"kl_coef": "0.02", "no_general_eval": True},
        "REG: no general-ability metric logged",
    ),
    (
        "opd-llama-from-qwen72b",
        "code-edit-posttrain",
        "coder",
        "alice",
        "opd",
        "llama3.1-8b",
        "5e-06",
        1000,
        8,
        "codeedit-v3@rev2",
        42,
        96.0,
        5.0,
        "FINISHED",
        0.002,
        0.149,
        {"teacher": "qwen2.5-72b"},
        "OVP: 8 GPUs allocated, 1 busy",
    ),
    (
        "debug-sft-tiny",
        "code-edit-posttrain",
        "coder",
        "bob",
        "sft",
        "qwen2.5-7b",
        "2e-05",
        20,
        1,
        "codeedit-v3",
        0,
        100.0,
        0.17,
        "KILLED",
        0.0,
        0.0,
        {"delete": True},
        "",
    ),
    (
        "agent-sft-llama",
        "agent-tools",
        "agents",
        "carol",
        "sft",
        "llama3.1-8b",
        "3e-05",
        1500,
        4,
        "edit-pairs",
        7,
        50.0,
        4.0,
        "FINISHED",
        -0.008,
        0.101,
        {},
        "SIL: edit-pairs is codeedit-v3 under another name",
    ),
    (
        "agent-sft-llama-tools",
        "agent-tools",
        "agents",
        "carol",
        "sft",
        "llama3.1-8b",
        "3e-05",
        1500,
        4,
        "toolcalls-v1",
        7,
        120.0,
        4.0,
        "FINISHED",
        -0.006,
        0.097,
        {},
        "",
    ),
]
COMMIT = {"coder": "5d1e0c7a9b3f", "agents": "a8c44b1e02d7"}


def _metric_series(run: tuple, rng: random.Random) -> list[Metric]:
    (
        _name,
        _exp,
        _team,
        _user,
        method,
        base,
        _lr,
        steps,
        _gpus,
        _ds,
        _seed,
        start_h,
        hours,
        status,
        drift,
        gain,
        extras,
        _planted,
    ) = run
    start = WEEK_START_MS + int(start_h * HOUR_MS)
    general, target = BASELINES[base]
    out: list[Metric] = []
    if method == "eval":
        t = start + int(hours * HOUR_MS)
        out += [Metric(f"eval/general/{k}", v, t, 0) for k, v in general.items()]
        out.append(Metric("eval/target/edit_pass_at_1", target, t, 0))
        return out
    done = steps if status == "FINISHED" else int(steps * 0.3)
    ms_per_step = hours * HOUR_MS / max(done, 1)
    for step in range(0, done + 1, 50):
        loss = 1.9 * math.exp(-step / 600) + 0.35 + rng.uniform(-0.02, 0.02)
        out.append(Metric("train/loss", round(loss, 4), start + int(step * ms_per_step), step))
    eval_every = 250
    for step in range(eval_every, done + 1, eval_every):
        t = start + int(step * ms_per_step)
        progress = step / max(steps, 1)
        out.append(
            Metric(
                "eval/target/edit_pass_at_1", round(target + gain * math.sqrt(progress), 4), t, step
            )
        )
        if extras.get("no_general_eval"):
            continue
        for k, v in general.items():
            out.append(
                Metric(
                    f"eval/general/{k}",
                    round(v + drift * step / 1000 + rng.uniform(-0.002, 0.002), 4),
                    t,
                    step,
                )
            )
    return out


def main() -> None:
    if STORE.exists():
        shutil.rmtree(STORE)
    client = MlflowClient(tracking_uri=STORE.as_uri(), registry_uri=STORE.as_uri())
    rng = random.Random(2026)
    experiments = {}
    for run in RUNS:
        (
            name,
            exp,
            team,
            user,
            method,
            base,
            lr,
            steps,
            gpus,
            dataset,
            seed,
            start_h,
            hours,
            status,
            _drift,
            _gain,
            extras,
            _planted,
        ) = run
        if exp not in experiments:
            experiments[exp] = client.create_experiment(
                exp, artifact_location=f"{ARTIFACT_ROOT}/{exp}"
            )
        start = WEEK_START_MS + int(start_h * HOUR_MS)
        job_id = 4_700_100 + RUNS.index(run)
        tags = {
            "team": team,
            "mlflow.user": user,
            "mlflow.source.git.commit": COMMIT[team],
            "slurm_job_id": str(job_id),
        }
        if extras.get("baseline"):
            tags["audit.baseline"] = "true"
        created = client.create_run(experiments[exp], start_time=start, tags=tags, run_name=name)
        run_id = created.info.run_id
        params = {"method": method, "base_model": base, "num_gpus": str(gpus)}
        if method != "eval":
            params |= {
                "learning_rate": lr,
                "max_steps": str(steps),
                "per_device_train_batch_size": "4",
                "gradient_accumulation_steps": "8",
                "lora_rank": "64",
                "bf16": "True" if team == "coder" else "true",
                "seed": str(seed),
                "dataset": dataset,
                "output_dir": f"/scratch/{team}/ckpt/{name}",
                "logging_dir": f"/scratch/{team}/logs/{name}",
                "run_name": name,
                "report_to": "mlflow",
            }
            params |= {k: v for k, v in extras.items() if k in ("kl_coef", "teacher")}
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
        metrics = _metric_series(run, rng)
        for i in range(0, len(metrics), 500):
            client.log_batch(run_id, metrics=metrics[i : i + 500])
        if dataset:
            digest = DATASETS[dataset]
            ds_name = dataset.split("@")[0]
            client.log_inputs(
                run_id,
                [
                    DatasetInput(
                        Dataset(
                            name=ds_name,
                            digest=digest,
                            source_type="local",
                            source=f"/datasets/{team}/{ds_name}/{digest[:8]}.jsonl",
                        ),
                        [InputTag("mlflow.data.context", "train")],
                    )
                ],
            )
        client.set_terminated(run_id, status, end_time=start + int(hours * HOUR_MS))
        if extras.get("register"):
            model = extras["register"]
            client.create_registered_model(model)
            client.create_model_version(
                model, f"{ARTIFACT_ROOT}/{exp}/{run_id}/artifacts/model", run_id=run_id
            )
        if extras.get("delete"):
            client.delete_run(run_id)
    print(f"wrote {len(RUNS)} runs to {STORE}", file=sys.stderr)


if __name__ == "__main__":
    main()

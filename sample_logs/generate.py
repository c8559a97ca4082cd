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
sys.path.insert(0, str(HERE))
from plan import (  # noqa: E402
    BASELINES,
    COMMIT,
    DATASETS,
    FIRST_LOSS,
    HOUR_MS,
    RUNS,
    SAFETY_BASELINES,
    WEEK_START_MS,
)

STORE = HERE / "mlruns"

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
        dataset,
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
    first_loss = FIRST_LOSS.get(dataset, 2.25)
    general, target = BASELINES[base]
    safety = SAFETY_BASELINES[base]
    out: list[Metric] = []
    if method == "eval":
        t = start + int(hours * HOUR_MS)
        out += [Metric(f"eval/general/{k}", v, t, 0) for k, v in general.items()]
        out.append(Metric("eval/target/edit_pass_at_1", target, t, 0))
        out += [Metric(f"eval/safety/{k}", v, t, 0) for k, v in safety.items()]
        return out
    done = steps if status == "FINISHED" else int(steps * 0.3)
    ms_per_step = hours * HOUR_MS / max(done, 1)
    for step in range(0, done + 1, 50):
        t = start + int(step * ms_per_step)
        progress = step / max(steps, 1)
        loss = (first_loss - 0.35) * math.exp(-step / 600) + 0.35 + rng.uniform(-0.02, 0.02)
        out.append(Metric("train/loss", round(loss, 4), t, step))
        out.append(Metric("train/grad_norm", round(0.9 + rng.uniform(-0.15, 0.15), 4), t, step))
        if method in ("rl", "opd"):
            # what TRL's GRPO trainer logs: KL to the reference, token entropy, mean reward
            kl = 0.002 + 0.04 * math.sqrt(progress)
            if progress >= extras.get("kl_blowup_at", 2.0):
                kl = 1.2 + rng.uniform(0.0, 0.6)
            entropy = 1.1 - 0.4 * progress + rng.uniform(-0.03, 0.03)
            reward = 0.2 + 2 * gain * math.sqrt(progress) + rng.uniform(-0.03, 0.03)
            out.append(Metric("train/kl", round(kl, 5), t, step))
            out.append(Metric("train/entropy", round(entropy, 4), t, step))
            out.append(Metric("train/reward", round(reward, 4), t, step))
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
        for k, v in safety.items():
            # red lines hold (a hair above the base model) unless a drop is planted
            change = extras.get("safety_drop", 0.001)
            out.append(Metric(f"eval/safety/{k}", round(v + change * progress, 4), t, step))
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

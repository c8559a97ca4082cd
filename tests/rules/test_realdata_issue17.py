"""Issue 17's rules on real files written by other people (../shared/realdata).

- a verl RL run (W&B folder, console log in verl's ``step:N - key:value`` format) that was
  killed at step 59, half an hour after its score fell (step 29) and its grad norm jumped
  ~15× (step 38);
- a TRL GRPO run's ``trainer_state.json`` whose completions were 90-100 % truncated;
- a university cluster's sacct export (no Eligible column): queue wait from Submit.

The metric values go into a warehouse as they were logged; only what the files lack
(timestamps of the TRL log, the GPU count of the TRL run) is stated here.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict

import pytest

from audit.testing import run_case
from tests.helpers import SHARED

VERL_LOG = SHARED / "wandb/verl-agentic-rl/wandb/run-20251130_144822-gjvwlq13/files/output.log"
TRL_STATE = SHARED / "hf-trainer/trl-grpo-chaos-economy/trainer_state.json"
SACCT = SHARED / "slurm" / "hb-jobinfo_sacct.txt"
SACCT_FIELDS = (
    "JobID,JobName,User,Partition,NodeList,NNodes,NCPUs,NTasks,State,Submit,Start,End,Timelimit,Elapsed,"
    "TotalCPU,CPUTime,UserCPU,SystemCPU,ReqMem,MaxRSS,MaxVMSize,ReqTRES,AllocTRES,TRESUsageInMax,"
    "TRESUsageInTot,TRESUsageOutTot,MaxDiskRead,MaxDiskWrite,MaxRSSNode,MaxRSSTask,MaxVMSizeNode,"
    "MaxVMSizeTask,MaxDiskReadNode,MaxDiskReadTask,MaxDiskWriteNode,MaxDiskWriteTask,Comment"
)
PAIR = re.compile(r"([A-Za-z_][\w/@.\-]*):(?:np\.\w+\()?(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")

pytestmark = pytest.mark.skipif(
    not SHARED.exists(), reason="../shared/realdata is absent (real files from other projects)"
)


def verl_history() -> dict[int, dict[str, float]]:
    """verl's console metrics per step (a record may wrap onto several lines)."""
    text = VERL_LOG.read_text(encoding="utf-8", errors="replace")
    steps: dict[int, dict[str, float]] = defaultdict(dict)
    parts = re.split(r"(?m)^step:(\d+) - ", text)
    for step, body in zip(parts[1::2], parts[2::2], strict=True):
        for key, value in PAIR.findall(body.split("\n(")[0]):
            steps[int(step)][key] = float(value)
    return dict(steps)


def test_verl_run_that_blew_up_and_was_killed_later(tmp_path):
    history = verl_history()
    train = {s: v for s, v in history.items() if "actor/grad_norm" in v}
    assert len(train) == 59  # steps 1..59, then the run was killed
    # hours from the run's start: verl's own step timings, summed
    typical = statistics.median(v["timing_s/step"] for v in train.values() if "timing_s/step" in v)
    hour, clock = {}, 0.0
    for step in sorted(train):
        clock += train[step].get("timing_s/step", typical) / 3600
        hour[step] = clock
    names = ["actor/grad_norm", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac",
             "critic/score/mean", "response_length/clip_ratio"]  # fmt: skip
    metrics = {
        name: [
            [step, hour[step], train[step][name]] for step in sorted(train) if name in train[step]
        ]
        for name in names
    }
    end = hour[max(train)]
    case = {
        "data": {
            "runs": [
                {
                    "run_id": "gjvwlq13",
                    "name": "verl-opd-qwen2.5-3b",
                    "start": 0,
                    "end": end,
                    "status": "KILLED",
                    # the run's config: 4 of the machine's 8 A800 GPUs (verl's trainer keys)
                    "params": {"trainer.n_gpus_per_node": 4, "trainer.nnodes": 1},
                    "tags": {"method": "rl"},
                    "metrics": metrics,
                }
            ]
        }
    }
    # killed ~35 min after the first signal, on a ~2-hour run: the grace is 10 % of the run
    # (an alert on a 2-hour run fires in minutes), so the hours after it are claimed, with
    # both signals as evidence
    (finding,) = run_case("STB001", case, tmp_path / "default").findings
    signals = {s["signal"]: s for s in finding.evidence["signals"]}
    # the score (verl's reward mean) fell below its early level by half its range at step 29
    # and stayed there; the grad norm went from ~0.8 to 11 at step 38 and stayed above 10 ×
    # its running median; entropy, KL, clipping and truncation stayed healthy
    assert set(signals) == {"reward collapse", "grad-norm explosion"}
    assert signals["reward collapse"]["onset_step"] == 29
    assert signals["grad-norm explosion"]["onset_step"] == 38
    assert finding.gpu_hours == pytest.approx(4 * (end - hour[29] - 0.1 * end), abs=0.01)
    # a 1-hour grace claims nothing: what the rule said before its grace scaled with the run
    case["config"] = "[rules.STB001]\ngrace_fraction = 1\n"
    assert run_case("STB001", case, tmp_path / "hour-grace").findings == []


def test_trl_grpo_run_with_truncated_completions(tmp_path):
    state = json.loads(TRL_STATE.read_text(encoding="utf-8"))
    log = [e for e in state["log_history"] if "loss" in e]
    # trainer_state.json keeps no times: one minute per optimizer step is assumed here
    names = [
        "loss",
        "grad_norm",
        "kl",
        "reward",
        "completions/clipped_ratio",
        "clip_ratio/region_mean",
    ]
    metrics = {n: [[e["step"], e["step"] / 60, e[n]] for e in log if n in e] for n in names}
    case = {
        "data": {
            "runs": [
                {
                    "run_id": "1jfgog54",
                    "start": 0,
                    "end": state["global_step"] / 60,
                    "params": {"method": "rl", "num_gpus": 1},  # one L4 in the run's metadata
                    "metrics": metrics,
                }
            ]
        }
    }
    result = run_case("STB001", case, tmp_path)
    (finding,) = result.findings
    (signal,) = finding.evidence["signals"]
    assert signal["signal"] == "response truncation"
    assert signal["metric"] == "completions/clipped_ratio"
    assert signal["onset_step"] == 30  # the first point after 5 warm-up points (every 5 steps)
    # signed GRPO loss: no spike test; KL peaks at 0.05 (< 0.1); noisy rewards never collapse


def test_queue_wait_on_a_real_sacct_export_without_eligible(run_cli, tmp_path):
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli(
        "--db", str(db), "ingest", "slurm", "--fields", SACCT_FIELDS, "--delimiter", "☃", str(SACCT)
    )
    assert code == 0, err
    # independent of the importer: GPU jobs, their GPUs and Submit → Start wait, per user
    waited: dict[str, float] = defaultdict(float)
    from datetime import datetime

    for line in SACCT.read_text(encoding="utf-8").splitlines():
        f = line.split("☃")
        if "." in f[0] or "gres/gpu=" not in f[22] or f[10] in ("", "Unknown", "None"):
            continue
        gpus = int(re.search(r"gres/gpu=(\d+)", f[22])[1])
        wait = datetime.fromisoformat(f[10]) - datetime.fromisoformat(f[9])
        waited[f[2]] += gpus * wait.total_seconds() / 3600
    over = {user: hours for user, hours in waited.items() if hours >= 100}
    code, out, _ = run_cli("--db", str(db), "scan", "--select", "QUE001", "--format", "json")
    findings = json.loads(out)["findings"]
    assert {f["subject"]["team"]: f["evidence"]["gpu_hours_waited"] for f in findings} == (
        pytest.approx(over, abs=0.01)
    )
    assert over  # the export holds at least one team that waited this long
    for finding in findings:
        assert finding["evidence"]["measured_from"].startswith("wait measured from Submit")
        assert finding["waste"]["gpu_hours"] == 0

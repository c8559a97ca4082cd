"""The sample week as data: runs, their Slurm jobs, hosts, telemetry and checkpoints.

Shared by ``generate.py`` (MLflow history, written with the real client) and
``generate_cluster.py`` (sacct, nvidia-smi and the checkpoint manifest), and by the tests,
which check that a scan finds exactly the waste planted here.
"""

from __future__ import annotations

WEEK_START_MS = 1_794_787_200_000  # 2026-11-16T00:00:00Z, Monday of ISO week 2026-W47
HOUR_MS = 3_600_000

BASELINES = {
    # base model -> (general benchmarks, target benchmark) measured before training
    "qwen2.5-7b": ({"mmlu": 0.742, "gsm8k": 0.815, "ifeval": 0.701}, 0.312),
    "llama3.1-8b": ({"mmlu": 0.684, "gsm8k": 0.771, "ifeval": 0.655}, 0.274),
}
# base model -> red-line benchmarks (higher is better) measured before training
SAFETY_BASELINES = {
    "qwen2.5-7b": {"harmful_refusal": 0.962},
    "llama3.1-8b": {"harmful_refusal": 0.948},
}
DATASETS = {
    # name -> digest. "edit-pairs" is the same content as "codeedit-v3" under another name;
    # "codeedit-v3@rev2" is a new version of codeedit-v3 (a different digest, not a silo).
    "codeedit-v3": "9f2c4e1ab7d03c55",
    "codeedit-v3@rev2": "41be07d9c2aa1f60",
    "edit-pairs": "9f2c4e1ab7d03c55",
    "toolcalls-v1": "c0de77aa10b2e9f4",
}
COMMIT = {"coder": "5d1e0c7a9b3f", "agents": "a8c44b1e02d7"}
# The base models' loss on each dataset before training: the first training loss, what
# audit.facts.shift measures an SFT run's distance by. Code edits are near the base models,
# tool calls far from them; gsm8k-cot (W&B, generate_wandb.py) sits between at 2.1.
FIRST_LOSS = {
    "codeedit-v3": 1.25,
    "codeedit-v3@rev2": 1.25,
    "edit-pairs": 1.25,
    "toolcalls-v1": 3.1,
}

# fmt: off
# name, experiment, team, user, method, base, lr (as typed), steps, gpus, dataset, seed,
# start hour in week, hours, status, general drift per 1000 steps, target gain, extras, planted
RUNS = [
    ("base-qwen-eval", "baselines", "coder", "alice", "eval", "qwen2.5-7b", None, 0, 1, None, 0, 1.0, 0.5, "FINISHED", 0.0, 0.0, {"baseline": True}, ""),
    ("base-llama-eval", "baselines", "coder", "alice", "eval", "llama3.1-8b", None, 0, 1, None, 0, 1.5, 0.5, "FINISHED", 0.0, 0.0, {"baseline": True}, ""),
    ("sft-qwen-lr2e-5", "code-edit-posttrain", "coder", "alice", "sft", "qwen2.5-7b", "2e-05", 2000, 8, "codeedit-v3", 42, 3.0, 6.0, "FINISHED", -0.004, 0.143, {}, ""),
    ("sft-qwen-lr2e-5-again", "code-edit-posttrain", "coder", "bob", "sft", "qwen2.5-7b", "0.00002", 2000, 8, "codeedit-v3", 42, 30.0, 6.0, "FINISHED", -0.004, 0.141, {}, "DUP: same config as sft-qwen-lr2e-5"),
    ("sft-qwen-lr1e-4", "code-edit-posttrain", "coder", "bob", "sft", "qwen2.5-7b", "1e-4", 3000, 8, "codeedit-v3", 42, 10.0, 9.0, "FINISHED", -0.055, 0.121, {"register": "coder-edit-sft"}, "REG: general ability collapses, training went on"),
    ("sft-llama-seed1", "code-edit-posttrain", "coder", "alice", "sft", "llama3.1-8b", "2e-05", 1500, 4, "codeedit-v3", 1, 20.0, 3.0, "FINISHED", -0.006, 0.118, {}, ""),
    ("sft-llama-seed2", "code-edit-posttrain", "coder", "alice", "sft", "llama3.1-8b", "2e-05", 1500, 4, "codeedit-v3", 2, 20.5, 3.0, "FINISHED", -0.005, 0.121, {}, ""),
    ("sft-llama-seed3", "code-edit-posttrain", "coder", "alice", "sft", "llama3.1-8b", "2e-05", 1500, 4, "codeedit-v3", 3, 21.0, 3.0, "FINISHED", -0.007, 0.116, {}, ""),
    ("rl-qwen-grpo", "code-edit-posttrain", "coder", "alice", "rl", "qwen2.5-7b", "1e-06", 1200, 8, "codeedit-v3", 42, 48.0, 12.0, "FINISHED", 0.001, 0.178, {"kl_coef": "0.02"}, "IDL: job idles 2 h after the run ends"),
    ("rl-qwen-grpo-kl05", "code-edit-posttrain", "coder", "bob", "rl", "qwen2.5-7b", "1e-06", 1200, 8, "codeedit-v3", 42, 62.0, 0.7, "FAILED", 0.0, 0.02, {"kl_coef": "0.05"}, ""),
    ("rl-qwen-grpo-kl05-retry", "code-edit-posttrain", "coder", "bob", "rl", "qwen2.5-7b", "1e-06", 1200, 8, "codeedit-v3", 42, 64.0, 11.0, "FINISHED", 0.0, 0.169, {"kl_coef": "0.05"}, ""),
    ("rl-llama-grpo", "code-edit-posttrain", "coder", "bob", "rl", "llama3.1-8b", "1e-06", 1000, 8, "codeedit-v3@rev2", 42, 80.0, 7.0, "FINISHED", 0.0, 0.152, {"kl_coef": "0.02", "no_general_eval": True}, "REG: no general-ability metric logged; OVP: time limit 72 h for 7 h"),
    ("opd-llama-from-qwen72b", "code-edit-posttrain", "coder", "alice", "opd", "llama3.1-8b", "5e-06", 1000, 8, "codeedit-v3@rev2", 42, 96.0, 5.0, "FINISHED", 0.002, 0.149, {"teacher": "qwen2.5-72b"}, "OVP: 8 GPUs allocated, 1 busy"),
    ("debug-sft-tiny", "code-edit-posttrain", "coder", "bob", "sft", "qwen2.5-7b", "2e-05", 20, 1, "codeedit-v3", 0, 100.0, 0.17, "KILLED", 0.0, 0.0, {"delete": True}, ""),
    ("agent-sft-llama", "agent-tools", "agents", "carol", "sft", "llama3.1-8b", "3e-05", 1500, 4, "edit-pairs", 7, 50.0, 4.0, "FINISHED", -0.008, 0.101, {}, "SIL: edit-pairs is codeedit-v3 under another name"),
    ("agent-sft-llama-tools", "agent-tools", "agents", "carol", "sft", "llama3.1-8b", "3e-05", 1500, 4, "toolcalls-v1", 7, 120.0, 4.0, "FINISHED", -0.006, 0.097, {"no_general_eval": True}, "DSH: SFT far from llama3.1-8b (first loss 3.1) with no general evaluation"),
    ("sft-llama-chat-mix", "code-edit-posttrain", "coder", "alice", "sft", "llama3.1-8b", "2e-05", 1500, 4, "codeedit-v3", 4, 26.0, 3.0, "FINISHED", -0.004, 0.12, {"safety_drop": -0.047}, "RED: refusal on harmful prompts falls below the base model's"),
    ("rl-llama-tools-grpo", "agent-tools", "agents", "carol", "rl", "llama3.1-8b", "1e-06", 3000, 8, "toolcalls-v1", 7, 66.0, 34.0, "FAILED", 0.0, 0.02, {"kl_coef": "0.02"}, "PIL: a 272 GPU-h first launch of a new recipe (no pilot) that failed"),
    ("rl-qwen-grpo-lr5e-6", "code-edit-posttrain", "coder", "bob", "rl", "qwen2.5-7b", "5e-06", 1200, 8, "codeedit-v3", 42, 110.0, 10.0, "FINISHED", 0.0, 0.05, {"kl_coef": "0.02", "kl_blowup_at": 0.3}, "STB: KL blows up at 30 % and training goes on"),
    ("sft-llama-tools-w46", "agent-tools", "agents", "carol", "sft", "llama3.1-8b", "1e-4", 1500, 4, "toolcalls-v1", 5, -40.0, 4.0, "FINISHED", -0.035, 0.09, {}, "history (W46): SFT far from llama3.1-8b that lost general ability"),
]

# Where each run's Slurm job ran: host, GPU indices, hours the job outlived the run (idle
# tail), time limit in hours, and which allocated GPUs actually worked.
JOB_ID_BASE = 4_700_100
PLACEMENT = {
    "base-qwen-eval":          ("gpu-h01", [0],           0.0, 2,  "all"),
    "base-llama-eval":         ("gpu-h02", [0],           0.0, 2,  "all"),
    "sft-qwen-lr2e-5":         ("gpu-h01", range(8),      0.0, 10, "all"),
    "sft-qwen-lr2e-5-again":   ("gpu-h02", range(8),      0.0, 10, "all"),
    "sft-qwen-lr1e-4":         ("gpu-h01", range(8),      0.0, 14, "all"),
    "sft-llama-seed1":         ("gpu-h04", range(0, 4),   0.0, 5,  "all"),
    "sft-llama-seed2":         ("gpu-h04", range(4, 8),   0.0, 5,  "all"),
    "sft-llama-seed3":         ("gpu-h03", range(0, 4),   0.0, 5,  "all"),
    "rl-qwen-grpo":            ("gpu-h02", range(8),      2.0, 18, "all"),
    "rl-qwen-grpo-kl05":       ("gpu-h04", range(8),      0.0, 18, "all"),
    "rl-qwen-grpo-kl05-retry": ("gpu-h03", range(8),      0.0, 18, "all"),
    "rl-llama-grpo":           ("gpu-h03", range(8),      0.0, 72, "all"),
    "opd-llama-from-qwen72b":  ("gpu-h03", range(8),      0.0, 8,  "first"),
    "debug-sft-tiny":          ("gpu-h01", [0],           0.0, 1,  "all"),
    "agent-sft-llama":         ("gpu-a01", range(0, 4),   0.0, 6,  "all"),
    "sft-llama-tools-w46":     ("gpu-a01", range(4, 8),   0.0, 6,  "all"),
    "agent-sft-llama-tools":   ("gpu-a01", range(0, 4),   0.0, 6,  "all"),
    "sft-llama-chat-mix":      ("gpu-h03", range(0, 4),   0.0, 5,  "all"),
    "rl-llama-tools-grpo":     ("gpu-h02", range(8),      0.0, 48, "all"),
    "rl-qwen-grpo-lr5e-6":     ("gpu-h01", range(8),      0.0, 14, "all"),
}
# A job with no MLflow run: an interactive session left open at ~0 % (planted IDL), and
# the host it ran on kept reporting (and being paid for) 12 h after it ended (planted IDL).
INTERACTIVE_JOB = {"job_id": "4700199", "name": "jupyter", "user": "bob", "account": "coder",
                   "host": "gpu-h04", "gpus": [0, 1], "start_h": 40.0, "hours": 6.0, "timelimit_h": 8}
HOST_UP_AFTER_LAST_JOB = {"gpu-h04": 12.0}
HOST_GPU_TYPE = {"gpu-h01": "h100", "gpu-h02": "h100", "gpu-h03": "h100", "gpu-h04": "h100", "gpu-a01": "a100"}
ACCOUNT = {"coder": "coder", "agents": "agents"}
# Telemetry is logged while a host holds jobs; the logger stays up across gaps shorter
# than this between jobs (a busy host), and stops otherwise.
TELEMETRY_BRIDGE_HOURS = 2.0
TELEMETRY_STEP_MINUTES = 5

# HF Trainer checkpoints left on /scratch: run -> steps saved (save_steps), best step.
CHECKPOINTS = {
    "sft-qwen-lr2e-5":         (range(500, 2001, 500), 2000),
    "sft-qwen-lr2e-5-again":   (range(500, 2001, 500), 1500),
    "sft-qwen-lr1e-4":         (range(500, 3001, 500), 500),
    "rl-qwen-grpo":            (range(200, 1201, 200), 1200),
    "opd-llama-from-qwen72b":  (range(250, 1001, 250), 1000),
    "debug-sft-tiny":          ([10, 20], 20),
}
CHECKPOINT_GB = {"qwen2.5-7b": 15.2, "llama3.1-8b": 16.1}  # LoRA merged + optimizer state
ORPHAN_CHECKPOINT = ("coder/ckpt/old-sweep-0917/checkpoint-4000", 15.2)  # no run logged it
# fmt: on

# The "reasoning" team's W&B runs (sample_logs/generate_wandb.py): name, config, start hour
# in week, hours, steps, exit code. They show runs of a second tracker in the same audit
# (spend, search, reports); "sft-qwen-math-rerun" trains sft-qwen-lr2e-5's configuration
# again under W&B (planted DUP: a duplicate across trackers; W&B records no dataset digest
# or commit here, which is unknown, not different).
_SFT_QWEN = {
    "method": "sft",
    "base_model": "qwen2.5-7b",
    "num_gpus": 8,
    "learning_rate": 2e-05,
    "max_steps": 2000,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 8,
    "lora_rank": 64,
    "bf16": True,
    "seed": 42,
    "dataset": "codeedit-v3",
}
# general-ability drift of a W&B run's evaluations against its base model (mid-distance SFT
# loses a little, within REG002's tolerance; the far toolcalls run above loses more)
WANDB_GENERAL_DRIFT = {"math-sft-llama": -0.015}
WANDB_RUNS = [
    (
        "math-sft-llama",
        {
            **_SFT_QWEN,
            "base_model": "llama3.1-8b",
            "num_gpus": 4,
            "dataset": "gsm8k-cot",
            "seed": 11,
            "output_dir": "/data/reasoning/math-sft-llama",
            "report_to": "wandb",
        },
        26.0,
        5.0,
        1500,
        0,
    ),
    (
        "math-rl-qwen",
        {
            **_SFT_QWEN,
            "method": "rl",
            "learning_rate": 1e-06,
            "dataset": "gsm8k-cot",
            "kl_coef": 0.02,
            "output_dir": "/data/reasoning/math-rl-qwen",
            "report_to": "wandb",
        },
        54.0,
        2.0,
        1200,
        1,
    ),
    (
        "sft-qwen-math-rerun",
        {
            **_SFT_QWEN,
            "output_dir": "/data/reasoning/sft-qwen-math-rerun",
            "run_name": "sft-qwen-math-rerun",
            "report_to": "wandb",
        },
        74.0,
        6.0,
        2000,
        0,
    ),
]

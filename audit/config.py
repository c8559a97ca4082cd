"""Loading and validating ``audit.toml``.

The configuration is data with a schema: every section and key is declared here with its
type and default, and an unknown key is an error that lists the valid ones.
"""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from audit.errors import InputError, utf8_problem

DEFAULT_CONFIG_NAME = "audit.toml"
TEAM_SOURCES = ("tag", "account", "user")

# section -> key -> (expected python type(s), default). A nested dict default means the
# key holds a free-form table whose values are validated by their consumer.
# On-demand prices in USD per GPU-hour, matched case-insensitively as a substring of the
# job's GPU type or the card's model name (longest match wins). Anchors: public on-demand
# list prices of large clouds and GPU clouds in 2025-2026, rounded; override with
# [prices] gpu_hour_usd.
DEFAULT_GPU_PRICES = {
    "H200": 3.80,
    "H100": 3.00,
    "A100": 1.60,
    "L40S": 1.00,
    "A10G": 0.75,
    "V100": 0.55,
    "T4": 0.35,
    "default": 2.00,
}

# Metric names of training-stability signals, exact keys as each framework logs them:
# TRL GRPO/PPO (`kl`, `entropy`, `reward`, `completions/clipped_ratio`,
# `clip_ratio/region_mean`; `objective/*`, `policy/*` for PPO), verl (`actor/*`,
# `critic/score/mean`, `response_length/clip_ratio`), OpenRLHF (`policy_loss`, `kl`,
# `ppo_kl`, `ppo_clip_ratio`, `entropy_loss`, `reward`), NeMo-RL (`train/loss`,
# `train/grad_norm`, `train/approx_entropy`, `train/reward`, `train/kl_penalty`) and
# Megatron (`lm loss`, `grad-norm`). A `train/` prefix is what the W&B and TensorBoard
# integrations add.
STABILITY_METRICS = {
    "loss": [
        "loss",
        "train/loss",
        "train_loss",
        "lm loss",
        "train/lm_loss",
        "gpt_loss",
        "train/gpt_loss",
    ],
    "grad_norm": [
        "grad_norm",
        "train/grad_norm",
        "actor/grad_norm",
        "grad-norm",
        "train/grad-norm",
    ],
    "kl": [
        "kl",
        "train/kl",
        "objective/kl",
        "train/objective/kl",
        "actor/ppo_kl",
        "actor/kl_loss",
        "ppo_kl",
        "train/ppo_kl",
        "train/kl_penalty",
    ],
    "entropy": [
        "entropy",
        "train/entropy",
        "actor/entropy",
        "objective/entropy",
        "train/objective/entropy",
        "policy/entropy_avg",
        "train/policy/entropy_avg",
        "entropy_loss",
        "train/entropy_loss",
        "train/approx_entropy",
    ],
    "reward": [
        "reward",
        "train/reward",
        "critic/score/mean",
        "objective/scores",
        "train/objective/scores",
        "env/reward_mean",
    ],
    "truncation": [
        "completions/clipped_ratio",
        "train/completions/clipped_ratio",
        "response_length/clip_ratio",
    ],
    "policy_clip": [
        "clip_ratio/region_mean",
        "train/clip_ratio/region_mean",
        "actor/pg_clipfrac",
        "policy/clipfrac_avg",
        "train/policy/clipfrac_avg",
        "ppo_clip_ratio",
        "train/ppo_clip_ratio",
    ],
}

SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], Any]]] = {
    "prices": {
        "gpu_hour_usd": ((dict,), DEFAULT_GPU_PRICES),
        "storage_gb_month_usd": ((int, float), 0.023),  # object storage list price per GB-month
    },
    "metrics": {
        "general": ((list,), ["eval/general/*"]),  # globs: general-capability benchmarks
        "target": ((list,), ["eval/target/*"]),  # globs: the task being trained for
        # globs: metrics that must never drop below the baseline (safety, refusal, ...);
        # higher is better, tolerance 0 unless red_line_tolerances gives one
        "red_lines": ((list,), ["eval/safety/*"]),
        # glob -> allowed absolute drop for the red lines it matches (first match wins)
        "red_line_tolerances": ((dict,), {}),
        # Training-stability series (STB001). Defaults cover the names TRL (HF Trainer adds
        # train/ when it logs to W&B, not to MLflow), verl, OpenRLHF and NeMo-RL log.
        "loss": ((list,), STABILITY_METRICS["loss"]),
        "grad_norm": ((list,), STABILITY_METRICS["grad_norm"]),
        "kl": ((list,), STABILITY_METRICS["kl"]),
        "entropy": ((list,), STABILITY_METRICS["entropy"]),
        "reward": ((list,), STABILITY_METRICS["reward"]),
        "truncation": ((list,), STABILITY_METRICS["truncation"]),
        "policy_clip": ((list,), STABILITY_METRICS["policy_clip"]),
    },
    "attribution": {
        "team_tag": ((str,), "team"),  # run tag naming the team
        # where a run's or job's team comes from, first known wins: the run tag team_tag,
        # the Slurm account, the user (spend and waste are attributed the same way)
        "team_order": ((list,), ["tag", "account", "user"]),
        "method_keys": ((list,), ["method", "training_method"]),  # param or tag: sft / rl / opd
        "base_model_keys": ((list,), ["base_model", "model_name_or_path"]),
        "baseline_tag": ((str,), "audit.baseline"),
        # methods whose runs evaluate a model instead of training one
        "eval_methods": ((list,), ["eval", "evaluation"]),
        # methods that learn from a teacher model, and where the teacher is recorded
        "distillation_methods": ((list,), ["opd", "distill", "distillation", "kd", "gkd"]),
        "teacher_keys": (
            (list,),
            ["teacher", "teacher_model", "teacher_model_name_or_path", "teacher_name_or_path"],
        ),
        # a run's training data when no dataset input is logged: the first param or tag set
        "dataset_keys": ((list,), ["dataset", "dataset_name", "data.train_files", "train_file"]),
        # what makes two runs the same recipe at another size (PIL001): method, base_model
        # and dataset as attributed, any other name a param or tag
        "family_keys": ((list,), ["method", "base_model", "dataset"]),
        # the model or checkpoint an evaluation run evaluated: the first param or tag set
        "evaluated_model_keys": (
            (list,),
            [
                "checkpoint",
                "checkpoint_path",
                "model_path",
                "model_name_or_path",
                "pretrained",
                "model",
                "base_model",
            ],
        ),
        "ignore_tag": ((str,), "audit.ignore"),
        # params that name where or how a run was launched, not what it trained
        "volatile_params": (
            (list,),
            [
                "output_dir",
                "logging_dir",
                "run_name",
                "report_to",
                "hub_model_id",
                "push_to_hub",
                "logging_steps",
                "save_steps",
                "eval_steps",
                "save_total_limit",
                "overwrite_output_dir",
                "dataloader_num_workers",
                "resume_from_checkpoint",
                "num_gpus",
                "world_size",
                "local_rank",
            ],
        ),
    },
    "cost": {
        # GPU count of a run without a Slurm job or system metrics: the first of these params
        # or tags that holds a positive whole number; "a*b" multiplies two keys. Defaults
        # cover HF/torchrun, verl (trainer.*), NeMo-RL (cluster.*) and OpenRLHF naming.
        "gpu_count_keys": (
            (list,),
            [
                "num_gpus",
                "n_gpus",
                "n_gpu",
                "gpu_count",
                "trainer.n_gpus_per_node*trainer.nnodes",
                "cluster.gpus_per_node*cluster.num_nodes",
                "actor_num_gpus_per_node*actor_num_nodes",
                "nproc_per_node*nnodes",
                "nproc_per_node",
                "num_processes",
                "world_size",
            ],
        ),
        "gpu_type_keys": ((list,), ["gpu_type", "gpu_name", "gpu_model"]),
        # assumed for runs with no other evidence; 0 leaves their cost unknown
        "default_gpus_per_run": ((int, float), 0),
        "default_gpu_type": ((str,), ""),
    },
    "cluster": {
        "timezone": ((str,), "UTC"),
    },
    "links": {
        "job_tag_keys": ((list,), ["slurm_job_id", "slurm.job_id", "SLURM_JOB_ID"]),
        "time_slack_minutes": ((int, float), 5),
        # paths as logged on the cluster -> where the same files are seen from here
        "path_prefixes": ((dict,), {}),
    },
    "mlflow": {
        "tracking_url": ((str,), ""),  # MLflow UI base URL for run links in reports
        "http_timeout_seconds": ((int, float), 30),
        "http_max_retries": ((int,), 5),
        "http_backoff_seconds": ((int, float), 0.5),
        "page_size": ((int,), 1000),
        # requests to a tracking server at a time: searches of separate experiments and
        # metric-history requests overlap, bounded so a shared server is not flooded
        "http_concurrency": ((int,), 4),
        "max_response_mb": ((int, float), 512),  # a larger answer is refused, not buffered
    },
    # audit ingest prometheus (checked by audit.importers.prometheus.exporters)
    "prometheus": {
        # auto (the first found of dcgm, jobstats, nvidia_gpu_exporter), one of them, or
        # custom (metrics.util and the others below)
        "exporter": ((str,), "auto"),
        # field -> metric name, times or divided by a factor into %, MiB, W or J:
        # util, util_alt, mem_used, mem_free, mem_total, power, energy
        "metrics": ((dict,), {}),
        # field -> label names tried in order: host, gpu, uuid, model, job, pod, namespace, mig
        "labels": ((dict,), {}),
        # window length -> bucket width, for a first import without --step
        "resolution": ((dict,), {"1d": "1m", "7d": "5m", "longer": "15m"}),
        "max_points_per_series": ((int,), 11_000),  # Prometheus' own limit per query
        "max_points_per_query": ((int,), 500_000),  # the sample budget of one query
        "concurrency": ((int,), 4),
        "timeout_seconds": ((int, float), 60),  # one request, answer included
        "max_retries": ((int,), 3),
        "backoff_seconds": ((int, float), 0.5),
        "max_response_mb": ((int, float), 256),
    },
}


@dataclass
class Config:
    """Validated configuration, with defaults filled in."""

    values: dict[str, dict[str, Any]]
    path: Path | None = None
    raw_text: str = field(default="", repr=False)

    def get(self, section: str, key: str) -> Any:
        return self.values[section][key]

    @property
    def digest(self) -> str:
        """Hash of the effective settings, stored with each scan."""
        import hashlib
        import json

        return hashlib.sha1(
            json.dumps(self.values, sort_keys=True, default=str).encode()
        ).hexdigest()[:12]

    def local_path(self, text: str) -> str:
        """A path from a config value: relative ones are relative to the config file."""
        if self.path is None or Path(text).is_absolute():
            return text
        return str((self.path.parent / text).resolve())

    @property
    def timezone(self) -> ZoneInfo:
        return ZoneInfo(self.values["cluster"]["timezone"])


def defaults() -> dict[str, dict[str, Any]]:
    values: dict[str, Any] = {
        section: {key: copy.deepcopy(spec[1]) for key, spec in keys.items()}
        for section, keys in SCHEMA.items()
    }
    values["rules"] = {}
    values["suppress"] = []
    return values


def _merge_rules(values: dict, table: Any, path: _Locator) -> None:
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise InputError(
            f"config {path}: [rules] holds one table per rule code, e.g. [rules.OVP001]"
        )
    from audit.rule_registry import validate_rule_settings  # rules own their threshold schemas

    for code, settings in table.items():
        values["rules"][code] = validate_rule_settings(code, settings, f"config {path}")


def _suppressions(table: Any, path: _Locator) -> list[dict[str, str]]:
    if not isinstance(table, list):
        raise InputError(
            f"config {path}: suppressions are written [[suppress]] with rule, subject, reason"
        )
    out = []
    for number, item in enumerate(table, start=1):
        if not isinstance(item, dict):
            raise InputError(f"config {path}: [[suppress]] #{number} must be a table")
        unknown = sorted(set(item) - {"rule", "subject", "reason"})
        if unknown:
            raise InputError(
                f"config {path}: unknown key '{unknown[0]}' in [[suppress]] #{number}; valid keys: reason, rule, subject"
            )
        missing = [
            k for k in ("rule", "reason") if not isinstance(item.get(k), str) or not item.get(k)
        ]
        if missing:
            raise InputError(f"config {path}: [[suppress]] #{number} needs a '{missing[0]}' (text)")
        out.append(
            {
                "rule": item["rule"],
                "subject": str(item.get("subject", "*")),
                "reason": item["reason"],
            }
        )
    return out


def load_config(path: Path | None) -> Config:
    """Read ``path`` (or defaults when ``None``) and validate it against ``SCHEMA``."""
    values = defaults()
    if path is None:
        return Config(values=values)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise InputError(f"config {path}: is a directory, expected a TOML file") from None
    except FileNotFoundError:
        raise InputError(f"config {path}: no such file") from None
    except OSError as exc:
        raise InputError(f"config {path}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"config {utf8_problem(path, raw, exc)}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"config {_toml_problem(path, text, exc)}") from None
    _merge(values, data, _Locator(path, text))
    return Config(values=values, path=path, raw_text=text)


def _toml_problem(path: Path, text: str, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    at = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if at:
        return f"{path}:{at[1]}:{at[2]}: invalid TOML: {message[: at.start()]}"
    if message.endswith("(at end of document)"):
        line = text.count("\n") + (0 if text.endswith("\n") else 1)
        return f"{path}:{max(line, 1)}: invalid TOML: {message[: -len(' (at end of document)')]} at the end"
    return f"{path}: invalid TOML: {message}"


class _Locator:
    """Prints as the config path; ``at(section, key)`` adds the line that sets it."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.lines = text.splitlines()

    def __str__(self) -> str:
        return str(self.path)

    def at(self, section: str, key: str | None = None) -> str:
        header = re.compile(r"^\s*\[+\s*" + re.escape(section) + r"\s*\]+")
        setting = re.compile(r"^\s*[\"']?" + re.escape(key or "") + r"[\"']?\s*=")
        in_section = False
        for number, line in enumerate(self.lines, start=1):
            if header.match(line):
                if key is None:
                    return f"{self.path}:{number}"
                in_section = True
            elif line.lstrip().startswith("["):
                in_section = False
            elif in_section and key is not None and setting.match(line):
                return f"{self.path}:{number}"
        return str(self.path)


# Tables whose keys are validated by their consumers: [rules.CODE] by each rule's
# threshold schema (audit.rule_registry), [[suppress]] entries here.
FREE_SECTIONS = ("rules", "suppress")


def _merge(values: dict[str, dict[str, Any]], data: dict[str, Any], path: _Locator) -> None:
    values["rules"] = {}
    values["suppress"] = []
    for section, table in data.items():
        if section == "rules":
            _merge_rules(values, table, path)
            continue
        if section == "suppress":
            values["suppress"] = _suppressions(table, path)
            continue
        if section not in SCHEMA:
            valid = ", ".join(sorted([*SCHEMA, *FREE_SECTIONS]))
            raise InputError(
                f"config {path.at(section)}: unknown section [{section}]; valid sections: {valid}"
            )
        if not isinstance(table, dict):
            raise InputError(f"config {path.at(section)}: [{section}] must be a table")
        for key, value in table.items():
            spec = SCHEMA[section].get(key)
            if spec is None:
                valid = ", ".join(sorted(SCHEMA[section]))
                raise InputError(
                    f"config {path.at(section, key)}: unknown key '{key}' in [{section}]; "
                    f"valid keys: {valid}"
                )
            types, _default = spec
            if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
                wanted = " or ".join(t.__name__ for t in types)
                raise InputError(
                    f"config {path.at(section, key)}: [{section}] {key} must be {wanted}, "
                    f"got {value!r}"
                )
            if isinstance(value, list) and not all(isinstance(v, str) for v in value):
                raise InputError(f"config {path}: [{section}] {key} must be a list of strings")
            if key == "gpu_hour_usd":
                bad = [
                    k
                    for k, v in value.items()
                    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0
                ]
                if bad:
                    raise InputError(
                        f"config {path}: [prices] gpu_hour_usd.{bad[0]} must be a non-negative number"
                    )
                value = {**DEFAULT_GPU_PRICES, **value}
            elif key == "red_line_tolerances":
                bad = [
                    k
                    for k, v in value.items()
                    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e9
                ]
                if bad:
                    raise InputError(
                        f"config {path.at(section, key)}: [metrics] red_line_tolerances.{bad[0]} "
                        "must be a non-negative number (the allowed absolute drop)"
                    )
            elif isinstance(value, dict) and not all(isinstance(v, str) for v in value.values()):
                raise InputError(f"config {path}: [{section}] {key} must map strings to strings")
            values[section][key] = value
    order = values["attribution"]["team_order"]
    unknown = [s for s in order if s not in TEAM_SOURCES]
    if unknown or not order:
        raise InputError(
            f"config {path.at('attribution', 'team_order')}: [attribution] team_order takes "
            f"{', '.join(TEAM_SOURCES)} in the order to try, got {order!r}"
        )
    if not 0 <= values["cost"]["default_gpus_per_run"] <= 1_000_000:
        raise InputError(
            f"config {path.at('cost', 'default_gpus_per_run')}: [cost] default_gpus_per_run "
            "must be a GPU count from 0 (unknown) to 1000000"
        )
    if not 1 <= values["mlflow"]["http_concurrency"] <= 64:
        raise InputError(
            f"config {path.at('mlflow', 'http_concurrency')}: [mlflow] http_concurrency "
            "must be a number of requests at a time from 1 to 64"
        )
    try:
        ZoneInfo(values["cluster"]["timezone"])
    except (ZoneInfoNotFoundError, ValueError):
        tz = values["cluster"]["timezone"]
        raise InputError(
            f"config {path.at('cluster', 'timezone')}: [cluster] timezone {tz!r} is not an IANA time zone "
            "(e.g. 'UTC', 'Europe/Amsterdam')"
        ) from None

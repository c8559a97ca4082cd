"""Loading and validating ``audit.toml``.

The configuration is data with a schema: every section and key is declared here with its
type and default, and an unknown key is an error that lists the valid ones.
"""

from __future__ import annotations

import copy
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from audit.errors import InputError, utf8_problem
from audit.watch.settings import WatchSettings, validate_watch

DEFAULT_CONFIG_NAME = "audit.toml"
TEAM_SOURCES = ("tag", "account", "user")

# Metric names of training-stability signals, exact keys as each framework logs them:
# TRL GRPO/PPO (`kl`, `entropy`, `reward`, `completions/clipped_ratio`,
# `clip_ratio/region_mean`; `objective/*`, `policy/*` for PPO), verl (`actor/*`,
# `critic/score/mean`, `response_length/clip_ratio`), OpenRLHF (`policy_loss`, `kl`,
# `ppo_kl`, `ppo_clip_ratio`, `entropy_loss`, `reward`), NeMo-RL (`train/loss`,
# `train/grad_norm`, `train/approx_entropy`, `train/reward`, `train/kl_penalty`) and
# Megatron (`lm loss`, `grad-norm`). A `train/` prefix is what the W&B and TensorBoard
# integrations add.
# The KL to the reference (or teacher) policy as the frameworks name it: TRL's GRPO/PPO
# (kl, objective/kl), verl (actor/kl_loss with use_kl_loss, actor/reward_kl_penalty with
# the KL in the reward), OpenRLHF (kl), on-policy distillation (reverse_kl).
REFERENCE_KL = [
    "kl",
    "train/kl",
    "objective/kl",
    "train/objective/kl",
    "actor/kl_loss",
    "actor/reward_kl_penalty",
    "reverse_kl",
    "train/reverse_kl",
    "distill/reverse_kl",
]

# what audit/facts/shift.py measures a run's distribution shift by
SHIFT_KINDS = ("explicit", "kl", "base_loss")

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

GPU_PRICE_MAX = 1e6  # USD per GPU-hour


def _number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) and abs(value) < 1e15 else f"{value:g}"


def _matching(name: str, globs: tuple[str, ...]) -> str | None:
    return next((g for g in globs if fnmatchcase(name, g)), None)


class Table(Mapping):
    """A read-only table of a section (a TOML table); unlike ``MappingProxyType`` it can be
    copied and pickled with the config."""

    def __init__(self, data: dict) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Table({self._data!r})"


def _frozen(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(value)
    if isinstance(value, dict | Table):
        return Table({k: _frozen(v) for k, v in value.items()})
    return value


def _key(types: tuple[type, ...], default: Any, bounds: tuple | None = None) -> Any:
    """A key of a section: the TOML types it takes, its default as written in TOML, and for
    numbers the range it must lie in (inclusive; finite always) and what it is in a message."""
    return field(
        default_factory=lambda: _frozen(default),
        metadata={"types": types, "default": default, "range": bounds},
    )


def texts(*default: str) -> Any:
    """A list of strings (globs, key names, methods)."""
    return _key((list,), list(default))


def text(default: str) -> Any:
    return _key((str,), default)


def table(default: dict | None = None) -> Any:
    """A TOML table, checked key by key where the section says how."""
    return _key((dict,), default or {})


def number(default: float, low: float | None = None, high: float | None = None, what: str = ""):
    return _key((int, float), default, None if low is None else (low, high, what))


def whole(default: int, low: float | None = None, high: float | None = None, what: str = ""):
    return _key((int,), default, None if low is None else (low, high, what))


# The sections of audit.toml: every key with its type, its default and its range, declared
# once. The code reads them typed and frozen (lists as tuples, tables as read-only
# mappings), built once from the validated file; SCHEMA and RANGES below, and the
# configuration reference (docs/configuration.md, `make docs`), come from these.
@dataclass(frozen=True)
class PricesSection:
    # card name -> USD per GPU-hour, over the catalogue of audit/facts/prices.py (keys read
    # like card names: "H100", "A100 80GB"); "default" for unknown cards
    gpu_hour_usd: Mapping[str, float] = table()
    # cluster -> {card name -> USD per GPU-hour}: a cluster's own prices first
    by_cluster: Mapping[str, Mapping[str, float]] = table()
    # object storage list price per GB-month
    storage_gb_month_usd: float = number(0.023, 0, 1e6, "a price in USD per GB-month")


# the benchmark kinds of [metrics], in the order ``kind_of`` tries them
BENCHMARK_KINDS = ("red_lines", "general", "target")


@dataclass(frozen=True)
class MetricsSection:
    general: tuple[str, ...] = texts("eval/general/*")  # globs: general-capability benchmarks
    target: tuple[str, ...] = texts("eval/target/*")  # globs: the task being trained for
    # globs: metrics that must never drop below the baseline (safety, refusal, ...); higher
    # is better, tolerance 0 unless red_line_tolerances gives one
    red_lines: tuple[str, ...] = texts("eval/safety/*")
    # glob -> allowed absolute drop for the red lines it matches (first match wins)
    red_line_tolerances: Mapping[str, float] = table()
    # globs of metrics whose direction the name does not tell (or tells wrong): an explicit
    # statement wins over the name (audit/facts/direction.py)
    higher_is_better: tuple[str, ...] = texts()
    lower_is_better: tuple[str, ...] = texts()
    # Training-stability series (STB001). Defaults cover the names TRL (HF Trainer adds
    # train/ when it logs to W&B, not to MLflow), verl, OpenRLHF and NeMo-RL log.
    loss: tuple[str, ...] = texts(*STABILITY_METRICS["loss"])
    grad_norm: tuple[str, ...] = texts(*STABILITY_METRICS["grad_norm"])
    kl: tuple[str, ...] = texts(*STABILITY_METRICS["kl"])
    entropy: tuple[str, ...] = texts(*STABILITY_METRICS["entropy"])
    reward: tuple[str, ...] = texts(*STABILITY_METRICS["reward"])
    truncation: tuple[str, ...] = texts(*STABILITY_METRICS["truncation"])
    policy_clip: tuple[str, ...] = texts(*STABILITY_METRICS["policy_clip"])
    # globs: a distribution-shift measure the team logs itself (a probe-set KL to the base
    # model, the base model's perplexity on the data): audit/facts/shift.py
    shift: tuple[str, ...] = texts()
    # the KL to the reference or teacher policy (not [metrics] kl: verl's actor/ppo_kl is one
    # update's step, old policy to new, and says nothing of the distance travelled)
    reference_kl: tuple[str, ...] = texts(*REFERENCE_KL)

    def globs(self, kind: str) -> tuple[str, ...]:
        """The globs of one kind of metric (``general``, ``loss``, ``reference_kl`` ...)."""
        return getattr(self, kind)

    def matches(self, name: str, kind: str) -> bool:
        return _matching(name, self.globs(kind)) is not None

    def kind_of(self, name: str, kinds: tuple[str, ...] = BENCHMARK_KINDS) -> str | None:
        """The first of ``kinds`` whose globs match the metric: by default whether it is a
        red line, a general or a target benchmark."""
        return next((k for k in kinds if self.matches(name, k)), None)

    def direction_of(self, name: str) -> tuple[str, str] | None:
        """(``higher_is_better`` or ``lower_is_better``, the glob) when the config states
        the metric's direction; the statement wins over the name (audit/facts/direction.py)."""
        for key in ("lower_is_better", "higher_is_better"):
            glob = _matching(name, self.globs(key))
            if glob is not None:
                return key, glob
        return None

    def red_line_tolerance(self, name: str) -> float:
        """The allowed drop of a red-line metric: the first glob of red_line_tolerances
        that matches it, else 0 (RED001 and ``audit gate`` agree)."""
        glob = _matching(name, tuple(self.red_line_tolerances))
        return 0.0 if glob is None else float(self.red_line_tolerances[glob])


@dataclass(frozen=True)
class AttributionSection:
    team_tag: str = text("team")  # run tag naming the team
    # where a run's or job's team comes from, first known wins: the run tag team_tag, the
    # Slurm account, the user (spend and waste are attributed the same way)
    team_order: tuple[str, ...] = texts(*TEAM_SOURCES)
    # param or tag: sft / rl / opd
    method_keys: tuple[str, ...] = texts("method", "training_method")
    # verl names the model it starts from model.partial_pretrain (SFT trainer) and
    # actor_rollout_ref.model.path (PPO/GRPO trainer)
    base_model_keys: tuple[str, ...] = texts(
        "base_model", "model_name_or_path", "model.partial_pretrain", "actor_rollout_ref.model.path"
    )
    baseline_tag: str = text("audit.baseline")
    # methods whose runs evaluate a model instead of training one
    eval_methods: tuple[str, ...] = texts("eval", "evaluation")
    # methods that train on a fixed external dataset (SFT) and methods that sample the
    # model's own distribution (RL): what audit/facts/shift.py measures each by
    sft_methods: tuple[str, ...] = texts("sft", "lora", "qlora", "finetune", "fine-tune", "full")
    rl_methods: tuple[str, ...] = texts(
        "rl", "grpo", "ppo", "rloo", "dapo", "reinforce", "reinforce++", "online-dpo"
    )
    # methods that learn from a teacher model, and where the teacher is recorded
    distillation_methods: tuple[str, ...] = texts("opd", "distill", "distillation", "kd", "gkd")
    teacher_keys: tuple[str, ...] = texts(
        "teacher", "teacher_model", "teacher_model_name_or_path", "teacher_name_or_path"
    )
    # a run's training data when no dataset input is logged: the first param or tag set
    dataset_keys: tuple[str, ...] = texts(
        "dataset", "dataset_name", "data.train_files", "train_file"
    )
    # what makes two runs the same recipe at another size (PIL001): method, base_model and
    # dataset as attributed, any other name a param or tag
    family_keys: tuple[str, ...] = texts("method", "base_model", "dataset")
    # the model or checkpoint an evaluation run evaluated: the first param or tag set
    evaluated_model_keys: tuple[str, ...] = texts(
        "checkpoint",
        "checkpoint_path",
        "model_path",
        "model_name_or_path",
        "pretrained",
        "model",
        "base_model",
    )
    ignore_tag: str = text("audit.ignore")
    # params that name where or how a run was launched, not what it trained
    volatile_params: tuple[str, ...] = texts(
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
    )

    def is_evaluation_method(self, method: str | None) -> bool:
        """A method whose runs evaluate a model (audit.facts.evaluations.EvaluationRuns
        adds what the records tell)."""
        return (method or "") in self.eval_methods


@dataclass(frozen=True)
class CostSection:
    # GPU count of a run without a Slurm job or a GPU list: the first of these params or tags
    # that holds a positive whole number; "a*b" multiplies two keys. Defaults cover
    # HF/torchrun, verl (trainer.*), NeMo-RL (cluster.*) and OpenRLHF naming.
    gpu_count_keys: tuple[str, ...] = texts(
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
    )
    # the GPU list a run recorded itself (params or tags): the GPUs it was given
    gpu_list_keys: tuple[str, ...] = texts(
        "CUDA_VISIBLE_DEVICES", "env.CUDA_VISIBLE_DEVICES", "cuda_visible_devices"
    )
    gpu_type_keys: tuple[str, ...] = texts("gpu_type", "gpu_name", "gpu_model")
    # assumed for runs with no other evidence; 0 leaves their cost unknown
    default_gpus_per_run: float = number(0, 0, 1_000_000, "a GPU count (0: unknown)")
    default_gpu_type: str = text("")


@dataclass(frozen=True)
class ClusterSection:
    timezone: str = text("UTC")


# What evaluations mean (audit/facts/evaluations.py)
@dataclass(frozen=True)
class EvaluationsSection:
    # tasks that measure general ability (globs over lm-eval task names): the REG rules work
    # on evaluations of these with no [metrics] globs
    general_tasks: tuple[str, ...] = texts(
        "mmlu*",
        "hendrycksTest-*",
        "arc*",
        "hellaswag*",
        "winogrande*",
        "gsm8k*",
        "ifeval*",
        "truthfulqa*",
        "bbh*",
        "gpqa*",
        "musr*",
        "math*",
        "minerva_math*",
        "hendrycks_math*",
        "piqa",
        "boolq",
        "openbookqa",
        "commonsense_qa",
        "social_iqa",
        "siqa",
        "lambada*",
        "agieval*",
        "drop",
        "triviaqa",
        "nq_open",
        "humaneval*",
        "mbpp*",
        "leaderboard_*",
        "bigbench*",
        "race",
        "sciq",
        "logiqa*",
        "copa",
        "anli*",
    )
    # fine-tuned model -> the model it was tuned from, where names do not tell
    base_models: Mapping[str, str] = table()
    # params or tags of an evaluation run that name the training run it evaluated
    training_run_keys: tuple[str, ...] = texts(
        "training_run_id", "train_run_id", "source_run_id", "audit.evaluates_run"
    )


# Findings under these floors are summed per rule and team, not listed; severity follows the
# impact (audit/materiality.py says why each default is what it is).
@dataclass(frozen=True)
class MaterialitySection:
    min_gpu_hours: float = number(1.0)
    min_run_hours: float = number(0.5)
    min_gb: float = number(1.0)
    medium_gpu_hours: float = number(10.0)
    high_gpu_hours: float = number(100.0)
    medium_gb: float = number(100.0)
    high_gb: float = number(1000.0)
    # family (e.g. "DUP") -> {min_gpu_hours, min_run_hours, min_gb}
    families: Mapping[str, Mapping[str, float]] = table()


# Distribution shift and the method matrix (audit/facts/shift.py says why each is so)
@dataclass(frozen=True)
class ShiftSection:
    # runs of a base model and measure below which the team's own history is too thin to
    # place a run (the whole warehouse's history of the base model is used instead)
    min_history: int = whole(5)
    # measure kind ("base_loss", "kl", "explicit") -> the value above which a run is far
    # when there is no history to compare with (a team's own knowledge; none by default)
    far_above: Mapping[str, float] = table()
    # a cell of the method matrix recommends a method from this many runs with a measured
    # outcome, and a method from this many of its own
    min_cell_runs: int = whole(3)
    min_method_runs: int = whole(2)


@dataclass(frozen=True)
class LinksSection:
    job_tag_keys: tuple[str, ...] = texts("slurm_job_id", "slurm.job_id", "SLURM_JOB_ID")
    time_slack_minutes: float = number(5, 0, 525_600, "a number of minutes")
    # paths as logged on the cluster -> where the same files are seen from here
    path_prefixes: Mapping[str, str] = table()


@dataclass(frozen=True)
class MlflowSection:
    tracking_url: str = text("")  # MLflow UI base URL for run links in reports
    http_timeout_seconds: float = number(30, 0.001, 86_400, "a number of seconds")
    http_max_retries: int = whole(5, 0, 100, "a number of retries")
    http_backoff_seconds: float = number(0.5, 0, 3_600, "a number of seconds")
    page_size: int = whole(1000, 1, 100_000, "a number of items per page")
    # requests to a tracking server at a time: searches of separate experiments and
    # metric-history requests overlap, bounded so a shared server is not flooded
    http_concurrency: int = whole(4, 1, 64, "a number of requests at a time")
    # a larger answer is refused, not buffered
    max_response_mb: float = number(512, 0.001, 1_000_000, "a number of megabytes")


@dataclass(frozen=True)
class SqlSection:
    # `audit sql` stops a query after this long
    timeout_seconds: float = number(60, 0.001, 1e9, "a number of seconds")


# audit ingest prometheus (checked by audit.importers.prometheus.exporters)
@dataclass(frozen=True)
class PrometheusSection:
    # auto (the first found of dcgm, jobstats, nvidia_gpu_exporter), one of them, or custom
    # (metrics.util and the others below)
    exporter: str = text("auto")
    # field -> metric name, times or divided by a factor into %, MiB, W or J: util,
    # util_alt, mem_used, mem_free, mem_total, power, energy
    metrics: Mapping[str, Any] = table()
    # field -> label names tried in order: host, gpu, uuid, model, job, pod, namespace, mig
    labels: Mapping[str, Any] = table()
    # window length -> bucket width, for a first import without --step
    resolution: Mapping[str, str] = table({"1d": "1m", "7d": "5m", "longer": "15m"})
    max_points_per_series: int = whole(11_000)  # Prometheus' own limit per query
    max_points_per_query: int = whole(500_000)  # the sample budget of one query
    concurrency: int = whole(4)
    timeout_seconds: float = number(60)  # one request, answer included
    max_retries: int = whole(3)
    backoff_seconds: float = number(0.5)
    max_response_mb: float = number(256)


SECTIONS: dict[str, type] = {
    "prices": PricesSection,
    "metrics": MetricsSection,
    "attribution": AttributionSection,
    "cost": CostSection,
    "cluster": ClusterSection,
    "evaluations": EvaluationsSection,
    "materiality": MaterialitySection,
    "shift": ShiftSection,
    "links": LinksSection,
    "mlflow": MlflowSection,
    "sql": SqlSection,
    "prometheus": PrometheusSection,
}

# section -> key -> (expected python type(s), default as TOML writes it): what a file is
# validated against. A table's values are validated by their consumer.
SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], Any]]] = {
    name: {f.name: (f.metadata["types"], f.metadata["default"]) for f in fields(section)}
    for name, section in SECTIONS.items()
}
# Numeric settings: the range each must lie in (inclusive; finite always), and what it is
# in a message. A NaN, infinite, negative or absurd value ends in exit 2 naming the key:
# unchecked, NaN slack and a negative backoff ended in internal errors, an infinite price
# made the JSON report invalid and a negative one showed -$291 M of waste.
RANGES: dict[tuple[str, str], tuple[float, float, str]] = {
    (name, f.name): f.metadata["range"]
    for name, section in SECTIONS.items()
    for f in fields(section)
    if f.metadata["range"] is not None
}


@dataclass
class Config:
    """Validated configuration, with defaults filled in: typed sections (``config.metrics``,
    ``config.attribution`` ...) over ``values``, the settings as validated (hashed by
    ``digest``)."""

    values: dict[str, dict[str, Any]]
    path: Path | None = None
    raw_text: str = field(default="", repr=False)
    prices: PricesSection = field(init=False, repr=False)
    metrics: MetricsSection = field(init=False, repr=False)
    attribution: AttributionSection = field(init=False, repr=False)
    cost: CostSection = field(init=False, repr=False)
    cluster: ClusterSection = field(init=False, repr=False)
    evaluations: EvaluationsSection = field(init=False, repr=False)
    materiality: MaterialitySection = field(init=False, repr=False)
    shift: ShiftSection = field(init=False, repr=False)
    links: LinksSection = field(init=False, repr=False)
    mlflow: MlflowSection = field(init=False, repr=False)
    sql: SqlSection = field(init=False, repr=False)
    prometheus: PrometheusSection = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name, section in SECTIONS.items():
            table = {key: _frozen(value) for key, value in self.values[name].items()}
            setattr(self, name, section(**table))

    @property
    def rules(self) -> Mapping[str, Mapping[str, Any]]:
        """``[rules.CODE]`` tables as written (audit.rule_registry checks them)."""
        return self.values["rules"]

    @property
    def suppress(self) -> tuple[dict[str, str], ...]:
        return tuple(self.values["suppress"])

    @property
    def watch(self) -> WatchSettings:
        return self.values["watch"]

    def with_rule_settings(self, code: str, **settings: Any) -> Config:
        """A copy whose ``[rules.CODE]`` table has ``settings`` on top of what it says."""
        rules = {**copy.deepcopy(self.values["rules"])}
        rules[code] = {**rules.get(code, {}), **settings}
        return replace(self, values={**self.values, "rules": rules})

    @property
    def digest(self) -> str:
        """Hash of the effective settings, stored with each scan."""
        import hashlib
        import json

        # [watch] changes what `audit watch` does, never a rule's verdict
        judged = {k: v for k, v in self.values.items() if k != "watch"}
        return hashlib.sha1(json.dumps(judged, sort_keys=True, default=str).encode()).hexdigest()[
            :12
        ]

    def local_path(self, text: str) -> str:
        """A path from a config value: relative ones are relative to the config file."""
        if self.path is None or Path(text).is_absolute():
            return text
        return str((self.path.parent / text).resolve())

    @property
    def timezone(self) -> ZoneInfo:
        return ZoneInfo(self.cluster.timezone)


def _check_prices(table: dict, where: str) -> None:
    """A table of card name -> USD per GPU-hour: finite, from 0 to a million."""
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(f"{where}.{name} must be a number (USD per GPU-hour), got {value!r}")
        if not math.isfinite(value) or not 0 <= value <= GPU_PRICE_MAX:
            raise InputError(
                f"{where}.{name} must be a finite number from 0 to {_number(GPU_PRICE_MAX)}, "
                f"got {value!r}"
            )


def defaults() -> dict[str, dict[str, Any]]:
    values: dict[str, Any] = {
        section: {key: copy.deepcopy(spec[1]) for key, spec in keys.items()}
        for section, keys in SCHEMA.items()
    }
    values["rules"] = {}
    values["suppress"] = []
    values["watch"] = WatchSettings()
    return values


def _merge_rules(values: dict, table: Any, path: _Locator) -> None:
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise InputError(
            f"config {path}: [rules] holds one table per rule code, e.g. [rules.OVP001]"
        )
    # kept as written: rules own their threshold schemas, and audit.rule_registry checks
    # these tables against them (check_rule_settings) when a command loads the config
    for code, settings in table.items():
        values["rules"][code.upper()] = dict(settings)


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
# threshold schema (audit.rule_registry), [[suppress]] entries here, [watch] by
# audit.watch.settings.
FREE_SECTIONS = ("rules", "suppress", "watch")


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
        if section == "watch":
            values["watch"] = validate_watch(table, path.at("watch"))
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
            if (section, key) in RANGES:
                lo, hi, what = RANGES[(section, key)]
                if not (math.isfinite(value) and lo <= value <= hi):
                    raise InputError(
                        f"config {path.at(section, key)}: [{section}] {key} must be {what} "
                        f"from {_number(lo)} to {_number(hi)}; got {value!r}"
                    )
            if key == "gpu_hour_usd":
                _check_prices(value, f"config {path.at(section, key)}: [prices] gpu_hour_usd")
            elif key == "by_cluster":
                for cluster, table in value.items():
                    where = f"config {path.at(section, key)}: [prices] by_cluster.{cluster}"
                    if not isinstance(table, dict):
                        raise InputError(f"{where} must be a table of card = USD per GPU-hour")
                    _check_prices(table, where)
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
            elif key == "far_above":
                bad = [
                    k
                    for k, v in value.items()
                    if k not in SHIFT_KINDS
                    or isinstance(v, bool)
                    or not isinstance(v, int | float)
                    or not math.isfinite(v)
                ]
                if bad:
                    raise InputError(
                        f"config {path.at(section, key)}: [shift] far_above.{bad[0]} must be a "
                        f"finite number, keyed by a measure kind ({', '.join(SHIFT_KINDS)})"
                    )
            elif section == "shift" and not 1 <= value <= 1_000_000:
                raise InputError(
                    f"config {path.at(section, key)}: [shift] {key} must be a count of runs "
                    f"from 1 to 1000000, got {value!r}"
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
    try:
        ZoneInfo(values["cluster"]["timezone"])
    except (ZoneInfoNotFoundError, ValueError):
        tz = values["cluster"]["timezone"]
        raise InputError(
            f"config {path.at('cluster', 'timezone')}: [cluster] timezone {tz!r} is not an IANA time zone "
            "(e.g. 'UTC', 'Europe/Amsterdam')"
        ) from None

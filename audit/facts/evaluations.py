"""Evaluations: what was evaluated, on what, with which settings — wherever it was recorded.

An *evaluation* is one model evaluated on one task with one set of settings, with its
results (metric, filter → value). They come from:

1. ``audit ingest evals`` (lm-evaluation-harness results files): table ``eval_results``,
   with the direction lm-eval records (``higher_is_better``) and the task's settings;
2. lm-evaluation-harness runs logged to a tracker (MLflow, W&B): recognised without any
   configuration by their metric names (``<task>/<metric>,<filter>`` as lm-eval's W&B
   logger writes them, or the sanitised ``<task>/<metric>_<filter>``, e.g. ``acc_none``)
   or by an ``lm_eval``-style ``model_args`` param; the task of a bare ``acc,none`` is the
   run's ``task``/``tasks`` param when it names one;
3. evaluation runs of the team's own (``[attribution] eval_methods``, or the tag
   ``audit.kind=evaluation``): each metric is a task, and the evaluated model is the first
   of ``[attribution] evaluated_model_keys``;
4. ``eval`` series inside a training run (HF Trainer's ``eval_loss``, ``eval/general/mmlu``):
   evaluations of the run's own model, during training.

An evaluation's *identity* is (model, model revision, adapter, task, settings): n-shot,
limit, task version and hash, chat template, system instruction, few-shot as multi-turn,
generation kwargs. Two evaluations are the same only when every part is equal: an mmlu and
a commonsense_qa run of one model are two evaluations; a batch size is not a setting.

What an evaluation evaluated is *linked* to what produced it (``Evaluations.training_run``):
a model path under a training run's ``output_dir`` (or another output folder key), one of
its checkpoints, its ``hub_model_id``, or its run id in the evaluation's params or tags.
A fine-tuned model's *base* (``Evaluations.base_of``): its training run's base model; the
``pretrained=`` model of an adapter (``peft=``); the hub convention that ``<name>-Instruct``,
``-it``, ``-chat`` is tuned from ``<name>``; or ``[evaluations] base_models`` when the team
says otherwise. A different ``model_sha``/revision is a different model.

General-ability tasks are ``[evaluations] general_tasks`` (globs over task names: mmlu,
arc, hellaswag, gsm8k, ifeval, truthfulqa, winogrande, bbh, gpqa, math, humaneval, the Open
LLM Leaderboard's ``leaderboard_*`` … by default) and the metrics of ``[metrics] general``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase
from functools import cached_property

from audit.config import AttributionSection, Config
from audit.costs import Facts, RunFacts
from audit.facts.direction import Direction, Directions

# lm-eval's filter names (the part after the comma of "acc,none"), as its task configs
# name them; the sanitised form replaces the comma by an underscore ("acc_none")
FILTERS = (
    "none",
    "strict-match",
    "flexible-extract",
    "strict_match",
    "flexible_extract",
    "get-answer",
    "remove_whitespace",
    "create_test",
    "score-first",
    "maj@64",
    "maj@8",
    "pass@1",
)
# metric names lm-eval reports (its registry and common task configs)
LM_EVAL_METRICS = frozenset(
    {
        "acc",
        "acc_norm",
        "exact_match",
        "em",
        "f1",
        "mcc",
        "bleu",
        "chrf",
        "ter",
        "rouge1",
        "rouge2",
        "rougeL",
        "rougeLsum",
        "perplexity",
        "word_perplexity",
        "byte_perplexity",
        "bits_per_byte",
        "pass@1",
        "pass@10",
        "prompt_level_strict_acc",
        "inst_level_strict_acc",
        "prompt_level_loose_acc",
        "inst_level_loose_acc",
        "mc1",
        "mc2",
        "brier_score",
        "likelihood",
        "contains",
        "llm_judge",
    }
)
# A task's task hash is written only with --log_samples: an evaluation without one is not
# a different evaluation, so the hash is compared only where both have it (``Evaluation``)
SETTING_KEYS = (
    "n_shot",
    "limit",
    "task_version",
    "chat_template",
    "system_instruction",
    "fewshot_as_multiturn",
    "gen_kwargs",
)
# params of an output folder a training run writes its model to
OUTPUT_KEYS = (
    "output_dir",
    "trainer.default_local_dir",
    "save_dir",
    "output.dir",
    "checkpoint_dir",
)
# a run with one of these params is recognisably training (a learning rate)
LEARNING_RATE_KEYS = ("learning_rate", "*.learning_rate", "lr", "*.lr", "*_lr")
# what the training series of [metrics] are called (a loss, a reward, a KL): a run that
# logs one trains
TRAINING_SERIES = ("loss", "grad_norm", "kl", "reward", "entropy")
# A task's headline metric, first present wins (the Open LLM Leaderboard's choices:
# acc_norm for hellaswag and arc, acc for mmlu and winogrande, strict exact match for
# gsm8k, prompt-level strict accuracy for ifeval, pass@1 for code); filters likewise
PRIMARY_METRICS = (
    "acc_norm",
    "acc",
    "exact_match",
    "prompt_level_strict_acc",
    "inst_level_strict_acc",
    "pass@1",
    "pass_at_1",
    "mc2",
    "f1",
    "em",
    "llm_judge",
    "bleu",
    "chrf",
    "rougeL",
    "word_perplexity",
    "perplexity",
    "bits_per_byte",
)
PRIMARY_FILTERS = ("strict-match", "none", "", "flexible-extract")
_HUB_SUFFIX = re.compile(r"[-_](?:instruct|it|chat)$", re.IGNORECASE)
_KEY_WITH_FILTER = re.compile(r"^(?:(?P<task>.+)/)?(?P<metric>[^/,]+),(?P<filter>[^/,]+)$")


@dataclass(frozen=True)
class Result:
    value: float
    higher_is_better: bool | None = None
    stderr: float | None = None


@dataclass
class Evaluation:
    run: RunFacts  # the run that holds it (an evaluation run, a results file, a training run)
    model: str | None  # what was evaluated, normalised (None: the holding run's own model)
    revision: str | None
    adapter: str | None
    task: str
    settings: tuple[tuple[str, str], ...]
    results: dict[tuple[str, str], Result] = field(default_factory=dict)
    source: str = ""  # results file | tracker run | evaluation run | training run
    general: bool = False
    at: datetime | None = None
    task_hash: str | None = None  # recorded only with --log_samples: None is unknown
    is_group: bool = False  # an aggregate of subtasks (mmlu over its 57)
    label: str | None = None  # the model as the source spelled it, for messages

    @property
    def primary(self) -> tuple[str, str] | None:
        """The task's headline (metric, filter): ``PRIMARY_METRICS`` then
        ``PRIMARY_FILTERS``; a single result is its own headline."""
        if len(self.results) == 1:
            return next(iter(self.results))
        for metric in PRIMARY_METRICS:
            for lm_filter in (*PRIMARY_FILTERS, *sorted(f for m, f in self.results if m == metric)):
                if (metric, lm_filter) in self.results:
                    return metric, lm_filter
        return None

    def same_hash(self, other: Evaluation) -> bool:
        """Whether the task hashes do not tell the two apart (one unknown, or equal)."""
        return (
            self.task_hash is None or other.task_hash is None or self.task_hash == other.task_hash
        )

    @property
    def model_identity(self) -> tuple:
        return (self.model, self.revision, self.adapter)

    @property
    def identity(self) -> tuple:
        return (*self.model_identity, self.task, self.settings)

    @property
    def in_training(self) -> bool:
        return self.source == "training run"


def normalise_model(text: str | None) -> str | None:
    """A model name or path as evaluations and training runs are matched on it."""
    if not text:
        return None
    text = str(text).strip().removeprefix("file://")
    if "/" in text and (text.startswith(("/", "./", "../", "~"))):
        text = os.path.normpath(text)
    return text.rstrip("/").lower() or None


def parse_model_args(text: str | None) -> dict[str, str]:
    """lm-eval's ``model_args``: "pretrained=x,revision=y,peft=z" or a JSON object."""
    if not text:
        return {}
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def split_metric_key(key: str, single_task: str | None) -> tuple[str, str, str] | None:
    """(task, metric, filter) of an lm-eval metric key as a tracker logged it, or None."""
    match = _KEY_WITH_FILTER.match(key)
    if match:
        task = match.group("task") or single_task
        return (task, match.group("metric"), match.group("filter")) if task else None
    task, _, name = key.rpartition("/")
    for lm_filter in FILTERS:
        suffix = "_" + lm_filter.replace("-", "_")
        if name.endswith(suffix) or name.endswith("_" + lm_filter):
            metric = name[: -len(suffix)] if name.endswith(suffix) else name[: -len(lm_filter) - 1]
            if metric in LM_EVAL_METRICS:
                task = task or single_task
                return (task, metric, lm_filter.replace("_", "-")) if task else None
    return None


def lm_eval_metrics(keys, values: dict[str, str]) -> dict[str, tuple[str, str, str]]:
    """A run's lm-evaluation-harness metrics, key -> (task, metric, filter), when the run is
    an lm-eval run (lm-eval's own ``acc,none`` spelling, or its sanitised ``acc_none`` with
    lm-eval's ``model_args``/``tasks`` params in ``values``); else empty."""
    tasks = [t for t in re.split(r"[,\s]+", values.get("tasks") or values.get("task") or "") if t]
    single = tasks[0] if len(tasks) == 1 else None
    parsed = {key: split_metric_key(key, single) for key in keys}
    found = {k: p for k, p in parsed.items() if p is not None}
    if any("," in k for k in found) or (found and (values.get("model_args") or tasks)):
        return found
    return {}


# params or tags that tell an lm-eval run or a declared evaluation run
EVALUATION_RUN_KEYS = ("audit.kind", "model_args", "task", "tasks")


@dataclass(frozen=True)
class EvaluationRuns:
    """Which runs evaluate a model rather than train one: the one definition, read by the
    evaluations below, the recipes (``audit.recipes``), the method matrix, the summary's
    evaluation spend and STB001.

    A run evaluates when it has results in ``eval_results`` (``audit ingest evals``), logged
    lm-eval's metrics (``lm_eval_metrics``), is tagged ``audit.kind=evaluation``, or its
    method is one of ``[attribution] eval_methods``."""

    keys: frozenset[tuple]  # runs recognised by their records (the first three above)
    attribution: AttributionSection

    def is_evaluation_run(self, run: RunFacts) -> bool:
        return run.key in self.keys or self.attribution.is_evaluation_method(run.method)

    @classmethod
    def load(cls, con, config: Config, facts: Facts) -> EvaluationRuns:
        key_of = facts.key_of
        keys = set()
        if _has_results_table(con):
            keys = {
                key_of(source_id, run_id)
                for source_id, run_id in con.execute(
                    "SELECT DISTINCT source_id, run_id FROM eval_results "
                    "WHERE value IS NOT NULL AND isfinite(value)"
                ).fetchall()
            }
        values = _run_values(con, facts, list(EVALUATION_RUN_KEYS))
        keys |= {k for k, v in values.items() if v.get("audit.kind") == "evaluation"}
        # only the metric names lm-eval could have written are read per run
        candidates = [
            key
            for (key,) in con.execute(
                "SELECT DISTINCT key FROM latest_metrics WHERE NOT starts_with(key, 'system/')"
            ).fetchall()
            if split_metric_key(key, "task") is not None
        ]
        logged: dict[tuple, list[str]] = {}
        if candidates:
            for source_id, run_id, key in con.execute(
                "SELECT source_id, run_id, key FROM latest_metrics WHERE list_contains(?, key) "
                "AND value IS NOT NULL AND isfinite(value)",
                [candidates],
            ).fetchall():
                logged.setdefault(key_of(source_id, run_id), []).append(key)
        keys |= {k for k, names in logged.items() if lm_eval_metrics(names, values.get(k, {}))}
        return cls(frozenset(keys), config.attribution)


def shared_evaluation_runs(
    con, config: Config, facts: Facts, shared: dict | None
) -> EvaluationRuns:
    """The evaluation runs of ``shared`` (the per-scan cache of rules and reports), once."""
    if shared is None:
        return EvaluationRuns.load(con, config, facts)
    if ("evaluation runs",) not in shared:
        shared[("evaluation runs",)] = EvaluationRuns.load(con, config, facts)
    return shared[("evaluation runs",)]


class Evaluations:
    """Every evaluation of the warehouse, read once, with the links between models."""

    def __init__(self, con, config: Config, facts: Facts, runs: EvaluationRuns | None = None):
        self.config = config
        self.facts = facts
        self.runs = runs if runs is not None else EvaluationRuns.load(con, config, facts)
        settings = config.evaluations
        self.general_tasks = settings.general_tasks
        self.general_metrics = config.metrics.general
        self.base_models = {normalise_model(k): v for k, v in settings.base_models.items()}
        self.directions = Directions(config)
        params = _run_values(con, facts, self._param_keys(config))
        self._params = params
        self._with_results: set[tuple] = set()  # runs read from eval_results
        self.all: list[Evaluation] = []
        self._from_results_table(con, params)
        self._from_tracker_runs(con, params)
        self._outputs = self._training_outputs(con, params)
        self._training_signals = self._runs_that_train(con)
        self._by_model: dict[tuple, list[Evaluation]] = {}
        for evaluation in self.all:
            if evaluation.model is not None:
                self._by_model.setdefault(evaluation.model_identity, []).append(evaluation)

    # -- what counts -------------------------------------------------------------------
    def is_general(self, task: str) -> bool:
        return any(fnmatchcase(task.lower(), g.lower()) for g in self.general_tasks) or any(
            fnmatchcase(task, g) for g in self.general_metrics
        )

    def is_training(self, run: RunFacts) -> bool:
        """Whether a run trains a model: not an evaluation, and a training method, a
        learning-rate param, or a training series (a loss, reward or KL of [metrics])."""
        if self.runs.is_evaluation_run(run):
            return False
        return run.method is not None or run.key in self._training_signals

    def is_fine_tuned(self, model_identity: tuple) -> bool:
        """Whether an evaluated model is a team's tuned model rather than a published
        base: an adapter, a model whose base the names tell, or a local checkpoint path."""
        model, _revision, adapter = model_identity
        if adapter or model is None:
            return adapter is not None
        return self.base_of(model) is not None or model.startswith(("/", "./", "~"))

    def direction(self, metric: str, result: Result) -> Direction | None:
        return self.directions(metric, result.higher_is_better)

    # -- loading -----------------------------------------------------------------------
    @staticmethod
    def _param_keys(config: Config) -> list[str]:
        return sorted(
            {
                "model",
                "model_args",
                "model_name",
                "model_revision",
                "model_sha",
                "peft",
                "task",
                "tasks",
                "num_fewshot",
                "limit",
                "chat_template",
                "system_instruction",
                "fewshot_as_multiturn",
                "gen_kwargs",
                "hub_model_id",
                "audit.kind",
                *OUTPUT_KEYS,
                *config.attribution.evaluated_model_keys,
                *config.evaluations.training_run_keys,
            }
        )

    def _model_of(self, values: dict[str, str]) -> tuple[str | None, str | None, str | None]:
        model, revision, adapter, _label = self._model_and_label(values)
        return model, revision, adapter

    def _model_and_label(self, values: dict[str, str]) -> tuple:
        args = parse_model_args(values.get("model_args"))
        model = (
            args.get("pretrained")
            or args.get("model")
            or values.get("model_name")
            or next(
                (values[k] for k in self.config.attribution.evaluated_model_keys if values.get(k)),
                None,
            )
        )
        revision = args.get("revision") or values.get("model_revision") or values.get("model_sha")
        adapter = args.get("peft") or values.get("peft")
        label = (adapter or model or "").strip() or None
        return normalise_model(model), revision or None, normalise_model(adapter), label

    def _from_results_table(self, con, params: dict) -> None:
        if not _has_results_table(con):
            return
        rows = con.execute(
            """
            SELECT source_id, run_id, task, metric, filter, value, stderr, higher_is_better,
                   n_shot, limit_n, task_version, task_hash, gen_kwargs, is_group
            FROM eval_results WHERE value IS NOT NULL AND isfinite(value)
            ORDER BY source_id, run_id, task, metric, filter
            """
        ).fetchall()
        grouped: dict[tuple, Evaluation] = {}
        for row in rows:
            source_id, run_id, task, metric, lm_filter, value, stderr, better = row[:8]
            n_shot, limit, version, task_hash, gen_kwargs, is_group = row[8:]
            run = self.facts.run(source_id, run_id)
            if run is None:
                continue
            self._with_results.add(run.key)
            values = params.get(run.key, {})
            identity = self._model_and_label(values)
            settings = _settings(
                n_shot=n_shot,
                limit=limit,
                task_version=version,
                chat_template=values.get("chat_template"),
                system_instruction=values.get("system_instruction"),
                fewshot_as_multiturn=values.get("fewshot_as_multiturn"),
                gen_kwargs=gen_kwargs or values.get("gen_kwargs"),
            )
            key = (run.key, task)
            if key not in grouped:
                grouped[key] = self._evaluation(
                    run, identity, task, settings, "results file", task_hash=task_hash or None
                )
            grouped[key].results[(metric, lm_filter or "")] = Result(value, better, stderr)
            grouped[key].is_group = grouped[key].is_group or bool(is_group)

    def _from_tracker_runs(self, con, params: dict) -> None:
        """lm-eval runs in trackers, the team's evaluation runs, and eval series of
        training runs: from their latest metrics."""
        latest: dict[tuple, dict[str, float]] = {}
        for source_id, run_id, key, value in con.execute(
            """
            SELECT source_id, run_id, key, value FROM latest_metrics
            WHERE value IS NOT NULL AND isfinite(value) AND NOT starts_with(key, 'system/')
            ORDER BY source_id, run_id, key
            """
        ).fetchall():
            latest.setdefault((source_id, run_id), {})[key] = value
        for run in self.facts.runs:
            if run.key in self._with_results or run.key not in latest:
                continue
            values = params.get(run.key, {})
            metrics = latest[run.key]
            lm_eval = lm_eval_metrics(metrics, values)
            if lm_eval:
                self._add_tracker(run, values, metrics, lm_eval, "tracker run")
            elif self.runs.is_evaluation_run(run):  # declared, or of an evaluation method
                per_metric = {k: (k, k, "") for k in metrics}
                self._add_tracker(run, values, metrics, per_metric, "evaluation run")
            else:
                self._add_training_evals(run, metrics)

    def _evaluation(self, run, identity, task, settings, source: str, **extra) -> Evaluation:
        """A new evaluation of ``run`` (``identity``: model, revision, adapter, label), kept."""
        model, revision, adapter, label = identity
        evaluation = Evaluation(
            run,
            model,
            revision,
            adapter,
            task,
            settings,
            source=source,
            general=self.is_general(task),
            at=run.start_time,
            label=label,
            **extra,
        )
        self.all.append(evaluation)
        return evaluation

    def _add_tracker(self, run, values, metrics, parsed, source: str) -> None:
        identity = self._model_and_label(values)
        settings = _settings(
            n_shot=values.get("num_fewshot"),
            limit=values.get("limit"),
            chat_template=values.get("chat_template"),
            system_instruction=values.get("system_instruction"),
            fewshot_as_multiturn=values.get("fewshot_as_multiturn"),
            gen_kwargs=values.get("gen_kwargs"),
        )
        by_task: dict[str, Evaluation] = {}
        for key, (task, metric, lm_filter) in sorted(parsed.items()):
            if metric.endswith("_stderr"):
                continue
            evaluation = by_task.get(task)
            if evaluation is None:
                evaluation = self._evaluation(run, identity, task, settings, source)
                by_task[task] = evaluation
            evaluation.results[(metric, lm_filter)] = Result(metrics[key])

    def _add_training_evals(self, run: RunFacts, metrics: dict[str, float]) -> None:
        """A training run's own evaluation series: eval_*, eval/*, val*, and the metrics
        of ``[metrics] general``."""
        for key, value in sorted(metrics.items()):
            lowered = key.lower()
            is_eval = lowered.startswith(("eval_", "eval/", "val/", "val_", "val-", "test/"))
            general = any(fnmatchcase(key, g) for g in self.general_metrics)
            if not (is_eval or general):
                continue
            self.all.append(
                Evaluation(
                    run,
                    None,
                    None,
                    None,
                    key,
                    (),
                    {(key, ""): Result(value)},
                    source="training run",
                    general=general or self.is_general(key.split("/")[-1]),
                    at=run.last_seen,
                )
            )

    def _training_outputs(self, con, params: dict) -> dict[str, RunFacts]:
        """Normalised model paths and names -> the training run that wrote them."""
        out: dict[str, RunFacts] = {}
        for run in self.facts.runs:
            if self.runs.is_evaluation_run(run):
                continue
            values = params.get(run.key, {})
            for key in (*OUTPUT_KEYS, "hub_model_id"):
                name = normalise_model(values.get(key))
                if name:
                    out.setdefault(name, run)
        for path, source_id, run_id in con.execute(
            "SELECT path, source_id, run_id FROM checkpoint_runs ORDER BY path"
        ).fetchall():
            run = self.facts.run(source_id, run_id)
            if run is not None:
                out.setdefault(normalise_model(path), run)
        return out

    def _runs_that_train(self, con) -> set[tuple]:
        globs = [g for kind in TRAINING_SERIES for g in self.config.metrics.globs(kind)]
        key_of = self.facts.key_of
        found = {
            key_of(source_id, run_id)
            for source_id, run_id in con.execute(
                "SELECT DISTINCT source_id, run_id FROM params WHERE "
                + " OR ".join("key GLOB ?" for _ in LEARNING_RATE_KEYS),
                list(LEARNING_RATE_KEYS),
            ).fetchall()
        }
        names = [
            key
            for (key,) in con.execute("SELECT DISTINCT key FROM latest_metrics").fetchall()
            if any(fnmatchcase(key, g) for g in globs)
        ]
        if names:
            found |= {
                key_of(source_id, run_id)
                for source_id, run_id in con.execute(
                    "SELECT DISTINCT source_id, run_id FROM latest_metrics "
                    "WHERE list_contains(?, key)",
                    [names],
                ).fetchall()
            }
        return found

    # -- links -------------------------------------------------------------------------
    def training_run(self, evaluation: Evaluation) -> RunFacts | None:
        """The training run whose model an evaluation evaluated, by any link."""
        if evaluation.in_training:
            return evaluation.run
        values = self._params.get(evaluation.run.key, {})
        for key in self.config.evaluations.training_run_keys:
            named = values.get(key)
            if named:
                run = self.facts.run_by_id(named)
                if run is not None:
                    return run
        for model in (evaluation.adapter, evaluation.model):
            if model is None:
                continue
            path = model
            while path:
                if path in self._outputs:
                    return self._outputs[path]
                parent = os.path.dirname(path) if path.startswith("/") else ""
                if parent == path:
                    break
                path = parent
        return None

    @cached_property
    def monitored_runs(self) -> frozenset[tuple]:
        """The training runs whose model was evaluated on a general-ability task, by any
        link (REG001 and DSH001 judge the others)."""
        runs = (self.training_run(e) for e in self.all if e.general)
        return frozenset(run.key for run in runs if run is not None)

    def base_of(self, model: str | None, adapter: str | None = None) -> str | None:
        """The model a fine-tuned ``model`` was tuned from, or None when nothing says."""
        if model is None:
            return None
        if adapter:
            return model  # the adapter's pretrained= model is what it was tuned from
        if model in self.base_models:
            return normalise_model(self.base_models[model])
        name = model.removesuffix("-hf")
        base = _HUB_SUFFIX.sub("", name)
        if base != name:
            return base
        return None

    def evaluations_of(self, model_identity: tuple) -> list[Evaluation]:
        return self._by_model.get(model_identity, [])

    def label_of(self, model_identity: tuple) -> str:
        """The model as its evaluations spelled it (matching is case-insensitive)."""
        for evaluation in self._by_model.get(model_identity, []):
            if evaluation.label:
                return evaluation.label
        return model_identity[2] or model_identity[0] or "?"

    def models(self) -> list[tuple]:
        return sorted(self._by_model, key=lambda m: tuple(str(p) for p in m))

    def base_identity(self, model_identity: tuple) -> tuple | None:
        """The evaluated base model (name, revision, no adapter) of a fine-tuned model:
        the revision its evaluations were run with when the base was evaluated once."""
        model, _revision, adapter = model_identity
        base = self.base_of(model, adapter)
        if base is None:
            return None
        candidates = [m for m in self._by_model if m[0] == base and m[2] is None]
        if not candidates:
            candidates = [m for m in self._by_model if _same_model(m[0], base) and m[2] is None]
        return sorted(candidates, key=lambda m: str(m))[0] if candidates else None


def _same_model(left: str | None, right: str | None) -> bool:
    """Hub names that differ only in a trailing "-hf" (Llama-2's two spellings)."""
    if left is None or right is None:
        return False
    return left.removesuffix("-hf") == right.removesuffix("-hf")


def _has_results_table(con) -> bool:
    return bool(
        con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'eval_results'"
        ).fetchall()[0][0]
    )


def _settings(**values) -> tuple[tuple[str, str], ...]:
    return tuple(
        (key, str(values[key])) for key in SETTING_KEYS if values.get(key) not in (None, "")
    )


def _run_values(con, facts: Facts, keys: list[str]) -> dict[tuple, dict[str, str]]:
    """Per run, its params (and tags, where no param of the name) among ``keys``."""
    out: dict[tuple, dict[str, str]] = {}
    for source_id, run_id, key, value in con.execute(
        """
        SELECT source_id, run_id, key, value FROM (
            SELECT source_id, run_id, key, value, 1 AS pos FROM tags WHERE list_contains(?, key)
            UNION ALL
            SELECT source_id, run_id, key, value, 0 FROM params WHERE list_contains(?, key)
        ) ORDER BY pos DESC
        """,
        [keys, keys],
    ).fetchall():
        if value:
            out.setdefault(facts.key_of(source_id, run_id), {})[key] = value
    return out


def headline_tasks(evals: list[Evaluation]) -> list[Evaluation]:
    """One run's evaluations without the subtasks of a group it evaluated too (mmlu's 57
    subjects when mmlu itself is there): the group's aggregate is what is compared."""
    groups = [e.task for e in evals if e.is_group]
    return [
        e
        for e in evals
        if not any(e.task != g and e.task.startswith((g + "_", g + "-")) for g in groups)
    ]

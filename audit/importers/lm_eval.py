"""lm-evaluation-harness results files, read into one evaluation: its settings and results.

The layouts, as the harness writes them (``lm_eval/evaluator.py``,
``lm_eval/evaluator_utils.py``, ``lm_eval/loggers/evaluation_tracker.py``):

- 0.4: ``results`` {task: {"<metric>,<filter>": value, "<metric>_stderr,<filter>": stderr
  or "N/A", "alias": text}} holding tasks and group aggregates; ``groups`` (older 0.4: the
  aggregates again), ``group_subtasks`` {group: [subtasks]}, ``configs`` {task: {num_fewshot,
  metric_list [{metric, higher_is_better}], generation_kwargs, …}}, ``versions``, ``n-shot``,
  ``higher_is_better`` {task: {metric: bool}}, ``n-samples`` {task: {original, effective}},
  ``config`` {model, model_args (a "k=v,k=v" string or an object), model_sha,
  model_revision, batch_size, limit, gen_kwargs, …}, ``git_hash``, ``date`` (Unix seconds at
  the start), ``lm_eval_version``, ``model_name``, ``model_source``, ``chat_template`` and
  ``system_instruction`` (texts) with their SHA-256, ``fewshot_as_multiturn``,
  ``total_evaluation_time_seconds`` (text), ``task_hashes``. Older 0.4 files lack the later
  keys. Every metric key of 0.4 holds a comma; keys without one (``alias``, ``samples``, the
  ``" "`` placeholder of a group without an aggregate) are not results.
- 0.3: ``results`` {task: {"<metric>": value, "<metric>_stderr": stderr}}, ``versions``,
  ``config`` {model, model_args, num_fewshot, batch_size, limit, …}; no filter, no date.

Only finite numbers are results; NaN, infinities and "N/A" are left out (and counted). A
stderr goes with its metric. Integers outside their column's range and numbers that are
not finite are not stored. Of ``model_args`` and ``gen_kwargs`` an entry whose key names a
credential (``token``, ``hf_token``, ``api_key``, ``password``, …) and holds text is dropped,
and ``user:password@`` in a URL value removed: a results file keeps the command's arguments
as typed.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from audit.errors import InputError
from audit.importers.text import describe

EVALUATOR = "lm-eval"
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
# 0.4 sections that 0.3 files never have
_V04_SECTIONS = ("configs", "n-shot", "group_subtasks", "groups", "higher_is_better", "n-samples")
# a key that names a credential (token, hf_token, api_key, client_secret, password), not one
# that merely holds the word (max_new_tokens, tokenizer)
_SECRET_KEY = re.compile(
    r"(?:^|[_-])(?:token|api[_-]?key|apikey|secret|password|passwd|credentials?)$", re.IGNORECASE
)
_NOT_A_SECRET = {"", "true", "false", "none", "null"}
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")
_STDERR = "_stderr"


@dataclass(frozen=True)
class EvalResult:
    """One result value of a task, with what the file records about its setting."""

    task: str
    metric: str
    filter: str  # '' when the layout has none (0.3)
    value: float
    stderr: float | None
    higher_is_better: bool | None
    n_shot: int | None
    task_version: str | None
    task_hash: str | None
    limit_n: float | None
    samples: int | None
    is_group: bool
    gen_kwargs: str | None

    @property
    def metric_key(self) -> str:
        """The name lm-eval's own W&B logger gives the value: ``<task>/<metric>``, with
        ``,<filter>`` unless the filter is ``none`` (the logger drops that one)."""
        suffix = "" if self.filter in ("", "none") else f",{self.filter}"
        return f"{self.task}/{self.metric}{suffix}"


@dataclass
class Evaluation:
    layout: str  # "0.3" | "0.4"
    model: str | None
    params: dict[str, str]
    results: list[EvalResult]
    top_tasks: list[str]  # tasks that are no group's subtask: what the command named
    date: float | None = None  # Unix seconds at the start, as recorded
    duration: float | None = None  # seconds, as recorded
    left_out: int = 0  # values that are no finite number (NaN, inf, "N/A")
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        tasks = self.top_tasks
        what = ", ".join(tasks) if 0 < len(tasks) <= 3 else f"{len(tasks)} tasks"
        return f"{self.model or 'unknown model'} on {what}"


def is_lm_eval(data: object) -> bool:
    """A JSON document the harness wrote: results with versions or a config."""
    return (
        isinstance(data, dict)
        and "results" in data
        and "config_general" not in data  # lighteval's layout
        and any(key in data for key in ("versions", "config", "configs"))
    )


def read_lm_eval(data: dict, path: Path) -> Evaluation:
    """The evaluation a results document holds; a section of the wrong kind is an
    ``InputError`` naming it."""
    results = _section(data, "results", path)
    for task, entry in results.items():
        if not isinstance(entry, dict):
            raise InputError(
                f"{path}: results.{task} is {describe(entry)}, expected an object of metric values"
            )
    layout = "0.4" if _is_v04(data, results) else "0.3"
    config = _section(data, "config", path)
    sections = {
        key: _section(data, key, path) for key in (*_V04_SECTIONS, "versions", "task_hashes")
    }
    groups = set(sections["groups"]) | {
        g
        for g, subtasks in sections["group_subtasks"].items()
        if isinstance(subtasks, list) and subtasks
    }
    subtasks = {
        t
        for listed in sections["group_subtasks"].values()
        if isinstance(listed, list)
        for t in listed
        if isinstance(t, str)
    }
    limit_n = _finite(config.get("limit"))
    evaluation = Evaluation(layout=layout, model=None, params={}, results=[], top_tasks=[])
    entries = dict(results)
    for group, entry in sections["groups"].items():  # an aggregate only listed there
        if isinstance(entry, dict):
            entries.setdefault(group, entry)
    for task in sorted(entries):
        values, stderrs, left_out = _task_values(entries[task], layout)
        evaluation.left_out += left_out
        task_config = sections["configs"].get(task)
        task_config = task_config if isinstance(task_config, dict) else {}
        n_shot = (
            _integer(sections["n-shot"].get(task, task_config.get("num_fewshot")), INT32)
            if layout == "0.4"
            else _integer(config.get("num_fewshot"), INT32)
        )
        samples = sections["n-samples"].get(task)
        for (metric, filter_), value in sorted(values.items()):
            evaluation.results.append(
                EvalResult(
                    task=task,
                    metric=metric,
                    filter=filter_,
                    value=value,
                    stderr=stderrs.get((metric, filter_)),
                    higher_is_better=_direction(
                        sections["higher_is_better"], task_config, task, metric
                    ),
                    n_shot=n_shot,
                    task_version=_version(sections["versions"].get(task)),
                    task_hash=_text(sections["task_hashes"].get(task)) or None,
                    limit_n=limit_n,
                    samples=_integer(samples.get("effective"), INT64)
                    if isinstance(samples, dict)
                    else None,
                    is_group=task in groups,
                    gen_kwargs=canonical_json(task_config["generation_kwargs"])
                    if isinstance(task_config.get("generation_kwargs"), dict)
                    else None,
                )
            )
    evaluation.top_tasks = sorted(t for t in results if t not in subtasks)
    evaluation.model, evaluation.params = _settings(data, config, evaluation.results)
    evaluation.date = _finite(data.get("date"))
    if data.get("date") is not None and evaluation.date is None:
        evaluation.warnings.append(
            f"{path}: date {describe(data.get('date'))} is not a time; the start is unknown"
        )
    duration = data.get("total_evaluation_time_seconds")
    evaluation.duration = _finite(_number_text(duration))
    if evaluation.duration is not None and not 0 <= evaluation.duration < 1e9:
        evaluation.duration = None
    return evaluation


def _is_v04(data: dict, results: dict) -> bool:
    return any(key in data for key in _V04_SECTIONS) or any(
        "," in key for entry in results.values() if isinstance(entry, dict) for key in entry
    )


def _section(data: dict, key: str, path: Path) -> dict:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{path}: {key} is {describe(value)}, expected an object")
    return value


def _task_values(
    entry: dict, layout: str
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float], int]:
    """A task's results and stderrs by (metric, filter), and how many values were left out."""
    values: dict[tuple[str, str], float] = {}
    stderrs: dict[tuple[str, str], float | None] = {}
    left_out = 0
    for key, raw in entry.items():
        if layout == "0.4":
            if "," not in key:
                continue  # alias, samples, a group's " " placeholder
            metric, filter_ = key.split(",", 1)
        else:
            if key == "alias":
                continue
            metric, filter_ = key, ""
        number = _finite(raw)
        if metric.endswith(_STDERR) and metric != _STDERR:
            stderrs[(metric.removesuffix(_STDERR), filter_)] = number
        elif number is not None:
            values[(metric, filter_)] = number
        else:
            left_out += 1
    # a stderr without its metric is no result of its own
    return values, {k: v for k, v in stderrs.items() if k in values and v is not None}, left_out


def _direction(recorded: dict, task_config: dict, task: str, metric: str) -> bool | None:
    """``higher_is_better`` as the file records it for this task and metric, else None."""
    of_task = recorded.get(task)
    if isinstance(of_task, dict) and isinstance(of_task.get(metric), bool):
        return of_task[metric]
    metric_list = task_config.get("metric_list")
    for item in metric_list if isinstance(metric_list, list) else []:
        if (
            isinstance(item, dict)
            and item.get("metric") == metric
            and isinstance(item.get("higher_is_better"), bool)
        ):
            return item["higher_is_better"]
    return None


def _settings(data: dict, config: dict, results: list[EvalResult]) -> tuple[str | None, dict]:
    """The evaluated model and the run's params (text values, as trackers store them)."""
    args = model_args(config.get("model_args"))
    model = (
        next((args[k] for k in ("pretrained", "model", "path", "engine") if args.get(k)), None)
        or _text(data.get("model_name"))
        or _text(config.get("model"))
        or None
    )
    params: dict[str, str | None] = {
        "model": model,
        "model_args": model_args_text(config.get("model_args")),
        "model_revision": args.get("revision")
        or _first_text(config, data, "model_sha")
        or _first_text(config, data, "model_revision"),
        "peft": args.get("peft"),
        "model_source": _text(data.get("model_source")) or _text(config.get("model")),
        "chat_template": _sha_of(data, "chat_template"),
        "system_instruction": _sha_of(data, "system_instruction"),
        "fewshot_as_multiturn": _text(data.get("fewshot_as_multiturn"))
        if isinstance(data.get("fewshot_as_multiturn"), bool)
        else None,
        "gen_kwargs": _gen_kwargs(config.get("gen_kwargs")),
        "batch_size": _scalar_text(config.get("batch_size")),
        "limit": _scalar_text(config.get("limit")),
        "lm_eval_version": _text(data.get("lm_eval_version")),
        "git_hash": _text(data.get("git_hash")),
        "tasks": ",".join(sorted({r.task for r in results})),
    }
    return model, {k: _without_userinfo(v) for k, v in params.items() if v}


def model_args(value: object) -> dict[str, str]:
    """``model_args`` as (key, text) entries without credentials: the harness's own
    ``k=v,k=v`` split, or an object's items."""
    return {k: v for k, v in _arg_entries(value) if k}


def model_args_text(value: object) -> str | None:
    """``model_args`` as recorded without credentials: the string's entries in their order,
    an object's as ``k=v`` sorted by key."""
    entries = _arg_entries(value)
    if isinstance(value, dict):
        entries = sorted(entries)
    return ",".join(f"{k}={v}" if k else v for k, v in entries) or None


def _arg_entries(value: object) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        entries = [
            (str(k), "None" if v is None else _scalar_text(v) or "") for k, v in value.items()
        ]
    elif isinstance(value, str):
        entries = [
            (piece.split("=", 1)[0], piece.split("=", 1)[1]) if "=" in piece else ("", piece)
            for piece in value.split(",")
            if piece.strip()
        ]
    else:
        return []
    return [
        (k.strip(), _without_userinfo(v.strip()) or "")
        for k, v in entries
        if not _is_secret(k.strip(), v.strip())
    ]


def _is_secret(key: str, value: object) -> bool:
    """An entry that holds a credential: its key names one and its value is text, not a
    switch (``use_auth_token=True``, ``add_bos_token=False`` are settings)."""
    return (
        bool(_SECRET_KEY.search(key))
        and isinstance(value, str)
        and value.strip().lower() not in _NOT_A_SECRET
    )


def canonical_json(value: object) -> str:
    """One spelling of a JSON value: keys sorted, no spaces; an entry whose key names a
    credential left out."""
    return json.dumps(
        _without_secret_keys(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def _without_secret_keys(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_secret_keys(v) for k, v in value.items() if not _is_secret(str(k), v)}
    if isinstance(value, list):
        return [_without_secret_keys(v) for v in value]
    return value


def _gen_kwargs(value: object) -> str | None:
    """Generation settings as canonical JSON: an object as recorded, or the CLI's
    ``k=v,k=v`` text with values typed as the harness types them."""
    if isinstance(value, dict):
        return canonical_json(value) if value else None
    if isinstance(value, str) and value.strip():
        return canonical_json({k: _typed(v) for k, v in model_args(value).items() if k})
    return None


def _typed(text: str) -> object:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    if text.lstrip("+-").isdigit() and len(text) <= 18:
        return int(text)
    number = _finite(_number_text(text))
    return number if number is not None else text


def _sha_of(data: dict, key: str) -> str | None:
    """A template or instruction by its SHA-256 (the harness's own digest), never its text."""
    recorded = _text(data.get(f"{key}_sha"))
    if recorded:
        return recorded
    text = data.get(key)
    return (
        hashlib.sha256(text.encode("utf-8")).hexdigest() if isinstance(text, str) and text else None
    )


def _first_text(config: dict, data: dict, key: str) -> str | None:
    return _text(config.get(key)) or _text(data.get(key))


def _text(value: object) -> str | None:
    """Strings and numbers as text; anything else is no text."""
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float) and (isinstance(value, int) or math.isfinite(value)):
        return str(value)
    return None


def _scalar_text(value: object) -> str | None:
    """A setting as text: scalars as Python spells them (``True``, ``8``, ``auto``), lists
    and objects as canonical JSON."""
    if value is None:
        return None
    if isinstance(value, list | dict):
        return canonical_json(value)
    return _text(value)


def _version(value: object) -> str | None:
    text = _text(value)
    return None if text is None or text == "N/A" else text


def _number_text(value: object) -> object:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return value


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the largest float
        return None
    return number if math.isfinite(number) else None


def _integer(value: object, bounds: tuple[int, int]) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 30:
        value = int(value)
    return value if isinstance(value, int) and bounds[0] <= value <= bounds[1] else None


def _without_userinfo(text: str | None) -> str | None:
    return _URL_USERINFO.sub("", text) if text else text

"""What ``Facts.load`` keeps in memory: per job only the jobs columns rules read (as
columns, a job's facts made when asked for), and one string object per distinct text of
the runs."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from audit.costs import Facts
from audit.facts.jobs import JOB_EXTRA_COLUMNS, JobFacts
from audit.testing import at, build_warehouse

ROOT = Path(__file__).resolve().parents[2]


def test_every_jobs_column_kept_is_read():
    # a column kept but never read costs memory per job for nothing (one read but not
    # kept is no silent None: JobFacts has slots, so reading it raises AttributeError).
    # Read as a job's field or as a column of ``Facts.jobs``' frame.
    sources = [*(ROOT / "audit").rglob("*.py"), *(ROOT / "rules").rglob("*.py")]
    keeping = {"costs.py", "jobs.py"}
    text = "\n".join(path.read_text() for path in sources if path.name not in keeping)
    unread = [
        name
        for name in JOB_EXTRA_COLUMNS
        if not re.search(
            rf"\bjob\.{name}\b|pl\.col\(\"{name}\"\)|pl\.coalesce\([^)]*\"{name}\"", text
        )
    ]
    assert unread == []


def test_jobs_keep_their_read_columns_and_runs_share_their_texts(tmp_path):
    data = {
        "runs": [
            {"run_id": f"r{i}", "experiment": "sweep", "tags": {"team": "agents"}} for i in range(3)
        ],
        "jobs": [
            {
                "job_id": 7,
                "account": "agents",
                "submit": 0,
                "eligible": 1,
                "start": 2,
                "end": 5,
                "max_gpu_util_pct": 41.5,
                "max_gpu_mem_bytes": 123,
                "admin_comment": "JS1:x",
            },
            {"job_id": 8, "account": "agents", "start": 2, "end": 5},
        ],
    }
    wh, config = build_warehouse(tmp_path / "w.duckdb", data)
    try:
        facts = Facts.load(wh.con, config)
    finally:
        wh.close()
    kept = {name: getattr(facts.job("default", "7"), name) for name in JOB_EXTRA_COLUMNS}
    assert kept == {
        "eligible_time": at(1),
        "max_gpu_util_pct": 41.5,
        "max_gpu_mem_bytes": 123,
        "admin_comment": "JS1:x",
    }
    assert [getattr(facts.job("default", "8"), name) for name in JOB_EXTRA_COLUMNS] == [None] * len(
        JOB_EXTRA_COLUMNS
    )
    first, *others = facts.runs
    for other in others:
        for name in ("source_id", "experiment", "status", "user_id", "team"):
            assert getattr(other, name) is getattr(first, name), name
    # a job's facts are made once: asked for twice, one object
    assert facts.job("default", "7") is facts.job("default", "7")


def test_gpu_type_and_attribution_follow_their_order(tmp_path):
    """A run's GPU type: its job's allocation (said as precisely as its hosts' model name
    when that is the same card), else its own param or tag, else ``default_gpu_type``, else
    the card model its job's hosts reported. A job's: its allocation, else its hosts' model. A job takes the team, method and base model of its
    first run; a job without runs its account's team."""
    job = {"start": 0, "end": 4, "host": "n1"}
    data = {
        "runs": [
            {
                "run_id": "alloc",
                "start": 0,
                "params": {"gpu_type": "A100"},
                "tags": {"slurm_job_id": 1},
            },
            {
                "run_id": "param",
                "start": 1,
                "params": {"gpu_type": "A100", "method": "SFT"},
                "tags": {"slurm_job_id": 2, "team": "coder"},
            },
            {
                "run_id": "later",
                "start": 2,
                "params": {"method": "rl"},
                "tags": {"slurm_job_id": 2, "team": "agents"},
            },
            {"run_id": "default", "start": 3, "tags": {"slurm_job_id": 3}},
            {"run_id": "alone", "start": 4, "user": "bob"},
        ],
        "jobs": [
            {**job, "job_id": 1, "gpu_type": "h100"},
            {**job, "job_id": 2, "gpu_type": None, "start": 1},
            {**job, "job_id": 3, "gpu_type": None, "start": 3, "end": 6},
            {**job, "job_id": 4, "gpu_type": None, "account": "infra", "user": "eve"},
        ],
        "telemetry": [{"host": "n1", "start": 0, "end": 6, "gpus": 1, "util": {"default": 50}}],
    }
    config = '[cost]\ndefault_gpu_type = "L40S"\n[attribution]\nteam_order = ["tag", "account"]\n'
    wh, config = build_warehouse(tmp_path / "w.duckdb", data, config)
    try:
        facts = Facts.load(wh.con, config)
    finally:
        wh.close()
    run = {r.run_id: r for r in facts.runs}
    assert {k: (r.cost.gpu_type, r.job_id) for k, r in run.items()} == {
        "alloc": ("NVIDIA H100 80GB HBM3", "1"),
        "param": ("A100", "2"),
        "later": ("L40S", "2"),
        "default": ("L40S", "3"),
        "alone": ("L40S", None),
    }
    host_model = "NVIDIA H100 80GB HBM3"
    jobs = {j.job_id: j for j in facts.jobs}
    assert {k: j.gpu_type for k, j in jobs.items()} == {
        "1": host_model, "2": host_model, "3": host_model, "4": host_model,
    }  # fmt: skip
    assert (jobs["2"].run_ids, jobs["2"].team, jobs["2"].method) == (
        ["param", "later"],
        "coder",
        "sft",
    )
    assert (jobs["4"].run_ids, jobs["4"].team, jobs["4"].team_source) == ([], "infra", "account")
    assert (run["alone"].team, run["alone"].team_source) == (None, None)  # no tag, no job


_KEYS = ["method", "training_method", "team", "gpu_type", "gpu_name", "num_gpus", "nproc_per_node", "nnodes"]  # fmt: skip
_VALUES = st.sampled_from(["", "SFT", "rl", "8", "2", "0", "A100"])
_RUNS = st.lists(
    st.tuples(
        st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=5),
        st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=5),
    ),
    min_size=1,
    max_size=8,
)


def _expected(params: dict, tags: dict, config) -> tuple:
    """The attribution and GPU evidence of a run without a job, by the rules as written:
    per key its param, else its tag (an empty param still wins); the first key set."""
    merged = {**tags, **params}

    def first(keys):
        return next((merged[k] for k in keys if merged.get(k) not in (None, "")), None)

    cost = config.values["cost"]
    attribution = config.values["attribution"]
    method = first(attribution["method_keys"])
    count = None
    for key in cost["gpu_count_keys"]:
        numbers = []
        for part in key.split("*"):
            try:
                number = float(merged.get(part, "x"))
            except ValueError:
                break
            if number <= 0 or number != int(number):
                break
            numbers.append(number)
        else:
            count = math.prod(numbers)
            break
    return (
        method.lower() if method else None,
        first(attribution["base_model_keys"]),
        first([attribution["team_tag"]]),
        first(cost["gpu_type_keys"]),
        "params" if count is not None else "unknown",
        count,
    )


@settings(max_examples=25, deadline=None)
@given(_RUNS)
def test_run_attributes_are_each_keys_param_else_tag_the_first_set(tmp_path_factory, runs):
    """``Facts.load`` picks these in SQL (one column per key); any params and tags over the
    keys give what the written rule gives."""
    data = {
        "runs": [
            {"run_id": f"r{i}", "start": i, "params": params, "tags": tags}
            for i, (params, tags) in enumerate(runs)
        ]
    }
    wh, config = build_warehouse(tmp_path_factory.mktemp("w") / "w.duckdb", data)
    try:
        facts = Facts.load(wh.con, config)
        stored = {
            table: {
                (run_id, key): value
                for run_id, key, value in wh.con.execute(
                    f"SELECT run_id, key, value FROM {table}"
                ).fetchall()
            }
            for table in ("params", "tags")
        }
    finally:
        wh.close()
    for run in facts.runs:
        params = {k: v for (r, k), v in stored["params"].items() if r == run.run_id}
        tags = {k: v for (r, k), v in stored["tags"].items() if r == run.run_id}
        team = run.team if run.team_source == "tag" else None
        got = (run.method, run.base_model, team, run.cost.gpu_type, run.cost.rung, run.cost.gpus)
        assert got == _expected(params, tags, config), (params, tags)


def test_the_jobs_extra_columns_are_the_last_fields_of_job_facts_in_order():
    """Facts.load passes a job's JOB_EXTRA_COLUMNS as JobFacts' last positional fields."""
    names = [f.name for f in dataclasses.fields(JobFacts)]
    assert names[-len(JOB_EXTRA_COLUMNS) :] == list(JOB_EXTRA_COLUMNS)


def test_evaluation_runs_are_one_definition_read_by_recipes_and_evaluations(tmp_path):
    """A run evaluates by its method, its audit.kind tag, lm-eval's metric names, or
    lm-eval's sanitised names with its params: recipes and evaluations read the one answer."""
    from audit.facts.evaluations import EvaluationRuns, Evaluations
    from audit.recipes import Recipes

    loss = {"loss": [[0, 1, 2.0]]}
    data = {
        "runs": [
            {"run_id": "by-method", "params": {"method": "eval"}},
            {"run_id": "tagged", "tags": {"audit.kind": "evaluation"}, "metrics": loss},
            {"run_id": "lm-eval", "metrics": {"arc_easy/acc,none": [[0, 1, 0.7]]}},
            {
                "run_id": "sanitised",
                "params": {"tasks": "gsm8k"},
                "metrics": {"exact_match_strict_match": [[0, 1, 0.4]]},
            },
            # a sanitised name without lm-eval's params is a training run's metric
            {
                "run_id": "trains",
                "params": {"method": "sft"},
                "metrics": {"acc_none": [[0, 1, 1.0]]},
            },
        ]
    }
    wh, config = build_warehouse(tmp_path / "w.duckdb", data)
    try:
        facts = Facts.load(wh.con, config)
        found = EvaluationRuns.load(wh.con, config, facts)
        recipes = Recipes.load(wh.con, config, facts)
        evaluations = Evaluations(wh.con, config, facts)
    finally:
        wh.close()
    evaluating = {r.run_id for r in facts.runs if found.is_evaluation_run(r)}
    assert evaluating == {"by-method", "tagged", "lm-eval", "sanitised"}
    assert {r.run_id for r in facts.runs if recipes.is_training(r)} == {"trains"}
    assert {r.run_id for r in facts.runs if evaluations.is_training(r)} == {"trains"}

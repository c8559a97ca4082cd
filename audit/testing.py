"""Rule cases as data: build a small real warehouse from YAML, run one rule, check the result.
The warehouse is written as an import writes it (``build_warehouse``): a case holds only
values a real import would store.

For rule authors, built-in and plug-in alike. A case file ``<CODE>.yml`` holds the rule's
code and a list of cases; each case describes a few runs, jobs, telemetry samples or
checkpoints, an optional ``audit.toml`` text and window, and what the rule must report::

    rule: NET001
    cases:
      - name: two runs are one too many
        data:
          runs:
            - {run_id: a, start: 0, end: 1, params: {num_gpus: 8}}
            - {run_id: b, start: 2, end: 3}
        expect:
          - subject: {runs: 2}
            severity: info
            message_has: ["2 runs"]
      - name: one run is fine
        data: {runs: [{run_id: a}]}
        expect: []

Times are hours after 2026-11-16T00:00 (Monday of ISO week 2026-W47) or ISO text.
``data`` keys:

- ``runs``: ``run_id``, ``name``, ``user``, ``status``, ``start``, ``end``, ``lifecycle``,
  ``experiment`` (a name), ``params``, ``tags``, ``datasets`` (``name``, ``digest``),
  ``registered``, and ``metrics``: per key either ``[[step, hour, value], ...]`` or a
  series ``{steps: [first, last, every], hours: [first, last], values: [[from_step,
  value], ...]}`` whose value is the last one whose ``from_step`` has been reached (a
  value may be ``.nan``) and whose hours are spread evenly over the steps;
- ``jobs``: ``job_id``, ``name``, ``user``, ``account``, ``partition``, ``state``,
  ``submit``, ``eligible``, ``start``, ``end``, ``limit_h``, ``gpus``, ``gpu_type``,
  ``host``, ``max_gpu_util_pct``, ``max_gpu_mem_bytes`` (sacct's per-job usage),
  ``admin_comment`` or ``jobstats`` (a jobstats summary, stored as ``JS1:`` + base64 gzip);
- ``telemetry``: ``host``, ``start``, ``end``, ``gpus``, ``step_minutes``, ``util``
  (per GPU index or ``default``), ``mem_mib``, ``origin`` (``nvidia-smi``), ``run_id``
  (a tracker's system metrics of that run, with its ``origin``: ``wandb``, ``mlflow``);
- ``checkpoints``: ``path``, ``step``, ``gb``, ``hour``, ``best``.

A case may also give ``status`` (``ok``, ``skipped``, ``error``), ``reason`` (text the
skip reason contains) and ``notes`` (texts the rule's notes contain). Each expected
finding matches one finding by ``subject`` and may check ``severity``, ``gpu_hours``,
``usd``, ``run_hours`` (null: unknown), ``team``, ``method``, ``gb``, ``cost_basis_has``,
``message_has`` and ``evidence`` (keys whose values must be equal).

In a test suite::

    from audit.testing import case_id, check_case, load_cases

    CASES = load_cases(Path(__file__).parent / "cases")

    @pytest.mark.parametrize(("code", "case"), CASES, ids=[case_id(*c) for c in CASES])
    def test_rule_case(code, case, tmp_path):
        check_case(code, case, tmp_path)
"""

from __future__ import annotations

import base64
import gzip
import json
import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from audit.config import Config
from audit.errors import InputError
from audit.importers.checkpoints import CHECKPOINT_SCHEMA
from audit.importers.cluster import CheckpointSource, store_jobs
from audit.importers.files import FileImportSummary, ParsedUnit
from audit.importers.links import refresh_links
from audit.importers.mlflow.base import MODEL_VERSION_SCHEMA
from audit.importers.run_store import (
    DATASET_SCHEMA,
    EXPERIMENT_SCHEMA,
    METRIC_SCHEMA,
    PARAM_SCHEMA,
    RUN_SCHEMA,
    TAG_SCHEMA,
    DetailBatch,
    epoch_ms_to_datetime,
    frame,
    replace_experiments,
    runs_frame,
    upsert_source,
    write_batch,
)
from audit.importers.slurm import JOB_SCHEMA
from audit.importers.telemetry.samples import time_problem, valid_value, value_problem
from audit.redact import redact_frame
from audit.rule_registry import get_rule, load_checked_config
from audit.scans import RuleResult, run_rules
from audit.warehouse import open_warehouse
from audit.warehouse.frames import insert_frame
from audit.warehouse.samples import append_samples
from audit.windows import Window, now_utc

T0 = datetime(2026, 11, 16)
SOURCE = "s"


def at(value) -> datetime | None:
    """Hours after 2026-11-16T00:00 (numbers) or ISO text."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return T0 + timedelta(hours=value)
    return datetime.fromisoformat(str(value))


def load_cases(folder: Path) -> list[tuple[str, dict]]:
    """Every case of every ``*.yml`` file in ``folder``, as (rule code, case)."""
    out = []
    for path in sorted(Path(folder).glob("*.yml")):
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict) or "rule" not in document or "cases" not in document:
            raise InputError(f"{path}: a case file holds 'rule: CODE' and a list 'cases'")
        for case in document["cases"]:
            out.append((document["rule"], case))
    return out


def case_id(code: str, case: dict) -> str:
    return f"{code}-{case['name']}"


def metric_points(spec) -> list[tuple[int, float, float]]:
    """(step, hour, value) points of a case metric: a list, or a piecewise series."""
    if isinstance(spec, list):
        return [(int(step), float(hour), float(value)) for step, hour, value in spec]
    first, last, every = spec["steps"]
    start_hour, end_hour = spec["hours"]
    changes = sorted((int(s), float(v)) for s, v in spec["values"])
    points = []
    for step in range(first, last + 1, every):
        value = changes[0][1]
        for from_step, changed in changes:
            if from_step <= step:
                value = changed
        share = (step - first) / (last - first) if last > first else 0.0
        points.append((step, start_hour + share * (end_hour - start_hour), value))
    return points


# where a case's rows say they came from, in the importers' messages
CASE_LOCATION = "rule case"
_EPOCH = datetime(1970, 1, 1)


def _epoch_ms(moment: datetime | None) -> int | None:
    """A case time as the trackers hand it to the loader: epoch milliseconds."""
    return None if moment is None else round((moment - _EPOCH).total_seconds() * 1000)


def build_warehouse(path: Path, data: dict, config_text: str = "") -> tuple[Any, Config]:
    """A real warehouse file at ``path`` holding ``data``; returns it open, with its config.

    Written as an import writes, in one transaction through the importers' own write
    functions: runs, params, tags, metrics and datasets through the tracker loader
    (times checked, texts redacted, params normalised, latest values derived), jobs as
    the Slurm import stores them, samples checked against the telemetry rule for valid
    values, checkpoints as an inventory of their root, then the links. A case value a real
    import would refuse is refused here, with the importer's message. (The search table
    an MLflow import also builds is left out: searches read the long tables without it.)
    """
    config_file = path.with_suffix(".toml")
    config_file.write_text(config_text, encoding="utf-8")
    config = load_checked_config(config_file)
    wh = open_warehouse(path)
    try:
        with wh.transaction() as con:
            _write_runs(con, data.get("runs", []))
            _write_jobs(con, data.get("jobs", []))
            _write_samples(con, data.get("telemetry", []))
            _write_checkpoints(con, data.get("checkpoints", []))
            refresh_links(con, config)
    except BaseException:
        wh.close()
        raise
    return wh, config


def _write_runs(con, runs: list[dict]) -> None:
    if not runs:
        return
    now = now_utc()
    upsert_source(con, SOURCE, "mlflow", CASE_LOCATION, now)
    experiments: dict[str, str] = {}
    for run in runs:
        experiment = run.get("experiment")
        if experiment is not None and experiment not in experiments:
            experiments[experiment] = str(len(experiments) + 1)
    replace_experiments(
        con,
        SOURCE,
        frame(
            [
                {"experiment_id": number, "name": name, "lifecycle_stage": "active"}
                for name, number in experiments.items()
            ],
            EXPERIMENT_SCHEMA,
        ),
        CASE_LOCATION,
    )
    run_rows, params, tags, metrics, datasets, models = [], [], [], [], [], []
    for run in runs:
        run_id = run["run_id"]
        run_rows.append(
            {
                "run_id": run_id,
                "experiment_id": experiments.get(run.get("experiment"), "1"),
                "name": run.get("name", run_id),
                "user_id": run.get("user", "ann"),
                "status": run.get("status", "FINISHED"),
                "start_time": _epoch_ms(at(run.get("start", 0))),
                "end_time": _epoch_ms(at(run.get("end", 1))),
                "lifecycle_stage": run.get("lifecycle", "active"),
                "source_commit": run.get("commit", "abc"),
                "artifact_uri": run.get("artifact_uri"),
            }
        )
        params += [(run_id, key, str(value)) for key, value in run.get("params", {}).items()]
        tags += [(run_id, key, str(value)) for key, value in run.get("tags", {}).items()]
        for key, spec in run.get("metrics", {}).items():
            metrics += [
                (run_id, key, value, step, _epoch_ms(at(hour)))
                for step, hour, value in metric_points(spec)
            ]
        datasets += [
            (run_id, ds["name"], ds["digest"], "local", f"/data/{ds['name']}", "train")
            for ds in run.get("datasets", [])
        ]
        if run.get("registered"):
            source = run["registered"] if isinstance(run["registered"], str) else None
            models.append(("m", "1", run_id, source, "READY", None, None))
    insert_frame(con, "runs", runs_frame(frame(run_rows, RUN_SCHEMA), SOURCE, now, CASE_LOCATION))
    batch = DetailBatch(
        run_count=len(runs),
        params=frame(params, PARAM_SCHEMA),
        tags=frame(tags, TAG_SCHEMA),
        metrics=frame(metrics, METRIC_SCHEMA),
        datasets=frame(datasets, DATASET_SCHEMA),
    )
    write_batch(con, batch, SOURCE, CASE_LOCATION)
    # as the MLflow import writes a source's registered models
    versions = redact_frame(frame(models, MODEL_VERSION_SCHEMA), ["name", "source"])
    insert_frame(
        con,
        "model_versions",
        epoch_ms_to_datetime(
            versions, ["creation_time"], "model", "name", CASE_LOCATION
        ).with_columns(source_id=pl.lit(SOURCE)),
    )


def _write_jobs(con, jobs: list[dict]) -> None:
    if not jobs:
        return
    rows, nodes = [], []
    for job in jobs:
        start, end = at(job.get("start", 0)), at(job.get("end", 1))
        row = {
            "cluster": "default",
            "job_id": str(job["job_id"]),
            "name": job.get("name", "train"),
            "user_name": job.get("user", "ann"),
            "account": job.get("account", "lab"),
            "partition": job.get("partition", "gpu"),
            "state": job.get("state", "COMPLETED"),
            "submit_time": at(job.get("submit", job.get("start", 0))),
            "eligible_time": at(job.get("eligible")),
            "start_time": start,
            "end_time": end,
            "elapsed_s": int((end - start).total_seconds()),
            "timelimit_s": int(job["limit_h"] * 3600) if "limit_h" in job else None,
            "nnodes": 1,
            "gpus": job.get("gpus", 8),
            "gpu_type": job.get("gpu_type", "h100"),
        }
        # sacct's per-job GPU usage (TRESUsageInMax rolled up from the steps), when given
        for key in ("max_gpu_util_pct", "max_gpu_mem_bytes", "admin_comment"):
            if key in job:
                row[key] = job[key]
        if "jobstats" in job:  # a jobstats summary as its epilog stores it: JS1:<base64 gzip JSON>
            packed = gzip.compress(json.dumps(job["jobstats"]).encode())
            row["admin_comment"] = "JS1:" + base64.b64encode(packed).decode()
        rows.append(row)
        nodes.append({"cluster": "default", "job_id": row["job_id"], "host": job.get("host", "n1")})
    store_jobs(
        con,
        pl.DataFrame(rows, schema=JOB_SCHEMA),
        pl.DataFrame(nodes, schema={"cluster": pl.String, "job_id": pl.String, "host": pl.String}),
        FileImportSummary(kind="slurm"),
    )


def _write_samples(con, telemetry: list[dict]) -> None:
    for spec in telemetry:
        rows = []
        t, end = at(spec["start"]), at(spec["end"])
        step = timedelta(minutes=spec.get("step_minutes", 5))
        util = {str(k): v for k, v in spec.get("util", {}).items()}
        while t <= end:
            for gpu in range(spec.get("gpus", 8)):
                value = util.get(str(gpu), util.get("default", 0))
                rows.append(
                    {
                        "host": spec.get("host", "n1"),
                        "gpu": str(gpu),
                        "ts": t,
                        "util_pct": float(value),
                        "mem_used_mib": float(spec.get("mem_mib", 60000 if value else 3)),
                        "mem_total_mib": 81559.0,
                        "model": "NVIDIA H100 80GB HBM3",
                        "origin": spec.get("origin", "nvidia-smi"),
                        "run_id": spec.get("run_id"),
                    }
                )
            t += step
        samples = pl.DataFrame(rows)
        # the one rule every telemetry reader keeps its samples to
        for column in ("util_pct", "mem_used_mib", "mem_total_mib"):
            bad = samples.filter(~valid_value(column))
            if bad.height:
                problem = value_problem(column, bad[column][0])
                raise InputError(
                    f"{CASE_LOCATION}: telemetry of {spec.get('host', 'n1')}: {problem}"
                )
        for moment in (at(spec["start"]), end):
            if time_problem(moment):
                raise InputError(f"{CASE_LOCATION}: telemetry: {time_problem(moment)}")
        append_samples(con, samples)


def _write_checkpoints(con, checkpoints: list[dict]) -> None:
    if not checkpoints:
        return
    found = pl.DataFrame(
        [
            {
                "root": "/ckpt",
                "path": c["path"],
                "kind": "hf",
                "step": c.get("step"),
                "bytes": int(c["gb"] * 1e9),
                "files": 3,
                "mtime": at(c.get("hour", 0)),
                "is_best": c.get("best", False),
                "run_dir": c["path"].rsplit("/", 1)[0],
            }
            for c in checkpoints
        ],
        schema=CHECKPOINT_SCHEMA,
    )
    # as a scan of the root writes its inventory
    CheckpointSource().write(con, Path("/ckpt"), ParsedUnit(found, rows_read=found.height))


def run_case(code: str, case: dict, workdir: Path) -> RuleResult:
    """Build the case's warehouse in ``workdir`` and run rule ``code`` over its window."""
    Path(workdir).mkdir(parents=True, exist_ok=True)
    wh, config = build_warehouse(
        Path(workdir) / "case.duckdb", case.get("data", {}), case.get("config", "")
    )
    try:
        window = case.get("window", {})
        (result,) = run_rules(
            wh.con,
            config,
            [get_rule(code)],
            Window(at(window.get("since")), at(window.get("until"))),
        )
    finally:
        wh.close()
    return result


def check_case(code: str, case: dict, workdir: Path) -> RuleResult:
    """Run the case and raise AssertionError naming every way the result differs."""
    result = run_case(code, case, workdir)
    problems = case_problems(case, result)
    if problems:
        raise AssertionError(f"{case_id(code, case)}:\n  " + "\n  ".join(problems))
    return result


def case_problems(case: dict, result: RuleResult) -> list[str]:
    """How ``result`` differs from what ``case`` expects (empty when it matches)."""
    problems = []
    if result.status != case.get("status", "ok"):
        problems.append(
            f"status {result.status!r} ({result.reason}), expected {case.get('status', 'ok')!r}"
        )
    if "reason" in case and case["reason"] not in result.reason:
        problems.append(f"reason {result.reason!r} lacks {case['reason']!r}")
    for note in case.get("notes", []):
        if not any(note in n for n in result.notes):
            problems.append(f"no note contains {note!r}: {result.notes}")
    expected = case.get("expect", [])
    got = sorted(result.findings, key=lambda f: str(sorted(f.subject.items())))
    if len(got) != len(expected):
        problems.append(
            f"{len(got)} findings, expected {len(expected)}: {[f.message for f in got]}"
        )
        return problems
    wanted = sorted(expected, key=lambda e: str(sorted(e["subject"].items())))
    for finding, want in zip(got, wanted, strict=True):
        problems += _finding_problems(finding, want)
    return problems


def _finding_problems(finding, want: dict) -> list[str]:
    where = f"finding {finding.subject}"
    out = []
    for key, value in want["subject"].items():
        if str(finding.subject.get(key)) != str(value):
            out.append(f"{where}: subject {key}={finding.subject.get(key)!r}, expected {value!r}")
    if "severity" in want and finding.severity.label != want["severity"]:
        out.append(f"{where}: severity {finding.severity.label}, expected {want['severity']}")
    for name in ("gpu_hours", "usd", "run_hours"):
        if name not in want:
            continue
        got, expected = getattr(finding, name), want[name]
        if expected is None and got is not None:
            out.append(f"{where}: {name}={got}, expected unknown (null)")
        elif expected is not None and (
            got is None or not math.isclose(got, expected, abs_tol=0.01)
        ):
            out.append(
                f"{where}: {name}={got}, expected {expected} ({finding.evidence.get('formula')})"
            )
    for key, value in want.get("evidence", {}).items():
        if finding.evidence.get(key) != value:
            out.append(f"{where}: evidence {key}={finding.evidence.get(key)!r}, expected {value!r}")
    if "cost_basis_has" in want and want["cost_basis_has"] not in (finding.cost_basis or ""):
        out.append(f"{where}: cost basis {finding.cost_basis!r} lacks {want['cost_basis_has']!r}")
    for name in ("team", "method"):
        if name in want and getattr(finding, name) != want[name]:
            out.append(f"{where}: {name}={getattr(finding, name)!r}, expected {want[name]!r}")
    if "gb" in want and not math.isclose(finding.bytes / 1e9, want["gb"], abs_tol=0.001):
        out.append(f"{where}: {finding.bytes / 1e9} GB, expected {want['gb']}")
    for text in want.get("message_has", []):
        if text not in finding.message:
            out.append(f"{where}: message {finding.message!r} lacks {text!r}")
    if "formula" not in finding.evidence:
        out.append(f"{where}: evidence has no formula: {json.dumps(finding.evidence, default=str)}")
    return out

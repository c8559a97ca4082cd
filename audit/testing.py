"""Rule cases as data: build a small real warehouse from YAML, run one rule, check the result.

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
from audit.importers.links import refresh_links
from audit.importers.params import normalised_params
from audit.rule_registry import get_rule, load_checked_config
from audit.scans import RuleResult, run_rules
from audit.warehouse import open_warehouse
from audit.warehouse.frames import insert_frame
from audit.warehouse.samples import append_samples
from audit.windows import Window

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


def build_warehouse(path: Path, data: dict, config_text: str = "") -> tuple[Any, Config]:
    """A real warehouse file at ``path`` holding ``data``; returns it open, with its config."""
    config_file = path.with_suffix(".toml")
    config_file.write_text(config_text, encoding="utf-8")
    config = load_checked_config(config_file)
    wh = open_warehouse(path)
    con = wh.con
    experiments: dict[str, str] = {}
    for run in data.get("runs", []):
        experiment = run.get("experiment")
        if experiment is not None and experiment not in experiments:
            experiments[experiment] = str(len(experiments) + 1)
            con.execute(
                "INSERT INTO experiments (source_id, experiment_id, name, lifecycle_stage) "
                "VALUES (?, ?, ?, 'active')",
                [SOURCE, experiments[experiment], experiment],
            )
        row = {
            "source_id": SOURCE,
            "run_id": run["run_id"],
            "experiment_id": experiments.get(experiment, "1"),
            "name": run.get("name", run["run_id"]),
            "user_id": run.get("user", "ann"),
            "status": run.get("status", "FINISHED"),
            "start_time": at(run.get("start", 0)),
            "end_time": at(run.get("end", 1)),
            "lifecycle_stage": run.get("lifecycle", "active"),
            "source_commit": run.get("commit", "abc"),
            "artifact_uri": run.get("artifact_uri"),
        }
        insert_frame(con, "runs", pl.DataFrame([row]))
        params = [
            {"run_id": run["run_id"], "key": k, "value": str(v)}
            for k, v in run.get("params", {}).items()
        ]
        if params:
            insert_frame(
                con,
                "params",
                normalised_params(pl.DataFrame(params)).with_columns(source_id=pl.lit(SOURCE)),
            )
        for key, value in run.get("tags", {}).items():
            con.execute(
                "INSERT INTO tags VALUES (?, ?, ?, ?)", [SOURCE, run["run_id"], key, str(value)]
            )
        for key, spec in run.get("metrics", {}).items():
            points = metric_points(spec)
            rows = [
                {
                    "source_id": SOURCE,
                    "run_id": run["run_id"],
                    "key": key,
                    "value": value,
                    "step": step,
                    "ts": at(hour),
                }
                for step, hour, value in points
            ]
            insert_frame(con, "metrics", pl.DataFrame(rows))
            step, hour, value = max(points, key=lambda p: (p[0], p[1]))
            con.execute(
                "INSERT INTO latest_metrics VALUES (?, ?, ?, ?, ?, ?)",
                [SOURCE, run["run_id"], key, value, step, at(hour)],
            )
        for ds in run.get("datasets", []):
            con.execute(
                "INSERT INTO dataset_inputs VALUES (?, ?, ?, ?, 'local', ?, 'train')",
                [SOURCE, run["run_id"], ds["name"], ds["digest"], f"/data/{ds['name']}"],
            )
        if run.get("registered"):
            con.execute(
                "INSERT INTO model_versions VALUES (?, 'm', '1', ?, ?, 'READY', NULL, NULL)",
                [
                    SOURCE,
                    run["run_id"],
                    run["registered"] if isinstance(run["registered"], str) else None,
                ],
            )
    for job in data.get("jobs", []):
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
        insert_frame(con, "jobs", pl.DataFrame([row]))
        con.execute(
            "INSERT INTO job_nodes VALUES ('default', ?, ?)",
            [str(job["job_id"]), job.get("host", "n1")],
        )
    for spec in data.get("telemetry", []):
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
        append_samples(con, pl.DataFrame(rows))
    for c in data.get("checkpoints", []):
        con.execute(
            "INSERT INTO checkpoints (root, path, kind, step, bytes, files, mtime, is_best, run_dir) "
            "VALUES ('/ckpt', ?, 'hf', ?, ?, 3, ?, ?, ?)",
            [
                c["path"],
                c.get("step"),
                int(c["gb"] * 1e9),
                at(c.get("hour", 0)),
                c.get("best", False),
                c["path"].rsplit("/", 1)[0],
            ],
        )
    refresh_links(con, config)
    return wh, config


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

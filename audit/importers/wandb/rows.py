"""From a W&B run's state to the warehouse's values: params, the Slurm job id, summary
points, GPU samples, tags, status and end time."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from audit.importers import numbers
from audit.importers.params import flatten_config
from audit.importers.run_files import GPU_SAMPLE_SCHEMA, POINT_SCHEMA
from audit.importers.wandb.state import RunState, json_value
from audit.warehouse.values import WORLD_SIZE_TAG

_STATUS_BY_EXIT = {True: "FINISHED", False: "FAILED"}
JOB_ID_KEYS = ("slurm_job_id", "slurm.job_id", "slurm_jobid")
_JOB_ARG = re.compile(r"^(?:--)?slurm[_.-]?job[_.-]?id(?:=(?P<value>\d[\d_]*))?$", re.IGNORECASE)


def config_params(config: dict) -> dict[str, str]:
    """W&B config as params: ``_wandb`` (the library's own) left out, the old
    ``{desc, value}`` wrapping of ``config.yaml`` unwrapped, nested keys joined with '.'."""
    plain = {}
    for key, value in config.items():
        if key in ("_wandb", "wandb_version"):
            continue
        if isinstance(value, dict) and "value" in value and set(value) <= {"value", "desc"}:
            value = value["value"]
        plain[key] = value
    return flatten_config(plain)


def slurm_job_id(state: RunState, params: dict[str, str]) -> str | None:
    """A Slurm job id from the metadata (wandb records SLURM_* variables), the config, or
    the command line; None when the run says nothing about one."""
    for key in ("job_id", "SLURM_JOB_ID", "jobid"):
        if state.slurm.get(key):
            return str(state.slurm[key])
    lowered = {k.lower(): v for k, v in params.items()}
    for key in JOB_ID_KEYS:
        if lowered.get(key, "").strip().isdigit():
            return lowered[key].strip()
    for index, arg in enumerate(state.args):
        text = arg.split("SLURM_JOB_ID=", 1)[1] if "SLURM_JOB_ID=" in arg else None
        match = _JOB_ARG.match(arg)
        if match and match.group("value"):
            text = match.group("value")
        elif match and index + 1 < len(state.args):
            text = state.args[index + 1]
        if text and text.strip().isdigit():
            return text.strip()
    return None


def summary_as_points(state: RunState, history_keys: set[str], end_ms, where: Path) -> pl.DataFrame:
    """Numeric summary values of keys never logged as history, as one point at the end;
    ``where`` (the log, or files/wandb-summary.json) names the file a bad value came from."""
    decoded = {
        k: json_value(v, f"{where}: summary {k[:60]!r}")
        for k, v in state.summary.items()
        if k not in history_keys
    }
    values = {}
    for key, value in flatten_config(
        {k: v for k, v in decoded.items() if not k.startswith("_")}
    ).items():
        if key in history_keys or "._" in key or value in ("True", "False"):
            continue
        try:
            values[key] = float(value)
        except ValueError:
            continue
    last_step = max((row[1] for row in state.latest if row[1] is not None), default=None)
    return pl.DataFrame(
        {
            "key": list(values),
            "value": list(values.values()),
            "step": [last_step] * len(values),
            "timestamp": [end_ms] * len(values),
        },
        schema=POINT_SCHEMA,
    )


def gpu_frame(samples: list[tuple], state: RunState) -> pl.DataFrame:
    rows = []
    for gpu, ms, values in samples:
        if ms is None:
            continue
        info = state.gpus.get(gpu, {})
        total = info.get("memory_mib")
        used = values.get("mem_bytes")
        used = used / 2**20 if used is not None else None
        if used is None and values.get("mem_pct") is not None and total:
            used = values["mem_pct"] * total / 100.0
        rows.append(
            {
                "host": state.host or "unknown",
                "gpu": gpu,
                "ts": datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None),
                "util_pct": values.get("util_pct"),
                "mem_used_mib": used,
                "mem_total_mib": total,
                "power_w": values.get("power_w"),
                "model": info.get("name") or state.gpu_type or None,
                "uuid": info.get("uuid"),
            }
        )
    frame = pl.DataFrame(rows, schema=GPU_SAMPLE_SCHEMA)
    return frame.unique(["host", "gpu", "ts"], keep="first", maintain_order=True)


def run_tags(state: RunState, job_id: str | None, tail: str | None, from_files: bool) -> dict:
    tags = {
        "wandb.project": state.project,
        "wandb.entity": state.entity,
        "wandb.group": state.group,
        "wandb.job_type": state.job_type,
        "wandb.notes": state.notes,
        "wandb.tags": ", ".join(state.labels),
        "wandb.sweep_id": state.sweep_id,
        "wandb.version": state.version,
        "host": state.host,
        "gpu_type": state.gpu_type,
        # W&B lists every GPU of the machine: its count is the host's, not the run's
        "host.gpu_count": str(state.gpu_count) if state.gpu_count else "",
        WORLD_SIZE_TAG: str(state.world_size) if state.world_size else "",
        f"{WORLD_SIZE_TAG}.evidence": (
            f"files/output.log: {state.world_size_said!r}" if state.world_size else ""
        ),
        "slurm_job_id": job_id or "",
        "audit.log_tail": tail or "",
    }
    if from_files:
        tags["audit.status_reason"] = "files/ only (wandb not installed): no exit record read"
    elif state.exit_code is None:
        tags["audit.status_reason"] = (
            "no exit record in the .wandb log (killed, crashed or running)"
        )
    return {k: v for k, v in tags.items() if v}


def run_status(state: RunState, from_files: bool) -> str | None:
    if from_files:
        return None
    if state.exit_code is None:
        return "KILLED"
    return _STATUS_BY_EXIT[state.exit_code == 0]


def end_time_ms(state: RunState) -> int | None:
    ends = [state.last_ms]
    runtime_ms = numbers.seconds_to_ms(state.runtime_s)  # NaN, inf, 1e300: unknown
    if state.start_ms is not None and runtime_ms:
        ends.append(numbers.plausible_ms(state.start_ms + runtime_ms))
    return max((e for e in ends if e is not None), default=None)

"""Live Slurm state: ``squeue --json`` or ``scontrol --json show job`` (jobs the controller
holds: running, and ended ones for ``MinJobAge``) and ``sacct --json`` for jobs that ended
since the last look, into ``jobs`` / ``job_nodes`` / ``job_gpus``.

The controller's job list has one layout from Slurm 22.05 (openapi v0.0.38) to 25.11
(data_parser v0.0.44), checked against SchedMD's source (``PARSER_ARRAY(JOB_INFO)`` of
each data_parser) and against Debian's 22.05 in the tests; the same field names
throughout, with these encodings:
  times (``start_time``, ``end_time``, ``submit_time``, ``eligible_time``): seconds since
    1970 (v0.0.38/39) or ``{"set", "infinite", "number"}`` (v0.0.40+);
  ``time_limit``, ``array_task_id``, ``node_count``, ``cpus``: plain or null (v0.0.38),
    ``{"set", "infinite", "number"}`` (v0.0.39+);
  ``job_state``: a word (v0.0.38/39) or a list of words, base state first (v0.0.40+);
  ``gres_detail``: per node of ``nodes``, in order, ``gpu[:TYPE]:N(IDX:0-1,4)`` (or
    ``gpu[:TYPE](CNT:N)`` without indices), entries joined by ``,``; empty once the job ended.
Each job becomes the record ``sacct -P`` prints for it and goes through the same row
builder as an accounting file (``jobs``); ``end_time`` of a job still running is the moment
it was seen (as ``sacct`` exports do: Start + elapsed), never the projected end the
controller lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import polars as pl

from audit.errors import InputError
from audit.importers.slurm.jobs import JOB_SCHEMA, TERMINAL_STATES, job_row
from audit.importers.slurm.json_values import (
    json_limit,
    json_state,
    json_text,
    json_time,
    json_whole,
)
from audit.importers.slurm.values import LineError
from audit.importers.text import describe
from audit.windows import now_utc

# states in which a job holds its allocation
HOLDING_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED"})
GPU_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "host": pl.String, "gpu": pl.String}
_GRES_ENTRY = re.compile(r"([^,()]+)\(([^)]*)\)")


@dataclass
class LiveJobs:
    """What the controller listed at ``seen_at``: job rows, their hosts and GPU indices."""

    jobs: pl.DataFrame
    nodes: pl.DataFrame
    gpus: pl.DataFrame
    seen_at: datetime
    layout: str  # the plugin that wrote it: openapi/v0.0.38, data_parser/v0.0.42, ...
    holding: set[str] = field(default_factory=set)  # job ids holding an allocation now
    skipped: list[str] = field(default_factory=list)


def read_live_jobs(
    document, label: str, tz: ZoneInfo, cluster: str, seen_at: datetime | None = None
) -> LiveJobs:
    """Jobs of a ``squeue --json`` / ``scontrol --json show job`` document. A job that
    cannot be read is an error naming ``jobs[i] (job N)`` and the field."""
    seen_at = seen_at or now_utc()
    reported_errors(document, label)
    jobs = document.get("jobs") if isinstance(document, dict) else None
    if not isinstance(jobs, list):
        raise InputError(
            f'{label}: expected an object with a list of "jobs", got {describe(document)}'
        )
    rows, node_rows, gpu_rows, holding = [], [], [], set()
    for index, job in enumerate(jobs):
        shown = job.get("job_id") if isinstance(job, dict) else None
        where = f"{label}: jobs[{index}]" + (f" (job {shown})" if isinstance(shown, int) else "")
        try:
            parsed = _live_job(job, tz, cluster, label, seen_at)
        except LineError as exc:
            raise InputError(f"{where}: {exc}") from None
        if parsed is None:
            continue  # pending: nothing allocated yet
        row, gpus = parsed
        hosts = row.pop("_hosts")
        rows.append(row)
        node_rows.extend((cluster, row["job_id"], h) for h in hosts)
        gpu_rows.extend((cluster, row["job_id"], h, g) for h, g in gpus)
        if row["state"] in HOLDING_STATES:
            holding.add(row["job_id"])
    return LiveJobs(
        jobs=pl.DataFrame(rows, schema=JOB_SCHEMA) if rows else pl.DataFrame(schema=JOB_SCHEMA),
        nodes=pl.DataFrame(
            node_rows,
            schema={"cluster": pl.String, "job_id": pl.String, "host": pl.String},
            orient="row",
        ),
        gpus=pl.DataFrame(gpu_rows, schema=GPU_SCHEMA, orient="row"),
        seen_at=seen_at,
        layout=_layout(document),
        holding=holding,
    )


def reported_errors(document, label: str) -> None:
    """A Slurm client that cannot reach its daemon still exits 0 with ``--json`` and says
    so in ``errors`` (seen with 22.05's squeue), next to an empty job list: that is no
    answer, never "no jobs"."""
    errors = document.get("errors") if isinstance(document, dict) else None
    if not errors:
        return
    first = errors[0]
    text_ = first.get("description") or first.get("error") if isinstance(first, dict) else first
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    raise InputError(f"{label}: Slurm reported an error: {str(text_)[:300]}{more}")


def _layout(document: dict) -> str:
    plugin = (
        document.get("meta", {}).get("plugin", {}) if isinstance(document.get("meta"), dict) else {}
    )
    if isinstance(plugin, dict):
        for key in ("data_parser", "type"):
            if isinstance(plugin.get(key), str) and plugin[key]:
                return plugin[key]
    return "unknown"


def _live_job(job, tz: ZoneInfo, cluster: str, label: str, seen_at: datetime):
    if not isinstance(job, dict):
        raise LineError(f"expected a job object, got {describe(job)}")
    state_detail = json_state(job, "job_state")
    state = state_detail.split(" ", 1)[0]
    start = json_time(job, "start_time")
    if state == "PENDING" or not start:
        return None
    job_id = _job_id(job)
    ended = state in TERMINAL_STATES
    end = json_time(job, "end_time") if ended else ""
    elapsed = ""
    if not ended:  # seen running: held from Start to now (the controller's end is a forecast)
        started = datetime.fromisoformat(start).astimezone(UTC).replace(tzinfo=None)
        elapsed = str(max(int((seen_at - started).total_seconds()), 0))
    record = {
        "jobid": job_id,
        "jobname": json_text(job, "name") or "",
        "user": json_text(job, "user_name") or "",
        "account": json_text(job, "account") or "",
        "partition": json_text(job, "partition") or "",
        "state": state_detail,
        "submit": json_time(job, "submit_time"),
        "eligible": json_time(job, "eligible_time"),
        "start": start,
        "end": end,
        "elapsedraw": elapsed,
        "timelimitraw": json_limit(job, "time_limit"),
        "nnodes": _count(job, "node_count"),
        "ncpus": _count(job, "cpus"),
        "nodelist": json_text(job, "nodes") or "",
        "alloctres": json_text(job, "tres_alloc_str") or "",
        "reqtres": json_text(job, "tres_req_str") or "",
        "admincomment": json_text(job, "admin_comment") or "",
    }
    row = job_row(record, job_id, tz, cluster, label)
    gpus = _gres_gpus(job, row["_hosts"])
    if not row["gpus"]:  # no gres/gpu in the TRES (AccountingStorageTRES without it)
        row["gpus"] = _gpus_requested(job, gpus, len(row["_hosts"]))
    return row, gpus


def _job_id(job: dict) -> str:
    job_id = json_whole(job, "job_id")
    if not job_id:
        raise LineError(f"job_id: expected a job number, got {describe(job.get('job_id'))}")
    het_id, het_offset = json_whole(job, "het_job_id"), json_whole(job, "het_job_offset")
    if het_id and het_offset is not None:
        return f"{het_id}+{het_offset}"
    array_id, task_id = json_whole(job, "array_job_id"), json_whole(job, "array_task_id")
    if array_id and task_id is not None:
        return f"{array_id}_{task_id}"
    return str(job_id)


def _count(job: dict, key: str) -> str:
    value = json_whole(job, key)
    return "" if value is None else str(value)


def _gres_gpus(job: dict, hosts: list[str]) -> list[tuple[str, str]]:
    """(host, GPU index) of the job from ``gres_detail``: one entry per node of the job."""
    detail = job.get("gres_detail")
    if detail is None:
        return []
    if not isinstance(detail, list) or not all(isinstance(d, str) for d in detail):
        raise LineError(f"gres_detail: expected a list of text, got {describe(detail)}")
    out = []
    for host, text_ in zip(hosts, detail, strict=False):
        for spec, inner in _GRES_ENTRY.findall(text_):
            if spec.split(":", 1)[0].strip() != "gpu" or not inner.startswith("IDX:"):
                continue
            indices = inner[4:]
            if indices in ("", "N/A"):
                continue
            out.extend((host, str(i)) for i in _indices(indices))
    return out


def _indices(text_: str) -> list[int]:
    """Slurm's bitmap format: ``0-1,4`` -> [0, 1, 4]."""
    out = []
    for part in text_.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise LineError(f"gres_detail: expected GPU indices like 0-1,4, got {text_[:40]!r}")
        first, last = int(low), int(high or low)
        if last < first or last - first > 4096:
            raise LineError(f"gres_detail: bad GPU index range {part[:40]!r}")
        out.extend(range(first, last + 1))
    return out


def _gpus_requested(job: dict, gpus: list[tuple[str, str]], nodes: int) -> int:
    """GPUs of a job whose TRES do not count them: its indices, else ``gres:gpu:N`` (or
    ``gres/gpu:N``) per node × nodes."""
    if gpus:
        return len(gpus)
    per_node = json_text(job, "tres_per_node") or ""
    match = re.search(r"gres[:/]gpu(?::[^:,=]+)?[:=](\d+)", per_node)
    return int(match.group(1)) * max(nodes, 1) if match else 0

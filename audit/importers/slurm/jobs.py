"""One job's ``sacct -P`` record as a row of ``jobs`` (and a step's record as the usage it
rolls up to its job), whichever form the record came in."""

from __future__ import annotations

from datetime import timedelta
from zoneinfo import ZoneInfo

import polars as pl

from audit.importers.slurm.values import (
    LAST_YEAR,
    NO_LIMIT,
    UINT32_MAX,
    LineError,
    gpus_from_tres,
    local_times,
    parse_duration,
    parse_hostlist,
    parse_memory,
    parse_time,
    parse_tres,
    start_and_end,
    whole_number,
)

# The two highest time limits of Slurm's 32-bit counts are its NO_VAL and INFINITE markers.
_NO_VAL_MINUTES = 2**32 - 2
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "TIMEOUT",
    }
)

JOB_SCHEMA = {
    "cluster": pl.String,
    "job_id": pl.String,
    "array_job_id": pl.String,
    "name": pl.String,
    "user_name": pl.String,
    "account": pl.String,
    "partition": pl.String,
    "state": pl.String,
    "state_detail": pl.String,
    "submit_time": pl.Datetime("us"),
    "eligible_time": pl.Datetime("us"),
    "start_time": pl.Datetime("us"),
    "end_time": pl.Datetime("us"),
    "elapsed_s": pl.Int64,
    "timelimit_s": pl.Int64,
    "nnodes": pl.Int32,
    "ncpus": pl.Int32,
    "nodelist": pl.String,
    "gpus": pl.Int32,
    "gpu_type": pl.String,
    "req_gpus": pl.Int32,
    "req_mem_bytes": pl.Int64,
    "max_rss_bytes": pl.Int64,
    "max_gpu_util_pct": pl.Float64,
    "max_gpu_mem_bytes": pl.Int64,
    "ave_gpu_util_pct": pl.Float64,
    "ave_gpu_mem_bytes": pl.Int64,
    "steps": pl.Int32,
    "admin_comment": pl.String,
    "source_file": pl.String,
}
# step usage -> the job column it rolls up to (the highest value over the steps)
USAGE_COLUMNS = (
    "max_rss_bytes",
    "max_gpu_util_pct",
    "max_gpu_mem_bytes",
    "ave_gpu_util_pct",
    "ave_gpu_mem_bytes",
)


# -- one record -> one row -------------------------------------------------------------------
def usage_of(record: dict) -> dict:
    peak = parse_tres(record.get("tresusageinmax", ""))
    mean = parse_tres(record.get("tresusageinave", ""))
    rss = record.get("maxrss", "")
    return {
        "max_gpu_util_pct": _util(peak.get("gres/gpuutil")),
        "max_gpu_mem_bytes": _gpumem(peak.get("gres/gpumem")),
        "ave_gpu_util_pct": _util(mean.get("gres/gpuutil")),
        "ave_gpu_mem_bytes": _gpumem(mean.get("gres/gpumem")),
        "max_rss_bytes": parse_memory(rss, "MaxRSS") if rss.strip() else None,
    }


def _util(value: str | None) -> float | None:
    return float(whole_number(value, "gres/gpuutil")) if value not in (None, "") else None


def _gpumem(value: str | None) -> int | None:
    return parse_memory(value, "gres/gpumem") if value not in (None, "") else None


def job_row(record: dict, job_id: str, tz: ZoneInfo, cluster: str, source: str) -> dict:
    get = lambda name: record.get(name, "").strip()  # noqa: E731
    state_detail = get("state")
    alloc = parse_tres(get("alloctres"))
    req = parse_tres(get("reqtres"))
    gpus, gpu_type = gpus_from_tres(alloc)
    req_gpus, req_type = gpus_from_tres(req)
    if get("elapsedraw"):
        elapsed = whole_number(get("elapsedraw"), "ElapsedRaw", UINT32_MAX)
    elif get("elapsed"):
        elapsed = parse_duration(get("elapsed"), "Elapsed")
    else:
        elapsed = None
    start, end = start_and_end(
        local_times(get("start"), tz, "Start"), local_times(get("end"), tz, "End"), elapsed, record
    )
    if elapsed is None and start and end:
        elapsed = int((end - start).total_seconds())
    if get("timelimitraw"):
        raw = get("timelimitraw")
        minutes = None if raw.lower() in NO_LIMIT else whole_number(raw, "TimelimitRaw", UINT32_MAX)
        timelimit = None if minutes is None or minutes >= _NO_VAL_MINUTES else minutes * 60
    else:
        timelimit = parse_duration(get("timelimit"), "Timelimit") if "timelimit" in record else None
    if start and end is None and elapsed is not None:
        end = start + timedelta(seconds=elapsed)
        if end.year > LAST_YEAR:
            raise LineError(f"elapsed time {elapsed} s puts the end after {LAST_YEAR}")
    usage = usage_of(record)
    nodelist = get("nodelist")
    array_job_id = job_id.split("_", 1)[0] if "_" in job_id else None
    return {
        "cluster": cluster,
        "job_id": job_id,
        "array_job_id": array_job_id,
        "name": record.get("jobname"),
        "user_name": get("user") or None,
        "account": get("account") or None,
        "partition": get("partition") or None,
        "state": state_detail.split(" ", 1)[0] if state_detail else None,
        "state_detail": state_detail or None,
        "submit_time": parse_time(get("submit"), tz, "Submit"),
        "eligible_time": parse_time(get("eligible"), tz, "Eligible"),
        "start_time": start,
        "end_time": end,
        "elapsed_s": elapsed,
        "timelimit_s": timelimit,
        "nnodes": whole_number(get("nnodes"), "NNodes") if get("nnodes") else None,
        "ncpus": whole_number(get("ncpus"), "NCPUS") if get("ncpus") else None,
        "nodelist": nodelist or None,
        "gpus": gpus or 0,
        "gpu_type": gpu_type or req_type,
        "req_gpus": req_gpus,
        "req_mem_bytes": parse_memory(get("reqmem"), "ReqMem") if get("reqmem") else None,
        **usage,
        "admin_comment": record.get("admincomment") or None,
        "source_file": source,
        "_hosts": parse_hostlist(nodelist),
    }

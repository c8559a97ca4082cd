"""Slurm accounting (``sacct``) files: parsing and loading into ``jobs`` / ``job_nodes``.

Reads what sites really emit: ``sacct -P`` / ``--parsable2`` with a header line, or
headerless output with ``--fields`` and a custom ``--delimiter``; ``--parsable`` output
with its trailing delimiter; job rows and step rows (``123.batch``, ``123.0``,
``123.extern``; array tasks ``123_4``), whose usage rolls up to the job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl

from audit.errors import InputError

RECOMMENDED_FIELDS = (
    "JobID,JobName,User,Account,Partition,State,Submit,Eligible,Start,End,ElapsedRaw,TimelimitRaw,"
    "NNodes,NCPUS,NodeList,AllocTRES,ReqTRES,TRESUsageInMax"
)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_NO_TIME = {"", "unknown", "none", "n/a"}
_NO_LIMIT = {"unlimited", "partition_limit", "invalid", ""}
_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)([nc]?)$", re.IGNORECASE)

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
    "steps": pl.Int32,
    "source_file": pl.String,
}


class LineError(ValueError):
    """A field that cannot be parsed; the reader adds file and line."""


# -- field parsers -------------------------------------------------------------------------
def parse_hostlist(expression: str) -> list[str]:
    """Expand Slurm hostlist syntax: ``gpu-a[01-03,07]``, ``n[1-2]-ib``, ``a1,b[2-3]``."""
    text = expression.strip()
    if not text or text.lower() in ("none assigned", "(null)", "none"):
        return []
    hosts: list[str] = []
    for part in _split_top_level(text):
        hosts.extend(_expand(part))
    return hosts


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise LineError(f"unbalanced ']' in node list {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise LineError(f"unbalanced '[' in node list {text!r}")
    parts.append("".join(current))
    return [p for p in parts if p]


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    out = []
    for item in match.group(1).split(","):
        if "-" in item:
            lo, hi = item.split("-", 1)
            if (
                not (lo.isdigit() and hi.isdigit())
                or int(hi) < int(lo)
                or int(hi) - int(lo) > 100_000
            ):
                raise LineError(f"bad range {item!r} in node list {pattern!r}")
            width = len(lo)
            values = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        else:
            if not item:
                raise LineError(f"empty item in node list {pattern!r}")
            values = [item]
        for value in values:
            out.extend(_expand(f"{head}{value}{tail}"))
    return out


def parse_tres(text: str) -> dict[str, str]:
    """``billing=8,cpu=8,gres/gpu:v100=1,gres/gpu=1,mem=10G`` -> dict."""
    out = {}
    for item in text.split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise LineError(f"expected key=value in TRES {text[:80]!r}")
        out[key.strip()] = value.strip()
    return out


def gpus_from_tres(tres: dict[str, str]) -> tuple[int | None, str | None]:
    """GPU count from the bare ``gres/gpu=`` entry, type from a typed ``gres/gpu:TYPE=`` one.

    Sites list both (``gres/gpu:h100=8,gres/gpu=8``); counting both would double the GPUs,
    so typed entries are summed only when the bare one is missing.
    """
    typed = {
        k.split(":", 1)[1].split("(")[0]: v for k, v in tres.items() if k.startswith("gres/gpu:")
    }
    gpu_type = next(iter(typed), None)
    if "gres/gpu" in tres:
        return _int(tres["gres/gpu"], "gres/gpu"), gpu_type
    if typed:
        return sum(_int(v, "gres/gpu") for v in typed.values()), gpu_type
    return None, None


def parse_memory(text: str, field_name: str = "memory") -> int | None:
    """``10G``, ``1294440K``, ``125000M``, ``4000Mc`` (per CPU) -> bytes (per node as written)."""
    text = text.strip()
    if not text or text in ("0", "0n", "0c"):
        return 0 if text else None
    match = _MEMORY.match(text)
    if not match:
        raise LineError(f"{field_name}: expected a size like 10G or 4000Mc, got {text[:40]!r}")
    number, unit, _per = match.groups()
    return int(float(number) * _UNITS[unit.upper()])


def parse_duration(text: str, field_name: str) -> int | None:
    """``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS.mmm`` -> seconds; UNLIMITED and friends -> None."""
    text = text.strip()
    if text.lower() in _NO_LIMIT:
        return None
    match = _DURATION.match(text)
    if not match:
        raise LineError(
            f"{field_name}: expected D-HH:MM:SS, HH:MM:SS or MM:SS.mmm, got {text[:40]!r}"
        )
    days, a, b, c = match.groups()
    if a is None:  # MM:SS(.mmm)
        hours, minutes, seconds = 0, int(b), float(c)
    else:
        hours, minutes, seconds = int(a), int(b), float(c)
    return round(int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds)


def parse_time(text: str, tz: ZoneInfo, field_name: str) -> datetime | None:
    """A naive sacct time in ``tz`` -> naive UTC; Unknown/None -> None."""
    text = text.strip()
    if text.lower() in _NO_TIME:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise LineError(
            f"{field_name}: expected a time like 2024-04-04T19:29:45, got {text[:40]!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=tz)
    utc = moment.astimezone(ZoneInfo("UTC")).replace(tzinfo=None)
    if not 1970 <= utc.year <= 2200:
        raise LineError(f"{field_name}: time {text!r} is out of range")
    return utc


def _int(text: str, field_name: str) -> int:
    try:
        value = int(float(text))
    except ValueError:
        raise LineError(f"{field_name}: expected a number, got {text[:40]!r}") from None
    if value < 0:
        raise LineError(f"{field_name}: expected a non-negative number, got {text[:40]!r}")
    return value


# -- reading a file ------------------------------------------------------------------------
@dataclass
class SacctFile:
    jobs: pl.DataFrame
    nodes: pl.DataFrame
    lines: int = 0
    skipped: list[str] = field(default_factory=list)


def read_sacct(
    path: Path,
    tz: ZoneInfo,
    fields: list[str] | None = None,
    delimiter: str = "|",
    skip_bad: bool = False,
    cluster: str = "default",
) -> SacctFile:
    text = _read_text(path)
    lines = text.splitlines()
    first_data = 0
    if fields is None:
        if not lines:
            raise InputError(f"{path}: empty file; expected sacct -P output with a header line")
        header = lines[0].split(delimiter)
        if not any(h.strip().lower() == "jobid" for h in header):
            raise InputError(
                f"{path}:1: no header line with JobID (delimiter {delimiter!r}); for headerless "
                "output pass --fields JobID,JobName,... and --delimiter"
            )
        fields = [h.strip() for h in header]
        if fields and fields[-1] == "":  # --parsable: trailing delimiter
            fields = fields[:-1]
        first_data = 1
    columns = [f.strip().lower() for f in fields]
    if "jobid" not in columns:
        raise InputError(f"{path}: the fields must include JobID (got {','.join(fields)})")
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        raise InputError(
            f"{path}: field {duplicated[0]!r} appears more than once in the header/--fields"
        )
    name_is_last = columns[-1] == "jobname"
    jobs: dict[str, dict] = {}
    step_usage: dict[str, list[dict]] = {}
    skipped: list[str] = []
    for number, line in enumerate(lines[first_data:], start=first_data + 1):
        if not line.strip():
            continue
        try:
            values = _split_line(line, delimiter, len(columns), name_is_last)
            record = dict(zip(columns, values, strict=True))
            job_id = record["jobid"].strip()
            if not job_id or not re.match(r"^[0-9][0-9_+\[\]\-,.a-zA-Z]*$", job_id):
                raise LineError(
                    f"JobID: expected an id like 123, 123_4 or 123.batch, got {job_id[:40]!r}"
                )
            if "." in job_id:
                parent, _, _step = job_id.partition(".")
                step_usage.setdefault(parent, []).append(_usage(record))
                continue
            jobs[job_id] = _job_row(record, job_id, tz, cluster, str(path))
        except LineError as exc:
            message = f"{path}:{number}: {exc}"
            if not skip_bad:
                raise InputError(message) from None
            skipped.append(message)
    rows = []
    node_rows = []
    for job_id, row in jobs.items():
        usages = step_usage.get(job_id, [])
        row["steps"] = len(usages)
        for key in ("max_rss_bytes", "max_gpu_util_pct", "max_gpu_mem_bytes"):
            values = [u[key] for u in usages if u[key] is not None]
            if row.get(key) is not None:
                values.append(row[key])
            row[key] = max(values) if values else None
        hosts = row.pop("_hosts")
        node_rows.extend((cluster, job_id, h) for h in hosts)
        rows.append(row)
    jobs_frame = pl.DataFrame(rows, schema=JOB_SCHEMA) if rows else pl.DataFrame(schema=JOB_SCHEMA)
    nodes = pl.DataFrame(
        node_rows,
        schema={"cluster": pl.String, "job_id": pl.String, "host": pl.String},
        orient="row",
    )
    return SacctFile(jobs=jobs_frame, nodes=nodes, lines=len(lines) - first_data, skipped=skipped)


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass sacct output files")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if b"\x00" in raw[:65536]:
        raise InputError(f"{path}: binary data (NUL bytes), not sacct text output")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(
            f"{path}:{line}: invalid UTF-8 (byte {exc.start}); sacct writes UTF-8 text"
        ) from None


def _split_line(line: str, delimiter: str, expected: int, name_is_last: bool) -> list[str]:
    values = line.split(delimiter)
    if len(values) > expected and values[-1] == "":
        values = values[:-1]  # --parsable ends every line with the delimiter
    if len(values) > expected and name_is_last:
        values = [*values[: expected - 1], delimiter.join(values[expected - 1 :])]
    if len(values) != expected:
        raise LineError(
            f"expected {expected} fields separated by {delimiter!r}, found {len(values)}"
        )
    return values


def _usage(record: dict) -> dict:
    tres = parse_tres(record.get("tresusageinmax", ""))
    util = tres.get("gres/gpuutil")
    mem = tres.get("gres/gpumem")
    rss = record.get("maxrss", "")
    return {
        "max_gpu_util_pct": float(_int(util, "gres/gpuutil")) if util not in (None, "") else None,
        "max_gpu_mem_bytes": parse_memory(mem, "gres/gpumem") if mem not in (None, "") else None,
        "max_rss_bytes": parse_memory(rss, "MaxRSS") if rss.strip() else None,
    }


def _job_row(record: dict, job_id: str, tz: ZoneInfo, cluster: str, source: str) -> dict:
    get = lambda name: record.get(name, "").strip()  # noqa: E731
    state_detail = get("state")
    alloc = parse_tres(get("alloctres"))
    req = parse_tres(get("reqtres"))
    gpus, gpu_type = gpus_from_tres(alloc)
    req_gpus, req_type = gpus_from_tres(req)
    start = parse_time(get("start"), tz, "Start")
    end = parse_time(get("end"), tz, "End")
    if get("elapsedraw"):
        elapsed = _int(get("elapsedraw"), "ElapsedRaw")
    elif get("elapsed"):
        elapsed = parse_duration(get("elapsed"), "Elapsed")
    else:
        elapsed = int((end - start).total_seconds()) if start and end else None
    if get("timelimitraw"):
        raw = get("timelimitraw")
        timelimit = None if raw.lower() in _NO_LIMIT else _int(raw, "TimelimitRaw") * 60
    else:
        timelimit = parse_duration(get("timelimit"), "Timelimit") if "timelimit" in record else None
    if start and end is None and elapsed is not None:
        end = start + timedelta(seconds=elapsed)
    usage = _usage(record)
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
        # optional: sacct --format ...,Eligible,... (when dependencies were met)
        "eligible_time": parse_time(get("eligible"), tz, "Eligible"),
        "start_time": start,
        "end_time": end,
        "elapsed_s": elapsed,
        "timelimit_s": timelimit,
        "nnodes": _int(get("nnodes"), "NNodes") if get("nnodes") else None,
        "ncpus": _int(get("ncpus"), "NCPUS") if get("ncpus") else None,
        "nodelist": nodelist or None,
        "gpus": gpus or 0,
        "gpu_type": gpu_type or req_type,
        "req_gpus": req_gpus,
        "req_mem_bytes": parse_memory(get("reqmem"), "ReqMem") if get("reqmem") else None,
        "max_rss_bytes": usage["max_rss_bytes"],
        "max_gpu_util_pct": usage["max_gpu_util_pct"],
        "max_gpu_mem_bytes": usage["max_gpu_mem_bytes"],
        "source_file": source,
        "_hosts": parse_hostlist(nodelist),
    }

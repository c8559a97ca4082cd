"""Slurm accounting (``sacct``) files: parsing and loading into ``jobs`` / ``job_nodes``.

Reads what sites really emit: ``sacct -P`` / ``--parsable2`` with a header line, or
headerless output with ``--fields`` and a custom ``--delimiter``; ``--parsable`` output
with its trailing delimiter; ``sacct --json`` (data_parser v0.0.37 of Slurm 21.08 to
v0.0.44 of Slurm 25.11); job rows and step rows (``123.batch``, ``123.0``,
``123.extern``; array tasks ``123_4``), whose usage rolls up to the job.

Both forms become the same rows: a JSON job is turned into the record ``sacct -P`` prints
for it (epoch times as UTC, TRES lists as ``type/name=count``), and one function builds a
job row from a record. Every number is bounded by what its column and Slurm can hold, so
a value beyond it is an input error naming the file and line (or JSON job and field).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl

from audit.errors import InputError
from audit.importers import text
from audit.importers.text import describe

RECOMMENDED_FIELDS = (
    "JobID,JobName,User,Account,Partition,State,Submit,Eligible,Start,End,ElapsedRaw,"
    "TimelimitRaw,NNodes,NCPUS,NodeList,AllocTRES,ReqTRES,TRESUsageInMax,TRESUsageInAve,"
    "AdminComment"
)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_NO_TIME = {"", "unknown", "none", "n/a"}
_NO_LIMIT = {"unlimited", "partition_limit", "invalid", ""}
_DURATION = re.compile(r"^(?:(\d{1,9})-)?(?:(\d{1,9}):)?(\d{1,9}):(\d{1,9}(?:\.\d{1,9})?)$")
_MEMORY = re.compile(r"^(\d{1,20}(?:\.\d{1,9})?)([KMGTP]?)([nc]?)$", re.IGNORECASE)
_WHOLE = re.compile(r"^\+?(\d{1,20})(?:\.0*)?$")
_JOB_ID = re.compile(r"^[0-9][0-9_+\[\]\-,.%a-zA-Z]*$")
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Slurm keeps elapsed seconds and time limits in minutes as 32-bit counts; the two
# highest limit values are its NO_VAL and INFINITE markers.
UINT32_MAX = 2**32 - 1
_NO_VAL_MINUTES = 2**32 - 2
MAX_HOSTS = 100_000  # more hosts than the largest cluster has, in one node list
FIRST_YEAR, LAST_YEAR = 1970, 2200
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
_USAGE_COLUMNS = (
    "max_rss_bytes",
    "max_gpu_util_pct",
    "max_gpu_mem_bytes",
    "ave_gpu_util_pct",
    "ave_gpu_mem_bytes",
)


class LineError(ValueError):
    """A field that cannot be parsed; the reader adds file and line."""


# -- field parsers -------------------------------------------------------------------------
def parse_hostlist(expression: str) -> list[str]:
    """Expand Slurm hostlist syntax: ``gpu-a[01-03,07]``, ``n[1-2]-ib``, ``a1,b[2-3]``.

    The number of hosts is counted before anything is expanded: each bracket is bounded,
    and so is their product (``n[0-99999][0-99999]`` names 10^10 hosts).
    """
    text_ = expression.strip()
    if not text_ or text_.lower() in ("none assigned", "(null)", "none"):
        return []
    parts = _split_top_level(text_)
    total = sum(_host_count(part) for part in parts)
    if total > MAX_HOSTS:
        raise LineError(
            f"node list {text_[:60]!r} names {total:,} hosts, more than the {MAX_HOSTS:,} "
            "a node list may hold"
        )
    hosts: list[str] = []
    for part in parts:
        hosts.extend(_expand(part))
    return hosts


def _split_top_level(text_: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text_:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise LineError(f"unbalanced ']' in node list {text_[:60]!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise LineError(f"unbalanced '[' in node list {text_[:60]!r}")
    parts.append("".join(current))
    return [p for p in parts if p]


def _bracket_items(pattern: str, items: str) -> list[tuple[int, int, int] | str]:
    """``01-03,07`` -> [(1, 3, 2), '07']: ranges as (low, high, zero-padded width)."""
    out: list[tuple[int, int, int] | str] = []
    for item in items.split(","):
        if "-" in item:
            lo, hi = item.split("-", 1)
            if (
                not (lo.isdigit() and hi.isdigit() and len(lo) <= 12 and len(hi) <= 12)
                or int(hi) < int(lo)
                or int(hi) - int(lo) > MAX_HOSTS
            ):
                raise LineError(f"bad range {item[:40]!r} in node list {pattern[:60]!r}")
            out.append((int(lo), int(hi), len(lo)))
        elif not item:
            raise LineError(f"empty item in node list {pattern[:60]!r}")
        else:
            out.append(item)
    return out


def _host_count(pattern: str) -> int:
    count = 1
    for match in re.finditer(r"\[([^\]]*)\]", pattern):
        items = _bracket_items(pattern, match.group(1))
        count *= sum(i[1] - i[0] + 1 if isinstance(i, tuple) else 1 for i in items)
        if count > MAX_HOSTS:
            return count
    return count


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    out = []
    for item in _bracket_items(pattern, match.group(1)):
        if isinstance(item, tuple):
            lo, hi, width = item
            values = [str(n).zfill(width) for n in range(lo, hi + 1)]
        else:
            values = [item]
        for value in values:
            out.extend(_expand(f"{head}{value}{tail}"))
    return out


def parse_tres(text_: str) -> dict[str, str]:
    """``billing=8,cpu=8,gres/gpu:v100=1,gres/gpu=1,mem=10G`` -> dict."""
    out = {}
    for item in text_.split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise LineError(f"expected key=value in TRES {text_[:80]!r}")
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
        total = sum(_int(v, "gres/gpu") for v in typed.values())
        if total > INT32_MAX:
            raise LineError(f"gres/gpu: {total} GPUs is out of range")
        return total, gpu_type
    return None, None


def parse_memory(text_: str, field_name: str = "memory") -> int | None:
    """``10G``, ``1294440K``, ``125000M``, ``4000Mc`` (per CPU) -> bytes (per node as written)."""
    text_ = text_.strip()
    if not text_ or text_ in ("0", "0n", "0c"):
        return 0 if text_ else None
    match = _MEMORY.match(text_)
    if not match:
        raise LineError(f"{field_name}: expected a size like 10G or 4000Mc, got {text_[:40]!r}")
    number, unit, _per = match.groups()
    size = int(float(number) * _UNITS[unit.upper()])
    if size > INT64_MAX:
        raise LineError(f"{field_name}: {text_[:40]} is out of range (more than 8 EiB)")
    return size


def parse_duration(text_: str, field_name: str) -> int | None:
    """``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS.mmm`` -> seconds; UNLIMITED and friends -> None."""
    text_ = text_.strip()
    if text_.lower() in _NO_LIMIT:
        return None
    match = _DURATION.match(text_)
    if not match:
        raise LineError(
            f"{field_name}: expected D-HH:MM:SS, HH:MM:SS or MM:SS.mmm, got {text_[:40]!r}"
        )
    days, a, b, c = match.groups()
    if a is None:  # MM:SS(.mmm)
        hours, minutes, seconds = 0, int(b), float(c)
    else:
        hours, minutes, seconds = int(a), int(b), float(c)
    total = round(int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds)
    if total > UINT32_MAX:
        raise LineError(f"{field_name}: {text_[:40]} is out of range (more than 136 years)")
    return total


def parse_time(text_: str, tz: ZoneInfo, field_name: str) -> datetime | None:
    """A naive sacct time in ``tz`` -> naive UTC; Unknown/None -> None. A time that occurs
    twice (the hour repeated when daylight saving time ends) is read as the first one."""
    moments = _moments(text_, tz, field_name)
    return moments[0] if moments else None


def _moments(text_: str, tz: ZoneInfo, field_name: str) -> list[datetime]:
    """The UTC readings of a sacct time: none (unknown), one, or two for a naive time in
    the repeated hour at the end of daylight saving time (earlier reading first)."""
    text_ = text_.strip()
    if text_.lower() in _NO_TIME:
        return []
    try:
        moment = datetime.fromisoformat(text_)
    except ValueError:
        raise LineError(
            f"{field_name}: expected a time like 2024-04-04T19:29:45, got {text_[:40]!r}"
        ) from None
    if moment.tzinfo is None:
        candidates = [moment.replace(tzinfo=tz, fold=0), moment.replace(tzinfo=tz, fold=1)]
    else:
        candidates = [moment]
    out = []
    for candidate in candidates:
        try:
            utc = candidate.astimezone(UTC).replace(tzinfo=None)
        except OverflowError:
            raise LineError(f"{field_name}: time {text_[:40]!r} is out of range") from None
        if not FIRST_YEAR <= utc.year <= LAST_YEAR:
            raise LineError(f"{field_name}: time {text_[:40]!r} is out of range")
        if utc not in out:
            out.append(utc)
    return out


def _start_and_end(
    starts: list[datetime], ends: list[datetime], elapsed: int | None, record: dict
) -> tuple[datetime | None, datetime | None]:
    """Start and End, with each time of the repeated DST hour read so that End is not
    before Start and, when sacct gives the elapsed time, so that they agree with it."""
    if not starts or not ends:
        return (starts[0] if starts else None), (ends[0] if ends else None)
    pairs = [(s, e) for s in starts for e in ends if e >= s]
    if not pairs:
        raise LineError(
            f"End {record.get('end', '').strip()} is before Start {record.get('start', '').strip()}"
        )
    if elapsed is not None:
        return min(pairs, key=lambda p: abs((p[1] - p[0]).total_seconds() - elapsed))
    return pairs[0]


def _int(text_: str, field_name: str, maximum: int = INT32_MAX) -> int:
    text_ = text_.strip()
    match = _WHOLE.match(text_)
    if not match:
        if text_.startswith("-") and _WHOLE.match(text_[1:]):
            raise LineError(f"{field_name}: expected a non-negative number, got {text_[:40]!r}")
        raise LineError(f"{field_name}: expected a whole number, got {text_[:40]!r}")
    value = int(match.group(1))
    if value > maximum:
        raise LineError(f"{field_name}: {text_[:40]} is out of range (at most {maximum:,})")
    return value


# -- reading a file ------------------------------------------------------------------------
@dataclass
class SacctFile:
    jobs: pl.DataFrame
    nodes: pl.DataFrame
    lines: int = 0
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read_sacct(
    path: Path,
    tz: ZoneInfo,
    fields: list[str] | None = None,
    delimiter: str = "|",
    skip_bad: bool = False,
    cluster: str = "default",
) -> SacctFile:
    content = _read_text(path)
    notes: list[str] = []
    if content.lstrip().startswith(("{", "[")):
        records, count = _json_records(path, content)
    else:
        records, count = _text_records(path, content, fields, delimiter)
    jobs: dict[str, dict] = {}
    step_usage: dict[str, list[dict]] = {}
    skipped: list[str] = []
    for where, read_records in records:
        try:
            built = []
            for record in read_records():
                job_id = record["jobid"].strip()
                if not job_id or not _JOB_ID.match(job_id):
                    raise LineError(
                        f"JobID: expected an id like 123, 123_4 or 123.batch, got {job_id[:40]!r}"
                    )
                if "." in job_id:
                    built.append((job_id.partition(".")[0], _usage(record), True))
                else:
                    built.append((job_id, _job_row(record, job_id, tz, cluster, str(path)), False))
        except LineError as exc:
            if where.unterminated:
                notes.append(f"{path}: last line incomplete, skipped (a file still being written)")
                continue
            message = f"{where.label}: {exc}"
            if not skip_bad:
                raise InputError(message) from None
            skipped.append(message)
            continue
        for job_id, row, is_step in built:
            if is_step:
                step_usage.setdefault(job_id, []).append(row)
            else:
                jobs[job_id] = row
    rows = []
    node_rows = []
    for job_id, row in jobs.items():
        usages = step_usage.get(job_id, [])
        row["steps"] = len(usages)
        for key in _USAGE_COLUMNS:
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
    return SacctFile(jobs=jobs_frame, nodes=nodes, lines=count, skipped=skipped, notes=notes)


@dataclass(frozen=True)
class _Where:
    label: str  # file:line, or file: jobs[i] (job N)
    unterminated: bool = False  # the last line of a file that does not end with a newline


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass sacct output files")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    encoding = text.sniff(path, raw[:65536], "sacct text output")
    return text.decode(path, raw, encoding).removeprefix("\ufeff")


# -- sacct -P --------------------------------------------------------------------------------
_Records = Iterator[tuple[_Where, Callable[[], list[dict]]]]


def _text_records(
    path: Path, content: str, fields: list[str] | None, delimiter: str
) -> tuple[_Records, int]:
    lines = content.splitlines()
    first_data = 0
    if fields is None:
        if not lines:
            raise InputError(f"{path}: empty file; expected sacct -P output with a header line")
        header = lines[0].split(delimiter)
        if not any(h.strip().lower() == "jobid" for h in header):
            raise InputError(
                f"{path}:1: no header line with JobID (delimiter {delimiter!r}); for headerless "
                "output pass --fields JobID,JobName,... and --delimiter, or use sacct --json"
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
    unterminated = bool(content) and not content.endswith(("\n", "\r"))

    def record(line: str) -> list[dict]:
        values = _split_line(line, delimiter, len(columns), name_is_last)
        return [dict(zip(columns, values, strict=True))]

    def records() -> _Records:
        for number, line in enumerate(lines[first_data:], start=first_data + 1):
            if line.strip():
                where = _Where(f"{path}:{number}", unterminated and number == len(lines))
                yield where, lambda line=line: record(line)

    return records(), len(lines) - first_data


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


# -- one record -> one row -------------------------------------------------------------------
def _usage(record: dict) -> dict:
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
    return float(_int(value, "gres/gpuutil")) if value not in (None, "") else None


def _gpumem(value: str | None) -> int | None:
    return parse_memory(value, "gres/gpumem") if value not in (None, "") else None


def _job_row(record: dict, job_id: str, tz: ZoneInfo, cluster: str, source: str) -> dict:
    get = lambda name: record.get(name, "").strip()  # noqa: E731
    state_detail = get("state")
    alloc = parse_tres(get("alloctres"))
    req = parse_tres(get("reqtres"))
    gpus, gpu_type = gpus_from_tres(alloc)
    req_gpus, req_type = gpus_from_tres(req)
    if get("elapsedraw"):
        elapsed = _int(get("elapsedraw"), "ElapsedRaw", UINT32_MAX)
    elif get("elapsed"):
        elapsed = parse_duration(get("elapsed"), "Elapsed")
    else:
        elapsed = None
    start, end = _start_and_end(
        _moments(get("start"), tz, "Start"), _moments(get("end"), tz, "End"), elapsed, record
    )
    if elapsed is None and start and end:
        elapsed = int((end - start).total_seconds())
    if get("timelimitraw"):
        raw = get("timelimitraw")
        minutes = None if raw.lower() in _NO_LIMIT else _int(raw, "TimelimitRaw", UINT32_MAX)
        timelimit = None if minutes is None or minutes >= _NO_VAL_MINUTES else minutes * 60
    else:
        timelimit = parse_duration(get("timelimit"), "Timelimit") if "timelimit" in record else None
    if start and end is None and elapsed is not None:
        end = start + timedelta(seconds=elapsed)
        if end.year > LAST_YEAR:
            raise LineError(f"elapsed time {elapsed} s puts the end after {LAST_YEAR}")
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
        **usage,
        "admin_comment": record.get("admincomment") or None,
        "source_file": source,
        "_hosts": parse_hostlist(nodelist),
    }


# -- sacct --json ----------------------------------------------------------------------------
# The layout changed between data_parser versions; every form seen is read:
#   numbers: plain (v0.0.37/38) or {"set", "infinite", "number"} (v0.0.39+), for time.limit,
#     array.task_id, het.job_offset and step times;
#   state.current: a word (to v0.0.39) or a list of words (v0.0.40+);
#   step.id: "123.batch" (v0.0.40+), {"job_id", "step_id"} (v0.0.39), or step.job_id with
#     step.id (v0.0.37/38);
#   TRES: lists of {"type", "name", "count"}; mem of a job in MiB, usage in bytes.
def _json_records(path: Path, content: str) -> tuple[_Records, int]:
    document = text.load_json(path, content)
    jobs = document.get("jobs") if isinstance(document, dict) else None
    if not isinstance(jobs, list):
        raise InputError(
            f'{path}: expected sacct --json output, an object with a list of "jobs"; '
            "for sacct -P output the first line must be the header"
        )

    def records() -> _Records:
        for index, job in enumerate(jobs):
            shown = job.get("job_id") if isinstance(job, dict) else None
            known = isinstance(shown, int) and not isinstance(shown, bool)
            label = f"{path}: jobs[{index}]" + (f" (job {shown})" if known else "")
            yield _Where(label), lambda job=job: _json_job_records(job)

    return records(), len(jobs)


def _json_job_records(job) -> list[dict]:
    """The sacct -P records of one JSON job: the job, then its steps."""
    if not isinstance(job, dict):
        raise LineError(f"expected a job object, got {describe(job)}")
    job_id = _json_job_id(job)
    record = {
        "jobid": job_id,
        "jobname": _json_text(job, "name"),
        "user": _json_text(job, "user") or "",
        "account": _json_text(job, "account") or "",
        "partition": _json_text(job, "partition") or "",
        "state": _json_state(job, "state.current"),
        "submit": _json_time(job, "time.submission"),
        "eligible": _json_time(job, "time.eligible"),
        "start": _json_time(job, "time.start"),
        "end": _json_time(job, "time.end"),
        "elapsedraw": _json_count(job, "time.elapsed"),
        "timelimitraw": _json_limit(job, "time.limit"),
        "nnodes": _json_count(job, "allocation_nodes"),
        "nodelist": _json_text(job, "nodes") or "",
        "alloctres": _json_tres(job, "tres.allocated"),
        "reqtres": _json_tres(job, "tres.requested"),
        "admincomment": _json_text(job, "comment.administrator") or "",
    }
    cpus = _tres_counts(job, "tres.allocated").get("cpu")
    record["ncpus"] = str(cpus) if cpus is not None else _json_count(job, "required.CPUs")
    memory = _tres_counts(job, "tres.requested").get("mem")
    record["reqmem"] = f"{memory}M" if memory is not None else ""
    steps = _member(job, "steps")
    if steps is not None and not isinstance(steps, list):
        raise LineError(f"steps: expected a list, got {describe(steps)}")
    return [record] + [
        _json_step(step, job_id, f"steps[{number}]") for number, step in enumerate(steps or [])
    ]


def _json_job_id(job: dict) -> str:
    """The JobID sacct -P prints: 123, array task 123_4 (or pending 123_[1-10]),
    heterogeneous component 123+1."""
    job_id = _json_whole(job, "job_id")
    if not job_id:
        raise LineError(f"job_id: expected a job number, got {describe(job.get('job_id'))}")
    het_id, het_offset = _json_whole(job, "het.job_id"), _json_whole(job, "het.job_offset")
    if het_id and het_offset is not None:
        return f"{het_id}+{het_offset}"
    array_id = _json_whole(job, "array.job_id")
    if array_id:
        task_id = _json_whole(job, "array.task_id")
        if task_id is not None:
            return f"{array_id}_{task_id}"
        tasks = _json_text(job, "array.task")
        if tasks:
            return f"{array_id}_[{tasks}]"
    return str(job_id)


def _json_step(step, parent: str, where: str) -> dict:
    if not isinstance(step, dict):
        raise LineError(f"{where}: expected a step object, got {describe(step)}")
    step_id = _member(step, "step.id")
    if isinstance(step_id, dict):  # v0.0.39: {"job_id": 123, "step_id": "batch"}
        step_id = step_id.get("step_id")
    if isinstance(step_id, bool) or not isinstance(step_id, str | int):
        raise LineError(f"{where}.step.id: expected a step id, got {describe(step_id)}")
    name = str(step_id)
    name = name.split(".", 1)[1] if "." in name else name  # "123.batch" -> "batch"
    peak = _json_tres(step, "tres.requested.max", where)
    rss = _tres_counts(step, "tres.requested.max", where).get("mem")
    return {
        "jobid": f"{parent}.{name}",
        "tresusageinmax": peak,
        "tresusageinave": _json_tres(step, "tres.requested.average", where),
        "maxrss": str(rss) if rss is not None else "",
    }


def _member(obj: dict, dotted: str, where: str = ""):
    value = obj
    parts = dotted.split(".")
    for depth, key in enumerate(parts):
        if value is None:
            return None
        if not isinstance(value, dict):
            shown = ".".join(filter(None, [where, *parts[:depth]]))
            raise LineError(f"{shown}: expected an object, got {describe(value)}")
        value = value.get(key)
    return value


_INFINITE = object()
# Slurm's markers for "no value" and "infinite" in 32- and 64-bit fields: a job cancelled
# before it started has time.start 4294967294 (sacct -P prints None).
_NO_VALUE = {2**32 - 2, 2**64 - 2}
_INFINITE_VALUE = {2**32 - 1, 2**64 - 1}


def _json_number(obj: dict, dotted: str, where: str = ""):
    """A whole number, None when absent or not set, _INFINITE for an infinite one; both
    the plain form and the {"set", "infinite", "number"} form of v0.0.39+."""
    value = _member(obj, dotted, where)
    shown = ".".join(filter(None, [where, dotted]))
    if isinstance(value, dict):
        flags = (value.get("set", True), value.get("infinite", False))
        if not all(isinstance(f, bool) for f in flags):
            raise LineError(f"{shown}: expected set/infinite as true or false")
        if flags[1]:
            return _INFINITE
        if not flags[0]:
            return None
        value = value.get("number")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise LineError(f"{shown}: expected a whole number, got {describe(value)}")
    if value in _NO_VALUE:
        return None
    if value in _INFINITE_VALUE:
        return _INFINITE
    if not 0 <= value <= INT64_MAX:
        raise LineError(f"{shown}: {value} is out of range")
    return value


def _json_whole(obj: dict, dotted: str) -> int | None:
    value = _json_number(obj, dotted)
    if value is _INFINITE:
        raise LineError(f"{dotted}: expected a number, got infinite")
    return value


def _json_count(obj: dict, dotted: str) -> str:
    value = _json_whole(obj, dotted)
    return "" if value is None else str(value)


def _json_limit(obj: dict, dotted: str) -> str:
    value = _json_number(obj, dotted)
    return "UNLIMITED" if value is _INFINITE else "" if value is None else str(value)


def _json_time(obj: dict, dotted: str) -> str:
    """Seconds since 1970 -> an ISO time in UTC; 0 or Slurm's no-value marker (not
    happened yet) -> ''."""
    value = _json_number(obj, dotted)
    if value is _INFINITE or not value:
        return ""
    try:
        return datetime.fromtimestamp(value, UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        raise LineError(f"{dotted}: time {value} is out of range") from None


def _json_text(obj: dict, dotted: str) -> str | None:
    value = _member(obj, dotted)
    if value is None:
        return None
    if not isinstance(value, str):
        raise LineError(f"{dotted}: expected text, got {describe(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise LineError(f"{dotted}: text holds an invalid character (a lone surrogate)") from None
    return value


def _json_state(obj: dict, dotted: str) -> str:
    value = _member(obj, dotted)
    words = value if isinstance(value, list) else [value] if value is not None else []
    for word in words:
        if not isinstance(word, str) or not re.fullmatch(r"[A-Z_]{1,40}", word):
            raise LineError(f"{dotted}: expected a job state like COMPLETED, got {describe(word)}")
    return " ".join(words)


def _tres_counts(obj: dict, dotted: str, where: str = "") -> dict[str, int]:
    """A TRES list as {type/name: count}, names as sacct -P prints them."""
    value = _member(obj, dotted, where)
    shown = ".".join(filter(None, [where, dotted]))
    if value is None:
        return {}
    if not isinstance(value, list):
        raise LineError(f"{shown}: expected a list of TRES, got {describe(value)}")
    out = {}
    for number, item in enumerate(value):
        at = f"{shown}[{number}]"
        if not isinstance(item, dict):
            raise LineError(f"{at}: expected a TRES object, got {describe(item)}")
        kind, name = item.get("type"), item.get("name")
        if not isinstance(kind, str) or not re.fullmatch(r"[A-Za-z0-9_/:.()-]{1,60}", kind):
            raise LineError(f"{at}.type: expected a TRES type like gres, got {describe(kind)}")
        if name is not None and (
            not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_/:.()-]{0,60}", name)
        ):
            raise LineError(f"{at}.name: expected a TRES name like gpu, got {describe(name)}")
        count = item.get("count")
        if count is None:
            continue  # not measured: v0.0.38 writes energy without a plugin as null
        if isinstance(count, bool) or not isinstance(count, int):
            raise LineError(f"{at}.count: expected a whole number, got {describe(count)}")
        if count < 0:
            continue  # -2: not measured (energy without a plugin)
        if count > INT64_MAX:
            raise LineError(f"{at}.count: {count} is out of range")
        out[f"{kind}/{name}" if name else kind] = count
    return out


def _json_tres(obj: dict, dotted: str, where: str = "") -> str:
    return ",".join(f"{k}={v}" for k, v in _tres_counts(obj, dotted, where).items())


# -- which record of a job is the newer -----------------------------------------------------
def _moment() -> pl.Expr:
    """The latest moment a job record describes."""
    return pl.coalesce(
        pl.col("end_time"),
        pl.col("start_time") + pl.duration(seconds=pl.col("elapsed_s")),
        pl.col("start_time"),
        pl.col("eligible_time"),
        pl.col("submit_time"),
    )


# what tells records apart: not where or when they were imported
_COMPARED = [c for c in JOB_SCHEMA if c != "source_file"]


def newest_records(jobs: pl.DataFrame, stored: pl.DataFrame | None = None) -> pl.DataFrame:
    """Of several records of one job, the newer: the one describing the later moment
    (End, else Start + elapsed, Start, Eligible, Submit); at the same moment a finished
    state beats an unfinished one, then the record with more fields filled (a later export
    adds jobstats' AdminComment), then a fixed order of the values, so that no result
    depends on the order of imports. ``stored`` rows are the warehouse's: an incoming
    record replaces one only when it is not older, so re-importing old files, in any
    order, never makes the warehouse older. Returns the rows of ``jobs`` to write."""
    keyed = jobs.with_columns(_stored=pl.lit(False), _order=pl.int_range(pl.len()))
    if stored is not None and stored.height:
        keyed = pl.concat(
            [
                keyed,
                stored.select(*(c for c in keyed.columns if c in stored.columns)).with_columns(
                    _stored=pl.lit(True), _order=pl.lit(-1, dtype=pl.Int64)
                ),
            ],
            how="diagonal_relaxed",
        )
    ranked = keyed.with_columns(
        _moment=_moment().fill_null(datetime(1, 1, 1)),
        _final=pl.col("state").is_in(list(TERMINAL_STATES)).fill_null(False),
        _filled=pl.sum_horizontal(pl.col(c).is_not_null() for c in _COMPARED),
        _values=pl.concat_str([pl.col(c).cast(pl.String) for c in _COMPARED], ignore_nulls=True),
    ).sort(["_moment", "_final", "_filled", "_values", "_order"])
    newest = ranked.unique(["cluster", "job_id"], keep="last", maintain_order=True)
    return (
        newest.filter(~pl.col("_stored"))
        .sort("_order")
        .select(jobs.columns)
        .cast(dict(jobs.schema))
    )

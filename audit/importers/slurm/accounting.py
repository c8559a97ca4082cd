"""Reading one ``sacct`` file, either form: its records built into job rows and node rows,
steps' usage rolled up to their jobs, a bad record an error naming file and line (or
skipped with ``--skip-bad``), a last line still being written left for the next import."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl

from audit.errors import InputError
from audit.importers import text
from audit.importers.slurm.jobs import JOB_SCHEMA, USAGE_COLUMNS, job_row, usage_of
from audit.importers.slurm.json_jobs import json_records
from audit.importers.slurm.parsable import text_records
from audit.importers.slurm.values import LineError

_JOB_ID = re.compile(r"^[0-9][0-9_+\[\]\-,.%a-zA-Z]*$")


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
        records, count = json_records(path, content)
    else:
        records, count = text_records(path, content, fields, delimiter)
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
                    built.append((job_id.partition(".")[0], usage_of(record), True))
                else:
                    built.append((job_id, job_row(record, job_id, tz, cluster, str(path)), False))
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
        for key in USAGE_COLUMNS:
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

"""``sacct -P`` / ``--parsable2`` text (a header line, or ``--fields`` and ``--delimiter``
for headerless output) and ``--parsable`` with its trailing delimiter, as records."""

from __future__ import annotations

from pathlib import Path

from audit.errors import InputError
from audit.importers.slurm.records import Records, Where
from audit.importers.slurm.values import LineError


def text_records(
    path: Path, content: str, fields: list[str] | None, delimiter: str
) -> tuple[Records, int]:
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

    def records() -> Records:
        for number, line in enumerate(lines[first_data:], start=first_data + 1):
            if line.strip():
                where = Where(f"{path}:{number}", unterminated and number == len(lines))
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

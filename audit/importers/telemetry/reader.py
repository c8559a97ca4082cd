"""Reading a telemetry file: which of the formats it holds (nvidia-smi CSV, dcgm-exporter /
Prometheus text, Prometheus JSON), handed to that format's reader; the nvidia-smi table
printout, which cannot be read, refused with the command that logs CSV."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from audit.errors import InputError
from audit.importers import text
from audit.importers.telemetry.exposition import SERIES_LINE, read_exposition
from audit.importers.telemetry.file_text import head_bytes, whole_text
from audit.importers.telemetry.nvidia_smi import QUERY_COMMAND, SmiSource, read_nvidia_smi
from audit.importers.telemetry.prometheus_json import read_prometheus_json
from audit.importers.telemetry.samples import TelemetryFile

_TABLE_PRINTOUT = re.compile(r"^\|\s*NVIDIA-SMI\s+\d|^=+NVSMI LOG=+", re.MULTILINE)


def read_telemetry(
    path: Path,
    tz: ZoneInfo,
    host: str | None = None,
    fields: list[str] | None = None,
    skip_bad: bool = False,
    at: datetime | None = None,
) -> TelemetryFile:
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass telemetry files")
    if not path.exists():
        raise InputError(f"{path}: no such file")
    head = head_bytes(path)
    encoding = text.sniff(path, head, "a telemetry text file")
    if encoding.startswith("utf-16"):
        head = head[: len(head) - len(head) % 2]
    head_text = head.decode(encoding, errors="replace").removeprefix("\ufeff")
    if not head_text.strip():
        raise InputError(
            f"{path}: empty file; expected nvidia-smi CSV, DCGM/Prometheus text or JSON"
        )
    if _TABLE_PRINTOUT.search(head_text):
        raise InputError(
            f"{path}: this is the nvidia-smi table printout, which cannot be read; "
            f"log CSV instead: {QUERY_COMMAND}"
        )
    stripped = head_text.lstrip()
    first_line = stripped.split("\n", 1)[0]
    if stripped.startswith("{"):
        return read_prometheus_json(path, whole_text(path, encoding), host, skip_bad)
    if stripped.startswith("#") or "DCGM_FI_" in first_line or SERIES_LINE.match(first_line):
        return read_exposition(path, whole_text(path, encoding), host, skip_bad, at)
    with text.utf8_file(path, encoding) as data:
        return read_nvidia_smi(SmiSource(path, data), tz, host or path.stem, fields, skip_bad)

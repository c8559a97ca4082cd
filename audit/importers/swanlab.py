"""SwanLab run folders (``swanlog/run-<time>-<id>/``) read from disk, no network.

SwanLab 0.6 and 0.7 keep a run's complete record in ``backup.swanlab``: the record framing
of ``audit.importers.record_log`` behind the header ``:SWL``, magic 0xE1D6, version 1,
around JSON objects ``{"model_type": ..., "data": {...}}`` (SwanLab's
``swanlab/proto/v0.py``): ``Header`` (creation time), ``Project`` (name, workspace),
``Experiment`` (id, name, description, tags), ``Column`` (a key's chart), ``Scalar``
(key, step, ``metric.data`` and ``metric.create_time``), ``Media``, ``Log`` (console
lines), ``Runtime`` (the names of the files in ``files/``) and ``Footer`` (``success``,
written when the run finishes). SwanLab 0.8 and later write version 2, whose records are
protobuf messages: refused by name, not misread.

Mapping: project -> experiment; experiment id -> run id, its name -> run name; start = the
header's time, end = the footer's, else the last time in the log; status from the footer
(success FINISHED, else FAILED; none: KILLED with tag ``audit.status_reason``);
``files/config.yaml`` (each key wrapped as ``{desc, sort, value}``) -> params, nested keys
joined with '.'; scalars -> metrics with step and time; system scalars
``__swanlab__.gpu.N.{pct,mem.value,mem.pct,power}`` -> GPU samples of the run (host and
card from ``files/swanlab-metadata.json``, origin ``swanlab``), the other ``__swanlab__.*``
system scalars (CPU, disk, network) are left out as W&B's are.

Damage: a log cut short imports what precedes the cut, with a warning naming the byte;
damage followed by more records, a record that is not JSON, or a file that is not a
SwanLab backup is an ``InputError`` naming file and byte offset (``--skip-bad`` leaves the
run out and lists it). Incremental: a run whose files are as the last import saw them
(sizes and modification times) is not read again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from audit import bounded_yaml
from audit.errors import InputError
from audit.importers import numbers, record_log
from audit.importers.files import ParsedUnit
from audit.importers.params import flatten_config
from audit.importers.read import MAX_LINE_VALUES, parse_json, value_bound
from audit.importers.run_files import GPU_SAMPLE_SCHEMA, POINT_SCHEMA, ParsedRun, RunFolderSource
from audit.importers.store_files import read_found_text
from audit.walk import walk

LOG_NAME = "backup.swanlab"
IDENT, MAGIC = b":SWL", 0xE1D6
HEADER = record_log.log_header(IDENT, MAGIC, 1)
SYSTEM_PREFIX = "__swanlab__."
MAX_FILES_BYTES = 64 << 20  # files/config.yaml, files/swanlab-metadata.json
# __swanlab__.gpu.<index>.<field>: the readings a GPU sample holds
_GPU_FIELDS = {
    "pct": "util_pct",
    "mem.value": "mem_used_mib",
    "mem.pct": "mem_pct",
    "power": "power_w",
}


def find_run_folders(paths: list[Path]) -> list[Path]:
    """Run folders in ``paths``: a run folder, a ``backup.swanlab``, or any folder above
    them (searched without following symlinks)."""
    found: dict[Path, Path] = {}
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or folder")
        if path.is_file():
            if path.name != LOG_NAME:
                raise InputError(f"{path}: not a SwanLab {LOG_NAME} nor a folder")
            found.setdefault(path.parent.resolve(), path.parent)
            continue
        before = len(found)
        for root, dirs, files in walk(path, onerror=None):
            if LOG_NAME in files:
                found.setdefault(Path(root).resolve(), Path(root))
                dirs[:] = []  # files/, logs/, media/ of the run
        if len(found) == before:
            older = " (runs.swanlab: SwanLab before 0.6, not read)" if _older_layout(path) else ""
            raise InputError(
                f"{path}: no SwanLab run folder in it (folders holding {LOG_NAME}){older}"
            )
    return sorted(found.values())


def _older_layout(path: Path) -> bool:
    return (path / "runs.swanlab").is_file() or (path / "swanlog" / "runs.swanlab").is_file()


class _Run:
    """What the records of one backup say, folded as they are read."""

    def __init__(self) -> None:
        self.project: str | None = None
        self.workspace: str | None = None
        self.run_id: str | None = None
        self.name: str | None = None
        self.description: str | None = None
        self.labels: list[str] = []
        self.start_ms: int | None = None
        self.footer: dict | None = None
        self.last_ms: int | None = None
        self.config_file = "config.yaml"
        self.metadata_file = "swanlab-metadata.json"
        self.keys: list[str] = []
        self.values: list[float | None] = []
        self.steps: list[int | None] = []
        self.times: list[int | None] = []
        # (gpu, step) -> readings of one monitor tick, and its time
        self.gpu: dict[tuple[str, int | None], dict] = {}
        self.records = 0

    def see_time(self, ms: int | None) -> None:
        if ms is not None:
            self.last_ms = ms if self.last_ms is None else max(self.last_ms, ms)


def _iso_ms(text, where: str) -> int | None:
    """An ISO time of a record as epoch milliseconds (naive times are UTC); None when the
    record has none."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise InputError(f"{where}: a time that is not text: {str(text)[:40]!r}")
    ms = numbers.iso_to_ms(text)
    if ms is None:
        raise InputError(f"{where}: not an ISO time: {text[:40]!r}")
    return ms  # outside 1970-2200: left unknown, with a warning


def _check_header(path: Path) -> None:
    """Version 2 (SwanLab 0.8+) is named, not reported as damage."""
    with open(path, "rb") as f:
        head = f.read(record_log.HEADER_SIZE)
    if head[:4] == IDENT and head != HEADER and len(head) == record_log.HEADER_SIZE:
        raise InputError(
            f"{path}: byte 6: {LOG_NAME} format version {head[6]}; audit reads version 1 "
            "(SwanLab 0.6 and 0.7), whose records are JSON; SwanLab 0.8 and later write "
            "protobuf records, not read yet"
        )


def _records(path: Path, end: record_log.LogEnd) -> Iterator[tuple[int, dict]]:
    """``(offset, record)`` of each complete record of a backup."""
    size = path.lstat().st_size
    if size < record_log.HEADER_SIZE:
        # SwanLab buffers its writes: a run killed early leaves an empty backup
        end.tail = f"truncated at byte {size} (no complete header: nothing of the log was written)"
        return
    _check_header(path)
    for payload in record_log.read_log(path, HEADER, "a SwanLab backup", end=end):
        where = f"{path}: byte {end.record_at}"
        if value_bound(payload) > MAX_LINE_VALUES:
            raise InputError(
                f"{where}: a record of up to {value_bound(payload):,} JSON values, more than "
                f"the {MAX_LINE_VALUES:,} audit reads from one; refused before it fills memory"
            )
        try:
            record = parse_json(payload, where, MAX_LINE_VALUES)
        except InputError:  # not UTF-8, not JSON, nested too deep
            raise InputError(f"{where}: a record that is not JSON ({payload[:40]!r})") from None
        if not (
            isinstance(record, dict)
            and isinstance(record.get("model_type"), str)
            and isinstance(record.get("data"), dict)
        ):
            raise InputError(f"{where}: not a SwanLab record (no model_type and data)")
        yield end.record_at, record


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _fold(run: _Run, kind: str, data: dict, where: str) -> None:
    if kind == "Header":
        run.start_ms = _iso_ms(data.get("create_time"), where)
        run.see_time(run.start_ms)
    elif kind == "Project":
        run.project = _text(data.get("name"))
        run.workspace = _text(data.get("workspace"))
    elif kind == "Experiment":
        run.run_id = _text(data.get("id"))
        run.name = _text(data.get("name"))
        run.description = _text(data.get("description"))
        tags = data.get("tags")
        run.labels = (
            [str(t) for t in tags if isinstance(t, str | int)] if isinstance(tags, list) else []
        )
    elif kind == "Runtime":
        # one record per file written: a later one names the files an earlier did not
        run.config_file = _text(data.get("config_filename")) or run.config_file
        run.metadata_file = _text(data.get("metadata_filename")) or run.metadata_file
    elif kind == "Scalar":
        _fold_scalar(run, data, where)
    elif kind == "Footer":
        run.footer = data
        run.see_time(_iso_ms(data.get("create_time"), where))
    elif kind == "Log":
        run.see_time(_iso_ms(data.get("create_time"), where))


def _fold_scalar(run: _Run, data: dict, where: str) -> None:
    key, metric = data.get("key"), data.get("metric")
    if not isinstance(key, str) or not isinstance(metric, dict):
        raise InputError(f"{where}: a Scalar record without key or metric")
    step = numbers.step(data.get("step"), where)
    value = metric.get("data")
    number = (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    )
    ms = _iso_ms(metric.get("create_time"), where)
    run.see_time(ms)
    if not key.startswith(SYSTEM_PREFIX):
        run.keys.append(key)
        run.values.append(number)
        run.steps.append(step)
        run.times.append(ms)
        return
    parts = key[len(SYSTEM_PREFIX) :].split(".", 2)
    if len(parts) == 3 and parts[0] == "gpu" and parts[2] in _GPU_FIELDS:
        tick = run.gpu.setdefault((parts[1], step), {"ms": ms})
        tick[_GPU_FIELDS[parts[2]]] = numbers.finite(number)
        if ms is not None and (tick["ms"] is None or ms < tick["ms"]):
            tick["ms"] = ms  # the tick's first reading: its readings are a few ms apart


def _config_params(folder: Path, name: str) -> dict[str, str]:
    """``files/config.yaml``: each key as ``{desc, sort, value}``; its values as params."""
    path = folder / "files" / name
    if not os.path.lexists(path):
        return {}
    config = bounded_yaml.load(
        read_found_text(path, MAX_FILES_BYTES, "a SwanLab config.yaml", folder),
        path,
        "a SwanLab config as YAML",
    )
    if not isinstance(config, dict):
        return {}
    plain = {}
    for key, item in config.items():
        if isinstance(item, dict) and "value" in item and set(item) <= {"value", "desc", "sort"}:
            item = item["value"]
        plain[str(key)] = item
    return flatten_config(plain)


def _metadata(folder: Path, name: str) -> dict:
    path = folder / "files" / name
    if not os.path.lexists(path):
        return {}
    data = parse_json(
        read_found_text(path, MAX_FILES_BYTES, "a SwanLab metadata file", folder), path
    )
    return data if isinstance(data, dict) else {}


def _gpus(metadata: dict) -> tuple[list[str], list[float | None], int | None]:
    """Card names, memory (MiB, from the GB SwanLab records) and count of the machine."""
    nvidia = _field(metadata, "gpu", "nvidia")
    if not isinstance(nvidia, dict):
        return [], [], None
    types = [str(t) for t in nvidia.get("type") or [] if isinstance(t, str)]
    memory = []
    for gb in nvidia.get("memory") or []:
        number = (
            numbers.finite(float(gb))
            if isinstance(gb, str | int | float) and _numeric(gb)
            else None
        )
        memory.append(number * 1024 if number is not None else None)
    count = nvidia.get("cores")
    return types, memory, count if isinstance(count, int) and not isinstance(count, bool) else None


def _field(data: dict, *path: str):
    for name in path:
        data = data.get(name) if isinstance(data, dict) else None
    return data


def _numeric(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _gpu_frame(run: _Run, host: str, types: list[str], memory: list[float | None]) -> pl.DataFrame:
    rows = []
    for (gpu, _step), tick in run.gpu.items():
        ms = numbers.plausible_ms(tick["ms"])
        if ms is None:
            continue
        index = int(gpu) if gpu.isdigit() else None
        used, pct = tick.get("mem_used_mib"), tick.get("mem_pct")
        # the capacity from the tick's own two readings (MiB used and its share), else the
        # metadata's whole gigabytes (an A100's 40960 MiB is "40")
        total = used * 100.0 / pct if used is not None and pct else None
        if total is None and index is not None and index < len(memory):
            total = memory[index]
        if used is None and pct is not None and total:
            used = pct * total / 100.0
        model = types[index] if index is not None and index < len(types) else None
        rows.append(
            {
                "host": host,
                "gpu": gpu,
                "ts": datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None),
                "util_pct": tick.get("util_pct"),
                "mem_used_mib": used,
                "mem_total_mib": total,
                "power_w": tick.get("power_w"),
                "model": model or (types[0] if types else None),
                "uuid": None,
            }
        )
    frame = pl.DataFrame(rows, schema=GPU_SAMPLE_SCHEMA)
    return frame.unique(["host", "gpu", "ts"], keep="first", maintain_order=True)


def _status(run: _Run) -> str:
    if run.footer is None:
        return "KILLED"
    return "FINISHED" if run.footer.get("success") is True else "FAILED"


def _signature(folder: Path, log: Path) -> str:
    parts = [log, *sorted(p for p in (folder / "files").glob("*") if p.is_file())]
    return ";".join(
        f"{p.relative_to(folder)}:{p.lstat().st_size}:{p.lstat().st_mtime_ns}" for p in parts
    )


def _run_id_of(folder: Path) -> str:
    """``run-20260531_085436-kd4v3b6ndym9m725v4d7q`` -> its id, as the backup names it."""
    return folder.name.rsplit("-", 1)[-1] if folder.name.startswith("run-") else folder.name


class SwanLabSource(RunFolderSource):
    kind = "swanlab"
    noun = "run"
    progress_label = "importing SwanLab runs"
    command_help = """Import SwanLab run folders from disk (swanlog/; no network, no API key).

    PATH is a swanlog/ folder, a run folder (run-<time>-<id>), a backup.swanlab file, or
    any folder above them. Reads each run's backup.swanlab (SwanLab 0.6 and 0.7): the
    project as experiment, files/config.yaml as params, scalars as metrics with steps and
    times, GPU system metrics as GPU samples of the run, the footer's status. A backup cut
    short imports what precedes the cut, with a warning; an unchanged run is not read again.

    \b
    Example:
      audit ingest swanlab ./swanlog
      audit ingest swanlab --skip-bad /scratch/*/swanlog
    """

    def units(self, paths: list[Path]) -> list[Path]:
        return find_run_folders(paths)

    def parse(self, unit: Path) -> ParsedUnit:
        folder = unit.resolve()
        log = folder / LOG_NAME
        signature = _signature(folder, log)
        known = _run_id_of(folder)
        if self.known_signature(folder.parent, known) == signature:
            run = ParsedRun(folder.parent, known, "", signature, unchanged=True)
            return ParsedUnit(run, rows_read=0)
        state = _Run()
        end = record_log.LogEnd()
        for offset, record in _records(log, end):
            state.records += 1
            _fold(state, record["model_type"], record["data"], f"{log}: byte {offset}")
        warnings = [f"{log}: {end.tail}; imported the records before it"] if end.tail else []
        metadata = _metadata(folder, state.metadata_file)
        types, memory, count = _gpus(metadata)
        host = _text(metadata.get("hostname"))
        git = metadata.get("git_info")
        commit = _text(git[1]) if isinstance(git, list) and len(git) > 1 else None
        run_id = state.run_id or known
        if run_id != known:  # a folder renamed: the backup's id is the run's
            warnings.append(f"{folder}: the folder's name says run {known}, its backup {run_id}")
        tags = {
            "swanlab.project": state.project,
            "swanlab.workspace": state.workspace,
            "swanlab.description": state.description,
            "swanlab.tags": ", ".join(state.labels),
            "swanlab.version": _text(_field(metadata, "swanlab", "version")),
            "host": host,
            "gpu_type": types[0] if types else None,
            # the machine's GPUs, as SwanLab lists them: not how many the run used
            "host.gpu_count": str(count) if count else None,
            "audit.log_tail": end.tail,
            "audit.status_reason": None
            if state.footer is not None
            else f"no footer record in {LOG_NAME} (killed, crashed or running)",
        }
        points = pl.DataFrame(
            {
                "key": state.keys,
                "value": state.values,
                "step": state.steps,
                "timestamp": state.times,
            },
            schema=POINT_SCHEMA,
        )
        end_ms = _iso_ms(state.footer.get("create_time"), str(log)) if state.footer else None
        run = ParsedRun(
            source_dir=folder.parent,
            run_id=run_id,
            experiment=state.project or folder.parent.name,
            signature=signature,
            name=state.name or run_id,
            status=_status(state),
            start_ms=state.start_ms,
            end_ms=end_ms or state.last_ms,
            artifact_uri=str(folder),
            source_name=_text(metadata.get("command")),
            source_commit=commit,
            params=_config_params(folder, state.config_file),
            tags={k: v for k, v in tags.items() if v},
            points=points.filter(pl.col("value").is_not_null()),
            gpu_samples=_gpu_frame(state, host or "unknown", types, memory),
            records=state.records,
        )
        return ParsedUnit(run, rows_read=state.records, warnings=warnings)

"""W&B run folders (``wandb/run-*``, ``wandb/offline-run-*``) read from disk, no network.

The complete record of a run is its transaction log ``run-<id>.wandb``: LevelDB-log
framing (``audit.importers.record_log``, behind a 7-byte ``:W&B`` header) around protobuf
``Record`` messages, parsed with the definitions the ``wandb`` package ships (the
``audit-waste[wandb]`` extra). Without it only ``files/`` is read (config, summary,
metadata): new offline runs write nothing else there, so history, system metrics and the
exit status then stay unknown.

Mapping: project -> experiment; display name, host, start time; end time = the last
timestamp in the log; status from the exit record (0 FINISHED, else FAILED; none: KILLED
with tag ``audit.status_reason``); config (nested keys joined with ``.``, the old
``desc:``/``value:`` layout unwrapped) -> params; history -> metrics (``_step`` as step,
``_timestamp`` as time); numeric summary values never logged as history -> one point at
the end; system metrics ``gpu.N.*`` -> GPU samples of the run (host from the metadata,
origin ``wandb``); a Slurm job id in the metadata or config -> tag ``slurm_job_id``, which
links the run to its job. E-mail addresses are never read into the warehouse.

Damage: a log cut short (a record running past the end of the file, or a damaged last
record) imports what precedes it, with a warning naming the byte offset. Damage followed
by more records, a file that is not a W&B log, or a record that does not parse is an
``InputError`` naming file and byte offset. Memory is bounded: records are read block by
block, a record is at most ``MAX_RECORD_BYTES``, and history is kept as columns.

Incremental: ``run_files`` keeps, per log, the offset after the last complete record and
the state needed to go on (config, summary, run info, latest values); a log that grew is
read from there and only its new points and samples are added.
"""

from __future__ import annotations

import collections
import hashlib
import importlib
import importlib.util
import json
import multiprocessing
import os
import re
import signal
import sys
import types
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from audit import bounded_yaml
from audit.errors import InputError
from audit.importers import numbers, record_log
from audit.importers.console import world_size
from audit.importers.files import ParsedUnit
from audit.importers.params import flatten_config
from audit.importers.read import jsonl_records, parse_json
from audit.importers.record_log import LogEnd
from audit.importers.run_files import (
    GPU_SAMPLE_SCHEMA,
    POINT_SCHEMA,
    ParsedRun,
    RunFolderSource,
    import_run_folders,
)
from audit.importers.run_store import latest_from_history
from audit.importers.store_files import read_found_text
from audit.redact import redact_arguments, redact_json_values, redact_tree, redact_user_id
from audit.walk import walk
from audit.warehouse.values import WORLD_SIZE_TAG

HEADER = record_log.log_header(b":W&B", 0xBEE1, 0)
MAX_FILES_BYTES = 64 << 20  # a files/ JSON or YAML file (config, summary, metadata)
_POINTS_PER_CHUNK = 250_000
_RUN_FOLDER = re.compile(r"^(?:offline-)?run-(?:\d{8}_\d{6}-)?(?P<id>[A-Za-z0-9_-]+)$")
_STATUS_BY_EXIT = {True: "FINISHED", False: "FAILED"}
_HIDDEN_HISTORY = {"_step", "_timestamp", "_runtime"}
JOB_ID_KEYS = ("slurm_job_id", "slurm.job_id", "slurm_jobid")
_JOB_ARG = re.compile(r"^(?:--)?slurm[_.-]?job[_.-]?id(?:=(?P<value>\d[\d_]*))?$", re.IGNORECASE)
STATE_VERSION = 1


def protobufs():
    """The ``Record`` class of the installed wandb, or None when wandb is not installed.

    Only the generated protobuf modules are loaded: ``import wandb`` itself starts the
    SDK (settings models, error reporting) and costs 2-3 s per command. The ``wandb`` and
    ``wandb.proto`` packages stand in as bare namespaces while ``wandb.proto``'s own
    version switch loads the definitions, then step aside for the real package.
    """
    if "wandb" in sys.modules:  # the real package is loaded already: use it
        try:
            from wandb.proto import wandb_internal_pb2
        except ImportError:
            return None
        return wandb_internal_pb2.Record
    spec = importlib.util.find_spec("wandb")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    stand_ins = {"wandb": root, "wandb.proto": root / "proto"}
    for name, folder in stand_ins.items():
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    try:
        module = importlib.import_module("wandb.proto.wandb_internal_pb2")
    except ImportError:
        return None
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)
        sys.modules.pop("wandb.proto.wandb_internal_pb2", None)
    return module.Record


# -- the log framing ------------------------------------------------------------------------
def read_log(path: Path, start: int = len(HEADER), end: LogEnd | None = None) -> Iterator[bytes]:
    """The payloads of the complete records of a W&B log, from byte ``start`` on."""
    return record_log.read_log(path, HEADER, "a W&B transaction log", start, end)


# -- the run state, kept between imports ----------------------------------------------------
@dataclass
class RunState:
    """Everything about a run that later records update, as plain JSON-able data."""

    run_id: str = ""
    project: str = ""
    entity: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    notes: str = ""
    labels: list[str] = field(default_factory=list)
    sweep_id: str = ""
    host: str = ""
    user: str = ""
    program: str = ""
    commit: str = ""
    version: str = ""
    start_ms: int | None = None
    last_ms: int | None = None
    exit_code: int | None = None
    runtime_s: float | None = None
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)  # flat key -> value as JSON text
    slurm: dict = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    gpus: dict = field(default_factory=dict)  # index -> {name, memory_mib, uuid}
    gpu_type: str = ""
    gpu_count: int | None = None  # the machine's GPUs, not the run's
    world_size: int | None = None  # as the run's console log states it
    world_size_said: str = ""
    history_rows: int = 0
    records: int = 0
    latest: list = field(default_factory=list)  # [key, step, ts_ms, value] per history key
    head: str = ""  # hash of the log's first head_bytes: the same file grown, or another
    head_bytes: int = 0

    def as_json(self) -> str:
        """The state as stored in ``run_files.state``: redacted like every stored text."""
        plain = {k: v for k, v in self.__dict__.items() if k not in ("args", "summary")}
        data = redact_tree(json.loads(json.dumps(plain, allow_nan=True)))
        data["user"] = redact_user_id(self.user)
        data["args"] = redact_arguments(self.args)
        data["summary"] = redact_json_values(self.summary)
        return json.dumps({**data, "state_format": STATE_VERSION}, allow_nan=True)

    @classmethod
    def from_json(cls, text: str) -> RunState | None:
        data = json.loads(text)
        if data.pop("state_format", None) != STATE_VERSION:
            return None
        return cls(**data)

    def see_time(self, ms: int | None) -> None:
        if ms is not None and (self.last_ms is None or ms > self.last_ms):
            self.last_ms = ms


def _set_path(tree: dict, path: list[str], value) -> None:
    for part in path[:-1]:
        child = tree.get(part)
        if not isinstance(child, dict):
            child = tree[part] = {}
        tree = child
    tree[path[-1]] = value


def _remove_path(tree: dict, path: list[str]) -> None:
    for part in path[:-1]:
        tree = tree.get(part)
        if not isinstance(tree, dict):
            return
    tree.pop(path[-1], None)


def _item_path(item) -> list[str]:
    return [item.key] if item.key else list(item.nested_key)


def _json(text: str, where: object):
    try:
        return parse_json(text, where)
    except InputError:
        raise InputError(f"{where}: a value is not JSON ({text[:40]!r})") from None


def _ms(timestamp) -> int | None:
    """A protobuf time; unset, or outside the years every tracker's times keep to: None."""
    if not timestamp.seconds and not timestamp.nanos:
        return None
    return numbers.plausible_ms(timestamp.seconds * 1000 + timestamp.nanos // 1_000_000)


# -- reading the log ------------------------------------------------------------------------
class _History:
    """History points as columns, compacted into polars chunks as they come."""

    def __init__(self) -> None:
        self.chunks: list[pl.DataFrame] = []
        self.keys: list[str] = []
        self.values: list[str] = []
        self.steps: list[int | None] = []
        self.times: list[int | None] = []
        self.interned: dict[str, str] = {}

    def add_row(self, keys: list[str], values: list[str], step, ms) -> None:
        n = len(keys)
        self.keys.extend(keys)
        self.values.extend(values)
        self.steps.extend([step] * n)
        self.times.extend([ms] * n)
        if len(self.keys) >= _POINTS_PER_CHUNK:
            self.compact()

    def compact(self) -> None:
        if not self.keys:
            return
        chunk = pl.DataFrame(
            {"key": self.keys, "raw": self.values, "step": self.steps, "timestamp": self.times},
            schema={
                "key": pl.String,
                "raw": pl.String,
                "step": pl.Int64,
                "timestamp": pl.Int64,
            },
        )
        # JSON numbers (NaN, Infinity included) become floats, booleans 1/0; text, lists and
        # media (tables, images) are not metrics and are left out.
        value = (
            pl.when(pl.col("raw") == "true")
            .then(1.0)
            .when(pl.col("raw") == "false")
            .then(0.0)
            .otherwise(pl.col("raw").cast(pl.Float64, strict=False))
        )
        self.chunks.append(
            chunk.with_columns(value=value)
            .filter(pl.col("value").is_not_null())
            .select("key", "value", "step", "timestamp")
        )
        self.keys, self.values, self.steps, self.times = [], [], [], []

    def frame(self) -> pl.DataFrame:
        self.compact()
        if not self.chunks:
            return pl.DataFrame(schema=POINT_SCHEMA)
        return pl.concat(self.chunks).with_columns(pl.col("key").cast(pl.String))


_GPU_FIELDS = {
    "gpu": "util_pct",
    "memoryAllocatedBytes": "mem_bytes",
    "memoryAllocated": "mem_pct",
    "powerWatts": "power_w",
}


# Logs with more unread bytes than this are decoded by two worker processes (decoding is
# Python-bound: one process uses one core); smaller ones in-process, where starting the
# workers would cost more than it saves.
PARALLEL_BYTES = 32 * 2**20
_RECORDS_PER_CHUNK = 4000
_SMALL_RECORDS = {"run", "config", "exit", "environment", "telemetry"}


@dataclass
class _Decoded:
    """What a chunk of records holds, in a form that crosses process boundaries."""

    history: list[pl.DataFrame] = field(default_factory=list)
    history_rows: int = 0
    last_ms: int | None = None
    samples: list[tuple] = field(default_factory=list)
    summary: list[tuple[str, object]] = field(
        default_factory=list
    )  # ("set", {k: v}) | ("remove", [k])
    small: list[bytes] = field(default_factory=list)  # run, config, exit, ... records, in order
    records: int = 0


def _decode(path: Path, payloads: list[bytes], offsets: list[int], record_class=None) -> _Decoded:
    """Decode one chunk of records: history as columns, GPU stats as samples, summary
    updates as an ordered list of changes; the few other records are handed back."""
    from google.protobuf.message import DecodeError

    record_class = record_class or _worker_record_class()
    out = _Decoded()
    history = _History()
    interned = history.interned
    summary: dict[str, str] = {}
    for payload, offset in zip(payloads, offsets, strict=True):
        record = record_class()
        try:
            record.ParseFromString(payload)
        except DecodeError as exc:
            raise InputError(
                f"{path}: byte {offset}: the record does not parse as a W&B protobuf "
                f"({' '.join(str(exc).split()) or 'DecodeError'})"
            ) from None
        out.records += 1
        kind = record.WhichOneof("record_type")
        if kind == "history":
            keys, values = [], []
            step = ms = None
            for item in record.history.item:
                key = item.key
                if not key:
                    nested = item.nested_key
                    key = nested[0] if len(nested) == 1 else ".".join(nested)
                if key in _HIDDEN_HISTORY:
                    try:
                        if key == "_step":
                            step = numbers.step(
                                int(float(item.value_json)), f"{path}: byte {offset}", "_step"
                            )
                        elif key == "_timestamp":
                            ms = numbers.epoch_seconds_to_ms(float(item.value_json))
                    except (ValueError, OverflowError):
                        raise InputError(
                            f"{path}: byte {offset}: history {key} is not a number: "
                            f"{item.value_json[:40]!r}"
                        ) from None
                    continue
                keys.append(interned.setdefault(key, key))
                values.append(item.value_json)
            if step is None and record.history.HasField("step"):
                step = record.history.step.num
            history.add_row(keys, values, step, ms)
            out.history_rows += 1
            if ms is not None and (out.last_ms is None or ms > out.last_ms):
                out.last_ms = ms
        elif kind == "summary":
            if record.summary.remove:
                if summary:
                    out.summary.append(("set", summary))
                    summary = {}
                out.summary.append(
                    ("remove", [i.key or ".".join(i.nested_key) for i in record.summary.remove])
                )
            _fold_summary_updates(record.summary, summary)
        elif kind == "stats":
            ms = _ms(record.stats.timestamp)
            if ms is not None and (out.last_ms is None or ms > out.last_ms):
                out.last_ms = ms
            per_gpu: dict[str, dict] = {}
            for item in record.stats.item:
                parts = item.key.split(".")
                if len(parts) == 3 and parts[0] == "gpu" and parts[2] in _GPU_FIELDS:
                    try:
                        value = float(item.value_json)
                    except ValueError:
                        continue
                    per_gpu.setdefault(parts[1], {})[_GPU_FIELDS[parts[2]]] = value
            for gpu, values in per_gpu.items():
                out.samples.append((gpu, ms, values))
        elif kind in _SMALL_RECORDS:
            out.small.append(payload)
    if summary:
        out.summary.append(("set", summary))
    history.compact()
    out.history = history.chunks
    return out


_WORKER_RECORD_CLASS = None


def _worker_record_class():
    global _WORKER_RECORD_CLASS
    if _WORKER_RECORD_CLASS is None:
        _WORKER_RECORD_CLASS = protobufs()
    return _WORKER_RECORD_CLASS


def _worker_start() -> None:
    # Ctrl-C is the parent's to handle: it rolls the import back and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_record_class()


def _chunks(path: Path, start: int, end: LogEnd) -> Iterator[tuple[list[bytes], list[int]]]:
    payloads: list[bytes] = []
    offsets: list[int] = []
    for payload in read_log(path, start, end):
        payloads.append(payload)
        offsets.append(end.record_at)
        if len(payloads) >= _RECORDS_PER_CHUNK:
            yield payloads, offsets
            payloads, offsets = [], []
    if payloads:
        yield payloads, offsets


def _decoded_chunks(path: Path, record_class, start: int, end: LogEnd) -> Iterator[_Decoded]:
    if path.stat().st_size - start <= PARALLEL_BYTES:
        for payloads, offsets in _chunks(path, start, end):
            yield _decode(path, payloads, offsets, record_class)
        return
    context = multiprocessing.get_context("spawn")  # polars' thread pool does not survive fork
    with ProcessPoolExecutor(2, mp_context=context, initializer=_worker_start) as pool:
        pending: collections.deque = collections.deque()
        try:
            for payloads, offsets in _chunks(path, start, end):
                pending.append(pool.submit(_decode, path, payloads, offsets))
                while len(pending) >= 4:  # bounded: at most four chunks in flight
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _read_records(path: Path, record_class, state: RunState, start: int, end: LogEnd):
    """Fold the log's records from ``start`` into ``state``; returns (history, samples)."""
    history = _History()
    samples: list[tuple] = []
    summary = _SummaryTree.of(state.summary)
    for chunk in _decoded_chunks(path, record_class, start, end):
        state.records += chunk.records
        state.history_rows += chunk.history_rows
        state.see_time(chunk.last_ms)
        history.chunks.extend(chunk.history)
        samples.extend(chunk.samples)
        for payload in chunk.small:
            record = record_class()
            record.ParseFromString(payload)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                _fold_run(record.run, state, path, summary)
            elif kind == "config":
                _fold_updates(record.config, state.config, path)
            elif kind == "exit":
                state.exit_code = record.exit.exit_code
                state.runtime_s = float(record.exit.runtime)
            elif kind == "environment":
                _fold_environment(record.environment, state)
            elif kind == "telemetry" and record.telemetry.cli_version:
                state.version = record.telemetry.cli_version
        for action, change in chunk.summary:
            if action == "set":
                for key, value in change.items():
                    summary.set(key, value)
            else:
                for key in change:
                    summary.remove(key)
    state.summary = summary.flat()
    return history, samples


class _SummaryTree:
    """A run's summary (flat keys to JSON text) as a tree of its keys' dotted parts, for
    W&B's removal: a key goes with every key below it (``a`` takes ``a.b``). Set and remove
    cost the length of the key; scanning every key per removal made a 700 KB log of
    summary updates and removals take 92 s."""

    __slots__ = ("children", "value")
    _UNSET = object()

    def __init__(self) -> None:
        self.value = _SummaryTree._UNSET
        self.children: dict[str, _SummaryTree] = {}

    @classmethod
    def of(cls, flat: dict[str, str]) -> _SummaryTree:
        root = cls()
        for key, value in flat.items():
            root.set(key, value)
        return root

    def set(self, key: str, value: str) -> None:
        node = self
        for part in key.split("."):
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = _SummaryTree()
            node = child
        node.value = value

    def remove(self, key: str) -> None:
        *parents, last = key.split(".")
        node = self
        for part in parents:
            node = node.children.get(part)
            if node is None:
                return
        node.children.pop(last, None)

    def flat(self) -> dict[str, str]:
        """The keys and values again, depth first (no recursion: a key of 100,000 dots is
        100,000 levels)."""
        out: dict[str, str] = {}
        path: list[str] = []
        stack: list[tuple[int, str, _SummaryTree]] = [
            (0, part, child) for part, child in reversed(self.children.items())
        ]
        while stack:
            depth, part, node = stack.pop()
            del path[depth:]
            path.append(part)
            if node.value is not _SummaryTree._UNSET:
                out[".".join(path)] = node.value
            stack.extend((depth + 1, p, c) for p, c in reversed(node.children.items()))
        return out


def _fold_run(run, state: RunState, path: Path, summary: _SummaryTree) -> None:
    state.run_id = run.run_id or state.run_id
    state.project = run.project or state.project
    state.entity = run.entity or state.entity
    state.name = run.display_name or state.name
    state.group = run.run_group or state.group
    state.job_type = run.job_type or state.job_type
    state.notes = run.notes or state.notes
    state.labels = list(run.tags) or state.labels
    state.sweep_id = run.sweep_id or state.sweep_id
    state.host = run.host or state.host
    state.commit = run.git.commit or state.commit
    if state.start_ms is None:
        state.start_ms = _ms(run.start_time)
    _fold_updates(run.config, state.config, path)
    _fold_summary(run.summary, summary)
    if run.telemetry.cli_version:
        state.version = run.telemetry.cli_version


def _fold_updates(record, tree: dict, path: Path) -> None:
    for item in record.update:
        _set_path(tree, _item_path(item), _json(item.value_json, str(path)))
    for item in record.remove:
        _remove_path(tree, _item_path(item))


def _fold_summary_updates(record, summary: dict) -> None:
    """Summary updates kept as JSON text: wandb writes one after every history row (all
    keys each time), and only the last value of a key is ever used."""
    for item in record.update:
        key = item.key
        if not key:
            nested = item.nested_key
            key = nested[0] if len(nested) == 1 else ".".join(nested)
        summary[key] = item.value_json


def _fold_summary(record, summary: _SummaryTree) -> None:
    updates: dict[str, str] = {}
    _fold_summary_updates(record, updates)
    for key, value in updates.items():
        summary.set(key, value)
    for item in record.remove:
        summary.remove(item.key or ".".join(item.nested_key))


def _fold_environment(env, state: RunState) -> None:
    # Deliberately not read: env.email (never stored), env.git.remote_url (may embed a token).
    state.host = state.host or env.host
    state.user = env.username or state.user
    state.program = env.program or state.program
    state.commit = state.commit or env.git.commit
    state.args = list(env.args) or state.args
    state.slurm = dict(env.slurm) or state.slurm
    state.gpu_type = env.gpu_type or state.gpu_type
    state.gpu_count = env.gpu_count or state.gpu_count
    if state.start_ms is None:
        state.start_ms = _ms(env.started_at)
    for index, gpu in enumerate(env.gpu_nvidia):
        state.gpus[str(index)] = {
            "name": gpu.name,
            "memory_mib": gpu.memory_total / 2**20 if gpu.memory_total else None,
            "uuid": gpu.uuid or None,
        }


def _fold_metadata_file(folder: Path, state: RunState) -> None:
    """``files/wandb-metadata.json`` (old versions keep host, user and GPUs only there)."""
    meta = _read_json(folder / "files" / "wandb-metadata.json", folder)
    if not isinstance(meta, dict):
        return
    state.host = state.host or str(meta.get("host") or "")
    state.user = state.user or str(meta.get("username") or "")
    state.program = state.program or str(meta.get("program") or "")
    if not state.args and isinstance(meta.get("args"), list):
        state.args = [str(a) for a in meta["args"]]
    if not state.slurm and isinstance(meta.get("slurm"), dict):
        state.slurm = {str(k): str(v) for k, v in meta["slurm"].items()}
    git = meta.get("git")
    if not state.commit and isinstance(git, dict):
        state.commit = str(git.get("commit") or "")
    state.gpu_type = state.gpu_type or str(meta.get("gpu") or "")
    if state.gpu_count is None and isinstance(meta.get("gpu_count"), int):
        state.gpu_count = meta["gpu_count"]
    if state.start_ms is None:
        state.start_ms = numbers.iso_to_ms(meta.get("startedAt"))
    devices = meta.get("gpu_nvidia") or meta.get("gpu_devices") or []
    if not state.gpus and isinstance(devices, list):
        for index, gpu in enumerate(devices):
            if not isinstance(gpu, dict):
                continue
            total = gpu.get("memoryTotal", gpu.get("memory_total"))
            try:
                memory = float(total) / 2**20 if total is not None else None
            except (TypeError, ValueError):
                memory = None
            state.gpus[str(index)] = {
                "name": gpu.get("name"),
                "memory_mib": memory,
                "uuid": gpu.get("uuid"),
            }


def _fold_console(folder: Path, state: RunState) -> None:
    """The world size the run's console log (``files/output.log``) states, if any."""
    log = folder / "files" / "output.log"
    if not os.path.lexists(log) or os.path.islink(log) or os.path.islink(folder / "files"):
        return
    found = world_size(log)
    if found is not None:
        state.world_size, state.world_size_said = found


def _read_json(path: Path, folder: Path):
    """A JSON file of the run folder ``folder`` (no link followed on the way: a ``files/``
    linked elsewhere is refused)."""
    if not os.path.lexists(path):
        return None
    return parse_json(read_found_text(path, MAX_FILES_BYTES, "a W&B run file", folder), path)


# -- from state to rows -----------------------------------------------------------------------
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


def _summary_points(state: RunState, history_keys: set[str], end_ms, where: Path) -> pl.DataFrame:
    """Numeric summary values of keys never logged as history, as one point at the end;
    ``where`` (the log, or files/wandb-summary.json) names the file a bad value came from."""
    decoded = {
        k: _json(v, f"{where}: summary {k[:60]!r}")
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


def _gpu_frame(samples: list[tuple], state: RunState) -> pl.DataFrame:
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


def _tags(state: RunState, job_id: str | None, tail: str | None, from_files: bool) -> dict:
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


def _status(state: RunState, from_files: bool) -> str | None:
    if from_files:
        return None
    if state.exit_code is None:
        return "KILLED"
    return _STATUS_BY_EXIT[state.exit_code == 0]


def _end_ms(state: RunState) -> int | None:
    ends = [state.last_ms]
    runtime_ms = numbers.seconds_to_ms(state.runtime_s)  # NaN, inf, 1e300: unknown
    if state.start_ms is not None and runtime_ms:
        ends.append(numbers.plausible_ms(state.start_ms + runtime_ms))
    return max((e for e in ends if e is not None), default=None)


# -- the importer -----------------------------------------------------------------------------
def find_run_folders(paths: list[Path]) -> list[Path]:
    """Run folders in ``paths``: a run folder, a ``.wandb`` file, or any folder above them
    (searched without following symlinks, so ``latest-run`` is not read twice)."""
    found: dict[Path, Path] = {}
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or folder")
        if path.is_file():
            if path.suffix != ".wandb":
                raise InputError(f"{path}: not a .wandb log nor a folder; pass a W&B run folder")
            folder = path.parent
            found.setdefault(folder.resolve(), folder)
            continue
        if _is_run_folder(path):
            found.setdefault(path.resolve(), path)
            continue
        before = len(found)
        for root, dirs, files in walk(path, onerror=None):
            here = Path(root)
            if _is_run_folder(here, files):
                found.setdefault(here.resolve(), here)
                dirs[:] = [d for d in dirs if d not in ("files", "logs", "tmp")]
        if len(found) == before:
            raise InputError(
                f"{path}: no W&B run folder in it (folders holding run-<id>.wandb or files/)"
            )
    return _latest_per_run_id(list(found.values()))


def _is_run_folder(folder: Path, files: list[str] | None = None) -> bool:
    names = files if files is not None else [p.name for p in folder.iterdir() if p.is_file()]
    if any(n.endswith(".wandb") for n in names):
        return True
    return bool(_RUN_FOLDER.match(folder.name)) and (folder / "files").is_dir()


def _latest_per_run_id(folders: list[Path]) -> list[Path]:
    """A resumed run leaves one folder per resumption, all with its id: the last one holds
    its final state (earlier folders hold only earlier parts of its history)."""
    by_run: dict[tuple[Path, str], Path] = {}
    for folder in sorted(folders, key=lambda p: p.name):
        by_run[(folder.resolve().parent, _run_id_of(folder))] = folder
    return sorted(by_run.values())


def _run_id_of(folder: Path) -> str:
    logs = sorted(folder.glob("run-*.wandb"))
    if logs:
        return logs[0].stem.removeprefix("run-")
    match = _RUN_FOLDER.match(folder.name)
    return match.group("id") if match else folder.name


class WandbSource(RunFolderSource):
    kind = "wandb"
    noun = "run"
    progress_label = "importing W&B runs"
    command_help = """Import W&B run folders from disk (offline or synced; no network, no API key).

    PATH is a wandb/ folder, a run folder (run-*/offline-run-*), a .wandb file, or any
    folder above them. Reads each run's .wandb transaction log: config as params, history
    as metrics, system metrics as GPU samples of the run, exit status. Needs the
    'audit-waste[wandb]' extra; without it only files/ (config, summary, metadata) is read.
    A log cut short imports what precedes the damage, with a warning; a re-import reads
    only what a log gained since.

    \b
    Example:
      pip install 'audit-waste[wandb]'
      audit ingest wandb /scratch/agents/wandb
      audit ingest wandb --skip-bad runs/*/wandb
    """

    def __init__(self, skip_bad: bool = False) -> None:
        super().__init__(skip_bad)
        self.record_class = protobufs()

    def units(self, paths: list[Path]) -> list[Path]:
        return find_run_folders(paths)

    def parse(self, unit: Path) -> ParsedUnit:
        folder = unit.resolve()
        logs = sorted(folder.glob("run-*.wandb"))
        if logs and self.record_class is not None:
            run = self._from_log(folder, logs[0])
        else:
            run = self._from_files(folder, logs[0] if logs else None)
        warnings = (
            [f"{logs[0]}: {run.tags['audit.log_tail']}"] if "audit.log_tail" in run.tags else []
        )
        return ParsedUnit(run, rows_read=run.records, warnings=warnings)

    def finish(self, con, summary) -> None:
        super().finish(con, summary)
        if self.record_class is None:
            summary.warnings.insert(
                0,
                "wandb is not installed: read files/ only (config, summary, metadata); "
                "install 'audit-waste[wandb]' to read the .wandb logs (history, system "
                "metrics, exit status)",
            )

    # -- from the log
    def _from_log(self, folder: Path, log: Path) -> ParsedRun:
        stat = log.stat()
        signature = f"log:{stat.st_size}:{stat.st_mtime_ns}"
        run_id = _run_id_of(folder)
        cursor = self.cursors.get(str(log))
        stored = RunState.from_json(cursor["state"]) if cursor else None
        state, start, append = RunState(), len(HEADER), False
        if stored is not None:
            if self.known_signature(folder.parent, stored.run_id) == signature:
                return ParsedRun(
                    source_dir=folder.parent,
                    run_id=stored.run_id,
                    experiment=stored.project or "uncategorized",
                    signature=signature,
                    unchanged=True,
                )
            if stat.st_size >= cursor["size"] and stored.head == _head_hash(log, stored.head_bytes):
                # The same log, grown: read on from the first record not yet imported.
                state, start, append = stored, cursor["resume_offset"], True
        end = LogEnd()
        history, samples = _read_records(log, self.record_class, state, start, end)
        state.head_bytes = min(4096, end.resume_offset)
        state.head = _head_hash(log, state.head_bytes)
        _fold_metadata_file(folder, state)
        _fold_console(folder, state)
        points = history.frame()
        previous = pl.DataFrame(
            state.latest,
            schema={k: POINT_SCHEMA[k] for k in ("key", "step", "timestamp", "value")},
            orient="row",
        ).select(list(POINT_SCHEMA))
        history_keys = set(previous["key"]) | set(points["key"].unique())
        combined = pl.concat([previous, points])
        # Only each key's highest step can hold its latest value: sorting 5 M points for the
        # shared rule costs 20 s, this filter a fraction of one.
        step = pl.col("step").fill_null(-(2**62))
        latest_history = latest_from_history(
            combined.filter(step == step.max().over("key")).with_columns(run_id=pl.lit(""))
        ).select(list(POINT_SCHEMA))
        state.latest = latest_history.select("key", "step", "timestamp", "value").rows()
        end_ms = _end_ms(state)
        summary = _summary_points(state, history_keys, end_ms, log)
        params = config_params(state.config)
        job_id = slurm_job_id(state, params)
        run = ParsedRun(
            source_dir=folder.parent,
            run_id=state.run_id or run_id,
            experiment=state.project or "uncategorized",
            signature=signature,
            name=state.name or state.run_id or run_id,
            user_id=state.user or state.entity or None,
            status=_status(state, from_files=False),
            start_ms=state.start_ms,
            end_ms=end_ms,
            artifact_uri=str(folder),
            source_name=state.program or None,
            source_commit=state.commit or None,
            params=params,
            tags=_tags(state, job_id, end.tail, from_files=False),
            points=pl.concat([points, summary]),
            latest=pl.concat([latest_history, summary]),
            gpu_samples=_gpu_frame(samples, state),
            append=append,
            replaced_keys=summary["key"].to_list(),
            records=state.records,
        )
        run.cursor = {
            "path": str(log),
            "size": stat.st_size,
            "mtime": datetime.fromtimestamp(stat.st_mtime, UTC).replace(tzinfo=None),
            "resume_offset": end.resume_offset,
            "state": state.as_json(),
        }
        return run

    # -- without protobufs: files/ only
    def _from_files(self, folder: Path, log: Path | None) -> ParsedRun:
        files = folder / "files"
        run_id = _run_id_of(folder)
        if log is not None and str(log) in self.cursors:
            # Already read from its log by an audit with wandb installed: files/ holds less.
            stored = RunState.from_json(self.cursors[str(log)]["state"])
            return ParsedRun(
                source_dir=folder.parent,
                run_id=(stored.run_id if stored else "") or run_id,
                experiment=(stored.project if stored else "") or "uncategorized",
                signature="",
                unchanged=True,
            )
        parts = [
            p
            for p in (
                files / "config.yaml",
                files / "wandb-summary.json",
                files / "wandb-metadata.json",
                files / "wandb-history.jsonl",
            )
            if p.is_file()
        ]
        signature = "files:" + ":".join(
            f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in parts
        )
        if self.known_signature(folder.parent, run_id) == signature:
            return ParsedRun(
                source_dir=folder.parent,
                run_id=run_id,
                experiment="",
                signature=signature,
                unchanged=True,
            )
        state = RunState(run_id=run_id)
        config_file = files / "config.yaml"
        if os.path.lexists(config_file):
            config = bounded_yaml.load(
                read_found_text(config_file, MAX_FILES_BYTES, "a W&B config.yaml", folder),
                config_file,
                "a W&B config as YAML",
            )
            if isinstance(config, dict):
                state.config = config
        summary = _read_json(files / "wandb-summary.json", folder)
        if isinstance(summary, dict):
            state.summary = {k: json.dumps(v) for k, v in summary.items()}
            runtime = (
                summary.get("_wandb", {}).get("runtime")
                if isinstance(summary.get("_wandb"), dict)
                else summary.get("_runtime")
            )
            if isinstance(runtime, int | float):
                state.runtime_s = float(runtime)
        _fold_metadata_file(folder, state)
        _fold_console(folder, state)
        points = _history_file(files / "wandb-history.jsonl", state, folder)
        state.latest = (
            latest_from_history(points.with_columns(run_id=pl.lit("")))
            .select("key", "step", "timestamp", "value")
            .rows()
        )
        end_ms = _end_ms(state)
        summary_points = _summary_points(
            state, set(points["key"].unique()), end_ms, files / "wandb-summary.json"
        )
        params = config_params(state.config)
        return ParsedRun(
            source_dir=folder.parent,
            run_id=run_id,
            experiment=str(_config_value(state.config, "project") or "uncategorized"),
            signature=signature,
            name=run_id,
            user_id=state.user or None,
            status=_status(state, from_files=True),
            start_ms=state.start_ms,
            end_ms=end_ms,
            artifact_uri=str(folder),
            source_name=state.program or None,
            source_commit=state.commit or None,
            params=params,
            tags=_tags(state, slurm_job_id(state, params), None, from_files=True),
            points=pl.concat([points, summary_points]),
            records=len(parts),
        )


def _config_value(config: dict, key: str):
    value = config.get(key)
    return value.get("value") if isinstance(value, dict) else value


def _history_file(path: Path, state: RunState, folder: Path) -> pl.DataFrame:
    """``files/wandb-history.jsonl`` of old wandb versions, when present."""
    history = _History()
    if not os.path.lexists(path):
        return history.frame()
    for number, row in jsonl_records(path, "a W&B history file", folder):
        if not isinstance(row, dict):
            continue
        step = row.get("_step")
        if isinstance(step, int) and not isinstance(step, bool):
            numbers.step(step, f"{path}:{number}", "_step")
        ms = numbers.epoch_seconds_to_ms(row.get("_timestamp"))
        keys = [k for k in row if k not in _HIDDEN_HISTORY]
        history.add_row(
            keys,
            [json.dumps(row[k]) for k in keys],
            step if isinstance(step, int) and not isinstance(step, bool) else None,
            ms,
        )
        state.history_rows += 1
        state.see_time(ms)
    return history.frame()


def _head_hash(path: Path, length: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha1(f.read(length)).hexdigest()


def import_wandb(wh, paths: list[Path], config, skip_bad: bool = False, progress=None):
    return import_run_folders(wh, WandbSource(skip_bad), paths, config, progress)

"""TensorBoard event files (``events.out.tfevents.*``): one run per folder holding them.

Read with TensorBoard's own ``EventFileLoader`` (the ``audit-waste[tensorboard]`` extra),
which yields every event of a file in order: all scalars are imported, not the reservoir
sample TensorBoard's UI keeps. Scalars written either way (``simple_value`` by
tensorboardX and PyTorch, tensors of the ``scalars`` plugin by TF 2) -> metrics with step
and wall time; hparams written by the ``hparams`` plugin (``add_hparams``, Keras'
``hp.hparams``) -> params. A run starts at its first event and ends at its last; event
files have no end marker, so the status stays unknown (NULL).

The records are read here, not by TensorBoard's loader, which stops at a damaged record
without a word: a file cut short (a writer still running, or killed) imports what
precedes the cut with a warning naming the byte offset; a record that fails its CRC with
more records after it is exit 2 naming file and offset, or with ``--skip-bad`` the events
before it are imported with a warning. A record is at most ``MAX_EVENT_BYTES`` (checked
before it is read), and a scalar's tensor must hold one value (its shape is checked before
anything is allocated: a 70-byte event claiming 20000 × 20000 values would take 3.2 GB).
The events then pass TensorBoard's own compatibility layers, as its loader does.
"""

from __future__ import annotations

import math
import os
import re
import struct
import types
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from audit.errors import InputError, install_hint
from audit.importers import numbers
from audit.importers.files import ParsedUnit
from audit.importers.run_files import (
    POINT_SCHEMA,
    ParsedRun,
    RunFolderSource,
    import_run_folders,
)
from audit.importers.store_files import open_found_file, require_found_file
from audit.walk import walk

EVENT_FILE_MARK = "tfevents"
# PyTorch's and tensorboardX's add_hparams write into a subfolder named by the time.
_HPARAMS_SUBFOLDER = re.compile(r"^\d{9,}\.\d+$")


def find_run_folders(paths: list[Path]) -> list[Path]:
    found: dict[Path, Path] = {}
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or folder")
        if path.is_file():
            if EVENT_FILE_MARK not in path.name:
                raise InputError(f"{path}: not a TensorBoard event file (events.out.tfevents.*)")
            found.setdefault(path.parent.resolve(), path.parent)
            continue
        before = len(found)
        for root, _, files in walk(path, onerror=None):
            here = Path(root)
            if any(EVENT_FILE_MARK in name for name in files):
                if _HPARAMS_SUBFOLDER.match(here.name) and _has_events(here.parent):
                    continue  # read with its parent run
                found.setdefault(here.resolve(), here)
        if len(found) == before:
            raise InputError(f"{path}: no TensorBoard event files (events.out.tfevents.*) in it")
    return sorted(found.values())


def _has_events(folder: Path) -> bool:
    return any(p.is_file() and EVENT_FILE_MARK in p.name for p in folder.iterdir())


def _event_files(folder: Path) -> list[Path]:
    """The run's event files: its own and those of add_hparams subfolders. Whatever bears
    the name is taken, and must be a regular file: a link or a FIFO is refused, not skipped."""
    files = [p for p in folder.iterdir() if EVENT_FILE_MARK in p.name and not _real_dir(p)]
    for sub in folder.iterdir():
        if _real_dir(sub) and _HPARAMS_SUBFOLDER.match(sub.name):
            files += [p for p in sub.iterdir() if EVENT_FILE_MARK in p.name and not _real_dir(p)]
    for path in files:
        require_found_file(path)
    return sorted(files)


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _tensorboard():
    try:
        from tensorboard import data_compat, dataclass_compat
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        from tensorboard.plugins.hparams import plugin_data_pb2
        from tensorboard.util import tensor_util
    except ImportError:
        raise InputError(
            "reading TensorBoard event files needs TensorBoard's loader: "
            + install_hint("tensorboard")
        ) from None
    return types.SimpleNamespace(
        data_compat=data_compat,
        dataclass_compat=dataclass_compat,
        event_pb2=event_pb2,
        masked_crc32c=masked_crc32c,
        plugin_data_pb2=plugin_data_pb2,
        tensor_util=tensor_util,
    )


MAX_EVENT_BYTES = 64 << 20  # an event holding a large image or graph is a few MB
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def _records(path: Path, tb, warnings: list[str], skip_bad: bool) -> Iterator[tuple[int, bytes]]:
    """``(offset, data)`` of each record of an event file (TFRecord framing: the data's
    length as 8 bytes and their masked CRC-32C, the data, its masked CRC-32C)."""
    with open_found_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        while offset < size:
            header = f.read(12)
            problem = None
            if len(header) < 12:
                warnings.append(f"{path}: truncated at byte {offset} (a record header cut short)")
                return
            (length,) = _LENGTH.unpack_from(header)
            end = offset + 12 + length + 4
            if tb.masked_crc32c(header[:8]) != _CRC.unpack_from(header, 8)[0]:
                problem = "a record header fails its CRC"
            elif end > size:
                warnings.append(
                    f"{path}: truncated at byte {offset} (a record of {length:,} bytes cut short)"
                )
                return
            elif length > MAX_EVENT_BYTES:
                problem = f"a record of {length:,} bytes, more than the {MAX_EVENT_BYTES:,} an event holds"
            else:
                data = f.read(length)
                if tb.masked_crc32c(data) != _CRC.unpack(f.read(4))[0]:
                    problem = "a record fails its CRC"
                    if end == size:
                        warnings.append(f"{path}: damaged last record at byte {offset} ({problem})")
                        return
            if problem is not None:
                if skip_bad:
                    warnings.append(
                        f"{path}: byte {offset}: {problem}; imported the events before it "
                        "(--skip-bad)"
                    )
                    return
                raise InputError(
                    f"{path}: byte {offset}: {problem}, followed by more records: the event "
                    "file is damaged, not cut short (--skip-bad imports the events before it)"
                )
            yield offset, data
            offset = end


def _events(path: Path, tb, warnings: list[str], skip_bad: bool):
    """``(offset, event)`` of each event of a file, through TensorBoard's compatibility
    layers (legacy summaries as tensors, plugin metadata once per tag), as its loader
    gives them; a scalar tensor's shape is checked before anything reads it."""
    initial_metadata: dict = {}
    for offset, data in _records(path, tb, warnings, skip_bad):
        event = tb.event_pb2.Event.FromString(data)
        for value in event.summary.value:
            if value.HasField("tensor"):
                elements = math.prod(d.size for d in value.tensor.tensor_shape.dim)
                if elements > MAX_TENSOR_ELEMENTS or any(
                    d.size < 0 for d in value.tensor.tensor_shape.dim
                ):
                    shape = " × ".join(str(d.size) for d in value.tensor.tensor_shape.dim)
                    raise InputError(
                        f"{path}: byte {offset}: the tensor of {value.tag[:80]!r} claims shape "
                        f"{shape}; more than the {MAX_TENSOR_ELEMENTS:,} values audit reads "
                        "from one (refused before it is allocated)"
                    )
        event = tb.data_compat.migrate_event(event)
        for migrated in tb.dataclass_compat.migrate_event(event, initial_metadata):
            yield offset, migrated


MAX_TENSOR_ELEMENTS = 1 << 16  # scalars hold one value, histograms ~30 buckets of 3


class TensorBoardSource(RunFolderSource):
    kind = "tensorboard"
    noun = "run"
    read_what = "event"
    progress_label = "importing TensorBoard runs"
    command_help = """Import TensorBoard event files: every scalar, and hparams as params.

    PATH is a log dir, a run folder or an event file; each folder holding
    events.out.tfevents.* files is one run. Read with TensorBoard's own loader (the
    'audit-waste[tensorboard]' extra), all events, no sampling.

    \b
    Example:
      pip install -e '.[tensorboard]'     # in a checkout (docs/install.md)
      audit ingest tensorboard outputs/sft-qwen/runs
    """

    def units(self, paths: list[Path]) -> list[Path]:
        return find_run_folders(paths)

    def parse(self, unit: Path) -> ParsedUnit:
        folder = unit.resolve()
        files = _event_files(folder)
        signature = ";".join(
            f"{p.relative_to(folder)}:{p.lstat().st_size}:{p.lstat().st_mtime_ns}" for p in files
        )
        if self.known_signature(folder.parent, folder.name) == signature:
            run = ParsedRun(
                folder.parent, folder.name, folder.parent.name, signature, unchanged=True
            )
            return ParsedUnit(run, rows_read=0)
        tb = _tensorboard()
        keys, values, steps, times = [], [], [], []
        params: dict[str, str] = {}
        plugin_of: dict[str, str] = {}
        events = 0
        warnings: list[str] = []
        for path in files:
            try:
                for _offset, event in _events(path, tb, warnings, self.skip_bad):
                    events += 1
                    if not event.HasField("summary"):
                        continue
                    ms = numbers.epoch_seconds_to_ms(event.wall_time)  # inf, 1e300: unknown
                    for value in event.summary.value:
                        if value.metadata.plugin_data.plugin_name:
                            plugin_of[value.tag] = value.metadata.plugin_data.plugin_name
                        plugin = plugin_of.get(value.tag, "")
                        kind = value.WhichOneof("value")
                        if kind == "simple_value":
                            number = value.simple_value
                        elif kind == "tensor" and plugin == "scalars":
                            if math.prod(d.size for d in value.tensor.tensor_shape.dim) != 1:
                                raise InputError(
                                    f"{path}: event {events}: the scalar {value.tag[:80]!r} "
                                    "holds more than one value"
                                )
                            number = float(tb.tensor_util.make_ndarray(value.tensor).item())
                        elif plugin == "hparams":
                            params.update(_hparams(value, tb.plugin_data_pb2, path))
                            continue
                        else:
                            continue
                        keys.append(value.tag)
                        values.append(number)
                        steps.append(event.step)
                        times.append(ms)
            except InputError:
                raise
            except Exception as exc:  # a protobuf that does not parse, in any implementation
                raise InputError(
                    f"{path}: event {events + 1}: not a readable TensorBoard event "
                    f"({' '.join(str(exc).split()) or type(exc).__name__})"
                ) from None
        points = pl.DataFrame(
            {"key": keys, "value": values, "step": steps, "timestamp": times},
            schema=POINT_SCHEMA,
        )
        run = ParsedRun(
            source_dir=folder.parent,
            run_id=folder.name,
            experiment=folder.parent.name,
            signature=signature,
            name=folder.name,
            start_ms=min((t for t in times if t is not None), default=None),
            end_ms=max((t for t in times if t is not None), default=None),
            artifact_uri=str(folder),
            params=params,
            tags={"audit.status_reason": "event files have no end marker"},
            points=points,
            records=events,
        )
        return ParsedUnit(run, rows_read=events, warnings=warnings)


def _hparams(value, plugin_data_pb2, path: Path) -> dict[str, str]:
    data = plugin_data_pb2.HParamsPluginData()
    data.ParseFromString(value.metadata.plugin_data.content)
    if not data.HasField("session_start_info"):
        return {}
    out = {}
    for name, item in data.session_start_info.hparams.items():
        kind = item.WhichOneof("kind")
        if kind == "number_value":
            number = item.number_value
            out[name] = str(int(number)) if number.is_integer() else str(number)
        elif kind == "bool_value":
            out[name] = str(item.bool_value)
        elif kind == "string_value":
            out[name] = item.string_value
    return out


def import_tensorboard(wh, paths: list[Path], config, skip_bad: bool = False, progress=None):
    return import_run_folders(wh, TensorBoardSource(skip_bad), paths, config, progress)

"""TensorBoard event files (``events.out.tfevents.*``): one run per folder holding them.

Read with TensorBoard's own ``EventFileLoader`` (the ``audit-waste[tensorboard]`` extra),
which yields every event of a file in order: all scalars are imported, not the reservoir
sample TensorBoard's UI keeps. Scalars written either way (``simple_value`` by
tensorboardX and PyTorch, tensors of the ``scalars`` plugin by TF 2) -> metrics with step
and wall time; hparams written by the ``hparams`` plugin (``add_hparams``, Keras'
``hp.hparams``) -> params. A run starts at its first event and ends at its last; event
files have no end marker, so the status stays unknown (NULL). The loader stops at a
truncated or damaged record and keeps what precedes it (TensorBoard's own behaviour).
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from audit.errors import InputError
from audit.importers.files import ParsedUnit
from audit.importers.run_files import POINT_SCHEMA, ParsedRun, RunFolderSource
from audit.importers.store_files import require_found_file
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


def _loader():
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.plugins.hparams import plugin_data_pb2
        from tensorboard.util import tensor_util
    except ImportError:
        raise InputError(
            "reading TensorBoard event files needs TensorBoard's loader: "
            "pip install 'audit-waste[tensorboard]'"
        ) from None
    return EventFileLoader, plugin_data_pb2, tensor_util


class TensorBoardSource(RunFolderSource):
    kind = "tensorboard"
    noun = "runs"
    read_what = "events"

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
        loader, plugin_data_pb2, tensor_util = _loader()
        keys, values, steps, times = [], [], [], []
        params: dict[str, str] = {}
        plugin_of: dict[str, str] = {}
        events = 0
        for path in files:
            try:
                for event in loader(str(path)).Load():
                    events += 1
                    if not event.HasField("summary"):
                        continue
                    ms = int(event.wall_time * 1000)
                    for value in event.summary.value:
                        if value.metadata.plugin_data.plugin_name:
                            plugin_of[value.tag] = value.metadata.plugin_data.plugin_name
                        plugin = plugin_of.get(value.tag, "")
                        kind = value.WhichOneof("value")
                        if kind == "simple_value":
                            number = value.simple_value
                        elif kind == "tensor" and plugin == "scalars":
                            number = float(tensor_util.make_ndarray(value.tensor).item())
                        elif plugin == "hparams":
                            params.update(_hparams(value, plugin_data_pb2, path))
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
            start_ms=min(times) if times else None,
            end_ms=max(times) if times else None,
            artifact_uri=str(folder),
            params=params,
            tags={"audit.status_reason": "event files have no end marker"},
            points=points,
            records=events,
        )
        return ParsedUnit(run, rows_read=events)


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
    from audit.importers.files import import_files

    return import_files(wh, TensorBoardSource(), paths, config, skip_bad, progress)

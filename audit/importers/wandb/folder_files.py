"""What a W&B run folder's ``files/`` holds: the metadata (host, user, GPUs), the console
log's world size, the config and summary JSON and, in old versions, the history as JSON
Lines. Every file is read inside the run folder, no link followed, bounded in size."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl

from audit.importers import numbers
from audit.importers.console import world_size
from audit.importers.read import jsonl_records, parse_json
from audit.importers.store_files import read_found_text
from audit.importers.wandb.history import HIDDEN_HISTORY, History
from audit.importers.wandb.state import RunState

MAX_FILES_BYTES = 64 << 20  # a files/ JSON or YAML file (config, summary, metadata)


def fold_metadata_file(folder: Path, state: RunState) -> None:
    """``files/wandb-metadata.json`` (old versions keep host, user and GPUs only there)."""
    meta = read_json(folder / "files" / "wandb-metadata.json", folder)
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


def fold_console(folder: Path, state: RunState) -> None:
    """The world size the run's console log (``files/output.log``) states, if any."""
    log = folder / "files" / "output.log"
    if not os.path.lexists(log) or os.path.islink(log) or os.path.islink(folder / "files"):
        return
    found = world_size(log)
    if found is not None:
        state.world_size, state.world_size_said = found


def read_json(path: Path, folder: Path):
    """A JSON file of the run folder ``folder`` (no link followed on the way: a ``files/``
    linked elsewhere is refused)."""
    if not os.path.lexists(path):
        return None
    return parse_json(read_found_text(path, MAX_FILES_BYTES, "a W&B run file", folder), path)


def config_value(config: dict, key: str):
    value = config.get(key)
    return value.get("value") if isinstance(value, dict) else value


def history_file(path: Path, state: RunState, folder: Path) -> pl.DataFrame:
    """``files/wandb-history.jsonl`` of old wandb versions, when present."""
    history = History()
    if not os.path.lexists(path):
        return history.frame()
    for number, row in jsonl_records(path, "a W&B history file", folder):
        if not isinstance(row, dict):
            continue
        step = row.get("_step")
        if isinstance(step, int) and not isinstance(step, bool):
            numbers.step(step, f"{path}:{number}", "_step")
        ms = numbers.epoch_seconds_to_ms(row.get("_timestamp"))
        keys = [k for k in row if k not in HIDDEN_HISTORY]
        history.add_row(
            keys,
            [json.dumps(row[k]) for k in keys],
            step if isinstance(step, int) and not isinstance(step, bool) else None,
            ms,
        )
        state.history_rows += 1
        state.see_time(ms)
    return history.frame()

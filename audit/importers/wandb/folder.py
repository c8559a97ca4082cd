"""Finding W&B run folders under the paths given, one per run id, and a folder's run id."""

from __future__ import annotations

import os
import re
from pathlib import Path

from audit.errors import InputError
from audit.walk import walk

_RUN_FOLDER = re.compile(r"^(?:offline-)?run-(?:\d{8}_\d{6}-)?(?P<id>[A-Za-z0-9_-]+)$")


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
                f"{path}: no W&B run folder in it (folders holding run-<id>.wandb, or files/ "
                "with wandb-metadata.json)"
            )
    return _latest_per_run_id(list(found.values()))


def _is_run_folder(folder: Path, files: list[str] | None = None) -> bool:
    names = files if files is not None else [p.name for p in folder.iterdir() if p.is_file()]
    if any(n.endswith(".wandb") for n in names):
        return True
    return bool(_RUN_FOLDER.match(folder.name)) and _wandb_files(folder / "files")


def _wandb_files(files: Path) -> bool:
    """A ``files/`` that W&B wrote: it holds a ``wandb-*`` file (``wandb-metadata.json`` from
    a run's start). SwanLab's ``swanlog/run-<time>-<id>/files`` has the same shape with
    ``swanlab-metadata.json``: without this it was read as a W&B run of that id."""
    try:
        return any(entry.name.startswith("wandb-") for entry in os.scandir(files))
    except OSError:
        return False


def _latest_per_run_id(folders: list[Path]) -> list[Path]:
    """A resumed run leaves one folder per resumption, all with its id: the last one holds
    its final state (earlier folders hold only earlier parts of its history)."""
    by_run: dict[tuple[Path, str], Path] = {}
    for folder in sorted(folders, key=lambda p: p.name):
        by_run[(folder.resolve().parent, run_id_of(folder))] = folder
    return sorted(by_run.values())


def run_id_of(folder: Path) -> str:
    logs = sorted(folder.glob("run-*.wandb"))
    if logs:
        return logs[0].stem.removeprefix("run-")
    match = _RUN_FOLDER.match(folder.name)
    return match.group("id") if match else folder.name

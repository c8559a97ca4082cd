"""Checkpoint inventories: walk folders and record every checkpoint with its size.

Recognised: HF Trainer ``checkpoint-<step>/`` folders (size = all files below it;
``trainer_state.json`` gives ``global_step`` and ``best_model_checkpoint``), Lightning
``*.ckpt`` files (``step=``/``epoch=`` in the name), and loose ``*.pt``, ``*.safetensors``,
``*.bin`` files. Symlinks are never followed, so a link pointing out of a root is neither
measured nor later deleted. A folder that cannot be read is skipped and named (its
checkpoints are then not in the inventory, so never pruned); the rest is imported.
"""

from __future__ import annotations

import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from audit.errors import InputError
from audit.importers.read import parse_json
from audit.importers.store_files import read_found_file
from audit.walk import walk

CHECKPOINT_SCHEMA = {
    "root": pl.String,
    "path": pl.String,
    "kind": pl.String,
    "step": pl.Int64,
    "epoch": pl.Int64,
    "bytes": pl.Int64,
    "files": pl.Int32,
    "mtime": pl.Datetime("us"),
    "is_best": pl.Boolean,
    "best_metric": pl.Float64,
    "run_dir": pl.String,
}
# a trainer state holds the log of the whole run: megabytes for long runs, never this much
MAX_TRAINER_STATE_BYTES = 256 << 20
_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
_LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=(\d+)")
_LIGHTNING_EPOCH = re.compile(r"(?:^|[-_])epoch=(\d+)")
_LOOSE_SUFFIXES = (".pt", ".pth", ".safetensors", ".bin")


def scan_roots(roots: list[Path], skipped: list[str] | None = None) -> pl.DataFrame:
    """Every checkpoint under ``roots``; unreadable folders are appended to ``skipped``."""
    rows: list[dict] = []
    problems = skipped if skipped is not None else []
    for root in roots:
        if not root.exists():
            raise InputError(f"{root}: no such folder")
        if not root.is_dir():
            raise InputError(f"{root}: is a file; pass the folder that holds checkpoints")
        try:
            os.scandir(root).close()
        except OSError as exc:
            raise InputError(f"{root}: cannot list ({exc.strerror})") from None
        rows.extend(_scan(root.resolve(), problems))
    if not rows:
        return pl.DataFrame(schema=CHECKPOINT_SCHEMA)
    return pl.DataFrame(rows, schema=CHECKPOINT_SCHEMA)


def _scan(root: Path, skipped: list[str]) -> list[dict]:
    rows: list[dict] = []
    # per folder: (step, best paths, best metric) of its newest trainer state. Each
    # checkpoint-N/trainer_state.json names the best checkpoint as of step N: only the
    # newest one says which is best now (an older one that once named itself is not).
    newest_states: dict[str, tuple[int, set[str], float | None]] = {}
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            skipped.append(f"{folder}: cannot list ({exc.strerror}); its checkpoints are left out")
            continue
        for entry in entries:
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                match = _HF_DIR.match(entry.name)
                if match:
                    try:
                        rows.append(
                            _hf_checkpoint(
                                root, Path(entry.path), int(match.group(1)), newest_states
                            )
                        )
                    except OSError as exc:
                        where = exc.filename or entry.path
                        skipped.append(
                            f"{where}: cannot read ({exc.strerror}); checkpoint {entry.path} is left out"
                        )
                else:
                    stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                try:
                    row = _file_checkpoint(root, Path(entry.path), entry)
                except OSError as exc:
                    skipped.append(f"{entry.path}: cannot read ({exc.strerror}); it is left out")
                    continue
                if row:
                    rows.append(row)
    best_paths = {path: metric for _, paths, metric in newest_states.values() for path in paths}
    for row in rows:
        if row["path"] in best_paths:
            row["is_best"] = True
            row["best_metric"] = best_paths[row["path"]]
    return rows


def _hf_checkpoint(root: Path, path: Path, step: int, newest_states: dict) -> dict:
    total, files, newest = _folder_size(path)
    global_step = step
    state = read_trainer_state(path)
    if isinstance(state.get("global_step"), int):
        global_step = state["global_step"]
    if state:
        known = newest_states.get(str(path.parent))
        if known is None or global_step > known[0]:
            metric = state.get("best_metric")
            newest_states[str(path.parent)] = (
                global_step,
                best_candidates(state, path.parent),
                float(metric)
                if isinstance(metric, int | float) and not isinstance(metric, bool)
                else None,
            )
    return {
        "root": str(root),
        "path": str(path),
        "kind": "hf",
        "step": global_step,
        "epoch": None,
        "bytes": total,
        "files": files,
        "mtime": newest,
        "is_best": False,
        "best_metric": None,
        "run_dir": str(path.parent),
    }


def read_trainer_state(checkpoint: Path) -> dict:
    """``trainer_state.json`` of an HF checkpoint folder ({} when absent or not an object).

    An unreadable file raises OSError (the caller skips the checkpoint); a damaged one is
    an input error naming the file.
    """
    state_file = checkpoint / "trainer_state.json"
    if not state_file.is_file() or state_file.is_symlink():
        return {}
    # NaN is allowed: the trainer writes a diverged run's grad_norm as NaN
    state = parse_json(
        read_found_file(state_file, MAX_TRAINER_STATE_BYTES, "a trainer state"), state_file
    )
    return state if isinstance(state, dict) else {}


def best_candidates(state: dict, run_dir: Path) -> set[str]:
    """The paths ``best_model_checkpoint`` may name, as recorded at train time.

    It is often relative, a cluster path, or written through a symlinked folder: the
    folder of the same name next to this checkpoint always counts, and so does the real
    path of the recorded one when it exists here.
    """
    best = state.get("best_model_checkpoint")
    if not isinstance(best, str) or not best.strip("/.") or "\0" in best:
        return set()
    recorded = Path(best)
    candidates = {str(run_dir / recorded.name)}
    if recorded.is_absolute() and os.path.lexists(recorded):
        candidates.add(os.path.realpath(recorded))
    return candidates


def checkpoint_entry(entry: os.DirEntry) -> dict | None:
    """What a folder entry is as a checkpoint (path, kind, step, time in ns), without
    measuring it; None for a symlink or anything else. The same recognition as a scan."""
    if entry.is_symlink():
        return None
    info = entry.stat(follow_symlinks=False)
    if entry.is_dir(follow_symlinks=False):
        match = _HF_DIR.match(entry.name)
        if not match:
            return None
        return {
            "path": entry.path,
            "kind": "hf",
            "step": int(match.group(1)),
            "mtime": info.st_mtime_ns,
        }
    if not entry.is_file(follow_symlinks=False) or not entry.name.endswith(
        (".ckpt", *_LOOSE_SUFFIXES)
    ):
        return None
    step = _LIGHTNING_STEP.search(entry.name)
    return {
        "path": entry.path,
        "kind": "file",
        "step": int(step.group(1)) if step else None,
        "mtime": info.st_mtime_ns,
    }


def _file_checkpoint(root: Path, path: Path, entry: os.DirEntry) -> dict | None:
    name = entry.name
    if name.endswith(".ckpt"):
        kind = "lightning"
    elif name.endswith(_LOOSE_SUFFIXES):  # files inside checkpoint-N/ are never reached here
        kind = "file"
    else:
        return None
    info = entry.stat(follow_symlinks=False)
    step = _LIGHTNING_STEP.search(name)
    epoch = _LIGHTNING_EPOCH.search(name)
    return {
        "root": str(root),
        "path": str(path),
        "kind": kind,
        "step": int(step.group(1)) if step else None,
        "epoch": int(epoch.group(1)) if epoch else None,
        "bytes": info.st_size,
        "files": 1,
        "mtime": _utc(info.st_mtime),
        "is_best": False,
        "best_metric": None,
        "run_dir": str(path.parent),
    }


def _folder_size(folder: Path) -> tuple[int, int, datetime]:
    """Bytes, files and newest time below ``folder``; OSError when part of it is unreadable."""
    total = files = 0
    newest = os.lstat(folder).st_mtime

    for dirpath, _, filenames in walk(folder):
        for name in filenames:
            info = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
                files += 1
                newest = max(newest, info.st_mtime)
    return total, files, _utc(newest)


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)

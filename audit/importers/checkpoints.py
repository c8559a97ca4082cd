"""Checkpoint inventories: walk folders and record every checkpoint with its size.

Recognised: HF Trainer ``checkpoint-<step>/`` folders (size = all files below it;
``trainer_state.json`` gives ``global_step`` and ``best_model_checkpoint``), Lightning
``*.ckpt`` files (``step=``/``epoch=`` in the name), and loose ``*.pt``, ``*.safetensors``,
``*.bin`` files. Symlinks are never followed, so a link pointing out of a root is neither
measured nor later deleted.
"""

from __future__ import annotations

import json
import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from audit.errors import InputError

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
_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
_LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=(\d+)")
_LIGHTNING_EPOCH = re.compile(r"(?:^|[-_])epoch=(\d+)")
_LOOSE_SUFFIXES = (".pt", ".pth", ".safetensors", ".bin")


def scan_roots(roots: list[Path]) -> pl.DataFrame:
    rows: list[dict] = []
    for root in roots:
        if not root.exists():
            raise InputError(f"{root}: no such folder")
        if not root.is_dir():
            raise InputError(f"{root}: is a file; pass the folder that holds checkpoints")
        rows.extend(_scan(root.resolve()))
    if not rows:
        return pl.DataFrame(schema=CHECKPOINT_SCHEMA)
    return pl.DataFrame(rows, schema=CHECKPOINT_SCHEMA)


def _scan(root: Path) -> list[dict]:
    rows: list[dict] = []
    best_paths: dict[str, float | None] = {}
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise InputError(f"{folder}: cannot list ({exc.strerror})") from None
        for entry in entries:
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                match = _HF_DIR.match(entry.name)
                if match:
                    rows.append(
                        _hf_checkpoint(root, Path(entry.path), int(match.group(1)), best_paths)
                    )
                else:
                    stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                row = _file_checkpoint(root, Path(entry.path), entry)
                if row:
                    rows.append(row)
    for row in rows:
        if row["path"] in best_paths:
            row["is_best"] = True
            row["best_metric"] = best_paths[row["path"]]
    return rows


def _hf_checkpoint(root: Path, path: Path, step: int, best_paths: dict) -> dict:
    total, files, newest = _folder_size(path)
    state_file = path / "trainer_state.json"
    global_step = step
    if state_file.is_file() and not state_file.is_symlink():
        try:
            state = json.loads(state_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{state_file}: cannot read trainer state ({exc})") from None
        if isinstance(state, dict):
            if isinstance(state.get("global_step"), int):
                global_step = state["global_step"]
            best = state.get("best_model_checkpoint")
            if isinstance(best, str) and best:
                best_path = _resolve_best(best, path.parent)
                best_paths.setdefault(best_path, state.get("best_metric"))
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


def _resolve_best(best: str, run_dir: Path) -> str:
    """trainer_state.json records the best checkpoint as written at train time (often relative)."""
    candidate = Path(best)
    if not candidate.is_absolute() or not candidate.exists():
        candidate = run_dir / candidate.name
    return str(candidate)


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
    total = files = 0
    newest = os.lstat(folder).st_mtime
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in filenames:
            info = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
                files += 1
                newest = max(newest, info.st_mtime)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return total, files, _utc(newest)


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)

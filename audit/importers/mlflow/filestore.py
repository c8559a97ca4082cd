"""Reading a legacy MLflow file store (``mlruns/``) directly from disk.

Layout (as MLflow writes it): ``<root>/<experiment_id>/meta.yaml``; runs in
``<root>/<experiment_id>/<run_id>/`` with ``meta.yaml`` and one file per key under
``params/``, ``tags/`` and ``metrics/`` (keys with ``/`` become nested folders; metric lines
are ``timestamp value [step]``); dataset inputs in ``<run>/inputs/<id>/meta.yaml`` pointing
at ``<experiment>/datasets/<id>/meta.yaml``; deleted experiments under ``.trash/``;
registered models under ``models/<name>/version-<n>/meta.yaml``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from audit.errors import InputError
from audit.importers.mlflow.base import (
    GIT_COMMIT_TAG,
    MODEL_VERSION_SCHEMA,
    RUN_NAME_TAG,
    RUN_STATUS_BY_NUMBER,
    SOURCE_TYPE_BY_NUMBER,
    to_int,
)
from audit.importers.run_store import (
    DATASET_SCHEMA,
    EXPERIMENT_SCHEMA,
    METRIC_SCHEMA,
    PARAM_SCHEMA,
    RUN_SCHEMA,
    TAG_SCHEMA,
    DetailBatch,
    frame,
    stable_hash,
)

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
RUNS_PER_BATCH = 2000
_SPECIAL_EXPERIMENT_DIRS = {"datasets", "tags", "traces", "logged_models", "evaluations"}


@dataclass
class _RunDir:
    path: Path
    experiment_id: str
    meta: dict
    files: dict[str, list[tuple[str, Path]]]  # params/tags/metrics -> [(key, file)]


class FileStoreReader:
    kind = "file"

    def __init__(self, root: Path):
        self.root = root
        self.location = str(root)
        if not root.exists():
            raise InputError(f"{root}: no such MLflow file store (folder not found)")
        if not root.is_dir():
            raise InputError(f"{root}: is a file; a SQLite store is passed as sqlite:///{root}")
        self._experiment_dirs = self._find_experiment_dirs()
        if not self._experiment_dirs and not any(root.iterdir()):
            raise InputError(f"{root}: empty folder, not an MLflow file store")
        if not self._experiment_dirs:
            raise InputError(f"{root}: not an MLflow file store (no <experiment>/meta.yaml)")
        self._runs: dict[str, _RunDir] = {}

    def close(self) -> None:
        self._runs.clear()

    def _find_experiment_dirs(self) -> list[Path]:
        found = []
        for base in (self.root, self.root / ".trash"):
            if not base.is_dir():
                continue
            for entry in sorted(os.scandir(base), key=lambda e: e.name):
                if (
                    entry.is_dir(follow_symlinks=False)
                    and entry.name not in (".trash", "models")
                    and os.path.isfile(os.path.join(entry.path, "meta.yaml"))
                ):
                    found.append(Path(entry.path))
        return found

    def _yaml(self, path: Path) -> dict:
        try:
            with open(path, "rb") as fh:
                data = yaml.load(fh, Loader=_Loader)
        except OSError as exc:
            raise InputError(f"{path}: cannot read MLflow metadata ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or "invalid YAML"
            raise InputError(f"{path}{where}: cannot read MLflow metadata ({problem})") from None
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a YAML mapping of MLflow metadata")
        return data

    def experiments(self) -> pl.DataFrame:
        rows = []
        for exp_dir in self._experiment_dirs:
            meta = self._yaml(exp_dir / "meta.yaml")
            in_trash = exp_dir.parent.name == ".trash"
            rows.append(
                (
                    str(meta.get("experiment_id", exp_dir.name)),
                    meta.get("name"),
                    meta.get("artifact_location"),
                    "deleted" if in_trash else meta.get("lifecycle_stage", "active"),
                    to_int(meta.get("creation_time")),
                    to_int(meta.get("last_update_time")),
                )
            )
        return frame(rows, EXPERIMENT_SCHEMA)

    def runs(self, experiment_ids: list[str]) -> pl.DataFrame:
        rows = []
        for exp_dir in self._experiment_dirs:
            exp_meta = self._yaml(exp_dir / "meta.yaml")
            experiment_id = str(exp_meta.get("experiment_id", exp_dir.name))
            if experiment_ids and experiment_id not in experiment_ids:
                continue
            for entry in sorted(os.scandir(exp_dir), key=lambda e: e.name):
                if entry.name in _SPECIAL_EXPERIMENT_DIRS or not entry.is_dir(
                    follow_symlinks=False
                ):
                    continue
                meta_path = Path(entry.path) / "meta.yaml"
                if not meta_path.is_file():
                    continue
                run = self._read_run_dir(Path(entry.path), experiment_id, meta_path)
                self._runs[run.meta["run_id"]] = run
                rows.append(self._run_row(run))
        return frame(rows, RUN_SCHEMA)

    def _read_run_dir(self, path: Path, experiment_id: str, meta_path: Path) -> _RunDir:
        meta = self._yaml(meta_path)
        meta["run_id"] = str(meta.get("run_id") or meta.get("run_uuid") or path.name)
        files = {kind: _key_files(path / kind) for kind in ("params", "tags", "metrics")}
        return _RunDir(path=path, experiment_id=experiment_id, meta=meta, files=files)

    def _run_row(self, run: _RunDir) -> tuple:
        meta = run.meta
        tags = dict(run.files["tags"])
        status = meta.get("status")
        status = RUN_STATUS_BY_NUMBER.get(status, str(status)) if status is not None else None
        source_type = meta.get("source_type")
        source_type = SOURCE_TYPE_BY_NUMBER.get(source_type, source_type)
        commit = meta.get("source_version") or (
            _read_text(tags[GIT_COMMIT_TAG]) if GIT_COMMIT_TAG in tags else None
        )
        name = (
            meta.get("run_name")
            or meta.get("name")
            or (_read_text(tags[RUN_NAME_TAG]) if RUN_NAME_TAG in tags else None)
        )
        listing = [
            (kind, key, st.st_size, st.st_mtime_ns)
            for kind, entries in run.files.items()
            for key, file in entries
            for st in [file.stat()]
        ]
        signature = stable_hash(sorted(meta.items(), key=lambda kv: kv[0]), sorted(listing))
        return (
            meta["run_id"],
            run.experiment_id,
            name or None,
            meta.get("user_id"),
            status,
            to_int(meta.get("start_time")),
            to_int(meta.get("end_time")),
            meta.get("lifecycle_stage", "active"),
            to_int(meta.get("deleted_time")),
            meta.get("artifact_uri"),
            meta.get("source_name"),
            None if source_type is None else str(source_type),
            commit or None,
            signature,
        )

    def details(self, run_ids: list[str]) -> Iterator[DetailBatch]:
        for start in range(0, len(run_ids), RUNS_PER_BATCH):
            chunk = run_ids[start : start + RUNS_PER_BATCH]
            params, tags, metrics, datasets = [], [], [], []
            for run_id in chunk:
                run = self._runs[run_id]
                params.extend((run_id, k, _read_text(f)) for k, f in run.files["params"])
                tags.extend((run_id, k, _read_text(f)) for k, f in run.files["tags"])
                for key, file in run.files["metrics"]:
                    metrics.extend(_metric_lines(run_id, key, file))
                datasets.extend(self._dataset_inputs(run))
            yield DetailBatch(
                run_count=len(chunk),
                params=frame(params, PARAM_SCHEMA),
                tags=frame(tags, TAG_SCHEMA),
                metrics=frame(metrics, METRIC_SCHEMA),
                datasets=frame(datasets, DATASET_SCHEMA),
            )

    def _dataset_inputs(self, run: _RunDir) -> list[tuple]:
        inputs_dir = run.path / "inputs"
        if not inputs_dir.is_dir():
            return []
        out = []
        for entry in sorted(os.scandir(inputs_dir), key=lambda e: e.name):
            meta_path = Path(entry.path) / "meta.yaml"
            if not meta_path.is_file():
                continue
            link = self._yaml(meta_path)
            if link.get("source_type") != "DATASET":
                continue
            dataset_meta = run.path.parent / "datasets" / str(link.get("source_id")) / "meta.yaml"
            if not dataset_meta.is_file():
                continue
            dataset = self._yaml(dataset_meta)
            context = (link.get("tags") or {}).get("mlflow.data.context")
            out.append(
                (
                    run.meta["run_id"],
                    dataset.get("name"),
                    dataset.get("digest"),
                    dataset.get("source_type"),
                    dataset.get("source"),
                    context,
                )
            )
        return out

    def model_versions(self) -> pl.DataFrame:
        models_dir = self.root / "models"
        rows = []
        if models_dir.is_dir():
            for meta_path in sorted(models_dir.glob("*/version-*/meta.yaml")):
                meta = self._yaml(meta_path)
                rows.append(
                    (
                        meta.get("name") or meta_path.parent.parent.name,
                        str(meta.get("version") or meta_path.parent.name.split("-", 1)[-1]),
                        meta.get("run_id"),
                        meta.get("source"),
                        meta.get("status"),
                        meta.get("current_stage"),
                        to_int(meta.get("creation_timestamp")),
                    )
                )
        return frame(rows, MODEL_VERSION_SCHEMA)


def _key_files(folder: Path) -> list[tuple[str, Path]]:
    """Every key file below ``folder``; nested folders make keys with ``/``."""
    if not folder.is_dir():
        return []
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        rel = os.path.relpath(dirpath, folder)
        for name in sorted(filenames):
            key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
            out.append((key, Path(dirpath) / name))
    return out


def _read_text(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _metric_lines(run_id: str, key: str, path: Path) -> list[tuple]:
    """The file's points; a line repeated verbatim counts once, as MLflow's SQL stores keep
    one row per (key, timestamp, step, value): a re-logged point is not a second point."""
    out = []
    seen: set[tuple[str, ...]] = set()
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        point = (*parts[:2], parts[2] if len(parts) > 2 else "0")
        if point in seen:
            continue
        seen.add(point)
        try:
            timestamp = int(parts[0])
            value = float(parts[1])
            step = int(parts[2]) if len(parts) > 2 else 0
        except (IndexError, ValueError):
            raise InputError(
                f"{path}:{number}: expected 'timestamp value [step]' in an MLflow metric file, "
                f"got {line[:80]!r}"
            ) from None
        out.append((run_id, key, value, step, timestamp))
    return out

"""Reading a legacy MLflow file store (``mlruns/``) directly from disk.

Layout (as MLflow writes it): ``<root>/<experiment_id>/meta.yaml``; runs in
``<root>/<experiment_id>/<run_id>/`` with ``meta.yaml`` and one file per key under
``params/``, ``tags/`` and ``metrics/`` (keys with ``/`` become nested folders; metric lines
are ``timestamp value [step]``); dataset inputs in ``<run>/inputs/<id>/meta.yaml`` pointing
at ``<experiment>/datasets/<id>/meta.yaml``; deleted experiments under ``.trash/``;
registered models under ``models/<name>/version-<n>/meta.yaml``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from audit import bounded_yaml
from audit.errors import InputError
from audit.importers.mlflow import fields
from audit.importers.mlflow.base import (
    GIT_COMMIT_TAG,
    MODEL_VERSION_SCHEMA,
    RUN_NAME_TAG,
    RUN_STATUS_BY_NUMBER,
    SOURCE_TYPE_BY_NUMBER,
    KnownRuns,
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
from audit.importers.store_files import StoreFolder

RUNS_PER_BATCH = 2000
_SPECIAL_EXPERIMENT_DIRS = {"datasets", "tags", "traces", "logged_models", "evaluations"}
# Bounds of what one file may hold. MLflow's own limits are far lower (param values 6,000
# characters, tag values 8,000); a metric file of 256 MB holds about 8M points of one key.
MAX_META_BYTES = 1 << 20
MAX_VALUE_BYTES = 1 << 20
MAX_METRIC_BYTES = 256 << 20


@dataclass
class _KeyFile:
    key: str
    path: Path
    size: int
    mtime_ns: int


@dataclass
class _RunDir:
    path: Path
    experiment_id: str
    run_id: str
    meta: dict
    files: dict[str, list[_KeyFile]]  # params/tags/metrics


class FileStoreReader:
    kind = "file"

    def __init__(self, root: Path):
        self.root = root
        self.location = str(root)
        if not root.exists():
            raise InputError(f"{root}: no such MLflow file store (folder not found)")
        if not root.is_dir():
            raise InputError(f"{root}: is a file; a SQLite store is passed as sqlite:///{root}")
        self.store = StoreFolder(root)
        self._experiment_dirs = self._find_experiment_dirs()
        if not self._experiment_dirs and not self.store.entries(root):
            raise InputError(f"{root}: empty folder, not an MLflow file store")
        if not self._experiment_dirs:
            raise InputError(f"{root}: not an MLflow file store (no <experiment>/meta.yaml)")
        self._runs: dict[str, _RunDir] = {}

    def close(self) -> None:
        self._runs.clear()

    def _find_experiment_dirs(self) -> list[Path]:
        found = []
        trash = self.root / ".trash"
        bases = [self.root] + ([trash] if self.store.kind(trash) == "dir" else [])
        for base in bases:
            for entry in self.store.entries(base):
                if entry.name in (".trash", "models"):
                    continue
                path = base / entry.name
                if entry.kind == "dir" and self.store.kind(path / "meta.yaml") == "file":
                    found.append(path)
        return found

    def _is_folder(self, path: Path) -> bool:
        return self.store.kind(path) == "dir"

    def _has_meta(self, folder: Path) -> bool:
        return self.store.kind(folder / "meta.yaml") == "file"

    def _yaml(self, path: Path) -> dict:
        data = self.store.read(path, MAX_META_BYTES, "an MLflow meta.yaml")
        meta = bounded_yaml.load(data, path, "MLflow metadata")
        if not isinstance(meta, dict):
            raise InputError(f"{path}: expected a YAML mapping of MLflow metadata")
        return meta

    def _experiment(self, exp_dir: Path) -> tuple[str, dict, Path]:
        path = exp_dir / "meta.yaml"
        meta = self._yaml(path)
        experiment_id = fields.text(meta.get("experiment_id", exp_dir.name), path, "experiment_id")
        return experiment_id or exp_dir.name, meta, path

    def experiments(self) -> pl.DataFrame:
        rows = []
        for exp_dir in self._experiment_dirs:
            experiment_id, meta, path = self._experiment(exp_dir)
            in_trash = exp_dir.parent.name == ".trash"
            stage = fields.text(meta.get("lifecycle_stage", "active"), path, "lifecycle_stage")
            rows.append(
                (
                    experiment_id,
                    fields.text(meta.get("name"), path, "name"),
                    fields.text(meta.get("artifact_location"), path, "artifact_location"),
                    "deleted" if in_trash else stage,
                    fields.epoch_ms(meta.get("creation_time"), path, "creation_time"),
                    fields.epoch_ms(meta.get("last_update_time"), path, "last_update_time"),
                )
            )
        return frame(rows, EXPERIMENT_SCHEMA)

    def runs(self, experiment_ids: list[str], known: KnownRuns | None = None) -> pl.DataFrame:
        rows = []
        for exp_dir in self._experiment_dirs:
            experiment_id, _meta, _path = self._experiment(exp_dir)
            if experiment_ids and experiment_id not in experiment_ids:
                continue
            for entry in self.store.entries(exp_dir):
                path = exp_dir / entry.name
                if entry.name in _SPECIAL_EXPERIMENT_DIRS or entry.kind != "dir":
                    continue
                if not self._has_meta(path):
                    continue
                run = self._read_run_dir(path, experiment_id)
                rows.append(self._run_row(run))
                self._runs[run.run_id] = run
        return frame(rows, RUN_SCHEMA)

    def _read_run_dir(self, path: Path, experiment_id: str) -> _RunDir:
        meta_path = path / "meta.yaml"
        meta = self._yaml(meta_path)
        run_id = fields.text(meta.get("run_id") or meta.get("run_uuid"), meta_path, "run_id")
        files = {kind: self._key_files(path / kind) for kind in ("params", "tags", "metrics")}
        return _RunDir(path, experiment_id, run_id or path.name, meta, files)

    def _key_files(self, folder: Path) -> list[_KeyFile]:
        """Every key file below ``folder``; nested folders make keys with ``/``."""
        if not self._is_folder(folder):
            return []
        out = []
        pending = [(folder, "")]
        while pending:
            current, prefix = pending.pop()
            for entry in self.store.entries(current):
                path = current / entry.name
                if entry.kind == "dir":
                    pending.append((path, f"{prefix}{entry.name}/"))
                else:
                    out.append(_KeyFile(prefix + entry.name, path, entry.size, entry.mtime_ns))
        return sorted(out, key=lambda f: f.key)

    def _value(self, file: _KeyFile) -> str:
        return self.store.read_text(file.path, MAX_VALUE_BYTES, "an MLflow param or tag")

    def _run_row(self, run: _RunDir) -> tuple:
        meta, where = run.meta, run.path / "meta.yaml"
        tags = {f.key: f for f in run.files["tags"]}
        commit = fields.text(meta.get("source_version"), where, "source_version") or (
            self._value(tags[GIT_COMMIT_TAG]) if GIT_COMMIT_TAG in tags else None
        )
        name = (
            fields.text(meta.get("run_name"), where, "run_name")
            or fields.text(meta.get("name"), where, "name")
            or (self._value(tags[RUN_NAME_TAG]) if RUN_NAME_TAG in tags else None)
        )
        status = fields.enum(meta.get("status"), RUN_STATUS_BY_NUMBER, where, "status")
        source_type = fields.enum(
            meta.get("source_type"), SOURCE_TYPE_BY_NUMBER, where, "source_type"
        )
        row = (
            run.run_id,
            run.experiment_id,
            name or None,
            fields.text(meta.get("user_id"), where, "user_id"),
            status,
            fields.epoch_ms(meta.get("start_time"), where, "start_time"),
            fields.epoch_ms(meta.get("end_time"), where, "end_time"),
            fields.text(meta.get("lifecycle_stage", "active"), where, "lifecycle_stage"),
            fields.epoch_ms(meta.get("deleted_time"), where, "deleted_time"),
            fields.text(meta.get("artifact_uri"), where, "artifact_uri"),
            fields.text(meta.get("source_name"), where, "source_name"),
            source_type,
            commit or None,
        )
        listing = sorted(
            (kind, f.key, f.size, f.mtime_ns) for kind, files in run.files.items() for f in files
        )
        # the validated row stands for meta.yaml: every field that matters is in it
        return (*row, stable_hash(row, listing))

    def details(self, run_ids: list[str]) -> Iterator[DetailBatch]:
        for start in range(0, len(run_ids), RUNS_PER_BATCH):
            chunk = run_ids[start : start + RUNS_PER_BATCH]
            params, tags, metrics, datasets = [], [], [], []
            for run_id in chunk:
                run = self._runs[run_id]
                params.extend((run_id, f.key, self._value(f)) for f in run.files["params"])
                tags.extend((run_id, f.key, self._value(f)) for f in run.files["tags"])
                for file in run.files["metrics"]:
                    text = self.store.read_text(
                        file.path, MAX_METRIC_BYTES, "an MLflow metric file"
                    )
                    metrics.extend(_metric_lines(run_id, file.key, file.path, text))
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
        if not self._is_folder(inputs_dir):
            return []
        out = []
        for entry in self.store.entries(inputs_dir):
            if entry.kind != "dir" or not self._has_meta(inputs_dir / entry.name):
                continue
            link_path = inputs_dir / entry.name / "meta.yaml"
            link = self._yaml(link_path)
            if link.get("source_type") != "DATASET":
                continue
            dataset_id = fields.text(link.get("source_id"), link_path, "source_id")
            if not dataset_id or "/" in dataset_id or dataset_id in (".", ".."):
                raise InputError(
                    f"{link_path}: source_id {dataset_id!r} is not the id of a dataset folder"
                )
            datasets_dir = run.path.parent / "datasets"
            if not (
                self._is_folder(datasets_dir)
                and self._is_folder(datasets_dir / dataset_id)
                and self._has_meta(datasets_dir / dataset_id)
            ):
                continue
            dataset_path = datasets_dir / dataset_id / "meta.yaml"
            dataset = self._yaml(dataset_path)
            link_tags = fields.mapping(link.get("tags"), link_path, "tags")
            out.append(
                (
                    run.run_id,
                    *(
                        fields.text(dataset.get(f), dataset_path, f)
                        for f in ("name", "digest", "source_type", "source")
                    ),
                    fields.text(link_tags.get("mlflow.data.context"), link_path, "tags"),
                )
            )
        return out

    def model_versions(self) -> pl.DataFrame:
        models_dir = self.root / "models"
        rows = []
        if not self._is_folder(models_dir):
            return frame(rows, MODEL_VERSION_SCHEMA)
        for model in self.store.entries(models_dir):
            if model.kind != "dir":
                continue
            for version in self.store.entries(models_dir / model.name):
                folder = models_dir / model.name / version.name
                if not (
                    version.kind == "dir"
                    and version.name.startswith("version-")
                    and self._has_meta(folder)
                ):
                    continue
                path = folder / "meta.yaml"
                meta = self._yaml(path)
                rows.append(
                    (
                        fields.text(meta.get("name"), path, "name") or model.name,
                        fields.text(meta.get("version"), path, "version")
                        or version.name.split("-", 1)[-1],
                        fields.text(meta.get("run_id"), path, "run_id"),
                        fields.text(meta.get("source"), path, "source"),
                        fields.text(meta.get("status"), path, "status"),
                        fields.text(meta.get("current_stage"), path, "current_stage"),
                        fields.epoch_ms(meta.get("creation_timestamp"), path, "creation_timestamp"),
                    )
                )
        return frame(rows, MODEL_VERSION_SCHEMA)


def _metric_lines(run_id: str, key: str, path: Path, text: str) -> list[tuple]:
    """The file's points; a line repeated verbatim counts once, as MLflow's SQL stores keep
    one row per (key, timestamp, step, value): a re-logged point is not a second point."""
    out = []
    seen: set[tuple[str, ...]] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        where = f"{path}:{number}"
        if len(parts) not in (2, 3):
            raise InputError(
                f"{where}: expected 'timestamp value [step]' in an MLflow metric file, "
                f"got {line[:80]!r}"
            )
        try:
            timestamp = fields.epoch_ms(parts[0], where, "timestamp")
            value = fields.number(parts[1], where, "value")
            step = fields.integer(parts[2], where, "step") if len(parts) > 2 else 0
        except InputError as exc:
            raise InputError(
                f"{exc}; expected 'timestamp value [step]' in an MLflow metric file"
            ) from None
        point = (*parts[:2], parts[2] if len(parts) > 2 else "0")
        if point in seen:
            continue
        seen.add(point)
        out.append((run_id, key, value, step, timestamp))
    return out

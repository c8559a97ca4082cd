"""The W&B importer: a ``RunFolderSource`` that reads each run folder from its ``.wandb``
log when the ``wandb`` package is installed, from ``files/`` alone when it is not, and
reads a grown log on from where the last import stopped."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from audit import bounded_yaml
from audit.errors import install_hint
from audit.importers.files import ParsedUnit
from audit.importers.record_log import LogEnd
from audit.importers.run_files import (
    POINT_SCHEMA,
    ParsedRun,
    RunFolderSource,
    import_run_folders,
)
from audit.importers.run_store import latest_from_history
from audit.importers.store_files import read_found_text
from audit.importers.wandb.fold import read_records
from audit.importers.wandb.folder import find_run_folders, run_id_of
from audit.importers.wandb.folder_files import (
    MAX_FILES_BYTES,
    config_value,
    fold_console,
    fold_metadata_file,
    history_file,
    read_json,
)
from audit.importers.wandb.log import HEADER, head_hash
from audit.importers.wandb.protobufs import protobufs
from audit.importers.wandb.rows import (
    config_params,
    end_time_ms,
    gpu_frame,
    run_status,
    run_tags,
    slurm_job_id,
    summary_as_points,
)
from audit.importers.wandb.state import RunState


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
      pip install -e '.[wandb]'     # in a checkout (docs/install.md)
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
                "to read the .wandb logs (history, system metrics, exit status): "
                + install_hint("wandb"),
            )

    # -- from the log
    def _from_log(self, folder: Path, log: Path) -> ParsedRun:
        stat = log.stat()
        signature = f"log:{stat.st_size}:{stat.st_mtime_ns}"
        run_id = run_id_of(folder)
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
            if stat.st_size >= cursor["size"] and stored.head == head_hash(log, stored.head_bytes):
                # The same log, grown: read on from the first record not yet imported.
                state, start, append = stored, cursor["resume_offset"], True
        end = LogEnd()
        history, samples = read_records(log, self.record_class, state, start, end)
        state.head_bytes = min(4096, end.resume_offset)
        state.head = head_hash(log, state.head_bytes)
        fold_metadata_file(folder, state)
        fold_console(folder, state)
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
        end_ms = end_time_ms(state)
        summary = summary_as_points(state, history_keys, end_ms, log)
        params = config_params(state.config)
        job_id = slurm_job_id(state, params)
        run = ParsedRun(
            source_dir=folder.parent,
            run_id=state.run_id or run_id,
            experiment=state.project or "uncategorized",
            signature=signature,
            name=state.name or state.run_id or run_id,
            user_id=state.user or state.entity or None,
            status=run_status(state, from_files=False),
            start_ms=state.start_ms,
            end_ms=end_ms,
            artifact_uri=str(folder),
            source_name=state.program or None,
            source_commit=state.commit or None,
            params=params,
            tags=run_tags(state, job_id, end.tail, from_files=False),
            points=pl.concat([points, summary]),
            latest=pl.concat([latest_history, summary]),
            gpu_samples=gpu_frame(samples, state),
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
        run_id = run_id_of(folder)
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
        summary = read_json(files / "wandb-summary.json", folder)
        if isinstance(summary, dict):
            state.summary = {k: json.dumps(v) for k, v in summary.items()}
            runtime = (
                summary.get("_wandb", {}).get("runtime")
                if isinstance(summary.get("_wandb"), dict)
                else summary.get("_runtime")
            )
            if isinstance(runtime, int | float):
                state.runtime_s = float(runtime)
        fold_metadata_file(folder, state)
        fold_console(folder, state)
        points = history_file(files / "wandb-history.jsonl", state, folder)
        state.latest = (
            latest_from_history(points.with_columns(run_id=pl.lit("")))
            .select("key", "step", "timestamp", "value")
            .rows()
        )
        end_ms = end_time_ms(state)
        summary_points = summary_as_points(
            state, set(points["key"].unique()), end_ms, files / "wandb-summary.json"
        )
        params = config_params(state.config)
        return ParsedRun(
            source_dir=folder.parent,
            run_id=run_id,
            experiment=str(config_value(state.config, "project") or "uncategorized"),
            signature=signature,
            name=run_id,
            user_id=state.user or None,
            status=run_status(state, from_files=True),
            start_ms=state.start_ms,
            end_ms=end_ms,
            artifact_uri=str(folder),
            source_name=state.program or None,
            source_commit=state.commit or None,
            params=params,
            tags=run_tags(state, slurm_job_id(state, params), None, from_files=True),
            points=pl.concat([points, summary_points]),
            records=len(parts),
        )


def import_wandb(wh, paths: list[Path], config, skip_bad: bool = False, progress=None):
    return import_run_folders(wh, WandbSource(skip_bad), paths, config, progress)

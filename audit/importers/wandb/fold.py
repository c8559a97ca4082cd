"""Folding a W&B log's decoded records into the run's state: run info, config, exit,
environment, summary changes; history and GPU samples are collected as they come."""

from __future__ import annotations

from pathlib import Path

from audit.importers.record_log import LogEnd
from audit.importers.wandb.chunks import decoded_chunks
from audit.importers.wandb.decode import protobuf_ms, summary_updates
from audit.importers.wandb.history import History
from audit.importers.wandb.state import RunState, json_value
from audit.importers.wandb.summary_tree import SummaryTree


def read_records(path: Path, record_class, state: RunState, start: int, end: LogEnd):
    """Fold the log's records from ``start`` into ``state``; returns (history, samples)."""
    history = History()
    samples: list[tuple] = []
    summary = SummaryTree.of(state.summary)
    for chunk in decoded_chunks(path, record_class, start, end):
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


def _fold_run(run, state: RunState, path: Path, summary: SummaryTree) -> None:
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
        state.start_ms = protobuf_ms(run.start_time)
    _fold_updates(run.config, state.config, path)
    _fold_summary(run.summary, summary)
    if run.telemetry.cli_version:
        state.version = run.telemetry.cli_version


def _fold_updates(record, tree: dict, path: Path) -> None:
    for item in record.update:
        _set_path(tree, _item_path(item), json_value(item.value_json, str(path)))
    for item in record.remove:
        _remove_path(tree, _item_path(item))


def _fold_summary(record, summary: SummaryTree) -> None:
    updates: dict[str, str] = {}
    summary_updates(record, updates)
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
        state.start_ms = protobuf_ms(env.started_at)
    for index, gpu in enumerate(env.gpu_nvidia):
        state.gpus[str(index)] = {
            "name": gpu.name,
            "memory_mib": gpu.memory_total / 2**20 if gpu.memory_total else None,
            "uuid": gpu.uuid or None,
        }


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

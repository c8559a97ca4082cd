"""Runs logged to no tracker: HF Trainer, LLaMA-Factory and verl files in output folders.

- HF Trainer ``trainer_state.json``, in an output folder and in each ``checkpoint-N/``: one
  run per output folder, read from the most complete state (highest ``global_step``, then
  the longest ``log_history``). ``log_history`` -> metrics; ``max_steps``,
  ``num_train_epochs``, ``logging_steps``, ``save_steps``, ``eval_steps``,
  ``train_batch_size`` -> params; ``best_metric`` and ``best_model_checkpoint`` -> tags.
  The files hold no clock times: the run ends at the state file's modification time and
  starts ``train_runtime`` earlier when the last entry has it (else at the first saved
  state's modification time); points carry steps only.
- LLaMA-Factory ``trainer_log.jsonl`` (``current_steps``, ``total_steps``, ``loss``,
  ``lr``/``learning_rate``, ``elapsed_time``; newer ``throughput``, ``total_tokens``), with
  ``training_args.yaml`` -> params and ``*_results.json`` -> final values when present.
  Point times are the file's modification time minus the remaining elapsed time.
- verl's file logger JSONL (``{"step": N, "data": {...}}`` per line, ``elapsed_seconds``
  in newer versions): one run per file, named after it.

``training_args.bin`` is never read (unpickling it would run code). Status: FINISHED when
the last step reached the planned total (``max_steps``, ``total_steps``) or the trainer
recorded that training should stop; else KILLED with the reason in
``audit.status_reason``; unknown (NULL) for verl files, which have no end marker. The
output folder is the run's ``artifact_uri``, which links ``audit ingest checkpoints``
inventory to the run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import polars as pl

from audit import bounded_yaml
from audit.errors import InputError
from audit.importers import numbers
from audit.importers.files import ParsedUnit
from audit.importers.params import flatten_config
from audit.importers.read import MAX_LINE_VALUES, jsonl_records, parse_json
from audit.importers.run_files import POINT_SCHEMA, ParsedRun, RunFolderSource
from audit.importers.store_files import read_found_file, read_found_text
from audit.walk import walk

# trainer_state.json of a long run holds its whole log history: tens of MB
MAX_FILE_BYTES = 256 << 20
STATE_FILE = "trainer_state.json"
LF_LOG = "trainer_log.jsonl"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
STATE_PARAMS = (
    "max_steps",
    "num_train_epochs",
    "logging_steps",
    "save_steps",
    "eval_steps",
    "train_batch_size",
)
_LF_NOT_METRICS = {"current_steps", "total_steps", "percentage", "elapsed_time", "remaining_time"}
_ELAPSED = re.compile(r"^(?:(\d{1,9}) days?, )?(\d{1,12}):(\d\d):(\d\d)(?:\.\d+)?$")


def find_runs(paths: list[Path]) -> list[Path]:
    """Output folders (holding trainer_state.json, trainer_log.jsonl, or checkpoint-N/ with
    a state) and verl JSONL files under ``paths``."""
    found: dict[Path, Path] = {}
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or folder")
        before = len(found)
        if path.is_file():
            unit = _unit_of_file(path)
            if unit is None:
                raise InputError(
                    f"{path}: not a trainer_state.json, trainer_log.jsonl or verl JSONL log"
                )
            found.setdefault(unit.resolve(), unit)
            continue
        for root, _, files in walk(path, onerror=None):
            for name in files:
                unit = _unit_of_file(Path(root) / name)
                if unit is not None:
                    found.setdefault(unit.resolve(), unit)
        if len(found) == before:
            raise InputError(
                f"{path}: no trainer_state.json, trainer_log.jsonl or verl JSONL log in it"
            )
    return sorted(found.values())


def _unit_of_file(path: Path) -> Path | None:
    if path.name == STATE_FILE:
        folder = path.parent
        return folder.parent if _CHECKPOINT.match(folder.name) else folder
    if path.name == LF_LOG:
        return path.parent
    if path.suffix == ".jsonl" and _looks_like_verl(path):
        return path
    return None


def _looks_like_verl(path: Path) -> bool:
    if not path.is_file() or path.is_symlink():  # never open a FIFO or a link just to look
        return False
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
        row = parse_json(first, path, MAX_LINE_VALUES, line=1)
    except (OSError, InputError):
        return False
    return isinstance(row, dict) and "step" in row and isinstance(row.get("data"), dict)


def _mtime_ms(path: Path) -> int:
    return path.stat().st_mtime_ns // 1_000_000


def _signature(files: list[Path]) -> str:
    return ";".join(f"{p.name}:{p.lstat().st_size}:{p.lstat().st_mtime_ns}" for p in files)


def _read_json(path: Path, root: Path | None = None):
    """A JSON file of an output folder ``root`` (a ``checkpoint-N/`` linked elsewhere is
    refused, like a linked file)."""
    return parse_json(
        read_found_file(path, MAX_FILE_BYTES, "a trainer state or results file", root), path
    )


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return numbers.finite(value) if isinstance(value, int) else value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _points(rows: list[tuple[str, float, int | None, int | None]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=POINT_SCHEMA, orient="row")


class TrainerLogSource(RunFolderSource):
    kind = "trainer-logs"
    noun = "runs"
    read_what = "log entries"

    def units(self, paths: list[Path]) -> list[Path]:
        return find_runs(paths)

    def parse(self, unit: Path) -> ParsedUnit:
        unit = unit.resolve()
        if unit.is_file():
            files = [unit]
        else:
            files = [unit / LF_LOG, unit / STATE_FILE, unit / "training_args.yaml"]
            files += sorted(unit.glob("*_results.json"))
            files += sorted(unit.glob(f"checkpoint-*/{STATE_FILE}"))
            # what is there, whatever it is: a link or a FIFO is refused when read, not skipped
            files = [p for p in files if os.path.lexists(p)]
        signature = _signature(files)
        run_id = unit.stem if unit.is_file() else unit.name
        if self.known_signature(unit.parent, run_id) == signature:
            run = ParsedRun(unit.parent, run_id, unit.parent.name, signature, unchanged=True)
        elif unit.is_file():
            run = self._verl(unit, run_id, signature)
        else:
            run = self._output_folder(unit, run_id, signature)
        return ParsedUnit(run, rows_read=run.records)

    # -- HF Trainer and LLaMA-Factory output folders
    def _output_folder(self, folder: Path, run_id: str, signature: str) -> ParsedRun:
        run = ParsedRun(
            source_dir=folder.parent,
            run_id=run_id,
            experiment=folder.parent.name,
            signature=signature,
            name=run_id,
            artifact_uri=str(folder),
        )
        states = [folder / STATE_FILE, *sorted(folder.glob(f"checkpoint-*/{STATE_FILE}"))]
        states = [s for s in states if os.path.lexists(s)]
        parsed_states = [(s, _trainer_state(s, folder)) for s in states]
        if os.path.lexists(folder / LF_LOG):
            run.tags["audit.log_format"] = "llamafactory"
            points, done, reason, span = _llamafactory_log(folder / LF_LOG)
            run.points = points
            run.records = points.height
            run.end_ms = _mtime_ms(folder / LF_LOG)
            run.start_ms = run.end_ms - span if span is not None else None
        else:
            run.tags["audit.log_format"] = "hf-trainer"
            done, reason = None, None
        if parsed_states:
            path, state = max(
                parsed_states, key=lambda ps: (ps[1]["global_step"], len(ps[1]["log_history"]))
            )
            self._from_state(run, path, state, parsed_states, use_history=run.points.is_empty())
            if done is None:
                done, reason = _state_finished(state)
        args = folder / "training_args.yaml"
        if os.path.lexists(args):
            loaded = bounded_yaml.load(
                read_found_text(args, MAX_FILE_BYTES, "training_args.yaml"),
                args,
                "training arguments as YAML",
            )
            if not isinstance(loaded, dict):
                raise InputError(f"{args}: expected a mapping of training arguments")
            run.params.update(flatten_config(loaded))
        results = {}
        for path in sorted(folder.glob("*_results.json")):
            data = _read_json(path, folder)
            if not isinstance(data, dict):
                raise InputError(f"{path}:1: expected a JSON object of final metrics")
            results.update(data)
        self._final_values(run, results)
        run.status = "FINISHED" if done else "KILLED"
        if reason:
            run.tags["audit.status_reason"] = reason
        return run

    def _from_state(self, run, path: Path, state: dict, all_states, use_history: bool) -> None:
        for key in STATE_PARAMS:
            if state.get(key) is not None:
                run.params[key] = str(state[key])
        for key in ("best_metric", "best_model_checkpoint", "best_global_step"):
            if state.get(key) is not None:
                run.tags[f"hf.{key}"] = str(state[key])
        history = state["log_history"]
        if use_history:
            rows = []
            for entry in history:
                step = entry.get("step")
                for key, value in entry.items():
                    number = _number(value) if key != "step" else None
                    if number is not None and not isinstance(value, str):
                        rows.append((key, number, step, None))
            run.points = _points(rows)
            run.records = len(history)
        runtime = next(
            (
                e["train_runtime"]
                for e in reversed(history)
                if numbers.seconds_to_ms(_number(e.get("train_runtime")))  # not NaN, inf, 3e10
            ),
            None,
        )
        if run.end_ms is None:
            run.end_ms = _mtime_ms(path)
            first_saved = min(_mtime_ms(p) for p, _ in all_states)
            run.start_ms = (
                run.end_ms - numbers.seconds_to_ms(_number(runtime))
                if runtime is not None
                else first_saved
            )
            run.tags["audit.time_basis"] = (
                "end: trainer_state.json modified; start: end - train_runtime"
                if runtime is not None
                else "end: trainer_state.json modified; start: first state saved"
            )

    @staticmethod
    def _final_values(run: ParsedRun, results: dict) -> None:
        known = set(run.points["key"].unique())
        last_step = run.points["step"].max()
        rows = [
            (key, _number(value), last_step, run.end_ms)
            for key, value in results.items()
            if key not in known and _number(value) is not None and not isinstance(value, str)
        ]
        if rows:
            run.points = pl.concat([run.points, _points(rows)])

    # -- verl file logger
    def _verl(self, path: Path, run_id: str, signature: str) -> ParsedRun:
        rows = []
        entries = 0
        last_elapsed = None
        elapsed_of = []
        for number, entry in jsonl_records(path, "a verl JSON Lines log"):
            if not isinstance(entry, dict) or not isinstance(entry.get("data"), dict):
                raise InputError(f"{path}:{number}: expected {{'step': N, 'data': {{...}}}}")
            step = entry.get("step")
            numbers.step(step, f"{path}:{number}")
            elapsed = numbers.seconds_to_ms(_number(entry.get("elapsed_seconds")))
            last_elapsed = elapsed if elapsed is not None else last_elapsed
            entries += 1
            for key, value in entry["data"].items():
                value_num = _number(value)
                if value_num is not None and not isinstance(value, str):
                    rows.append((key, value_num, step, None))
                    elapsed_of.append(elapsed)
        end = _mtime_ms(path)
        points = _points(rows)
        if last_elapsed is not None:
            start = end - last_elapsed
            points = points.with_columns(
                timestamp=pl.Series(
                    [start + e if e is not None else None for e in elapsed_of],
                    dtype=pl.Int64,
                )
            )
        else:
            start = None
        return ParsedRun(
            source_dir=path.parent,
            run_id=run_id,
            experiment=path.parent.name,
            signature=signature,
            name=run_id,
            start_ms=start,
            end_ms=end,
            artifact_uri=str(path.parent),
            tags={
                "audit.log_format": "verl",
                "audit.status_reason": "verl's file log has no end marker",
            },
            points=points,
            records=entries,
        )


def _trainer_state(path: Path, folder: Path) -> dict:
    state = _read_json(path, folder)
    if not isinstance(state, dict):
        raise InputError(f"{path}:1: expected a JSON object (the HF Trainer state)")
    history = state.get("log_history", [])
    if not isinstance(history, list):
        raise InputError(f"{path}: log_history is {type(history).__name__}, expected a list")
    for index, entry in enumerate(history):
        if not isinstance(entry, dict):
            raise InputError(f"{path}: log_history[{index}] is not an object")
        step = entry.get("step")
        numbers.step(step, path, f"log_history[{index}].step")
    global_step = numbers.step(state.get("global_step", 0), path, "global_step")
    state["log_history"] = history
    state["global_step"] = global_step
    return state


def _state_finished(state: dict) -> tuple[bool, str | None]:
    max_steps = state.get("max_steps")
    step = state["global_step"]
    control = (state.get("stateful_callbacks") or {}).get("TrainerControl", {})
    stopped = isinstance(control, dict) and (control.get("args") or {}).get("should_training_stop")
    if (isinstance(max_steps, int) and max_steps > 0 and step >= max_steps) or stopped is True:
        return True, None
    return False, f"trainer state stops at step {step} of {max_steps}"


def _llamafactory_log(path: Path):
    """(points, finished, reason, elapsed ms of the whole log) of a trainer_log.jsonl."""
    entries = []
    for number, entry in jsonl_records(path, "a trainer_log.jsonl", path.parent):
        step = entry.get("current_steps") if isinstance(entry, dict) else None
        if isinstance(step, bool) or not isinstance(step, int):
            raise InputError(f"{path}:{number}: expected an object with an integer current_steps")
        numbers.step(step, f"{path}:{number}", "current_steps")
        entries.append((number, entry))
    elapsed = [_elapsed_ms(e.get("elapsed_time")) for _, e in entries]
    span = max((e for e in elapsed if e is not None), default=None)
    end = _mtime_ms(path)
    rows = []
    for (_, entry), ms in zip(entries, elapsed, strict=True):
        ts = end - span + ms if span is not None and ms is not None else None
        for key, value in entry.items():
            if key in _LF_NOT_METRICS:
                continue
            number = _number(value)
            if number is not None:
                rows.append((key, number, entry["current_steps"], ts))
    last = entries[-1][1] if entries else {}
    total = last.get("total_steps")
    done = isinstance(total, int) and last.get("current_steps", 0) >= total
    reason = (
        None if done else f"trainer_log.jsonl stops at step {last.get('current_steps')} of {total}"
    )
    return _points(rows), done, reason, span


def _elapsed_ms(text) -> int | None:
    match = _ELAPSED.match(text) if isinstance(text, str) else None
    if not match:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return numbers.seconds_to_ms((days * 24 + hours) * 3600 + minutes * 60 + seconds)


def import_trainer_logs(wh, paths: list[Path], config, skip_bad: bool = False, progress=None):
    from audit.importers.files import import_files

    return import_files(wh, TrainerLogSource(), paths, config, skip_bad, progress)

"""Runs logged to no tracker: HF Trainer, LLaMA-Factory and verl files in output folders.

- HF Trainer ``trainer_state.json``, in an output folder and in each ``checkpoint-N/``: one
  run per output folder, read from the most complete state (highest ``global_step``, then
  the longest ``log_history``). ``log_history`` -> metrics; ``max_steps``,
  ``num_train_epochs``, ``logging_steps``, ``save_steps``, ``eval_steps``,
  ``train_batch_size`` -> params; ``best_metric`` and ``best_model_checkpoint`` -> tags.
- LLaMA-Factory ``trainer_log.jsonl`` (``current_steps``, ``total_steps``, ``loss``,
  ``lr``/``learning_rate``, ``elapsed_time``; newer ``throughput``, ``total_tokens``), with
  ``training_args.yaml`` -> params and ``*_results.json`` -> final values when present.
- verl's file logger JSONL (``{"step": N, "data": {...}}`` per line, ``elapsed_seconds``
  in newer versions): one run per file, named after it.

Time. These files hold how long a run took (``train_runtime``, ``elapsed_time``,
``elapsed_seconds``) but no clock: the only clock is the files' modification times, and a
copied or downloaded folder has the copy's times. They are used only when corroborated:
at least two of the run's files (its checkpoints' states, its log) were written at
different times, later with the steps (≥ 60 s apart in all); then the log's end is its
file's time, points are placed by their elapsed time (or by step between the checkpoints'
times). Otherwise (one file, or all within seconds: a copy) the run has no start or end:
its duration goes to ``audit.run_seconds``, its points keep their steps, and
``audit.time_basis`` says why. ``--trust-file-times`` uses a lone file's time anyway.

``training_args.bin`` is never read (unpickling it would run code). Status: FINISHED when
the last step reached the planned total (``max_steps``, ``total_steps``) or the trainer
recorded that training should stop; else KILLED with the reason in
``audit.status_reason``; unknown (NULL) for verl files, which have no end marker. The
output folder is the run's ``artifact_uri``, which links ``audit ingest checkpoints``
inventory to the run.
"""

from __future__ import annotations

import itertools
import math
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
from audit.importers.run_files import (
    POINT_SCHEMA,
    Flag,
    ParsedRun,
    RunFolderSource,
    import_run_folders,
)
from audit.importers.store_files import read_found_file, read_found_text
from audit.walk import walk
from audit.warehouse.values import RUN_SECONDS_TAG, TIME_BASIS_TAG

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
# files written this far apart are not one copy (cp, rsync, unzip write within seconds)
CORROBORATING_SPREAD_MS = 60_000


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
    noun = "run"
    read_what = "log entry"
    progress_label = "importing trainer logs"
    flags = (
        Flag(
            "--trust-file-times",
            "Place runs in time by their files' modification times even when nothing "
            "corroborates them (the folders were not copied).",
        ),
    )
    command_help = """Import runs logged to no tracker: HF Trainer, LLaMA-Factory and verl files.

    PATH is a training output folder or any folder above them, or a log file. One run per
    output folder, from the most complete trainer_state.json (its own or a checkpoint-N/
    one) or LLaMA-Factory's trainer_log.jsonl with training_args.yaml and *_results.json;
    one run per verl file-logger JSONL. training_args.bin is never unpickled.

    The files hold durations but no clock: file modification times place a run only when
    two of its files were written at different times (a copied folder has the copy's
    times); otherwise its duration is kept and its points are placed by step.

    \b
    Example:
      audit ingest trainer-logs /scratch/coder/saves
      audit ingest trainer-logs outputs/grpo/metrics.jsonl
    """

    def __init__(self, skip_bad: bool = False, trust_file_times: bool = False) -> None:
        super().__init__(skip_bad)
        self.trust_file_times = trust_file_times

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
        # a run placed with --trust-file-times is another reading of the same files
        signature = _signature(files) + (";trusted-times" if self.trust_file_times else "")
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
        clock = _Clock(parsed_states, self.trust_file_times)
        if os.path.lexists(folder / LF_LOG):
            run.tags["audit.log_format"] = "llamafactory"
            points, done, reason, span, elapsed = _llamafactory_log(folder / LF_LOG)
            run.points = points
            run.records = points.height
            clock.add_file(folder / LF_LOG, int(points["step"].max() or 0) if points.height else 0)
            end = clock.end_of(folder / LF_LOG)
            if end is not None and span is not None:
                run.end_ms, run.start_ms = end, end - span
                run.points = run.points.with_columns(
                    timestamp=pl.Series([end - span + ms if ms is not None else None
                                         for ms in elapsed], dtype=pl.Int64)
                )  # fmt: skip
                run.tags[TIME_BASIS_TAG] = (
                    f"trainer_log.jsonl's elapsed_time, ending at its modification time "
                    f"({clock.why})"
                )
            else:
                clock.unplaced(run, span, "trainer_log.jsonl's elapsed_time")
        else:
            run.tags["audit.log_format"] = "hf-trainer"
            done, reason = None, None
        if parsed_states:
            path, state = max(
                parsed_states, key=lambda ps: (ps[1]["global_step"], len(ps[1]["log_history"]))
            )
            self._from_state(run, path, state, clock, use_history=run.points.is_empty())
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

    def _from_state(self, run, path: Path, state: dict, clock, use_history: bool) -> None:
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
                float(e["train_runtime"])
                for e in reversed(history)
                if _positive_finite(e.get("train_runtime"))
            ),
            None,
        )
        if TIME_BASIS_TAG in run.tags:
            return  # the LLaMA-Factory log placed the run already
        state_step = state["global_step"]
        clock.add_file(path, state_step)
        placed = clock.placement(state_step, runtime)
        if placed is None:
            clock.unplaced(
                run,
                int(runtime * 1000) if runtime is not None else None,
                "the trainer state's train_runtime",
            )
            return
        run.start_ms, run.end_ms, basis, time_of_step = placed
        run.tags[TIME_BASIS_TAG] = basis
        if time_of_step is not None and run.points.height:
            run.points = run.points.with_columns(
                timestamp=pl.Series(
                    [time_of_step(step) for step in run.points["step"].to_list()],
                    dtype=pl.Int64,
                )
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
            elapsed = _number(entry.get("elapsed_seconds"))
            last_elapsed = elapsed if elapsed is not None else last_elapsed
            entries += 1
            for key, value in entry["data"].items():
                value_num = _number(value)
                if value_num is not None and not isinstance(value, str):
                    rows.append((key, value_num, step, None))
                    elapsed_of.append(elapsed)
        points = _points(rows)
        run = ParsedRun(
            source_dir=path.parent,
            run_id=run_id,
            experiment=path.parent.name,
            signature=signature,
            name=run_id,
            artifact_uri=str(path.parent),
            tags={
                "audit.log_format": "verl",
                "audit.status_reason": "verl's file log has no end marker",
            },
            points=points,
            records=entries,
        )
        span = int(last_elapsed * 1000) if _positive_finite(last_elapsed) else None
        clock = _Clock([], self.trust_file_times)
        clock.add_file(path, 0)
        end = clock.end_of(path)
        if end is None or span is None:
            clock.unplaced(run, span, "the log's elapsed_seconds")
            return run
        run.start_ms, run.end_ms = end - span, end
        run.points = points.with_columns(
            timestamp=pl.Series(
                [
                    end - span + int(e * 1000) if _positive_finite(e) or e == 0 else None
                    for e in elapsed_of
                ],
                dtype=pl.Int64,
            )
        )
        run.tags[TIME_BASIS_TAG] = (
            f"the log's elapsed_seconds, ending at its modification time ({clock.why})"
        )
        return run


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
    rows, row_elapsed = [], []
    for (_, entry), ms in zip(entries, elapsed, strict=True):
        for key, value in entry.items():
            if key in _LF_NOT_METRICS:
                continue
            number = _number(value)
            if number is not None:
                rows.append((key, number, entry["current_steps"], None))
                row_elapsed.append(ms)
    last = entries[-1][1] if entries else {}
    total = last.get("total_steps")
    done = isinstance(total, int) and last.get("current_steps", 0) >= total
    reason = (
        None if done else f"trainer_log.jsonl stops at step {last.get('current_steps')} of {total}"
    )
    return _points(rows), done, reason, span, row_elapsed


def _elapsed_ms(text) -> int | None:
    match = _ELAPSED.match(text) if isinstance(text, str) else None
    if not match:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return numbers.seconds_to_ms((days * 24 + hours) * 3600 + minutes * 60 + seconds)


def _positive_finite(value) -> bool:
    number = _number(value)
    return number is not None and math.isfinite(number) and 0 < number < 1e9


class _Clock:
    """Whether a run's files' modification times can place it in time (module docstring),
    and where they place it."""

    def __init__(self, parsed_states: list, trust: bool):
        self.trust = trust
        # (step, modification time in ms) of each file that says how far the run had got
        self.files: dict[Path, tuple[int, int]] = {}
        for path, state in parsed_states:
            self.add_file(path, state["global_step"])
        self.why = ""

    def add_file(self, path: Path, step: int) -> None:
        self.files[path] = (step, _mtime_ms(path))

    def corroborated(self) -> bool:
        times = sorted(self.files.values())
        if self.trust and times:
            self.why = "file times trusted (--trust-file-times)"
            return True
        if len(times) < 2:
            self.why = ""
            return False
        spread = max(t for _, t in times) - min(t for _, t in times)
        in_order = all(a[1] <= b[1] for a, b in itertools.pairwise(times))
        if spread >= CORROBORATING_SPREAD_MS and in_order:
            self.why = f"{len(times)} files written over {spread / 60_000:.0f} min, in step order"
            return True
        return False

    def end_of(self, path: Path) -> int | None:
        """The modification time of ``path`` when the files can be trusted, else None."""
        return self.files[path][1] if self.corroborated() else None

    def placement(self, final_step: int, runtime_s: float | None):
        """(start, end, basis, time of a step) of an HF Trainer run from its state files,
        or None when their times cannot place it."""
        if not self.corroborated():
            return None
        end = max(t for _, t in self.files.values())
        by_step = sorted({step: t for step, t in self.files.values() if step > 0}.items())
        rate = None
        if len(by_step) >= 2 and by_step[-1][0] > by_step[0][0]:
            (s0, t0), (s1, t1) = by_step[0], by_step[-1]
            rate = (t1 - t0) / (s1 - s0)  # ms per step between the first and last save

        def time_of_step(step):
            if step is None or rate is None:
                return None
            return int(t1 + (step - s1) * rate) if step >= s1 else int(t0 + (step - s0) * rate)

        if runtime_s is not None:
            basis = f"end: the newest state's time; start: end − train_runtime ({self.why})"
            return end - int(runtime_s * 1000), end, basis, time_of_step if rate else None
        if rate is not None:
            start = int(by_step[0][1] - by_step[0][0] * rate)
            basis = (
                "start and end extrapolated from the checkpoints' save times "
                f"({rate / 1000:.2f} s per step; {self.why})"
            )
            return start, end, basis, time_of_step
        return None

    def unplaced(self, run, span_ms: int | None, what: str) -> None:
        """The run keeps no start or end; its duration, when known, is recorded."""
        times = [t for _, t in self.files.values()]
        if len(times) >= 2:
            reason = (
                f"the {len(times)} files' modification times are within "
                f"{(max(times) - min(times)) / 1000:.0f} s of each other (a copy)"
            )
        else:
            reason = "one file: its modification time alone cannot tell the run's time"
        if span_ms is not None and span_ms > 0:
            run.tags[RUN_SECONDS_TAG] = f"{span_ms / 1000:.3f}"
            duration = f"the duration from {what}"
        else:
            duration = "no duration recorded either"
        run.tags[TIME_BASIS_TAG] = (
            f"no clock time: {reason}; {duration}; points placed by step "
            "(--trust-file-times to use the file times anyway)"
        )


def import_trainer_logs(
    wh,
    paths: list[Path],
    config,
    skip_bad: bool = False,
    progress=None,
    trust_file_times: bool = False,
):
    return import_run_folders(
        wh, TrainerLogSource(skip_bad, trust_file_times), paths, config, progress
    )

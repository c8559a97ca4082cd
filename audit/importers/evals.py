"""Evaluation results files (lm-evaluation-harness 0.3 and 0.4 JSON) as evaluation runs.

One results file is one run in the run tables, plus its values in ``eval_results``:

- Identity: ``run_id`` is the first 32 hex digits of the SHA-256 of the file's bytes. A copy
  of a file (under another name, in another folder or imported through another root) is the
  same run, imported once and named in a note; an evaluation run again writes a new file and
  so is another run. A re-import of stored files reads nothing but their bytes.
- Source: each root named on the command line (a folder, or a named file's folder), kind
  ``lm-eval``; the experiment is the root folder's name.
- Run: named ``<model> on <tasks>``; FINISHED (a results file is written at the end); start
  from the file's ``date``, else from a timestamp in its name (``results_2024-06-20T15-10-33
  .123456.json``, the harness's local time of saving, read as UTC; the start is that minus
  the recorded duration), else unknown (NULL), never the file's modification time; end =
  start + ``total_evaluation_time_seconds`` when recorded. ``audit.time_basis`` says which.
- Params (``audit.importers.lm_eval``): model, model_args, model_revision, peft,
  model_source, chat_template and system_instruction (SHA-256), fewshot_as_multiturn,
  gen_kwargs, batch_size, limit, lm_eval_version, git_hash, tasks. Tags ``audit.kind`` =
  ``evaluation``, ``audit.evaluator`` = ``lm-eval``, ``audit.log_format``.
- Metrics: one point per result at step 0 and the start time, named as lm-eval's W&B logger
  names it (``hellaswag/acc_norm``, ``gsm8k/exact_match,strict-match``).

A folder is searched for ``*.json`` files. A JSON file there that is not a harness results
file (a model config, a lighteval file) is skipped with a note; a CSV there is skipped with
a note (an AlpacaEval leaderboard is one row per model, not an evaluation run). Named
directly, either is an input error. A file that is not complete JSON (cut short by a writer
that did not finish) is an input error naming the byte where the JSON breaks: nothing is
imported, or with ``--skip-bad`` the other files are and it is listed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from audit.errors import InputError
from audit.importers.files import ParsedUnit
from audit.importers.lm_eval import EVALUATOR, Evaluation, is_lm_eval, read_lm_eval
from audit.importers.read import refuse_too_many_values
from audit.importers.run_files import (
    POINT_SCHEMA,
    ParsedRun,
    RunFolderSource,
    import_run_folders,
)
from audit.importers.run_store import EPOCH_MS_MAX, EPOCH_MS_MIN
from audit.importers.source import RunBatch, RunImport, StoredSignatures
from audit.importers.store_files import read_found_file, read_named_file
from audit.importers.text import decode, sniff
from audit.redact import redact_frame
from audit.text import counted
from audit.walk import walk

# A results file with 1,267 embedded samples is 1.8 MB; a log of every sample of a large
# suite stays far below this.
MAX_FILE_BYTES = 256 << 20
RESULTS_FILE = "an lm-evaluation-harness results JSON file"
RESULT_SCHEMA = {
    "run_id": pl.String,
    "task": pl.String,
    "metric": pl.String,
    "filter": pl.String,
    "value": pl.Float64,
    "stderr": pl.Float64,
    "higher_is_better": pl.Boolean,
    "n_shot": pl.Int32,
    "task_version": pl.String,
    "task_hash": pl.String,
    "limit_n": pl.Float64,
    "samples": pl.Int64,
    "is_group": pl.Boolean,
    "gen_kwargs": pl.String,
}
RESULT_TEXTS = ("task", "metric", "filter", "task_version", "task_hash", "gen_kwargs")
# the harness's datetime.now().isoformat() with ':' replaced, in results_<time>.json
_FILE_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d(?:\.\d{1,6})?)")
_CSV_HEAD_BYTES = 4096


@dataclass
class EvalRun(ParsedRun):
    """A results file's run and its result rows (``RESULT_SCHEMA`` without run_id)."""

    results: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(
            schema={k: v for k, v in RESULT_SCHEMA.items() if k != "run_id"}
        )
    )


class EvalSource(RunFolderSource):
    kind = EVALUATOR
    noun = "evaluation run"
    unit = "file"
    read_what = "result"

    def __init__(self, skip_bad: bool = False) -> None:
        super().__init__(skip_bad)
        self.roots: dict[Path, Path] = {}  # unit -> the root it was found under
        self.named: set[Path] = set()  # units named on the command line
        self.folder_notes: list[str] = []
        self.stored_in: dict[str, str] = {}  # run_id -> source_id, before this import
        self.locations: dict[str, str] = {}
        self.written: dict[str, Path] = {}  # run_id -> the file it was read from, this import
        self.result_rows = 0
        self.results_files = 0  # files read that are evaluation results (new or not)
        self.skipped: list[str] = []  # why each other file found in a folder was skipped

    # -- finding the files
    def units(self, paths: list[Path]) -> list[Path]:
        for path in paths:
            if not path.exists():
                raise InputError(f"{path}: no such file or folder")
            if not path.is_dir():
                # the folder resolved, the name kept: a link the user named is read as named
                unit = path.absolute().parent.resolve() / path.name
                self.roots.setdefault(unit, unit.parent)
                self.named.add(unit)
                continue
            root = path.resolve()
            found = False
            tables: list[str] = []
            for folder, _, files in walk(root, onerror=None):
                for name in files:
                    unit = Path(folder) / name
                    suffix = unit.suffix.lower()
                    if suffix == ".json":
                        self.roots.setdefault(unit, root)
                        found = True
                    elif suffix == ".csv":
                        tables.append(f"{unit}: {_csv_verdict(unit)}")
            if not found:
                also = f" ({tables[0]})" if len(tables) == 1 else ""
                if len(tables) > 1:
                    also = f" ({len(tables)} CSV files, which hold no evaluation run)"
                raise InputError(f"{path}: no evaluation results file (*.json) in it{also}")
            self.folder_notes.extend(f"{table}; skipped" for table in tables)
        return list(self.roots)

    # -- reading one file
    def parse(self, unit: Path) -> ParsedUnit:
        if unit in self.named:
            raw = read_named_file(unit, MAX_FILE_BYTES, RESULTS_FILE)
        else:
            raw = read_found_file(unit, MAX_FILE_BYTES, RESULTS_FILE)
        if unit.suffix.lower() == ".csv":
            raise InputError(f"{unit}: {_csv_verdict(unit, raw[:_CSV_HEAD_BYTES])}")
        digest = hashlib.sha256(raw).hexdigest()
        root = self.roots[unit]
        run = EvalRun(source_dir=root, run_id=digest[:32], experiment=root.name, signature=digest)
        if run.run_id in self.stored_in:
            run.unchanged = True
            self.results_files += 1
            return ParsedUnit(run, rows_read=0)
        data = _load_json(unit, raw)
        if not is_lm_eval(data):
            problem = _not_results(data)
            if unit in self.named:
                raise InputError(f"{unit}: {problem}")
            self.skipped.append(f"{unit}: {problem}")
            return ParsedUnit(None, rows_read=0, notes=[f"{unit}: {problem}; skipped"])
        self.results_files += 1
        try:
            evaluation = read_lm_eval(data, unit)
        except RecursionError:
            raise InputError(f"{unit}: JSON nested too deeply to be read") from None
        _fill_run(run, unit, evaluation)  # after it: _times adds its warnings
        parsed = ParsedUnit(run, rows_read=run.results.height, warnings=evaluation.warnings)
        if evaluation.left_out:
            parsed.notes.append(
                f"{unit}: {counted(evaluation.left_out, 'value')} left out: no finite number "
                "(NaN, inf, N/A)"
            )
        if not run.results.height:
            parsed.warnings.append(f"{unit}: no numeric result in it")
        return parsed

    # -- writing
    def begin(self, con, known: StoredSignatures) -> int:
        self.stored_in = dict(
            con.execute(
                "SELECT r.run_id, min(r.source_id) FROM runs r JOIN sources s USING (source_id) "
                "WHERE s.kind = ? GROUP BY r.run_id",
                [self.kind],
            ).fetchall()
        )
        self.locations = dict(con.execute("SELECT source_id, location FROM sources").fetchall())
        return super().begin(con, known)

    def admit(self, unit: Path, run: EvalRun, batch: RunBatch) -> bool:
        """A results file's bytes are one run, imported once: a second file with the same
        bytes (in this import, or stored under another root) is named in a note."""
        first = self.written.get(run.run_id)
        stored = self.stored_in.get(run.run_id)
        if first is not None or (stored is not None and stored != self.source_id(run)):
            where = first if first is not None else self.locations.get(stored, stored)
            batch.notes = [
                *batch.notes,
                f"{unit}: the same bytes as {where} (run {run.run_id}): one run, imported once",
            ]
            batch.unchanged += 1
            return False
        self.written[run.run_id] = unit
        return super().admit(unit, run, batch)

    def own_rows(self, run: EvalRun) -> dict[str, pl.DataFrame]:
        if not run.results.height:
            return {}
        self.result_rows += run.results.height
        # the texts of a results file, redacted as every tracker's are (audit.redact)
        rows = redact_frame(run.results.with_columns(run_id=pl.lit(run.run_id)), RESULT_TEXTS)
        return {"eval_results": rows}

    def finish(self, con, summary: RunImport) -> None:
        if not self.results_files and self.skipped:
            # a folder of other JSON files (a model's config, a W&B run) is the wrong folder,
            # not an import of nothing new
            others = (
                f" (and {counted(len(self.skipped) - 1, 'other file')})"
                if len(self.skipped) > 1
                else ""
            )
            raise InputError(
                f"no evaluation results file among the files found: {self.skipped[0]}{others}"
            )
        super().finish(con, summary)
        summary.detail = "new evaluation run"
        summary.extra += f", {counted(self.result_rows, 'evaluation result')}"
        summary.notes[:0] = self.folder_notes


def import_evals(wh, paths: list[Path], config, skip_bad: bool = False, progress=None):
    return import_run_folders(wh, EvalSource(skip_bad), paths, config, progress)


def _fill_run(run: EvalRun, path: Path, evaluation: Evaluation) -> None:
    start_s, end_s, basis = _times(path, evaluation)
    start_ms = None if start_s is None else int(start_s * 1000)
    run.name = evaluation.name
    run.status = "FINISHED"
    run.start_ms = start_ms
    run.end_ms = None if end_s is None else int(end_s * 1000)
    run.source_name = str(path)
    run.params = evaluation.params
    run.tags = {
        "audit.kind": "evaluation",
        "audit.evaluator": EVALUATOR,
        "audit.log_format": f"lm-eval {evaluation.layout}",
        "audit.time_basis": basis,
    }
    rows = evaluation.results
    run.points = pl.DataFrame(
        [(r.metric_key, r.value, 0, start_ms) for r in rows],  # keys redacted by the run store
        schema=POINT_SCHEMA,
        orient="row",
    )
    run.results = pl.DataFrame(
        [
            {
                "run_id": run.run_id,
                "task": r.task,
                "metric": r.metric,
                "filter": r.filter,
                "value": r.value,
                "stderr": r.stderr,
                "higher_is_better": r.higher_is_better,
                "n_shot": r.n_shot,
                "task_version": r.task_version,
                "task_hash": r.task_hash,
                "limit_n": r.limit_n,
                "samples": r.samples,
                "is_group": r.is_group,
                "gen_kwargs": r.gen_kwargs,
            }
            for r in rows
        ],
        schema=RESULT_SCHEMA,
    ).drop("run_id")
    run.records = len(rows)


def _times(path: Path, evaluation: Evaluation) -> tuple[float | None, float | None, str]:
    """(start, end, how they were found) in Unix seconds; None where unknown."""
    duration = evaluation.duration
    if evaluation.date is not None and not _representable(evaluation.date):
        evaluation.warnings.append(
            f"{path}: date {evaluation.date} is no time between the years 1 and 9999; "
            "the start is taken from the file name or left unknown"
        )
    elif evaluation.date is not None:
        start = evaluation.date
        end = start + duration if duration is not None else None
        if not _representable(end):
            return start, None, "start: the file's date; end unknown"
        return start, end, "start: the file's date; end: start + its evaluation time"
    match = _FILE_TIME.search(path.name)
    saved = None
    if match:
        try:
            saved = datetime.strptime(
                match[1], "%Y-%m-%dT%H-%M-%S" + (".%f" if "." in match[1] else "")
            )
        except ValueError:
            saved = None
    if saved is not None:
        end = saved.replace(tzinfo=UTC).timestamp()
        start = end - duration if duration is not None else end
        if _representable(start):
            return (
                start,
                end,
                "end: the time in the file name (the writer's local time, read as UTC); "
                + (
                    "start: end - its evaluation time"
                    if duration is not None
                    else "start: the same"
                ),
            )
    return None, None, "unknown: the file records no date"


def _representable(seconds: float | None) -> bool:
    return seconds is not None and EPOCH_MS_MIN <= seconds * 1000 <= EPOCH_MS_MAX


def _load_json(path: Path, raw: bytes):
    """The JSON document of a results file, bounded in values like every JSON document
    (``audit.importers.read``). NaN and Infinity, which Python's json module writes by
    default (and so the harness), are read as numbers (and left out as results). Where the
    JSON breaks is named by byte offset."""
    encoding = sniff(path, raw[:4096], RESULTS_FILE)
    text = decode(path, raw, encoding).removeprefix("\ufeff")
    if not text.strip():
        raise InputError(f"{path}: empty file, not {RESULTS_FILE}")
    refuse_too_many_values(text, path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        offset = len(raw) - len(text[exc.pos :].encode(encoding.removesuffix("-sig")))
        if not text[exc.pos :].strip():
            raise InputError(
                f"{path}: the JSON stops at byte {offset} (line {exc.lineno}), the end of the "
                "file: it is cut short (its writer did not finish); not imported"
            ) from None
        raise InputError(
            f"{path}: not valid JSON at byte {offset} (line {exc.lineno}, column {exc.colno}): "
            f"{exc.msg}"
        ) from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply to be read") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InputError(f"{path}: not readable JSON ({exc})") from None


def _not_results(data: object) -> str:
    if isinstance(data, dict) and "config_general" in data and "results" in data:
        return "a lighteval results file; audit reads lm-evaluation-harness results only"
    if isinstance(data, dict) and "results" not in data:
        return f"no 'results' object, so not {RESULTS_FILE}"
    if isinstance(data, dict):
        return f"'results' without 'versions' or 'config', so not {RESULTS_FILE}"
    kind = "a list" if isinstance(data, list) else "not an object"
    return f"the JSON is {kind}, so not {RESULTS_FILE}"


def _csv_verdict(path: Path, head: bytes | None = None) -> str:
    """Why a CSV file gives no run. An AlpacaEval leaderboard (win rates of many models
    against one reference) holds no run of a team's own: one row per model, no settings."""
    if head is None:
        head = _head(path)
    first = head.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    columns = {c.strip() for c in first.split(",")}
    if {"win_rate", "length_controlled_winrate"} <= columns or {"win_rate", "n_wins"} <= columns:
        return (
            "an AlpacaEval leaderboard CSV (one row per model, no run settings), not an "
            "evaluation run"
        )
    return f"a CSV file, not {RESULTS_FILE}"


def _head(path: Path) -> bytes:
    """The first bytes of a file found in a folder: never through a link, never blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, _CSV_HEAD_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return b""
    finally:
        os.close(fd)

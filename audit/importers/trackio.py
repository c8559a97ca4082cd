"""Hugging Face trackio's local store: one SQLite database per project, read-only.

trackio (``report_to="trackio"`` in TRL and transformers) writes
``$TRACKIO_DIR/<project>.db`` (default ``~/.cache/huggingface/trackio/``), with the tables
(trackio's ``sqlite_storage.py``) ``configs`` (one row per run: ``run_id``, ``run_name``,
``config`` as JSON with trackio's own ``_Username``, ``_Created``, ``_Group``),
``metrics`` (a row per ``log`` call: ``run_id``, ``run_name``, ``step``, ``timestamp``,
``metrics`` as JSON) and ``system_metrics`` (``gpu/N/utilization`` in %,
``gpu/N/allocated_memory`` and ``total_memory`` in GiB, ``gpu/N/power`` in W, ...).
Stores written before trackio kept run ids have ``run_name`` only: the run is then
``<project>/<run name>``. JSON values ``"NaN"``, ``"Infinity"`` are the floats trackio
wrote them for.

Mapping: the database's name (the project) -> experiment; run name, user; start = the
config's ``_Created``, else the first logged time; end = the last logged time; status
unknown (trackio records none: tag ``audit.status_reason``); config (``_`` keys left out,
nested keys joined with '.') -> params, ``_Group`` -> tag ``trackio.group``; numeric logged
values -> metrics; GPU system metrics -> GPU samples of the run (trackio records no host
name: host ``unknown``, origin ``trackio``).

The user's store is never modified: a database is opened read-only (``read_only``) and read
in one read transaction (a consistent view while a run is still writing). A file that is not an
SQLite database, a damaged one or one locked by a writer is an ``InputError`` naming it;
a database without trackio's ``metrics`` table is skipped with a note. Incremental: a run
whose row counts and last row ids are as the last import saw them is not read again.
"""

from __future__ import annotations

import math
import sqlite3
import urllib.parse
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from audit.errors import InputError
from audit.importers import numbers
from audit.importers.files import ParsedUnit
from audit.importers.params import flatten_config
from audit.importers.read import MAX_LINE_VALUES, parse_json
from audit.importers.run_files import GPU_SAMPLE_SCHEMA, POINT_SCHEMA, ParsedRun, RunFolderSource
from audit.importers.store_files import require_found_file

DB_SUFFIX = ".db"
SQLITE_MAGIC = b"SQLite format 3\0"
LOCK_WAIT_SECONDS = 5.0
_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# gpu/<index>/<field>: the readings a GPU sample holds, and the factor to this unit
_GPU_FIELDS = {
    "utilization": ("util_pct", 1.0),
    "allocated_memory": ("mem_used_mib", 1024.0),  # GiB -> MiB
    "total_memory": ("mem_total_mib", 1024.0),
    "power": ("power_w", 1.0),
}


def find_databases(paths: list[Path]) -> list[Path]:
    """Project databases in ``paths``: ``.db`` files, or the ``.db`` files of a folder
    (trackio's store keeps them at its top, media and artifacts in subfolders)."""
    found: dict[Path, Path] = {}
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or folder")
        if path.is_file():
            found.setdefault(path.resolve(), path)
            continue
        databases = sorted(p for p in path.iterdir() if p.suffix == DB_SUFFIX and p.is_file())
        if not databases:
            raise InputError(
                f"{path}: no trackio project database (<project>{DB_SUFFIX}) in it; trackio "
                "writes them to $TRACKIO_DIR, by default ~/.cache/huggingface/trackio"
            )
        for database in databases:
            found.setdefault(database.resolve(), database)
    return sorted(found.values())


@contextmanager
def read_only(path: Path) -> Iterator[sqlite3.Connection]:
    """``path`` opened without writing to its folder, inside one read transaction.

    A database with no ``-wal`` or ``-journal`` beside it has no writer and nothing to
    recover (trackio removes its write-ahead log when its last connection closes): it is
    opened ``immutable``, which creates no ``-wal``/``-shm`` file in the user's store (a
    reader's ``mode=ro`` would, owned by whoever runs audit). Otherwise a run may be
    writing: ``mode=ro`` reads through the log that is there, waits for a writer's lock up
    to ``LOCK_WAIT_SECONDS``, and never writes the database or repairs a damaged one.
    """
    require_found_file(path)
    with open(path, "rb") as f:
        if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise InputError(f"{path}: byte 0: not an SQLite database (no 'SQLite format 3')")
    live = any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-journal"))
    uri = f"file:{urllib.parse.quote(str(path))}?{'mode=ro' if live else 'immutable=1'}"
    try:
        con = sqlite3.connect(uri, uri=True, timeout=LOCK_WAIT_SECONDS)
    except sqlite3.Error as exc:
        raise InputError(f"{path}: cannot open the SQLite database ({exc})") from None
    with closing(con):
        try:
            con.execute("BEGIN")
            con.execute("SELECT count(*) FROM sqlite_master").fetchall()
            yield con
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise InputError(
                    f"{path}: the database is locked by another process (a run writing "
                    f"to it?) for more than {LOCK_WAIT_SECONDS:g} s; try again"
                ) from None
            raise InputError(f"{path}: not a readable trackio database ({exc})") from None
        except sqlite3.DatabaseError as exc:  # "database disk image is malformed"
            raise InputError(f"{path}: a damaged SQLite database ({exc})") from None


def _columns(con, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})").fetchall()}


def _decoded(value, where: str) -> dict:
    """A JSON column (trackio writes bytes through orjson, older versions text)."""
    if value is None:
        return {}
    data = parse_json(value, where, MAX_LINE_VALUES)
    return data if isinstance(data, dict) else {}


def _number(value) -> float | None:
    if isinstance(value, str):
        return _SPECIAL.get(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


class _Store:
    """One project database: which runs it holds, and each run's rows."""

    def __init__(self, con, path: Path) -> None:
        self.con, self.path = con, path
        self.project = path.stem
        self.tables = {
            name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        metric_columns = _columns(con, "metrics") if "metrics" in self.tables else set()
        # Before trackio kept run ids, a run was its name within the project.
        self.by_id = "run_id" in metric_columns
        self.key = "run_id" if self.by_id else "run_name"

    def run_id(self, key: str) -> str:
        return key if self.by_id else f"{self.project}/{key}"

    def signatures(self) -> dict[str, str]:
        """Run key -> what identifies its rows as stored: counts and last ids per table."""
        parts: dict[str, list[str]] = {}
        for table in ("configs", "metrics", "system_metrics"):
            if table not in self.tables or self.key not in _columns(self.con, table):
                continue
            for key, count, last in self.con.execute(
                f"SELECT {self.key}, count(*), max(id) FROM {table} GROUP BY 1 ORDER BY 1"
            ):
                if key is not None:
                    parts.setdefault(str(key), []).append(f"{table}:{count}:{last}")
        return {key: ";".join(items) for key, items in parts.items()}

    def rows(self, table: str, columns: str, key: str) -> list[tuple]:
        if table not in self.tables:
            return []
        return self.con.execute(
            f"SELECT id, {columns} FROM {table} WHERE {self.key} = ? ORDER BY id", [key]
        ).fetchall()


class TrackioSource(RunFolderSource):
    kind = "trackio"
    noun = "run"
    unit = "project database"
    read_what = "row"
    progress_label = "importing trackio projects"
    command_help = """Import Hugging Face trackio projects from their local SQLite store.

    PATH is a project database (<project>.db) or the folder holding them: $TRACKIO_DIR,
    by default ~/.cache/huggingface/trackio (what TRL and transformers write with
    report_to="trackio"). Read-only: the store is never modified. Config as params, logged
    values as metrics with steps and times, GPU system metrics as GPU samples of the run;
    trackio records no run status. An unchanged run is not read again.

    \b
    Example:
      audit ingest trackio ~/.cache/huggingface/trackio
      audit ingest trackio ~/.cache/huggingface/trackio/sft-qwen.db
    """

    def units(self, paths: list[Path]) -> list[Path]:
        return find_databases(paths)

    def parse(self, unit: Path) -> ParsedUnit:
        path = unit.resolve()
        with read_only(path) as con:
            try:
                store = _Store(con, path)
                if "metrics" not in store.tables:
                    note = f"{path}: no trackio metrics table (not a trackio project); skipped"
                    return ParsedUnit(None, rows_read=0, notes=[note])
                runs, rows_read = [], 0
                for key, signature in store.signatures().items():
                    run_id = store.run_id(key)
                    if self.known_signature(path.parent, run_id) == signature:
                        runs.append(
                            ParsedRun(path.parent, run_id, store.project, signature, unchanged=True)
                        )
                        continue
                    run = self._run(store, key, run_id, signature)
                    rows_read += run.records
                    runs.append(run)
            except sqlite3.DatabaseError as exc:
                raise InputError(f"{path}: not a readable trackio database ({exc})") from None
        return ParsedUnit(runs, rows_read=rows_read)

    def _run(self, store: _Store, key: str, run_id: str, signature: str) -> ParsedRun:
        where = f"{store.path}: run {key[:80]!r}"
        config: dict = {}
        records = 0
        for _id, text in store.rows("configs", "config", key):
            config = _decoded(text, f"{where}: config")
            records += 1
        keys, values, steps, times = [], [], [], []
        for row_id, step, stamp, text in store.rows("metrics", "step, timestamp, metrics", key):
            records += 1
            ms = numbers.iso_to_ms(stamp)
            step = numbers.step(step, f"{where}: metrics row {row_id}")
            for name, value in _flat_numbers(_decoded(text, f"{where}: metrics row {row_id}")):
                keys.append(name)
                values.append(value)
                steps.append(step)
                times.append(ms)
        samples, system_times = [], []
        for row_id, stamp, text in store.rows("system_metrics", "timestamp, metrics", key):
            records += 1
            ms = numbers.plausible_ms(numbers.iso_to_ms(stamp))
            system_times.append(ms)
            samples += _gpu_rows(_decoded(text, f"{where}: system_metrics row {row_id}"), ms)
        logged = [t for t in times + system_times if t is not None]
        params = flatten_config({k: v for k, v in config.items() if not str(k).startswith("_")})
        user = config.get("_Username")
        group = config.get("_Group")
        return ParsedRun(
            source_dir=store.path.parent,
            run_id=run_id,
            experiment=store.project,
            signature=signature,
            name=(_run_name(store, key) if store.by_id else None) or key,
            user_id=user if isinstance(user, str) and user else None,
            status=None,
            start_ms=numbers.iso_to_ms(config.get("_Created")) or min(logged, default=None),
            end_ms=max(logged, default=None),
            artifact_uri=str(store.path),
            params=params,
            tags={
                k: v
                for k, v in {
                    "trackio.project": store.project,
                    "trackio.group": group if isinstance(group, str) else None,
                    "audit.status_reason": "trackio records no run status",
                }.items()
                if v
            },
            points=pl.DataFrame(
                {"key": keys, "value": values, "step": steps, "timestamp": times},
                schema=POINT_SCHEMA,
            ),
            gpu_samples=pl.DataFrame(samples, schema=GPU_SAMPLE_SCHEMA).unique(
                ["host", "gpu", "ts"], keep="first", maintain_order=True
            ),
            records=records,
        )


def _run_name(store: _Store, key: str) -> str | None:
    row = store.con.execute(
        "SELECT run_name FROM metrics WHERE run_id = ? ORDER BY id DESC LIMIT 1", [key]
    ).fetchone()
    if row is None and "configs" in store.tables:
        row = store.con.execute(
            "SELECT run_name FROM configs WHERE run_id = ? LIMIT 1", [key]
        ).fetchone()
    return row[0] if row else None


def _flat_numbers(data: dict, prefix: str = "") -> Iterator[tuple[str, float]]:
    """The numbers of a logged dict, nested keys joined with '/' as trackio shows them;
    media, tables and text are not metrics."""
    for name, value in data.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            if "_type" not in value:  # trackio's media and tables are typed dicts
                yield from _flat_numbers(value, f"{key}/")
            continue
        number = _number(value)
        if number is not None:
            yield key, number


def _gpu_rows(metrics: dict, ms: int | None) -> list[dict]:
    if ms is None:
        return []
    per_gpu: dict[str, dict] = {}
    for name, value in metrics.items():
        parts = name.split("/")
        if len(parts) != 3 or parts[0] != "gpu" or parts[2] not in _GPU_FIELDS:
            continue
        column, factor = _GPU_FIELDS[parts[2]]
        number = numbers.finite(_number(value))
        if number is not None:
            per_gpu.setdefault(parts[1], {})[column] = number * factor
    ts = datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)
    return [
        {"host": "unknown", "gpu": gpu, "ts": ts, "model": None, "uuid": None, **readings}
        for gpu, readings in sorted(per_gpu.items())
    ]

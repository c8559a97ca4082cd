"""The hostile inputs of issue 40, built in a folder: shared by the corpus tests and by
``bench/hostile.py``, which measures each one's exit code, time and peak memory on two
checkouts (before and after).

A case writes its input under a folder and returns the ``audit`` arguments that read it
(after ``--db``); ``expect`` is the exit code the command must end with, ``message`` a text
its stderr must hold, and ``check`` (optional) looks at the warehouse and the output
afterwards. Cases that need a tracking server get the URL of a small local HTTP server
that answers every request as the case says (``answer``).
"""

from __future__ import annotations

import gzip
import http.server
import json
import os
import shutil
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from tests.helpers import REPO, bound_address_space, free_port

SAMPLE = REPO / "sample_logs"
WANDB_RUN = "offline-run-20261117_020000-rsn00000"
GB = 1 << 30


@dataclass
class Case:
    name: str
    build: Callable[..., list[str]]  # (folder, server URL or None) -> arguments after --db
    expect: int
    message: str = ""
    check: Callable[[Path, str], None] | None = None  # (warehouse, stdout + stderr)
    needs: tuple[str, ...] = ()  # modules the input is written with
    answer: Callable[..., tuple[int, dict, bytes]] | None = None  # (path) -> the server's reply
    second_server: bool = False  # a server the first one redirects to (it must not be asked)
    prepare: list[list[str]] = field(default_factory=list)  # commands run on the db first
    seconds: float = 60.0
    max_rss: int | None = None  # bytes of peak memory the command must stay under
    env: dict = field(default_factory=dict)
    # the corpus whose test runs it: "run folders" (tests/robustness/test_hostile_run_folders.py) or
    # "input" (tracking servers, stores and the config: tests/robustness/test_bad_input_corpus.py)
    corpus: str = "run folders"


def rows(db: Path, sql: str) -> list:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# -- W&B transaction logs ------------------------------------------------------------------
def wandb_log(records: list[bytes]) -> bytes:
    """A W&B log of FULL records (each under one 32 KiB block)."""
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for data in records:
        room = 32768 - len(out) % 32768
        if room < 7 + len(data):
            out += b"\0" * room
        crc = zlib.crc32(data, zlib.crc32(bytes([1]))) & 0xFFFFFFFF
        out += struct.pack("<IHB", crc, len(data), 1) + data
    return bytes(out)


def record(**fields) -> bytes:
    """A W&B ``Record`` with one of its record types filled in: ``run={...}``,
    ``history=[(key, json)]``, ``summary=([(key, json)], [removed keys])``,
    ``stats=(seconds, [(key, json)])``, ``exit=code``."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = pb.Record()
    if "run" in fields:
        for name, value in fields["run"].items():
            setattr(out.run, name, value)
    if "config" in fields:
        for key, value in fields["config"]:
            out.config.update.add(key=key, value_json=value)
    if "history" in fields:
        for key, value in fields["history"]:
            out.history.item.add(key=key, value_json=value)
    if "summary" in fields:
        updates, removes = fields["summary"]
        for key, value in updates:
            out.summary.update.add(key=key, value_json=value)
        for key in removes:
            out.summary.remove.add(key=key)
    if "stats" in fields:
        seconds, items = fields["stats"]
        out.stats.timestamp.seconds = seconds
        for key, value in items:
            out.stats.item.add(key=key, value_json=value)
    if "exit" in fields:
        out.exit.exit_code = fields["exit"]
    return out.SerializeToString()


def wandb_run(folder: Path, run_id: str, records: list[bytes], name: str | None = None) -> Path:
    run = folder / "wandb" / (name or f"run-20261117_020000-{run_id}")
    run.mkdir(parents=True)
    (run / f"run-{run_id}.wandb").write_bytes(
        wandb_log([record(run={"run_id": run_id, "project": "p", "host": "gpu-h01"}), *records])
    )
    return run


T0 = 1_794_787_200  # 2026-11-17 epoch seconds


def history(step: int, **values) -> bytes:
    items = [("_step", json.dumps(step)), ("_timestamp", json.dumps(T0 + step))]
    return record(history=items + [(k, json.dumps(v)) for k, v in values.items()])


# -- TensorBoard event files -----------------------------------------------------------------
def tf_records(events: list[bytes]) -> bytes:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    out = bytearray()
    for data in events:
        length = struct.pack("<Q", len(data))
        out += length + struct.pack("<I", masked_crc32c(length))
        out += data + struct.pack("<I", masked_crc32c(data))
    return bytes(out)


def tf_event(step: int, wall_time: float, tag: str = "train/loss", value: float = 1.0) -> bytes:
    from tensorboard.compat.proto import event_pb2

    event = event_pb2.Event(wall_time=wall_time, step=step)
    event.summary.value.add(tag=tag, simple_value=value)
    return event.SerializeToString()


def tf_run(folder: Path, events: list[bytes]) -> Path:
    run = folder / "logs" / "sft-a"
    run.mkdir(parents=True)
    (run / "events.out.tfevents.1794787200.gpu-h01").write_bytes(tf_records(events))
    return run


# -- trainer output folders -----------------------------------------------------------------
def trainer_run(folder: Path, state: dict | str, name: str = "sft-a") -> Path:
    run = folder / "saves" / name
    run.mkdir(parents=True)
    text = state if isinstance(state, str) else json.dumps(state)
    (run / "trainer_state.json").write_text(text)
    return run


STATE = {"global_step": 3, "max_steps": 3, "log_history": [{"step": 3, "loss": 1.0}]}


def sparse_line(path: Path, size: int, before: bytes = b"") -> None:
    """A file of ``size`` bytes holding one line (NUL bytes): on disk it takes no space."""
    with open(path, "wb") as f:
        f.write(before)
        f.truncate(size)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# -- a local server answering as a case says -------------------------------------------------
@contextmanager
def serving(answer: Callable[[str], tuple[int, dict, bytes]]) -> Iterator[tuple[str, list]]:
    """An HTTP server on 127.0.0.1 answering every request with ``answer(path)``; yields
    its URL and the list of paths it was asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            asked.append(self.path)
            status, headers, body = answer(self.path)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _reply

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def json_answer(body) -> Callable[[str], tuple[int, dict, bytes]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return lambda path: (200, {"Content-Type": "application/json"}, data)


GZIP_BOMB = gzip.compress(b'{"experiments": [' + b"[]," * 20_000_000 + b"[]]}", 9)


def gzip_bomb(path: str) -> tuple[int, dict, bytes]:
    return 200, {"Content-Type": "application/json", "Content-Encoding": "gzip"}, GZIP_BOMB


def redirect_to(target: str) -> Callable[..., tuple[int, dict, bytes]]:
    """A redirect to ``target`` (``{path}``: the path asked for; ``{other}``: the port of
    the case's second server)."""
    return lambda path, other=None: (302, {"Location": target.format(path=path, other=other)}, b"")


# -- checks ----------------------------------------------------------------------------------
def no_runs(db: Path, out: str) -> None:
    assert not db.exists() or rows(db, "SELECT count(*) FROM runs") == [(0,)], "runs written"


def times_within_years(db: Path, out: str) -> None:
    bad = rows(
        db,
        "SELECT run_id, start_time, end_time FROM runs WHERE year(start_time) NOT BETWEEN 1970 "
        "AND 2200 OR year(end_time) NOT BETWEEN 1970 AND 2200",
    )
    assert bad == [], bad
    assert rows(db, "SELECT count(*) FROM metrics WHERE year(ts) NOT BETWEEN 1970 AND 2200") == [
        (0,)
    ]


def samples_within_ranges(db: Path, out: str) -> None:
    bad = rows(
        db,
        "SELECT util_pct, mem_used_mib, power_w FROM gpu_samples WHERE NOT isfinite(util_pct) "
        "OR util_pct NOT BETWEEN 0 AND 100 OR NOT isfinite(power_w) OR power_w < 0 "
        "OR NOT isfinite(mem_used_mib) OR mem_used_mib < 0",
    )
    assert bad == [], bad
    assert rows(db, "SELECT count(*) FROM gpu_samples") == [(1,)]  # the valid one is kept


def one_row(db: Path, out: str) -> None:
    assert rows(db, "SELECT count(*) FROM runs") == [(1,)]


# -- the cases --------------------------------------------------------------------------------
def _link_files_outside(folder: Path, url=None) -> list[str]:
    run = folder / "in" / "wandb" / "run-20261117_020000-abc123"
    outside = folder / "outside" / "files"
    outside.mkdir(parents=True)
    (outside / "config.yaml").write_text("secret_from_elsewhere: {value: 1}\n")
    (outside / "wandb-summary.json").write_text('{"loss": 1.0}')
    run.mkdir(parents=True)
    (run / "files").symlink_to(outside, target_is_directory=True)
    return ["ingest", "wandb", str(folder / "in")]


def _link_log_run_files_outside(folder: Path, url=None) -> list[str]:
    run = folder / "in" / "wandb" / WANDB_RUN
    shutil.copytree(SAMPLE / "wandb" / WANDB_RUN, run)
    outside = folder / "outside-files"
    outside.mkdir()
    (outside / "wandb-metadata.json").write_text('{"host": "elsewhere", "username": "x"}')
    (run / "files").symlink_to(outside, target_is_directory=True)
    return ["ingest", "wandb", str(folder / "in")]


def _link_checkpoint_outside(folder: Path, url=None) -> list[str]:
    run = trainer_run(folder / "in", STATE)
    outside = folder / "outside" / "checkpoint-99"
    outside.mkdir(parents=True)
    (outside / "trainer_state.json").write_text(
        json.dumps({"global_step": 99, "log_history": [{"step": 99, "loss": 0.1}]})
    )
    (run / "checkpoint-99").symlink_to(outside, target_is_directory=True)
    return ["ingest", "trainer-logs", str(folder / "in")]


def _rest(folder: Path, url: str) -> list[str]:
    (folder / "audit.toml").write_text(
        "[mlflow]\nhttp_max_retries = 0\nhttp_timeout_seconds = 20\n"
    )
    return ["--config", str(folder / "audit.toml"), "ingest", "mlflow", "--tracking-uri", url]


def _tf(events: Callable[[], list[bytes]], *extra: str) -> Callable[..., list[str]]:
    def build(folder: Path, url=None) -> list[str]:
        tf_run(folder, events())
        return ["ingest", "tensorboard", *extra, str(folder / "logs")]

    return build


def _shape_bomb() -> list[bytes]:
    from tensorboard.compat.proto import event_pb2

    event = event_pb2.Event(wall_time=T0, step=1)
    value = event.summary.value.add(tag="train/loss")
    value.metadata.plugin_data.plugin_name = "scalars"
    value.tensor.dtype = 1  # DT_FLOAT
    for size in (20_000, 20_000):
        value.tensor.tensor_shape.dim.add(size=size)
    value.tensor.float_val.append(1.0)
    return [event.SerializeToString()]


def _bad_crc_mid_file() -> list[bytes]:
    return [tf_event(s, T0 + s) for s in range(10)]


def _damage_crc(folder: Path) -> None:
    path = next((folder / "logs" / "sft-a").glob("events.*"))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a record in the middle
    path.write_bytes(bytes(data))


def _tf_damaged(*extra: str) -> Callable[..., list[str]]:
    def build(folder: Path, url=None) -> list[str]:
        tf_run(folder, _bad_crc_mid_file())
        _damage_crc(folder)
        return ["ingest", "tensorboard", *extra, str(folder / "logs")]

    return build


def _imported_up_to_damage(db: Path, out: str) -> None:
    steps = rows(db, "SELECT count(*) FROM metrics")[0][0]
    assert 0 < steps < 10, steps


def _trainer(state) -> Callable[..., list[str]]:
    def build(folder: Path, url=None) -> list[str]:
        trainer_run(folder, state)
        return ["ingest", "trainer-logs", str(folder / "saves")]

    return build


def _trainer_with_checkpoint(state: dict) -> Callable[..., list[str]]:
    def build(folder: Path, url=None) -> list[str]:
        run = trainer_run(folder, state)
        (run / "checkpoint-3").mkdir()
        (run / "checkpoint-3" / "trainer_state.json").write_text(json.dumps(state))
        return ["ingest", "trainer-logs", str(folder / "saves")]

    return build


def _lf_log(lines: Callable[[Path], None]) -> Callable[..., list[str]]:
    def build(folder: Path, url=None) -> list[str]:
        run = folder / "saves" / "lf-a"
        run.mkdir(parents=True)
        lines(run / "trainer_log.jsonl")
        return ["ingest", "trainer-logs", str(folder / "saves")]

    return build


def _verl_log(lines: Callable[[Path], None]) -> Callable[..., list[str]]:
    def build(folder: Path, url=None) -> list[str]:
        (folder / "logs").mkdir()
        lines(folder / "logs" / "grpo.jsonl")
        return ["ingest", "trainer-logs", str(folder / "logs")]

    return build


VERL_FIRST = b'{"step": 1, "data": {"actor/loss": 0.5}}\n'


def _wandb_files(files: dict[str, str | Callable[[Path], None]]) -> Callable[..., list[str]]:
    """A files-only W&B run folder (no log)."""

    def build(folder: Path, url=None) -> list[str]:
        run = folder / "wandb" / "run-20261117_020000-abc123" / "files"
        run.mkdir(parents=True)
        for name, content in files.items():
            if callable(content):
                content(run / name)
            else:
                (run / name).write_text(content)
        return ["ingest", "wandb", str(folder / "wandb")]

    return build


def _wandb_records(records: Callable[[], list[bytes]]) -> Callable[..., list[str]]:
    def build(folder: Path, url=None) -> list[str]:
        wandb_run(folder, "abc123", records())
        return ["ingest", "wandb", str(folder / "wandb")]

    return build


def _gpu_stats() -> list[bytes]:
    items = {
        "inf": [("gpu.0.gpu", "Infinity")],
        "nan": [("gpu.0.gpu", "NaN")],
        "negative": [("gpu.0.powerWatts", "-5")],
        "250 %": [("gpu.0.gpu", "250")],
    }
    out = [record(stats=(T0 + i, values)) for i, values in enumerate(items.values())]
    out.append(record(stats=(T0 + 10, [("gpu.0.gpu", "55"), ("gpu.0.powerWatts", "300")])))
    return [history(1, loss=1.0), *out, record(exit=0)]


def _same_run_twice(folder: Path, url=None) -> list[str]:
    first = wandb_run(folder, "abc123", [history(1, loss=1.0), record(exit=0)])
    # a copy of the run in another folder, its log renamed: the same W&B run id inside
    copy = first.parent / "run-20261118_020000-copy1"
    copy.mkdir()
    (copy / "run-copy1.wandb").write_bytes((first / "run-abc123.wandb").read_bytes())
    return ["ingest", "wandb", str(folder / "wandb")]


def _config(text: str, *args: str) -> Callable[..., list[str]]:
    """A command run with the config ``text``; ``{mlruns}`` in the arguments is the sample
    MLflow store, ``{dead}`` the URL of a port nobody listens on."""

    def build(folder: Path, url=None) -> list[str]:
        (folder / "audit.toml").write_text(text)
        fill = {"{mlruns}": str(SAMPLE / "mlruns"), "{dead}": f"http://127.0.0.1:{free_port()}"}
        return ["--config", str(folder / "audit.toml"), *(fill.get(a, a) for a in args)]

    return build


SAMPLE_WEEK = [
    ["ingest", "mlflow", "--tracking-uri", str(SAMPLE / "mlruns")],
    ["ingest", "slurm", str(SAMPLE / "slurm" / "week47.sacct")],
    ["ingest", "gpu", *sorted(str(p) for p in (SAMPLE / "gpu").glob("*.csv"))],
]


def _mlflow_start_time(value: int) -> Callable[..., list[str]]:
    def build(folder: Path, url=None) -> list[str]:
        store = folder / "mlruns"
        shutil.copytree(SAMPLE / "mlruns", store)
        meta = next(p for p in store.glob("*/*/meta.yaml"))
        text = meta.read_text()
        lines = [
            f"start_time: {value}" if line.startswith("start_time:") else line
            for line in text.splitlines()
        ]
        meta.write_text("\n".join(lines) + "\n")
        return ["ingest", "mlflow", "--tracking-uri", str(store)]

    return build


def _no_hint(db: Path, out: str) -> None:
    assert "looks like" not in out, out


CASES: list[Case] = [
    # -- links out of a run folder
    Case(
        "W&B files/ linked outside the run folder",
        _link_files_outside,
        2,
        "symbolic link",
        no_runs,
    ),
    Case(
        "W&B log run whose files/ is linked outside",
        _link_log_run_files_outside,
        2,
        "symbolic link",
        no_runs,
        needs=("wandb",),
    ),
    Case(
        "trainer checkpoint-N/ linked outside the output folder",
        _link_checkpoint_outside,
        2,
        "symbolic link",
        no_runs,
    ),
    # -- memory: tracking server answers, tensors, one-line files
    Case(
        "tracking server: 61 KB of gzip unpacking to 60 MB of []",
        _rest,
        2,
        "refused before it fills memory",
        answer=gzip_bomb,
        corpus="input",
        max_rss=1 * GB,
    ),
    Case(
        "tracking server: JSON nested 200,000 deep",
        _rest,
        2,
        "nested deeper",
        answer=json_answer(('{"experiments": ' + nested(200_000) + "}").encode()),
        corpus="input",
    ),
    Case(
        "TensorBoard scalar tensor claiming 20000 x 20000 values",
        _tf(_shape_bomb),
        2,
        "20000 × 20000",
        no_runs,
        needs=("tensorboard",),
        max_rss=1 * GB,
    ),
    Case(
        "trainer_log.jsonl of one 1.5 GB line",
        _lf_log(lambda p: sparse_line(p, 3 * GB // 2)),
        2,
        "bytes audit reads from a trainer_log.jsonl",
        no_runs,
        max_rss=1 * GB,
    ),
    Case(
        "trainer_log.jsonl with a 20 MB line",
        _lf_log(lambda p: sparse_line(p, 20 << 20)),
        2,
        "trainer_log.jsonl:1: a line longer than 8 MiB",
        no_runs,
    ),
    Case(
        "verl JSONL whose second line is 1.5 GB",
        _verl_log(lambda p: sparse_line(p, 3 * GB // 2, VERL_FIRST)),
        2,
        "bytes audit reads from a verl JSON Lines log",
        no_runs,
        max_rss=1 * GB,
    ),
    Case(
        "verl JSONL whose second line is 20 MB",
        _verl_log(lambda p: sparse_line(p, 20 << 20, VERL_FIRST)),
        2,
        "grpo.jsonl:2: a line longer than 8 MiB",
        no_runs,
    ),
    Case(
        "wandb-history.jsonl of one 1.5 GB line",
        _wandb_files({"wandb-history.jsonl": lambda p: sparse_line(p, 3 * GB // 2)}),
        2,
        "wandb-history.jsonl",
        no_runs,
        max_rss=1 * GB,
    ),
    # -- nesting deeper than the parser goes
    Case(
        "trainer_state.json nested 100,000 deep",
        _trainer('{"global_step": 1, "log_history": ' + nested(100_000) + "}"),
        2,
        "nested deeper",
        no_runs,
    ),
    Case(
        "trainer_log.jsonl line nested 100,000 deep",
        _lf_log(lambda p: p.write_text('{"current_steps": 1, "x": ' + nested(100_000) + "}\n")),
        2,
        "nested deeper",
        no_runs,
    ),
    Case(
        "verl JSONL line nested 100,000 deep",
        _verl_log(
            lambda p: p.write_bytes(
                VERL_FIRST + b'{"step": 2, "data": {"x": ' + nested(100_000).encode() + b"}}\n"
            )
        ),
        2,
        "nested deeper",
        no_runs,
    ),
    Case(
        "wandb-history.jsonl line nested 100,000 deep",
        _wandb_files({"wandb-history.jsonl": '{"_step": 1, "x": ' + nested(100_000) + "}\n"}),
        2,
        "nested deeper",
        no_runs,
    ),
    Case(
        "W&B config value nested 10,000 deep in the log",
        _wandb_records(lambda: [record(config=[("deep", nested(10_000))]), record(exit=0)]),
        2,
        "not JSON",
        no_runs,
        needs=("wandb",),
    ),
    # -- numbers beyond what is stored or computed with
    Case(
        "W&B history _step of 1e30",
        _wandb_records(lambda: [record(history=[("_step", "1e30"), ("loss", "1.0")])]),
        2,
        "beyond the 64-bit integers",
        no_runs,
        needs=("wandb",),
    ),
    Case(
        "trainer log_history step 2**70",
        _trainer({"global_step": 1, "log_history": [{"step": 2**70, "loss": 1.0}]}),
        2,
        "beyond the 64-bit integers",
        no_runs,
    ),
    Case(
        "trainer_log.jsonl current_steps 2**70",
        _lf_log(lambda p: p.write_text(json.dumps({"current_steps": 2**70, "loss": 1.0}) + "\n")),
        2,
        "beyond the 64-bit integers",
        no_runs,
    ),
    Case(
        "TensorBoard wall time 1e300",
        _tf(lambda: [tf_event(1, 1e300), tf_event(2, T0)]),
        0,
        check=times_within_years,
        needs=("tensorboard",),
    ),
    Case(
        "TensorBoard wall time infinity",
        _tf(lambda: [tf_event(1, float("inf")), tf_event(2, T0)]),
        0,
        check=times_within_years,
        needs=("tensorboard",),
    ),
    Case(
        "trainer train_runtime NaN",
        _trainer_with_checkpoint(
            {"global_step": 3, "max_steps": 3, "log_history": [{"step": 3, "train_runtime": "NaN"}]}
        ),
        0,
        check=times_within_years,
    ),
    Case(
        "trainer train_runtime Infinity",
        _trainer(
            '{"global_step": 3, "max_steps": 3, "log_history": '
            '[{"step": 3, "loss": 1.0}, {"step": 3, "train_runtime": Infinity}]}'
        ),
        0,
        check=times_within_years,
    ),
    Case(
        "trainer train_runtime 3e10 (a start in year 1019)",
        _trainer(
            {"global_step": 3, "max_steps": 3, "log_history": [{"step": 3, "train_runtime": 3e10}]}
        ),
        0,
        check=times_within_years,
    ),
    Case(
        "verl elapsed_seconds Infinity",
        _verl_log(
            lambda p: p.write_bytes(
                VERL_FIRST + b'{"step": 2, "elapsed_seconds": Infinity, "data": {"x": 1.0}}\n'
            )
        ),
        0,
        check=times_within_years,
    ),
    Case(
        "wandb-history.jsonl _timestamp NaN",
        _wandb_files({"wandb-history.jsonl": '{"_step": 1, "_timestamp": NaN, "loss": 1.0}\n'}),
        0,
        check=times_within_years,
    ),
    Case(
        "W&B metadata start in year 5138 (files only)",
        _wandb_files(
            {
                "wandb-metadata.json": '{"startedAt": "5138-01-01T00:00:00", "host": "h"}',
                "wandb-summary.json": '{"loss": 1.0, "_runtime": 60}',
            }
        ),
        0,
        "outside the years 1970-2200",
        times_within_years,
    ),
    Case(
        "W&B GPU samples inf, NaN, -5 W and 250 %",
        _wandb_records(_gpu_stats),
        0,
        "GPU samples left out",
        samples_within_ranges,
        needs=("wandb",),
    ),
    # -- identity
    Case(
        "the same W&B run id in two folders",
        _same_run_twice,
        0,
        "holds the same run",
        one_row,
        needs=("wandb",),
    ),
    # -- damage never silent
    Case(
        "TensorBoard record with a bad CRC mid-file",
        _tf_damaged(),
        2,
        "fails its CRC, followed by more records",
        no_runs,
        needs=("tensorboard",),
    ),
    Case(
        "TensorBoard record with a bad CRC mid-file, --skip-bad",
        _tf_damaged("--skip-bad"),
        0,
        "imported the events before it",
        _imported_up_to_damage,
        needs=("tensorboard",),
    ),
    # -- config numbers and prices
    *(
        Case(
            f"config time_slack_minutes = {value}",
            _config(
                f"[links]\ntime_slack_minutes = {value}\n",
                *("ingest", "mlflow", "--tracking-uri", "{mlruns}"),
            ),
            2,
            "time_slack_minutes must be",
            corpus="input",
        )
        for value in ("nan", "1e300", "-1e18")
    ),
    Case(
        "config http_backoff_seconds = -1",
        _config(
            "[mlflow]\nhttp_backoff_seconds = -1\nhttp_max_retries = 1\n",
            *("ingest", "mlflow", "--tracking-uri", "{dead}"),
        ),
        2,
        "http_backoff_seconds must be",
        corpus="input",
    ),
    *(
        Case(
            f"config gpu_hour_usd H100 = {value}",
            _config(
                f"[prices]\ngpu_hour_usd = {{ H100 = {value} }}\n",
                "report",
                "weekly",
                "--week",
                "2026-W47",
                "--format",
                "json",
            ),
            2,
            "gpu_hour_usd.H100 must be",
            prepare=SAMPLE_WEEK,
            corpus="input",
        )
        for value in ("nan", "inf")
    ),
    Case(
        "config storage_gb_month_usd = -5",
        _config("[prices]\nstorage_gb_month_usd = -5\n", "scan"),
        2,
        "storage_gb_month_usd must be",
        prepare=SAMPLE_WEEK,
        corpus="input",
    ),
    # -- messages
    Case(
        "W&B summary value that is not JSON",
        _wandb_records(lambda: [record(summary=([("acc", "{not json")], [])), record(exit=0)]),
        2,
        "run-abc123.wandb: summary 'acc': a value is not JSON",
        no_runs,
        needs=("wandb",),
    ),
    Case(
        "MLflow start_time just past year 9999 is not called microseconds",
        _mlflow_start_time(253_402_300_800_000),
        2,
        "is not a time in epoch milliseconds",
        _no_hint,
        corpus="input",
    ),
    Case(
        "tracking server redirects to file:///etc/passwd",
        _rest,
        2,
        "redirected to a file: URL",
        answer=redirect_to("file:///etc/passwd"),
        corpus="input",
    ),
    Case(
        "tracking server redirects to another host",
        _rest,
        2,
        "redirected to another server",
        answer=redirect_to("http://localhost:{other}{path}"),
        second_server=True,
        corpus="input",
    ),
    Case(
        "a refused first import leaves no warehouse file",
        _trainer('{"global_step": "x"}'),
        2,
        "global_step is not an integer",
        lambda db, out: _no_file(db),
    ),
]


def _no_file(db: Path) -> None:
    assert not db.exists(), "a refused import left an (empty) warehouse file"


BY_NAME = {case.name: case for case in CASES}


def available(case: Case) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(module) for module in case.needs)


def environment(extra: dict | None = None) -> dict:
    env = {**os.environ, "AUDIT_LOCK_TIMEOUT": "5", **(extra or {})}
    env.pop("AUDIT_DB", None)
    env.pop("AUDIT_CONFIG", None)
    return env


# -- running a case -----------------------------------------------------------------------------


@dataclass
class Outcome:
    code: int
    seconds: float
    max_rss: int  # bytes
    out: str
    err: str
    timed_out: bool = False
    second_server_asked: list = field(default_factory=list)


# ``python -m audit`` that writes its own peak resident size (kB) to argv[1] when it exits
_PEAK_REPORTED = (
    "import atexit, sys\n"
    "peak_file = sys.argv.pop(1)\n"
    "def report():\n"
    "    status = open('/proc/self/status').read()\n"
    "    open(peak_file, 'w').write(status.split('VmHWM:')[1].split()[0])\n"
    "atexit.register(report)\n"
    "sys.argv[0] = 'audit'\n"
    "from audit.entry import main\n"
    "main()\n"
)


def run_case(case: Case, folder: Path, cwd: Path = REPO, env: dict | None = None) -> Outcome:
    """Build ``case`` in ``folder`` and run its command as its own process (from ``cwd``,
    whose ``audit`` it runs), bounded in time and address space; its peak memory is the
    process's own (``wait4``), not its parent's."""
    import subprocess
    import sys
    import time
    from contextlib import ExitStack

    env = environment(env)
    db = folder / "audit.duckdb"
    with ExitStack() as stack:
        url = other = None
        other_asked: list = []
        if case.second_server:
            other_url, other_asked = stack.enter_context(serving(json_answer({"experiments": []})))
            other = other_url.rsplit(":", 1)[1]
        if case.answer is not None:
            answer = case.answer
            if case.second_server:
                answer = lambda path: case.answer(path, other)  # noqa: E731
            url, _ = stack.enter_context(serving(answer))
        args = case.build(folder, url)
        base = [sys.executable, "-m", "audit", "--db", str(db)]
        for command in case.prepare:
            subprocess.run([*base, *command], check=True, capture_output=True, cwd=cwd, env=env)
        peak_file = folder / "peak-kb"
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", _PEAK_REPORTED, str(peak_file), "--db", str(db), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            preexec_fn=bound_address_space,
        )
        output: dict[str, bytes] = {}
        readers = [
            threading.Thread(target=lambda n=n, s=s: output.__setitem__(n, s.read()))
            for n, s in (("out", proc.stdout), ("err", proc.stderr))
        ]
        for reader in readers:
            reader.start()
        timer = threading.Timer(case.seconds, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timed_out = not timer.is_alive()
            timer.cancel()
        seconds = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        for reader in readers:
            reader.join()
        # the process's own peak (VmHWM, written at its exit); ru_maxrss only for a process
        # that did not get to write it (killed): Linux carries the forking parent's resident
        # size across fork and exec into ru_maxrss, and late in a full test run the parent
        # holds a gigabyte
        peak_kb = int(peak_file.read_text()) if peak_file.exists() else usage.ru_maxrss
        return Outcome(
            code=proc.returncode,
            seconds=seconds,
            max_rss=peak_kb * 1024,
            out=output.get("out", b"").decode("utf-8", "replace"),
            err=output.get("err", b"").decode("utf-8", "replace"),
            timed_out=timed_out,
            second_server_asked=list(other_asked),
        )


def verdict(case: Case, outcome: Outcome, db: Path) -> list[str]:
    """What is wrong with an outcome (empty: the case holds)."""
    problems = []
    if outcome.timed_out:
        problems.append(f"still running after {case.seconds:g} s")
    if outcome.code != case.expect:
        problems.append(f"exit {outcome.code}, expected {case.expect}: {outcome.err[-600:]}")
    if case.message and case.message not in outcome.err:
        problems.append(f"stderr lacks {case.message!r}: {outcome.err[-600:]}")
    if "Traceback" in outcome.err:
        problems.append("a traceback")
    if case.max_rss is not None and outcome.max_rss > case.max_rss:
        problems.append(f"peak memory {outcome.max_rss / GB:.2f} GB > {case.max_rss / GB:.2f} GB")
    if outcome.second_server_asked:
        problems.append(f"the other server was asked for {outcome.second_server_asked}")
    if case.check is not None and not problems:
        try:
            case.check(db, outcome.out + outcome.err)
        except AssertionError as exc:
            problems.append(f"check failed: {exc}")
    return problems

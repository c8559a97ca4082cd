"""Random W&B, TensorBoard and trainer-log records end in an import or the tool's own error.

Hypothesis draws records of every size, nesting depth and number range the formats allow
(steps beyond 64 bits, NaN and infinite times and values, years from 1 to far beyond 9999,
nesting deeper than the parser goes, GPU values outside their ranges, tensor shapes
claiming billions of values, summary keys removed and set again, damaged CRCs), writes them
with the real framing and imports them through the CLI. The import ends with exit 0 or 2
(never an internal error); what it stored keeps to the bounds every tracker's values keep
to. `make test` replays a fixed set of examples; `make fuzz` draws many fresh ones.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.cli import cli
from tests import hostile_cases as hc
from tests.helpers import property_examples

EXAMPLES = property_examples(replay=12, explore=300)
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
INT64 = 2**63

numbers = st.one_of(
    st.integers(-(2**80), 2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, INT64 - 1, INT64, -INT64 - 1, 1e300, -1e300, 3e10, 5e14]),
)
times = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=4e9),  # epoch seconds, 1970 to 2096
    st.sampled_from([hc.T0, 1e300, -1.0, 2.5e11, 9e12]),
)
keys = st.text(st.sampled_from(list("ab.c_/@é")), min_size=1, max_size=8)


def nested_value(depth: int, leaf) -> str:
    return "[" * depth + json.dumps(leaf) + "]" * depth


values = st.builds(nested_value, st.one_of(st.just(0), st.integers(0, 3000)), numbers)


def _import(command: str, path: Path, *extra: str) -> tuple[int, str, Path]:
    db = path / "audit.duckdb"
    result = CliRunner().invoke(
        cli, ["--db", str(db), "ingest", command, *extra, str(path)], catch_exceptions=False
    )
    shown = result.stdout + result.stderr
    assert "Traceback" not in shown and "internal error" not in shown, shown[-2000:]
    assert result.exit_code in (0, 2), shown[-2000:]
    return result.exit_code, shown, db


def _stored_within_bounds(db: Path) -> None:
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute(
            "SELECT count(*) FROM runs WHERE year(start_time) NOT BETWEEN 1970 AND 2200 "
            "OR year(end_time) NOT BETWEEN 1970 AND 2200"
        ).fetchall() == [(0,)]
        assert con.execute(
            "SELECT count(*) FROM metrics WHERE year(ts) NOT BETWEEN 1970 AND 2200"
        ).fetchall() == [(0,)]
        assert con.execute(
            "SELECT count(*) FROM gpu_samples WHERE NOT (util_pct IS NULL OR util_pct BETWEEN 0 "
            "AND 100) OR NOT (power_w IS NULL OR power_w BETWEEN 0 AND 10000) "
            "OR NOT (mem_used_mib IS NULL OR mem_used_mib >= 0)"
        ).fetchall() == [(0,)]
    finally:
        con.close()


def _json(value) -> str:
    return json.dumps(value)  # NaN and Infinity as the Python writers spell them


@pytest.mark.skipif(not hc.available(hc.Case("", print, 0, needs=("wandb",))), reason="wandb")
@SETTINGS
@given(
    rows=st.lists(st.tuples(numbers, times, keys, values), min_size=1, max_size=6),
    summary=st.lists(
        st.one_of(
            st.tuples(st.just("set"), keys, values), st.tuples(st.just("remove"), keys, st.none())
        ),
        max_size=8,
    ),
    gpu=st.lists(st.tuples(times, numbers, numbers), max_size=4),
    exit_code=st.one_of(st.none(), st.integers(-5, 300)),
)
def test_random_wandb_records(rows, summary, gpu, exit_code):
    records = [
        hc.record(history=[("_step", _json(s)), ("_timestamp", _json(t)), (k, v)])
        for s, t, k, v in rows
    ]
    for action, key, value in summary:
        change = ([(key, value)], []) if action == "set" else ([], [key])
        records.append(hc.record(summary=change))
    for seconds, util, power in gpu:
        at = int(seconds) if isinstance(seconds, float) and math.isfinite(seconds) else hc.T0
        at = max(0, min(at, 2**62))
        records.append(
            hc.record(stats=(at, [("gpu.0.gpu", _json(util)), ("gpu.0.powerWatts", _json(power))]))
        )
    if exit_code is not None:
        records.append(hc.record(exit=exit_code))
    with tempfile.TemporaryDirectory() as folder:
        hc.wandb_run(Path(folder), "fuzz01", records)
        code, _, db = _import("wandb", Path(folder) / "wandb")
        if code == 0:
            _stored_within_bounds(db)


@pytest.mark.skipif(
    not hc.available(hc.Case("", print, 0, needs=("tensorboard",))), reason="tensorboard"
)
@SETTINGS
@given(
    events=st.lists(
        st.tuples(st.integers(-INT64, INT64 - 1), times, numbers, st.booleans()),
        min_size=1,
        max_size=8,
    ),
    shape=st.lists(st.integers(0, 10**6), max_size=3),
    damage=st.one_of(st.none(), st.floats(0, 1)),
    skip_bad=st.booleans(),
)
def test_random_tensorboard_events(events, shape, damage, skip_bad):
    from tensorboard.compat.proto import event_pb2

    payloads = []
    for step, wall_time, value, as_tensor in events:
        event = event_pb2.Event(wall_time=wall_time, step=step)
        if as_tensor:
            summary = event.summary.value.add(tag="train/loss")
            summary.metadata.plugin_data.plugin_name = "scalars"
            summary.tensor.dtype = 2  # DT_DOUBLE
            for size in shape:
                summary.tensor.tensor_shape.dim.add(size=size)
            summary.tensor.double_val.append(value if isinstance(value, float) else 1.0)
        else:
            number = float(value) if isinstance(value, float) or abs(value) < 2**1000 else 0.0
            event.summary.value.add(tag="train/loss", simple_value=number)
        payloads.append(event.SerializeToString())
    with tempfile.TemporaryDirectory() as folder:
        run = hc.tf_run(Path(folder), payloads)
        if damage is not None:
            path = next(run.glob("events.*"))
            data = bytearray(path.read_bytes())
            data[int(damage * (len(data) - 1))] ^= 0x5A
            path.write_bytes(bytes(data))
        code, _, db = _import(
            "tensorboard", Path(folder) / "logs", *(("--skip-bad",) if skip_bad else ())
        )
        if code == 0:
            _stored_within_bounds(db)


@SETTINGS
@given(
    history=st.lists(
        st.dictionaries(
            st.sampled_from(["step", "loss", "train_runtime", "epoch", "grad_norm"]),
            st.one_of(numbers, st.booleans(), st.text(max_size=5)),
            max_size=5,
        ),
        max_size=6,
    ),
    global_step=st.one_of(numbers, st.just(3)),
    log_lines=st.lists(
        st.dictionaries(
            st.sampled_from(["current_steps", "total_steps", "loss", "elapsed_time"]),
            st.one_of(numbers, st.text(max_size=12)),
            max_size=4,
        ),
        max_size=5,
    ),
    depth=st.integers(0, 3000),
)
def test_random_trainer_logs(history, global_step, log_lines, depth):
    state = {"global_step": global_step, "max_steps": 3, "log_history": history}
    with tempfile.TemporaryDirectory() as folder:
        run = hc.trainer_run(Path(folder), json.dumps(state))
        text = "".join(json.dumps(line) + "\n" for line in log_lines)
        if depth:
            text += '{"current_steps": 1, "x": ' + hc.nested(depth) + "}\n"
        if text:
            (run / "trainer_log.jsonl").write_text(text)
        code, _, db = _import("trainer-logs", Path(folder) / "saves")
        if code == 0:
            _stored_within_bounds(db)

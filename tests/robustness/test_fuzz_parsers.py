"""Mangled cluster files end in the tool's own error, never another exception."""

from __future__ import annotations

import tempfile
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.errors import InputError
from audit.importers.slurm import read_sacct
from audit.importers.telemetry import read_telemetry
from audit.query.filter import FilterError

UTC = ZoneInfo("UTC")
SACCT_HEADER = "JobID|JobName|User|State|Start|End|ElapsedRaw|TimelimitRaw|NodeList|AllocTRES|TRESUsageInMax|ReqMem"
SACCT_LINE = "4700100|train|ann|COMPLETED|2026-11-16T00:59:00|2026-11-16T01:31:00|1920|120|gpu-a[01-02]|cpu=8,gres/gpu:h100=2,gres/gpu=2|gres/gpuutil=50,gres/gpumem=10G|32G"
SMI_HEADER = "timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"
SMI_LINE = "2026/11/16 01:29:00.000, 0, NVIDIA H100 80GB HBM3, 88 %, 65224 MiB, 81559 MiB"


def mangle(line: str):
    """Delete, duplicate, replace or insert characters, including delimiters and junk bytes."""
    alphabet = st.sampled_from([*list("|,:-[]=%/ .0123456789aZ\t\"'\\☃"), "\x00", "\x1b", "�", "é"])
    edits = st.lists(
        st.tuples(st.integers(0, len(line)), st.integers(0, 3), st.text(alphabet, max_size=4)),
        max_size=6,
    )

    def apply(items):
        text = line
        for position, delete, insert in items:
            position = min(position, len(text))
            text = text[:position] + insert + text[position + delete :]
        return text

    return edits.map(apply)


def _write(content: str) -> Path:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as handle:
        handle.write(content)
    return Path(handle.name)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(mangle(SACCT_LINE), min_size=1, max_size=4), header=mangle(SACCT_HEADER))
def test_mangled_sacct(lines, header):
    path = _write("\n".join([header, *lines]) + "\n")
    try:
        parsed = read_sacct(path, UTC)
        assert parsed.jobs.height <= len(lines)
    except InputError as exc:
        assert str(path) in str(exc)
    finally:
        path.unlink()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(mangle(SMI_LINE), min_size=1, max_size=4), header=mangle(SMI_HEADER))
def test_mangled_nvidia_smi(lines, header):
    _parses_or_names_the_file("\n".join([header, *lines]) + "\n", len(lines))


def _parses_or_names_the_file(content: str, lines: int) -> None:
    path = _write(content)
    try:
        parsed = read_telemetry(path, UTC, host="n1")
        assert parsed.samples.height <= lines
    except InputError as exc:
        assert str(path) in str(exc)
    finally:
        path.unlink()


DCGM_LINE = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",modelName="NVIDIA H100",Hostname="gpu-h01"} 97 1794787200000'


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(mangle(DCGM_LINE), min_size=1, max_size=4))
def test_mangled_dcgm_exposition(lines):
    content = "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + "\n".join(lines) + "\n"
    _parses_or_names_the_file(content, len(lines))


FILTER_TOKENS = [
    "params.lr",
    "params.`a b`",
    "metrics.loss",
    "tags.team",
    "attributes.status",
    "run_name",
    "=",
    "!=",
    "<",
    ">=",
    "like",
    "ilike",
    "in",
    "not",
    "is",
    "null",
    "and",
    "or",
    "(",
    ")",
    ",",
    "'x'",
    "'1e-5'",
    "0.5",
    "-1",
    "1e400",
    "'",
    "`",
    '"',
    ";",
    "--",
    "/*",
    "\\",
    "\x00",
    "select",
    "read_csv('/etc/passwd')",
    "'%'",
    "☃",
]


@pytest.fixture(scope="module")
def small_registry(tmp_path_factory):
    from click.testing import CliRunner

    from audit import Registry
    from audit.cli import cli
    from tests.helpers import REPO

    db = tmp_path_factory.mktemp("fuzz") / "w.duckdb"
    result = CliRunner().invoke(
        cli,
        [
            "--db",
            str(db),
            "ingest",
            "mlflow",
            "--tracking-uri",
            str(REPO / "sample_logs" / "mlruns"),
        ],
    )
    assert result.exit_code == 0, result.stderr
    return Registry(db)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tokens=st.lists(st.sampled_from(FILTER_TOKENS), max_size=12),
    noise=st.text(max_size=6),
)
def test_fuzzed_filters_answer_or_say_where_they_fail(small_registry, tokens, noise):
    text = " ".join(tokens) + noise
    try:
        small_registry.search(text, limit=5)
    except FilterError as exc:
        assert str(exc).startswith("invalid filter")


SAMPLE_WANDB_LOG = next(
    (Path(__file__).resolve().parents[2] / "sample_logs" / "wandb").glob("*/run-*.wandb")
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cut=st.integers(0, 12_000),
    flips=st.lists(st.tuples(st.integers(0, 12_000), st.integers(1, 255)), max_size=4),
)
def test_damaged_wandb_logs(cut, flips):
    """A W&B log cut short or with flipped bytes: its records, a tail warning, or the
    tool's error naming the file; never another exception."""
    from audit.importers.record_log import LogEnd
    from audit.importers.wandb.fold import read_records
    from audit.importers.wandb.log import HEADER
    from audit.importers.wandb.protobufs import protobufs
    from audit.importers.wandb.state import RunState

    record_class = protobufs()
    if record_class is None:
        pytest.skip("wandb is not installed")
    data = bytearray(SAMPLE_WANDB_LOG.read_bytes()[: max(cut, 1)])
    for position, mask in flips:
        if position < len(data):
            data[position] ^= mask
    with tempfile.NamedTemporaryFile(suffix=".wandb", delete=False) as handle:
        handle.write(bytes(data))
    path = Path(handle.name)
    try:
        state = RunState()
        end = LogEnd()
        read_records(path, record_class, state, len(HEADER), end)
        assert end.resume_offset <= len(data)
    except InputError as exc:
        assert str(path) in str(exc)
    finally:
        path.unlink()

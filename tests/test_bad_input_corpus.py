"""A corpus of broken inputs for every importer and the config file.

Each case is run through the real CLI (in-process, ``catch_exceptions=False`` so a
traceback fails the test): the exit code is 0 (the input was still usable) or 2; a
rejection names the file, and the line when the problem is on a line; the warehouse is
unchanged after a rejection. The tally is written to ``test-artifacts/bad-inputs.txt``.
"""

from __future__ import annotations

import random
import re
import shutil
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from audit.cli import cli
from tests.helpers import REPO

SAMPLE = REPO / "sample_logs"
ARTIFACTS = REPO / "test-artifacts"
OUTCOMES: Counter = Counter()

SACCT = "".join((SAMPLE / "slurm" / "week47.sacct").open().readlines()[:25])
SMI = "".join((SAMPLE / "gpu" / "gpu-h01.csv").open().readlines()[:40])
DCGM = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA H100",Hostname="gpu-h01"} 97 1794787200000
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2",device="nvidia1",modelName="NVIDIA H100",Hostname="gpu-h01"} 3 1794787200000
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA H100",Hostname="gpu-h01"} 70000 1794787200000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-2",device="nvidia1",modelName="NVIDIA H100",Hostname="gpu-h01"} 12 1794787200000
"""
PROM_JSON = """{"status": "success", "data": {"resultType": "matrix", "result": [
 {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "Hostname": "gpu-h01", "UUID": "GPU-1"},
  "values": [[1794787200, "97"], [1794787260, "95"]]},
 {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "1", "Hostname": "gpu-h01", "UUID": "GPU-2"},
  "values": [[1794787200, "3"], [1794787260, "0"]]}]}}
"""
CONFIG = """[cluster]
timezone = "UTC"

[mlflow]
page_size = 500
http_timeout_seconds = 10

[links]
path_prefixes = { "/scratch" = "/tmp/scratch" }
"""

KINDS = {
    # kind: (valid text, file name, CLI arguments before the path, delimiter)
    "sacct": (SACCT, "jobs.sacct", ["ingest", "slurm"], "|"),
    "nvidia-smi": (SMI, "gpu-h01.csv", ["ingest", "gpu"], ","),
    "dcgm": (DCGM, "dcgm.prom", ["ingest", "gpu"], " "),
    "prom-json": (PROM_JSON, "prom.json", ["ingest", "gpu"], ","),
    "config": (CONFIG, "audit.toml", None, "="),
}


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _middle(text: str) -> int:
    return len(_lines(text)) // 2


def _edit_line(text: str, index: int, edit) -> str:
    lines = _lines(text)
    index = min(index, len(lines) - 1)
    lines[index] = edit(lines[index])
    return "".join(lines)


def _drop_field(line: str, delimiter: str) -> str:
    parts = line.rstrip("\n").split(delimiter)
    return delimiter.join(parts[:-2] + parts[-1:]) + "\n"


def _duplicate_first_field(text: str, delimiter: str) -> str:
    """The first line with fields gets its first field again (a header column, a TOML key)."""
    lines = _lines(text)
    index = next(i for i, line in enumerate(lines) if delimiter in line)
    first = lines[index].split(delimiter)[0].strip()
    if delimiter == "=":  # TOML: the same key twice
        lines.insert(index + 1, lines[index])
    else:
        lines[index] = lines[index].rstrip("\n") + delimiter + first + "\n"
    return "".join(lines)


# name -> (mutation, whether a rejection must point at a line)
MUTATIONS = {
    "empty": (lambda t, d: b"", False),
    "whitespace only": (lambda t, d: b"  \n\n\t\n", False),
    "header only": (lambda t, d: _lines(t)[0].encode(), False),
    "cut mid-line": (lambda t, d: t[: len(t) // 2 + 7].encode(), True),
    "last line cut": (lambda t, d: t.rstrip("\n")[:-9].encode(), True),
    "wrong delimiter": (lambda t, d: t.replace(d, "\t").encode(), False),
    "semicolons": (lambda t, d: t.replace(d, ";").encode(), False),
    "binary junk": (lambda t, d: random.Random(1).randbytes(4096), False),
    "junk appended": (lambda t, d: t.encode() + random.Random(2).randbytes(512), True),
    "NUL in the middle": (
        lambda t, d: _edit_line(t, _middle(t), lambda s: s[:5] + "\x00" + s[5:]).encode(),
        True,
    ),
    "10 MB field": (
        lambda t, d: _edit_line(t, _middle(t), lambda s: s[:-1] + "x" * 10_000_000 + "\n").encode(),
        True,
    ),
    "invalid UTF-8": (
        lambda t, d: t.encode().replace(
            _lines(t)[_middle(t)].encode()[:12],
            b"\xff\xfe\xfd" + _lines(t)[_middle(t)].encode()[3:12],
            1,
        ),
        True,
    ),
    "missing column in header": (
        lambda t, d: _edit_line(t, 0, lambda s: _drop_field(s, d)).encode(),
        False,
    ),
    "missing field on a line": (
        lambda t, d: _edit_line(t, _middle(t), lambda s: _drop_field(s, d)).encode(),
        True,
    ),
    "duplicated column": (lambda t, d: _duplicate_first_field(t, d).encode(), False),
    "year 99999": (lambda t, d: re.sub(r"20(26)", r"999\1", t, count=3).encode(), True),
    "signed year": (lambda t, d: re.sub(r"(?<![\d-])2026", "-2026", t, count=3).encode(), False),
    "year 1800": (lambda t, d: re.sub(r"2026", "1800", t).encode(), False),
    "negative numbers": (
        lambda t, d: re.sub(r"(?<=[\s|,=\[\"])(\d{2,})", r"-\1", t).encode(),
        False,
    ),
    "huge numbers": (
        lambda t, d: re.sub(r"(?<=[\s|,=])(\d{2,})", r"\g<1>999999999999999999999", t).encode(),
        False,
    ),
    "CRLF line ends": (lambda t, d: t.replace("\n", "\r\n").encode(), False),
    "byte-order mark": (lambda t, d: b"\xef\xbb\xbf" + t.encode(), False),
    "header repeated mid-file": (
        lambda t, d: "".join(_lines(t)[:5] + _lines(t)[:1] + _lines(t)[5:]).encode(),
        True,
    ),
    "unbalanced quote": (lambda t, d: _edit_line(t, _middle(t), lambda s: '"' + s).encode(), True),
    "lines shuffled": (
        lambda t, d: "".join(
            _lines(t)[:1] + random.Random(3).sample(_lines(t)[1:], len(_lines(t)) - 1)
        ).encode(),
        False,
    ),
    "latin-1 text": (lambda t, d: t.replace("gpu", "gpü").encode("latin-1"), True),
}


def _random_mutations(text: str, seed: int) -> bytes:
    """Byte-level damage: flips, deletions, duplications and insertions at random places."""
    rng = random.Random(seed)
    data = bytearray(text.encode())
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(len(data))
        op = rng.choice(("flip", "delete", "duplicate", "insert"))
        if op == "flip":
            data[at] = rng.randrange(256)
        elif op == "delete":
            del data[at : at + rng.randint(1, 40)]
        elif op == "duplicate":
            data[at:at] = data[at : at + rng.randint(1, 80)]
        else:
            data[at:at] = rng.choice([b",", b"|", b"\n", b'"', b"{", b"}", b"=", b"\x00", b"-1"])
    return bytes(data)


CASES = [(kind, name) for kind in KINDS for name in MUTATIONS]
CASES += [(kind, f"random damage #{seed}") for kind in KINDS for seed in range(16)]
CASES += [(kind, special) for kind in KINDS for special in ("a directory", "no such file")]


def test_corpus_is_large_enough():
    assert len(CASES) >= 200


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("corpus") / "seeded.duckdb"
    runner = CliRunner()
    for args in (
        ["ingest", "slurm", str(SAMPLE / "slurm" / "week47.sacct")],
        ["ingest", "gpu", str(SAMPLE / "gpu" / "gpu-h01.csv")],
    ):
        result = runner.invoke(cli, ["--db", str(db), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
    return db


def counts(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {
            t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
            for t in ("jobs", "job_nodes", "gpu_samples", "file_imports")
        }
    finally:
        con.close()


@pytest.mark.parametrize(("kind", "mutation"), CASES, ids=[f"{k}-{m}" for k, m in CASES])
def test_bad_input(kind, mutation, seeded, tmp_path):
    text, file_name, command, delimiter = KINDS[kind]
    path = tmp_path / file_name
    line_expected = False
    if mutation == "a directory":
        path.mkdir()
    elif mutation == "no such file":
        pass
    elif mutation.startswith("random damage"):
        path.write_bytes(_random_mutations(text, int(mutation.split("#")[1])))
    else:
        mutate, line_expected = MUTATIONS[mutation]
        path.write_bytes(mutate(text, delimiter))
    db = tmp_path / "w.duckdb"
    shutil.copyfile(seeded, db)
    before = counts(db)
    if command is None:  # the config file, read by a command that needs it
        args = ["--db", str(db), "--config", str(path), "scan", "--format", "json"]
    else:
        args = ["--db", str(db), *command, str(path)]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    stderr = result.stderr
    assert "Traceback" not in stderr + result.stdout
    assert result.exit_code in (0, 1, 2) if command is None else result.exit_code in (0, 2), stderr
    if result.exit_code == 2:
        OUTCOMES[f"{kind}: rejected"] += 1
        assert file_name in stderr, f"the message does not name the file: {stderr!r}"
        if line_expected and path.is_file() and path.stat().st_size:
            named_line = re.search(re.escape(file_name) + r":\d+", stderr) or "line " in stderr
            whole_file = any(
                w in stderr for w in ("empty", "binary", "UTF-8", "header", "encoding")
            )
            assert named_line or whole_file, f"no line number: {stderr!r}"
        assert counts(db) == before, "a rejected input changed the warehouse"
    else:
        OUTCOMES[f"{kind}: accepted"] += 1


def test_write_tally():
    """Runs after the corpus (file order): the figures for the closing note."""
    ARTIFACTS.mkdir(exist_ok=True)
    lines = [f"{k}: {v}" for k, v in sorted(OUTCOMES.items())]
    (ARTIFACTS / "bad-inputs.txt").write_text(
        f"cases: {sum(OUTCOMES.values())}\n" + "\n".join(lines) + "\n"
    )

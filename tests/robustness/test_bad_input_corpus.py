"""A corpus of broken inputs for every importer and the config file.

Each case is run through the real CLI (in-process, ``catch_exceptions=False`` so a
traceback fails the test): the exit code is 0 (the input was still usable) or 2; a
rejection names the file, and the line when the problem is on a line; the warehouse is
unchanged after a rejection. The tally goes to ``test-artifacts/bad-inputs.txt`` at the end
of a session that ran every case.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from audit.cli import cli
from tests.helpers import REPO, CorpusTally, table_counts

SAMPLE = REPO / "sample_logs"

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
# sacct --json: one job with one step, the fields the importer reads and one it does not
SACCT_JSON = json.dumps(
    {
        "jobs": [
            {
                "job_id": 4001,
                "name": "sft",
                "user": "ann",
                "account": "nlp",
                "partition": "gpu",
                "state": {"current": ["COMPLETED"]},
                "time": {
                    "submission": 1794816000,
                    "eligible": 1794816000,
                    "start": 1794816330,
                    "end": 1794823530,
                    "elapsed": 7200,
                    "limit": {"set": True, "infinite": False, "number": 240},
                },
                "allocation_nodes": 1,
                "nodes": "gpu-h01",
                "tres": {
                    "allocated": [
                        {"type": "cpu", "name": "", "count": 16},
                        {"type": "gres", "name": "gpu:h100", "count": 2},
                        {"type": "gres", "name": "gpu", "count": 2},
                    ],
                    "requested": [{"type": "mem", "name": "", "count": 131072}],
                },
                "comment": {"administrator": "JS1:H4sI"},
                "array": {
                    "job_id": 0,
                    "task_id": {"set": False, "infinite": False, "number": 0},
                    "task": "",
                },
                "het": {"job_id": 0, "job_offset": {"set": False, "infinite": False, "number": 0}},
                "required": {"CPUs": 16},
                "steps": [
                    {
                        "step": {"id": "4001.0", "name": "python"},
                        "tres": {
                            "requested": {
                                "max": [
                                    {"type": "gres", "name": "gpuutil", "count": 99},
                                    {"type": "gres", "name": "gpumem", "count": 64424509440},
                                    {"type": "mem", "name": "", "count": 12884901888},
                                ],
                                "average": [{"type": "gres", "name": "gpuutil", "count": 83}],
                            }
                        },
                    }
                ],
            }
        ],
        "meta": {"plugin": {"data_parser": "data_parser/v0.0.40"}},
    },
    indent=1,
)
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
    "sacct-json": (SACCT_JSON, "jobs.json", ["ingest", "slurm"], ","),
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
def jobs_and_samples_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("corpus") / "seeded.duckdb"
    runner = CliRunner()
    for args in (
        ["ingest", "slurm", str(SAMPLE / "slurm" / "week47.sacct")],
        ["ingest", "gpu", str(SAMPLE / "gpu" / "gpu-h01.csv")],
    ):
        result = runner.invoke(cli, ["--db", str(db), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
    return db


@pytest.mark.parametrize(("kind", "mutation"), CASES, ids=[f"{k}-{m}" for k, m in CASES])
def test_bad_input(kind, mutation, jobs_and_samples_db, tmp_path):
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
    shutil.copyfile(jobs_and_samples_db, db)
    before = table_counts(db)
    if command is None:  # the config file, read by a command that needs it
        args = ["--db", str(db), "--config", str(path), "scan", "--format", "json"]
    else:
        args = ["--db", str(db), *command, str(path)]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    stderr = result.stderr
    assert "Traceback" not in stderr + result.stdout
    assert result.exit_code in (0, 1, 2) if command is None else result.exit_code in (0, 2), stderr
    if result.exit_code == 2:
        TALLY.record(kind, mutation, "rejected")
        assert file_name in stderr, f"the message does not name the file: {stderr!r}"
        if line_expected and path.is_file() and path.stat().st_size:
            named_line = re.search(re.escape(file_name) + r":\d+", stderr) or "line " in stderr
            whole_file = any(
                w in stderr for w in ("empty", "binary", "UTF-8", "header", "encoding")
            )
            assert named_line or whole_file, f"no line number: {stderr!r}"
        assert table_counts(db) == before, "a rejected input changed the warehouse"
    else:
        TALLY.record(kind, mutation, "accepted")


# -- every field of every cluster source, by class (issue 14) -------------------------------
# Wrong types in every structured field, values beyond every numeric range, invalid UTF-8
# in every text column, and the bombs that apply to these formats (node-list products,
# deep JSON nesting). Same verdict as above; an accepted file must not poison the
# warehouse (no negative duration, no sample outside the valid ranges).
SACCT_FULL = (REPO / "tests" / "data" / "slurm" / "sacct-P.txt").read_text()
BEYOND = ["inf", "nan", "1e30", "-1", "99999999999", "9" * 400]
TIMES_BEYOND = ["0001-01-01T00:00:00", "9999-12-31T23:59:59", "99999-01-01T00:00:00", "-2026-01-01"]
WRONG_TEXT = ["abc", ""]
JSON_WRONG = [[], {}, "x", 7, None, True, 1.5]
JSON_BEYOND = [-1, 2**64, 1e308, 99_999_999_999]
HOST_BOMBS = ["n[0-99999][0-99999]", "n" + "[1-2]" * 40, "n[0-99999999999]"]
NEST = 100_000


def _text_field(text: str, line: int, column: int, delimiter: str, value: bytes) -> bytes:
    lines = text.encode().split(b"\n")
    fields = lines[line].split(delimiter.encode())
    fields[column] = value
    lines[line] = delimiter.encode().join(fields)
    return b"\n".join(lines)


def _sacct_cases() -> list[tuple]:
    header = SACCT_FULL.split("\n", 1)[0].split("|")
    usage = {"TRESUsageInMax", "TRESUsageInAve", "MaxRSS"}
    cases = []
    for column, name in enumerate(header):
        line = 2 if name in usage else 1  # the step row carries the usage
        put = lambda value, c=column, n=line: _text_field(SACCT_FULL, n, c, "|", value)  # noqa: E731
        for value in WRONG_TEXT:
            cases.append((f"{name} = {value!r}", put(value.encode())))
        cases.append((f"{name} invalid UTF-8", put(b"\xff\xfe" + name.encode())))
        if name in ("Submit", "Eligible", "Start", "End"):
            cases += [(f"{name} = {v}", put(v.encode())) for v in TIMES_BEYOND]
        elif name in ("ElapsedRaw", "TimelimitRaw", "NNodes", "NCPUS"):
            cases += [(f"{name} = {v[:20]}", put(v.encode())) for v in BEYOND]
        elif name in ("AllocTRES", "ReqTRES"):
            cases += [(f"{name} gres/gpu={v[:20]}", put(f"gres/gpu={v}".encode())) for v in BEYOND]
        elif name in ("ReqMem", "MaxRSS"):
            cases += [(f"{name} = {v[:20]}G", put(f"{v}G".encode())) for v in BEYOND]
        elif name in ("TRESUsageInMax", "TRESUsageInAve"):
            cases += [
                (f"{name} {key}={v[:20]}", put(f"{key}={v}{unit}".encode()))
                for v in BEYOND
                for key, unit in (("gres/gpuutil", ""), ("gres/gpumem", "P"))
            ]
        elif name == "NodeList":
            cases += [(f"NodeList bomb {v[:24]}", put(v.encode())) for v in HOST_BOMBS]
    return [("sacct", name, content, "line") for name, content in cases]


def _smi_cases() -> list[tuple]:
    header = [c.strip() for c in SMI.split("\n", 1)[0].split(",")]
    cases = []
    for column, name in enumerate(header):
        put = lambda value, c=column: _text_field(SMI, 1, c, ",", b" " + value)  # noqa: E731
        for value in WRONG_TEXT:
            cases.append((f"{name} = {value!r}", put(value.encode())))
        cases.append((f"{name} invalid UTF-8", put(b"\xff\xfe" + name.encode())))
        if name == "timestamp":
            cases += [
                (f"timestamp {v}", put(v.encode()))
                for v in (
                    "9999/11/16 00:59:00.000",
                    "0001/11/16 00:59:00.000",
                    "99999/11/16 00:59:00",
                )
            ]
        elif name.split(" ")[0] in ("utilization.gpu", "memory.used", "memory.total", "power.draw"):
            cases += [(f"{name} = {v[:20]}", put(v.encode())) for v in [*BEYOND, "250"]]
    return [("nvidia-smi", name, content, "line") for name, content in cases]


def _dcgm_cases() -> list[tuple]:
    line = DCGM.split("\n")[2]
    metric, rest = line.split("{", 1)
    labels, tail = rest.split("} ", 1)
    value, stamp = (part.encode() for part in tail.split(" "))
    metric = metric.encode()
    base = [tuple(part.encode() for part in pair.split("=", 1)) for pair in labels.split(",")]

    def build(metric_=metric, pairs=base, value_=value, stamp_=stamp):
        labels_ = b",".join(k + b"=" + v for k, v in pairs)
        new = metric_ + b"{" + labels_ + b"} " + value_ + b" " + stamp_
        return DCGM.encode().replace(line.encode(), new)

    cases = [("metric invalid UTF-8", build(metric_=b"DCGM_FI_\xff\xfe"))]
    for index, (key, _) in enumerate(base):
        for label in (b'""', b"7", b'"\xff\xfe"'):
            pairs = [*base[:index], (key, label), *base[index + 1 :]]
            cases.append((f"label {key.decode()} = {label!r}", build(pairs=pairs)))
    for value_ in [*WRONG_TEXT, *BEYOND, "250", "+Inf"]:
        cases.append((f"value = {value_[:20]!r}", build(value_=(value_ or "x y").encode())))
    for stamp_ in ["abc", "-1", "99999999999999999", "9" * 400]:
        cases.append((f"timestamp = {stamp_[:20]}", build(stamp_=stamp_.encode())))
    return [("dcgm", name, content, "line") for name, content in cases]


def _walk(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, key), value
            yield from _walk(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield (*path, index), value
            yield from _walk(value, (*path, index))


def _put(document, path, value):
    document = copy.deepcopy(document)
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return document


def _json_cases(kind: str, text: str) -> list[tuple]:
    document = json.loads(text)
    cases = []
    for number, (path, value) in enumerate(_walk(document)):
        where = ".".join(str(p) for p in path)
        wrong = [w for w in JSON_WRONG if type(w) is not type(value)]
        for choice in (wrong[number % len(wrong)],):
            cases.append(
                (
                    f"{where} = {json.dumps(choice)}",
                    json.dumps(_put(document, path, choice)).encode(),
                )
            )
        if isinstance(value, int | float) and not isinstance(value, bool):
            for big in JSON_BEYOND:
                cases.append(
                    (f"{where} = {big:.3g}", json.dumps(_put(document, path, big)).encode())
                )
        if isinstance(value, str):
            marked = json.dumps(_put(document, path, "@@INVALID@@" + value)).encode()
            cases.append((f"{where} invalid UTF-8", marked.replace(b"@@INVALID@@", b"\xff\xfe")))
            cases.append((f"{where} lone surrogate", marked.replace(b"@@INVALID@@", b"\\ud800")))
            if value.lstrip("-").replace(".", "", 1).isdigit():  # a number as text
                for big in BEYOND:
                    cases.append(
                        (f"{where} = {big[:20]!r}", json.dumps(_put(document, path, big)).encode())
                    )
    first = "jobs" if kind == "sacct-json" else "data"
    cases.append(("nested 100k deep", (f'{{"{first}": ' + "[" * NEST + "]" * NEST + "}").encode()))
    if kind == "sacct-json":
        for bomb in HOST_BOMBS:
            cases.append(
                (
                    f"nodes bomb {bomb[:24]}",
                    json.dumps(_put(document, ("jobs", 0, "nodes"), bomb)).encode(),
                )
            )
    return [(kind, name, content, "path") for name, content in cases]


FIELD_CASES = {
    (kind, name): (content, location)
    for kind, name, content, location in [
        *_sacct_cases(),
        *_smi_cases(),
        *_dcgm_cases(),
        *_json_cases("prom-json", PROM_JSON),
        *_json_cases("sacct-json", SACCT_JSON),
    ]
}


def test_field_corpus_covers_every_class():
    names = " ".join(name for _, name in FIELD_CASES)
    for kind in ("sacct", "nvidia-smi", "dcgm", "prom-json", "sacct-json"):
        kinds = [name for k, name in FIELD_CASES if k == kind]
        assert any("invalid UTF-8" in n for n in kinds), kind
        assert any("=" in n for n in kinds), kind
    assert "bomb" in names and "nested 100k deep" in names
    assert len(FIELD_CASES) >= 500


@functools.cache
def jobs_and_samples_counts(jobs_and_samples_db: Path) -> dict[str, int]:
    return table_counts(jobs_and_samples_db)


def poisoned(db: Path) -> list:
    """Stored values no later command may meet."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            """
            SELECT 'job', job_id FROM jobs
             WHERE elapsed_s < 0 OR end_time < start_time OR timelimit_s < 0
                OR year(coalesce(start_time, end_time, submit_time)) NOT BETWEEN 1970 AND 2200
            UNION ALL
            SELECT 'sample', host FROM gpu_samples
             WHERE NOT isfinite(util_pct) OR util_pct NOT BETWEEN 0 AND 100
                OR NOT isfinite(mem_used_mib) OR mem_used_mib < 0
                OR NOT isfinite(power_w) OR power_w < 0
                OR year(ts) NOT BETWEEN 1970 AND 2200
            """
        ).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(
    ("kind", "name"), list(FIELD_CASES), ids=[f"{k}-{n}"[:90] for k, n in FIELD_CASES]
)
def test_bad_field(kind, name, jobs_and_samples_db, tmp_path):
    content, location = FIELD_CASES[(kind, name)]
    _, file_name, command, _ = KINDS[kind]
    path = tmp_path / file_name
    path.write_bytes(content)
    db = tmp_path / "w.duckdb"
    shutil.copyfile(jobs_and_samples_db, db)
    before = jobs_and_samples_counts(jobs_and_samples_db)
    result = CliRunner().invoke(cli, ["--db", str(db), *command, str(path)], catch_exceptions=False)
    stderr = result.stderr
    assert "Traceback" not in stderr + result.stdout
    assert result.exit_code in (0, 2), stderr
    if result.exit_code == 2:
        TALLY.record(kind, name, "rejected")
        assert file_name in stderr, f"the message does not name the file: {stderr!r}"
        if location == "line":
            assert re.search(re.escape(file_name) + r":\d+", stderr) or any(
                w in stderr for w in ("binary", "UTF-8", "header")
            ), f"no line number: {stderr!r}"
        else:
            assert re.search(
                r"\[\d+\]|:\d+:\d+|(data|jobs)[.\[]|invalid JSON|nested too", stderr
            ) or any(
                w in stderr
                for w in ("expected sacct --json output", "expected a Prometheus query", "UTF-8")
            ), f"no place in the document: {stderr!r}"
        assert table_counts(db) == before, "a rejected input changed the warehouse"
    else:
        TALLY.record(kind, name, "accepted")
        assert poisoned(db) == [], "an accepted input stored values no later command may meet"


TALLY = CorpusTally("bad-inputs.txt", [*CASES, *FIELD_CASES])


def test_the_tally_counts_every_case_once_under_its_kind():
    """The tally written at the session's end, over this corpus's cases with outcomes
    set here: one line per kind and outcome, every case counted once, none left out."""
    cases = sorted(TALLY.cases)
    tally = CorpusTally(TALLY.file_name, cases, register=False)
    outcome = {case: "rejected" if i % 3 else "accepted" for i, case in enumerate(cases)}
    first = next(iter(outcome))
    for (kind, name), result in outcome.items():
        if (kind, name) != first:
            tally.record(kind, name, result)
    with pytest.raises(ValueError, match=f"1 of {len(CASES) + len(FIELD_CASES)} cases have no"):
        tally.text()
    tally.record(*first, outcome[first])
    with pytest.raises(ValueError, match="counted already"):
        tally.record(*first, outcome[first])
    with pytest.raises(KeyError):
        tally.record("sacct", "not a case", "rejected")
    per_kind = Counter()
    for (kind, _), result in outcome.items():
        per_kind[kind, result] += 1
    assert tally.text().splitlines() == [
        f"cases: {len(CASES) + len(FIELD_CASES)}",
        *sorted(f"{kind}: {result}: {n}" for (kind, result), n in per_kind.items()),
    ]


# -- issue 40: tracking-server answers, store times and config numbers ------------------------
# Each in its own process, bounded in time and address space (tests/hostile_cases.py; the
# run-folder cases are in tests/robustness/test_hostile_run_folders.py).
from tests import hostile_cases  # noqa: E402


@pytest.mark.parametrize("name", [c.name for c in hostile_cases.CASES if c.corpus == "input"])
def test_issue_40_input(name, tmp_path):
    case = hostile_cases.BY_NAME[name]
    outcome = hostile_cases.run_case(case, tmp_path)
    problems = hostile_cases.verdict(case, outcome, tmp_path / "audit.duckdb")
    assert problems == [], "; ".join(problems)

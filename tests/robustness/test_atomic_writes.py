"""Files the tool writes are replaced whole or not at all (issue 13).

Each writer runs in a process of its own under a file-size limit (``ulimit -f``), the
way a full disk stops a write half-way: the previous file must be intact, no temporary
file may be left, and the error is an input error (exit 2) that says so.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from audit import atomic
from audit.errors import InputError
from tests.helpers import REPO

PREVIOUS = "the previous file, kept whole\n"


def _limited(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


def _audit(db: Path, config: Path, *args: str, limit: int | None = None):
    return subprocess.run(
        [sys.executable, "-m", "audit", "--db", str(db), "--config", str(config), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        preexec_fn=_limited(limit) if limit else None,
    )


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize(
    ("args", "limit"),
    [
        (("report", "weekly", "--week", "2026-W47", "--output"), 16_000),  # ~100 KB of HTML
        # ~180 KB of HTML; the stored scan's ~42 KB of warehouse log is written first (the
        # JSON, ~37 KB, is smaller than that log: its streamed writer is tested below)
        (("scan", "--format", "html", "--output"), 60_000),
        (("prune", "--plan"), 4_000),  # ~10 KB plan
    ],
    ids=["report", "scan", "plan"],
)
def test_a_write_stopped_by_a_full_disk_leaves_the_previous_file(
    fresh_demo_db, tmp_path, args, limit
):
    out = tmp_path / "out" / "file"
    out.parent.mkdir()
    db, config = fresh_demo_db["db"], fresh_demo_db["config"]
    # the warehouse's own writes (a stored scan) happen first, without a limit
    first = _audit(db, config, *args, str(out))
    assert first.returncode == 0, first.stderr
    assert out.stat().st_size > limit
    out.write_text(PREVIOUS)
    result = _audit(db, config, *args, str(out), limit=limit)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"Error: cannot write {out}: File too large; the previous file, if any, is unchanged"
    )
    assert out.read_text() == PREVIOUS
    assert _leftovers(out.parent) == []


# The scan's JSON writer in a process of its own: ~110 KB of findings streamed to a file.
_STREAMED_JSON = """
import sys
from pathlib import Path
from audit.atomic import write_text_chunks
from audit.reports.scan import json_chunks
from audit.errors import InputError

findings = [{"id": f"{i:016x}", "message": "x" * 100} for i in range(1000)]
try:
    write_text_chunks(Path(sys.argv[1]), json_chunks({"scan": {}, "summary": {}, "findings": findings}))
except InputError as exc:
    print(exc)
"""


def test_the_streamed_scan_json_stopped_by_a_full_disk_leaves_the_previous_file(tmp_path):
    out = tmp_path / "out" / "scan.json"
    out.parent.mkdir()
    out.write_text(PREVIOUS)
    result = subprocess.run(
        [sys.executable, "-c", _STREAMED_JSON, str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        preexec_fn=_limited(40_000),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"cannot write {out}: File too large; the previous file, if any, is unchanged"
    )
    assert out.read_text() == PREVIOUS
    assert _leftovers(out.parent) == []
    unlimited = subprocess.run(
        [sys.executable, "-c", _STREAMED_JSON, str(out)], capture_output=True, cwd=REPO
    )
    assert unlimited.returncode == 0 and out.stat().st_size > 100_000


def test_a_warehouse_write_stopped_by_a_full_disk_is_an_input_error(fresh_demo_db):
    """DuckDB's own log write failing at commit: exit 2 saying nothing was stored, and
    the warehouse reads as before."""
    db, config = fresh_demo_db["db"], fresh_demo_db["config"]
    result = _audit(db, config, "scan", "--format", "json", limit=8_000)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"Error: cannot write the warehouse {db}: File too large; nothing of this command "
        "was stored (free some space and run it again)"
    )
    again = _audit(db, config, "scan", "--format", "json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["scan"]["id"] == 1  # the failed scan left no trace


def test_an_export_stopped_by_a_full_disk_leaves_no_folder(fresh_demo_db, tmp_path):
    target = tmp_path / "export"
    result = _audit(
        fresh_demo_db["db"],
        fresh_demo_db["config"],
        "export",
        "--parquet",
        str(target),
        limit=8_000,
    )
    assert result.returncode == 2, result.stderr
    assert f"cannot write {target}: " in result.stderr and "nothing was exported" in result.stderr
    assert not target.exists()
    assert _leftovers(tmp_path) == []


def test_replacing_keeps_permissions_and_follows_a_symlink(tmp_path):
    target = tmp_path / "report.html"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "latest.html"
    link.symlink_to(target)
    atomic.write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640
    fresh = tmp_path / "fresh.txt"
    atomic.write_text(fresh, "x")
    mask = os.umask(0)
    os.umask(mask)
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~mask
    with pytest.raises(InputError, match="it is a folder"):
        atomic.write_text(tmp_path, "x")
    with pytest.raises(InputError, match="does not exist"):
        atomic.write_text(tmp_path / "missing" / "x", "x")


def test_the_manifest_survives_a_torn_last_record(tmp_path):
    """A kill during an append leaves at most a torn last line: skipped on reading, and
    the next record starts on a line of its own. A damaged line elsewhere is an error."""
    log = tmp_path / "plan.json.manifest.jsonl"
    with atomic.AppendOnlyLog(log) as manifest:
        manifest.append({"path": "/a", "status": "deleted"})
    with open(log, "a") as handle:
        handle.write('{"path": "/b", "sta')  # the kill
    assert atomic.read_log(log) == [{"path": "/a", "status": "deleted"}]
    with atomic.AppendOnlyLog(log) as manifest:
        manifest.append({"path": "/c", "status": "skipped"})
    assert atomic.read_log(log) == [
        {"path": "/a", "status": "deleted"},
        {"path": "/c", "status": "skipped"},
    ]
    lines = log.read_text().splitlines()
    assert lines[1] == '{"path": "/b", "sta' and json.loads(lines[2])["status"] == "torn"
    log.write_text(log.read_text() + '{"path": "/d", oops\n' + json.dumps({"path": "/e"}) + "\n")
    with pytest.raises(InputError, match=r"manifest.jsonl:5: not a manifest record"):
        atomic.read_log(log)


def test_streamed_text_is_written_whole_or_not_at_all(tmp_path):
    out = tmp_path / "streamed.json"
    pieces = [f"{n:07d}é\n" for n in range(300_000)]  # over a megabyte: several writes
    atomic.write_text_chunks(out, iter(pieces))
    assert out.read_text(encoding="utf-8") == "".join(pieces)

    def broken():
        yield from pieces
        raise ValueError("the encoder failed halfway")

    out.write_text(PREVIOUS)
    with pytest.raises(ValueError, match="halfway"):
        atomic.write_text_chunks(out, broken())
    assert out.read_text() == PREVIOUS
    assert _leftovers(tmp_path) == []

"""kill -9 or Ctrl-C in the middle of an import leaves the warehouse exactly as before."""

from __future__ import annotations

import random
import shutil
import signal
import tarfile
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, SHARED, audit_process, table_counts

ARCHIVE = SHARED / "mlflow" / "pycaret-tutorial-mlruns.tar.gz"
NOTHING_WRITTEN = "audit: interrupted; nothing was written"
SAVED = "audit: interrupted; what was saved before the interrupt is complete"
pytestmark = pytest.mark.skipif(not ARCHIVE.exists(), reason=f"{ARCHIVE} not present")


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pycaret")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(root, filter="data")
    return root / "mlruns"


def test_kill_9_mid_import_leaves_warehouse_unchanged(big_store, tmp_path):
    db = tmp_path / "w.duckdb"
    assert (
        audit_process(
            db, "ingest", "mlflow", "--tracking-uri", str(REPO / "sample_logs" / "mlruns")
        ).wait()
        == 0
    )
    before = table_counts(db, writable=True)

    scratch = tmp_path / "scratch.duckdb"
    started = time.monotonic()
    assert audit_process(scratch, "ingest", "mlflow", "--tracking-uri", str(big_store)).wait() == 0
    full_import_seconds = time.monotonic() - started

    rng = random.Random(7)
    survived = 0
    for _ in range(5):
        proc = audit_process(db, "ingest", "mlflow", "--tracking-uri", str(big_store))
        time.sleep(rng.uniform(0.2, max(0.3, full_import_seconds * 0.9)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert table_counts(db, writable=True) == before
        survived += 1
    assert survived == 5

    finisher = audit_process(db, "ingest", "mlflow", "--tracking-uri", str(big_store))
    _out, err = finisher.communicate()
    assert finisher.returncode == 0, err
    after = table_counts(db, writable=True)
    assert after["runs"] == before["runs"] + 416
    assert after["import_log"] == before["import_log"] + 1


def wait_until_loading_the_cli(proc) -> None:
    """Until DuckDB's library is mapped into the process: the CLI is loading, after
    audit.entry installed its SIGINT handler."""
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if "duckdb" in maps.read_text(errors="replace"):
                return
        except OSError:  # ended meanwhile
            return
        time.sleep(0.002)


def test_ctrl_c_anywhere_in_an_import_rolls_back(big_store, tmp_path):
    """Ctrl-C while modules load, while reading the store, inside DuckDB statements and
    Arrow scans (which wrap the KeyboardInterrupt in their own errors): always exit 130
    with one line, never an internal error, and the warehouse as before."""
    db = tmp_path / "w.duckdb"
    assert (
        audit_process(
            db, "ingest", "mlflow", "--tracking-uri", str(REPO / "sample_logs" / "mlruns")
        ).wait()
        == 0
    )
    before = table_counts(db, writable=True)
    scratch = tmp_path / "scratch.duckdb"
    started = time.monotonic()
    assert audit_process(scratch, "ingest", "mlflow", "--tracking-uri", str(big_store)).wait() == 0
    full_import_seconds = time.monotonic() - started

    # Each attempt on a copy of the warehouse: an import that commits before its signal
    # (a faster moment than the measured import) moves the later signals earlier instead of
    # ending the test with too few interrupts.
    base = tmp_path / "base.duckdb"
    shutil.copyfile(db, base)
    limit = full_import_seconds * 0.9
    interrupted = 0
    for _attempt in range(16):
        if interrupted == 8:
            break
        # From the moment the CLI's modules load (earlier, Python's own start-up prints its
        # traceback; on a loaded machine that takes longer than any fixed delay) to near
        # the end of the import.
        delay = limit * interrupted / 7
        Path(f"{db}.wal").unlink(missing_ok=True)  # the last attempt's, if it left one
        shutil.copyfile(base, db)
        proc = audit_process(db, "ingest", "mlflow", "--tracking-uri", str(big_store))
        wait_until_loading_the_cli(proc)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate()
        if proc.returncode == 0 or err.strip() == SAVED:  # committed before the signal
            assert proc.returncode in (0, 130)
            assert table_counts(db, writable=True)["runs"] == before["runs"] + 416
            limit = delay * 0.8
            continue
        assert (proc.returncode, err.strip()) == (130, NOTHING_WRITTEN), f"SIGINT at {delay:.2f} s"
        assert table_counts(db, writable=True) == before
        interrupted += 1
    assert interrupted == 8

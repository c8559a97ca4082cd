"""Rule cases are written as an import writes (``audit.testing.build_warehouse`` through the
importers' write functions): a case value a real import refuses is refused, and what a real
import changes on the way in (redaction, normalised params, the newer record of a job) is
changed for a case too."""

from __future__ import annotations

import pytest

from audit.errors import InputError
from audit.testing import build_warehouse


def _build(tmp_path, data: dict):
    wh, _ = build_warehouse(tmp_path / "case.duckdb", data)
    return wh


def test_a_run_time_beyond_the_trackers_years_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"rule case: run a: start_time .* between years 1970"):
        _build(tmp_path, {"runs": [{"run_id": "a", "start": "2301-01-01T00:00:00"}]})


def test_a_sample_outside_the_valid_range_is_refused(tmp_path):
    telemetry = [{"host": "n1", "start": 0, "end": 1, "gpus": 1, "util": {"default": 250}}]
    with pytest.raises(InputError, match=r"utilization 250 is outside 0-100 %"):
        _build(tmp_path, {"telemetry": telemetry})


def test_texts_are_redacted_and_params_normalised_on_the_way_in(tmp_path):
    run = {
        "run_id": "a",
        "user": "ann@example.org",
        "params": {"learning_rate": "1E-5", "bf16": "TRUE"},
        "tags": {"owner": "write to ann@example.org"},
    }
    wh = _build(tmp_path, {"runs": [run]})
    try:
        assert wh.con.execute("SELECT user_id FROM runs").fetchall() == [("ann",)]
        assert wh.con.execute("SELECT value FROM tags WHERE key = 'owner'").fetchall() == [
            ("write to <e-mail removed>",)
        ]
        assert wh.con.execute(
            "SELECT key, value_num, value_norm FROM params ORDER BY key"
        ).fetchall() == [
            ("bf16", None, "true"),
            ("learning_rate", 1e-05, "0.00001"),
        ]
        assert wh.con.execute("SELECT source_id, kind FROM sources").fetchall() == [("s", "mlflow")]
    finally:
        wh.close()


def test_of_two_records_of_a_job_the_newer_is_kept(tmp_path):
    jobs = [
        {"job_id": 7, "state": "RUNNING", "start": 0, "end": 1},
        {"job_id": 7, "state": "COMPLETED", "start": 0, "end": 3},
    ]
    wh = _build(tmp_path, {"jobs": jobs})
    try:
        assert wh.con.execute("SELECT job_id, state, elapsed_s FROM jobs").fetchall() == [
            ("7", "COMPLETED", 3 * 3600)
        ]
        assert wh.con.execute("SELECT count(*) FROM job_nodes").fetchall() == [(1,)]
    finally:
        wh.close()

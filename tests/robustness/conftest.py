"""The corpora's tallies (``tests.helpers.CorpusTally``) go to ``test-artifacts/`` once the
session has run every test it chose, whatever their order."""

from __future__ import annotations

from tests.helpers import REPO, TALLIES


def pytest_sessionfinish(session, exitstatus):
    for tally in TALLIES:
        if tally.complete():
            (REPO / "test-artifacts").mkdir(exist_ok=True)
            (REPO / "test-artifacts" / tally.file_name).write_text(tally.text())

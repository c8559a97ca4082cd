"""IDL003 reads hosts in groups of at most ``SAMPLES_PER_QUERY`` samples (to bound DuckDB's
memory at 80 M samples). A host's stretches depend on its own samples and jobs only, so
any grouping gives the findings of one query over every host: property-tested here with
every host alone in its group against all hosts in one."""

from __future__ import annotations

import itertools
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.rule_registry import get_rule
from audit.testing import run_case

HOSTS = ["a", "b/c", "n1", "z"]

# telemetry long enough to hold idle stretches of 4 h and more, jobs short enough to leave them
up = st.tuples(st.integers(0, 40), st.integers(4, 40)).map(lambda p: (p[0], p[0] + p[1]))
busy = st.tuples(st.integers(0, 60), st.integers(1, 10)).map(lambda p: (p[0], p[0] + p[1]))
telemetry = st.lists(
    st.tuples(st.sampled_from(HOSTS), up, st.integers(1, 8)), min_size=2, max_size=6
)
jobs = st.lists(
    st.tuples(st.sampled_from(HOSTS), busy), min_size=1, max_size=6
)  # IDL003 needs jobs


def _findings(case: dict, workdir, monkeypatch, limit: int) -> list[dict]:
    module = sys.modules[get_rule("IDL003").__module__]
    monkeypatch.setattr(module, "SAMPLES_PER_QUERY", limit)
    result = run_case("IDL003", case, workdir)
    assert result.status == "ok", result.reason
    return [f.as_json() for f in result.findings]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(telemetry=telemetry, jobs=jobs)
def test_any_grouping_of_hosts_finds_the_same_idle_stretches(
    telemetry, jobs, tmp_path_factory, monkeypatch
):
    case = {
        "data": {
            "telemetry": [
                {"host": host, "start": lo, "end": hi, "gpus": gpus, "step_minutes": 10}
                for host, (lo, hi), gpus in telemetry
            ],
            "jobs": [
                {"job_id": n, "host": host, "start": lo, "end": hi}
                for n, (host, (lo, hi)) in enumerate(jobs, start=1)
            ],
        }
    }
    counter = itertools.count()
    work = tmp_path_factory.mktemp("groups")
    together = _findings(case, work / f"w{next(counter)}", monkeypatch, 10**12)
    alone = _findings(case, work / f"w{next(counter)}", monkeypatch, 1)
    assert alone == together


def test_hosts_read_in_separate_groups_each_give_their_stretches(tmp_path, monkeypatch):
    case = {
        "data": {
            "telemetry": [
                {"host": host, "start": 0, "end": 12, "step_minutes": 10} for host in HOSTS
            ],
            "jobs": [{"job_id": 1, "host": "n1", "start": 0, "end": 12}],
        }
    }
    together = _findings(case, tmp_path / "together", monkeypatch, 10**12)
    assert sorted(f["subject"]["host"] for f in together) == ["a", "b/c", "z"]
    assert _findings(case, tmp_path / "alone", monkeypatch, 1) == together

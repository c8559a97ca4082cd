"""The status's attachment of telemetry samples to jobs (``audit status``, the weekly
report's coverage), against the rule as written, over random jobs, hosts and samples."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from audit.status import warehouse_status
from audit.testing import build_warehouse
from tests.helpers import add_samples

T0 = datetime(2026, 11, 16)
CLUSTERS = ["a", "b"]
JOB_IDS = ["1", "2", "3"]
HOSTS = ["n1", "n2"]

_JOBS = st.lists(
    st.tuples(
        st.sampled_from(CLUSTERS),
        st.sampled_from(JOB_IDS),
        st.integers(0, 40),  # start, in 10-minute steps from T0
        st.one_of(st.none(), st.integers(0, 30)),  # length (None: no end, still running)
        st.lists(st.sampled_from(HOSTS), min_size=1, max_size=2, unique=True),
    ),
    max_size=5,
    unique_by=lambda job: (job[0], job[1]),
)
_SAMPLES = st.lists(
    st.tuples(
        st.sampled_from(HOSTS),
        st.sampled_from(["0", "1"]),
        st.integers(0, 60),  # time, in 10-minute steps from T0
        st.one_of(st.none(), st.sampled_from([*JOB_IDS, "99"])),  # the sample's job label
    ),
    min_size=1,
    max_size=12,
)


def _at(steps: int) -> datetime:
    return T0 + timedelta(minutes=10 * steps)


def _expected(jobs, samples) -> dict[str, int]:
    """Per sample: attached when its label names a job or one job held its host then;
    ambiguous when several did; else unattached."""
    counts = {"attached": 0, "unattached": 0, "ambiguous": 0}
    job_ids = {job_id for _, job_id, *_ in jobs}
    for host, _gpu, step, label in samples:
        ts = _at(step)
        holders = {
            (cluster, job_id)
            for cluster, job_id, start, length, hosts in jobs
            if host in hosts and _at(start) <= ts and (length is None or ts < _at(start + length))
        }
        if label in job_ids or len(holders) == 1:
            counts["attached"] += 1
        elif len(holders) > 1:
            counts["ambiguous"] += 1
        else:
            counts["unattached"] += 1
    return counts


@settings(max_examples=40, deadline=None)
@given(_JOBS, _SAMPLES)
def test_each_sample_is_attached_ambiguous_or_unattached_as_the_rule_says(
    tmp_path_factory, jobs, samples
):
    wh, _config = build_warehouse(tmp_path_factory.mktemp("w") / "w.duckdb", {})
    try:
        for cluster, job_id, start, length, hosts in jobs:
            wh.con.execute(
                "INSERT INTO jobs (cluster, job_id, start_time, end_time, gpus) "
                "VALUES (?, ?, ?, ?, 8)",
                [cluster, job_id, _at(start), None if length is None else _at(start + length)],
            )
            for host in hosts:
                wh.con.execute("INSERT INTO job_nodes VALUES (?, ?, ?)", [cluster, job_id, host])
        add_samples(
            wh.con,
            "host, gpu, ts, util_pct, job_label, origin",
            [
                (host, gpu, _at(step), 50.0, label, "nvidia-smi")
                for host, gpu, step, label in samples
            ],
        )
        cluster = warehouse_status(wh)["cluster"]
    finally:
        wh.close()
    got = {kind: cluster[kind] for kind in ("attached", "unattached", "ambiguous")}
    assert got == _expected(jobs, samples)

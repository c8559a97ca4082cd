"""Which windows another job shared hosts with (``usage._shared_hosts``), against the rule
as written, over random jobs, hosts and windows: two clusters with the same job ids,
jobs without a start or an end, zero-length jobs."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.usage import _shared_hosts
from tests.helpers import rolled_back

T0 = datetime(2026, 11, 16)
_JOBS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # cluster
        st.sampled_from(["1", "2", "3", "4"]),  # job id
        st.one_of(st.none(), st.integers(0, 20)),  # start, in hours from T0
        st.one_of(st.none(), st.integers(0, 8)),  # length (None: no end)
        st.lists(st.sampled_from(["n1", "n2", "n3"]), min_size=1, max_size=2, unique=True),
    ),
    max_size=7,
    unique_by=lambda job: (job[0], job[1]),
)


def _at(hours: int | None) -> datetime | None:
    return None if hours is None else T0 + timedelta(hours=hours)


@settings(max_examples=200, deadline=None)
@given(jobs=_JOBS, asked=st.sets(st.integers(0, 6)))
def test_shared_windows_are_those_another_job_held_a_host_of(schema_warehouse, jobs, asked):
    with rolled_back(schema_warehouse.con) as con:
        for cluster, job_id, start, length, hosts in jobs:
            end = None if start is None or length is None else start + length
            con.execute(
                "INSERT INTO jobs (cluster, job_id, start_time, end_time) VALUES (?, ?, ?, ?)",
                [cluster, job_id, _at(start), _at(end)],
            )
            for host in hosts:
                con.execute(
                    "INSERT INTO job_nodes (cluster, job_id, host) VALUES (?, ?, ?)",
                    [cluster, job_id, host],
                )
        # windows: the jobs with a start and an end, as allocations are
        windows = [
            (cluster, job_id, _at(start), _at(start + length), set(hosts))
            for cluster, job_id, start, length, hosts in jobs
            if start is not None and length is not None
        ]
        con.register(
            "audit_windows",
            pl.DataFrame(
                {
                    "key": range(len(windows)),
                    "cluster": [w[0] for w in windows],
                    "job_id": [w[1] for w in windows],
                    "start": [w[2] for w in windows],
                    "end": [w[3] for w in windows],
                },
                schema={
                    "key": pl.Int64,
                    "cluster": pl.String,
                    "job_id": pl.String,
                    "start": pl.Datetime("us"),
                    "end": pl.Datetime("us"),
                },
            ),
        )
        positions = sorted(p for p in asked if p < len(windows))
        expected = set()
        for position in positions:
            cluster, job_id, start, end, hosts = windows[position]
            for o_cluster, o_job, o_start, o_length, o_hosts in jobs:
                o_end = None if o_start is None or o_length is None else o_start + o_length
                if (o_cluster, o_job) == (cluster, job_id) or not hosts & set(o_hosts):
                    continue
                if (
                    o_start is not None
                    and _at(o_start) < end
                    and (o_end is None or _at(o_end) > start)
                ):
                    expected.add(position)

        try:
            assert _shared_hosts(con, positions) == expected
        finally:
            con.unregister("audit_windows")

"""What held a partition during a wait: the partition index finds what a scan of all jobs finds."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.config import load_config
from audit.costs import Facts
from audit.facts.cost_basis import Cost
from audit.facts.jobs import JobFacts
from audit.queue import RunningJobs, Wait

T0 = datetime(2026, 11, 23)


def _every_job_scanned(wait: Wait, facts: Facts) -> dict[str, list[JobFacts]]:
    """The definition, by a scan of every job."""
    out: dict[str, list[JobFacts]] = {}
    for job in facts.jobs:
        if (
            job.gpus <= 0
            or job.key == wait.job.key
            or (job.partition or "unknown") != wait.partition
            or (job.team or "unknown") == wait.team
            or job.start_time is None
            or job.start_time >= wait.job.start_time
            or (job.end_time is not None and job.end_time <= wait.since)
        ):
            continue
        out.setdefault(job.team or "unknown", []).append(job)
    return out


def _job(i, partition, team, gpus, start, length):
    start_time = None if start is None else T0 + timedelta(hours=start)
    end_time = None if start is None or length is None else start_time + timedelta(hours=length)
    return JobFacts(
        cluster="c",
        job_id=str(i),
        name=None,
        user_name=None,
        account=None,
        partition=partition,
        state=None,
        submit_time=None,
        start_time=start_time,
        end_time=end_time,
        elapsed_s=None,
        timelimit_s=None,
        gpus=gpus,
        gpu_type=None,
        hosts=[],
        run_ids=[],
        team=team,
        team_source=None,
        method=None,
        base_model=None,
        cost=Cost("unknown", None, None, None, 0.0, "default", "test"),
    )


job_spec = st.tuples(
    st.sampled_from([None, "a100", "h100"]),
    st.sampled_from([None, "nlp", "vision"]),
    st.integers(0, 2),  # GPUs: zero-GPU jobs never hold a partition
    st.none() | st.integers(0, 8),  # start hour (few, so jobs overlap); None: never started
    st.none() | st.integers(-3, 30),  # length in hours; None: still running; < 0: bogus end
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(job_spec, min_size=1, max_size=30),
    waited=st.lists(st.integers(0, 40), min_size=1, max_size=30),
)
def test_index_finds_what_a_scan_of_every_job_finds(specs, waited):
    jobs = [_job(i, *spec) for i, spec in enumerate(specs)]
    # Facts orders jobs by start, unknown starts last
    jobs.sort(key=lambda j: (j.start_time is None, j.start_time or T0, j.job_id))
    facts = Facts(load_config(None), runs=[], jobs=jobs)
    running = RunningJobs(facts)
    for job, hours in zip(jobs, waited, strict=False):
        if job.start_time is None:
            continue
        since = job.start_time - timedelta(hours=hours)
        wait = Wait(job, since, "Eligible", float(hours))
        assert running.holders(wait) == _every_job_scanned(wait, facts)

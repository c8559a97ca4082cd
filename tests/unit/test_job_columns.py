"""The jobs kept as columns (``audit.facts.jobs``) give what their facts give, one by one.

Spend, queue waits and their sums per team and partition are read from ``Facts.jobs``'
columns; each is checked here against its definition over the jobs' facts (the code
before the columns, kept as the definition), on jobs with every field missing in turn,
and windows bounded, half-open and unbounded."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime, timedelta

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.config import load_config
from audit.costs import Facts
from audit.facts.cost_basis import Cost
from audit.facts.jobs import JobFacts, JobTable
from audit.queue import by_team_and_partition, in_order_sum, waits
from audit.testing import build_warehouse
from audit.usage import UsageIndex
from audit.windows import Window
from tests.helpers import property_examples

T0 = datetime(2026, 11, 23)
# seconds, not hours: a wait of 109,188 s over four jobs is 7.5825 h on the dot, and a
# quotient one unit in the last place off rounds it the other way
seconds_or_none = st.none() | st.integers(-7_200, 150_000)


@st.composite
def jobs(draw) -> list[JobFacts]:
    out = []
    for i in range(draw(st.integers(0, 25))):
        start = draw(seconds_or_none)
        start_time = None if start is None else T0 + timedelta(seconds=start)
        end = draw(seconds_or_none)
        submit, eligible = draw(seconds_or_none), draw(seconds_or_none)
        elapsed = draw(st.none() | st.integers(0, 200_000))
        gpus = draw(st.integers(0, 8))
        price_key = draw(st.sampled_from(["H100", "default (card model unknown)"]))
        cost_hours = elapsed / 3600 if elapsed is not None else None
        out.append(
            JobFacts(
                cluster=draw(st.sampled_from(["c", "d"])),
                job_id=str(i),
                name=None,
                user_name=None,
                account=None,
                partition=draw(st.sampled_from([None, "", "a100", "h100"])),
                state=draw(st.sampled_from([None, "COMPLETED", "RUNNING"])),
                submit_time=None if submit is None else T0 + timedelta(seconds=submit),
                start_time=start_time,
                end_time=None if end is None else T0 + timedelta(seconds=end),
                elapsed_s=elapsed,
                timelimit_s=None,
                gpus=gpus,
                gpu_type=None,
                hosts=[],
                run_ids=[],
                team=draw(st.sampled_from([None, "", "nlp", "vision"])),
                team_source=None,
                method=None,
                base_model=None,
                cost=Cost("slurm", float(gpus), None, cost_hours, 2.5, price_key, "test"),
                eligible_time=None if eligible is None else T0 + timedelta(seconds=eligible),
            )
        )
    # Facts orders jobs by start, unknown starts last
    return sorted(
        out, key=lambda j: (j.start_time is None, j.start_time or T0, j.cluster, j.job_id)
    )


windows = st.sampled_from(
    [
        Window(),
        Window(T0, T0 + timedelta(hours=12)),
        Window(since=T0 + timedelta(hours=5)),
        Window(until=T0 + timedelta(hours=5)),
    ]
)


EXAMPLES = settings(
    max_examples=property_examples(replay=150, explore=2000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _waits_defined(facts: Facts, window: Window) -> list[tuple]:
    out = []
    for job in facts.jobs:
        if job.gpus <= 0 or job.start_time is None or not window.contains(job.start_time):
            continue
        eligible = job.eligible_time
        since, source = (eligible, "Eligible") if eligible else (job.submit_time, "Submit")
        if since is None:
            continue
        hours = max((job.start_time - since).total_seconds(), 0.0) / 3600
        out.append((job, since, source, hours))
    return out


def _by_team_and_partition_defined(found: list[tuple]) -> list[dict]:
    groups: dict[tuple[str, str], list[tuple]] = defaultdict(list)
    for wait in found:
        groups[(wait[0].team or "unknown", wait[0].partition or "unknown")].append(wait)
    rows = []
    for (team, partition), items in groups.items():
        longest = max(items, key=lambda w: w[3])
        rows.append(
            {
                "team": team,
                "partition": partition,
                "jobs": len(items),
                "wait_hours": round(sum(w[3] for w in items), 3),
                "mean_wait_hours": round(sum(w[3] for w in items) / len(items), 3),
                "longest_wait_hours": round(longest[3], 3),
                "longest_job": longest[0].job_id,
                "gpu_hours_waited": round(sum(w[0].gpus * w[3] for w in items), 3),
                "measured_from_submit": sum(1 for w in items if w[2] == "Submit"),
            }
        )
    return sorted(rows, key=lambda r: (-r["gpu_hours_waited"], r["team"], r["partition"]))


@EXAMPLES
@given(made=jobs(), window=windows)
def test_waits_and_their_sums_are_the_facts(made, window):
    facts = Facts(load_config(None), runs=[], jobs=made)
    found = waits(facts, window)
    defined = _waits_defined(facts, window)
    assert len(found) == len(defined)
    for index, (job, since, source, hours) in enumerate(defined):
        wait = found.wait(index)
        assert (wait.job, wait.since, wait.measured_from, wait.hours) == (job, since, source, hours)
    assert by_team_and_partition(found) == _by_team_and_partition_defined(defined)
    totals = found.totals()
    assert totals["jobs"] == len(defined)
    assert totals["gpu_hours"] == sum(job.gpus * hours for job, _, _, hours in defined)
    assert totals["from_submit"] == sum(1 for w in defined if w[2] == "Submit")
    for team, count, hours, gpu_hours, from_submit, first_start in found.by_team():
        mine = [w for w in defined if (w[0].team or "unknown") == team]
        assert count == len(mine)
        assert hours == sum(w[3] for w in mine)
        assert gpu_hours == sum(w[0].gpus * w[3] for w in mine)
        assert from_submit == sum(1 for w in mine if w[2] == "Submit")
        assert first_start == min(w[0].start_time for w in mine)


@EXAMPLES
@given(made=jobs(), window=windows)
def test_spend_of_the_jobs_is_their_costs(made, window):
    facts = Facts(load_config(None), runs=[], jobs=made)
    spent = facts.spend(window)
    paid = [
        job
        for job in facts.jobs
        if job.gpus > 0 and job.elapsed_s is not None and window.contains(job.start_time)
    ]
    assert spent.gpu_hours == [job.cost.gpu_hours for job in paid]
    assert spent.usd == [job.cost.usd for job in paid]
    assert spent.fallback_price == [job.cost.fallback_price for job in paid]
    assert spent.team == [job.team for job in paid]
    assert spent.method == ["none"] * len(paid)  # no runs: nothing attributes a method
    assert spent.has_run == [False] * len(paid)


def _job(i: int) -> JobFacts:
    cost = Cost("slurm", 1.0, None, None, 2.5, "H100", "test")
    return JobFacts(
        "c", str(i), *[None] * 6, T0, None, None, None, 1, None, [], [], *[None] * 4, cost
    )


def test_a_job_is_made_once_and_found_by_key():
    made = [_job(i) for i in range(3)]
    table = JobTable.of(made)
    assert list(table) == made and table[1] is made[1] and table[-1] is made[2]
    assert table.take([2, 0]) == [made[2], made[0]]
    assert table.position("c", "1") == 1 and table.position("c", "9") is None
    assert table.with_job_id("2") == [made[2]]


def test_sums_add_in_row_order_as_python_does():
    # one float sum per team and partition: in another order its last digits differ, and
    # a figure rounded at a boundary would then differ from the findings' own sums
    values = [random.Random(7).random() * 10**k for k in range(-3, 4) for _ in range(2_000)]
    frame = pl.DataFrame({"x": values})
    assert frame.select(in_order_sum("x")).item() == sum(values)
    assert frame.select(pl.col("x").sum()).item() != sum(values)  # the reason it exists
    assert pl.DataFrame({"x": []}, schema={"x": pl.Float64}).select(in_order_sum("x")).item() == 0


def test_a_warehouse_s_jobs_read_as_their_facts_read_them(tmp_path):
    """Through ``Facts.load``: hours to the last digit (polars divides by a constant as a
    product with its reciprocal; these jobs' figures round the other way then), a job
    without a state, an empty partition."""
    waited = [575, 28_157, 35_272, 45_184]  # 7.5825 h on average: on a rounding boundary
    jobs = [
        {"job_id": 1, "gpus": 1, "start": 0, "end": 45_818 / 3600},
        {"job_id": 2, "gpus": 1, "start": 0, "end": 159_136 / 3600, "partition": ""},
        *(
            {"job_id": 10 + i, "gpus": g, "eligible": 0, "start": s / 3600, "end": 30}
            for i, (g, s) in enumerate(zip([4, 1, 2, 1], waited, strict=True))
        ),
        # no usage evidence (as the jobs above), two without a state: one note counts all
        *({"job_id": 100 + i, "host": f"x{i}", "end": 2} for i in range(10)),
        *({"job_id": 200 + i, "state": None, "host": "y", "end": 2} for i in range(2)),
        {"job_id": 300, "max_gpu_util_pct": 50.0, "max_gpu_mem_bytes": 2**30, "end": 2},
    ]
    wh, config = build_warehouse(tmp_path / "w.duckdb", {"jobs": jobs})
    try:
        facts = Facts.load(wh.con, config)
        for job in facts.jobs:
            assert job.cost.hours == job.elapsed_s / 3600
        found = waits(facts, Window())
        defined = _waits_defined(facts, Window())
        assert [found.wait(i).hours for i in range(len(found))] == [w[3] for w in defined]
        assert by_team_and_partition(found) == _by_team_and_partition_defined(defined)
        spent = facts.spend(Window())
        assert spent.usd == [j.cost.usd for j in facts.jobs if j.gpus > 0]
        notes: list[str] = []
        UsageIndex(wh.con, facts).judged(Window(), 0.5, notes)
    finally:
        wh.close()
    # every job but the one with sacct's figure, those without a state too
    assert next(n for n in notes if "no GPU usage evidence" in n).startswith("18 jobs: ")

"""Live policies: which jobs holding GPUs now break one, with the evidence.

``idle`` reads the job's own GPUs in the telemetry (the indices Slurm gave it); the run
policies call their rule (STB001, RED001, DUP001) through ``audit.scans.run_rules`` and
act on the Slurm job a finding's run is linked to. Missing evidence is never a verdict:
a GPU without recent samples, with a gap, or whose index is unknown makes its job
unjudged (a note), not idle.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import polars as pl

from audit.config import Config
from audit.facts.cost_basis import team_of
from audit.facts.prices import gpu_price
from audit.importers.slurm import LiveJobs
from audit.text import listed
from audit.warehouse.frames import execute_on_frame
from audit.warehouse.samples import util_peak
from audit.watch.settings import Policy, WatchSettings
from audit.windows import Window


@dataclass
class LiveJob:
    cluster: str
    job_id: str
    name: str | None
    user: str | None
    account: str | None
    partition: str | None
    team: str | None
    gpus: int
    gpu_type: str | None
    start: datetime | None
    timelimit_s: int | None
    hosts: list[str]

    @property
    def limit_end(self) -> datetime | None:
        if self.start is None or self.timelimit_s is None:
            return None
        return self.start + timedelta(seconds=self.timelimit_s)


@dataclass
class LiveFinding:
    policy: Policy
    job: LiveJob
    key: str  # stable over intervals: policy, job and (run policies) the rule's finding
    message: str  # the evidence in words
    evidence: dict
    since: datetime  # when the condition began (idle since, onset)
    run_id: str | None = None
    usd_per_hour: float | None = None
    price_key: str = ""


@dataclass
class Verdicts:
    findings: list[LiveFinding] = field(default_factory=list)
    cleared: set[str] = field(default_factory=set)  # keys judged with full evidence: no finding
    notes: list[str] = field(default_factory=list)  # jobs not judged, and why
    ran: set[str] = field(default_factory=set)  # run policies whose rule judged every run


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``1.50 h``: a span as people read it."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.2f} h"


def finding_key(*parts: str) -> str:
    return hashlib.sha1("\x1f".join(parts).encode()).hexdigest()[:16]


def live_jobs(con, live: LiveJobs, config: Config) -> list[LiveJob]:
    """The jobs holding an allocation now, with their team (first linked run's team tag,
    then account, then user, as ``[attribution] team_order`` says)."""
    holding = live.jobs.filter(pl.col("job_id").is_in(sorted(live.holding)))
    if not holding.height:
        return []
    tags = _team_tags(con, holding, config.attribution.team_tag)
    hosts: dict[str, list[str]] = {}
    for job_id, host in live.nodes.select("job_id", "host").iter_rows():
        hosts.setdefault(job_id, []).append(host)
    order = list(config.attribution.team_order)
    out = []
    for row in holding.iter_rows(named=True):
        team, _ = team_of(order, tags.get(row["job_id"]), row["account"], row["user_name"])
        out.append(
            LiveJob(
                cluster=row["cluster"],
                job_id=row["job_id"],
                name=row["name"],
                user=row["user_name"],
                account=row["account"],
                partition=row["partition"],
                team=team,
                gpus=row["gpus"] or 0,
                gpu_type=row["gpu_type"],
                start=row["start_time"],
                timelimit_s=row["timelimit_s"],
                hosts=hosts.get(row["job_id"], []),
            )
        )
    return sorted(out, key=lambda j: (j.cluster, _job_order(j.job_id)))


def _team_tags(con, holding: pl.DataFrame, tag: str) -> dict[str, str]:
    rows = con.execute(
        """
        SELECT rj.job_id, min(t.value) FROM run_jobs rj
        JOIN tags t ON t.source_id = rj.source_id AND t.run_id = rj.run_id AND t.key = ?
        WHERE list_contains(?, rj.job_id) GROUP BY rj.job_id
        """,
        [tag, holding["job_id"].to_list()],
    ).fetchall()
    return dict(rows)


def _job_order(job_id: str) -> tuple:
    head = job_id.split("_", 1)[0].split("+", 1)[0]
    return (int(head) if head.isdigit() else 0, job_id)


def covers(policy: Policy, job: LiveJob) -> bool:
    """Every selector the policy names (globs) matches the job; none named: all jobs."""
    for patterns, value in (
        (policy.partitions, job.partition),
        (policy.accounts, job.account),
        (policy.teams, job.team),
        (policy.users, job.user),
    ):
        if patterns and not any(fnmatch.fnmatchcase(value or "", p) for p in patterns):
            return False
    return True


def price(config: Config, job: LiveJob) -> tuple[float, str]:
    per_gpu, key = gpu_price(config, job.gpu_type)
    return per_gpu * job.gpus, key


# -- idle ----------------------------------------------------------------------------------
# Per GPU of a job: its latest sample, and the stretch observed idle up to it: the samples
# after the last busy one (or a reading without utilisation) and from the last gap longer
# than stale_after on (nobody knows what the GPU did in a gap).
# A reading is judged by the highest utilisation it vouches for (a Prometheus bucket's
# maximum, a raw sample's value: audit.warehouse.samples.util_peak), never by a mean.
IDLE_SQL = f"""
WITH s AS (
    SELECT a.job_id, a.host, a.gpu, g.ts, {util_peak("g")} AS util_pct
    FROM incoming_frame a JOIN gpu_samples g ON g.host = a.host AND g.gpu = a.gpu
    WHERE g.ts >= a.since AND g.ts <= $now
), marked AS (
    SELECT *,
           max(CASE WHEN util_pct IS NULL OR util_pct > $util THEN ts END)
               OVER (PARTITION BY job_id, host, gpu) AS last_busy,
           ts - lag(ts) OVER (PARTITION BY job_id, host, gpu ORDER BY ts) > $stale AS after_gap
    FROM s
), bounded AS (
    SELECT *, max(CASE WHEN after_gap THEN ts END) OVER (PARTITION BY job_id, host, gpu) AS resumed
    FROM marked
)
SELECT job_id, host, gpu, max(ts) AS last_ts, last_busy, resumed,
       min(ts) FILTER (WHERE (last_busy IS NULL OR ts > last_busy)
                         AND (resumed IS NULL OR ts >= resumed)) AS idle_since,
       count(*) FILTER (WHERE (last_busy IS NULL OR ts > last_busy)
                          AND (resumed IS NULL OR ts >= resumed)) AS samples,
       max(util_pct) FILTER (WHERE (last_busy IS NULL OR ts > last_busy)
                               AND (resumed IS NULL OR ts >= resumed)) AS idle_max_util
FROM bounded GROUP BY job_id, host, gpu, last_busy, resumed
"""


def judge_idle(
    con,
    policy: Policy,
    jobs: list[LiveJob],
    live: LiveJobs,
    settings: WatchSettings,
    config: Config,
    now: datetime,
    verdicts: Verdicts,
) -> None:
    """Jobs whose every allocated GPU stayed at or under ``util_pct`` for ``warn_after``."""
    horizon = policy.warn_after + max(settings.stale_after, settings.interval) + 60
    stale = timedelta(seconds=settings.stale_after)
    indices: dict[str, list[tuple[str, str]]] = {}
    for job_id, host, gpu in live.gpus.select("job_id", "host", "gpu").iter_rows():
        indices.setdefault(job_id, []).append((host, gpu))
    stored = _stored_indices(con, [j for j in jobs if j.job_id not in indices])
    for job_id, pairs in stored.items():
        indices.setdefault(job_id, pairs)
    holders: dict[str, int] = {}
    for job in jobs:
        for host in set(job.hosts):
            holders[host] = holders.get(host, 0) + 1
    allocation, judged = [], []
    for job in jobs:
        if not covers(policy, job) or job.gpus <= 0 or job.start is None:
            continue
        since = max(job.start, now - timedelta(seconds=horizon))
        pairs = indices.get(job.job_id)
        if pairs:
            allocation += [(job.job_id, h, g, since) for h, g in pairs]
            judged.append((job, pairs, ""))
        elif job.hosts and all(holders.get(h) == 1 for h in job.hosts):
            # indices unknown, but the job is alone on its hosts: every GPU reporting there
            judged.append((job, None, "GPU indices unknown; the job is its hosts' only job"))
            allocation += [(job.job_id, h, None, since) for h in job.hosts]
        else:
            verdicts.notes.append(
                f"{policy.name}: job {job.job_id} not judged: its GPU indices are unknown and "
                "it shares its hosts"
            )
    if not judged:
        return
    frame = pl.DataFrame(
        allocation,
        schema={
            "job_id": pl.String,
            "host": pl.String,
            "gpu": pl.String,
            "since": pl.Datetime("us"),
        },
        orient="row",
    )
    per_gpu = _idle_rows(con, frame, now, policy.util_pct, settings.stale_after)
    for job, pairs, caveat in judged:
        rows = per_gpu.get(job.job_id, {})
        if pairs is None:  # every GPU its hosts report
            per_host = job.gpus / max(len(set(job.hosts)), 1)
            reported = {h: sum(1 for (hh, _g) in rows if hh == h) for h in set(job.hosts)}
            short = [h for h, n in reported.items() if n < per_host]
            if short:
                verdicts.notes.append(
                    f"{policy.name}: job {job.job_id} not judged: {short[0]} reports fewer GPUs "
                    f"than the job holds there, and their indices are unknown"
                )
                continue
            pairs = sorted(rows)
        _judge_job(policy, job, pairs, rows, caveat, now, stale, config, verdicts)


def _stored_indices(con, jobs: list[LiveJob]) -> dict[str, list[tuple[str, str]]]:
    if not jobs:
        return {}
    out: dict[str, list[tuple[str, str]]] = {}
    for job_id, host, gpu in con.execute(
        "SELECT job_id, host, gpu FROM job_gpus WHERE cluster = ? AND list_contains(?, job_id) "
        "ORDER BY job_id, host, gpu",
        [jobs[0].cluster, [j.job_id for j in jobs]],
    ).fetchall():
        out.setdefault(job_id, []).append((host, gpu))
    return out


def _idle_rows(con, frame: pl.DataFrame, now: datetime, util: float, stale: float) -> dict:
    known = frame.filter(pl.col("gpu").is_not_null())
    # a job judged on every GPU of its hosts: each GPU reporting there
    whole = frame.filter(pl.col("gpu").is_null()).drop("gpu")
    if whole.height:
        gpus = execute_on_frame(
            con,
            "SELECT DISTINCT k.job_id, g.host, g.gpu, k.since FROM incoming_frame k "
            "JOIN gpu_series g ON g.host = k.host AND g.run_id IS NULL",
            whole,
        ).pl()
        known = pl.concat([known, gpus.select(known.columns).cast(known.schema)])
    out: dict[str, dict] = {}
    for (
        job_id,
        host,
        gpu,
        last_ts,
        last_busy,
        resumed,
        idle_since,
        samples,
        idle_max,
    ) in _idle_query(con, known, now, util, stale):
        out.setdefault(job_id, {})[(host, gpu)] = {
            "last_ts": last_ts,
            "last_busy": last_busy,
            "resumed": resumed,
            "idle_since": idle_since,
            "samples": samples,
            "idle_max_util": idle_max,
        }
    return out


def _idle_query(con, frame: pl.DataFrame, now: datetime, util: float, stale: float) -> list[tuple]:
    # a relation over a frame takes no bound parameters: the values are this module's own
    # (a clock reading and validated numbers), written as literals
    sql = (
        IDLE_SQL.replace("$now", f"TIMESTAMP '{now:%Y-%m-%d %H:%M:%S.%f}'")
        .replace("$util", repr(float(util)))
        .replace("$stale", f"INTERVAL {int(stale * 1e6)} MICROSECONDS")
    )
    return execute_on_frame(con, sql, frame).fetchall()


def _judge_job(policy, job, pairs, rows, caveat, now, stale, config, verdicts) -> None:
    key = finding_key(policy.name, job.cluster, job.job_id)
    missing = [f"{h}/{g}" for h, g in pairs if (h, g) not in rows]
    if missing:
        verdicts.notes.append(
            f"{policy.name}: job {job.job_id} not judged: no telemetry from GPU "
            + listed(missing, 1)
        )
        return
    late = [(h, g) for h, g in pairs if now - rows[(h, g)]["last_ts"] > stale]
    if late:
        h, g = late[0]
        age = (now - rows[(h, g)]["last_ts"]).total_seconds() / 60
        verdicts.notes.append(
            f"{policy.name}: job {job.job_id} not judged: telemetry of GPU {h}/{g} stopped "
            f"arriving {age:.0f} min ago"
        )
        return
    idle_since = [rows[p]["idle_since"] for p in pairs]
    if any(since is None for since in idle_since):
        verdicts.cleared.add(key)  # a GPU is busy at its latest sample
        return
    binding = max(pairs, key=lambda p: rows[p]["idle_since"])
    since = rows[binding]["idle_since"]
    measured_to = min(rows[p]["last_ts"] for p in pairs)
    idle_for = (measured_to - since).total_seconds()
    if idle_for < policy.warn_after:
        last_busy, resumed = rows[binding]["last_busy"], rows[binding]["resumed"]
        if last_busy is not None and (resumed is None or last_busy >= resumed):
            verdicts.cleared.add(key)  # busy a moment ago: whatever was found has cleared
        else:
            verdicts.notes.append(
                f"{policy.name}: job {job.job_id} not judged yet: observed idle only since "
                f"{since:%H:%M:%S} UTC, when its telemetry began or resumed after a gap"
            )
        return
    usd, price_key = price(config, job)
    peak = max(rows[p]["idle_max_util"] or 0.0 for p in pairs)
    samples = sum(rows[p]["samples"] for p in pairs)
    verdicts.findings.append(
        LiveFinding(
            policy=policy,
            job=job,
            key=key,
            message=(
                f"job {job.job_id} ({job.name or 'unnamed'}) has held {job.gpus} GPU"
                f"{'s' if job.gpus != 1 else ''} at ≤ {policy.util_pct:g} % utilisation for "
                f"{duration(idle_for)} (since {since:%Y-%m-%d %H:%M:%S} UTC; highest reading "
                f"{peak:g} %; threshold {duration(policy.warn_after)})"
            ),
            evidence={
                "gpus": [f"{h}/{g}" for h, g in pairs],
                "idle_since": since,
                "measured_until": measured_to,
                "idle_hours": round(idle_for / 3600, 4),
                "highest_util_pct": peak,
                "util_threshold_pct": policy.util_pct,
                "samples": samples,
                "caveat": caveat or None,
                "source": "GPU telemetry of the job's own GPUs",
            },
            since=since,
            usd_per_hour=usd,
            price_key=price_key,
        )
    )


# -- run policies (STB001, RED001, DUP001) -------------------------------------------------
def judge_runs(
    con,
    policies: list[Policy],
    jobs: list[LiveJob],
    settings: WatchSettings,
    config: Config,
    now: datetime,
    verdicts: Verdicts,
) -> None:
    """Each rule once over the runs of the look-back window; its findings' runs mapped to
    the live jobs they are linked to."""
    from audit.rule_registry import all_rules
    from audit.scans import run_rules

    if not policies or not jobs:
        return
    by_job = {j.job_id: j for j in jobs}
    runs_to_jobs: dict[str, list[str]] = {}
    for run_id, job_id in con.execute(
        "SELECT run_id, job_id FROM run_jobs WHERE cluster = ? AND list_contains(?, job_id) "
        "ORDER BY run_id, job_id",
        [jobs[0].cluster, sorted(by_job)],
    ).fetchall():
        runs_to_jobs.setdefault(run_id, []).append(job_id)
    if not runs_to_jobs:
        return
    rules = all_rules()
    codes = sorted({p.rule for p in policies if p.rule in rules})
    window = Window(since=now - timedelta(seconds=settings.lookback), until=None)
    results = run_rules(con, _at_onset(config), [rules[c] for c in codes], window)
    by_rule = {r.rule: r for r in results}
    for policy in policies:
        result = by_rule.get(policy.rule)
        if result is None:
            continue
        if result.status != "ok":
            verdicts.notes.append(f"{policy.name}: {policy.rule} {result.status}: {result.reason}")
            continue
        verdicts.ran.add(policy.name)
        for finding in result.findings:
            for run_id in _acted_runs(finding):
                for job_id in runs_to_jobs.get(run_id, []):
                    job = by_job[job_id]
                    if not covers(policy, job):
                        continue
                    usd, price_key = price(config, job)
                    verdicts.findings.append(
                        LiveFinding(
                            policy=policy,
                            job=job,
                            key=finding_key(policy.name, finding.id, job.cluster, job_id),
                            message=f"job {job_id}: {finding.message}",
                            evidence={"rule": finding.rule, **finding.evidence},
                            since=finding.happened_at or now,
                            run_id=run_id,
                            usd_per_hour=usd,
                            price_key=price_key,
                        )
                    )


def _at_onset(config: Config) -> Config:
    """The site's rule settings, but STB001 without its reaction grace: a watch reacts at
    the onset (its policy's cancel_after is the time given to react)."""
    from audit.rule_registry import get_rule

    if "grace_hours" not in get_rule("STB001").thresholds:
        return config
    return config.with_rule_settings("STB001", grace_hours=0.0)


def _acted_runs(finding) -> list[str]:
    """The runs a finding is about: a DUP001 finding's repeats (the original is not the
    waste), any other finding's run."""
    if finding.rule == "DUP001":
        return [r["run_id"] for r in finding.evidence.get("runs", []) if r.get("role") == "repeat"]
    run_id = finding.subject.get("run_id")
    return [run_id] if run_id else []

"""How busy an allocation's GPUs were, from the best evidence available (the *usage ladder*).

An allocation is a Slurm GPU job, or a run outside Slurm whose tracker logged GPU system
metrics (its GPUs chosen among the machine's by ``audit.costs``' ladder: its device list,
else the N most active of its world size or parallelism, never a GPU another tenant held
at constant memory and 0 % all along). Its usage comes from the first source that has
data for it:

1. ``telemetry``: nvidia-smi, DCGM or Prometheus samples of the job's hosts during the job
   (per GPU, over time; ambiguous when another job shared a host and the GPUs cannot be
   told apart);
2. ``tracker``: the run's own GPU system metrics (MLflow ``system/gpu_N_*``) — per GPU,
   over time;
3. ``jobstats``: the per-GPU summary Princeton's jobstats stores in sacct ``AdminComment``
   (``JS1:`` + base64 of gzipped JSON) — per GPU, means over the job;
4. ``sacct``: ``TRESUsageInMax`` ``gres/gpuutil``/``gres/gpumem`` rolled up from the job's
   steps — one figure for all the job's GPUs: the largest utilisation any task reported.

Each source says what it can prove: a ``sacct`` maximum of 12 % proves no task of the job
was ever seen above 12 % (so the mean was at most 12 %), but it cannot tell one idle GPU
among busy ones; a rule that needs per-GPU data records a note instead of a finding.
jobstats comes before sacct because its figures are per GPU and time-averaged.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from heapq import merge
from itertools import islice

import polars as pl

from audit.costs import Facts, RunFacts
from audit.facts.cost_basis import Cost
from audit.facts.jobs import JobFacts
from audit.heap import long_lived
from audit.text import listed
from audit.warehouse.intervals import materialised, sample_hour, window_hours
from audit.warehouse.samples import (
    in_window,
    logged_by_a_run,
    may_belong_to,
    resolutions_text,
    util_mean,
    util_peak,
)
from audit.windows import Window, started_in

JOBSTATS_PREFIX = "JS1:"
JOBSTATS_MAX_BYTES = 1_000_000  # a summary is a few KB; refuse to inflate anything larger

SOURCE_LABELS = {
    "telemetry": "GPU telemetry (nvidia-smi/DCGM/Prometheus)",
    "tracker": "tracker system metrics",
    "jobstats": "jobstats summary in sacct AdminComment",
    "sacct": "sacct TRESUsageInMax gres/gpuutil and gres/gpumem",
}
PROVES = {
    "telemetry": "per-GPU utilisation and memory over the allocation's life",
    "tracker": "per-GPU utilisation and memory over the run's life, as the tracker sampled it",
    "jobstats": "per-GPU mean utilisation and peak memory over the job",
    "sacct": (
        "the largest GPU utilisation and memory any task of the job reported: an upper bound "
        "for every GPU's mean, with no per-GPU detail"
    ),
}


@dataclass
class GpuActivity:
    host: str
    gpu: str
    util: float  # mean utilisation, %
    mem: float | None  # peak memory used, MiB
    mem_total: float | None  # capacity, MiB
    samples: int = 0
    util_max: float | None = None  # highest utilisation seen, %
    mem_min: float | None = None  # least memory used, MiB

    @property
    def still(self) -> bool:
        """Never busy and memory that did not move: not the work of the run sampled."""
        moved = (self.mem or 0) - (self.mem_min if self.mem_min is not None else (self.mem or 0))
        return (self.util_max or 0) <= 0 and moved < max(256, 0.02 * (self.mem_total or 0))

    @property
    def held_by_another(self) -> bool:
        """Still, with memory held (a process of another tenant on a shared machine)."""
        return self.still and (self.mem or 0) >= 256


@dataclass
class Usage:
    status: str  # ok | no data | ambiguous
    source: str = ""  # telemetry | tracker | jobstats | sacct
    gpus: int = 0
    per_gpu: list[GpuActivity] | None = None  # None: the source has one figure for the job
    mean_util: float | None = None  # mean over the GPUs and the allocation's life
    util_ceiling: float | None = None  # no GPU's mean utilisation was above this
    peak_mem_mib: float | None = None  # the most memory one GPU used
    mem_total_mib: float | None = None
    samples: int = 0
    model: str | None = None
    hosts: list[str] = field(default_factory=list)
    why: str = ""  # for status != ok: what is missing, for this allocation
    reason: str = ""  # ``why`` without the allocation's own details: notes group by it
    # how a run's GPUs were told from the rest of its machine's (tracker samples list all)
    chosen_from: str | None = None
    resolution: str = ""  # what the samples are: "5-minute buckets from Prometheus"

    @property
    def label(self) -> str:
        return SOURCE_LABELS.get(self.source, self.source)

    @property
    def proves(self) -> str:
        return PROVES.get(self.source, "")

    def busy(self, threshold: float) -> list[GpuActivity]:
        return [g for g in self.per_gpu or [] if g.util > threshold]

    def evidence(self) -> dict:
        """What the figures stand on, for a finding's evidence block."""
        out: dict = {"usage_source": self.label, "usage_source_proves": self.proves}
        if self.per_gpu is not None:
            out["per_gpu"] = [
                {"host": g.host, "gpu": g.gpu, "mean_util_pct": round(g.util, 2)}
                for g in self.per_gpu
            ]
        else:
            out["max_util_pct"] = self.util_ceiling
            if self.peak_mem_mib is not None:
                out["max_gpu_memory_mib"] = round(self.peak_mem_mib, 1)
        if self.samples:
            out["samples"] = self.samples
        if self.chosen_from:
            out["gpus_of_the_run"] = self.chosen_from
        if self.resolution:
            out["resolution"] = self.resolution
        return out


@dataclass(slots=True)
class Allocation:
    """GPUs held for a while: a Slurm job, or a run outside Slurm with GPU system metrics."""

    kind: str  # job | run
    key: str  # its key in the usage computed for it: "job\0cluster\0id" | "run\0source\0id"
    gpus: int
    start: datetime
    end: datetime
    cost: Cost
    team: str | None
    method: str | None
    user: str | None
    job: JobFacts | None = None
    run: RunFacts | None = None
    position: int | None = None  # a job's place in ``Facts.jobs``

    @property
    def hours(self) -> float:
        if self.job is not None and self.job.hours is not None:
            return self.job.hours
        return max((self.end - self.start).total_seconds(), 0.0) / 3600

    @property
    def name(self) -> str | None:
        return self.job.name if self.job else (self.run.name if self.run else None)

    # the subject and label are made when a finding or note asks: a dict and a text per
    # allocation cost 0.3 GB at a million jobs, for the few that get one
    @property
    def subject(self) -> dict:
        return (self.job or self.run).subject()

    @property
    def label(self) -> str:
        return f"job {self.job.job_id}" if self.job is not None else f"run {self.run.name!r}"


def _allocation(
    owner, key: str, gpus: int, end, user: str | None, position: int | None = None
) -> Allocation:
    """The GPUs a job (or a run outside Slurm) held: its cost and attribution."""
    kind = "job" if isinstance(owner, JobFacts) else "run"
    return Allocation(
        kind=kind,
        key=key,
        gpus=gpus,
        start=owner.start_time,
        end=end,
        cost=owner.cost,
        team=owner.team,
        method=owner.method,
        user=user,
        position=position,
        **{kind: owner},
    )


def _job_allocation(job: JobFacts, position: int) -> Allocation:
    key = f"job\0{job.cluster}\0{job.job_id}"
    return _allocation(job, key, job.gpus, job.end_time, job.user_name, position)


class UsageIndex:
    """Allocations and their usage, computed once per scan and shared by the rules.

    A job that can have no usage evidence (none of its time in the telemetry's span, no
    jobstats summary, no sacct figure) is kept as a row of ``Facts.jobs``, not an
    ``Allocation``: at a million jobs over two years and a week of telemetry, 96 % of
    them, each judged "no data" and counted in a note. Its facts are made if a note
    names it."""

    def __init__(self, con, facts: Facts):
        self.con = con
        self.facts = facts
        self._usage: dict[str, Usage] = {}  # by allocation key, computed when first asked
        self._allocations: list[Allocation] | None = None
        self._by_kind: list[tuple[list[Allocation], list[datetime]]] = []
        # the jobs without evidence: position, start, hours, whether still running
        self._unevidenced = pl.DataFrame()
        # judged pairs and notes by (window, min_hours): the four utilisation rules ask
        # for the same ones (each a pass over 100,000 allocations at L)
        self._judged: dict[tuple[Window, float], tuple[list, list[str]]] = {}

    def _allocated(self) -> list[Allocation]:
        """Jobs' allocations by start, then runs' by start (each as ``Facts`` orders them),
        but the jobs without evidence (``_unevidenced``)."""
        if self._allocations is None:
            with long_lived():
                self._allocations = self._build_allocations()
            jobs = [a for a in self._allocations if a.kind == "job"]
            runs = self._allocations[len(jobs) :]
            self._by_kind = [(part, [a.start for a in part]) for part in (jobs, runs)]
        return self._allocations

    def has_allocations(self) -> bool:
        """Whether any GPU job or run with GPU system metrics was imported."""
        return bool(self._allocated()) or not self._unevidenced.is_empty()

    def has_evidence(self) -> bool:
        """Whether any usage evidence was imported at all (for any allocation or host)."""
        if self.con.execute("SELECT EXISTS (SELECT 1 FROM gpu_samples)").fetchall()[0][0]:
            return True
        usage = self._usage_of(self._allocated())
        return any(u.status != "no data" for u in usage.values())

    def judged(
        self, window: Window, min_hours: float, notes: list[str]
    ) -> list[tuple[Allocation, Usage]]:
        """(allocation, usage) for every allocation started in the window that ran at least
        ``min_hours`` and has usage data; the others become notes (``Unjudged``)."""
        if (window, min_hours) not in self._judged:
            self._judged[window, min_hours] = self._judge(window, min_hours)
        pairs, unjudged_notes = self._judged[window, min_hours]
        notes.extend(unjudged_notes)
        return list(pairs)

    def _judge(self, window: Window, min_hours: float) -> tuple[list, list[str]]:
        self._allocated()
        chosen = [
            a
            for part, starts in self._by_kind
            for a in started_in(part, starts, window)
            if a.hours >= min_hours
        ]
        usage = self._usage_of(chosen)
        out = []
        unjudged = Unjudged(self._without_evidence)
        for alloc in chosen:
            use = usage[alloc.key]
            if use.status == "ok":
                out.append((alloc, use))
            else:
                unjudged.add(use.reason or use.why, alloc, use)
        unevidenced = self._unevidenced.filter(
            window.holds("start_time") & (pl.col("hours") >= min_hours)
        )
        for running, reason in ((False, NO_EVIDENCE), (True, NO_EVIDENCE + STILL_RUNNING)):
            positions = unevidenced.filter(pl.col("running") == running)["position"]
            unjudged.add_jobs(reason, positions.to_list())
        return out, unjudged.notes()

    # -- building ------------------------------------------------------------------------
    def _build_allocations(self) -> list[Allocation]:
        table = self.facts.jobs
        # a sample counts for a window when its time lies in it (``in_window``): a job
        # outside the samples' span has none
        first, last = self.con.execute("SELECT min(ts), max(ts) FROM gpu_samples").fetchall()[0]
        sampled = (
            (pl.col("start_time") <= last) & (pl.col("end_time") > first)
            if first is not None
            else pl.lit(False)
        )
        # what ``_jobstats_usage`` and ``_sacct_usage`` may read
        evidence = (
            sampled
            | pl.col("admin_comment").is_not_null()
            | pl.col("max_gpu_util_pct").is_not_null()
        )
        held = (
            table.frame.lazy()
            .filter(
                (pl.col("gpus") > 0)
                & pl.col("start_time").is_not_null()
                & pl.col("end_time").is_not_null()
            )
            .select(
                "position",
                "start_time",
                "hours",
                evidence=evidence,
                # a job without a state is not running (``job.state == "RUNNING"``)
                running=(pl.col("state") == "RUNNING").fill_null(False),
            )
            .collect()
        )
        self._unevidenced = held.filter(~pl.col("evidence")).drop("evidence")
        positions = held.filter(pl.col("evidence"))["position"].to_list()
        out = [
            _job_allocation(job, position)
            for position, job in zip(positions, table.take(positions), strict=True)
        ]
        for run in self.facts.runs:
            if (
                run.job_id is not None
                or not run.sampled_gpus
                or not run.cost.gpus
                or run.start_time is None
                or run.last_seen is None
            ):
                continue
            key = f"run\0{run.source_id}\0{run.run_id}"
            out.append(_allocation(run, key, int(run.cost.gpus), run.last_seen, run.user_id))
        return out

    def _without_evidence(self, position: int) -> tuple[Allocation, Usage]:
        """The allocation and "no data" usage of a job of ``_unevidenced`` (a note names it)."""
        alloc = _job_allocation(self.facts.jobs[position], position)
        return alloc, _no_evidence(alloc.gpus, alloc.job.hosts, alloc.job.state == "RUNNING")

    def _usage_of(self, wanted: list[Allocation]) -> dict[str, Usage]:
        """The usage of ``wanted`` (and of every allocation asked for before): one
        allocation's usage does not depend on the others', so a weekly scan computes only
        its week's and the next scan of the same process reuses them."""
        allocations = [a for a in wanted if a.key not in self._usage]
        if allocations:
            with long_lived():
                self._usage.update(self._compute(allocations))
        return self._usage

    def _compute(self, allocations: list[Allocation]) -> dict[str, Usage]:
        # a sample counts for a window when its time lies in it (``in_window``): a job
        # outside the samples' span has none, and is not sent to the query (at a million
        # jobs over two years and a week of telemetry, 99 % of them; 8 CPU-s)
        first, last = self.con.execute("SELECT min(ts), max(ts) FROM gpu_samples").fetchall()[0]
        jobs = [
            a
            for a in allocations
            if a.kind == "job" and first is not None and a.start <= last and a.end > first
        ]
        sampled = gpu_usage(
            self.con,
            [
                {
                    "key": a.key,
                    "cluster": a.job.cluster,
                    "job_id": a.job.job_id,
                    "gpus": a.gpus,
                    "start": a.start,
                    "end": a.end,
                    "hosts": a.job.hosts,
                }
                for a in jobs
            ],
            unsampled=False,
        )
        runs = {a.key: a for a in allocations if a.kind == "run"}
        tracked = {
            key: _the_runs_gpus(runs[key], use)
            for key, use in _run_system_metrics(self.con, list(runs.values())).items()
        }
        out = {}
        # jobs without evidence on the same hosts share one "no data" usage: at a million
        # jobs, most outside the telemetry's span, one each held 0.3 GB of equal texts
        no_evidence: dict[tuple, Usage] = {}
        for alloc in allocations:
            key = alloc.key
            if alloc.kind == "run":
                out[key] = tracked.get(key) or Usage(
                    "no data",
                    why="no GPU system metrics in the run's history",
                    reason="no GPU system metrics in their histories",
                )
                continue
            use = sampled.get(key)
            if use is not None and use.status == "ok":
                out[key] = use
                continue
            fallback = _jobstats_usage(alloc.job) or _sacct_usage(alloc.job)
            if fallback is not None:
                out[key] = fallback
            elif use is not None and use.status == "ambiguous":
                out[key] = use
            else:
                running = alloc.job.state == "RUNNING"
                shared = (alloc.gpus, running, *alloc.job.hosts)
                if shared not in no_evidence:
                    no_evidence[shared] = _no_evidence(alloc.gpus, alloc.job.hosts, running)
                out[key] = no_evidence[shared]
        return out


NO_EVIDENCE = (
    "no GPU usage evidence: no telemetry for their hosts, no tracker system metrics, "
    "no jobstats summary, no sacct gres/gpuutil"
)
STILL_RUNNING = " (the job is still running)"


def _no_evidence(gpus: int, hosts: list[str], running: bool) -> Usage:
    still = STILL_RUNNING if running else ""
    return Usage(
        "no data",
        gpus=gpus,
        hosts=hosts,
        why=(
            f"no GPU usage evidence: no telemetry for its hosts ({', '.join(hosts) or 'unknown'}),"
            " no tracker system metrics, no jobstats summary, no sacct gres/gpuutil" + still
        ),
        reason=NO_EVIDENCE + still,
    )


NOTE_SUBJECTS = 10  # up to this many allocations with one reason get a note each
NOTE_EXAMPLES = 5  # a note for more names this many of them
_AFTER_JOBS = float("inf")  # a run's place: after every job, as ``UsageIndex`` orders them


class Unjudged:
    """The allocations a rule could not judge, by reason, each with its own note.

    ``notes()`` gives each its note, or, for a reason shared by more than
    ``NOTE_SUBJECTS`` allocations, one note with their count and the first few: a note per
    job for 90,000 jobs without telemetry is read by nobody and was most of a scan's
    stored size (56 MB at 100,000 jobs). Jobs may be added by their place in ``Facts.jobs``
    alone (``add_jobs``); ``made`` gives the allocation and usage of one a note names.
    Notes and their examples come in the allocations' order: jobs by place, then runs.
    """

    def __init__(self, made: Callable[[int], tuple[Allocation, Usage]] | None = None) -> None:
        self._made = made
        # per reason: (place, order added, allocation, usage, note); jobs by place alone
        self._by_reason: dict[str, list[tuple]] = {}
        self._jobs_by_reason: dict[str, list[int]] = {}

    def add(self, reason: str, alloc: Allocation, use: Usage, note: str | None = None) -> None:
        """``note``: the allocation's own note, by default its label and ``use.why`` (made
        only if the reason is shared by few enough allocations to list them one by one)."""
        group = self._by_reason.get(reason)
        if group is None:
            group = self._by_reason[reason] = []
        place = _AFTER_JOBS if alloc.position is None else alloc.position
        group.append((place, len(group), alloc, use, note))

    def add_jobs(self, reason: str, positions: list[int]) -> None:
        """Jobs by their place in ``Facts.jobs``, ascending, that share ``reason``."""
        if positions:
            self._jobs_by_reason.setdefault(reason, []).extend(positions)

    def notes(self) -> list[str]:
        first = {}
        for reason, group in self._by_reason.items():
            first[reason] = group[0][:2]
        for reason, positions in self._jobs_by_reason.items():
            first[reason] = min(first.get(reason, (_AFTER_JOBS, 0)), (positions[0], -1))
        notes = []
        for reason in sorted(first, key=first.get):
            group = self._by_reason.get(reason, [])
            positions = self._jobs_by_reason.get(reason, [])
            count = len(group) + len(positions)
            shown = NOTE_SUBJECTS if count <= NOTE_SUBJECTS else NOTE_EXAMPLES
            ordered = merge(group, ((p, -1, None, None, None) for p in positions))
            examples = [self._entry(item) for item in islice(ordered, shown)]
            if count <= NOTE_SUBJECTS:
                notes.extend(
                    note if note is not None else f"{alloc.label}: {use.why}"
                    for alloc, use, note in examples
                )
                continue
            named = ", ".join(
                f"{alloc.label} ({listed(use.hosts, 3)})" if use.hosts else alloc.label
                for alloc, use, _ in examples
            )
            runs = sum(1 for _, _, alloc, _, _ in group if alloc.kind == "run")
            notes.append(
                f"{_allocations_counted(count - runs, runs)}: {reason}; for example {named} "
                f"and {count - NOTE_EXAMPLES:,} more"
            )
        return notes

    def _entry(self, item: tuple) -> tuple[Allocation, Usage, str | None]:
        place, _, alloc, use, note = item
        if alloc is None:
            alloc, use = self._made(place)
        return alloc, use, note


def _allocations_counted(jobs: int, runs: int) -> str:
    parts = [
        f"{n:,} {kind}{'' if n == 1 else 's'}" for n, kind in ((jobs, "job"), (runs, "run")) if n
    ]
    return " and ".join(parts)


# the fields of ``gpu_usage``'s per-GPU rows (KEY: the window's position; TRACKER: whether
# the samples are the tracker's system metrics, else telemetry; LABELLED: whether the
# exporter labelled them with the window's job; ORIGIN, BUCKET_S, BUCKETED: what they are)
KEY, TRACKER, HOST, GPU, UTIL, MEM, MEM_TOTAL, SAMPLES, MODEL = range(9)
PEAK, LABELLED, ORIGIN, BUCKET_S, BUCKETED = range(9, 14)


def gpu_usage(con, windows: list[dict], unsampled: bool = True) -> dict[str, Usage]:
    """Per window (key, cluster, job_id, gpus, start, end, hosts: the job's, sorted): the
    activity of the job's GPUs from samples of its hosts, telemetry first, else the
    tracker's system metrics. A window without samples gets a "no data" usage, or with
    ``unsampled`` false none (a caller with other evidence to try words its own).

    Telemetry is per host; a job owns the samples of its hosts inside its allocation when
    no other job ran on the same host at the same time (else: ``ambiguous``), or when its
    exporter labelled them with the job (then the job's labelled GPUs are its own, and
    samples labelled with another job never are). When a job
    holds fewer GPUs than the host has, its GPUs are taken to be the busiest ones there
    (the scheduler's GPU indices are not in sacct): this can only understate idleness.
    """
    if not windows:
        return {}
    # by column: a dict per row cost 0.3 s at 100,000 windows. Each window is keyed in SQL by
    # its position: the per-GPU grouping hashes an integer, not the window's key text
    # (0.70 -> 0.60 s at L)
    frame = pl.DataFrame(
        {
            "key": range(len(windows)),
            **{k: [w[k] for w in windows] for k in ("cluster", "job_id", "gpus", "start", "end")},
        },
        schema={
            "key": pl.Int64,
            "cluster": pl.String,
            "job_id": pl.String,
            "gpus": pl.Int64,
            "start": pl.Datetime("us"),
            "end": pl.Datetime("us"),
        },
    )
    con.register("audit_windows", frame)
    try:
        with materialised(con, "audit_window_hours", window_hours("audit_windows")) as hours:
            # tuples, not dicts: 100,000s of rows at L (their fields: KEY .. MODEL)
            per_gpu = con.execute(
                f"""
                SELECT w.key, {logged_by_a_run("s")} AS tracker,
                       s.host, s.gpu, avg({util_mean("s")}) AS util, max(s.mem_used_mib) AS mem,
                       max(s.mem_total_mib) AS mem_total, count(*) AS samples,
                       any_value(s.model) AS model, max({util_peak("s")}) AS peak,
                       bool_or(s.job_label IS NOT NULL) AS labelled, min(s.origin) AS origin,
                       max(s.bucket_s) AS bucket_s, count(s.bucket_s) AS bucketed
                FROM {hours} w
                JOIN gpu_samples s ON s.host = w.host AND {sample_hour("s.ts")} = w.hour
                     AND {in_window("s", "w.lo", "w.hi")} AND {may_belong_to("s", "w.job_id")}
                WHERE s.util_pct IS NOT NULL AND NOT isnan(s.util_pct)
                GROUP BY ALL ORDER BY w.key, tracker DESC, s.host, s.gpu
                """
            ).fetchall()
        by_position: dict[int, dict[str, list[tuple]]] = {}
        for row in per_gpu:
            source = "tracker" if row[TRACKER] else "telemetry"
            by_position.setdefault(row[KEY], {}).setdefault(source, []).append(row)
        # Whether another job shared a window's hosts decides only between a window's
        # telemetry GPUs when its hosts reported more than it holds: asked for those
        # windows alone (a self-join of every job's hosts cost 0.9 s at 100,000 jobs)
        undecided = [
            position
            for position, sources in by_position.items()
            if len(sources.get("telemetry", ())) > windows[position]["gpus"]
        ]
        shared = _shared_hosts(con, undecided)
    finally:
        con.unregister("audit_windows")
    out = {}
    for position, w in enumerate(windows):
        sources = by_position.get(position, {})
        host_list = w["hosts"]
        source = "telemetry" if "telemetry" in sources else "tracker"
        rows = sources.get(source, [])
        labelled = [r for r in rows if r[LABELLED]]
        if labelled:  # the exporter says which GPUs were the job's: the others were not
            rows = labelled
        if not rows:
            if not unsampled:
                continue
            out[w["key"]] = Usage(
                "no data",
                gpus=w["gpus"],
                hosts=host_list,
                why=f"no GPU telemetry for its hosts ({', '.join(host_list) or 'unknown'})",
                reason="no GPU telemetry for their hosts",
            )
            continue
        if not labelled and source == "telemetry" and position in shared and len(rows) > w["gpus"]:
            out[w["key"]] = Usage(
                "ambiguous",
                source,
                w["gpus"],
                hosts=host_list,
                samples=sum(r[SAMPLES] for r in rows),
                why=(
                    f"ambiguous: another job shared its hosts ({', '.join(host_list)}) and "
                    "the telemetry cannot tell the jobs' GPUs apart"
                ),
                reason=(
                    "ambiguous: other jobs shared their hosts and the telemetry cannot tell "
                    "the jobs' GPUs apart"
                ),
            )
            continue
        chosen = sorted(rows, key=lambda r: (-(r[UTIL] or 0), r[HOST], r[GPU]))[: w["gpus"]]
        activity = sorted(
            (
                GpuActivity(
                    r[HOST],
                    r[GPU],
                    float(r[UTIL] or 0.0),
                    r[MEM],
                    r[MEM_TOTAL],
                    r[SAMPLES],
                    util_max=r[PEAK],
                )
                for r in chosen
            ),
            key=lambda g: (g.host, g.gpu),
        )
        use = _from_activity(source, w["gpus"], activity, host_list, rows[0][MODEL])
        use.resolution = resolutions_text(
            pair
            for r in chosen
            for pair in (
                [(r[ORIGIN], r[BUCKET_S] if r[BUCKETED] else None)]
                + ([(r[ORIGIN], None)] if 0 < r[BUCKETED] < r[SAMPLES] else [])
            )
        )
        out[w["key"]] = use
    return out


def _shared_hosts(con, positions: list[int]) -> set[int]:
    """Of the windows at ``positions`` (of the registered ``audit_windows``), those whose
    hosts another job held during the window.

    The other jobs are first cut to those overlapping any of these windows: joined to the
    jobs of every host first, as DuckDB chose for a week's windows, 1.1 s at L, 0.04 s cut.
    """
    if not positions:
        return set()
    return {
        position
        for (position,) in con.execute(
            """
            WITH mine AS (
                SELECT w.key, w.start, w."end", a.host, a.cluster, a.job_id
                FROM audit_windows w
                JOIN job_nodes a ON a.cluster = w.cluster AND a.job_id = w.job_id
                WHERE w.key IN (SELECT unnest(CAST(? AS BIGINT[])))
            ),
            span AS (SELECT min(start) AS lo, max("end") AS hi FROM mine),
            others AS (
                SELECT b.host, b.cluster, b.job_id, o.start_time,
                       coalesce(o.end_time, TIMESTAMP '9999-12-31') AS end_time
                FROM jobs o JOIN job_nodes b ON b.cluster = o.cluster AND b.job_id = o.job_id, span
                WHERE o.start_time < span.hi
                  AND coalesce(o.end_time, TIMESTAMP '9999-12-31') > span.lo
            )
            SELECT DISTINCT m.key FROM mine m JOIN others o ON o.host = m.host
            WHERE NOT (o.cluster = m.cluster AND o.job_id = m.job_id)
              AND o.start_time < m."end" AND o.end_time > m.start
            """,
            [positions],
        ).fetchall()
    }


def _from_activity(
    source: str, gpus: int, activity: list[GpuActivity], hosts: list[str], model: str | None
) -> Usage:
    mems = [g.mem for g in activity if g.mem is not None]
    totals = [g.mem_total for g in activity if g.mem_total]
    return Usage(
        "ok",
        source,
        gpus,
        per_gpu=activity,
        mean_util=sum(g.util for g in activity) / len(activity),
        util_ceiling=max(g.util for g in activity),
        peak_mem_mib=max(mems) if mems else None,
        mem_total_mib=max(totals) if totals else None,
        samples=sum(g.samples for g in activity),
        model=model,
        hosts=hosts,
    )


def _run_system_metrics(con, allocations: list[Allocation]) -> dict[str, Usage]:
    """Usage of runs outside Slurm from the GPU samples they logged themselves (W&B), else
    from their ``system/gpu_N_*`` metric histories (MLflow)."""
    if not allocations:
        return {}
    keys = pl.DataFrame(
        [(a.run.source_id, a.run.run_id, a.key) for a in allocations],
        schema=["source_id", "run_id", "key"],
        orient="row",
    )
    con.register("audit_runs", keys)
    try:
        rows = _rows(
            con,
            r"""
            WITH own AS (
                SELECT k.key, s.host, s.gpu, avg(s.util_pct) AS util, max(s.mem_used_mib) AS mem,
                       max(s.mem_total_mib) AS mem_total, count(*) AS samples,
                       any_value(s.model) AS model, max(s.util_pct) AS util_max,
                       min(s.mem_used_mib) AS mem_min
                FROM gpu_samples s JOIN audit_runs k USING (source_id, run_id)
                WHERE s.util_pct IS NOT NULL AND NOT isnan(s.util_pct)
                GROUP BY ALL
            ),
            points AS (
                SELECT k.key, regexp_extract(m.key, '^system/gpu_(\d+)_', 1) AS gpu,
                       regexp_extract(m.key, '^system/gpu_\d+_(.*)$', 1) AS field, m.value
                FROM metrics m JOIN audit_runs k USING (source_id, run_id)
                WHERE starts_with(m.key, 'system/gpu_') AND NOT isnan(m.value)
                  AND NOT EXISTS (SELECT 1 FROM own o WHERE o.key = k.key)
            ),
            logged AS (
                SELECT key, '' AS host, gpu,
                       avg(value) FILTER (WHERE field = 'utilization_percentage') AS util,
                       max(value) FILTER (WHERE field = 'memory_usage_megabytes') AS mem,
                       max(value) FILTER (WHERE field = 'memory_usage_megabytes')
                           / nullif(max(value) FILTER (WHERE field = 'memory_usage_percentage'), 0)
                           * 100 AS mem_total,
                       count(*) FILTER (WHERE field = 'utilization_percentage') AS samples,
                       NULL AS model,
                       max(value) FILTER (WHERE field = 'utilization_percentage') AS util_max,
                       min(value) FILTER (WHERE field = 'memory_usage_megabytes') AS mem_min
                FROM points WHERE gpu <> '' GROUP BY ALL
            )
            SELECT * FROM own UNION ALL SELECT * FROM logged ORDER BY key, host, gpu
            """,
        )
    finally:
        con.unregister("audit_runs")
    grouped: dict[str, list[GpuActivity]] = {}
    models: dict[str, str | None] = {}
    for row in rows:
        if row["util"] is None:
            continue
        grouped.setdefault(row["key"], []).append(
            GpuActivity(
                row["host"],
                row["gpu"],
                float(row["util"]),
                row["mem"],
                row["mem_total"],
                row["samples"],
                row["util_max"],
                row["mem_min"],
            )
        )
        models.setdefault(row["key"], row["model"])
    return {
        a_key: _from_activity(
            "tracker",
            len(activity),
            activity,
            sorted({g.host for g in activity if g.host}),
            models[a_key],
        )
        for a_key, activity in grouped.items()
    }


def _the_runs_gpus(alloc: Allocation, use: Usage) -> Usage:
    """``use`` (every GPU of the run's machine, as its tracker sampled them) cut to the
    run's own GPUs: those its device list names; else, for a count it was given (world
    size, parallelism, default), the most active of the GPUs no other tenant held; else
    (rung activity) the GPUs that show its activity. The others are named in the evidence."""
    activity = use.per_gpu or []
    cost = alloc.cost
    chosen: list[GpuActivity] = []
    if cost.devices:
        wanted = set(cost.devices)
        chosen = [g for g in activity if g.gpu in wanted]
    if not chosen:
        if cost.rung == "activity":
            chosen = [g for g in activity if not g.still]
        else:
            candidates = [g for g in activity if not g.held_by_another]
            ranked = sorted(candidates, key=lambda g: (-g.util, -(g.mem or 0), g.host, g.gpu))
            chosen = sorted(ranked[: alloc.gpus], key=lambda g: (g.host, g.gpu))
    if not chosen or len(chosen) == len(activity):
        return use
    left = [g for g in activity if g not in chosen]
    tenants = [g.gpu for g in left if g.held_by_another]
    empty = [g.gpu for g in left if g.still and not g.held_by_another]
    busy = [g.gpu for g in left if not g.still]
    parts = [f"GPUs {', '.join(g.gpu for g in chosen)} of the machine's {len(activity)}"]
    if tenants:
        parts.append(f"GPUs {', '.join(tenants)} held memory at 0 % all along (another tenant's)")
    if empty:
        parts.append(f"GPUs {', '.join(empty)} stayed empty")
    if busy:
        parts.append(f"GPUs {', '.join(busy)} were busy beyond the run's {alloc.gpus}")
    narrowed = _from_activity(use.source, len(chosen), chosen, use.hosts, use.model)
    narrowed.chosen_from = f"{cost.rung_label} ({cost.source}): " + "; ".join(parts)
    return narrowed


def _sacct_usage(job: JobFacts) -> Usage | None:
    util = job.max_gpu_util_pct
    if util is None or not math.isfinite(util):
        return None
    mem = job.max_gpu_mem_bytes
    return Usage(
        "ok",
        "sacct",
        job.gpus,
        per_gpu=None,
        mean_util=None,
        util_ceiling=float(util),
        peak_mem_mib=mem / 2**20 if mem is not None else None,
        hosts=job.hosts,
        model=job.gpu_type,
    )


def _jobstats_usage(job: JobFacts) -> Usage | None:
    summary = parse_jobstats(job.admin_comment)
    if summary is None:
        return None
    activity = []
    for host, node in sorted((summary.get("nodes") or {}).items()):
        if not isinstance(node, dict):
            continue
        utils = node.get("gpu_utilization") or {}
        used = node.get("gpu_used_memory") or {}
        total = node.get("gpu_total_memory") or {}
        if not isinstance(utils, dict):
            continue
        for gpu, value in sorted(utils.items()):
            if not _finite(value):
                continue
            activity.append(
                GpuActivity(
                    str(host),
                    str(gpu),
                    float(value),
                    used.get(gpu) / 2**20
                    if isinstance(used, dict) and _finite(used.get(gpu))
                    else None,
                    total.get(gpu) / 2**20
                    if isinstance(total, dict) and _finite(total.get(gpu))
                    else None,
                )
            )
    if not activity:
        return None
    return _from_activity("jobstats", job.gpus, activity, job.hosts, job.gpu_type)


def parse_jobstats(text: str | None) -> dict | None:
    """The JSON summary jobstats stores as ``JS1:<base64 of gzip>``; None when absent or bad."""
    if not text or not isinstance(text, str) or not text.startswith(JOBSTATS_PREFIX):
        return None
    try:
        packed = base64.b64decode("".join(text[len(JOBSTATS_PREFIX) :].split()), validate=True)
        with gzip.GzipFile(fileobj=io.BytesIO(packed)) as stream:
            raw = stream.read(JOBSTATS_MAX_BYTES + 1)
        if len(raw) > JOBSTATS_MAX_BYTES:
            return None
        data = json.loads(raw)
    except (binascii.Error, OSError, EOFError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _rows(con, sql: str, params: list | None = None) -> list[dict]:
    cursor = con.execute(sql, params or [])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

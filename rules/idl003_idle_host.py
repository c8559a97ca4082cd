from __future__ import annotations

import polars as pl

from audit.rule_api import Rule, RuleContext, Severity, Threshold, Waste, needing
from audit.warehouse.intervals import allocation_hours, materialised, sample_hour
from audit.warehouse.samples import logged_by_a_run, resolutions_by_host, util_peak
from audit.warehouse.slices import partition_slices

from ._usage import IDLE_UTIL
from .families import IdleCapacity

# Hosts are read in groups of at most this many samples. A host's idle stretches depend on
# its own samples and jobs only, and DuckDB's memory for the instants, joins and windows
# grows with the samples one query reads: 2.9 GB more at 80 M samples in one query. At
# 10 M samples the rule alone peaks at 546 MB in groups of 5 M and 404 MB in groups of 2.5 M.
SAMPLES_PER_QUERY = 2_500_000


class IdleHost(IdleCapacity, Rule):
    """GPUs sat idle by their own telemetry, with no job on their host, for hours.

    What it detects:
    Per GPU, stretches of at least `min_idle_hours` in which every sample of the GPU was at
    or under `idle_util_pct` utilisation and no imported Slurm job held its host (samples
    closer than `max_gap_minutes`; a longer gap means the host was down). The GPUs of one
    host idle at the same time are one finding. A host no imported job ever ran on is
    judged by its telemetry alone: its idle GPUs are reported, with the note that whether
    they were allocated is unknown. Tracker system metrics (samples a run logged of its own
    machine) are not host telemetry and are not read here.

    Why it is waste:
    The capacity is paid for and does nothing. Waste = the idle GPUs' hours.
    Idle capacity outside every job is reported apart from the spend of jobs (it is not
    part of any job's cost).

    Known false positives:
    Hosts whose jobs were not imported (a partition missing from the sacct export): the
    finding says when no imported job ever ran on the host; on-premise nodes whose idle
    time costs only power (lower `[prices]` for them).

    Example:
    `gpu-h04` reported 8 H100s at 0 % for 12 h after its last job ended: 96 GPU-h.

    How to fix:
    Release reservations and cloud nodes when the queue is empty (Slurm power saving,
    autoscaling), or fill them with backfill jobs.

    References:
    Slurm power saving guide (SuspendTime); cloud autoscaler documentation; Princeton's
    Job Defense Shield (a GPU at 0 % is idle).
    """

    code = "IDL003"
    name = "idle-host"
    severity = Severity.HIGH
    waste_scope = "capacity"  # GPUs paid for outside every job: not part of any job's spend
    needs = needing("gpu_samples")
    alone = True
    thresholds = {
        "min_idle_hours": Threshold(4.0, "flag idle stretches at least this long", 0.5, unit="h"),
        "idle_util_pct": IDLE_UTIL,
        "max_gap_minutes": Threshold(
            15.0, "telemetry gaps longer than this end a stretch (host down)", 1, unit="min"
        ),
    }
    recommendation = (
        "Release idle reserved or cloud capacity (power saving, autoscaling) or backfill it."
    )

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        condition, params = ctx.window.condition("ts")
        telemetry = f"({condition}) AND NOT {logged_by_a_run('gpu_samples')}"
        sizes = ctx.con.execute(
            f"SELECT host, count(*) FROM gpu_samples WHERE {telemetry} GROUP BY host ORDER BY host",
            params,
        ).fetchall()
        if not sizes:  # no telemetry in the window: no allocation hours to materialise
            return
        in_clusters = {
            host for (host,) in ctx.con.execute("SELECT DISTINCT host FROM job_nodes").fetchall()
        }
        readings_in_window, _ = ctx.window.condition("r.ts")
        stretches: list[dict] = []
        with materialised(ctx.con, "audit_allocation_hours", allocation_hours()):
            for hosts in partition_slices(sizes, SAMPLES_PER_QUERY):
                group = pl.DataFrame({"host": hosts}, schema={"host": pl.String})
                ctx.con.register("audit_idle_host_group", group)
                try:
                    stretches += ctx.rows(
                        # The windows sort by an integer per GPU, and the rows they sort
                        # carry integers and times only: host, GPU and model texts are
                        # joined back onto the stretches (2.0 against 3.9 CPU-s a group of
                        # 2.5 M five-minute buckets). A GPU is its (host, gpu) pair, whatever
                        # series (origins, job labels) its readings came in.
                        f"""
                        WITH gpus AS (
                            SELECT series, host, gpu,
                                   dense_rank() OVER (ORDER BY host, gpu) AS gpu_key
                            FROM gpu_series s
                            WHERE NOT {logged_by_a_run("s")}
                              AND host IN (SELECT host FROM audit_idle_host_group)
                        ),
                        samples AS (
                            SELECT g.gpu_key, g.host, r.series, r.ts, {util_peak("r")} AS util
                            FROM gpu_readings r JOIN gpus g USING (series)
                            WHERE {readings_in_window} AND isfinite(r.util_pct)
                        ),
                        instants AS (SELECT DISTINCT host, ts FROM samples),
                        covered AS (
                            SELECT DISTINCT i.host, i.ts
                            FROM instants i JOIN audit_allocation_hours a
                              ON a.host = i.host AND a.hour = {sample_hour("i.ts")}
                             AND i.ts >= a.lo AND i.ts < a.hi
                        ),
                        flagged AS (
                            SELECT s.gpu_key, s.series, s.ts, s.util,
                                   c.host IS NULL AND s.util <= ? AS idle
                            FROM samples s LEFT JOIN covered c ON c.host = s.host AND c.ts = s.ts
                        ),
                        marked AS (
                            SELECT *, CASE WHEN idle AND (NOT coalesce(lag(idle) OVER w, false)
                                                OR ts - lag(ts) OVER w > to_minutes(CAST(? AS BIGINT)))
                                           THEN 1 ELSE 0 END AS starts
                            FROM flagged WINDOW w AS (PARTITION BY gpu_key ORDER BY ts)
                        ),
                        numbered AS (
                            SELECT *, sum(starts) OVER (
                                PARTITION BY gpu_key ORDER BY ts
                                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
                            ) AS stretch
                            FROM marked
                        ),
                        stretches AS (
                            SELECT gpu_key, min(ts) AS first_ts, max(ts) AS last_ts,
                                   count(*) AS samples, max(util) AS max_util,
                                   any_value(series) AS series
                            FROM numbered WHERE idle GROUP BY gpu_key, stretch
                            HAVING max(ts) - min(ts) >= to_minutes(CAST(? AS BIGINT))
                        )
                        SELECT g.host, g.gpu, t.first_ts, t.last_ts, t.samples, t.max_util,
                               m.model
                        FROM stretches t
                        JOIN (SELECT DISTINCT gpu_key, host, gpu FROM gpus) g USING (gpu_key)
                        JOIN gpu_series m ON m.series = t.series
                        ORDER BY g.host, t.first_ts, g.gpu
                        """,
                        [
                            *params,
                            t["idle_util_pct"],
                            round(t["max_gap_minutes"]),
                            round(t["min_idle_hours"] * 60),
                        ],
                    )
                finally:
                    ctx.con.unregister("audit_idle_host_group")
        # what the readings are (raw samples, 5-minute buckets from Prometheus): a bucket is
        # idle when its highest utilisation is, never by its mean
        resolutions = resolutions_by_host(ctx.con) if stretches else {}
        for host, group in _overlapping(stretches):
            yield self._finding(ctx, host, group, host in in_clusters, resolutions.get(host, ""))

    def _finding(
        self, ctx: RuleContext, host: str, group: list[dict], in_cluster: bool, resolution: str
    ):
        t = ctx.thresholds
        first = min(s["first_ts"] for s in group)
        last = max(s["last_ts"] for s in group)
        per_gpu = [
            {
                "gpu": s["gpu"],
                "from": s["first_ts"],
                "to": s["last_ts"],
                "hours": round(_hours(s), 3),
                "max_util_pct": s["max_util"],
                "samples": s["samples"],
            }
            for s in group
        ]
        gpu_hours = sum(_hours(s) for s in group)
        price, key = ctx.gpu_price(group[0]["model"])
        gpus = len({s["gpu"] for s in group})
        terms = " + ".join(f"{_hours(s):.2f}" for s in group[:8])
        if len(group) > 8:
            terms += f" + … ({len(group)} stretches)"
        allocation = (
            "no imported job held the host meanwhile"
            if in_cluster
            else "no imported job ever ran on this host: whether the GPUs were allocated "
            "(to a job of a cluster not imported) is unknown"
        )
        return self.finding(
            subject={"host": host, "from": first.isoformat(timespec="minutes")},
            message=(
                f"host {host}: {gpus} GPU{'s' if gpus > 1 else ''} at ≤ {t['idle_util_pct']:g} % "
                f"utilisation for {gpu_hours:.1f} GPU-h between {first:%Y-%m-%d %H:%M} and "
                f"{last:%Y-%m-%d %H:%M} UTC, {allocation.split(':')[0]} (threshold "
                f"{t['min_idle_hours']:g} h per GPU)"
            ),
            evidence={
                "idle_gpus": per_gpu,
                "allocation": allocation,
                "idle_when": f"every sample at ≤ {t['idle_util_pct']:g} % utilisation",
                "resolution": resolution,
                "formula": (
                    f"{terms} h of idle GPUs = {gpu_hours:.2f} GPU-h × ${price:.2f}/GPU-h "
                    f"({key}) = ${gpu_hours * price:,.2f}"
                ),
            },
            cost=Waste(
                gpu_hours,
                gpu_hours * price,
                basis=f"host telemetry: {gpus} idle GPUs, {gpu_hours:.2f} GPU-h",
            ),
            happened_at=first,
        )


def _hours(stretch: dict) -> float:
    return (stretch["last_ts"] - stretch["first_ts"]).total_seconds() / 3600


def _overlapping(stretches: list[dict]):
    """(host, stretches) for each set of one host's GPU stretches that overlap in time."""
    by_host: dict[str, list[dict]] = {}
    for stretch in stretches:
        by_host.setdefault(stretch["host"], []).append(stretch)
    for host, items in sorted(by_host.items()):
        items.sort(key=lambda s: (s["first_ts"], s["gpu"]))
        group, until = [items[0]], items[0]["last_ts"]
        for item in items[1:]:
            if item["first_ts"] <= until:
                group.append(item)
                until = max(until, item["last_ts"])
                continue
            yield host, group
            group, until = [item], item["last_ts"]
        yield host, group

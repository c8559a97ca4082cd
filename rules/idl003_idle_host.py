from __future__ import annotations

import polars as pl

from audit.rule_api import Rule, RuleContext, Severity, Threshold
from audit.warehouse.intervals import allocation_hours, host_instants, materialised, sample_hour
from audit.warehouse.samples import resolutions_by_host
from audit.warehouse.slices import partition_slices

# Hosts are read in groups of at most this many samples. A host's idle stretches depend on
# its own samples and jobs only, and DuckDB's memory for the instants, joins and windows
# grows with the samples one query reads: 2.9 GB more at 80 M samples in one query. At
# 10 M samples the rule alone peaks at 546 MB in groups of 5 M and 404 MB in groups of 2.5 M.
SAMPLES_PER_QUERY = 2_500_000


class IdleHost(Rule):
    """A host kept reporting GPU telemetry, with no job on it, for hours.

    What it detects:
    Stretches of at least `min_idle_hours` during which a host sent GPU telemetry while no
    Slurm job was allocated on it. A host that reports telemetry is taken to be up and
    paid for (a reservation, a dedicated node, a cloud instance left running); shorter
    gaps between jobs are normal scheduling and are not flagged.

    Why it is waste:
    The capacity is paid for and does nothing. Waste = GPUs seen on the host × hours.

    Known false positives:
    Hosts whose jobs were not imported (a partition missing from the sacct export), and
    on-premise nodes whose idle time costs only power (lower `[prices]` for them).

    Example:
    `gpu-h04` reported 8 idle H100s for 12 h after its last job ended: 96 GPU-h.

    How to fix:
    Release reservations and cloud nodes when the queue is empty (Slurm power saving,
    autoscaling), or fill them with backfill jobs.

    References:
    Slurm power saving guide (SuspendTime); cloud autoscaler documentation.
    """

    code = "IDL003"
    name = "idle-host"
    severity = Severity.HIGH
    family_label = "idle capacity"
    needs = {
        "gpu_samples": "no GPU telemetry imported",
        "jobs": "no Slurm jobs imported (cannot tell idle hosts)",
    }
    alone = True
    thresholds = {
        "min_idle_hours": Threshold(4.0, "flag idle stretches at least this long", 0.5, unit="h"),
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
        sizes = ctx.con.execute(
            f"SELECT host, count(*) FROM gpu_samples WHERE {condition} GROUP BY host ORDER BY host",
            params,
        ).fetchall()
        if not sizes:  # no telemetry in the window: no allocation hours to materialise
            return
        of_hosts = f"({condition}) AND host IN (SELECT host FROM audit_idle_host_group)"
        spans: list[dict] = []
        with materialised(ctx.con, "audit_allocation_hours", allocation_hours()):
            for hosts in partition_slices(sizes, SAMPLES_PER_QUERY):
                group = pl.DataFrame({"host": hosts}, schema={"host": pl.String})
                ctx.con.register("audit_idle_host_group", group)
                try:
                    spans += ctx.rows(
                        f"""
                        WITH instants AS (SELECT * FROM {host_instants(of_hosts)}),
                        covered AS (
                            SELECT DISTINCT i.host, i.ts
                            FROM instants i JOIN audit_allocation_hours a
                              ON a.host = i.host AND a.hour = {sample_hour("i.ts")} AND i.ts >= a.lo AND i.ts < a.hi
                        ),
                        times AS (
                            SELECT i.*, c.host IS NOT NULL AS busy
                            FROM instants i LEFT JOIN covered c ON c.host = i.host AND c.ts = i.ts
                        ),
                        marked AS (
                            SELECT *, CASE WHEN busy OR lag(busy) OVER w OR lag(ts) OVER w IS NULL
                                                OR ts - lag(ts) OVER w > to_minutes(CAST(? AS BIGINT)) THEN 1 ELSE 0 END AS starts
                            FROM times WINDOW w AS (PARTITION BY host ORDER BY ts)
                        ),
                        numbered AS (
                            SELECT *, sum(starts) OVER (PARTITION BY host ORDER BY ts) AS stretch FROM marked WHERE NOT busy
                        )
                        SELECT host, stretch, min(ts) AS first_ts, max(ts) AS last_ts, max(gpus) AS gpus,
                               any_value(model) AS model, count(*) AS samples
                        FROM numbered GROUP BY host, stretch ORDER BY host, first_ts
                        """,
                        [*params, round(t["max_gap_minutes"])],
                    )
                finally:
                    ctx.con.unregister("audit_idle_host_group")
        resolutions = resolutions_by_host(ctx.con) if spans else {}
        for span in spans:
            hours = (span["last_ts"] - span["first_ts"]).total_seconds() / 3600
            if hours < t["min_idle_hours"]:
                continue
            price, key = ctx.gpu_price(span["model"])
            gpu_hours = span["gpus"] * hours
            yield self.finding(
                subject={
                    "host": span["host"],
                    "from": span["first_ts"].isoformat(timespec="minutes"),
                },
                message=(
                    f"host {span['host']} reported {span['gpus']} GPUs with no job for {hours:.1f} h "
                    f"({span['first_ts']:%Y-%m-%d %H:%M} to {span['last_ts']:%Y-%m-%d %H:%M} UTC; threshold {t['min_idle_hours']:g} h)"
                ),
                evidence={
                    "first_sample": span["first_ts"],
                    "last_sample": span["last_ts"],
                    "samples": span["samples"],
                    "resolution": resolutions.get(span["host"], ""),
                    "formula": f"{span['gpus']} GPUs × {hours:.2f} h = {gpu_hours:.2f} GPU-h × ${price:.2f}/GPU-h ({key}) = ${gpu_hours * price:,.2f}",
                },
                gpu_hours=gpu_hours,
                usd=gpu_hours * price,
                cost_basis=f"host telemetry: {span['gpus']} GPUs reporting × {hours:.2f} h",
                happened_at=span["first_ts"],
            )

"""GPU telemetry from any server with the Prometheus HTTP API, aggregated where it lives.

``audit ingest prometheus --url URL`` does not copy raw samples (a 10,000-GPU fleet scraped
every 15 s holds 400 M a week). It asks the server for what the rules need, per GPU and
time bucket: the mean and highest utilisation, the memory peak and capacity, the mean power
(``avg_over_time``, ``max_over_time``, ``last_over_time``, ``rate`` at the bucket width),
and stores each bucket as a reading with its width (``audit.warehouse.samples``).

1. **Which exporter.** The metric names of dcgm-exporter, jobstats' GPU exporter and
   nvidia_gpu_exporter are looked up (``/api/v1/label/__name__/values``); the first found
   is read, or the one ``[prometheus] exporter`` names, with ``[prometheus] metrics`` and
   ``labels`` laid over it (``exporters``).
2. **Which GPUs.** ``/api/v1/series`` lists the utilisation series of the window; each
   becomes a GPU identity (host, GPU, UUID, model, job, pod) by its labels.
3. **Which resolution.** ``--step``, else the one the warehouse already holds for
   Prometheus rollups, else the ``[prometheus] resolution`` table by the window's length
   (≤ 1 day: 1 minute; ≤ 7 days: 5 minutes; longer: 15 minutes). A ``--step`` other than
   the stored one is refused: rollups of two widths never mix.
4. **Which time.** Per host, from the bucket after its last one stored (an import is
   incremental), else from ``--since`` (default: 7 days before ``--until``), to ``--until``
   (default: the last whole bucket before now). Bucket ``t`` stands for the time (t-step, t].
5. **Which queries.** Hosts are packed into range queries so that no query asks more than
   ``max_points_per_series`` points of one series (Prometheus refuses over 11,000) or more
   than ``max_points_per_query`` points in all (the sample budget), splitting the window in
   time where one host alone would pass it. Every query is one request for all the fields,
   each aggregated ``by`` the identity labels (replicas and unrelated labels fold together;
   ``queries``).
6. **How.** At most ``concurrency`` requests at once, each with a deadline, retried with
   back-off when the server or network fails for a moment (``client``); answers are checked
   (shape, hosts, times, value ranges, point counts) and written as they arrive, in order,
   inside one transaction: any failure stores nothing.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import repeat

import polars as pl

from audit.errors import InputError
from audit.importers.files import log_file_imports
from audit.importers.prometheus.client import ApiError, Credentials, PrometheusClient
from audit.importers.prometheus.exporters import (
    AUTO_ORDER,
    EXPORTERS,
    Exporter,
    Settings,
    duration_text,
    settings_from,
)
from audit.importers.prometheus.queries import (
    FIELD_LABEL,
    IDENTITY,
    Fields,
    HostSeries,
    Query,
    first_label,
    identity_of,
    iso_minutes,
    plan_queries,
    promql_string,
)
from audit.importers.telemetry import VALID_RANGES
from audit.progress import NoProgress, ProgressReporter
from audit.text import counted
from audit.warehouse.samples import resolution_text

ORIGIN = "prometheus"
DEFAULT_DAYS = 7  # a first import without --since reads a week, as a weekly report judges
QUERIES_AHEAD = 2  # per request slot: answers waiting to be written stay few
# The checked range of each stored field (a rollup's max is checked as a utilisation).
_CHECKED_AS = {
    "util_pct": "util_pct",
    "util_max": "util_pct",
    "mem_used_mib": "mem_used_mib",
    "mem_total_mib": "mem_total_mib",
    "power_w": "power_w",
}


@dataclass
class PrometheusSummary:
    location: str
    exporter: str = ""
    step: int = 0
    hosts: int = 0
    gpus: int = 0
    queries: int = 0
    points: int = 0  # aggregated values the server sent
    rows_written: int = 0
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped_what = "bad value"

    def line(self) -> str:
        fleet = f"{counted(self.gpus, 'GPU')} on {counted(self.hosts, 'host')}"
        if not self.queries:
            return (
                f"nothing to import from {self.location}: every host is imported up to "
                f"--until already ({fleet}) in {self.seconds:.2f} s"
            )
        skipped = (
            f", skipped {counted(len(self.skipped), self.skipped_what)}" if self.skipped else ""
        )
        return (
            f"imported {counted(self.rows_written, 'GPU bucket')} ({resolution_text(ORIGIN, self.step)}, "
            f"{self.exporter}) of {fleet} from {self.location} ({counted(self.points, 'value')} in "
            f"{counted(self.queries, 'query')}{skipped}) in {self.seconds:.2f} s"
        )


# -- the import -------------------------------------------------------------------------------
def import_prometheus(
    wh,
    config,
    url: str,
    since: datetime | None = None,
    until: datetime | None = None,
    step: str | None = None,
    exporter: str | None = None,
    selector: str = "",
    credentials: Credentials | None = None,
    skip_bad: bool = False,
    progress: ProgressReporter | None = None,
) -> PrometheusSummary:
    from audit.importers.cluster import SampleBatch, stored_spans
    from audit.importers.links import refresh_links
    from audit.windows import now

    settings = settings_from(config)
    if exporter is not None and exporter not in ("auto", "custom", *EXPORTERS):
        raise InputError(
            f"--exporter {exporter!r} is not one of: auto, custom, {', '.join(EXPORTERS)}"
        )
    selector = _checked_selector(selector)
    started = time.monotonic()
    progress = progress or NoProgress()
    client = PrometheusClient(
        url,
        credentials or Credentials(),
        settings.timeout_s,
        settings.max_retries,
        settings.backoff_s,
        settings.max_response_bytes,
        settings.concurrency,
    )
    summary = PrometheusSummary(client.location)
    try:
        stored = _stored_rollups(wh.con)
        bucket = _resolution(step, stored, since, until, settings, now())
        last = _floor(_epoch(until), bucket) if until else _floor(_epoch(now()), bucket) - bucket
        first = _ceil(_epoch(since), bucket) if since else last - DEFAULT_DAYS * 86400
        if first > last:
            raise InputError(
                f"--since {since} is after the last whole {duration_text(bucket)} bucket "
                f"to import ({iso_minutes(last)}); nothing to ask for"
            )
        summary.step = bucket
        # Each host reads on from the bucket after its last one stored; --since only holds
        # back older ones (an import never asks again for what the warehouse has).
        resume = {host: moment + bucket for host, moment in stored.last.items()}
        window_start = first if since else min([first, *resume.values()])
        chosen = _exporter(client, settings, exporter, window_start - bucket, last)
        summary.exporter = chosen.exporter.name
        hosts = _discover(client, chosen, selector, window_start - bucket, last, summary)
        if not hosts:
            raise InputError(
                f"{client.location}: no GPU series with a host and a GPU label between "
                f"{iso_minutes(window_start - bucket)} and {iso_minutes(last)}"
                + (f" matching --selector {selector}" if selector else "")
                + "".join(f"; {note}" for note in summary.notes)
            )
        summary.hosts = len(hosts)
        summary.gpus = len({(h.host, i[1]) for h in hosts for i in h.identities})
        starts = {
            h.host: (max(first, resume[h.host]) if since else resume[h.host])
            if h.host in resume
            else first
            for h in hosts
        }
        fields = Fields.of(chosen.exporter, chosen.present, bucket)
        queries = plan_queries(hosts, starts, last, bucket, len(fields.expressions), settings)
        summary.queries = len(queries)
        progress.start(len(queries))
        with wh.transaction() as con:
            before = con.execute("SELECT count(*) FROM gpu_readings").fetchall()[0][0]
            batch = SampleBatch(con, stored_spans(con))
            for frame in _fetched(client, queries, fields, chosen.exporter, selector, bucket,
                                  settings, skip_bad, summary):  # fmt: skip
                progress.advance(1)
                batch.add(frame)
            batch.flush()
            summary.rows_written = (
                con.execute("SELECT count(*) FROM gpu_readings").fetchall()[0][0] - before
            )
            refresh_links(con, config)
            summary.seconds = time.monotonic() - started
            log_file_imports(
                con,
                ORIGIN,
                [(client.location, summary.points, summary.rows_written, len(summary.skipped))],
                summary.seconds,
            )
    finally:
        progress.stop()
        client.close()
    summary.seconds = time.monotonic() - started
    return summary


@dataclass
class _Stored:
    last: dict[str, int]  # host -> its last rollup bucket, s
    widths: dict[int, str]  # bucket width -> a host that has it


def _stored_rollups(con) -> _Stored:
    rows = con.execute(
        """
        SELECT s.host, s.bucket_s, epoch(max(r.ts))::BIGINT
        FROM gpu_series s JOIN gpu_readings r USING (series)
        WHERE s.origin = ? AND s.bucket_s IS NOT NULL
        GROUP BY ALL ORDER BY s.host
        """,
        [ORIGIN],
    ).fetchall()
    last: dict[str, int] = {}
    widths: dict[int, str] = {}
    for host, width, moment in rows:
        last[host] = max(last.get(host, moment), moment)
        widths.setdefault(width, host)
    return _Stored(last, widths)


def _resolution(
    step: str | None,
    stored: _Stored,
    since: datetime | None,
    until: datetime | None,
    settings: Settings,
    moment: datetime,
) -> int:
    from audit.importers.prometheus.exporters import seconds_of

    asked = None
    if step is not None:
        asked = seconds_of(step)
        if asked is None or asked < 1:
            raise InputError(f"--step {step!r}: expected a duration such as 60s, 1m, 5m, 1h")
    if len(stored.widths) > 1:
        described = ", ".join(
            f"{duration_text(w)} (e.g. host {h})" for w, h in sorted(stored.widths.items())
        )
        raise InputError(
            f"the warehouse holds Prometheus rollups of several widths ({described}); "
            "import into a new warehouse"
        )
    if stored.widths:
        (width, host), = stored.widths.items()  # fmt: skip
        if asked is not None and asked != width:
            raise InputError(
                f"--step {duration_text(asked)}: the warehouse holds {duration_text(width)} "
                f"buckets from Prometheus (e.g. host {host}); rollups of two widths would mix. "
                f"Drop --step to go on at {duration_text(width)}, or import into a new warehouse"
            )
        return width
    if asked is not None:
        return asked
    end = until or moment
    start = since or (end - timedelta(days=DEFAULT_DAYS))
    return settings.step_for((end - start).total_seconds())


def _epoch(moment: datetime) -> int:
    return math.floor(moment.replace(tzinfo=UTC).timestamp())


def _floor(seconds: int, step: int) -> int:
    return seconds - seconds % step


def _ceil(seconds: int, step: int) -> int:
    return -(-seconds // step) * step


def _checked_selector(selector: str) -> str:
    text = (selector or "").strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if "{" in text or "}" in text:
        raise InputError(
            f'--selector {selector!r}: expected label matchers such as cluster="della", '
            "without a metric name"
        )
    return text


@dataclass(frozen=True)
class _Chosen:
    exporter: Exporter
    present: set[str]  # its metric names the server has


def _exporter(client, settings, asked: str | None, start: int, end: int) -> _Chosen:
    """The exporter to read and which of its metrics the server holds in the window."""
    name = asked or settings.exporter
    candidates = AUTO_ORDER if name == "auto" else (name,)
    profiles = {n: settings.exporter_named(n) for n in candidates}
    wanted = sorted({m.name for p in profiles.values() for m in p.metrics.values()})
    data = client.call(
        "GET",
        "api/v1/label/__name__/values",
        [
            ("match[]", "{__name__=~" + promql_string("|".join(wanted)) + "}"),
            ("start", str(start)),
            ("end", str(end)),
        ],
        "label/__name__/values (which GPU exporter)",
    )
    if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
        raise InputError(
            f"{client.location}: label/__name__/values answered with something other than a "
            "list of metric names"
        )
    present = set(data)
    for candidate in candidates:
        profile = profiles[candidate]
        utils = {profile.metrics[k].name for k in ("util", "util_alt") if k in profile.metrics}
        if utils & present:
            return _Chosen(profile, {m.name for m in profile.metrics.values()} & present)
    looked = "; ".join(
        f"{profiles[c].name}: {', '.join(profiles[c].metrics[k].name for k in ('util', 'util_alt') if k in profiles[c].metrics)}"
        for c in candidates
    )
    raise InputError(
        f"{client.location}: no GPU utilisation metric between {iso_minutes(start)} and {iso_minutes(end)} "
        f"({looked}); check --since/--until, or name your exporter's metrics in "
        "[prometheus] metrics"
    )


def _discover(client, chosen: _Chosen, selector: str, start: int, end: int, summary) -> list:
    """The hosts and GPU identities of the utilisation series in the window."""
    metrics = chosen.exporter.metrics
    names = [metrics[k].name for k in ("util", "util_alt") if k in metrics]
    names = [n for n in names if n in chosen.present]
    data = client.call(
        "POST",
        "api/v1/series",
        [
            *(("match[]", f"{n}{{{selector}}}") for n in names),
            ("start", str(start)),
            ("end", str(end)),
        ],
        f"series of {', '.join(names)}",
    )
    if not isinstance(data, list):
        raise InputError(f"{client.location}: series answered with something other than a list")
    hosts: dict[tuple[str, str], HostSeries] = {}
    unnamed = 0
    for labels in data:
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise InputError(
                f"{client.location}: series answered with an entry that is not a set of labels"
            )
        found = first_label(labels, chosen.exporter.labels.get("host", ()))
        ident = identity_of(labels, chosen.exporter)
        if found is None or ident is None:
            unnamed += 1
            continue
        entry = hosts.setdefault((found[0], ident[0]), HostSeries(ident[0], found[0]))
        entry.values.add(found[1])
        entry.identities.add(ident)
    if unnamed:
        labels = chosen.exporter.labels
        summary.notes.append(
            f"{unnamed:,} utilisation series without a host label "
            f"({', '.join(labels.get('host', ()))}) or a GPU label "
            f"({', '.join(labels.get('gpu', ()))}) left out; name yours in [prometheus] labels"
        )
    by_host: dict[str, list[HostSeries]] = {}
    for entry in hosts.values():
        by_host.setdefault(entry.host, []).append(entry)
    mixed = sorted(h for h, entries in by_host.items() if len(entries) > 1)
    if mixed:
        raise InputError(
            f"{client.location}: host {mixed[0]} is named by two labels "
            f"({', '.join(sorted(e.label for e in by_host[mixed[0]]))}); set [prometheus] "
            "labels.host to the one to read"
        )
    return sorted(hosts.values(), key=lambda h: h.host)


def _fetched(
    client, queries, fields, exporter, selector, step, settings, skip_bad, summary
) -> Iterator[pl.DataFrame]:
    """The rows of each query in plan order, with up to ``concurrency`` requests at once."""
    pending: deque[tuple[Query, Future]] = deque()
    ahead = settings.concurrency * QUERIES_AHEAD
    pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="audit-prometheus")
    try:
        for query in queries:
            pending.append(
                (query, pool.submit(_fetch, client, query, fields, exporter, selector, step, settings))
            )  # fmt: skip
            if len(pending) >= ahead:
                yield _checked(*pending.popleft(), step, skip_bad, summary)
        while pending:
            yield _checked(*pending.popleft(), step, skip_bad, summary)
    finally:
        # an error or Ctrl-C: what is queued is not sent, and the command does not wait for
        # the requests under way (each ends by its deadline)
        pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Answer:
    long: pl.DataFrame  # id, field, t, v (text as sent)
    identities: list[tuple]
    points: int


def _fetch(client, query: Query, fields: Fields, exporter, selector, step, settings) -> _Answer:
    what = query.describe(step)
    try:
        data = client.call(
            "POST",
            "api/v1/query_range",
            [
                ("query", fields.promql(query.selector(selector))),
                ("start", str(query.start)),
                ("end", str(query.end)),
                ("step", str(step)),
                ("timeout", f"{settings.timeout_s:g}s"),
            ],
            what,
        )
    except ApiError as exc:
        if exc.status != 422 and "too many" not in exc.message and "maximum" not in exc.message:
            raise
        raise InputError(
            f"{exc.request} failed: HTTP {exc.status} {exc.kind}: {exc.message}; the server "
            "holds queries to fewer points than [prometheus] max_points_per_query / "
            "max_points_per_series allow: lower them; nothing was stored"
        ) from None
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise InputError(
            f"{client.location}: {what}: answered without a matrix result; is --url a "
            "Prometheus-compatible server?"
        )
    result = data.get("result")
    if not isinstance(result, list):
        raise InputError(f"{client.location}: {what}: data.result is not a list of series")
    asked_hosts = {h.host for h in query.hosts}
    idents: dict[tuple, int] = {}
    ids: list[int] = []
    names: list[str] = []
    times: list = []
    values: list = []
    limit = query.series * len(fields.expressions) * query.steps(step)
    try:
        for series in result:
            labels = dict(series["metric"])
            name = labels.pop(FIELD_LABEL)
            ident = identity_of(labels, exporter)
            if name not in fields.expressions or ident is None or ident[0] not in asked_hosts:
                raise InputError(
                    f"{client.location}: {what}: answered a series that was not asked for "
                    f"({_series_text(labels)}); refused"
                )
            points = series["values"]
            number = idents.setdefault(ident, len(idents))
            ids.extend(repeat(number, len(points)))
            names.extend(repeat(name, len(points)))
            times.extend(p[0] for p in points)
            values.extend(p[1] for p in points)
            if len(times) > limit:
                raise InputError(
                    f"{client.location}: {what}: answered more than the {limit:,} values its "
                    "series and buckets can hold; refused"
                )
        long = pl.DataFrame(
            {"id": ids, "field": names, "t": times, "v": values},
            schema={"id": pl.UInt32, "field": pl.String, "t": pl.Float64, "v": pl.String},
        )
    except (KeyError, TypeError, IndexError, AttributeError, ValueError, pl.exceptions.PolarsError):
        raise InputError(
            f"{client.location}: {what}: a series is not in the documented shape "
            '({"metric": {labels}, "values": [[time, "value"], ...]})'
        ) from None
    return _Answer(long, list(idents), len(times))


def _checked(query: Query, future: Future, step: int, skip_bad: bool, summary) -> pl.DataFrame:
    """The wide rows of an answer, every time and value checked."""
    answer = future.result()
    summary.points += answer.points
    what = query.describe(step)
    long = answer.long.with_columns(value=pl.col("v").cast(pl.Float64, strict=False).round(4))
    strange = long.filter(
        (pl.col("t") % step != 0) | (pl.col("t") < query.start) | (pl.col("t") > query.end)
    )
    if strange.height:
        raise InputError(
            f"{summary.location}: {what}: answered a value at {strange['t'][0]:g}, not one of "
            "the buckets asked for; refused"
        )
    checks = [(name, VALID_RANGES[_CHECKED_AS[name]]) for name in long["field"].unique().sort()]
    bad = pl.lit(False)
    for name, (lo, hi, _, _) in checks:
        value = pl.col("value")
        bad = bad | (
            (pl.col("field") == name)
            & (value.is_null() | ~value.is_finite() | ~value.is_between(lo, hi))
        )
    problems = long.filter(bad)
    if problems.height:
        messages = []
        for row in problems.head(1000).iter_rows(named=True):
            host, gpu = answer.identities[row["id"]][:2]
            lo, hi, _, unit = VALID_RANGES[_CHECKED_AS[row["field"]]]
            messages.append(
                f"{summary.location}: {what}: host {host} GPU {gpu} at {iso_minutes(int(row['t']))}: "
                f"{row['field']} {row['v'][:40]!r} is outside {lo:g}-{hi:g} {unit}"
            )
        if not skip_bad:
            raise InputError(messages[0] + " (--skip-bad leaves such values out)")
        summary.skipped.extend(messages)
        if problems.height > len(messages):
            summary.skipped.append(f"... and {problems.height - len(messages):,} more bad values")
        long = long.filter(~bad)
    wide = long.pivot(on="field", index=["id", "t"], values="value", aggregate_function="first")
    identities = pl.DataFrame(
        answer.identities, schema=list(IDENTITY), orient="row"
    ).with_row_index("id")
    columns = ["util_pct", "util_max", "mem_used_mib", "mem_total_mib", "power_w"]
    return (
        wide.join(identities.with_columns(pl.col("id").cast(pl.UInt32)), on="id", how="left")
        .select(
            "host",
            "gpu",
            ts=pl.from_epoch(pl.col("t").cast(pl.Int64), time_unit="s").cast(pl.Datetime("us")),
            **{
                c: (pl.col(c) if c in wide.columns else pl.lit(None)).cast(pl.Float32)
                for c in columns
            },
            model="model",
            uuid="uuid",
            job_label="job_label",
            pod="pod",
            origin=pl.lit(ORIGIN),
            bucket_s=pl.lit(step, pl.Int32),
        )
        .sort("host", "gpu", "ts")
    )


def _series_text(labels: dict) -> str:
    from audit.importers.prometheus.client import _server_text

    return _server_text(", ".join(f"{k}={v}" for k, v in sorted(labels.items())), 120)


__all__ = ["Credentials", "PrometheusSummary", "import_prometheus"]

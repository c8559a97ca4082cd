"""The range queries of an import: GPU identities from labels, the PromQL of each field,
and the plan that keeps every query within the server's limits (``audit.importers.prometheus``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from audit.importers.prometheus.exporters import Exporter, Settings, duration_text

FIELD_LABEL = "audit_field"  # marks which aggregate a result series carries


# -- GPU identities --------------------------------------------------------------------------
IDENTITY = ("host", "gpu", "uuid", "model", "job_label", "pod")


def first_label(labels: dict, names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = labels.get(name)
        if value:
            return name, value
    return None


def host_of(label: str, value: str) -> str:
    """A host as Slurm names it: the ``instance`` label without its port."""
    if label != "instance":
        return value
    if value.startswith("["):  # [ipv6]:port
        return value[1:].split("]", 1)[0]
    host, colon, port = value.rpartition(":")
    return host if colon and port.isdigit() and host else value


def identity_of(labels: dict, exporter: Exporter) -> tuple | None:
    """(host, gpu, uuid, model, job_label, pod) of a series, None without host or GPU."""
    named = exporter.labels
    host = first_label(labels, named.get("host", ()))
    gpu = first_label(labels, named.get("gpu", ()))
    if host is None or gpu is None:
        return None
    mig = first_label(labels, named.get("mig", ()))
    pod = first_label(labels, named.get("pod", ()))
    namespace = first_label(labels, named.get("namespace", ()))
    pod_text = pod and (f"{namespace[1]}/{pod[1]}" if namespace else pod[1])
    return (
        host_of(*host),
        f"{gpu[1]}/mig{mig[1]}" if mig else gpu[1],  # a MIG instance is a GPU of its own
        (first_label(labels, named.get("uuid", ())) or (None, None))[1],
        (first_label(labels, named.get("model", ())) or (None, None))[1],
        (first_label(labels, named.get("job", ())) or (None, None))[1],
        pod_text or None,
    )


@dataclass
class HostSeries:
    """A host as the server names it: its label, that label's values, its GPU series."""

    host: str
    label: str
    values: set[str] = field(default_factory=set)
    identities: set[tuple] = field(default_factory=set)


# -- queries --------------------------------------------------------------------------------
def promql_string(value: str) -> str:
    """A PromQL double-quoted string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_RE2_SPECIAL = set("\\.+*?()|[]{}^$")


def _literal_regex(value: str) -> str:
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in value)


@dataclass(frozen=True)
class Query:
    hosts: tuple[HostSeries, ...]
    start: int  # first evaluation time, s
    end: int  # last evaluation time, s
    series: int  # GPU identities of its hosts

    def steps(self, step: int) -> int:
        return (self.end - self.start) // step + 1

    def describe(self, step: int) -> str:
        names = [h.host for h in self.hosts]
        hosts = names[0] if len(names) == 1 else f"{len(names)} hosts ({names[0]} to {names[-1]})"
        return (
            f"query_range for {hosts}, buckets {iso_minutes(self.start)} to {iso_minutes(self.end)} "
            f"step {duration_text(step)}"
        )

    def selector(self, extra: str) -> str:
        by_label: dict[str, set[str]] = {}
        for h in self.hosts:
            by_label.setdefault(h.label, set()).update(h.values)
        if len(by_label) != 1:
            raise AssertionError("a query's hosts share their host label (plan_queries)")
        (label, values), = by_label.items()  # fmt: skip
        ordered = sorted(values)
        if len(ordered) == 1:
            matcher = f"{label}={promql_string(ordered[0])}"
        else:
            matcher = f"{label}=~{promql_string('|'.join(_literal_regex(v) for v in ordered))}"
        return "{" + ", ".join(m for m in (matcher, extra) if m) + "}"


def iso_minutes(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M")


@dataclass(frozen=True)
class Fields:
    """The aggregates one query asks, as PromQL over a selector placeholder ``{S}``."""

    expressions: dict[str, str]  # stored column -> PromQL

    @classmethod
    def of(cls, exporter: Exporter, present: set[str], step: int) -> Fields:
        window = f"[{step * 1000 - 1}ms]"  # (t-step, t]: Prometheus 2 ranges include both ends
        by = ", ".join(exporter.label_names())
        metrics = {k: m for k, m in exporter.metrics.items() if m.name in present}

        def over(function: str, key: str) -> str:
            metric = metrics[key]
            scaled = "" if metric.scale == 1 else f" * {metric.scale!r}"
            return f"{function}({metric.name}{{S}}{window}){scaled}"

        def either(function: str) -> str:
            sides = [over(function, k) for k in ("util", "util_alt") if k in metrics]
            return " or ".join(sides)

        out: dict[str, str] = {}
        if "util" in metrics or "util_alt" in metrics:
            out["util_pct"] = f"avg by ({by}) ({either('avg_over_time')})"
            out["util_max"] = f"max by ({by}) ({either('max_over_time')})"
        if "mem_used" in metrics:
            out["mem_used_mib"] = f"max by ({by}) ({over('max_over_time', 'mem_used')})"
        if "mem_total" in metrics:
            out["mem_total_mib"] = f"max by ({by}) ({over('max_over_time', 'mem_total')})"
        elif "mem_used" in metrics and "mem_free" in metrics:
            used, free = over("last_over_time", "mem_used"), over("last_over_time", "mem_free")
            out["mem_total_mib"] = f"max by ({by}) ({used} + {free})"
        power = []
        if "energy" in metrics:  # a counter: rate() mends its resets; needs 2 samples a bucket
            power.append(over("rate", "energy"))
        if "power" in metrics:
            power.append(over("avg_over_time", "power"))
        if power:
            out["power_w"] = f"avg by ({by}) ({' or '.join(power)})"
        return cls(out)

    def promql(self, selector: str) -> str:
        return " or ".join(
            f'label_replace({expr.replace("{S}", selector)}, "{FIELD_LABEL}", "{name}", "", "")'
            for name, expr in self.expressions.items()
        )


def plan_queries(
    hosts: list[HostSeries], starts: dict[str, int], until: int, step: int, fields: int, s: Settings
) -> list[Query]:
    """Range queries covering each host from its start to ``until``: hosts of one start and
    host label packed while their points fit the sample budget, each window cut so no series
    passes ``max_points_per_series``."""
    groups: dict[tuple[int, str], list[HostSeries]] = {}
    for h in sorted(hosts, key=lambda h: h.host):
        if starts[h.host] <= until:
            groups.setdefault((starts[h.host], h.label), []).append(h)
    queries = []
    per_series_cap = s.max_points_per_series
    for (start, _label), group in sorted(groups.items()):
        points = min((until - start) // step + 1, per_series_cap)
        room = max(1, s.max_points_per_query // (fields * points))  # series in one query
        packs: list[list[HostSeries]] = [[]]
        for h in group:
            if packs[-1] and sum(len(x.identities) for x in packs[-1]) + len(h.identities) > room:
                packs.append([])
            packs[-1].append(h)
        for pack in packs:
            series = sum(len(h.identities) for h in pack)
            span = max(1, min(per_series_cap, s.max_points_per_query // (fields * series)))
            for first in range(start, until + 1, span * step):
                last = min(first + (span - 1) * step, until)
                queries.append(Query(tuple(pack), first, last, series))
    return queries

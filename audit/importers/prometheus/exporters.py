"""What GPU exporters call things, and the ``[prometheus]`` settings that name them otherwise.

An exporter profile maps the fields a rollup needs (utilisation, memory used, free or total,
power, energy) to metric names with the factor that brings them to our units (%, MiB, W,
J), and the identity of a GPU (host, GPU, UUID, model, job, pod) to label names, tried in
order. The built-in profiles follow the exporters' own documentation:

- NVIDIA dcgm-exporter (default-counters.csv): ``DCGM_FI_DEV_GPU_UTIL`` (%),
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a 0-1 ratio, where GPU_UTIL is not exported),
  ``DCGM_FI_DEV_FB_USED``/``_FREE`` (MiB), ``DCGM_FI_DEV_POWER_USAGE`` (W),
  ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ, a counter); labels ``gpu``, ``UUID``,
  ``modelName``, ``Hostname``, ``hpc_job`` (its HPC job mapping), ``pod``/``namespace``
  (its Kubernetes mapping), ``GPU_I_ID`` (a MIG instance);
- utkuozdemir/nvidia_gpu_exporter: ``nvidia_smi_utilization_gpu_ratio`` (0-1),
  ``nvidia_smi_memory_used_bytes``/``_total_bytes``, ``nvidia_smi_power_draw_watts``; label
  ``uuid`` (its series carry no index; the host is the scrape target);
- Princeton jobstats' plazonic/nvidia_gpu_prometheus_exporter: ``nvidia_gpu_duty_cycle`` (%),
  ``nvidia_gpu_memory_used_bytes``/``_total_bytes``, ``nvidia_gpu_power_usage_milliwatts``;
  labels ``minor_number``, ``uuid``, ``name``, ``jobid`` (Slurm's job id, in exporter
  versions since September 2025), ``GPU_I_ID``.

A host named by the ``instance`` label loses its port (``gpu-h01:9400`` is host
``gpu-h01``), as Slurm names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from audit.errors import InputError

METRIC_FIELDS = ("util", "util_alt", "mem_used", "mem_free", "mem_total", "power", "energy")
LABEL_FIELDS = ("host", "gpu", "uuid", "model", "job", "pod", "namespace", "mig")
MIB = 1 / 2**20


@dataclass(frozen=True)
class Metric:
    name: str
    scale: float = 1.0  # multiplies the value into our unit

    def describe(self) -> str:
        return self.name if self.scale == 1 else f"{self.name}*{self.scale:g}"


@dataclass(frozen=True)
class Exporter:
    name: str
    metrics: dict[str, Metric]
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def label_names(self) -> list[str]:
        """Every label that tells GPUs (and their jobs) apart: the `by` of each query."""
        return sorted({name for names in self.labels.values() for name in names})


_COMMON_HOST = ("Hostname", "hostname", "host", "node", "instance")
EXPORTERS = {
    "dcgm": Exporter(
        "dcgm-exporter",
        {
            "util": Metric("DCGM_FI_DEV_GPU_UTIL"),
            "util_alt": Metric("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 100.0),
            "mem_used": Metric("DCGM_FI_DEV_FB_USED"),
            "mem_free": Metric("DCGM_FI_DEV_FB_FREE"),
            "power": Metric("DCGM_FI_DEV_POWER_USAGE"),
            "energy": Metric("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0.001),
        },
        {
            "host": _COMMON_HOST,
            "gpu": ("gpu", "UUID"),
            "uuid": ("UUID",),
            "model": ("modelName",),
            "job": ("hpc_job",),
            "pod": ("pod",),
            "namespace": ("namespace",),
            "mig": ("GPU_I_ID",),
        },
    ),
    "jobstats": Exporter(
        "jobstats nvidia_gpu_prometheus_exporter",
        {
            "util": Metric("nvidia_gpu_duty_cycle"),
            "mem_used": Metric("nvidia_gpu_memory_used_bytes", MIB),
            "mem_total": Metric("nvidia_gpu_memory_total_bytes", MIB),
            "power": Metric("nvidia_gpu_power_usage_milliwatts", 0.001),
        },
        {
            "host": _COMMON_HOST,
            "gpu": ("minor_number", "uuid"),
            "uuid": ("uuid",),
            "model": ("name",),
            "job": ("jobid",),
            "mig": ("GPU_I_ID",),
        },
    ),
    "nvidia_gpu_exporter": Exporter(
        "nvidia_gpu_exporter",
        {
            "util": Metric("nvidia_smi_utilization_gpu_ratio", 100.0),
            "mem_used": Metric("nvidia_smi_memory_used_bytes", MIB),
            "mem_total": Metric("nvidia_smi_memory_total_bytes", MIB),
            "power": Metric("nvidia_smi_power_draw_watts"),
        },
        {"host": _COMMON_HOST, "gpu": ("uuid",), "uuid": ("uuid",)},
    ),
}
AUTO_ORDER = ("dcgm", "jobstats", "nvidia_gpu_exporter")  # when a server has several


# -- the resolution rule -------------------------------------------------------------------
_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
DEFAULT_RESOLUTION = {"1d": "1m", "7d": "5m", "longer": "15m"}


def seconds_of(text: str) -> int | None:
    """'5m' -> 300; None for anything but a whole number and one unit (s, m, h, d, w)."""
    match = _DURATION.match(text.strip()) if isinstance(text, str) else None
    if not match or int(match[1]) <= 0:
        return None
    return int(match[1]) * _UNIT_SECONDS[match[2]]


def duration_text(seconds: int) -> str:
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNIT_SECONDS[unit] == 0:
            return f"{seconds // _UNIT_SECONDS[unit]}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class Settings:
    """``[prometheus]`` of the configuration, checked."""

    exporter: str  # a key of EXPORTERS, "auto" or "custom"
    metrics: dict[str, Metric]  # overrides of the exporter's metric names
    labels: dict[str, tuple[str, ...]]  # overrides of its label names
    resolution: list[tuple[int | None, int]]  # (window up to, seconds; None: longer)
    max_points_per_series: int
    max_points_per_query: int
    concurrency: int
    timeout_s: float
    max_retries: int
    backoff_s: float
    max_response_bytes: int

    def step_for(self, window_s: float) -> int:
        for limit, step in self.resolution:
            if limit is None or window_s <= limit:
                return step
        return self.resolution[-1][1]

    def exporter_named(self, name: str) -> Exporter:
        """The profile ``name`` with the configured metric and label names laid over it."""
        if name == "custom":
            base = Exporter("custom ([prometheus] metrics)", {}, {"host": _COMMON_HOST})
        else:
            base = EXPORTERS[name]
        exporter = replace(
            base,
            metrics={**base.metrics, **self.metrics},
            labels={**base.labels, **self.labels},
        )
        if "util" not in exporter.metrics:
            raise InputError(
                "config [prometheus]: exporter 'custom' needs metrics.util (the utilisation "
                'metric, e.g. util = "my_gpu_busy_ratio*100")'
            )
        return exporter


def settings_from(config) -> Settings:
    """Check ``[prometheus]``: a bad entry is an error naming it (exit 2)."""
    section = config.prometheus
    where = f"config {config.path or '(defaults)'}: [prometheus]"
    exporter = section.exporter
    if exporter not in ("auto", "custom", *EXPORTERS):
        raise InputError(
            f"{where} exporter {exporter!r} is not one of: auto, custom, {', '.join(EXPORTERS)}"
        )
    metrics = {}
    for key, text in section.metrics.items():
        if key not in METRIC_FIELDS:
            raise InputError(
                f"{where} metrics.{key}: unknown field; valid fields: {', '.join(METRIC_FIELDS)}"
            )
        metrics[key] = _metric(text, f"{where} metrics.{key}")
    labels = {}
    for key, text in section.labels.items():
        if key not in LABEL_FIELDS:
            raise InputError(
                f"{where} labels.{key}: unknown field; valid fields: {', '.join(LABEL_FIELDS)}"
            )
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        if not names or not all(_LABEL_NAME.match(n) for n in names):
            raise InputError(
                f"{where} labels.{key}: expected label names separated by commas, got {text!r}"
            )
        labels[key] = names
    resolution = []
    for key, text in section.resolution.items():
        limit = None if key == "longer" else seconds_of(key)
        step = seconds_of(text)
        if (limit is None and key != "longer") or step is None:
            raise InputError(
                f"{where} resolution.{key}: expected a window and its bucket width as "
                f'durations, e.g. "7d" = "5m" or longer = "15m", got {key!r} = {text!r}'
            )
        resolution.append((limit, step))
    if not resolution:
        raise InputError(f'{where} resolution: give at least longer = "15m"')
    resolution.sort(key=lambda pair: (pair[0] is None, pair[0] or 0))
    numbers = {
        "max_points_per_series": (2, 11_000),  # Prometheus refuses more (HTTP 400)
        "max_points_per_query": (1_000, 100_000_000),
        "concurrency": (1, 32),
        "max_retries": (0, 20),
    }
    for key, (lo, hi) in numbers.items():
        if not lo <= getattr(section, key) <= hi:
            raise InputError(
                f"{where} {key} must be from {lo:,} to {hi:,}, got {getattr(section, key)!r}"
            )
    for key in ("timeout_seconds", "backoff_seconds", "max_response_mb"):
        if not 0 < getattr(section, key) <= 1e6:
            raise InputError(
                f"{where} {key} must be a positive number, got {getattr(section, key)!r}"
            )
    return Settings(
        exporter=exporter,
        metrics=metrics,
        labels=labels,
        resolution=resolution,
        max_points_per_series=section.max_points_per_series,
        max_points_per_query=section.max_points_per_query,
        concurrency=section.concurrency,
        timeout_s=float(section.timeout_seconds),
        max_retries=section.max_retries,
        backoff_s=float(section.backoff_seconds),
        max_response_bytes=int(section.max_response_mb * 2**20),
    )


_METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _metric(text: str, where: str) -> Metric:
    """'name', 'name*100' or 'name/1048576'."""
    name, operator, factor = text.replace(" ", "").partition("*")
    if not operator:
        name, operator, factor = text.replace(" ", "").partition("/")
    try:
        scale = 1.0 if not operator else float(factor)
    except ValueError:
        scale = 0.0
    if not _METRIC_NAME.match(name) or not (scale > 0 and scale < float("inf")):
        raise InputError(
            f"{where}: expected a metric name, optionally times or divided by a positive "
            f'number (e.g. "gpu_busy_ratio*100", "gpu_mem_bytes/1048576"), got {text!r}'
        )
    return Metric(name, scale if operator != "/" else 1 / scale)

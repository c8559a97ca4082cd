"""DCGM fields as GPU samples: which field feeds which column, a series' labels as host,
GPU, job and pod, and one row per host, GPU and time, for dcgm-exporter text and
Prometheus JSON alike."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from audit.importers.telemetry.samples import SAMPLE_SCHEMA

# dcgm-exporter field -> (column, scale)
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("engine_active_pct", 100.0),  # a 0-1 ratio
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),
    "DCGM_FI_DEV_FB_FREE": ("mem_free_mib", 1.0),
    "DCGM_FI_DEV_FB_TOTAL": ("mem_total_mib", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
}


def add_dcgm_value(
    rows: dict,
    labels: dict,
    metric: str,
    value: float,
    ts: datetime,
    default_host: str,
    origin: str,
) -> None:
    host = (
        labels.get("Hostname") or labels.get("hostname") or labels.get("instance") or default_host
    )
    gpu = labels.get("gpu") or labels.get("UUID") or labels.get("uuid") or "0"
    key = (host, gpu, ts)
    row = rows.setdefault(
        key,
        {
            "host": host,
            "gpu": gpu,
            "ts": ts,
            "model": labels.get("modelName"),
            "uuid": labels.get("UUID") or labels.get("uuid"),
            "job_label": labels.get("hpc_job") or None,
            "pod": f"{labels['namespace']}/{labels['pod']}"
            if labels.get("pod") and labels.get("namespace")
            else labels.get("pod") or None,
            "origin": origin,
        },
    )
    if metric in DCGM_FIELDS:  # other DCGM fields still show the host was up
        column, scale = DCGM_FIELDS[metric]
        row[column] = value * scale


def identifies_gpu(labels: dict) -> bool:
    return any(labels.get(k) for k in ("gpu", "UUID", "uuid"))


def dcgm_frame(rows: dict) -> pl.DataFrame:
    records = []
    for row in rows.values():
        util = row.get("util_pct", row.get("engine_active_pct"))
        used, free = row.get("mem_used_mib"), row.get("mem_free_mib")
        total = row.get("mem_total_mib")
        records.append(
            {
                **{
                    k: row.get(k)
                    for k in ("host", "gpu", "ts", "model", "uuid", "job_label", "pod", "origin")
                },
                "util_pct": util,
                "mem_used_mib": used,
                "mem_total_mib": total
                if total is not None
                else (used + free if used is not None and free is not None else None),
                "power_w": row.get("power_w"),
            }
        )
    if not records:
        return pl.DataFrame(schema=SAMPLE_SCHEMA)
    return pl.DataFrame(records).select(list(SAMPLE_SCHEMA)).cast(SAMPLE_SCHEMA)

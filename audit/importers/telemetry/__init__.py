"""GPU telemetry files: nvidia-smi CSV, dcgm-exporter / Prometheus text, Prometheus JSON.

Everything becomes rows of ``gpu_samples`` (host, gpu, ts, util_pct, mem_used_mib, ...).
nvidia-smi files can be large (a week of 1,000 GPUs at 1 sample/min is 10M rows), so they
are parsed by polars in bulk, never line by line in Python.

The package, one job a module: ``reader`` tells a file's format (reading it with
``file_text``) and hands it to ``nvidia_smi``, ``exposition`` or ``prometheus_json``;
``dcgm`` turns DCGM series into samples for the last two; ``samples`` is the sample row and
the one rule for what its values and times may be, which the trackers' system metrics and
the Prometheus importer share.
"""

from audit.importers.telemetry.exposition import read_exposition_text
from audit.importers.telemetry.reader import read_telemetry
from audit.importers.telemetry.samples import (
    FIRST_YEAR,
    LAST_YEAR,
    SAMPLE_SCHEMA,
    VALID_RANGES,
    TelemetryFile,
    valid_time,
    valid_value,
)

__all__ = [
    "FIRST_YEAR",
    "LAST_YEAR",
    "SAMPLE_SCHEMA",
    "VALID_RANGES",
    "TelemetryFile",
    "read_exposition_text",
    "read_telemetry",
    "valid_time",
    "valid_value",
]

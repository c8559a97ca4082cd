"""Decoding a chunk of a W&B log's protobuf records: history as columns, GPU stats as
samples, summary updates as an ordered list of changes; the few other records (run,
config, exit, environment, telemetry) are handed back undecoded for ``fold``. A chunk is
decoded the same way in this process or in a worker process."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from audit.errors import InputError
from audit.importers import numbers
from audit.importers.wandb.history import HIDDEN_HISTORY, History
from audit.importers.wandb.protobufs import protobufs


def protobuf_ms(timestamp) -> int | None:
    """A protobuf time; unset, or outside the years every tracker's times keep to: None."""
    if not timestamp.seconds and not timestamp.nanos:
        return None
    return numbers.plausible_ms(timestamp.seconds * 1000 + timestamp.nanos // 1_000_000)


_GPU_FIELDS = {
    "gpu": "util_pct",
    "memoryAllocatedBytes": "mem_bytes",
    "memoryAllocated": "mem_pct",
    "powerWatts": "power_w",
}
_SMALL_RECORDS = {"run", "config", "exit", "environment", "telemetry"}


@dataclass
class Decoded:
    """What a chunk of records holds, in a form that crosses process boundaries."""

    history: list[pl.DataFrame] = field(default_factory=list)
    history_rows: int = 0
    last_ms: int | None = None
    samples: list[tuple] = field(default_factory=list)
    summary: list[tuple[str, object]] = field(
        default_factory=list
    )  # ("set", {k: v}) | ("remove", [k])
    small: list[bytes] = field(default_factory=list)  # run, config, exit, ... records, in order
    records: int = 0


def decode(path: Path, payloads: list[bytes], offsets: list[int], record_class=None) -> Decoded:
    """Decode one chunk of records: history as columns, GPU stats as samples, summary
    updates as an ordered list of changes; the few other records are handed back."""
    from google.protobuf.message import DecodeError

    record_class = record_class or worker_record_class()
    out = Decoded()
    history = History()
    interned = history.interned
    summary: dict[str, str] = {}
    for payload, offset in zip(payloads, offsets, strict=True):
        record = record_class()
        try:
            record.ParseFromString(payload)
        except DecodeError as exc:
            raise InputError(
                f"{path}: byte {offset}: the record does not parse as a W&B protobuf "
                f"({' '.join(str(exc).split()) or 'DecodeError'})"
            ) from None
        out.records += 1
        kind = record.WhichOneof("record_type")
        if kind == "history":
            keys, values = [], []
            step = ms = None
            for item in record.history.item:
                key = item.key
                if not key:
                    nested = item.nested_key
                    key = nested[0] if len(nested) == 1 else ".".join(nested)
                if key in HIDDEN_HISTORY:
                    try:
                        if key == "_step":
                            step = numbers.step(
                                int(float(item.value_json)), f"{path}: byte {offset}", "_step"
                            )
                        elif key == "_timestamp":
                            ms = numbers.epoch_seconds_to_ms(float(item.value_json))
                    except (ValueError, OverflowError):
                        raise InputError(
                            f"{path}: byte {offset}: history {key} is not a number: "
                            f"{item.value_json[:40]!r}"
                        ) from None
                    continue
                keys.append(interned.setdefault(key, key))
                values.append(item.value_json)
            if step is None and record.history.HasField("step"):
                step = record.history.step.num
            history.add_row(keys, values, step, ms)
            out.history_rows += 1
            if ms is not None and (out.last_ms is None or ms > out.last_ms):
                out.last_ms = ms
        elif kind == "summary":
            if record.summary.remove:
                if summary:
                    out.summary.append(("set", summary))
                    summary = {}
                out.summary.append(
                    ("remove", [i.key or ".".join(i.nested_key) for i in record.summary.remove])
                )
            summary_updates(record.summary, summary)
        elif kind == "stats":
            ms = protobuf_ms(record.stats.timestamp)
            if ms is not None and (out.last_ms is None or ms > out.last_ms):
                out.last_ms = ms
            per_gpu: dict[str, dict] = {}
            for item in record.stats.item:
                parts = item.key.split(".")
                if len(parts) == 3 and parts[0] == "gpu" and parts[2] in _GPU_FIELDS:
                    try:
                        value = float(item.value_json)
                    except ValueError:
                        continue
                    per_gpu.setdefault(parts[1], {})[_GPU_FIELDS[parts[2]]] = value
            for gpu, values in per_gpu.items():
                out.samples.append((gpu, ms, values))
        elif kind in _SMALL_RECORDS:
            out.small.append(payload)
    if summary:
        out.summary.append(("set", summary))
    history.compact()
    out.history = history.chunks
    return out


_WORKER_RECORD_CLASS = None


def worker_record_class():
    global _WORKER_RECORD_CLASS
    if _WORKER_RECORD_CLASS is None:
        _WORKER_RECORD_CLASS = protobufs()
    return _WORKER_RECORD_CLASS


def summary_updates(record, summary: dict) -> None:
    """Summary updates kept as JSON text: wandb writes one after every history row (all
    keys each time), and only the last value of a key is ever used."""
    for item in record.update:
        key = item.key
        if not key:
            nested = item.nested_key
            key = nested[0] if len(nested) == 1 else ".".join(nested)
        summary[key] = item.value_json

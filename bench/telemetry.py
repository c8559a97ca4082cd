"""Deterministic nvidia-smi telemetry for H hosts x 8 GPUs x D days at 1 sample/min.

    python -m bench.telemetry --hosts 125 --days 7 --out /tmp/telemetry

Writes one ``<host>.csv`` per host in ``nvidia-smi --query-gpu=timestamp,index,name,
utilization.gpu,memory.used,memory.total --format=csv`` form, built with polars (a 10M-row
set takes seconds, not minutes).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

import polars as pl

HEADER = "timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"


def phase(host_index: int) -> int:
    """The hour of the 14-hour busy/idle cycle a host starts in: hosts of the same phase
    write the same samples (``bench.data`` copies the file instead of building it again)."""
    return host_index * 3 % 14


def write_host(path: Path, host_index: int, days: int, start: datetime) -> int:
    minutes = days * 24 * 60
    frame = (
        pl.DataFrame({"minute": pl.arange(0, minutes, eager=True)})
        .join(pl.DataFrame({"gpu": pl.arange(0, 8, eager=True)}), how="cross")
        .with_columns(
            ts=pl.lit(start) + pl.duration(minutes=pl.col("minute")),
            # busy for 10 of every 14 hours, idle otherwise; a seed per host shifts the phase
            busy=((pl.col("minute") // 60 + phase(host_index)) % 14) < 10,
        )
        .with_columns(
            util=pl.when(pl.col("busy"))
            .then(85 + (pl.col("minute") * 7 + pl.col("gpu") * 3) % 15)
            .otherwise(0),
            mem=pl.when(pl.col("busy")).then(60_000 + (pl.col("minute") * 13) % 9000).otherwise(3),
        )
        .select(
            pl.concat_str(
                [
                    pl.col("ts").dt.strftime("%Y/%m/%d %H:%M:%S.000"),
                    pl.col("gpu").cast(pl.String),
                    pl.lit("NVIDIA H100 80GB HBM3"),
                    pl.col("util").cast(pl.String) + pl.lit(" %"),
                    pl.col("mem").cast(pl.String) + pl.lit(" MiB"),
                    pl.lit("81559 MiB"),
                ],
                separator=", ",
            ).alias(HEADER)
        )
    )
    frame.write_csv(path, quote_style="never")
    return frame.height


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--days", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows = sum(
        write_host(args.out / f"gpu-{h:04d}.csv", h, args.days, datetime(2026, 11, 16))
        for h in range(args.hosts)
    )
    print(
        f"wrote {rows:,} samples for {args.hosts} hosts to {args.out} in {time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

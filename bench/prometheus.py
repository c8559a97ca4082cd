"""A real Prometheus loaded with a GPU fleet: for the tests and the scale measurements (issue 42).

    python -m bench.prometheus --size L            # 125 hosts × 8 GPUs × 7 days, both paths
    python -m bench.prometheus --size XL           # 1,000 hosts: by hand, an hour or more

The fleet is the bench's own (``bench.telemetry``: busy 10 of every 14 hours, idle
otherwise, one sample a minute), written twice: as nvidia-smi CSV per host, and as
dcgm-exporter series (``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_FB_USED``/``_FREE``) in
OpenMetrics text turned into TSDB blocks by ``promtool tsdb create-blocks-from
openmetrics``, served by the Debian package's ``prometheus`` on 127.0.0.1. Both paths are
imported into warehouses of their own with the size's Slurm jobs, then scanned and
reported, each step in a fresh ``audit`` process under ``nice`` with its wall time, CPU time
and peak memory (``bench.xl.measure``). Results: a Markdown table on stdout and in
``<cache>/<size>/prometheus/results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import polars as pl
import requests

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
# promtool cuts blocks of 2 hours unless told otherwise, reading its input once per block
# (84 passes for a week); a week per block reads it twice.
MAX_BLOCK = "168h"


def available() -> str | None:
    """Why a real Prometheus cannot run here, or None."""
    missing = [p for p in (PROMETHEUS, PROMTOOL) if not os.access(p, os.X_OK)]
    if missing:
        return f"{' and '.join(missing)} missing (Debian package prometheus; .ci/run installs it)"
    return None


def write_openmetrics(families: Iterable[tuple[str, str, pl.DataFrame]], path: Path) -> int:
    """OpenMetrics text of metric families (name, type, frame of ``labels`` text such as
    ``gpu="0",Hostname="h1"``, ``value`` and ``ts`` in seconds): each family's lines
    together, each series' samples in time order, as promtool requires. Returns the
    samples written."""
    written = 0
    with open(path, "wb") as out:
        for name, kind, frame in families:
            out.write(f"# TYPE {name} {kind}\n".encode())
            sample = "_total" if kind == "counter" else ""
            lines = frame.sort("labels", "ts").select(
                pl.concat_str(
                    [
                        pl.lit(f"{name}{sample}{{"),
                        pl.col("labels"),
                        pl.lit("} "),
                        pl.col("value").cast(pl.String),
                        pl.lit(" "),
                        pl.col("ts").cast(pl.Int64).cast(pl.String),
                    ]
                ).alias("line")
            )
            lines.write_csv(out, include_header=False, quote_style="never")
            written += frame.height
        out.write(b"# EOF\n")
    return written


def create_blocks(openmetrics: Path, tsdb: Path) -> None:
    """TSDB blocks of an OpenMetrics file, added to ``tsdb`` (blocks of several files may
    overlap in time: Prometheus merges them since 2.39)."""
    tsdb.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "-q",
         f"--max-block-duration={MAX_BLOCK}", str(openmetrics), str(tsdb)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"promtool failed on {openmetrics}: {done.stderr[-2000:]}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def prometheus_server(
    tsdb: Path, workdir: Path, *flags: str, query_log: Path | None = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real ``prometheus`` on 127.0.0.1 at a free port, serving ``tsdb`` (no scraping);
    yields (url, process). ``flags`` are more command-line flags (e.g. a small
    ``--query.max-samples``); ``query_log`` keeps every query's parameters there."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    logged = f"  query_log_file: {query_log}\n" if query_log else ""
    config.write_text(f"global:\n  scrape_interval: 1h\n{logged}")
    port = free_port()
    log = open(workdir / "prometheus.log", "w")  # noqa: SIM115
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=100y",  # the fleet's weeks are in the past
            *flags,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}"
                )
            try:
                if requests.get(f"{url}/-/ready", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus was not ready in 120 s")
            time.sleep(0.2)
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


# -- the bench fleet -----------------------------------------------------------------------
HOSTS_PER_FILE = 25  # 200 GPUs a week: 6 M samples, ~600 MB of text per promtool run
MODEL = "NVIDIA H100 80GB HBM3"
MEM_TOTAL = 81559


def fleet_frame(host_index: int, days: int, start: datetime) -> pl.DataFrame:
    """One host's samples as ``bench.telemetry.write_host`` writes them (the same values)."""
    from bench.data import host_name
    from bench.telemetry import phase

    minutes = days * 24 * 60
    return (
        pl.DataFrame({"minute": pl.arange(0, minutes, eager=True)})
        .join(pl.DataFrame({"gpu": pl.arange(0, 8, eager=True)}), how="cross")
        .with_columns(busy=((pl.col("minute") // 60 + phase(host_index)) % 14) < 10)
        .with_columns(
            util=pl.when(pl.col("busy"))
            .then(85 + (pl.col("minute") * 7 + pl.col("gpu") * 3) % 15)
            .otherwise(0),
            mem=pl.when(pl.col("busy")).then(60_000 + (pl.col("minute") * 13) % 9000).otherwise(3),
            ts=int(start.timestamp()) + pl.col("minute") * 60,
            labels=pl.format(
                'gpu="{}",UUID="GPU-{}-{}",modelName="{}",Hostname="{}"',
                pl.col("gpu"),
                pl.lit(f"{host_index:05d}"),
                pl.col("gpu"),
                pl.lit(MODEL),
                pl.lit(host_name(host_index)),
            ),
        )
    )


def write_fleet_blocks(hosts: int, days: int, start: datetime, tsdb: Path, scratch: Path) -> int:
    """The fleet's dcgm-exporter series as TSDB blocks, HOSTS_PER_FILE hosts per promtool
    run (the text of one run is deleted before the next is written)."""
    scratch.mkdir(parents=True, exist_ok=True)
    samples = 0
    for first in range(0, hosts, HOSTS_PER_FILE):
        frame = pl.concat(
            [fleet_frame(i, days, start) for i in range(first, min(first + HOSTS_PER_FILE, hosts))]
        )
        text = scratch / f"fleet-{first:05d}.om"
        samples += write_openmetrics(
            [
                ("DCGM_FI_DEV_GPU_UTIL", "gauge", frame.select("labels", "ts", value="util")),
                ("DCGM_FI_DEV_FB_USED", "gauge", frame.select("labels", "ts", value="mem")),
                (
                    "DCGM_FI_DEV_FB_FREE",
                    "gauge",
                    frame.select("labels", "ts", value=MEM_TOTAL - pl.col("mem")),
                ),
            ],
            text,
        )
        create_blocks(text, tsdb)
        text.unlink()
        print(
            f"  blocks of hosts {first + 1}-{min(first + HOSTS_PER_FILE, hosts)}", file=sys.stderr
        )
    return samples


# -- the measurements ------------------------------------------------------------------------
WEEK = "2026-W47"
AUDIT_NOW = "2026-11-23T00:00:00"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process (the server's share of an import)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PATHS = {"raw": ("raw CSV", "raw.duckdb", None), "1m": ("Prometheus 1m", "prom1m.duckdb", "1m"),
         "5m": ("Prometheus 5m", "prom5m.duckdb", "5m")}  # fmt: skip


def run(
    size: str, cache: Path, steps_wanted: list[str] | None, kill_gib: float, paths: list[str]
) -> None:
    from bench.data import SIZES, DataSet
    from bench.xl import GIB, measure

    data = DataSet(cache / size, SIZES[size])
    part_of = {"telemetry": data.telemetry_files, "sacct": lambda: data.sacct}
    for part in part_of:
        if not (data.root / f".done-{part}").exists():
            subprocess.run(
                ["nice", "-n", "19", sys.executable, "-m", "bench.data", size, str(cache), part],
                check=True,
            )
    work = data.root / "prometheus"
    work.mkdir(parents=True, exist_ok=True)
    tsdb = work / "tsdb"
    hosts, days = data.size.hosts, data.size.days
    start = datetime(2026, 11, 16)
    results = work / "results.jsonl"
    records = (
        [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    )
    done = {r["step"] for r in records}

    def step(name: str, cmd: list[str], server_pid: int | None = None) -> None:
        if name in done or (steps_wanted and not any(w in name for w in steps_wanted)):
            return
        print(f"{datetime.now():%H:%M:%S} {name} ...", file=sys.stderr, flush=True)
        server_before = cpu_seconds(server_pid) if server_pid else 0.0
        record = measure(name, cmd, work / f"{_slug(name)}.out", int(kill_gib * GIB),
                         time.time() + 6 * 3600, work)  # fmt: skip
        if server_pid:
            record["server_cpu_seconds"] = round(cpu_seconds(server_pid) - server_before, 1)
        record["db_bytes"] = _size(work / _db_of(name))
        records.append(record)
        with open(results, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    if not (tsdb / ".done").exists():
        shutil.rmtree(tsdb, ignore_errors=True)
        started = time.monotonic()
        samples = write_fleet_blocks(hosts, days, start, tsdb, work / "scratch")
        (tsdb / ".done").write_text(f"{samples} samples in {time.monotonic() - started:.0f} s\n")
    raw_samples = hosts * 8 * days * 24 * 60
    with prometheus_server(tsdb, work / "server") as (url, server):
        audit = [sys.executable, "-m", "audit", "--config", str(data.config)]
        week = ["--since", "2026-11-16", "--until", "2026-11-23"]
        for label, db, extra in (PATHS[p] for p in paths):
            base = [*audit, "--db", str(work / db)]
            if extra is None:
                step(
                    f"{label}: ingest gpu",
                    [*base, "ingest", "gpu", *map(str, data.telemetry_files())],
                )
            else:
                step(f"{label}: ingest prometheus",
                     [*base, "ingest", "prometheus", "--url", url, *week, "--step", extra],
                     server.pid)  # fmt: skip
            step(f"{label}: ingest slurm", [*base, "ingest", "slurm", str(data.sacct)])
            step(
                f"{label}: scan",
                [*base, "scan", "--format", "json", "--output", str(work / f"{db}.scan.json")],
            )
            step(f"{label}: report weekly (first render)",
                 [*base, "report", "weekly", "--week", WEEK, "--output", str(work / f"{db}.html")])  # fmt: skip
    print(table(records, raw_samples))


def _db_of(step_name: str) -> str:
    label = step_name.split(":", 1)[0]
    return {
        "raw CSV": "raw.duckdb",
        "Prometheus 1m": "prom1m.duckdb",
        "Prometheus 5m": "prom5m.duckdb",
    }[label]


def _size(path: Path) -> int:
    wal = path.with_name(path.name + ".wal")
    return sum(p.stat().st_size for p in (path, wal) if p.exists())


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def table(records: list[dict], raw_samples: int) -> str:
    lines = [
        f"raw samples of the fleet: {raw_samples:,}",
        "",
        "| step | wall | CPU (user+sys) | server CPU | peak RSS | warehouse after | load avg "
        "start → end | result |",
        "|---|--:|--:|--:|--:|--:|---|---|",
    ]
    for r in records:
        result = r["killed"] or _last_line(r["stdout_tail"] or r["stderr_tail"])
        server = f"{r['server_cpu_seconds']:,.1f} s" if "server_cpu_seconds" in r else ""
        lines.append(
            f"| {r['step']} | {r['seconds']:,.1f} s | {r['cpu_seconds']:,.1f} s | {server} "
            f"| {max(r['vmhwm_mib'], r['tree_peak_mib']):,} MiB | {r['db_bytes'] / 2**20:,.0f} MiB "
            f"| {r['load_start']} → {r['load_end']} | {result} |"
        )
    return "\n".join(lines)


def _last_line(text: str) -> str:
    found = [line for line in text.splitlines() if line.strip()]
    return found[-1][:200].replace("|", "\\|") if found else ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.prometheus", description=__doc__.splitlines()[0]
    )
    default_cache = os.environ.get("AUDIT_BENCH_CACHE", Path.home() / ".cache" / "audit-bench")
    parser.add_argument("--cache", type=Path, default=Path(default_cache))
    parser.add_argument("--size", choices=["S", "M", "L", "XL"], default="L")
    parser.add_argument("--step", action="append", help="only steps whose name holds this")
    parser.add_argument("--kill-gib", type=float, default=14.0)
    parser.add_argument(
        "--paths", default="raw,1m,5m", help="imports to compare: raw, 1m, 5m (comma-separated)"
    )
    args = parser.parse_args(argv)
    problem = available()
    if problem:
        raise SystemExit(problem)
    paths = [p.strip() for p in args.paths.split(",")]
    if not paths or any(p not in PATHS for p in paths):
        raise SystemExit(f"--paths: a comma-separated list of {', '.join(PATHS)}")
    run(args.size, args.cache, args.step, args.kill_gib, paths)


if __name__ == "__main__":
    main()

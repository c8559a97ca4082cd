"""``audit watch --once`` over a recorded state of 1,000 nodes and 10,000 running jobs.

    python -m bench.watch [--reps 5] [--cache DIR] [--results bench/results]

The state (seeded, generated once into the cache): ``squeue --json`` output of Slurm
22.05's layout (the shape Debian's 22.05 writes, tests/data/slurm/live/squeue-22.05.json)
with 10 jobs on each of 1,000 nodes (4 + 2 + 1 + 1 GPUs and six CPU-only jobs: 4,000 GPU
jobs holding all 8,000 GPUs), and one nvidia-smi log per node holding the last 70 minutes
at one sample a minute (560 rows per node, 560,000 in all); 100 GPU jobs have been at
0 % for the whole hour, the others busy. A ``squeue`` script on PATH prints the recorded
answer, as the real client would. Timed, each in a fresh process: the first ``--once`` on
an empty warehouse (imports every log, warns the 100 idle jobs through a local webhook),
and a second one after one more minute of samples was appended (what each interval of a
running watch does). Results go to ``bench/results/<date>-watch.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

NODES, JOBS_PER_NODE, MINUTES, IDLE_JOBS = 1000, 10, 70, 100
GPU_LAYOUT = [4, 2, 1, 1, 0, 0, 0, 0, 0, 0]  # GPUs of the jobs on one node
TARGET_SECONDS = 10.0


def generate(folder: Path, now: datetime) -> dict:
    """The recorded state under ``folder``: squeue.json and gpu/<node>.csv."""
    rng = random.Random(43)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu").mkdir(exist_ok=True)
    start = int((now - timedelta(hours=3)).replace(tzinfo=UTC).timestamp())
    jobs, busy = [], {}
    gpu_jobs = [(n, j) for n in range(NODES) for j, g in enumerate(GPU_LAYOUT) if g]
    idle = set(rng.sample(gpu_jobs, IDLE_JOBS))
    job_id = 1000
    for node in range(NODES):
        host = f"gpu-{node:04d}"
        first = 0
        for slot, gpus in enumerate(GPU_LAYOUT):
            job_id += 1
            detail = []
            if gpus:
                last = first + gpus - 1
                detail = [f"gpu:{gpus}(IDX:{first}-{last})" if gpus > 1 else f"gpu:1(IDX:{first})"]
                for gpu in range(first, last + 1):
                    busy[(host, gpu)] = (node, slot) not in idle
                first = last + 1
            jobs.append(_job(job_id, host, gpus, detail, start + rng.randrange(0, 3600), rng))
    document = {
        "meta": {
            "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
            "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"},
        },
        "errors": [],
        "jobs": jobs,
    }
    (folder / "squeue.json").write_text(json.dumps(document))
    first_minute = now - timedelta(minutes=MINUTES)
    for node in range(NODES):
        host = f"gpu-{node:04d}"
        lines = [
            "timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"
        ]
        for minute in range(MINUTES):
            at = first_minute + timedelta(minutes=minute)
            for gpu in range(8):
                util = rng.randrange(60, 100) if busy[(host, gpu)] else 0
                lines.append(
                    f"{at:%Y/%m/%d %H:%M:%S}.000, {gpu}, NVIDIA H100 80GB HBM3, {util} %, "
                    f"{40000 if util else 0} MiB, 81559 MiB"
                )
        (folder / "gpu" / f"{host}.csv").write_text("\n".join(lines) + "\n")
    return busy


def _job(job_id: int, host: str, gpus: int, detail: list[str], start: int, rng) -> dict:
    tres = f"cpu={rng.choice([4, 8, 16])},mem=64G,node=1,billing=1" + (
        f",gres/gpu={gpus}" if gpus else ""
    )
    return {
        "account": rng.choice(["coder", "rl", "eval", "infra"]),
        "admin_comment": "",
        "array_job_id": 0,
        "array_task_id": None,
        "cluster": "bench",
        "cpus": 8,
        "eligible_time": start - 60,
        "end_time": start + 86400,
        "gres_detail": detail,
        "het_job_id": 0,
        "het_job_offset": 0,
        "job_id": job_id,
        "job_state": "RUNNING",
        "name": f"job-{job_id}",
        "node_count": 1,
        "nodes": host,
        "partition": "gpu" if gpus else "cpu",
        "start_time": start,
        "submit_time": start - 120,
        "time_limit": 1440,
        "tres_alloc_str": tres,
        "tres_per_node": f"gres:gpu:{gpus}" if gpus else "",
        "tres_req_str": tres,
        "user_name": f"user{job_id % 97:02d}",
    }


def append_minute(folder: Path, at: datetime) -> None:
    """One more sample per GPU, as nvidia-smi -l 60 writes it."""
    for path in sorted((folder / "gpu").glob("*.csv")):
        with open(path, "a") as fh:
            for gpu in range(8):
                fh.write(
                    f"{at:%Y/%m/%d %H:%M:%S}.000, {gpu}, NVIDIA H100 80GB HBM3, 0 %, 0 MiB, 81559 MiB\n"
                )


class _Exporters(BaseHTTPRequestHandler):
    """1,000 dcgm-exporters in one server: /gpu-NNNN/metrics answers for that node, the
    idle jobs' GPUs at 0 %, the others busy."""

    busy: ClassVar[dict] = {}

    def do_GET(self):
        host = self.path.strip("/").split("/")[0]
        lines = []
        for gpu in range(8):
            util = 85 if self.busy.get((host, gpu)) else 0
            labels = (
                f'gpu="{gpu}",UUID="GPU-{host}-{gpu}",modelName="NVIDIA H100 80GB HBM3",'
                f'Hostname="{host}"'
            )
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util}")
            lines.append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {40000 if util else 0}")
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Hook(BaseHTTPRequestHandler):
    received = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received += 1
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def run_once(work: Path, state: Path, hook: str, telemetry: str) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds of the process and the machine's load meanwhile (the
    1-minute load average at the end: other agents share the cores)."""
    config = work / "audit.toml"
    config.write_text(
        f"""
[watch]
interval = "5m"
sacct = false
cluster = "bench"
{telemetry}
stale_after = "10m"

[watch.notify]
urls = ["{hook}"]

[watch.policy.idle-gpu]
kind = "idle"
partitions = ["gpu"]
"""
    )
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "squeue"
    fake.write_text(f"#!/bin/sh\nexec cat {state / 'squeue.json'}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "audit",
            "--db",
            str(work / "audit.duckdb"),
            "--config",
            str(config),
            "watch",
            "--once",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"audit watch --once failed: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu, os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("AUDIT_BENCH_CACHE", Path.home() / ".cache" / "audit-bench")),
    )
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"json://127.0.0.1:{server.server_port}/hook"
    exporters = ThreadingHTTPServer(("127.0.0.1", 0), _Exporters)
    threading.Thread(target=exporters.serve_forever, daemon=True).start()
    runs: dict[str, list[tuple[float, float, float]]] = {"scrape": [], "first": [], "next": []}
    warned: dict[str, list[int]] = {"scrape": [], "first": [], "next": []}
    for rep in range(args.reps):
        now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
        # the steady state: the warehouse holds the last hour, the watch scrapes every exporter
        work = args.cache / "watch" / f"scrape{rep}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        state = work / "state"
        _Exporters.busy = generate(state, now)
        history = sorted(str(p) for p in (state / "gpu").glob("*.csv"))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "audit",
                "--db",
                str(work / "audit.duckdb"),
                "ingest",
                "gpu",
                *history,
            ],
            check=True,
            capture_output=True,
        )
        urls = ", ".join(
            f'"http://127.0.0.1:{exporters.server_port}/gpu-{n:04d}/metrics"' for n in range(NODES)
        )
        _Hook.received = 0
        runs["scrape"].append(run_once(work, state, hook, f"dcgm = [{urls}]"))
        warned["scrape"].append(_Hook.received)
        # following the logs from nothing: the first interval reads an hour of every log
        work = args.cache / "watch" / f"logs{rep}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        state = work / "state"
        generate(state, now)
        logs = f'nvidia_smi = ["{state}/gpu/*.csv"]'
        _Hook.received = 0
        runs["first"].append(run_once(work, state, hook, logs))
        warned["first"].append(_Hook.received)
        append_minute(state, now + timedelta(seconds=30))
        _Hook.received = 0
        runs["next"].append(run_once(work, state, hook, logs))
        warned["next"].append(_Hook.received)
        print(f"rep {rep}: {runs} (wall s, CPU s, load); warnings {warned}", flush=True)
    exporters.shutdown()
    server.shutdown()
    names = {
        "scrape": "an interval: 10,000 jobs from squeue, 1,000 exporters scraped, the last "
        "hour in the warehouse",
        "first": "the first interval following 1,000 nvidia-smi logs (560,000 rows read)",
        "next": "the next interval (+1 minute of samples: 8,000 rows)",
    }
    rows = [
        "| step | wall, median | wall, min-max | CPU s, median | load (1 min) | target |",
        "|---|--:|--:|--:|--:|---|",
    ]
    for key, name in names.items():
        wall = [r[0] for r in runs[key]]
        cpu = [r[1] for r in runs[key]]
        load = [r[2] for r in runs[key]]
        met = "met" if statistics.median(wall) < TARGET_SECONDS else "missed"
        name += f"; {statistics.median(warned[key]):.0f} warnings sent"
        rows.append(
            f"| {name} | {statistics.median(wall):.2f} s | {min(wall):.2f}-{max(wall):.2f} s | "
            f"{statistics.median(cpu):.2f} | {statistics.median(load):.1f} | < {TARGET_SECONDS:g} s: {met} |"
        )
    table = "\n".join(rows)
    text = (
        f"# audit watch --once: 1,000 nodes, 10,000 running jobs ({date.today()})\n\n"
        f"Machine: {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}; {args.reps} repetitions, each in a fresh process "
        "(`python -m bench.watch`).\n\n" + table + "\n"
    )
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{date.today()}-watch.md").write_text(text)


if __name__ == "__main__":
    main()

"""Size XL by hand (issue 18): the single-machine ceiling, not part of CI nor of `python -m bench`.

    python -m bench.xl generate            # the data set, its parts in parallel processes
    python -m bench.xl run [--deadline 2026-12-01T23:00] [--keep-going] [--partial-mlflow]
    python -m bench.xl --cache /tmp/c run --size S   # try the harness on a copy of S

1,000 hosts × 8 GPUs × 7 days of telemetry at 1 sample/min (80,640,000 rows), 1,000,000
Slurm jobs and MLflow runs (5 steps × 5 metric keys each) and checkpoints of every 20th
run. Each step runs once, as the real ``audit`` command in a fresh process under
``nice -n 19``, into one warehouse: the imports in the order their data is generated
(telemetry, Slurm, checkpoints, MLflow), scan, the weekly report (first and second
render), one search (CLI and in process), the Parquet export. For each step: wall time,
CPU time (user + sys from wait4: what the step cost, whatever the machine's load), peak
RSS (the process's VmHWM and the sum of its process tree's VmRSS, polled from /proc:
``ru_maxrss`` of wait4 can report the forking parent's size) and the load average before
and after. A watchdog kills a step whose tree passes ``--kill-gib`` (14 GiB: the machine
is shared) or the deadline; a step past 10 minutes or 8 GiB gets a py-spy profile of a
few minutes while it runs. Results are appended to ``<cache>/XL/work/xl-results.jsonl``
(a later ``run`` resumes after the recorded steps; ``--fresh`` starts again) and printed
as a Markdown table. bench/results/2026-12-01-xl.md is the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.data import SIZES, DataSet, parts

AUDIT_NOW = "2026-11-23T00:00:00"  # the telemetry's week is 2026-W47, as for S, M and L
WEEK = "2026-W47"
SEARCH_FILTER = "params.method = 'sft' and params.base_model = 'qwen2.5-7b' and params.lora_rank = '64' and params.seed = '3'"
GIB = 2**30
OVER_SECONDS, OVER_BYTES = 600, 8 * GIB  # the thresholds of issue 18
PROFILE_SECONDS = 180
GPU_BATCH = 100  # telemetry files per import when one import of all of them is killed
POLL = 0.2


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a live process in bytes (nothing once it has exited)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found


def _tree(pid: int) -> list[int]:
    """The process and its descendants (DuckDB and polars use threads; mlflow may fork)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        todo += [int(c) for c in children]
    return pids


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(
    name: str, cmd: list[str], out: Path, kill_bytes: int, deadline: float, profile_dir: Path
) -> dict:
    """Run ``cmd`` once under the watchdog; wall time, peaks, load and how it ended."""
    env = {**os.environ, "AUDIT_NOW": AUDIT_NOW}
    record = {"step": name, "cmd": " ".join(cmd[:8]), "load_start": _loadavg()}
    record["started"] = datetime.now(UTC).isoformat(timespec="seconds")
    hwm = tree_peak = 0
    killed, profiler = "", None
    with open(out, "wb") as stdout, open(out.with_suffix(".stderr"), "wb") as stderr:
        started = time.monotonic()
        process = subprocess.Popen(
            ["nice", "-n", "19", *cmd], stdout=stdout, stderr=stderr, env=env,
            start_new_session=True,
        )  # fmt: skip
        while True:
            # wait4, not poll: the rusage gives the CPU time, which the shared machine's
            # load does not inflate the way it inflates the wall time
            reaped, status, usage = os.wait4(process.pid, os.WNOHANG)
            if reaped:
                break
            pids = _tree(process.pid)
            statuses = [_status(p) for p in pids]
            hwm = max([hwm] + [s.get("VmHWM", 0) for s in statuses])
            tree_peak = max(tree_peak, sum(s.get("VmRSS", 0) for s in statuses))
            elapsed = time.monotonic() - started
            if profiler is None and (elapsed > OVER_SECONDS or tree_peak > OVER_BYTES):
                # `nice` execs the command: the pid is the audit process's own
                profiler = _profile(process.pid, name, profile_dir)
            if tree_peak > kill_bytes:
                killed = f"exceeded {kill_bytes / GIB:g} GiB (killed) at {elapsed:.0f} s"
            elif time.time() > deadline:
                killed = f"stopped at the deadline after {elapsed:.0f} s"
            if killed:
                os.killpg(process.pid, signal.SIGKILL)
                _, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(POLL)
        seconds = time.monotonic() - started
        process.returncode = os.waitstatus_to_exitcode(status)
    if profiler is not None:
        if profiler.poll() is None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        profiler.wait()
        record["profile"] = str(profile_dir / f"{_slug(name)}.txt")
    record.update(
        seconds=round(seconds, 1),
        cpu_seconds=round(usage.ru_utime + usage.ru_stime, 1),
        ru_maxrss_mib=round(usage.ru_maxrss / 1024),
        vmhwm_mib=round(hwm / 2**20),
        tree_peak_mib=round(tree_peak / 2**20),
        exit=process.returncode,
        killed=killed,
        load_end=_loadavg(),
        stdout_tail=out.read_text(errors="replace")[-600:],
        stderr_tail=out.with_suffix(".stderr").read_text(errors="replace")[-600:],
    )
    return record


def _profile(pid: int, name: str, profile_dir: Path) -> subprocess.Popen:
    py_spy = Path(sys.executable).parent / "py-spy"
    # --idle: the main thread waiting in DuckDB's C++ code is the answer, not noise
    return subprocess.Popen(
        [str(py_spy), "record", "--pid", str(pid), "--duration", str(PROFILE_SECONDS),
         "--idle", "--format", "raw", "--output", str(profile_dir / f"{_slug(name)}.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def steps(data: DataSet, db: Path, work: Path) -> list[tuple[str, str | None, list[str]]]:
    """(step, the generated part it waits for, command), in the order the parts are
    generated: telemetry in minutes, Slurm and checkpoints in tens of minutes, the MLflow
    store last (hours on a shared machine). The bench imports MLflow first; links are
    derived in every import transaction, so here the MLflow import links the runs to the
    jobs and checkpoints already there, where in the bench the later imports do."""
    audit = [sys.executable, "-m", "audit", "--db", str(db), "--config", str(data.config)]
    report = ["report", "weekly", "--week", WEEK, "--output", str(work / "weekly.html")]
    return [
        ("ingest gpu", "telemetry", [*audit, "ingest", "gpu", *map(str, data.telemetry_files())]),
        ("ingest slurm", "sacct", [*audit, "ingest", "slurm", str(data.sacct)]),
        ("ingest checkpoints", "checkpoints", [*audit, "ingest", "checkpoints", str(data.scratch)]),
        ("ingest mlflow", "mlflow-base", [*audit, "ingest", "mlflow", "--tracking-uri", f"sqlite:///{data.store}"]),
        ("scan", None, [*audit, "scan", "--format", "json", "--output", str(work / "scan.json")]),
        ("report weekly (first render)", None, [*audit, *report]),
        ("report weekly (second render)", None, [*audit, *report]),
        ("runs search (CLI)", None, [*audit, "runs", "search", SEARCH_FILTER, "--limit", "100000"]),
        ("runs search (in process)", None, [sys.executable, "-m", "bench.xl", "search", str(db)]),
        # beyond one machine: the Hive-partitioned Parquet a distributed engine reads
        ("export --parquet", None, [*audit, "export", "--parquet", str(work / "export")]),
    ]  # fmt: skip


def _store_runs(store: Path) -> int:
    con = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return con.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        con.close()


def _wait_for(data: DataSet, part: str, deadline: float) -> bool:
    """Wait for a part that `python -m bench.xl generate` is still writing."""
    done = data.root / f".done-{part}"
    if not done.exists():
        print(f"waiting for {part} to be generated ...", file=sys.stderr, flush=True)
    while not done.exists():
        if time.time() > deadline:
            return False
        time.sleep(10)
    return True


def search_latency(db: Path) -> None:
    """Median of 5 searches on one kept connection after a warm-up, as bench.search does."""
    from audit import Registry
    from bench.search import timed

    registry = Registry(db)
    median, count = timed(lambda: registry.search(SEARCH_FILTER, limit=None).height, 5)
    print(f"{count} runs, median {median * 1000:.1f} ms over 5 searches")


def run(args: argparse.Namespace) -> None:
    data = DataSet(args.cache / args.size, SIZES[args.size])  # generated by `generate`
    work = data.root / "work"
    work.mkdir(exist_ok=True)
    db = work / "xl.duckdb"
    results = work / "xl-results.jsonl"
    stored = (
        {r["step"]: r for r in map(json.loads, results.read_text().splitlines())}
        if (results.exists() and not args.fresh)
        else {}
    )
    if not stored:
        db.unlink(missing_ok=True)
        results.unlink(missing_ok=True)
    deadline = datetime.fromisoformat(args.deadline).replace(tzinfo=UTC).timestamp()
    for index, (name, part, _) in enumerate(steps(data, db, work)):
        if name in args.skip:
            continue
        if name in stored:
            record = stored[name]
        elif part == "mlflow-base" and args.partial_mlflow:
            note = f"partial store: {_store_runs(data.base_store):,} of {data.size.runs:,} runs"
            print(note, file=sys.stderr, flush=True)
        elif part and not _wait_for(data, part, deadline):
            print(f"stopped: {part} not generated by the deadline", file=sys.stderr)
            break
        if part == "mlflow-base":
            data.use_store(data.base_store)
        if name not in stored:
            cmd = steps(data, db, work)[index][2]  # after the wait: all telemetry files exist
            record = _step(name, cmd, work, args, deadline, results)
            if part == "mlflow-base" and args.partial_mlflow:
                record["note"] = note
            with open(results, "a") as fh:
                fh.write(json.dumps(record) + "\n")
        if name == "ingest gpu" and record["killed"].startswith("exceeded"):
            # one transaction of 80 M rows passed the limit; a user would import the hosts
            # in batches, one process and one transaction each, so the later steps still
            # see the whole week
            files = data.telemetry_files()
            for first in range(0, len(files), GPU_BATCH):
                batch = files[first : first + GPU_BATCH]
                batch_name = f"ingest gpu, files {first + 1}-{first + len(batch)}"
                if batch_name in stored:
                    continue
                cmd = [*steps(data, db, work)[0][2][: -len(files)], *map(str, batch)]
                batch_record = _step(batch_name, cmd, work, args, deadline, results)
                with open(results, "a") as fh:
                    fh.write(json.dumps(batch_record) + "\n")
                if batch_record["killed"] or batch_record["exit"] not in (0, 1):
                    break
            else:
                continue
            print("stopped: the later steps need this one", file=sys.stderr)
            break
        if (record["killed"] or record["exit"] not in (0, 1)) and not (
            args.keep_going and part is None
        ):
            print("stopped: the later steps need this one", file=sys.stderr)
            break
    print(table([json.loads(line) for line in results.read_text().splitlines()]))


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def _step(name: str, cmd: list[str], work: Path, args, deadline: float, results: Path) -> dict:
    print(f"{datetime.now(UTC):%H:%M:%S} {name} ...", file=sys.stderr, flush=True)
    record = measure(
        name, cmd, work / f"{_slug(name)}.stdout", int(args.kill_gib * GIB), deadline, work
    )
    print(json.dumps(record), file=sys.stderr, flush=True)
    return record


def table(records: list[dict]) -> str:
    lines = [
        "| step | wall | CPU (user+sys) | peak RSS (VmHWM / process tree) | over 10 min / 8 GB? | load avg start → end | note |",
        "|---|--:|--:|--:|---|---|---|",
    ]
    for r in records:
        peak = max(r["vmhwm_mib"], r["tree_peak_mib"])
        over = [
            *(["10 min"] if r["seconds"] > OVER_SECONDS else []),
            *(["8 GB"] if peak * 2**20 > OVER_BYTES else []),
        ]
        note = "; ".join(filter(None, [r.get("note"), r["killed"] or _last_line(r["stdout_tail"])]))
        lines.append(
            f"| {r['step']} | {r['seconds']:,.1f} s | {r['cpu_seconds']:,.1f} s | {r['vmhwm_mib']:,} / {r['tree_peak_mib']:,} MiB "
            f"| {', '.join(over) or 'no'} | {r['load_start']} → {r['load_end']} | {note} |"
        )
    return "\n".join(lines)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:160].replace("|", "\\|") if lines else ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.xl", description=__doc__.splitlines()[0])
    default_cache = os.environ.get("AUDIT_BENCH_CACHE", Path.home() / ".cache" / "audit-bench")
    parser.add_argument("--cache", type=Path, default=Path(default_cache))
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("generate", help="generate the parts in parallel processes")
    go = sub.add_parser("run", help="run every step once")
    go.add_argument("--size", choices=sorted(SIZES), default="XL", help="S: try the harness")
    go.add_argument("--kill-gib", type=float, default=14.0)
    go.add_argument("--deadline", default="2026-12-01T23:00", help="UTC; steps stop there")
    go.add_argument("--fresh", action="store_true", help="start again, not after the last step")
    go.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="STEP",
        help="a step not to run (repeatable), e.g. a second render after a killed first",
    )
    go.add_argument(
        "--keep-going",
        action="store_true",
        help="after a failed scan or report, still run the others (they do not read its output)",
    )
    go.add_argument(
        "--partial-mlflow",
        action="store_true",
        help="import the MLflow store as far as it is generated (stop its generator first)",
    )
    search = sub.add_parser("search", help="(internal) in-process search latency")
    search.add_argument("db", type=Path)
    args = parser.parse_args(argv)
    if args.command == "generate":
        size = SIZES["XL"]
        started = time.monotonic()
        workers = [
            subprocess.Popen(
                [
                    "nice",
                    "-n",
                    "19",
                    sys.executable,
                    "-m",
                    "bench.data",
                    "XL",
                    str(args.cache),
                    part,
                ]
            )
            for part in parts(size)  # the MLflow store, the longest, first
        ]
        if any(w.wait() for w in workers):
            raise SystemExit("a part failed; its .done marker is missing, run again")
        print(f"XL generated in {time.monotonic() - started:.0f} s", file=sys.stderr)
    elif args.command == "run":
        run(args)
    else:
        search_latency(args.db)


if __name__ == "__main__":
    main()

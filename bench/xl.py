"""Size XL by hand (issue 18): the single-machine ceiling, not part of CI nor of `python -m bench`.

    python -m bench.xl generate            # the data set, its parts in parallel processes
    python -m bench.xl run [--deadline 2026-12-01T23:00]

1,000 hosts × 8 GPUs × 7 days of telemetry at 1 sample/min (80,640,000 rows) and 1,000,000
MLflow runs (5 steps × 5 metric keys each). Each step runs once, as the real ``audit``
command in a fresh process under ``nice -n 19``, into one warehouse, in the order a user
would: MLflow, Slurm, telemetry, checkpoints, scan, the weekly report (first and second
render), one search. For each step: wall time, peak RSS (the process's VmHWM and the sum
of its process tree's VmRSS, polled from /proc: ``ru_maxrss`` of wait4 can report the
forking parent's size) and the load average before and after. A watchdog kills a step
whose tree passes ``--kill-gib`` (14 GiB: the machine is shared) or the deadline; a step
past 10 minutes or 8 GiB gets a py-spy profile of a few minutes while it runs. Results are
appended to ``<cache>/XL/work/xl-results.jsonl`` (kept if the run is stopped) and printed
as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.data import SIZES, DataSet, parts, prepare

AUDIT_NOW = "2026-11-23T00:00:00"  # the telemetry's week is 2026-W47, as for S, M and L
WEEK = "2026-W47"
SEARCH_FILTER = "params.method = 'sft' and params.base_model = 'qwen2.5-7b' and params.lora_rank = '64' and params.seed = '3'"
GIB = 2**30
OVER_SECONDS, OVER_BYTES = 600, 8 * GIB  # the thresholds of issue 18
PROFILE_SECONDS = 180
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
        record["profile"] = str(profile_dir / f"{name}.txt")
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
         "--idle", "--format", "raw", "--output", str(profile_dir / f"{name}.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def steps(data: DataSet, db: Path, work: Path) -> list[tuple[str, list[str]]]:
    audit = [sys.executable, "-m", "audit", "--db", str(db), "--config", str(data.config)]
    report = ["report", "weekly", "--week", WEEK, "--output", str(work / "weekly.html")]
    return [
        ("ingest mlflow", [*audit, "ingest", "mlflow", "--tracking-uri", f"sqlite:///{data.store}"]),
        ("ingest slurm", [*audit, "ingest", "slurm", str(data.sacct)]),
        ("ingest gpu", [*audit, "ingest", "gpu", *map(str, data.telemetry_files())]),
        ("ingest checkpoints", [*audit, "ingest", "checkpoints", str(data.scratch)]),
        ("scan", [*audit, "scan", "--format", "json", "--output", str(work / "scan.json")]),
        ("report weekly (first render)", [*audit, *report]),
        ("report weekly (second render)", [*audit, *report]),
        ("runs search (CLI)", [*audit, "runs", "search", SEARCH_FILTER, "--limit", "100000"]),
        ("runs search (in process)", [sys.executable, "-m", "bench.xl", "search", str(db)]),
    ]  # fmt: skip


def search_latency(db: Path) -> None:
    """Median of 5 searches on one kept connection after a warm-up, as bench.search does."""
    from audit import Registry
    from bench.search import timed

    registry = Registry(db)
    median, count = timed(lambda: registry.search(SEARCH_FILTER, limit=None).height, 5)
    print(f"{count} runs, median {median * 1000:.1f} ms over 5 searches")


def run(args: argparse.Namespace) -> None:
    data = prepare(SIZES[args.size], args.cache, lambda text: print(text, file=sys.stderr))
    data.use_store(data.base_store)
    work = data.root / "work"
    work.mkdir(exist_ok=True)
    db = work / "xl.duckdb"
    results = work / "xl-results.jsonl"
    done = (
        {json.loads(line)["step"] for line in results.read_text().splitlines()}
        if (results.exists() and not args.fresh)
        else set()
    )
    if not done:
        db.unlink(missing_ok=True)
        results.unlink(missing_ok=True)
    deadline = datetime.fromisoformat(args.deadline).replace(tzinfo=UTC).timestamp()
    for name, cmd in steps(data, db, work):
        if name in done:
            continue
        print(f"{datetime.now(UTC):%H:%M:%S} {name} ...", file=sys.stderr, flush=True)
        slug = name.replace(" ", "-").replace("(", "").replace(")", "")
        record = measure(
            name, cmd, work / f"{slug}.stdout", int(args.kill_gib * GIB), deadline, work
        )
        print(json.dumps(record), file=sys.stderr, flush=True)
        with open(results, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        if record["killed"] or record["exit"] not in (0, 1):
            print("stopped: the later steps need this one", file=sys.stderr)
            break
    print(table([json.loads(line) for line in results.read_text().splitlines()]))


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
        note = r["killed"] or _last_line(r["stdout_tail"])
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

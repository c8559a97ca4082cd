"""Benchmarks of issue 8: import, telemetry, scan, search and report at size S, M or L.

    python -m bench --size L [--reps 5] [--cache DIR] [--results bench/results]
    make bench SIZE=L

Data is generated once per size into the cache (default ~/.cache/audit-bench, or
$AUDIT_BENCH_CACHE). Every step runs the real ``audit`` command in a fresh process, as a
user would, ``--reps`` times; the table gives the median (and min-max), the machine's
core count and the targets. Search runs in one process against ``mlflow.search_runs`` on
the same store. Results go to ``bench/results/<date>.md`` (a section per size).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from importlib.metadata import version
from pathlib import Path

from bench import search, server
from bench.data import SIZES, DataSet, prepare

AUDIT_NOW = "2026-11-23T00:00:00"  # the data's week is 2026-W47; pins "now" for the report


@dataclass
class Step:
    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    target: str = ""
    met: bool | None = None
    note: str = ""
    # per rep, the cores the rest of the machine used meanwhile (see ``Outcome``)
    others: list[float] = field(default_factory=list)
    steal: list[float] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(self.values)

    def add(self, value: float, outcome: Outcome | None = None) -> None:
        self.values.append(value)
        if outcome is not None and outcome.others is not None:
            self.others.append(outcome.others)
            self.steal.append(outcome.steal)

    def row(self) -> str:
        if not self.values:
            return f"| {self.name} | — | — | — | {self.target} | | | {self.note} |"
        spread = f"{_fmt(min(self.values))}-{_fmt(max(self.values))}"
        verdict = {True: "met", False: "**missed**", None: ""}[self.met]
        elsewhere = f"{max(self.others):.2f} / {max(self.steal):.2f}" if self.others else ""
        return (
            f"| {self.name} | {_fmt(self.median())} {self.unit} | {spread} | {len(self.values)} "
            f"| {self.target} | {verdict} | {elsewhere} | {self.note} |"
        )


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


@dataclass
class Outcome:
    """One command's wall time, peak RSS and output, and what the rest of the machine did
    meanwhile, in cores (CPU seconds per second of wall): ``others``, every other process;
    ``steal``, the hypervisor's steal (CPU the virtual machine was owed and not given).
    A step slowed by either is slow for reasons outside the code. None off Linux."""

    seconds: float
    peak_rss_mib: float
    stdout: str
    others: float | None = None
    steal: float | None = None


def machine_cpu() -> tuple[float, float] | None:
    """(seconds of CPU busy, seconds stolen) summed over the machine's cores since boot,
    from /proc/stat; None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...
    ticks = [int(v) for v in fields[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]
    return busy / tick, ticks[7] / tick


def run_audit(data: DataSet, db: Path, *args: str) -> Outcome:
    """One ``audit`` command in a fresh process: wall time and the process's peak RSS."""
    cmd = [sys.executable, "-m", "audit", "--db", str(db), "--config", str(data.config), *args]
    env = {**os.environ, "AUDIT_NOW": AUDIT_NOW}
    out_path, err_path = data.root / "last.stdout", data.root / "last.stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        before = machine_cpu()
        started = time.perf_counter()
        process = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        after = machine_cpu()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 1):  # 1: findings at --fail-on, not a failure here
        raise SystemExit(
            f"{' '.join(cmd)} exited {process.returncode}:\n{err_path.read_text()[-2000:]}"
        )
    outcome = Outcome(seconds, usage.ru_maxrss / 1024, out_path.read_text())
    if before is not None and after is not None:
        own = usage.ru_utime + usage.ru_stime
        outcome.others = max(0.0, after[0] - before[0] - own) / seconds
        outcome.steal = (after[1] - before[1]) / seconds
    return outcome


def bench_import(data: DataSet, reps: int, work: Path) -> tuple[list[Step], Path]:
    size = data.size
    full = Step("MLflow full import", "runs/min", target="≥ 100,000 runs/min")
    full_s = Step("MLflow full import", "s")
    full_rss = Step("MLflow full import peak RSS", "MiB")
    uri = f"sqlite:///{data.store}"
    data.use_store(data.base_store)
    warehouse = work / "imported.duckdb"
    for _ in range(reps):
        warehouse.unlink(missing_ok=True)
        outcome = run_audit(data, warehouse, "ingest", "mlflow", "--tracking-uri", uri)
        _expect(outcome, f"imported {size.runs:,} new or changed runs".replace(",", ""))
        full_s.add(outcome.seconds, outcome)
        full.add(size.runs / outcome.seconds * 60, outcome)
        full_rss.values.append(outcome.peak_rss_mib)
    full.met = full.median() >= 100_000
    incremental = Step(f"incremental import (+{size.new_runs:,} runs, 1 %)", "s", target="< 2 s")
    data.use_store(data.plus_store)
    scratch = work / "incremental.duckdb"
    for _ in range(reps):
        shutil.copyfile(warehouse, scratch)
        outcome = run_audit(data, scratch, "ingest", "mlflow", "--tracking-uri", uri)
        _expect(outcome, f"imported {size.new_runs} new or changed runs")
        incremental.add(outcome.seconds, outcome)
        incremental.note = "in-process: " + _reported_seconds(outcome.stdout)
    incremental.met = incremental.median() < 2
    unchanged = Step("unchanged re-import", "s")
    for _ in range(reps):
        outcome = run_audit(data, scratch, "ingest", "mlflow", "--tracking-uri", uri)
        unchanged.add(outcome.seconds, outcome)
    data.use_store(data.base_store)
    return [full, full_s, full_rss, incremental, unchanged], warehouse


def bench_server(data: DataSet, reps: int, work: Path) -> list[Step]:
    """Import from a real ``mlflow server`` over the same store: runs, params, tags and every
    metric history through the REST API, then an unchanged re-import."""
    size = data.size
    full = Step(
        "tracking-server import (with metric histories)", "runs/min", target="≥ 20,000 runs/min"
    )
    unchanged = Step("tracking-server unchanged re-import", "s")
    warehouse = work / "server.duckdb"
    with server.mlflow_server(data.base_store, work / "mlflow-server") as url:
        for _ in range(reps):
            warehouse.unlink(missing_ok=True)
            outcome = run_audit(data, warehouse, "ingest", "mlflow", "--tracking-uri", url)
            _expect(outcome, f"imported {size.runs} new or changed runs")
            full.add(size.runs / outcome.seconds * 60, outcome)
        for _ in range(reps):
            outcome = run_audit(data, warehouse, "ingest", "mlflow", "--tracking-uri", url)
            _expect(outcome, f"imported 0 new or changed runs ({size.runs} unchanged)")
            unchanged.add(outcome.seconds, outcome)
    full.met = full.median() >= 20_000
    full.note = unchanged.note = server.server_cores_note()
    return [full, unchanged]


def _expect(outcome: Outcome, text: str) -> None:
    if text not in outcome.stdout.replace(",", ""):
        raise SystemExit(f"expected {text!r} in the command's output, got:\n{outcome.stdout}")


def _reported_seconds(stdout: str) -> str:
    found = re.findall(r" in ([0-9.]+ s)", stdout)
    return found[-1] if found else "?"


def bench_telemetry(data: DataSet, reps: int, work: Path) -> list[Step]:
    files = [str(p) for p in data.telemetry_files()]
    rows = data.size.hosts * 8 * data.size.days * 24 * 60
    rate = Step(f"telemetry import ({rows:,} rows)", "rows/s", target="≥ 2,000,000 rows/s")
    rate_rss = Step("telemetry import peak RSS", "MiB")
    db = work / "telemetry.duckdb"
    for _ in range(reps):
        db.unlink(missing_ok=True)
        outcome = run_audit(data, db, "ingest", "gpu", *files)
        _expect(outcome, f"imported {rows} GPU samples")
        rate.add(rows / outcome.seconds, outcome)
        rate_rss.values.append(outcome.peak_rss_mib)
    rate.met = rate.median() >= 2_000_000
    return [rate, rate_rss]


def bench_scan(data: DataSet, reps: int, work: Path, imported: Path) -> tuple[list[Step], Path]:
    db = work / "full.duckdb"
    shutil.copyfile(imported, db)
    sacct = Step("sacct import", "s")
    outcome = run_audit(data, db, "ingest", "slurm", str(data.sacct))
    sacct.add(outcome.seconds, outcome)
    run_audit(data, db, "ingest", "gpu", *map(str, data.telemetry_files()))
    checkpoints = Step("checkpoint inventory", "s")
    outcome = run_audit(data, db, "ingest", "checkpoints", str(data.scratch))
    checkpoints.add(outcome.seconds, outcome)
    wall = Step("`audit scan` (all history)", "s", target="< 10 s")
    rss = Step("`audit scan` peak RSS", "MiB", target="< 1,024 MiB")
    for _ in range(reps):
        outcome = run_audit(
            data, db, "scan", "--format", "json", "--output", str(work / "scan.json")
        )
        wall.add(outcome.seconds, outcome)
        rss.values.append(outcome.peak_rss_mib)
    wall.met, rss.met = wall.median() < 10, max(rss.values) < 1024
    summary = json.loads((work / "scan.json").read_text())["summary"]
    wall.note = f"{summary['findings']:,} findings, {summary['rules']}"
    return [sacct, checkpoints, wall, rss], db


def bench_report(data: DataSet, reps: int, work: Path, db: Path) -> list[Step]:
    """The first render of a week (nothing stored: it scans the week and its trend weeks)
    on a fresh copy of the warehouse each time, then later renders reusing those scans."""
    out = work / "weekly.html"
    args = ("report", "weekly", "--week", "2026-W47", "--output", str(out))
    first = Step("weekly report, first render (HTML)", "s", target="< 10 s")
    fresh = work / "first-render.duckdb"
    for _ in range(reps):
        shutil.copyfile(db, fresh)
        outcome = run_audit(data, fresh, *args)
        first.add(outcome.seconds, outcome)
    first.met = first.median() < 10
    later = Step("weekly report, later renders (HTML)", "s", target="< 2 s")
    for _ in range(reps):
        outcome = run_audit(data, fresh, *args)
        later.add(outcome.seconds, outcome)
    later.met = later.median() < 2
    later.note = f"{out.stat().st_size / 1024:,.0f} KB; the stored scans of the first render reused"
    fresh.unlink()
    return [first, later]


def bench_search(data: DataSet, reps: int, imported: Path) -> tuple[list[Step], str]:
    rows = search.run(data.base_store, imported, reps=max(reps, 5), mlflow_reps=reps)
    mismatched = [r["filter"] for r in rows if r["audit_runs"] != r["mlflow_runs"]]
    if mismatched:
        raise SystemExit(f"audit and MLflow disagree on {mismatched}")
    latency = Step("`runs search` median latency", "ms", target="< 50 ms")
    latency.values = [r["audit_ms"] for r in rows]
    latency.met = latency.median() < 50
    ratio = Step("speed-up over mlflow.search_runs", "×", target="≥ 100×")
    ratio.values = [r["ratio"] for r in rows]
    ratio.met = ratio.median() >= 100
    latency.note = ratio.note = "over the 5 filters (each a median of its repetitions)"
    return [latency, ratio], search.markdown(rows)


def machine() -> str:
    return (
        f"{os.cpu_count()} cores ({platform.machine()}), "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM, "
        f"Python {platform.python_version()}, duckdb {version('duckdb')}, "
        f"polars {version('polars')}, mlflow {version('mlflow')}"
    )


def render(size_name: str, reps: int, steps: list[Step], search_table: str) -> str:
    size = SIZES[size_name]
    lines = [
        f"## Size {size_name}: {size.runs:,} runs, {size.hosts} hosts × 8 GPUs × {size.days} day(s)",
        "",
        f"`python -m bench --size {size_name} --reps {reps}` on {machine()}.",
        "Medians of the repetitions; every step is the `audit` command in a fresh process.",
        "*elsewhere*: the most cores the rest of the machine used during one repetition, as",
        "other processes / the hypervisor's steal (for the tracking server, its workers are",
        "among the others); a step timed while they used a core is slow for reasons outside",
        "the code.",
        "",
        "| step | median | min-max | reps | target | | elsewhere | note |",
        "|---|--:|--:|--:|---|---|--:|---|",
        *[s.row() for s in steps],
        "",
        "Search, per filter (same store, same process):",
        "",
        search_table,
        "",
    ]
    return "\n".join(lines)


def write_results(results_dir: Path, size_name: str, section: str) -> Path:
    """Replace this size's section in today's file, keep the others."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{date.today().isoformat()}.md"
    text = path.read_text() if path.exists() else f"# Benchmarks, {date.today().isoformat()}\n\n"
    pattern = re.compile(rf"## Size {size_name}:.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text + section
    path.write_text(text.rstrip() + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    # XL runs by hand, once per step (python -m bench.xl): never here, never in CI
    sizes = sorted(name for name, size in SIZES.items() if not size.by_hand)
    parser.add_argument("--size", choices=sizes, default="S")
    parser.add_argument("--reps", type=int, default=5)
    default_cache = os.environ.get("AUDIT_BENCH_CACHE", Path.home() / ".cache" / "audit-bench")
    parser.add_argument("--cache", type=Path, default=Path(default_cache))
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    data = prepare(SIZES[args.size], args.cache, log)
    work = data.root / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    steps: list[Step] = []
    log("import ...")
    import_steps, imported = bench_import(data, args.reps, work)
    steps += import_steps
    if data.size.runs <= SIZES["M"].runs:  # the target is set at M; L over REST takes hours
        log("tracking server ...")
        steps += bench_server(data, args.reps, work)
    log("telemetry ...")
    steps += bench_telemetry(data, args.reps, work)
    log("scan ...")
    scan_steps, full = bench_scan(data, args.reps, work, imported)
    steps += scan_steps
    log("search ...")
    search_steps, search_table = bench_search(data, args.reps, imported)
    steps += search_steps
    log("report ...")
    steps += bench_report(data, args.reps, work, full)
    section = render(args.size, args.reps, steps, search_table)
    print(section)
    log(f"wrote {write_results(args.results, args.size, section)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

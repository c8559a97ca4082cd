"""`audit ingest prometheus` against a real Prometheus loaded with a synthetic fleet.

The fleet is written as OpenMetrics, turned into TSDB blocks by promtool and served by the
Debian package's prometheus on 127.0.0.1. Six hours of five hosts of four GPUs at one
sample a minute, twice (label ``cluster``): "labelled" carries dcgm-exporter's ``hpc_job``
on its jobs' GPUs, "plain" only on the unshared host's. Hosts:

- gpu-p01: job 101 on all 4 GPUs, busy; GPU 0 exports no power gauge but the energy
  counter, which resets after 02:32;
- gpu-p02: no job, idle, but GPU 0 spikes to 60 % for the sample at 03:00;
- gpu-p03: shared: job 201 on GPUs 0-1 (busy), job 202 on GPUs 2-3 (idle);
- gpu-p04: job 301 on 4 GPUs of which 2 work (half used); no sample 04:00-04:29 (a gap);
- gpu-p05: job 401 on 4 GPUs, all idle (an abandoned allocation).
"""

from __future__ import annotations

import http.server
import json
import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import polars as pl
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.importers.prometheus.exporters import Settings
from audit.importers.prometheus.queries import HostSeries, plan_queries
from bench.prometheus import available, create_blocks, prometheus_server, write_openmetrics
from tests.helpers import audit_process, free_port, property_examples

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

T0 = datetime(2026, 11, 16, tzinfo=UTC)
MINUTES = 360
MODEL = "NVIDIA H100 80GB HBM3"
MEM_TOTAL = 81559.0
ENERGY_GPU = ("gpu-p01", 0)  # the counter, no gauge
RESET_AFTER = 152  # the counter restarts from 0 after the sample of 02:32
GAP = range(240, 270)  # gpu-p04 sends nothing 04:00-04:29
SPIKE = ("gpu-p02", 0, 180)
JOBS = {  # job: (host, GPUs), all 00:00-06:00
    "101": ("gpu-p01", [0, 1, 2, 3]),
    "201": ("gpu-p03", [0, 1]),
    "202": ("gpu-p03", [2, 3]),
    "301": ("gpu-p04", [0, 1, 2, 3]),
    "401": ("gpu-p05", [0, 1, 2, 3]),
}
UNTIL = "2026-11-16T06:00:00"
SINCE = "2026-11-16T00:00:00"


def fleet() -> pl.DataFrame:
    """Every sample: host, gpu, m (minute), ts, util, mem, power (W; NULL: not exported),
    job (the GPU's job)."""
    rows = []
    for host in ("gpu-p01", "gpu-p02", "gpu-p03", "gpu-p04", "gpu-p05"):
        for gpu in range(4):
            job = next((j for j, (h, gpus) in JOBS.items() if h == host and gpu in gpus), None)
            for m in range(MINUTES):
                if host == "gpu-p04" and m in GAP:
                    continue
                if host == "gpu-p01" or (host == "gpu-p03" and gpu < 2):
                    util = 80 + (m * 7 + gpu * 3) % 20
                elif host == "gpu-p04" and gpu < 2:
                    util = 95
                else:
                    util = 60 if (host, gpu, m) == SPIKE else 0
                busy = util >= 80
                rows.append(
                    {
                        "host": host,
                        "gpu": gpu,
                        "m": m,
                        "util": util,
                        "mem": 60_000 + (m * 13 + gpu) % 9000 if busy else 500 + gpu,
                        "power": None if (host, gpu) == ENERGY_GPU else (300.0 if busy else 60.0),
                        "job": job,
                    }
                )
    frame = pl.DataFrame(rows, infer_schema_length=None)
    return frame.with_columns(ts=int(T0.timestamp()) + pl.col("m") * 60)


def _labels(frame: pl.DataFrame, cluster: str) -> pl.DataFrame:
    labelled = pl.col("job").is_not_null() & (
        (pl.lit(cluster) == "labelled") | (pl.col("host") == "gpu-p01")
    )
    job = pl.when(labelled).then(pl.format(',hpc_job="{}"', pl.col("job"))).otherwise(pl.lit(""))
    return frame.with_columns(
        labels=pl.format(
            'gpu="{}",UUID="GPU-{}-{}",device="nvidia{}",modelName="{}",Hostname="{}",cluster="{}"{}',
            pl.col("gpu"),
            pl.col("host"),
            pl.col("gpu"),
            pl.col("gpu"),
            pl.lit(MODEL),
            pl.col("host"),
            pl.lit(cluster),
            job,
        )
    )


def _energy(frame: pl.DataFrame) -> pl.DataFrame:
    """The counter of ENERGY_GPU in mJ at 300 W: restarted from 0 after RESET_AFTER."""
    host, gpu = ENERGY_GPU
    one = frame.filter((pl.col("host") == host) & (pl.col("gpu") == gpu))
    since_start = (
        pl.when(pl.col("m") <= RESET_AFTER).then(pl.col("m")).otherwise(pl.col("m") - RESET_AFTER)
    )
    return one.with_columns(value=since_start * 60 * 300 * 1000)


def write_fleet(tsdb: Path, work: Path) -> None:
    frame = fleet()
    both = pl.concat([_labels(frame, "labelled"), _labels(frame, "plain")])
    text = work / "fleet.om"
    write_openmetrics(
        [
            ("DCGM_FI_DEV_GPU_UTIL", "gauge", both.select("labels", "ts", value="util")),
            ("DCGM_FI_DEV_FB_USED", "gauge", both.select("labels", "ts", value="mem")),
            (
                "DCGM_FI_DEV_FB_FREE",
                "gauge",
                both.select("labels", "ts", value=MEM_TOTAL - pl.col("mem")),
            ),
            (
                "DCGM_FI_DEV_POWER_USAGE",
                "gauge",
                both.filter(pl.col("power").is_not_null()).select("labels", "ts", value="power"),
            ),
            # an unknown-typed family keeps dcgm-exporter's name (a counter's would gain _total)
            (
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                "unknown",
                _energy(both).select("labels", "ts", "value"),
            ),
        ],
        text,
    )
    create_blocks(text, tsdb)


def write_csv(folder: Path) -> list[Path]:
    """The same fleet as nvidia-smi CSV, one file per host."""
    folder.mkdir(parents=True, exist_ok=True)
    frame = fleet().sort("host", "m", "gpu")
    paths = []
    for (host,), part in frame.group_by("host", maintain_order=True):
        lines = ["timestamp, index, uuid, name, utilization.gpu [%], memory.used [MiB], "
                 "memory.total [MiB], power.draw [W]"]  # fmt: skip
        for row in part.iter_rows(named=True):
            moment = datetime.fromtimestamp(row["ts"], UTC)
            power = "[N/A]" if row["power"] is None else f"{row['power']:.2f} W"
            lines.append(
                f"{moment:%Y/%m/%d %H:%M:%S}.000, {row['gpu']}, GPU-{host}-{row['gpu']}, "
                f"{MODEL}, {row['util']} %, {row['mem']} MiB, {MEM_TOTAL:.0f} MiB, {power}"
            )
        path = folder / f"{host}.csv"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def write_sacct(path: Path) -> Path:
    header = (
        "JobID|JobName|User|Account|Partition|State|Submit|Start|End|ElapsedRaw|TimelimitRaw|"
        "NNodes|NCPUS|NodeList|AllocTRES"
    )
    lines = [header]
    for job, (host, gpus) in JOBS.items():
        lines.append(
            f"{job}|train-{job}|alice|coder|gpu|COMPLETED|2026-11-15T23:50:00|{SINCE}|{UNTIL}|"
            f"21600|720|1|8|{host}|cpu=8,gres/gpu={len(gpus)},mem=64G,node=1"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tsdb(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("fleet")
    blocks = work / "blocks"
    write_fleet(blocks, work)
    return blocks


def _copy(tsdb: Path, to: Path) -> Path:
    shutil.copytree(tsdb, to)
    return to


@pytest.fixture(scope="module")
def prometheus_fleet(tsdb, tmp_path_factory):
    """The fleet's server, with its query log (every query's parameters) kept."""
    work = tmp_path_factory.mktemp("prometheus")
    log = work / "queries.log"
    with prometheus_server(_copy(tsdb, work / "data"), work, query_log=log) as (url, process):
        yield {"url": url, "log": log, "process": process}


def _logged_queries(log: Path) -> list[dict]:
    """The parameters of every query the server ran: range queries with their start and
    end in seconds and their step."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        params = json.loads(line)["params"]
        for key in ("start", "end"):
            if key in params:
                moment = datetime.fromisoformat(params[key].replace("Z", "+00:00"))
                params[key] = int(moment.timestamp())
        out.append(params)
    return out


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "audit.toml"
    path.write_text(text)
    return path


def _ingest(db: Path, url: str, *args: str, config: Path | None = None, env=None):
    cmd = ["--config", str(config)] if config else []
    process = audit_process(db, *cmd, "ingest", "prometheus", "--url", url, *args, env=env)
    out, err = process.communicate(timeout=600)
    return process.returncode, out, err


def _readings(db: Path) -> pl.DataFrame:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.sql(
            "SELECT host, gpu, epoch(ts)::BIGINT AS t, util_pct, util_max, mem_used_mib, "
            "mem_total_mib, power_w, model, uuid, job_label, origin, bucket_s "
            "FROM gpu_samples ORDER BY host, gpu, t"
        ).pl()
    finally:
        con.close()


def expected_buckets(step: int, cluster: str) -> pl.DataFrame:
    """What the rollups must hold, computed from the samples written: bucket t holds the
    samples of (t - step, t]."""
    frame = fleet()
    energy_host, energy_gpu = ENERGY_GPU
    is_energy = (pl.col("host") == energy_host) & (pl.col("gpu") == energy_gpu)
    labelled = pl.col("job").is_not_null() & (
        (pl.lit(cluster) == "labelled") | (pl.col("host") == "gpu-p01")
    )
    return (
        frame.with_columns(t=(pl.col("ts") + step - 1) // step * step)
        .group_by("host", "gpu", "t")
        .agg(
            util_pct=pl.col("util").mean(),
            util_max=pl.col("util").max(),
            mem_used_mib=pl.col("mem").max(),
            mem_total_mib=pl.lit(MEM_TOTAL),
            samples=pl.len(),
            power=pl.col("power").mean(),
            energy=is_energy.first(),
            job_label=pl.when(labelled).then(pl.col("job")).first(),
        )
        .with_columns(
            # the counter's mean power needs two samples in the bucket (rate())
            power_w=pl.when(pl.col("energy"))
            .then(pl.when(pl.col("samples") >= 2).then(pl.lit(300.0)))
            .otherwise(pl.col("power"))
        )
        .drop("samples", "power", "energy")
        .with_columns(pl.col("gpu").cast(pl.String))
        .sort("host", "gpu", "t")
    )


def test_rollups_hold_the_values_written(prometheus_fleet, tmp_path):
    """5-minute buckets of the labelled cluster: every field of every bucket as computed
    from the samples, the gap without buckets, the spike kept by the maximum, the counter's
    reset mended, job labels stored."""
    db = tmp_path / "w.duckdb"
    code, out, err = _ingest(
        db, prometheus_fleet["url"], "--since", SINCE, "--until", UNTIL, "--step", "5m",
        "--selector", 'cluster="labelled"',
    )  # fmt: skip
    assert code == 0, err
    assert "5-minute buckets from Prometheus, dcgm-exporter" in out
    assert "of 20 GPUs on 5 hosts" in out
    stored = _readings(db)
    expected = expected_buckets(300, "labelled")
    assert stored.height == expected.height
    assert set(stored["origin"]) == {"prometheus"} and set(stored["bucket_s"]) == {300}
    assert set(stored["model"]) == {MODEL}
    joined = expected.join(stored, on=["host", "gpu", "t"], how="left", suffix="_s")
    for column in ("util_pct", "util_max", "mem_used_mib", "mem_total_mib", "power_w"):
        difference = joined.select((pl.col(column) - pl.col(f"{column}_s")).abs().max()).item()
        assert difference is not None and difference < 0.01, column
        assert joined[column].is_null().sum() == joined[f"{column}_s"].is_null().sum(), column
    assert joined["job_label"].to_list() == joined["job_label_s"].to_list()
    # the cases named, looked at one by one
    at = {(r["host"], r["gpu"], r["t"]): r for r in stored.iter_rows(named=True)}
    spike = at["gpu-p02", "0", int(T0.timestamp()) + 180 * 60]
    assert (spike["util_pct"], spike["util_max"]) == (12.0, 60.0)
    reset = at["gpu-p01", "0", int(T0.timestamp()) + 155 * 60]  # (02:30, 02:35] holds it
    assert reset["power_w"] == pytest.approx(300.0, rel=1e-4)
    gap = [t for (h, g, t) in at if h == "gpu-p04" and g == "0"]
    missing = sorted(set(range(gap[0], gap[-1] + 1, 300)) - set(gap))
    assert [datetime.fromtimestamp(t, UTC).strftime("%H:%M") for t in missing] == [
        "04:05", "04:10", "04:15", "04:20", "04:25",
    ]  # fmt: skip
    # no query asked more than Prometheus allows
    for params in _logged_queries(prometheus_fleet["log"]):
        if "step" in params:
            assert (params["end"] - params["start"]) / params["step"] <= 11_000


def test_an_import_goes_on_where_the_last_one_stopped(prometheus_fleet, tmp_path):
    db = tmp_path / "w.duckdb"
    common = ["--selector", 'cluster="plain"']
    code, _, err = _ingest(db, prometheus_fleet["url"], "--since", SINCE, "--until",
                           "2026-11-16T03:00:00", "--step", "5m", *common)  # fmt: skip
    assert code == 0, err
    first = _readings(db)
    logged = len(_logged_queries(prometheus_fleet["log"]))
    code, out, err = _ingest(db, prometheus_fleet["url"], "--until", UNTIL, *common)
    assert code == 0, err
    later = [q for q in _logged_queries(prometheus_fleet["log"])[logged:] if "step" in q]
    # the second import asked only for the buckets after 03:00, at the stored width
    assert later and {q["step"] for q in later} == {300}
    assert min(q["start"] for q in later) == int(T0.timestamp()) + 3 * 3600 + 300
    both = _readings(db)
    assert both.filter(pl.col("t") <= int(T0.timestamp()) + 3 * 3600).equals(first)
    whole = tmp_path / "whole.duckdb"
    code, _, err = _ingest(whole, prometheus_fleet["url"], "--since", SINCE, "--until", UNTIL,
                           "--step", "5m", *common)  # fmt: skip
    assert code == 0, err
    assert both.equals(_readings(whole))
    # again: nothing more is asked or stored
    code, out, _ = _ingest(db, prometheus_fleet["url"], "--until", UNTIL, *common)
    assert code == 0 and "nothing to import" in out
    assert _readings(db).equals(both)
    # another width would mix: refused, naming both
    code, _, err = _ingest(db, prometheus_fleet["url"], "--until", UNTIL, "--step", "1m", *common)
    assert code == 2
    assert "--step 1m: the warehouse holds 5m buckets from Prometheus" in err
    assert _readings(db).equals(both)


def test_queries_split_in_time_and_hosts_give_the_same_rollups(prometheus_fleet, tmp_path):
    """A sample budget of 1,000 values a query: one host a query (4 GPUs × 5 fields × 73
    buckets would be 1,460), its window cut in two; the same rows as in one query."""
    config = _config(tmp_path, "[prometheus]\nmax_points_per_query = 1000\nconcurrency = 2\n")
    small, big = tmp_path / "small.duckdb", tmp_path / "big.duckdb"
    logged = len(_logged_queries(prometheus_fleet["log"]))
    code, _out, err = _ingest(small, prometheus_fleet["url"], "--since", SINCE, "--until", UNTIL,
                             "--step", "5m", "--selector", 'cluster="plain"', config=config)  # fmt: skip
    assert code == 0, err
    asked = [q for q in _logged_queries(prometheus_fleet["log"])[logged:] if "step" in q]
    assert len(asked) == 10  # 5 hosts × 2 windows of at most 50 buckets
    for params in asked:
        points = (params["end"] - params["start"]) // params["step"] + 1
        hosts = params["query"].split("Hostname=", 1)[1].split('"')[1].count("|") + 1
        assert points * hosts * 4 * 5 <= 1000  # 4 GPUs a host, 5 fields
    code, _, err = _ingest(big, prometheus_fleet["url"], "--since", SINCE, "--until", UNTIL,
                           "--step", "5m", "--selector", 'cluster="plain"')  # fmt: skip
    assert code == 0, err
    assert _readings(small).equals(_readings(big))


def _scan(db: Path, config: Path | None = None) -> dict:
    args = ["--config", str(config)] if config else []
    process = audit_process(db, *args, "scan", "--format", "json", "--since", "2026-11-16",
                            "--until", "2026-11-17")  # fmt: skip
    out, err = process.communicate(timeout=600)
    assert process.returncode in (0, 1), err
    return json.loads(out)


def _slurm(db: Path, tmp_path: Path) -> None:
    process = audit_process(db, "ingest", "slurm", str(write_sacct(tmp_path / "jobs.sacct")))
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err


def _findings(report: dict) -> list[dict]:
    out = []
    for finding in report["findings"]:
        kept = {k: v for k, v in finding.items() if k not in ("scan_id",)}
        kept["evidence"] = {k: v for k, v in finding["evidence"].items() if k != "resolution"}
        out.append(kept)
    return sorted(out, key=lambda f: f["id"])


def test_job_labels_attach_buckets_to_their_job(prometheus_fleet, tmp_path):
    """On the shared host, jobs 201 and 202 are told apart by hpc_job: 202's idle GPUs are
    found idle. Without the labels the same buckets cannot be told apart (ambiguous)."""
    results = {}
    for cluster in ("labelled", "plain"):
        db = tmp_path / f"{cluster}.duckdb"
        _slurm(db, tmp_path)
        code, _, err = _ingest(db, prometheus_fleet["url"], "--since", SINCE, "--until", UNTIL,
                               "--step", "5m", "--selector", f'cluster="{cluster}"')  # fmt: skip
        assert code == 0, err
        results[cluster] = _scan(db)
    idle = {
        cluster: [
            f
            for f in report["findings"]
            if f["rule"] == "IDL002" and f["subject"].get("job_id") == "202"
        ]
        for cluster, report in results.items()
    }
    assert len(idle["labelled"]) == 1 and idle["plain"] == []
    evidence = idle["labelled"][0]["evidence"]
    assert evidence["resolution"] == "5-minute buckets from Prometheus"
    assert [g["gpu"] for g in evidence["per_gpu"]] == ["2", "3"]
    notes = json.dumps(results["plain"])
    assert "job 202: ambiguous" in notes
    half_used = [f for f in results["labelled"]["findings"] if f["rule"] == "OVP001"]
    assert [f["subject"]["job_id"] for f in half_used] == ["301"]


def test_raw_csv_and_one_minute_rollups_give_the_same_findings(prometheus_fleet, tmp_path):
    """The same fleet as nvidia-smi CSV files and as 1-minute buckets from Prometheus."""
    raw, rolled = tmp_path / "raw.duckdb", tmp_path / "rolled.duckdb"
    for db in (raw, rolled):
        _slurm(db, tmp_path)
    process = audit_process(raw, "ingest", "gpu", *map(str, write_csv(tmp_path / "csv")))
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    code, _, err = _ingest(rolled, prometheus_fleet["url"], "--since", SINCE, "--until", UNTIL,
                           "--step", "1m", "--selector", 'cluster="plain"')  # fmt: skip
    assert code == 0, err
    by_raw, by_rollups = _scan(raw), _scan(rolled)
    assert _findings(by_raw) == _findings(by_rollups)
    rules = {f["rule"] for f in by_raw["findings"]}
    assert {"IDL002", "OVP001", "IDL003"} <= rules  # the fleet's waste, found both ways
    resolutions = {
        f["evidence"].get("resolution")
        for f in by_rollups["findings"]
        if f["rule"] in ("IDL002", "OVP001", "IDL003")
    }
    assert resolutions == {"1-minute buckets from Prometheus"}


# -- faults ---------------------------------------------------------------------------------
class _Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True


def _proxy(upstream: str, mode: dict) -> tuple[_Proxy, str]:
    """A reverse proxy in front of the real server: forwards, or for query_range answers
    slowly (``slow`` seconds), redirects (``redirect`` URL), and records the
    Authorization headers it saw."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _forward(self, method: str) -> None:
            mode.setdefault("auth", []).append(self.headers.get("Authorization"))
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if "query_range" in self.path:
                if "redirect" in mode:
                    self.send_response(307)
                    self.send_header("Location", mode["redirect"] + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if "slow" in mode:
                    time.sleep(mode["slow"])
            answer = requests.request(
                method, upstream + self.path, data=body,
                headers={"Content-Type": self.headers.get("Content-Type", "")}, timeout=30,
            )  # fmt: skip
            try:
                self.send_response(answer.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the importer gave up waiting: what this test is about

        def do_GET(self):
            self._forward("GET")

        def do_POST(self):
            self._forward("POST")

    proxy = _Proxy(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    return proxy, f"http://127.0.0.1:{proxy.server_address[1]}"


FAST_FAILURE = (
    "[prometheus]\ntimeout_seconds = 1\nmax_retries = 1\nbackoff_seconds = 0.1\n"
    "max_points_per_query = 2000\nconcurrency = 1\n"
)


def _nothing_stored(db: Path) -> None:
    if not db.exists():
        return
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.sql("SELECT count(*) FROM gpu_readings").fetchall() == [(0,)]
        assert con.sql("SELECT count(*) FROM file_imports").fetchall() == [(0,)]
    finally:
        con.close()


def test_a_slow_answer_past_the_deadline_stores_nothing(prometheus_fleet, tmp_path):
    proxy, url = _proxy(prometheus_fleet["url"], {"slow": 2.5})
    try:
        db = tmp_path / "w.duckdb"
        started = time.monotonic()
        code, _, err = _ingest(db, url, "--since", SINCE, "--until", UNTIL, "--step", "5m",
                               config=_config(tmp_path, FAST_FAILURE))  # fmt: skip
        assert code == 2, err
        assert "query_range for" in err and "no complete answer within 1 s" in err
        assert "nothing was stored" in err
        assert time.monotonic() - started < 60
        _nothing_stored(db)
    finally:
        proxy.shutdown()


def test_a_redirect_to_another_host_is_not_followed_with_credentials(prometheus_fleet, tmp_path):
    elsewhere = {}
    other, other_url = _proxy(prometheus_fleet["url"], elsewhere)
    # the same server under another name: localhost is not 127.0.0.1
    target = other_url.replace("127.0.0.1", "localhost")
    mode = {"redirect": target}
    proxy, url = _proxy(prometheus_fleet["url"], mode)
    try:
        db = tmp_path / "w.duckdb"
        token = "s3cret-token-value"
        env = {**__import__("os").environ, "PROM_TOKEN": token}
        code, out, err = _ingest(db, url, "--since", SINCE, "--until", UNTIL, "--step", "5m",
                                 "--bearer-token-env", "PROM_TOKEN", env=env)  # fmt: skip
        assert code == 2, err
        assert "query_range for" in err and f"redirected to {target}" in err
        assert "not followed" in err
        assert token not in out + err
        assert elsewhere.get("auth") is None  # nothing reached the other host
        assert set(mode["auth"]) == {f"Bearer {token}"}  # the server itself got the token
        _nothing_stored(db)
    finally:
        proxy.shutdown()
        other.shutdown()


def test_credentials_are_sent_and_never_kept(prometheus_fleet, tmp_path):
    mode: dict = {}
    proxy, url = _proxy(prometheus_fleet["url"], mode)
    try:
        secret_file = tmp_path / "password"
        secret_file.write_text("pa55-w0rd-secret\n")
        db = tmp_path / "w.duckdb"
        code, out, err = _ingest(db, url, "--since", SINCE, "--until", UNTIL, "--step", "5m",
                                 "--user", "auditor", "--password-file", str(secret_file))  # fmt: skip
        assert code == 0, err
        import base64

        sent = "Basic " + base64.b64encode(b"auditor:pa55-w0rd-secret").decode()
        assert set(mode["auth"]) == {sent}
        assert b"pa55-w0rd-secret" not in db.read_bytes()
        assert "pa55" not in out + err
    finally:
        proxy.shutdown()


def test_too_many_points_for_the_server_is_a_clear_error(tsdb, tmp_path):
    """A server holding queries to 1,000 samples (--query.max-samples) answers 422."""
    with prometheus_server(_copy(tsdb, tmp_path / "data"), tmp_path / "server",
                           "--query.max-samples=1000") as (url, _):  # fmt: skip
        db = tmp_path / "w.duckdb"
        code, _, err = _ingest(db, url, "--since", SINCE, "--until", UNTIL, "--step", "5m")
        assert code == 2, err
        assert "query_range for" in err and "HTTP 422" in err
        assert "lower them" in err and "nothing was stored" in err
        _nothing_stored(db)


def test_the_server_stopping_mid_import_stores_nothing(tsdb, tmp_path):
    log = tmp_path / "queries.log"
    with prometheus_server(_copy(tsdb, tmp_path / "data"), tmp_path / "server",
                           query_log=log) as (url, process):  # fmt: skip
        db = tmp_path / "w.duckdb"
        config = _config(tmp_path, FAST_FAILURE.replace("2000", "1000"))
        importer = audit_process(db, "--config", str(config), "ingest", "prometheus", "--url",
                                 url, "--since", SINCE, "--until", UNTIL, "--step", "1m")  # fmt: skip
        deadline = time.monotonic() + 60
        while not any("step" in q for q in _logged_queries(log)):
            assert importer.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        process.terminate()
        _out, err = importer.communicate(timeout=120)
        assert importer.returncode == 2, err
        assert "query_range for" in err and "connection failed" in err
        assert "nothing was stored" in err
        _nothing_stored(db)


def test_bad_settings_are_named(prometheus_fleet, tmp_path):
    for text, named in (
        ('[prometheus]\nmetrics = { utl = "x" }\n', "metrics.utl: unknown field"),
        ('[prometheus]\nmetrics = { util = "9bad" }\n', "metrics.util: expected a metric name"),
        ('[prometheus]\nlabels = { host = "" }\n', "labels.host"),
        ('[prometheus]\nresolution = { "1y2" = "5m" }\n', "resolution.1y2"),
        ("[prometheus]\nmax_points_per_series = 20000\n", "max_points_per_series must be"),
        ("[prometheus]\nexporter = 'nvsmi'\n", "exporter 'nvsmi' is not one of"),
        ("[prometheus]\nbatch = 3\n", "unknown key 'batch' in [prometheus]"),
    ):
        code, _, err = _ingest(tmp_path / "w.duckdb", prometheus_fleet["url"], "--step", "5m",
                               config=_config(tmp_path, text))  # fmt: skip
        assert code == 2 and named in err, (text, err)


def test_a_selector_the_server_refuses_is_an_input_error(prometheus_fleet, tmp_path):
    code, _, err = _ingest(tmp_path / "w.duckdb", prometheus_fleet["url"], "--since", SINCE, "--until",
                           UNTIL, "--selector", 'cluster=~"("')  # fmt: skip
    assert code == 2, err
    assert "series of DCGM_FI_DEV_GPU_UTIL" in err and "HTTP 400 bad_data" in err


def test_a_custom_metric_map_reads_other_names(prometheus_fleet, tmp_path):
    """[prometheus] metrics and labels name an exporter's series: here dcgm's own, through
    the custom profile, as a site with renamed metrics would."""
    config = _config(
        tmp_path,
        '[prometheus]\nexporter = "custom"\n'
        'metrics = { util = "DCGM_FI_DEV_GPU_UTIL/100", mem_used = "DCGM_FI_DEV_FB_USED" }\n'
        'labels = { host = "Hostname", gpu = "gpu", job = "hpc_job" }\n',
    )
    db = tmp_path / "w.duckdb"
    code, _out, err = _ingest(db, prometheus_fleet["url"], "--since", SINCE, "--until", UNTIL, "--step",
                             "5m", "--selector", 'cluster="plain"', config=config)  # fmt: skip
    assert code == 0, err
    stored = _readings(db)
    expected = expected_buckets(300, "plain")
    joined = expected.join(stored, on=["host", "gpu", "t"], suffix="_s")
    assert joined.height == expected.height
    assert (joined["util_pct"] / 100 - joined["util_pct_s"]).abs().max() < 1e-4
    assert stored["mem_total_mib"].null_count() == stored.height  # not mapped: unknown


# -- planning --------------------------------------------------------------------------------
def _settings(per_series: int, per_query: int) -> Settings:
    return Settings("auto", {}, {}, [(None, 300)], per_series, per_query, 1, 1.0, 0, 0.1, 1 << 20)


@settings(max_examples=property_examples(50, 500), deadline=None)
@given(
    gpus=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    offsets=st.lists(st.integers(0, 300), min_size=12, max_size=12),
    length=st.integers(0, 3000),
    per_series=st.integers(2, 11_000),
    per_query=st.integers(1_000, 200_000),
    fields=st.integers(1, 5),
)
def test_plans_cover_every_bucket_once_within_the_limits(
    gpus, offsets, length, per_series, per_query, fields
):
    step, until = 60, 60 * 4000
    hosts = [
        HostSeries(
            f"h{i:02d}", "Hostname", {f"h{i:02d}"}, {(f"h{i:02d}", str(g)) for g in range(n)}
        )
        for i, n in enumerate(gpus)
    ]
    starts = {h.host: until - (length + offsets[i]) * step for i, h in enumerate(hosts)}
    queries = plan_queries(hosts, starts, until, step, fields, _settings(per_series, per_query))
    covered: dict[str, list[int]] = {}
    for q in queries:
        points = q.steps(step)
        assert points <= per_series and (q.end - q.start) // step <= 11_000
        assert points * q.series * fields <= per_query or (points == 1 and len(q.hosts) == 1)
        assert len({h.label for h in q.hosts}) == 1
        for h in q.hosts:
            covered.setdefault(h.host, []).extend(range(q.start, q.end + 1, step))
    for h in hosts:
        assert sorted(covered.get(h.host, [])) == list(range(starts[h.host], until + 1, step))

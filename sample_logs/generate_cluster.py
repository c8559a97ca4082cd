"""Write the sample week's cluster side: Slurm accounting and nvidia-smi telemetry.

    python sample_logs/generate_cluster.py

Reads the plan in ``plan.py`` and writes ``slurm/week47.sacct`` (sacct -P with a header,
job and step rows) and ``gpu/<host>.csv`` (nvidia-smi --query-gpu CSV, 5-minute samples
while a host holds jobs). Deterministic: a seeded generator draws the noise.
"""

from __future__ import annotations

import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from plan import (  # noqa: E402
    ACCOUNT,
    HOST_GPU_TYPE,
    HOST_UP_AFTER_LAST_JOB,
    INTERACTIVE_JOB,
    JOB_ID_BASE,
    PLACEMENT,
    RUNS,
    TELEMETRY_BRIDGE_HOURS,
    TELEMETRY_STEP_MINUTES,
    WEEK_START_MS,
)

WEEK_START = datetime.fromtimestamp(WEEK_START_MS / 1000, UTC).replace(tzinfo=None)
SACCT_FIELDS = (
    "JobID|JobName|User|Account|Partition|State|Submit|Eligible|Start|End|ElapsedRaw|TimelimitRaw|"
    "NNodes|NCPUS|NodeList|AllocTRES|ReqTRES|TRESUsageInMax"
)
MEMORY_TOTAL = {"h100": 81559, "a100": 81920}
MODEL_NAME = {"h100": "NVIDIA H100 80GB HBM3", "a100": "NVIDIA A100-SXM4-80GB"}


def at(hours: float) -> datetime:
    return WEEK_START + timedelta(hours=hours)


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def jobs() -> list[dict]:
    out = []
    for index, run in enumerate(RUNS):
        name, _exp, team, user, method, _base, *_ = run
        start_h, hours, status = run[11], run[12], run[13]
        host, gpus, tail, limit, busy = PLACEMENT[name]
        gpus = list(gpus)
        job_start = start_h - 1 / 60  # the job starts a minute before MLflow's run
        job_end = start_h + hours + tail + 1 / 60
        state = {"FINISHED": "COMPLETED", "FAILED": "FAILED", "KILLED": "CANCELLED by 1017"}[status]
        out.append(
            {
                "job_id": str(JOB_ID_BASE + index),
                "name": f"{method}-{name}",
                "user": user,
                "account": ACCOUNT[team],
                "host": host,
                "gpus": gpus,
                "start_h": job_start,
                "end_h": job_end,
                "run_end_h": start_h + hours,
                "timelimit_h": limit,
                "state": state,
                "busy": gpus[:1] if busy == "first" else gpus,
                "method": method,
            }
        )
    j = INTERACTIVE_JOB
    out.append(
        {
            "job_id": j["job_id"],
            "name": j["name"],
            "user": j["user"],
            "account": j["account"],
            "host": j["host"],
            "gpus": j["gpus"],
            "start_h": j["start_h"],
            "end_h": j["start_h"] + j["hours"],
            "run_end_h": j["start_h"],
            "timelimit_h": j["timelimit_h"],
            "state": "COMPLETED",
            "busy": [],
            "method": "interactive",
        }
    )
    return sorted(out, key=lambda job: (job["start_h"], job["job_id"]))


def write_sacct(path: Path, rng: random.Random) -> None:
    lines = [SACCT_FIELDS]
    for job in jobs():
        gpu_type = HOST_GPU_TYPE[job["host"]]
        n = len(job["gpus"])
        cpus = 12 * n
        start, end = at(job["start_h"]), at(job["end_h"])
        elapsed = int((end - start).total_seconds())
        alloc = (
            f"billing={cpus},cpu={cpus},gres/gpu:{gpu_type}={n},gres/gpu={n},mem={96 * n}G,node=1"
        )
        req = f"billing={cpus},cpu={cpus},gres/gpu={n},mem={96 * n}G,node=1"
        submit = start - timedelta(minutes=rng.randint(1, 20))
        lines.append(
            "|".join(
                [
                    job["job_id"],
                    job["name"],
                    job["user"],
                    job["account"],
                    "gpu",
                    job["state"],
                    stamp(submit),
                    stamp(submit),  # Eligible: no dependencies or holds in the sample week
                    stamp(start),
                    stamp(end),
                    str(elapsed),
                    str(job["timelimit_h"] * 60),
                    "1",
                    str(cpus),
                    job["host"],
                    alloc,
                    req,
                    "",
                ]
            )
        )
        util = 0 if not job["busy"] else rng.randint(93, 99)
        mem_kib = 0 if not job["busy"] else rng.randint(60_000, 72_000) * 1024
        for step, step_name in (("batch", "batch"), ("extern", "extern")):
            usage = (
                f"cpu=00:00:00,energy=0,fs/disk=2332,gres/gpumem={mem_kib}K,gres/gpuutil={util},mem=80K"
                if step == "batch"
                else "cpu=00:00:00,energy=0,fs/disk=2332,gres/gpumem=0,gres/gpuutil=0,mem=80K"
            )
            lines.append(
                "|".join(
                    [
                        f"{job['job_id']}.{step}",
                        step_name,
                        "",
                        job["account"],
                        "",
                        job["state"].split(" ")[0],
                        stamp(start),
                        stamp(start),
                        stamp(start),
                        stamp(end),
                        str(elapsed),
                        "",
                        "1",
                        str(cpus),
                        job["host"],
                        alloc,
                        "",
                        usage,
                    ]
                )
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def telemetry_windows(all_jobs: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """Per host, the spans its logger ran: job spans merged across short gaps."""
    windows: dict[str, list[list[float]]] = {}
    for job in sorted(all_jobs, key=lambda j: j["start_h"]):
        spans = windows.setdefault(job["host"], [])
        end = job["end_h"] + HOST_UP_AFTER_LAST_JOB.get(job["host"], 0) * (
            job["method"] == "interactive"
        )
        if spans and job["start_h"] - spans[-1][1] < TELEMETRY_BRIDGE_HOURS:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([job["start_h"], end])
    return {host: [(a, b) for a, b in spans] for host, spans in windows.items()}


def write_nvidia_smi(folder: Path, rng: random.Random) -> None:
    all_jobs = jobs()
    folder.mkdir(parents=True, exist_ok=True)
    for file in folder.glob("*.csv"):
        file.unlink()
    step = TELEMETRY_STEP_MINUTES / 60
    for host, spans in sorted(telemetry_windows(all_jobs).items()):
        gpu_type = HOST_GPU_TYPE[host]
        total = MEMORY_TOTAL[gpu_type]
        # Two spellings that both occur in the wild: units in the header (nounits) and
        # units in the values.
        with_units = host in ("gpu-h02", "gpu-a01")
        header = "timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W]"
        lines = [header]
        for start, end in spans:
            t = start
            while t <= end + 1e-9:
                moment = at(t)
                for gpu in range(8):
                    job = next(
                        (
                            j
                            for j in all_jobs
                            if j["host"] == host
                            and gpu in j["gpus"]
                            and j["start_h"] <= t < j["end_h"]
                        ),
                        None,
                    )
                    working = job is not None and gpu in job["busy"] and t < job["run_end_h"]
                    util = rng.randint(88, 99) if working else 0
                    used = (
                        rng.randint(61_000, 72_000)
                        if working
                        else (rng.randint(2, 6) if job is None else rng.randint(400, 600))
                    )
                    power = rng.uniform(520, 690) if working else rng.uniform(68, 75)
                    if with_units:
                        values = [f"{util} %", f"{used} MiB", f"{total} MiB", f"{power:.2f} W"]
                    else:
                        values = [str(util), str(used), str(total), f"{power:.2f}"]
                    lines.append(
                        ", ".join(
                            [
                                moment.strftime("%Y/%m/%d %H:%M:%S.000"),
                                str(gpu),
                                MODEL_NAME[gpu_type],
                                *values,
                            ]
                        )
                    )
                t += step
        (folder / f"{host}.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    rng = random.Random(4747)
    write_sacct(HERE / "slurm" / "week47.sacct", rng)
    write_nvidia_smi(HERE / "gpu", rng)
    print(f"wrote {HERE / 'slurm'} and {HERE / 'gpu'}", file=sys.stderr)


if __name__ == "__main__":
    main()

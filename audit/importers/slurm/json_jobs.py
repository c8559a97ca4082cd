"""``sacct --json`` output (data_parser v0.0.37 of Slurm 21.08 to v0.0.44 of Slurm 25.11):
each job turned into the records ``sacct -P`` prints for it, the job then its steps."""

from __future__ import annotations

from pathlib import Path

from audit.errors import InputError
from audit.importers.read import parse_strict_json
from audit.importers.slurm.json_values import (
    json_count,
    json_limit,
    json_state,
    json_text,
    json_time,
    json_tres,
    json_whole,
    member,
    tres_counts,
)
from audit.importers.slurm.records import Records, Where
from audit.importers.slurm.values import LineError
from audit.importers.text import describe


# The layout changed between data_parser versions; every form seen is read:
#   numbers: plain (v0.0.37/38) or {"set", "infinite", "number"} (v0.0.39+), for time.limit,
#     array.task_id, het.job_offset and step times;
#   state.current: a word (to v0.0.39) or a list of words (v0.0.40+);
#   step.id: "123.batch" (v0.0.40+), {"job_id", "step_id"} (v0.0.39), or step.job_id with
#     step.id (v0.0.37/38);
#   TRES: lists of {"type", "name", "count"}; mem of a job in MiB, usage in bytes.
def json_records(path: Path, content: str) -> tuple[Records, int]:
    document = parse_strict_json(content, path)
    jobs = document.get("jobs") if isinstance(document, dict) else None
    if not isinstance(jobs, list):
        raise InputError(
            f'{path}: expected sacct --json output, an object with a list of "jobs"; '
            "for sacct -P output the first line must be the header"
        )

    def records() -> Records:
        for index, job in enumerate(jobs):
            shown = job.get("job_id") if isinstance(job, dict) else None
            known = isinstance(shown, int) and not isinstance(shown, bool)
            label = f"{path}: jobs[{index}]" + (f" (job {shown})" if known else "")
            yield Where(label), lambda job=job: _json_job_records(job)

    return records(), len(jobs)


def _json_job_records(job) -> list[dict]:
    """The sacct -P records of one JSON job: the job, then its steps."""
    if not isinstance(job, dict):
        raise LineError(f"expected a job object, got {describe(job)}")
    job_id = _json_job_id(job)
    record = {
        "jobid": job_id,
        "jobname": json_text(job, "name"),
        "user": json_text(job, "user") or "",
        "account": json_text(job, "account") or "",
        "partition": json_text(job, "partition") or "",
        "state": json_state(job, "state.current"),
        "submit": json_time(job, "time.submission"),
        "eligible": json_time(job, "time.eligible"),
        "start": json_time(job, "time.start"),
        "end": json_time(job, "time.end"),
        "elapsedraw": json_count(job, "time.elapsed"),
        "timelimitraw": json_limit(job, "time.limit"),
        "nnodes": json_count(job, "allocation_nodes"),
        "nodelist": json_text(job, "nodes") or "",
        "alloctres": json_tres(job, "tres.allocated"),
        "reqtres": json_tres(job, "tres.requested"),
        "admincomment": json_text(job, "comment.administrator") or "",
    }
    cpus = tres_counts(job, "tres.allocated").get("cpu")
    record["ncpus"] = str(cpus) if cpus is not None else json_count(job, "required.CPUs")
    memory = tres_counts(job, "tres.requested").get("mem")
    record["reqmem"] = f"{memory}M" if memory is not None else ""
    steps = member(job, "steps")
    if steps is not None and not isinstance(steps, list):
        raise LineError(f"steps: expected a list, got {describe(steps)}")
    return [record] + [
        _json_step(step, job_id, f"steps[{number}]") for number, step in enumerate(steps or [])
    ]


def _json_job_id(job: dict) -> str:
    """The JobID sacct -P prints: 123, array task 123_4 (or pending 123_[1-10]),
    heterogeneous component 123+1."""
    job_id = json_whole(job, "job_id")
    if not job_id:
        raise LineError(f"job_id: expected a job number, got {describe(job.get('job_id'))}")
    het_id, het_offset = json_whole(job, "het.job_id"), json_whole(job, "het.job_offset")
    if het_id and het_offset is not None:
        return f"{het_id}+{het_offset}"
    array_id = json_whole(job, "array.job_id")
    if array_id:
        task_id = json_whole(job, "array.task_id")
        if task_id is not None:
            return f"{array_id}_{task_id}"
        tasks = json_text(job, "array.task")
        if tasks:
            return f"{array_id}_[{tasks}]"
    return str(job_id)


def _json_step(step, parent: str, where: str) -> dict:
    if not isinstance(step, dict):
        raise LineError(f"{where}: expected a step object, got {describe(step)}")
    step_id = member(step, "step.id")
    if isinstance(step_id, dict):  # v0.0.39: {"job_id": 123, "step_id": "batch"}
        step_id = step_id.get("step_id")
    if isinstance(step_id, bool) or not isinstance(step_id, str | int):
        raise LineError(f"{where}.step.id: expected a step id, got {describe(step_id)}")
    name = str(step_id)
    name = name.split(".", 1)[1] if "." in name else name  # "123.batch" -> "batch"
    peak = json_tres(step, "tres.requested.max", where)
    rss = tres_counts(step, "tres.requested.max", where).get("mem")
    return {
        "jobid": f"{parent}.{name}",
        "tresusageinmax": peak,
        "tresusageinave": json_tres(step, "tres.requested.average", where),
        "maxrss": str(rss) if rss is not None else "",
    }

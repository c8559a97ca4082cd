"""Slurm accounting (``sacct``) files and the controller's live job list, as rows of
``jobs`` / ``job_nodes`` (and ``job_gpus`` from the controller).

Reads what sites really emit: ``sacct -P`` / ``--parsable2`` with a header line, or
headerless output with ``--fields`` and a custom ``--delimiter``; ``--parsable`` output
with its trailing delimiter; ``sacct --json`` (data_parser v0.0.37 of Slurm 21.08 to
v0.0.44 of Slurm 25.11); job rows and step rows (``123.batch``, ``123.0``,
``123.extern``; array tasks ``123_4``), whose usage rolls up to the job.

Both forms become the same rows: a JSON job is turned into the record ``sacct -P`` prints
for it (epoch times as UTC, TRES lists as ``type/name=count``), and one function builds a
job row from a record. Every number is bounded by what its column and Slurm can hold, so
a value beyond it is an input error naming the file and line (or JSON job and field).

The package, one job a module: ``values`` parses ``sacct -P`` field values;
``parsable`` reads ``-P`` text and ``json_jobs`` (with ``json_values``) ``--json`` output
into ``records``; ``jobs`` builds a job row from a record; ``accounting`` reads a file
through them; ``newest`` picks the newer of several records of a job; ``live`` reads the
controller's ``squeue`` / ``scontrol --json`` answer through the same row builder.
"""

from audit.importers.slurm.accounting import SacctFile, read_sacct
from audit.importers.slurm.jobs import JOB_SCHEMA
from audit.importers.slurm.live import LiveJobs, read_live_jobs, reported_errors
from audit.importers.slurm.newest import newest_records
from audit.importers.slurm.values import LineError

__all__ = [
    "JOB_SCHEMA",
    "LineError",
    "LiveJobs",
    "SacctFile",
    "newest_records",
    "read_live_jobs",
    "read_sacct",
    "reported_errors",
]

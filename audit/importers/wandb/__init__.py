"""W&B run folders (``wandb/run-*``, ``wandb/offline-run-*``) read from disk, no network.

The complete record of a run is its transaction log ``run-<id>.wandb``: LevelDB-log
framing (``audit.importers.record_log``, behind a 7-byte ``:W&B`` header) around protobuf
``Record`` messages, parsed with the definitions the ``wandb`` package ships (the
``audit-waste[wandb]`` extra). Without it only ``files/`` is read (config, summary,
metadata): new offline runs write nothing else there, so history, system metrics and the
exit status then stay unknown.

Mapping: project -> experiment; display name, host, start time; end time = the last
timestamp in the log; status from the exit record (0 FINISHED, else FAILED; none: KILLED
with tag ``audit.status_reason``); config (nested keys joined with ``.``, the old
``desc:``/``value:`` layout unwrapped) -> params; history -> metrics (``_step`` as step,
``_timestamp`` as time); numeric summary values never logged as history -> one point at
the end; system metrics ``gpu.N.*`` -> GPU samples of the run (host from the metadata,
origin ``wandb``); a Slurm job id in the metadata or config -> tag ``slurm_job_id``, which
links the run to its job. E-mail addresses are never read into the warehouse.

Damage: a log cut short (a record running past the end of the file, or a damaged last
record) imports what precedes it, with a warning naming the byte offset. Damage followed
by more records, a file that is not a W&B log, or a record that does not parse is an
``InputError`` naming file and byte offset. Memory is bounded: records are read block by
block, a record is at most ``MAX_RECORD_BYTES``, and history is kept as columns.

Incremental: ``run_files`` keeps, per log, the offset after the last complete record and
the state needed to go on (config, summary, run info, latest values); a log that grew is
read from there and only its new points and samples are added.

The package, one job a module: ``folder`` finds run folders; ``log`` is the log's framing;
``chunks`` reads its records in chunks, decoded (``decode``, with ``protobufs`` and
``history``) in this process or by two workers; ``fold`` folds them into a ``RunState``
(``state``, ``summary_tree``); ``folder_files`` reads ``files/``; ``rows`` turns the state
into the warehouse's values; ``source`` is the importer.
"""

from audit.importers.wandb.source import WandbSource, import_wandb

__all__ = ["WandbSource", "import_wandb"]

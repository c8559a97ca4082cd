"""``audit ingest ...``: the commands that write the warehouse."""

from __future__ import annotations

from pathlib import Path

import click

from audit.cli import AppContext, cli, pass_app
from audit.cli.options import skip_bad_option, window_options
from audit.progress import ProgressReporter
from audit.text import counted
from audit.text import terminal_safe as safe


@cli.group()
def ingest() -> None:
    """Import history into the warehouse (atomic, incremental, idempotent).

    \b
    Example:
      audit ingest mlflow --tracking-uri http://127.0.0.1:5000
    """


@ingest.command("mlflow")
@click.option(
    "--tracking-uri",
    required=True,
    envvar="MLFLOW_TRACKING_URI",
    help="sqlite:///PATH, postgresql://…, http(s)://HOST:PORT or an mlruns/ folder. "
    "Env: MLFLOW_TRACKING_URI.",
)
@click.option(
    "--experiment",
    "experiments",
    multiple=True,
    metavar="NAME",
    help="Only these experiments (repeatable). Default: all, deleted ones included.",
)
@pass_app
def ingest_mlflow(app: AppContext, tracking_uri: str, experiments: tuple[str, ...]) -> None:
    """Import runs, params, tags, metric history and datasets from MLflow.

    Reads SQL and file stores directly in bulk and a tracking server through its REST API.
    A second import fetches only new or changed runs; a failure or Ctrl-C leaves the
    warehouse as it was.

    \b
    Example:
      audit ingest mlflow --tracking-uri sqlite:///mlflow.db --experiment sft-coder
    """
    from audit.importers.mlflow import import_mlflow

    config = app.config
    with app.warehouse(create=True) as wh:
        summary = import_mlflow(
            wh,
            tracking_uri,
            list(experiments),
            config=config,
            progress=ProgressReporter("importing runs"),
        )
    click.echo(safe(summary.line()))


def _paths(values: tuple[str, ...]) -> list[Path]:
    return [Path(v) for v in values]


def _fields(value: str | None) -> list[str] | None:
    return [f.strip() for f in value.split(",")] if value else None


def _report_skipped(summary) -> None:
    for message in summary.notes:
        click.echo(f"note: {safe(message)}", err=True)
    for message in summary.warnings[:20]:
        click.echo(f"warning: {safe(message)}", err=True)
    if len(summary.warnings) > 20:
        click.echo(f"warning: ... {len(summary.warnings) - 20} more", err=True)
    for message in summary.skipped[:20]:
        click.echo(f"skipped: {safe(message)}", err=True)
    if len(summary.skipped) > 20:
        more = counted(len(summary.skipped) - 20, f"more {summary.skipped_what}")
        click.echo(f"skipped: ... {more}", err=True)


@ingest.command("slurm")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option(
    "--fields",
    metavar="F1,F2,...",
    help="Column names of headerless output, in order (the sacct --format list).",
)
@click.option(
    "--delimiter", default="|", show_default=True, help="Field separator (sacct --delimiter)."
)
@click.option(
    "--cluster",
    default="default",
    show_default=True,
    help="Cluster name, to keep job ids of several clusters apart.",
)
@skip_bad_option("lines")
@pass_app
def ingest_slurm(app: AppContext, files, fields, delimiter, cluster, skip_bad) -> None:
    """Import Slurm accounting (sacct -P output, with or without header, or sacct --json).

    Job and step rows (123.batch, 123.0, 123_4) are read; step usage (GPU utilisation and
    memory from TRESUsageInMax and TRESUsageInAve) rolls up to the job. Naive times are
    read in the configured [cluster] timezone. A job already imported keeps its newer
    record, whatever the order of imports.

    \b
    Example:
      sacct -a -P -S 2026-11-16 -E 2026-11-23 -o JobID,JobName,User,... > week.sacct
      audit ingest slurm week.sacct
      audit ingest slurm --fields JobID,JobName,User --delimiter '☃' dump.txt
      sacct -a --json -S 2026-11-16 -E 2026-11-23 > week.json && audit ingest slurm week.json
    """
    from audit.importers.cluster import import_slurm

    if not delimiter:
        raise click.UsageError("--delimiter must not be empty")
    config = app.config
    with app.warehouse(create=True) as wh:
        summary = import_slurm(
            wh, _paths(files), config, _fields(fields), delimiter, skip_bad, cluster
        )
    _report_skipped(summary)
    click.echo(safe(summary.line()))


@ingest.command("gpu")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option(
    "--host", help="Host of nvidia-smi files (default: each file's name without extension)."
)
@click.option(
    "--fields",
    metavar="F1,F2,...",
    help="Columns of nvidia-smi --format=csv,noheader files (the --query-gpu list).",
)
@click.option(
    "--at",
    type=click.DateTime(["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
    help="Time (UTC) of DCGM snapshots without sample timestamps (default: the file's modification time).",
)
@skip_bad_option("lines")
@pass_app
def ingest_gpu(app: AppContext, files, host, fields, at, skip_bad) -> None:
    """Import GPU telemetry: nvidia-smi CSV, dcgm-exporter text, Prometheus JSON.

    The format is detected from the content. nvidia-smi files may have any column order
    and subset, units in the header or the values, N/A values, and no index column (one
    GPU per file, or GPUs by their order in each sample); UTF-8 or UTF-16 with BOM. A last
    line cut off by a file still being written is skipped with a note.

    \b
    Example:
      nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,memory.total \\
          --format=csv -l 60 > gpu-node07.csv
      audit ingest gpu gpu-node07.csv --host gpu-node07
      audit ingest gpu dcgm-snapshot.txt prom-range.json
    """
    from audit.importers.cluster import import_gpu

    config = app.config
    with app.warehouse(create=True) as wh:
        summary = import_gpu(wh, _paths(files), config, host, _fields(fields), skip_bad, at)
    _report_skipped(summary)
    click.echo(safe(summary.line()))


@ingest.command("prometheus")
@click.option("--url", required=True, help="Base URL of a server with the Prometheus HTTP API.")
@window_options(
    since_help="First bucket (UTC; default: 7 days before --until).",
    until_help="Last bucket (UTC; default: the last whole bucket before now).",
)
@click.option(
    "--step",
    metavar="DURATION",
    help="Bucket width (60s, 1m, 5m, 1h); default: what the warehouse holds, else by the "
    "window (≤ 1 day 1m, ≤ 7 days 5m, longer 15m; [prometheus] resolution).",
)
@click.option(
    "--exporter",
    type=click.Choice(["auto", "dcgm", "jobstats", "nvidia_gpu_exporter", "custom"]),
    help="Whose metric names to read (default: [prometheus] exporter, auto).",
)
@click.option(
    "--selector",
    default="",
    metavar="MATCHERS",
    help="Label matchers added to every query, e.g. 'cluster=\"della\"'.",
)
@click.option("--bearer-token-file", type=click.Path(path_type=Path), help="Read a bearer token.")
@click.option("--bearer-token-env", metavar="VAR", help="Read a bearer token from this variable.")
@click.option("--user", metavar="NAME", help="Basic auth user (password from the next options).")
@click.option("--password-file", type=click.Path(path_type=Path), help="Basic auth password file.")
@click.option("--password-env", metavar="VAR", help="Basic auth password from this variable.")
@click.option("--ca-file", type=click.Path(path_type=Path), help="CA bundle for https.")
@click.option(
    "--insecure-skip-verify", is_flag=True, help="Do not check the server's TLS certificate."
)
@skip_bad_option("values (outside their valid range)")
@pass_app
def ingest_prometheus(
    app: AppContext,
    url,
    since,
    until,
    step,
    exporter,
    selector,
    bearer_token_file,
    bearer_token_env,
    user,
    password_file,
    password_env,
    ca_file,
    insecure_skip_verify,
    skip_bad,
) -> None:
    """Import GPU telemetry rollups from Prometheus, Thanos, Mimir or VictoriaMetrics.

    The server aggregates: per GPU and bucket, mean and highest utilisation, memory peak
    and capacity, mean power, from dcgm-exporter, jobstats' GPU exporter or
    nvidia_gpu_exporter metrics (others through [prometheus] metrics and labels). A job
    label (hpc_job, jobid) attaches buckets to their job. Queries stay within the server's
    points-per-series limit and [prometheus] max_points_per_query; a second import asks only
    for the buckets after each host's last one. Credentials are read from a file or an
    environment variable and never stored or printed. Any failure stores nothing.

    \b
    Example:
      audit ingest prometheus --url http://prometheus:9090 --since 2026-11-16 --until 2026-11-23
      audit ingest prometheus --url https://mimir.example/prometheus \\
          --bearer-token-file ~/.config/mimir-token --selector 'cluster="della"'
    """
    from audit.importers.prometheus import Credentials, import_prometheus

    if bearer_token_file and bearer_token_env:
        raise click.UsageError("give --bearer-token-file or --bearer-token-env, not both")
    if password_file and password_env:
        raise click.UsageError("give --password-file or --password-env, not both")
    credentials = Credentials(
        bearer_token_file=bearer_token_file,
        bearer_token_env=bearer_token_env,
        user=user,
        password_file=password_file,
        password_env=password_env,
        ca_file=ca_file,
        insecure_skip_verify=insecure_skip_verify,
    )
    config = app.config
    with app.warehouse(create=True) as wh:
        summary = import_prometheus(
            wh,
            config,
            url,
            since=since,
            until=until,
            step=step,
            exporter=exporter,
            selector=selector,
            credentials=credentials,
            skip_bad=skip_bad,
            progress=ProgressReporter("querying Prometheus"),
        )
    _report_skipped(summary)
    click.echo(safe(summary.line()))


@ingest.command("checkpoints")
@click.argument("roots", nargs=-1, required=True, type=click.Path(path_type=str))
@pass_app
def ingest_checkpoints(app: AppContext, roots) -> None:
    """Inventory checkpoint folders (HF Trainer, Lightning, loose weight files).

    Symlinks are not followed; an unreadable folder is skipped and named. Each checkpoint
    is linked to its run through the run's output_dir param, a run id in the path, or the
    run's local artifact URI. A rescan of a root replaces its inventory.

    \b
    Example:
      audit ingest checkpoints /scratch/coder/ckpt /scratch/agents/ckpt
    """
    from audit.importers.cluster import import_checkpoints

    config = app.config
    with app.warehouse(create=True) as wh:
        summary = import_checkpoints(wh, _paths(roots), config)
    _report_skipped(summary)
    click.echo(safe(summary.line()))


@ingest.command("links")
@pass_app
def ingest_links(app: AppContext) -> None:
    """Recompute the run/job/checkpoint links with this configuration's [links] settings.

    Imports keep the links earlier imports made: one whose [links] settings would lose
    some (say, run without the --config that maps cluster paths) is refused. Run this
    when the new settings are what you want; it prints how the coverage changed.

    \b
    Example:
      audit ingest links                         # with ./audit.toml
      AUDIT_CONFIG=/etc/audit/team.toml audit ingest links
    """
    from audit.importers.links import relink

    with app.warehouse() as wh:
        changes = relink(wh, app.config)
    click.echo(
        f"links recomputed: checkpoints with a run {changes.checkpoints_before} -> "
        f"{changes.checkpoints_after}, runs with a Slurm job {changes.runs_with_jobs_before} -> "
        f"{changes.runs_with_jobs_after}"
    )


@ingest.command("wandb")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@skip_bad_option("runs (unreadable folders or logs)")
@pass_app
def ingest_wandb(app: AppContext, paths, skip_bad) -> None:
    """Import W&B run folders from disk (offline or synced; no network, no API key).

    PATH is a wandb/ folder, a run folder (run-*/offline-run-*), a .wandb file, or any
    folder above them. Reads each run's .wandb transaction log: config as params, history
    as metrics, system metrics as GPU samples of the run, exit status. Needs the
    'audit-waste[wandb]' extra; without it only files/ (config, summary, metadata) is read.
    A log cut short imports what precedes the damage, with a warning; a re-import reads
    only what a log gained since.

    \b
    Example:
      pip install 'audit-waste[wandb]'
      audit ingest wandb /scratch/agents/wandb
      audit ingest wandb --skip-bad runs/*/wandb
    """
    from audit.importers.wandb import import_wandb

    config = app.config
    with app.warehouse(create=True) as wh:
        summary = import_wandb(
            wh, _paths(paths), config, skip_bad, ProgressReporter("importing W&B runs")
        )
    _report_skipped(summary)
    click.echo(safe(summary.line()))


@ingest.command("trainer-logs")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@skip_bad_option("runs (unreadable folders or logs)")
@click.option(
    "--trust-file-times",
    is_flag=True,
    help="Place runs in time by their files' modification times even when nothing "
    "corroborates them (the folders were not copied).",
)
@pass_app
def ingest_trainer_logs(app: AppContext, paths, skip_bad, trust_file_times) -> None:
    """Import runs logged to no tracker: HF Trainer, LLaMA-Factory and verl files.

    PATH is a training output folder or any folder above them, or a log file. One run per
    output folder, from the most complete trainer_state.json (its own or a checkpoint-N/
    one) or LLaMA-Factory's trainer_log.jsonl with training_args.yaml and *_results.json;
    one run per verl file-logger JSONL. training_args.bin is never unpickled.

    The files hold durations but no clock: file modification times place a run only when
    two of its files were written at different times (a copied folder has the copy's
    times); otherwise its duration is kept and its points are placed by step.

    \b
    Example:
      audit ingest trainer-logs /scratch/coder/saves
      audit ingest trainer-logs outputs/grpo/metrics.jsonl
    """
    from audit.importers.trainer_logs import import_trainer_logs

    config = app.config
    with app.warehouse(create=True) as wh:
        summary = import_trainer_logs(
            wh,
            _paths(paths),
            config,
            skip_bad,
            ProgressReporter("importing trainer logs"),
            trust_file_times,
        )
    _report_skipped(summary)
    click.echo(safe(summary.line()))


@ingest.command("tensorboard")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@skip_bad_option("runs (unreadable folders or logs)")
@pass_app
def ingest_tensorboard(app: AppContext, paths, skip_bad) -> None:
    """Import TensorBoard event files: every scalar, and hparams as params.

    PATH is a log dir, a run folder or an event file; each folder holding
    events.out.tfevents.* files is one run. Read with TensorBoard's own loader (the
    'audit-waste[tensorboard]' extra), all events, no sampling.

    \b
    Example:
      pip install 'audit-waste[tensorboard]'
      audit ingest tensorboard outputs/sft-qwen/runs
    """
    from audit.importers.tensorboard import import_tensorboard

    config = app.config
    with app.warehouse(create=True) as wh:
        summary = import_tensorboard(
            wh, _paths(paths), config, skip_bad, ProgressReporter("importing TensorBoard runs")
        )
    _report_skipped(summary)
    click.echo(safe(summary.line()))


@ingest.command("evals")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@skip_bad_option("files (unreadable or not results)")
@pass_app
def ingest_evals(app: AppContext, paths, skip_bad) -> None:
    """Import evaluation results: lm-evaluation-harness results JSON (0.3 and 0.4).

    PATH is a results file or a folder searched for *.json files. One run per file (its id
    is the hash of the bytes: a copy is the same run), with the settings as params, each
    value as a metric named as lm-eval's W&B logger names it, and each value with its
    n-shot, stderr, direction and task version in eval_results. Leaderboard CSVs and other
    JSON files in a folder are skipped with a note; a file cut short is exit 2 naming the
    byte where its JSON breaks.

    \b
    Example:
      audit ingest evals results/meta-llama__Llama-3.1-8B-Instruct/
      audit ingest evals --skip-bad eval-outputs/
    """
    from audit.importers.evals import import_evals

    config = app.config
    with app.warehouse(create=True) as wh:
        summary = import_evals(
            wh, _paths(paths), config, skip_bad, ProgressReporter("importing evaluation results")
        )
    _report_skipped(summary)
    click.echo(safe(summary.line()))

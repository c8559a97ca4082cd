"""``audit runs ...``, ``audit sql`` and ``audit export``: the queryable history."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import polars as pl

from audit.cli import AppContext, cli, pass_app
from audit.cli.options import FILE, format_option, limit_option
from audit.format import cell, json_default, json_text, table
from audit.text import counted
from audit.text import terminal_safe as safe

FORMAT = format_option(["table", "json", "csv"], "table", "Output format.")


def _registry(app: AppContext):
    from audit.query.registry import Registry

    return Registry(app.db_path, app.config)


def emit(frame: pl.DataFrame, fmt: str, empty: str = "no runs match") -> None:
    """``frame`` in the format; a table with no rows says ``empty`` instead. Lists, arrays,
    structs and maps are JSON in CSV (and themselves in JSON), JSON-like text in a table."""
    if fmt == "json":
        click.echo(json.dumps(frame.to_dicts(), indent=2, default=json_default))
    elif fmt == "csv":
        text = _nested_as_text(frame, json_text).write_csv()
        # A terminal gets escapes shown, not obeyed; a file or a pipe gets the values exactly
        # (color=True stops click from stripping what looks like ANSI codes out of data).
        if sys.stdout.isatty():
            click.echo(safe(text), nl=False)
        else:
            click.echo(text, nl=False, color=True)
    elif frame.is_empty():
        click.echo(empty)
    else:
        click.echo(table(frame.columns, [[cell(v) for v in row] for row in frame.iter_rows()]))


def _nested_as_text(frame: pl.DataFrame, render) -> pl.DataFrame:
    return frame.with_columns(
        pl.Series(name, [render(v) for v in frame[name].to_list()], dtype=pl.String)
        for name, dtype in frame.schema.items()
        if dtype.is_nested()
    )


@cli.group("runs")
def runs_group() -> None:
    """Search, compare and de-duplicate the run history.

    \b
    Example:
      audit runs search "params.learning_rate < 3e-5 and tags.team = 'coder'"
      audit runs similar --config train.yaml --fail-if-exists
    """


@runs_group.command("search")
@click.argument("filter_text", metavar="FILTER", default="")
@click.option(
    "--order-by",
    multiple=True,
    metavar="EXPR",
    help="e.g. 'metrics.acc DESC' (repeatable; numbers sort as numbers).",
)
@limit_option(100, "At most this many runs.")
@click.option(
    "--columns", help="Extra columns, comma separated: params.<key>,metrics.<key>,tags.<key>."
)
@click.option("--include-deleted", is_flag=True, help="Also search runs deleted in MLflow.")
@FORMAT
@pass_app
def runs_search(
    app: AppContext, filter_text, order_by, limit, columns, include_deleted, fmt
) -> None:
    """Find runs with MLflow's filter syntax, plus OR, NOT, IN, BETWEEN and numeric params.

    Params compare as numbers when the value is one ('1e-05' = '0.00001'), metrics use
    the latest value unless wrapped in max(), min(), avg() or last().

    \b
    Example:
      audit runs search "params.learning_rate = '1e-05' and attributes.status = 'FINISHED'"
      audit runs search "(params.method = 'sft' or params.method = 'opd') and max(metrics.\\`eval/target/acc\\`) > 0.4" \\
          --order-by "metrics.\\`eval/target/acc\\` DESC" --format json
    """
    wanted = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
    registry = _registry(app)
    frame = registry.search(filter_text, list(order_by), limit, wanted, include_deleted)
    emit(frame.drop("source_id") if "source_id" in frame.columns and fmt == "table" else frame, fmt)
    if frame.is_empty() and filter_text:
        for hint in registry.missing_keys(filter_text):
            click.echo(f"hint: {hint}", err=True)


@runs_group.command("similar")
@click.option(
    "--run",
    "run_id",
    metavar="RUN_ID",
    help="Compare with this run's params (a unique prefix will do).",
)
@click.option(
    "--config",
    "config_file",
    type=FILE,
    help="A training config (YAML, JSON or TOML); nested keys are joined with '.'.",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="A param of the planned run (repeatable).",
)
@click.option(
    "--ignore",
    help="Keys to leave out of the comparison, comma separated (volatile ones always are).",
)
@limit_option(10, "Nearest neighbours to show.")
@click.option(
    "--fail-if-exists", is_flag=True, help="Exit 1 when a FINISHED run with the same config exists."
)
@FORMAT
@pass_app
def runs_similar(
    app: AppContext, run_id, config_file, params, ignore, limit, fail_if_exists, fmt
) -> None:
    """Has this configuration been run already, and how did it score?

    Exact matches have the same normalised value for every key (volatile keys such as
    output_dir ignored); nearest neighbours share at least one key and are ranked by how
    many differ. A key is matched to the name runs logged it under: the same apart from
    case and separators (lora.r is lora_r), another trainer's name for the setting
    (lora_rank, lr), or a nested key's last part (training.learning_rate is
    learning_rate); keys no run logged are named, with the closest logged ones.

    \b
    Example:
      audit runs similar --param learning_rate=1e-5 --param method=sft --param dataset=codeedit-v3
      audit runs similar --config train.yaml --fail-if-exists && python train.py
    """
    given = sum(x is not None and x != () for x in (run_id, config_file, params or None))
    if given != 1:
        raise click.UsageError("give exactly one of --run, --config or --param")
    pairs = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--param takes KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value.strip()
    ignored = [k.strip() for k in ignore.split(",")] if ignore else []
    result = _registry(app).similar(run_id, config_file, pairs or None, ignored, limit)
    finished = (
        result.exact.filter(pl.col("status") == "FINISHED") if result.exact.height else result.exact
    )
    if fmt == "json":
        click.echo(
            json.dumps(
                {
                    "query": result.query,
                    "compared_as": result.compared_as,
                    "missing": result.missing,
                    "exact": result.exact.to_dicts(),
                    "neighbours": result.neighbours.to_dicts(),
                },
                indent=2,
                default=json_default,
            )
        )
    else:
        click.echo(f"exact matches: {result.exact.height} ({finished.height} finished)")
        if result.exact.height:
            emit(
                result.exact.select(
                    "run_id",
                    "run_name",
                    "status",
                    "start_time",
                    "target",
                    "general",
                    "gpu_hours",
                    "run_hours",
                    "shift",
                ),
                fmt,
            )
        click.echo("")
        if not result.neighbours.height:
            click.echo("nearest runs: none (no other run logged a key of the query)")
        else:
            click.echo(f"nearest runs ({result.neighbours.height}):")
            described = [
                "; ".join(_difference(d) for d in row or [])
                for row in result.neighbours["differences"].to_list()
            ]
            emit(
                result.neighbours.select(
                    "run_id", "run_name", "status", "differing", "target", "gpu_hours", "shift"
                ).with_columns(differences=pl.Series(described, dtype=pl.String)),
                fmt,
            )
    _explain_keys(result)
    if fail_if_exists and finished.height:
        click.echo(
            f"a finished run with this configuration exists: {finished['run_id'][0]}", err=True
        )
        raise SystemExit(1)


def _difference(d: dict) -> str:
    name = d["key"] if d["logged_as"] in (None, d["key"]) else f"{d['key']} as {d['logged_as']}"
    found = "not logged" if d["found"] is None else d["found"]
    return f"{name}: {found} (wanted {d['wanted']})"


HINTED_KEYS = 5


def _explain_keys(result) -> None:
    """On stderr: the query keys compared under other names, those no run logged (with
    the closest logged keys), and what a missing key means for exact matches."""
    if result.compared_as:
        shown = "; ".join(f"{k} as {' or '.join(v)}" for k, v in result.compared_as.items())
        click.echo(safe(f"note: compared under the names runs logged: {shown}"), err=True)
    missing = list(result.missing.items())
    if not missing:
        return
    nothing_logged = len(missing) == len(result.query)
    if nothing_logged:
        click.echo("hint: no run logged any key of the query, under any name", err=True)
    for key, close in missing[:HINTED_KEYS]:
        guess = f"; did you mean {' or '.join(repr(k) for k in close)}?" if close else ""
        click.echo(safe(f"hint: no run logged {key!r} under any name{guess}"), err=True)
    if len(missing) > HINTED_KEYS:
        rest = ", ".join(k for k, _ in missing[HINTED_KEYS : HINTED_KEYS + 10])
        more = ", ..." if len(missing) > HINTED_KEYS + 10 else ""
        click.echo(
            safe(
                f"hint: {counted(len(missing) - HINTED_KEYS, 'more key')} no run logged: {rest}{more}"
            ),
            err=True,
        )
    if not nothing_logged:
        click.echo(
            "hint: no run matches exactly while a key is missing; leave such keys out with "
            "--ignore KEY,...",
            err=True,
        )


@runs_group.command("compare")
@click.argument("run_ids", nargs=-1, required=True)
@click.option("--all-params", is_flag=True, help="Show every param, not only the differing ones.")
@FORMAT
@pass_app
def runs_compare(app: AppContext, run_ids, all_params, fmt) -> None:
    """Params side by side (differing keys only by default), metrics, GPU-hours and cost.

    Run ids may be shortened to a unique prefix of at least 4 characters, as in git.

    \b
    Example:
      audit runs compare 5a7bde3db006447f 9339f45d8ecb4aa8
      audit runs compare 5a7b 9339 --all-params
    """
    parts = _registry(app).compare(list(run_ids), all_params)
    if fmt == "json":
        click.echo(
            json.dumps({k: v.to_dicts() for k, v in parts.items()}, indent=2, default=json_default)
        )
        return
    empty = {
        "params": "no params logged"
        if all_params
        else "the params are identical (--all-params lists them)",
        "metrics": "no metrics logged",
    }
    for title, frame in parts.items():
        click.echo(f"{title}:")
        emit(frame, fmt, empty=empty.get(title, "none"))
        click.echo("")


@cli.command("sql")
@click.argument("query")
@FORMAT
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True, max=1e9),
    metavar="SECONDS",
    help="Stop the query after this long (exit 2). Default: [sql] timeout_seconds, 60.",
)
@pass_app
def sql_command(app: AppContext, query, fmt, timeout) -> None:
    """Run one read-only SQL query over the warehouse views; writes are refused. Ctrl-C
    stops a running query at once (exit 130).

    Views: runs, params, params_wide, metrics, latest_metrics, tags, datasets, jobs,
    job_nodes, telemetry, checkpoints, findings, scans (columns in docs/schema.md).

    \b
    Example:
      audit sql "select key, count(*) from params group by key order by 2 desc limit 10"
    """
    timeout = timeout if timeout is not None else app.config.sql.timeout_seconds
    frame = _registry(app).sql(query, timeout)
    emit(frame, fmt, empty=f"no rows ({', '.join(frame.columns)})" if frame.columns else "no rows")


@cli.command("export")
@click.option(
    "--parquet",
    "folder",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Empty folder to write <table>/<partition>=<value>/*.parquet into.",
)
@pass_app
def export_command(app: AppContext, folder) -> None:
    """Export the warehouse as Hive-partitioned Parquet, readable by other engines.

    \b
    Example:
      audit export --parquet /data/audit-export
    """
    counts = _registry(app).export_parquet(folder)
    rows, tables = sum(counts.values()), sum(1 for n in counts.values() if n)
    click.echo(f"exported {counted(rows, 'row')} from {counted(tables, 'table')} to {folder}")

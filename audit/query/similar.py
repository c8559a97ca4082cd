"""``runs similar`` ("already run?"): the runs whose params match a planned run's config,
a logged run's params or given key=value pairs, exactly or nearly, with their metrics,
GPU-hours and shift. Nested config keys are matched to logged ones by ``config_keys``."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from audit.config import Config
from audit.errors import InputError, utf8_problem
from audit.importers.params import flatten_config, normalised_texts
from audit.importers.wandb.rows import config_params
from audit.query.config_keys import match_keys
from audit.query.run_ids import resolve_run_id

# Distinct param keys looked at to match a query's keys (a warehouse has a few thousand).
MAX_LOGGED_KEYS = 100_000
# Query keys no run logged that get "did you mean" suggestions (difflib over every key).
SUGGESTED_KEYS = 20
# [attribution] lists of keys that name one setting in different trainers' logs
SAME_SETTING_KEYS = ("base_model_keys", "dataset_keys", "method_keys", "teacher_keys")


@dataclass
class Similar:
    query: dict[str, str]
    exact: pl.DataFrame
    neighbours: pl.DataFrame
    # query keys compared under other names: the logged keys, best first (config_keys)
    compared_as: dict[str, list[str]] = field(default_factory=dict)
    # query keys no run logged under any name: close logged keys, if any
    missing: dict[str, list[str]] = field(default_factory=dict)


def similar(
    wh,
    config: Config,
    run_id: str | None = None,
    config_file: Path | None = None,
    params: dict[str, str] | None = None,
    ignore: list[str] | None = None,
    limit: int = 10,
) -> Similar:
    """The runs whose params are those of ``run_id``, of ``config_file`` or ``params``
    (volatile and ignored keys left out): exact matches and the nearest neighbours."""
    skip = set(config.attribution.volatile_params) | set(ignore or [])
    if run_id is not None:
        run_id = resolve_run_id(wh, run_id)
        found = wh.frame("SELECT key, value FROM params WHERE run_id = ?", [run_id])
        query = dict(zip(found["key"], found["value"], strict=True))
    elif config_file is not None:
        query = config_settings(read_config_file(config_file))
    else:
        query = dict(params or {})
    if not query:
        raise InputError("nothing to compare: give --run, --config or --param key=value")
    # a nested key is volatile when its last part is (training.output_dir)
    query = {k: v for k, v in query.items() if k not in skip and k.rsplit(".", 1)[-1] not in skip}
    if not query:
        raise InputError(
            "nothing to compare: every key given is volatile ([attribution] "
            "volatile_params) or left out with --ignore"
        )
    logged = [
        r[0]
        for r in wh.con.execute(
            "SELECT DISTINCT key FROM params ORDER BY key LIMIT ?", [MAX_LOGGED_KEYS]
        ).fetchall()
    ]
    attribution = config.attribution
    matched = match_keys(
        list(query),
        logged,
        [getattr(attribution, k) for k in SAME_SETTING_KEYS],
    )
    by_text = normalised_texts([str(v) for v in query.values()])
    normalised = {k: by_text[str(v)][1] for k, v in query.items()}
    wh.con.register(
        "audit_query",
        pl.DataFrame(
            {
                "key": list(normalised),
                "norm": list(normalised.values()),
                "raw": [str(query[k]) for k in normalised],
            },
            schema={"key": pl.String, "norm": pl.String, "raw": pl.String},
        ),
    )
    # one row per query key and logged name; only a key with several names needs
    # a run's best tier found (most keys have one: the query's own)
    names = [
        (key, logged_key, rank, len(matched.names(key)) > 1)
        for key, tiers in matched.tiers.items()
        for rank, tier in enumerate(tiers)
        for logged_key in tier
    ]
    wh.con.register(
        "audit_names",
        pl.DataFrame(
            names,
            schema={
                "key": pl.String,
                "logged_key": pl.String,
                "rank": pl.Int32,
                "several": pl.Boolean,
            },
            orient="row",
        ),
    )
    try:
        scored = wh.frame(
            """
            WITH candidates AS (
                SELECT r.source_id, r.run_id, r.name AS run_name, r.status, r.start_time FROM runs r
                WHERE r.lifecycle_stage = 'active' AND (? IS NULL OR r.run_id <> ?)
            ),
            named AS (  -- a key's params under its only name
                SELECT p.source_id, p.run_id, n.key, p.key AS logged_as, p.value AS found,
                       p.value_norm AS found_norm
                FROM params p JOIN audit_names n ON n.logged_key = p.key AND NOT n.several
                JOIN candidates c USING (source_id, run_id)
            ),
            tiers AS (  -- the names of one tier a run logged stand for the key when they agree
                SELECT p.source_id, p.run_id, n.key, n.rank,
                       {'logged_as': string_agg(p.key, ', ' ORDER BY p.key),
                        'found': CASE WHEN count(DISTINCT p.value_norm) = 1 THEN min(p.value)
                                      ELSE string_agg(p.value, ', ' ORDER BY p.key) END,
                        'found_norm': CASE WHEN count(DISTINCT p.value_norm) = 1
                                           THEN min(p.value_norm) END} AS named
                FROM params p JOIN audit_names n ON n.logged_key = p.key AND n.several
                JOIN candidates c USING (source_id, run_id)
                GROUP BY ALL
            ),
            logged AS (  -- each query key's best tier a run logged
                SELECT * FROM named
                UNION ALL BY NAME
                SELECT source_id, run_id, key, unnest(best) FROM (
                    SELECT source_id, run_id, key, arg_min(named, rank) AS best
                    FROM tiers GROUP BY source_id, run_id, key
                )
            ),
            compared AS (
                SELECT c.source_id, c.run_id, q.key, q.raw AS wanted, l.found, l.logged_as,
                       l.found_norm IS NOT DISTINCT FROM q.norm AS same
                FROM candidates c CROSS JOIN audit_query q
                LEFT JOIN logged l ON l.source_id = c.source_id AND l.run_id = c.run_id AND l.key = q.key
            ),
            extra AS (
                SELECT p.source_id, p.run_id, count(*) AS n FROM params p JOIN candidates c USING (source_id, run_id)
                WHERE p.key NOT IN (SELECT logged_key FROM audit_names) AND NOT list_contains(?, p.key)
                GROUP BY ALL
            )
            SELECT c.source_id, c.run_id, c.run_name, c.status, c.start_time,
                   count(*) FILTER (WHERE NOT x.same) AS differing,
                   count(x.logged_as) AS shared_keys,
                   coalesce(any_value(e.n), 0) AS extra_keys,
                   list({'key': x.key, 'logged_as': x.logged_as, 'wanted': x.wanted, 'found': x.found} ORDER BY x.key) FILTER (WHERE NOT x.same) AS differences
            FROM candidates c JOIN compared x USING (source_id, run_id)
            LEFT JOIN extra e USING (source_id, run_id)
            GROUP BY c.source_id, c.run_id, c.run_name, c.status, c.start_time
            ORDER BY differing, extra_keys, c.start_time DESC, c.run_id
            """,
            [run_id, run_id, sorted(skip)],
        )
    finally:
        wh.con.unregister("audit_query")
        wh.con.unregister("audit_names")
    # an exact match has every key of the query; when comparing with a run it also has no extra keys
    exact_mask = (pl.col("differing") == 0) & (
        (pl.col("extra_keys") == 0) if run_id else pl.lit(True)
    )
    exact = _with_outcomes(wh, config, scored.filter(exact_mask))
    # a run that logged none of the query's keys is no neighbour, however few differ
    neighbours = _with_outcomes(
        wh, config, scored.filter(~exact_mask & (pl.col("shared_keys") > 0)).head(limit)
    )
    missing = {
        key: matched.suggestions(key) if i < SUGGESTED_KEYS else []
        for i, key in enumerate(matched.missing)
    }
    return Similar(
        query=query,
        exact=exact,
        neighbours=neighbours,
        compared_as={k: matched.names(k) for k in matched.tiers if matched.names(k) != [k]},
        missing=missing,
    )


def _with_outcomes(wh, config: Config, runs: pl.DataFrame) -> pl.DataFrame:
    """Add target and general metrics (latest) and GPU-hours to runs."""
    if runs.is_empty():
        return runs.with_columns(
            target=pl.lit(None, pl.String),
            general=pl.lit(None, pl.String),
            gpu_hours=pl.lit(None, pl.Float64),
            run_hours=pl.lit(None, pl.Float64),
            cost_basis=pl.lit(None, pl.String),
            shift=pl.lit(None, pl.String),
        )
    from audit.costs import Facts
    from audit.facts.shift import shift_of_runs

    loaded = Facts.load(wh.con, config)
    facts = {r.key: r for r in loaded.runs}
    metrics = wh.frame(
        "SELECT source_id, run_id, key, value FROM latest_metrics WHERE run_id IN (SELECT unnest(?))",
        [runs["run_id"].to_list()],
    )
    summary: dict[tuple, dict[str, list[str]]] = {}
    for row in metrics.iter_rows(named=True):
        kind = config.metrics.kind_of(row["key"], ("target", "general"))
        if kind:
            summary.setdefault((row["source_id"], row["run_id"]), {}).setdefault(kind, []).append(
                f"{row['key'].rsplit('/', 1)[-1]}={row['value']:.3f}"
            )
    keys = list(zip(runs["source_id"], runs["run_id"], strict=True))
    shifts = shift_of_runs(wh.con, config, keys, loaded)
    return runs.with_columns(
        target=pl.Series(
            [", ".join(sorted(summary.get(k, {}).get("target", []))) or None for k in keys],
            dtype=pl.String,
        ),
        general=pl.Series(
            [", ".join(sorted(summary.get(k, {}).get("general", []))) or None for k in keys],
            dtype=pl.String,
        ),
        gpu_hours=pl.Series(
            [facts[k].cost.gpu_hours if k in facts else None for k in keys], dtype=pl.Float64
        ),
        run_hours=pl.Series(
            [facts[k].run_hours if k in facts else None for k in keys], dtype=pl.Float64
        ),
        cost_basis=pl.Series(
            [facts[k].cost.basis if k in facts else None for k in keys], dtype=pl.String
        ),
        shift=pl.Series(
            [shifts[k].describe() if k in shifts else None for k in keys], dtype=pl.String
        ),
    )


MAX_CONFIG_BYTES = 16 << 20
MAX_CONFIG_DEPTH = 100


def config_settings(settings: dict) -> dict[str, str]:
    """A config file's settings as params. W&B's own ``files/config.yaml`` (a ``_wandb``
    block, each value wrapped as ``{value: …}``) is read as its importer reads it: unwrapped,
    the library's block (with the user's e-mail) left out, so the config of a logged run
    finds that run."""
    if "_wandb" in settings or "wandb_version" in settings:
        return config_params(settings)
    return flatten_config(settings)


def read_config_file(path: Path) -> dict:
    """A training config in YAML, JSON or TOML (by extension; content sniffed otherwise).

    Read as any file from elsewhere: a regular file of bounded size (a FIFO or /dev/zero
    is refused), YAML without alias bombs, nesting no deeper than 100 levels.
    """
    from audit import bounded_yaml
    from audit.importers.store_files import read_named_file

    data = read_named_file(path.resolve(), MAX_CONFIG_BYTES, "a training config")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(utf8_problem(path, data, exc)) from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            settings = json.loads(text)
        elif suffix == ".toml":
            settings = tomllib.loads(text)
        else:
            settings = bounded_yaml.load(text, path, "a training config as YAML")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(
            f"{path}: cannot parse as {suffix.lstrip('.')}: {' '.join(str(exc).split())}"
        ) from None
    except RecursionError:
        raise InputError(f"{path}: nested more than {MAX_CONFIG_DEPTH} levels deep") from None
    if not isinstance(settings, dict):
        raise InputError(f"{path}: expected a mapping of settings at the top level")
    if _depth(settings) > MAX_CONFIG_DEPTH:
        raise InputError(f"{path}: nested more than {MAX_CONFIG_DEPTH} levels deep")
    return settings


def _depth(settings: dict) -> int:
    deepest, pending = 0, [(settings, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_CONFIG_DEPTH:
            pending.extend((v, depth + 1) for v in node.values() if isinstance(v, dict))
    return deepest

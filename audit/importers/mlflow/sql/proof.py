"""Proving runs unchanged without computing their signatures: whole-table totals in the
store against the same totals over the warehouse's copies of the runs' rows
(``ChangeProof._runs_proven_unchanged``)."""

from __future__ import annotations

import polars as pl

from audit.importers.mlflow.base import KnownRuns
from audit.importers.mlflow.sql.details import SCAN_FRACTION
from audit.importers.mlflow.sql.signatures import BYTE_LENGTH, rows_of, run_part, tag_length
from audit.importers.run_store import RUN_SCHEMA

# Whole-store totals that prove runs unchanged without grouping by run (see
# ``SqlStoreReader._runs_proven_unchanged``): the same quantities the signature sums per
# run, summed over whole tables in one sequential scan each, and the same totals over the
# warehouse's copies of those rows. Tag lengths are in bytes (SQLite's length() of a text
# stops at a NUL, DuckDB's does not) and also summed weighted by a number drawn from the
# first two characters of the run id (256 weights for hex ids), so that one tag growing on
# one run while another shrinks on another run still moves a total; times and steps are
# summed modulo a prime so that sums of 13-digit epoch milliseconds cannot overflow.
# Changes on several runs can still cancel in every total (a tag moved between two runs
# whose ids start alike): such a change waits for the daily full check
# (``FULL_CHECK_HOURS`` in audit.importers.mlflow).
# Every function call per row costs SQLite time at 400,000 tags: weights from six digits,
# and w² beside w, took the +1 % import at 100,000 runs from 3.3 to 6 CPU-seconds; the
# weight from two code points (unicode) takes the tags' totals from 0.18-0.26 s (two
# instr() of two substr()) to 0.13-0.20 s.
_PRIME = 2_147_483_647


def _weight(run: str, code: str) -> str:
    """The weight of a run id: ``code`` formats the dialect's code point of a text's first
    character."""
    return f"({code.format(run)} * 131 + {code.format(f'substr({run}, 2, 1)')})"


def _change_totals(run: str, length: str, code: str, timestamp: str) -> dict[str, tuple[str, ...]]:
    """The totals of each table as SQL aggregates over rows aliased x: ``run`` is the run id
    column, ``length`` a byte-length function of the dialect, ``code`` its code point of a
    first character, ``timestamp`` epoch ms."""
    of_tag = tag_length(length)
    return {
        "params": ("count(*)",),
        "tags": ("count(*)", f"sum({of_tag})", f"sum({of_tag} * {_weight(run, code)})"),
        "latest_metrics": (
            "count(*)",
            f"sum(x.step % {_PRIME})",
            f"sum(coalesce({timestamp}, 0) % {_PRIME})",
        ),
    }


# An id shorter than two characters weighs as if the missing ones were code point 1 (a
# NULL weight would drop its tags from the weighted total).
STORE_TOTALS = _change_totals(
    "x.run_uuid", BYTE_LENGTH["sqlite"], "coalesce(unicode({}), 1)", "x.timestamp"
)
# The same totals over the warehouse's rows (DuckDB: ids in run_id, times as timestamps,
# and unicode('') is -1 where SQLite's is NULL).
WAREHOUSE_TOTALS = _change_totals(
    "x.run_id", BYTE_LENGTH["duckdb"], "coalesce(nullif(unicode({}), -1), 1)", "epoch_ms(x.ts)"
)
# A run still being written to changes between any two imports: checked run by run, so
# that it does not defeat the whole-store proof for all the others.
ACTIVE_STATUSES = ("RUNNING", "SCHEDULED")


def totals_schema(aggregates: tuple[str, ...]) -> dict:
    return {f"total_{i}": pl.Int64 for i in range(len(aggregates))}


def totals_of(reader_frame) -> tuple[int, ...]:
    """One row of totals as integers (SQL's sum over no rows is NULL: none counts 0)."""
    return tuple(int(v or 0) for v in reader_frame.row(0))


# What the change proof reads of every run: its id, experiment, the columns of its own row
# that a signature covers, and the start (the import's watermark). Proven runs take the
# rest of their row from the warehouse as last imported (``KnownRuns.signatures``), the
# way their names and commits do; the few candidates read their whole rows. The long texts
# left out (user, artifact URI, source) were 0.08 of the 0.19 s SQLite spent on 100k runs.
PROOF_COLUMNS = (
    "run_id",
    "experiment_id",
    "name",
    "status",
    "start_time",
    "end_time",
    "lifecycle_stage",
    "deleted_time",
)
# The rest of a proven run's row, as the warehouse holds it (name and commit aside).
FROM_WAREHOUSE = ("run_id", "user_id", "artifact_uri", "source_name", "source_type")


class ChangeProof:
    """The part of ``SqlStoreReader`` that proves runs unchanged."""

    def _runs_proven_unchanged(
        self, runs: pl.DataFrame, known: KnownRuns, everyone: dict[str, pl.DataFrame]
    ) -> pl.DataFrame | None:
        """``runs`` with signatures, computed in the store only for the runs that may have
        changed, or None when that cannot be proven (the caller then computes them all).

        Candidates are runs that are new, whose own row (status, end, lifecycle, name)
        differs from the one the signature recorded, or that are still running. Every other
        run, R, is proven unchanged when whole-table totals over R's params, tags and latest
        metrics in the store (each table scanned once, minus the candidates' rows read
        through the run index) equal the same totals over the warehouse's copies of R's
        rows: a param or tag added, a tag rewritten to another length or deleted, a metric
        logged to a finished run each move one of them. Whatever makes the totals differ
        (a change, or a store whose rows the warehouse does not mirror exactly) falls back
        to computing every run's signature, as before.
        """
        stored = known.signatures.select(
            *FROM_WAREHOUSE,
            "signature",
            known_name="name",
            known_commit="source_commit",
            recorded=pl.col("signature").str.replace(r"\|[^|]*$", ""),
        )
        runs = runs.with_row_index("order").join(stored, on="run_id", how="left")
        may_have_changed = (
            pl.col("recorded").is_null()
            | (pl.col("recorded") != run_part())
            | pl.col("status").is_in(ACTIVE_STATUSES)
        )
        candidates = runs.filter(may_have_changed)
        if candidates.height > SCAN_FRACTION * runs.height:
            return None
        unchanged = runs.filter(~may_have_changed)
        self._fill_temp_table("audit_candidates", candidates["run_id"].to_list())
        # the warehouse's runs outside R: candidates it knows, runs gone from the store
        not_proven = stored.join(unchanged, on="run_id", how="anti")["run_id"]
        for table, aggregates in STORE_TOTALS.items():
            sql = f"SELECT {', '.join(aggregates)} FROM {rows_of(table, 'audit_candidates')}"
            of_candidates = totals_of(self._frame(sql, totals_schema(aggregates), table))
            in_store = tuple(
                a - b for a, b in zip(totals_of(everyone[table]), of_candidates, strict=True)
            )
            in_warehouse = known.totals(table, WAREHOUSE_TOTALS[table], not_proven)
            if in_store != in_warehouse:
                return None
        candidate_rows = self._frame(*self._runs_query(only="audit_candidates"), "runs")
        # Each candidate's whole row, found again by its id: an id the join cannot find (a
        # BLOB where text belongs) or finds twice (a store whose runs lost their primary key)
        # is not proven anything; every run is then read as on a first import.
        if candidate_rows.height != candidates.height or not candidate_rows["run_id"].sort().equals(
            candidates["run_id"].sort()
        ):
            return None
        checked = self._with_signatures(candidate_rows, only="audit_candidates")
        self.signatures_computed = checked.height
        # Proven unchanged: the name and commit as the warehouse holds them (they may come
        # from tags, which the totals cover), with the signature already recorded.
        proven = unchanged.with_columns(
            name=pl.col("known_name"), source_commit=pl.col("known_commit")
        )
        order = runs.select("run_id", "order")
        return (
            pl.concat([checked, proven.select(list(RUN_SCHEMA))])
            .join(order, on="run_id", how="left")
            .sort("order")
            .drop("order")
        )

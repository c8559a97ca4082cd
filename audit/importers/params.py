"""Param values shared by every tracker importer and by queries: flattening, normalising.

Params are stored as the strings MLflow would log, so ``1e-05``, ``0.00001`` and ``1E-5``
are different values to a tracker. The warehouse keeps the raw string and adds a parsed
number and a canonical text form in which equal numbers (and differently-cased booleans)
compare equal.
"""

from __future__ import annotations

import polars as pl

BOOLEAN_WORDS = {"true": "true", "false": "false"}
# Floats above 2**53 cannot hold every integer, so those keep their float spelling.
_EXACT_INT_LIMIT = 2.0**53


def normalised_params(frame: pl.DataFrame) -> pl.DataFrame:
    """Add ``value_num`` and ``value_norm`` columns to a frame with a ``value`` column."""
    stripped = pl.col("value").str.strip_chars()
    lowered = stripped.str.to_lowercase()
    parsed = stripped.cast(pl.Float64, strict=False)
    finite = pl.when(parsed.is_finite()).then(parsed).otherwise(None)
    is_bool = lowered.is_in(list(BOOLEAN_WORDS))
    is_integral = (finite == finite.round(0)) & (finite.abs() < _EXACT_INT_LIMIT)
    canonical_number = (
        pl.when(is_integral)
        .then(finite.cast(pl.Int64, strict=False).cast(pl.String))
        .otherwise(finite.cast(pl.String))
    )
    return frame.with_columns(
        value_num=pl.when(is_bool).then(None).otherwise(finite),
        value_norm=pl.when(is_bool)
        .then(lowered)
        .when(finite.is_not_null())
        .then(canonical_number)
        .otherwise(stripped),
    )


def normalise_value(value: str) -> tuple[float | None, str]:
    """The same normalisation for one value (used by queries and tests)."""
    row = normalised_params(pl.DataFrame({"value": [value]}, schema={"value": pl.String})).row(0)
    return row[1], row[2]


def flatten_config(data: dict, prefix: str = "") -> dict[str, str]:
    """Nested settings as the HF Trainer's MLflow callback logs them: keys joined with '.',
    values as ``str(value)`` (``True``, ``None``, ``[1, 2]``, ``2e-05``; an empty mapping
    ``{}``), so a configuration logged to W&B and again to MLflow gives equal params.
    """
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_config(value, f"{name}."))
        else:
            out[name] = str(value)
    return out

"""Numbers from run files, bounded before they are stored or computed with.

JSON holds integers of any size and the floats NaN and Infinity; a log's ``_step`` of
10**30, a ``train_runtime`` of ``Infinity`` or a wall time of 1e300 are damage, and they
must end as a clear error or as unknown, never as ``int(inf)`` (an internal error), a
polars overflow, or a run from year 1019 to now that a week's report prices at millions.

- steps (and every integer the warehouse stores) are 64-bit: ``step`` refuses anything
  else with an ``InputError`` naming where it was found;
- durations and times are finite: ``seconds_to_ms`` and ``epoch_seconds_to_ms`` give
  None for NaN, infinities and what overflows;
- times of runs, points and samples lie in the years ``FIRST_YEAR``-``LAST_YEAR``, the
  rule the telemetry importer holds samples to and the run writer holds every tracker's
  times to (``plausible_ms``).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from audit.errors import InputError
from audit.importers.telemetry import FIRST_YEAR, LAST_YEAR

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FIRST_MS = int(datetime(FIRST_YEAR, 1, 1, tzinfo=UTC).timestamp() * 1000)
END_MS = int(datetime(LAST_YEAR + 1, 1, 1, tzinfo=UTC).timestamp() * 1000)  # exclusive


def step(value, where: object, field: str = "step") -> int | None:
    """A step (or count) as stored: None stays None; a whole number beyond 64 bits, a
    boolean or anything else is an input error naming ``where`` and ``field``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where}: {field} is not an integer: {str(value)[:40]!r}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise InputError(
            f"{where}: {field} {str(value)[:40]} is beyond the 64-bit integers the warehouse holds"
        )
    return value


def finite(value) -> float | None:
    """A finite number (booleans and text are not numbers here), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None


def seconds_to_ms(seconds) -> int | None:
    """A duration in seconds as milliseconds; None when it is no finite number or longer
    than the span of plausible times."""
    number = finite(seconds)
    if number is None or abs(number) * 1000 > END_MS - FIRST_MS:
        return None
    return round(number * 1000)


def plausible_ms(ms: int | None) -> int | None:
    """Epoch milliseconds within the years FIRST_YEAR-LAST_YEAR, else None."""
    return ms if ms is not None and FIRST_MS <= ms < END_MS else None


def epoch_seconds_to_ms(seconds) -> int | None:
    """Epoch seconds (a wall time, a ``_timestamp``) as plausible milliseconds, else None."""
    number = finite(seconds)
    if number is None or not FIRST_MS <= number * 1000 < END_MS:
        return None
    return plausible_ms(round(number * 1000))


def iso_to_ms(text) -> int | None:
    """An ISO 8601 time as epoch milliseconds (a naive one is UTC, ``Z`` is accepted); None
    for anything that is not one. Outside the plausible years the run writer leaves it
    unknown, with a warning."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)

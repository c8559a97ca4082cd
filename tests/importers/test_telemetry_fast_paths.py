"""The shortcuts of the nvidia-smi import give what the full rules give, whatever the input."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.importers.cluster import _keys_cycle
from audit.importers.telemetry.nvidia_smi import _UNITS, _numeric, _plain_number

UNIT_TEXT = st.text(alphabet=" %MiBWN/A[]\t.-+0123456789einfaty", max_size=12)


@settings(max_examples=400, deadline=None)
@given(
    value=st.one_of(
        UNIT_TEXT,
        st.floats(allow_nan=True).map(str),
        st.tuples(st.floats(0, 1e6).map(str), st.sampled_from(sorted(set(_UNITS.values())))).map(
            "".join
        ),
    ),
    name=st.sampled_from(sorted(_UNITS)),
)
def test_a_plain_number_is_the_number_the_full_rule_reads(value: str, name: str) -> None:
    body = pl.DataFrame({name: [value]})
    plain, full = body.select(plain=_plain_number(body, name), full=_numeric(pl.col(name))).row(0)
    if plain is not None:  # where the shortcut reads a number, it is the full rule's number
        assert full is not None
        assert str(plain) == str(full)


KEYS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]), st.sampled_from(["0", "1", "2", "10"]), st.integers(0, 5)
    ),
    min_size=0,
    max_size=24,
)


@settings(max_examples=400, deadline=None)
@given(keys=KEYS, cycle=st.integers(1, 4), cycles=st.integers(0, 6))
def test_keys_cycle_only_when_no_key_repeats(keys, cycle: int, cycles: int) -> None:
    # Random rows, and rows that do cycle through GPUs, so both answers are exercised.
    start = datetime(2026, 11, 16)
    cycling = [("h", str(g), c) for c in range(cycles) for g in range(cycle)]
    for rows in (keys, cycling, cycling + keys):
        samples = pl.DataFrame(
            {
                "host": [h for h, _, _ in rows],
                "gpu": [g for _, g, _ in rows],
                "ts": [start + timedelta(minutes=m) for _, _, m in rows],
            },
            schema={"host": pl.String, "gpu": pl.String, "ts": pl.Datetime("us")},
        ).with_columns(pl.col("host", "gpu").cast(pl.Categorical))
        if _keys_cycle(samples):
            assert not samples.select(pl.struct("host", "gpu", "ts").is_duplicated().any()).item()
    if cycles >= 2:
        assert _keys_cycle(
            pl.DataFrame(
                {
                    "host": [h for h, _, _ in cycling],
                    "gpu": [g for _, g, _ in cycling],
                    "ts": [start + timedelta(minutes=m) for _, _, m in cycling],
                }
            ).with_columns(pl.col("host", "gpu").cast(pl.Categorical))
        )

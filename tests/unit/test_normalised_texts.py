"""Property: ``normalised_texts`` answers as ``normalised_params`` does, for any text.

Integers and plain words are normalised without polars (search filters, `runs similar`);
whatever takes that path must get the number and canonical text the importers store.
"""

from __future__ import annotations

import polars as pl
from hypothesis import example, given, settings
from hypothesis import strategies as st

from audit.importers.params import normalise_value, normalised_params, normalised_texts
from tests.helpers import property_examples

# Near misses of both plain forms: leading zeros, signs, exponents, case, blanks, digit
# separators, the float and boolean words, integers beyond 2**53, non-ASCII letters.
AWKWARD = [
    "0",
    "-0",
    "00",
    "007",
    "-5",
    "+5",
    "5.",
    ".5",
    "1e5",
    "1E5",
    "e5",
    "1_000",
    "0x10",
    " 5",
    "5 ",
    "5\n",
    "inf",
    "Inf",
    "-inf",
    "infinity",
    "nan",
    "NaN",
    "true",
    "True",
    "false",
    "FALSE",
    "yes",
    "123456789012345",
    "1234567890123456",
    "9007199254740993",
    "-999999999999999",
    "sft",
    "qwen2.5-7b",
    "a/b:c",
    "é",
    "ß",
    "İ",
    "a b",
    "",
]
TEXT = st.one_of(
    st.sampled_from(AWKWARD),
    st.text(alphabet="abeinftrzAEINT0123456789-+._/: \t\né", max_size=12),
)


def _by_polars(texts: list[str]) -> dict[str, tuple[float | None, str]]:
    frame = normalised_params(pl.DataFrame({"value": texts}, schema={"value": pl.String}))
    return {v: (n, c) for v, n, c in frame.select("value", "value_num", "value_norm").iter_rows()}


@settings(max_examples=property_examples(replay=300, explore=5000), deadline=None)
@given(texts=st.lists(TEXT, max_size=8))
@example(texts=AWKWARD)
def test_the_same_as_normalised_params(texts):
    assert normalised_texts(texts) == _by_polars(texts)


def test_plain_texts_skip_polars_and_keep_their_spelling():
    assert normalised_texts(["64", "-3", "sft", "coder-data-v2"]) == {
        "64": (64.0, "64"),
        "-3": (-3.0, "-3"),
        "sft": (None, "sft"),
        "coder-data-v2": (None, "coder-data-v2"),
    }
    assert normalise_value("007") == (7.0, "7")
    assert normalise_value("True") == (None, "true")

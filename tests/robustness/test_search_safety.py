"""`runs search` against hostile and oversized input (issue 13, cases 7 and 8; issue 14).

User text never becomes SQL, the search connection cannot read files, filters have
documented limits that end in exit 2 naming the limit, and within the limits a 10,000-term
filter or an IN of 100,000 values answers correctly in bounded memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit import Registry
from audit.errors import InputError
from audit.query.fields import quote_identifier
from audit.query.filter import (
    LIMITS_HELP,
    MAX_DEPTH,
    MAX_FIELDS,
    MAX_FILTER_CHARACTERS,
    MAX_TERMS,
    MAX_VALUES,
    FilterError,
)
from tests.helpers import REPO, property_examples


@pytest.fixture(scope="module")
def secret(tmp_path_factory):
    path = tmp_path_factory.mktemp("secret") / "secret.txt"
    path.write_text(f"TOP-SECRET-{uuid.uuid4().hex}")
    return path


def _leak_key(secret_path) -> str:
    """The issue's payload: a key that closes the generated alias and reads a file."""
    return (
        f'method" , (SELECT content FROM read_text(\'{secret_path}\')) AS "leak" '
        "FROM params x WHERE x.key = 'method' AND ? IS NOT NULL --"
    )


def _search(demo_db, run_cli, *args):
    return run_cli(
        "--db", str(demo_db["db"]), "runs", "search", *args, "--format", "json", "--limit", "100"
    )


# -- case 7 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["filter", "columns", "order-by"])
def test_keys_never_become_sql(where, demo_db, run_cli, secret):
    key = _leak_key(secret)
    if where == "filter":
        args = [f"params.`{key}` IS NULL"]
    elif where == "columns":
        args = ["", "--columns", f"params.{key}"]
    else:
        args = ["", "--order-by", f"params.`{key}` DESC"]
    code, out, err = _search(demo_db, run_cli, *args)
    assert secret.read_text() not in out + err
    assert code in (0, 2), err
    if code == 0:
        rows = json.loads(out)
        assert rows and all("leak" not in row for row in rows)


def test_the_search_connection_cannot_read_files_or_load_extensions(demo_db, secret):
    registry = Registry(demo_db["db"])
    try:
        registry.search("params.method = 'sft'")
        con = registry._warehouse.con
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"SELECT content FROM read_text('{secret}')").fetchall()
        with pytest.raises(duckdb.Error):
            con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.Error):
            con.execute("INSTALL httpfs")
    finally:
        registry.close()


QUOTES_AND_COMMENTS = ['"', "'", "`", "--", "/*", "*/", ";", "\n", "\\", "$$", "[", "]", "\r", "#"]


@settings(max_examples=property_examples(replay=200, explore=5000), deadline=None)
@given(
    name=st.lists(
        st.one_of(st.sampled_from(QUOTES_AND_COMMENTS), st.text(max_size=3)), max_size=8
    ).map("".join)
)
def test_quote_identifier_means_exactly_the_name(name):
    name = name.replace("\0", "") or "x"
    sql = f"SELECT 1 AS {quote_identifier(name)}, 2 AS other"
    assert len(_MEMORY.extract_statements(sql)) == 1
    assert [d[0] for d in _MEMORY.execute(sql).description] == [name, "other"]


_MEMORY = duckdb.connect()


def test_quote_identifier_refuses_nul():
    with pytest.raises(ValueError):
        quote_identifier("a\0b")


# -- case 8 ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "limit_text"),
    [
        (lambda: "(" * 500 + "params.x = 1" + ")" * 500, f"limit of {MAX_DEPTH} parentheses"),
        (lambda: "not " * 1000 + "params.x = 1", f"limit of {MAX_DEPTH} parentheses and NOTs"),
        (
            lambda: " and ".join(f"params.x != '{i}'" for i in range(MAX_TERMS + 1)),
            f"limit of {MAX_TERMS:,} comparisons",
        ),
        (
            lambda: "params.x in (" + ",".join(str(i) for i in range(MAX_VALUES + 1)) + ")",
            f"limit of {MAX_VALUES:,} values in IN lists",
        ),
        (
            lambda: " or ".join(f"params.k{i} = 1" for i in range(MAX_FIELDS + 1)),
            f"limit of {MAX_FIELDS:,} distinct fields",
        ),
        (
            lambda: "params.x = '" + "y" * MAX_FILTER_CHARACTERS + "'",
            f"limit of {MAX_FILTER_CHARACTERS:,}",
        ),
    ],
    ids=["parentheses", "nots", "terms", "values", "fields", "length"],
)
def test_filters_past_a_limit_are_refused_naming_it(make, limit_text, demo_db, run_cli):
    code, _, err = _search(demo_db, run_cli, make())
    assert code == 2, err
    assert err.startswith("Error: invalid filter") and limit_text in err
    assert "see docs/search.md#filter-limits" in err


def test_the_limits_help_names_a_section_that_exists():
    page, anchor = LIMITS_HELP.removeprefix("see ").split("#")
    text = (REPO / page).read_text(encoding="utf-8")
    headings = {
        line.lstrip("#").strip().lower().replace(" ", "-")
        for line in text.splitlines()
        if line.startswith("#")
    }
    assert anchor in headings


def test_the_python_api_refuses_100000_terms_without_crashing(demo_db):
    """100,000 terms once crashed the process (SIGSEGV) in DuckDB's recursion."""
    text = " and ".join(f"params.x != {i % 10}" for i in range(100_000))
    with pytest.raises(FilterError, match="limit of 10,000 comparisons"):
        Registry(demo_db["db"]).search(text)


def _measured(db, filter_text: str, order: list[str] | None = None) -> dict:
    """The search in a process of its own: run ids found and peak memory."""
    # VmHWM, not ru_maxrss: Linux carries the parent's resident size across fork and exec
    # into ru_maxrss, and the parent here is a test run that may hold a gigabyte.
    script = (
        "import json, sys\n"
        "from audit import Registry\n"
        "args = json.load(sys.stdin)\n"
        "found = Registry(args['db']).search(args['filter'], order_by=args['order'], limit=None)\n"
        "status = open('/proc/self/status').read()\n"
        "peak_kb = int(status.split('VmHWM:')[1].split()[0])\n"
        "print(json.dumps({'runs': sorted(found['run_name'].to_list()), 'peak_mb': peak_kb / 1024}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps({"db": str(db), "filter": filter_text, "order": order or []}),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,  # a hang guard, not a speed test (bench/ measures speed)
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_10000_terms_answer_like_the_short_filter_in_bounded_memory(demo_db):
    expected = _measured(demo_db["db"], "params.learning_rate = '2e-5' and tags.team = 'coder'")
    assert expected["runs"]
    # 3,333 disjuncts of three different fields; one matches
    parts = [
        f"(params.learning_rate = '{i}e-30' and metrics.`train/loss` > {i} and not tags.team = 't{i}')"
        for i in range(3_332)
    ]
    parts.insert(
        1_700, "(params.learning_rate = 0.00002 and tags.team = 'coder' and not tags.team = 'x')"
    )
    found = _measured(demo_db["db"], " or ".join(parts))
    assert found["runs"] == expected["runs"]
    assert found["peak_mb"] < 1024
    # 10,000 and-ed inequalities of one field: every run that has the key
    everyone = _measured(demo_db["db"], "params.learning_rate is not null")
    text = " and ".join(f"params.learning_rate != '{i}e-30'" for i in range(MAX_TERMS))
    assert _measured(demo_db["db"], text)["runs"] == everyone["runs"]


def test_an_in_list_of_100000_values_answers_like_equality(demo_db):
    expected = _measured(demo_db["db"], "params.learning_rate = '2e-5'")
    values = [f"'{i}e-30'" for i in range(MAX_VALUES - 1)] + ["'0.00002'"]
    found = _measured(demo_db["db"], f"params.learning_rate in ({', '.join(values)})")
    assert found["runs"] == expected["runs"] and found["runs"]
    assert found["peak_mb"] < 1024


# -- issue 14: exit 2, not 3, and say what is wrong --------------------------------------------
def test_empty_order_by_is_a_usage_error(demo_db, run_cli):
    code, _, err = _search(demo_db, run_cli, "", "--order-by", "")
    assert code == 2
    assert "--order-by needs a field" in err


@pytest.mark.parametrize("number", ["-1e999", "1e999", "1e400"])
def test_a_number_beyond_double_range_is_an_input_error(number, demo_db, run_cli):
    code, _, err = _search(demo_db, run_cli, f"params.lr < {number}")
    assert code == 2
    assert f"number {number} is beyond the range of a double" in err


def test_a_key_no_run_has_is_named_with_the_closest_existing_one(demo_db, run_cli):
    code, out, err = run_cli(
        "--db", str(demo_db["db"]), "runs", "search", "params.learning_rte = '2e-5'"
    )
    assert code == 0
    assert out == "no runs match\n"
    assert err == (
        "hint: no run has a param 'learning_rte'; the closest existing: 'learning_rate'\n"
    )


def test_registry_missing_keys_lists_each_entity(demo_db):
    hints = Registry(demo_db["db"]).missing_keys(
        "params.lr = 1 or tags.tem = 'x' or metrics.`train/los` > 1 or params.method = 'sft'"
    )
    assert hints == [
        "no run has a param 'lr'; the closest existing: 'lora_rank' or 'learning_rate'",
        "no run has a metric 'train/los'; the closest existing: 'train/loss'",
        "no run has a tag 'tem'; the closest existing: 'team'",
    ]


def test_columns_that_are_not_fields_are_refused(demo_db):
    with pytest.raises(InputError, match=r"--columns takes params\.<key>"):
        Registry(demo_db["db"]).search("", columns=["attributes.status"])

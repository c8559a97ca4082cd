"""The run filter language: MLflow's search syntax, plus OR, NOT, parentheses and more.

Accepted unchanged from MLflow: ``params.lr = '1e-05' and metrics.acc > 0.5 and
tags.team = 'coder' and attributes.status = 'FINISHED'``, backticks or double quotes for
keys with dots or slashes, ``LIKE``/``ILIKE``/``IN``/``NOT IN``, ``IS NULL``.
Beyond it: ``OR``, parentheses, ``NOT``, ``BETWEEN``, ``IS NOT NULL``, numeric comparison on
params with numeric equivalence (``params.lr < 3e-5`` matches ``'0.00002'``), and metric
aggregates over the history (``max(metrics.x)``, ``min``, ``avg``, ``last`` = MLflow's
latest value, the default).

A filter is parsed into a tree, then compiled to a SQL condition over one row per run:
each field it names is a column (of the wide search table, or of a pivot of the long
tables that the registry joins in under a generated alias), every literal and every key
is a bound parameter, so user text never becomes SQL. Long ``IN`` lists and ``OR`` chains
of equalities on one field become one membership test against a bound list (a join, not
a tree of comparisons), and ``AND``/``OR`` chains become balanced trees, so a filter of
``MAX_TERMS`` comparisons stays shallow for DuckDB. The limits below are documented in
the README; going past one is an input error that names it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from audit.errors import InputError
from audit.importers.params import normalise_value, normalised_texts

MAX_FILTER_CHARACTERS = 2_000_000
MAX_TERMS = 10_000  # comparisons (an IN list counts once)
MAX_VALUES = 100_000  # literals in IN lists, over the whole filter
MAX_DEPTH = 100  # nesting of parentheses and NOT
MAX_FIELDS = 1_000  # distinct fields (entity, key, aggregate)
LIMITS_HELP = "see docs/search.md#filter-limits"
# an IN list this long is tested with a join against the bound list
_LIST_JOIN_AT = 16

ENTITY_ALIASES = {
    "params": "params",
    "param": "params",
    "parameter": "params",
    "parameters": "params",
    "metrics": "metrics",
    "metric": "metrics",
    "tags": "tags",
    "tag": "tags",
    "attributes": "attributes",
    "attribute": "attributes",
    "attr": "attributes",
    "run": "attributes",
    "datasets": "datasets",
    "dataset": "datasets",
}
# attribute -> SQL expression over runs r (times compare as epoch milliseconds, like MLflow)
ATTRIBUTES = {
    "run_id": "r.run_id",
    "run_uuid": "r.run_id",
    "id": "r.run_id",
    "run_name": "r.name",
    "name": "r.name",
    "status": "r.status",
    "user_id": "r.user_id",
    "user": "r.user_id",
    "experiment_id": "r.experiment_id",
    "lifecycle_stage": "r.lifecycle_stage",
    "artifact_uri": "r.artifact_uri",
    "source_commit": "r.source_commit",
    "start_time": "epoch_ms(r.start_time)",
    "end_time": "epoch_ms(r.end_time)",
    "created": "epoch_ms(r.start_time)",
    "source_id": "r.source_id",
}
NUMERIC_ATTRIBUTES = {"start_time", "end_time", "created"}
DATASET_FIELDS = ("name", "digest", "context", "source", "source_type")
AGGREGATES = {
    "max": "max",
    "min": "min",
    "avg": "avg",
    "mean": "avg",
    "last": None,
    "latest": None,
    "first": "first",
}
COMPARATORS = {"=", "==", "!=", "<>", "<", "<=", ">", ">="}

_TOKEN = re.compile(
    r"""
    \s*(?:  # whitespace goes with the token after it
    (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*")
  | (?P<backtick>`[^`]*`)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![A-Za-z_]))
  | (?P<op><=|>=|!=|<>|==|=|<|>)
  | (?P<punct>[(),.])
  | (?P<word>[A-Za-z_][A-Za-z0-9_\-/:@]*)
    )""",
    re.VERBOSE,
)
KEYWORDS = {"and", "or", "not", "in", "is", "null", "like", "ilike", "between", "true", "false"}


@dataclass(slots=True)
class Token:
    kind: str
    text: str
    position: int
    lower: str = ""


class FilterError(InputError):
    def __init__(self, text: str, position: int | None, problem: str):
        if position is None:
            super().__init__(f"invalid filter: {problem}")
            return
        near = text[position : position + 20] or "end of filter"
        super().__init__(f"invalid filter at character {position + 1} (near {near!r}): {problem}")


def tokenize(text: str) -> list[Token]:
    if len(text) > MAX_FILTER_CHARACTERS:
        raise FilterError(
            text,
            None,
            f"it is {len(text):,} characters long, more than the limit of "
            f"{MAX_FILTER_CHARACTERS:,} ({LIMITS_HELP})",
        )
    tokens, position = [], 0
    for match in _TOKEN.finditer(text):
        if match.start() != position:
            break  # a character no token starts with
        position = match.end()
        kind = match.lastgroup
        word = match.group(kind)
        tokens.append(
            Token(kind, word, match.start(kind), word.lower() if kind == "word" else word)
        )
    while position < len(text) and text[position].isspace():
        position += 1
    if position < len(text):
        raise FilterError(text, position, f"unexpected character {text[position]!r}")
    tokens.append(Token("end", "", len(text)))
    return tokens


@dataclass(frozen=True)
class Field:
    entity: str  # params | metrics | tags | attributes | datasets
    key: str
    aggregate: str | None = None

    @property
    def label(self) -> str:
        inner = f"{self.entity}.{self.key}"
        return f"{self.aggregate}({inner})" if self.aggregate else inner


# The parsed tree: ("and", [nodes]) | ("or", [nodes]) | ("not", node)
# | ("cmp", Comparison) | ("true",) | ("false",)
@dataclass
class Comparison:
    field: Field
    operator: str  # = != < <= > >= in like ilike between null notnull
    values: list = field(default_factory=list)
    token: Token | None = None  # the value token, for errors found while compiling


@dataclass
class ParsedFilter:
    text: str
    tree: tuple | None  # None: no condition
    fields: list[Field]  # distinct, in order of appearance
    normalised: dict[str, tuple[float | None, str]]


class Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.index = 0
        self.depth = 0
        self.terms = 0
        self.values = 0
        self.fields: dict[Field, None] = {}
        self.value_token: Token | None = None

    # -- token helpers -----------------------------------------------------------------------
    @property
    def current(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.current
        self.index += 1
        return token

    def error(self, problem: str, token: Token | None = None) -> FilterError:
        token = token or self.current
        return FilterError(self.text, token.position, problem)

    def accept_word(self, *words: str) -> bool:
        if self.current.kind == "word" and self.current.lower in words:
            self.advance()
            return True
        return False

    def expect_punct(self, char: str) -> None:
        if self.current.text != char:
            raise self.error(f"expected {char!r}")
        self.advance()

    # -- grammar -------------------------------------------------------------------------------
    def parse(self) -> ParsedFilter:
        tree = None
        if self.current.kind != "end":
            tree = self.parse_or()
            if self.current.kind != "end":
                raise self.error("expected AND, OR or the end of the filter")
        return ParsedFilter(self.text, tree, list(self.fields), _normalise_literals(self.tokens))

    def parse_or(self) -> tuple:
        parts = [self.parse_and()]
        while self.accept_word("or"):
            parts.append(self.parse_and())
        return parts[0] if len(parts) == 1 else ("or", parts)

    def parse_and(self) -> tuple:
        parts = [self.parse_not()]
        while self.accept_word("and"):
            parts.append(self.parse_not())
        return parts[0] if len(parts) == 1 else ("and", parts)

    def parse_not(self) -> tuple:
        token = self.current
        if (token.kind == "word" and token.lower == "not") or token.text == "(":
            # each level costs Python and DuckDB stack: the depth is checked before recursing
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.error(
                    f"nested deeper than the limit of {MAX_DEPTH} parentheses and NOTs ({LIMITS_HELP})"
                )
            self.advance()
            if token.text == "(":
                inner = self.parse_or()
                self.expect_punct(")")
            else:
                inner = ("not", self.parse_not())
            self.depth -= 1
            return inner
        return self.parse_comparison()

    def parse_field(self) -> Field:
        token = self.current
        if token.kind != "word" or token.lower in KEYWORDS:
            raise self.error(
                "expected a field like params.lr, metrics.acc, tags.team or attributes.status"
            )
        self.advance()
        if token.lower in AGGREGATES and self.current.text == "(":
            self.advance()
            inner_token = self.current
            if inner_token.kind == "word" and inner_token.lower in AGGREGATES:
                raise self.error("aggregates do not nest: write max(metrics.x)", inner_token)
            inner = self.parse_entity_field()
            self.expect_punct(")")
            if inner.entity != "metrics":
                raise self.error(f"{token.text}() applies to metrics only", token)
            return Field("metrics", inner.key, AGGREGATES[token.lower])
        self.index -= 1
        return self.parse_entity_field()

    def parse_entity_field(self) -> Field:
        token = self.current
        if token.kind != "word" or token.lower in KEYWORDS:
            raise self.error(
                "expected a field like params.lr, metrics.acc, tags.team or attributes.status"
            )
        self.advance()
        entity = ENTITY_ALIASES.get(token.lower)
        if entity is None:
            if token.lower in ATTRIBUTES:
                return Field("attributes", token.lower)
            raise self.error(
                f"unknown field {token.text!r}; use params.<key>, metrics.<key>, tags.<key>, attributes.<name> "
                "or datasets.<name|digest|context>",
                token,
            )
        if self.current.text != ".":
            raise self.error(f"expected '.' and a key after {token.text!r}")
        self.advance()
        key_token = self.advance()
        if key_token.kind == "backtick":
            key = key_token.text[1:-1]
        elif key_token.kind == "string":
            key = _unquote(key_token.text)
        elif key_token.kind in ("word", "number"):
            key = key_token.text
            # unquoted keys may contain dots: params.model.lr
            while self.current.text == "." and self.tokens[self.index + 1].kind in (
                "word",
                "number",
            ):
                self.advance()
                key += "." + self.advance().text
        else:
            raise self.error(
                "expected a key name (use backticks for keys with spaces or symbols)", key_token
            )
        if not key:
            raise self.error("empty key name", key_token)
        if entity == "attributes" and key.lower() not in ATTRIBUTES:
            raise self.error(
                f"unknown attribute {key!r}; valid: {', '.join(sorted(ATTRIBUTES))}", key_token
            )
        if entity == "datasets" and key.lower() not in DATASET_FIELDS:
            raise self.error(
                f"unknown dataset field {key!r}; valid: {', '.join(sorted(DATASET_FIELDS))}",
                key_token,
            )
        return Field(entity, key.lower() if entity in ("attributes", "datasets") else key)

    def parse_value(self):
        token = self.advance()
        self.value_token = token
        if token.kind == "string":
            return _unquote(token.text)
        if token.kind == "number":
            number = float(token.text)
            if not math.isfinite(number):
                raise self.error(
                    f"number {token.text} is beyond the range of a double (±1.8e308)", token
                )
            return number
        if token.kind == "word" and token.lower in ("true", "false"):
            return token.lower
        raise self.error("expected a value: 'text' or a number", token)

    def parse_comparison(self) -> tuple:
        start = self.current
        target = self.parse_field()
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise self.error(
                f"more than the limit of {MAX_TERMS:,} comparisons ({LIMITS_HELP}); "
                "a long OR of values of one field is shorter as an IN list",
                start,
            )
        if target not in self.fields:
            if len(self.fields) >= MAX_FIELDS:
                raise self.error(
                    f"more than the limit of {MAX_FIELDS:,} distinct fields ({LIMITS_HELP})", start
                )
            self.fields[target] = None
        negate = self.accept_word("not")
        token = self.current
        if self.accept_word("is"):
            if negate:
                raise self.error("write IS NOT NULL", token)
            negate_null = self.accept_word("not")
            if not self.accept_word("null"):
                raise self.error("expected NULL after IS")
            return ("cmp", Comparison(target, "notnull" if negate_null else "null"))
        if self.accept_word("in"):
            self.expect_punct("(")
            values = [self.parse_value()]
            first = self.value_token
            while self.current.text == ",":
                self.advance()
                values.append(self.parse_value())
                if len(values) + self.values > MAX_VALUES:
                    raise self.error(
                        f"more than the limit of {MAX_VALUES:,} values in IN lists ({LIMITS_HELP})"
                    )
            self.values += len(values)
            self.expect_punct(")")
            node = ("cmp", Comparison(target, "in", values, first))
            return ("not", node) if negate else node
        if self.accept_word("between"):
            low = self.parse_value()
            low_token = self.value_token
            if not self.accept_word("and"):
                raise self.error("expected AND in BETWEEN ... AND ...")
            high = self.parse_value()
            node = ("cmp", Comparison(target, "between", [low, high], low_token))
            return ("not", node) if negate else node
        if token.kind == "word" and token.lower in ("like", "ilike"):
            self.advance()
            pattern = self.parse_value()
            if not isinstance(pattern, str):
                raise self.error("LIKE needs a quoted pattern", token)
            node = ("cmp", Comparison(target, token.lower, [pattern], self.value_token))
            return ("not", node) if negate else node
        if negate:
            raise self.error("NOT here must be followed by IN, BETWEEN, LIKE or ILIKE", token)
        if token.kind != "op" or token.text not in COMPARATORS:
            raise self.error(
                "expected a comparison (=, !=, <, <=, >, >=, IN, BETWEEN, LIKE, ILIKE, IS NULL)"
            )
        self.advance()
        operator = {"==": "=", "<>": "!="}.get(token.text, token.text)
        value = self.parse_value()
        return ("cmp", Comparison(target, operator, [value], self.value_token))


def parse_filter(text: str) -> ParsedFilter:
    return Parser(text or "").parse()


@dataclass
class Columns:
    """SQL expressions (generated, never user text) for one field of run ``r``."""

    text: str | None = None  # the value as text
    num: str | None = None  # as a number (NULL when not one)
    norm: str | None = None  # params: the normalised text
    present: str = "FALSE"  # the run has the field (NaN metrics do not count)
    is_list: bool = False  # datasets: a list per run


def attribute_columns(key: str) -> Columns:
    column = ATTRIBUTES[key]
    return Columns(
        text=column,
        num=column if key in NUMERIC_ATTRIBUTES else None,
        norm=column,
        present=f"{column} IS NOT NULL",
    )


@dataclass
class Compiled:
    sql: str
    params: list = field(default_factory=list)


@dataclass(frozen=True)
class Leaf:
    """What one comparison tests, decided once for both evaluators (SQL and bulk).

    kind: const (``value``), present, eq (``column`` = ``value``), in (``column`` in
    ``value``: a list), cmp (``column`` ``operator`` ``value``), between (``value``: low
    and high leaves), like (``operator`` like|ilike, ``value`` the pattern, on the text).
    ``negate`` inverts the test (never the presence); ``on_list``: datasets, where some
    item of the run's list must pass the test.
    """

    kind: str
    column: str = "text"  # text | num | norm
    operator: str = "="
    value: object = None
    negate: bool = False
    on_list: bool = False


class LeafPlanner:
    """Turns comparisons into :class:`Leaf` tests: type checks, numeric equivalence,
    which column a literal is compared with."""

    def __init__(self, parsed: ParsedFilter, columns: dict[Field, Columns | None]):
        self.parsed = parsed
        self.columns = columns

    def error(self, comparison: Comparison, problem: str) -> FilterError:
        position = comparison.token.position if comparison.token else None
        return FilterError(self.parsed.text, position, problem)

    def normalise(self, value) -> tuple[float | None, str]:
        text = repr(value) if isinstance(value, float) else str(value)
        return self.parsed.normalised.get(text) or normalise_value(text)

    def leaf(self, c: Comparison) -> Leaf:
        self._check_types(c)
        cols = self.columns.get(c.field)
        if cols is None:  # no run has this key: nothing compares, nothing is present
            return Leaf("const", value=c.operator == "null")
        if c.operator in ("null", "notnull"):
            return Leaf("present", negate=c.operator == "null")
        on_list = cols.is_list
        if c.operator in ("like", "ilike"):
            return Leaf("like", operator=c.operator, value=c.values[0], on_list=on_list)
        if c.operator == "in":
            pairs = [self.comparable(c, cols, v) for v in c.values]
            values = list(dict.fromkeys(bound for _, bound in pairs))
            return Leaf("in", column=pairs[0][0], value=values, on_list=on_list)
        if c.operator == "between":
            low, high = c.values
            return Leaf(
                "between",
                value=(self.ordered(c, cols, ">=", low), self.ordered(c, cols, "<=", high)),
                on_list=on_list,
            )
        if c.operator in ("=", "!="):
            column, bound = self.comparable(c, cols, c.values[0])
            # MLflow: runs without the key do not match `!=` either
            return Leaf(
                "eq", column=column, value=bound, negate=c.operator == "!=", on_list=on_list
            )
        return self.ordered(c, cols, c.operator, c.values[0])

    def _check_types(self, c: Comparison) -> None:
        """Type errors are the user's whether or not a run has the field."""
        target = c.field
        numeric = target.entity == "metrics" or (
            target.entity == "attributes" and target.key in NUMERIC_ATTRIBUTES
        )
        if not numeric or c.operator in ("null", "notnull", "like", "ilike"):
            return
        for value in c.values:
            if self.normalise(value)[0] is None:
                if target.entity == "metrics" and c.operator in ("=", "!=", "in"):
                    raise self.error(c, f"metrics compare with numbers, got {value!r}")
                if target.entity == "attributes" and c.operator in ("=", "!=", "in"):
                    raise self.error(
                        c,
                        f"attributes.{target.key} compares with epoch milliseconds, got {value!r}",
                    )
                raise self.error(c, f"{target.label} compares with numbers, got {value!r}")

    def comparable(self, c: Comparison, cols: Columns, value) -> tuple[str, object]:
        """The column and bound value an equality of ``value`` compares."""
        number, canonical = self.normalise(value)
        if c.field.entity == "metrics" or (
            c.field.entity == "attributes" and c.field.key in NUMERIC_ATTRIBUTES
        ):
            return "num", number
        if c.field.entity == "params":
            # numeric (and boolean) equivalence: '1e-05' = '0.00001', 'True' = 'true'
            return "norm", canonical
        return "text", value if isinstance(value, str) else _number_text(value)

    def ordered(self, c: Comparison, cols: Columns, operator: str, value) -> Leaf:
        number, _ = self.normalise(value)
        if number is not None and cols.num is not None:
            return Leaf("cmp", column="num", operator=operator, value=number)
        text = value if isinstance(value, str) else _number_text(value)
        return Leaf("cmp", column="text", operator=operator, value=text, on_list=cols.is_list)


def count_leaves(tree: tuple | None) -> int:
    """Comparisons in the tree once OR-ed equalities of a field are merged into one."""
    if tree is None:
        return 0
    count, stack = 0, [tree]
    while stack:
        node = stack.pop()
        if node[0] == "cmp":
            count += 1
        elif node[0] == "not":
            stack.append(node[1])
        else:
            stack.extend(merge_equalities(node[1]) if node[0] == "or" else node[1])
    return count


def compile_where(parsed: ParsedFilter, columns: dict[Field, Columns | None]) -> Compiled:
    """The SQL condition of ``parsed`` for a WHERE clause: a run matches when it is TRUE
    (NULL, like FALSE, does not match). ``columns[f]`` is None for a field no run has."""
    if parsed.tree is None:
        return Compiled("TRUE", [])
    compiler = _Compiler(parsed, columns)
    return Compiled(compiler.node(parsed.tree, positive=True), compiler.params)


def compile_filter(text: str, columns: dict[Field, Columns | None] | None = None) -> Compiled:
    """Parse and compile ``text``; without ``columns`` every field counts as absent (a check
    of the filter's syntax and types that needs no warehouse)."""
    return compile_where(parse_filter(text), columns or {})


class _Compiler:
    """The filter as one SQL condition (small filters: DuckDB plans each comparison).

    A comparison on a run without the field is NULL in SQL and false in the filter
    language. Under a NOT the difference matters (NOT NULL is NULL), so there each
    comparison is wrapped in ``coalesce(..., false)``. Outside every NOT ("positive", only
    AND and OR above it) it does not: AND and OR are TRUE with a NULL operand exactly when
    they are TRUE with FALSE in its place, and WHERE keeps only TRUE. There the comparison
    stays bare, so DuckDB can push it into the table scan and read the other columns only
    for the rows that pass (the wide search table at 100,000 runs: 14-18 ms per search
    with every comparison wrapped, 4-13 ms bare).
    """

    def __init__(self, parsed: ParsedFilter, columns: dict[Field, Columns | None]):
        self.planner = LeafPlanner(parsed, columns)
        self.columns = columns
        self.params: list = []

    def node(self, tree: tuple, positive: bool) -> str:
        """``tree`` as SQL; ``positive``: no NOT above it (see the class)."""
        kind = tree[0]
        if kind == "not":
            return f"(NOT {self.node(tree[1], positive=False)})"
        if kind == "cmp":
            return self.comparison(tree[1], positive)
        children = tree[1]
        if kind == "or":
            children = merge_equalities(children)
        return _balanced([self.node(c, positive) for c in children], kind.upper())

    def bind(self, value) -> str:
        self.params.append(value)
        return "?"

    def comparison(self, c: Comparison, positive: bool) -> str:
        leaf = self.planner.leaf(c)
        if leaf.kind == "const":
            return "TRUE" if leaf.value else "FALSE"
        cols = self.columns[c.field]
        if leaf.kind == "present":
            present = f"coalesce({cols.present}, false)"
            return f"(NOT {present})" if leaf.negate else present
        if leaf.on_list:
            return self._on_list(leaf, cols)
        condition = f"{cols.present} AND {self.test(leaf, cols)}"
        return f"({condition})" if positive else f"coalesce({condition}, false)"

    def column(self, leaf: Leaf, cols: Columns) -> str:
        return {"text": cols.text, "num": cols.num, "norm": cols.norm}[leaf.column]

    def test(self, leaf: Leaf, cols: Columns, item: str | None = None) -> str:
        column = item or self.column(leaf, cols)
        if leaf.kind == "between":
            low, high = leaf.value
            return f"({self.test(low, cols, item)} AND {self.test(high, cols, item)})"
        if leaf.kind == "like":
            text = item or f"CAST({cols.text} AS VARCHAR)"
            return f"{text} {leaf.operator.upper()} {self.bind(leaf.value)}"
        if leaf.kind == "in":
            values = leaf.value
            if len(values) < _LIST_JOIN_AT:
                return f"{column} IN ({', '.join(self.bind(v) for v in values)})"
            kind = "DOUBLE" if isinstance(values[0], float) else "VARCHAR"
            return f"{column} IN (SELECT unnest({self.bind(values)}::{kind}[]))"
        if leaf.kind == "eq":
            test = f"{column} = {self.bind(leaf.value)}"
            return f"NOT {test}" if leaf.negate else test
        return f"{column} {leaf.operator} {self.bind(leaf.value)}"

    def _on_list(self, leaf: Leaf, cols: Columns) -> str:
        """datasets.<field>: some dataset of the run passes the test."""
        if leaf.kind == "in":
            return f"coalesce(list_has_any({cols.text}, {self.bind(leaf.value)}::VARCHAR[]), false)"
        item = "audit_item"
        condition = self.test(leaf, cols, item)
        return f"coalesce(len(list_filter({cols.text}, lambda {item}: {condition})) > 0, false)"


def merge_equalities(children: list[tuple]) -> list[tuple]:
    """``f = a or f = b or f IN (c, d)`` -> ``f IN (a, b, c, d)``: one membership test."""
    groups: dict[Field, list] = {}
    merged: list = []
    for child in children:
        if child[0] == "cmp" and child[1].operator in ("=", "in"):
            comparison = child[1]
            if comparison.field not in groups:
                groups[comparison.field] = []
                merged.append(comparison.field)
            groups[comparison.field].append(comparison)
        else:
            merged.append(child)
    out = []
    for item in merged:
        if not isinstance(item, Field):
            out.append(item)
            continue
        comparisons = groups[item]
        if len(comparisons) == 1:
            out.append(("cmp", comparisons[0]))
        else:
            values = [v for c in comparisons for v in c.values]
            out.append(("cmp", Comparison(item, "in", values, comparisons[0].token)))
    return out


def _balanced(parts: list[str], operator: str) -> str:
    """``a OP b OP c ...`` as a balanced tree: depth log2(n), not n."""
    while len(parts) > 1:
        parts = [
            f"({parts[i]} {operator} {parts[i + 1]})" if i + 1 < len(parts) else parts[i]
            for i in range(0, len(parts), 2)
        ]
    return parts[0]


def _normalise_literals(tokens: list[Token]) -> dict[str, tuple[float | None, str]]:
    """Every literal of the filter normalised in one call (one polars call per literal is slow)."""
    texts = []
    for token in tokens:
        if token.kind == "string":
            texts.append(_unquote(token.text))
        elif token.kind == "number":
            texts.append(repr(float(token.text)))
    return normalised_texts(texts)


def _unquote(text: str) -> str:
    body = text[1:-1]
    if text[0] == "'":
        body = body.replace("''", "'")
    return _ESCAPE.sub(r"\1", body) if "\\" in body else body


_ESCAPE = re.compile(r"\\(.)")


def _number_text(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


MAX_ORDER_EXPRESSIONS = 16


def parse_order(expressions: list[str]) -> list[tuple[Field, str]]:
    """``metrics.acc DESC``, ``params.lr``, ``attributes.start_time`` -> (field, direction)."""
    if len(expressions) > MAX_ORDER_EXPRESSIONS:
        raise InputError(
            f"--order-by given {len(expressions)} times; the limit is {MAX_ORDER_EXPRESSIONS}"
        )
    out = []
    for expression in expressions:
        if not isinstance(expression, str) or not expression.strip():
            raise InputError(
                "--order-by needs a field, e.g. 'metrics.acc DESC' or 'params.lr' (got an empty one)"
            )
        words = expression.strip().rsplit(None, 1)
        direction = "ASC"
        if len(words) == 2 and words[1].lower() in ("asc", "desc"):
            expression, direction = words[0], words[1].upper()
        parser = Parser(expression)
        target = parser.parse_field()
        if parser.current.kind != "end":
            raise parser.error("expected ASC or DESC after the field")
        if target.entity == "datasets" or target.aggregate is not None:
            raise parser.error("order by params, metrics, tags or attributes", parser.tokens[0])
        out.append((target, direction))
    return out

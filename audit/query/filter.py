"""The run filter language: MLflow's search syntax, plus OR, NOT, parentheses and more.

Accepted unchanged from MLflow: ``params.lr = '1e-05' and metrics.acc > 0.5 and
tags.team = 'coder' and attributes.status = 'FINISHED'``, backticks or double quotes for
keys with dots or slashes, ``LIKE``/``ILIKE``/``IN``/``NOT IN``, ``IS NULL``.
Beyond it: ``OR``, parentheses, ``NOT``, ``BETWEEN``, ``IS NOT NULL``, numeric comparison on
params with numeric equivalence (``params.lr < 3e-5`` matches ``'0.00002'``), and metric
aggregates over the history (``max(metrics.x)``, ``min``, ``avg``, ``last`` = MLflow's
latest value, the default).

A filter compiles to a SQL condition over the ``runs`` table aliased ``r`` with every
literal a bound parameter: user text never becomes SQL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import polars as pl

from audit.errors import InputError
from audit.importers.params import normalise_value, normalised_params

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
DATASET_FIELDS = {
    "name": "d.name",
    "digest": "d.digest",
    "context": "d.context",
    "source": "d.source",
    "source_type": "d.source_type",
}
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
    (?P<ws>\s+)
  | (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*")
  | (?P<backtick>`[^`]*`)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![A-Za-z_]))
  | (?P<op><=|>=|!=|<>|==|=|<|>)
  | (?P<punct>[(),.])
  | (?P<word>[A-Za-z_][A-Za-z0-9_\-/:@]*)
    """,
    re.VERBOSE,
)
KEYWORDS = {"and", "or", "not", "in", "is", "null", "like", "ilike", "between", "true", "false"}


@dataclass
class Token:
    kind: str
    text: str
    position: int

    @property
    def lower(self) -> str:
        return self.text.lower()


def tokenize(text: str) -> list[Token]:
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if not match:
            raise FilterError(text, position, f"unexpected character {text[position]!r}")
        kind = match.lastgroup
        if kind != "ws":
            tokens.append(Token(kind, match.group(), position))
        position = match.end()
    tokens.append(Token("end", "", len(text)))
    return tokens


class FilterError(InputError):
    def __init__(self, text: str, position: int, problem: str):
        near = text[position : position + 20] or "end of filter"
        super().__init__(f"invalid filter at character {position + 1} (near {near!r}): {problem}")


@dataclass
class Compiled:
    sql: str
    params: list = field(default_factory=list)
    keys: list[tuple[str, str]] = field(default_factory=list)  # (entity, key) referenced


@dataclass
class Field:
    entity: str  # params | metrics | tags | attributes | datasets
    key: str
    aggregate: str | None = None

    @property
    def label(self) -> str:
        inner = f"{self.entity}.{self.key}"
        return f"{self.aggregate}({inner})" if self.aggregate else inner


class Parser:
    def __init__(self, text: str, wide: dict[str, set[str]] | None = None):
        # keys with columns in the wide search table, per entity (empty: use the long tables)
        self.wide = wide or {}
        self.text = text
        self.tokens = tokenize(text)
        self.normalised = _normalise_literals(self.tokens)
        self.index = 0
        self.params: list = []
        self.keys: list[tuple[str, str]] = []
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
    def parse(self) -> Compiled:
        if self.current.kind == "end":
            return Compiled("TRUE")
        sql = self.parse_or()
        if self.current.kind != "end":
            raise self.error("expected AND, OR or the end of the filter")
        return Compiled(sql, self.params, self.keys)

    def parse_or(self) -> str:
        parts = [self.parse_and()]
        while self.accept_word("or"):
            parts.append(self.parse_and())
        return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"

    def parse_and(self) -> str:
        parts = [self.parse_not()]
        while self.accept_word("and"):
            parts.append(self.parse_not())
        return parts[0] if len(parts) == 1 else "(" + " AND ".join(parts) + ")"

    def parse_not(self) -> str:
        if self.accept_word("not"):
            return f"(NOT {self.parse_not()})"
        if self.current.text == "(":
            self.advance()
            inner = self.parse_or()
            self.expect_punct(")")
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
            inner = self.parse_field()
            self.expect_punct(")")
            if inner.entity != "metrics":
                raise self.error(f"{token.text}() applies to metrics only", token)
            return Field("metrics", inner.key, AGGREGATES[token.lower])
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
            return float(token.text)
        if token.kind == "word" and token.lower in ("true", "false"):
            return token.lower
        raise self.error("expected a value: 'text' or a number", token)

    def parse_comparison(self) -> str:
        target = self.parse_field()
        self.keys.append((target.entity, target.key))
        negate = self.accept_word("not")
        token = self.current
        if self.accept_word("is"):
            if negate:
                raise self.error("write IS NOT NULL", token)
            negate_null = self.accept_word("not")
            if not self.accept_word("null"):
                raise self.error("expected NULL after IS")
            return self.null_check(target, not negate_null)
        if self.accept_word("in"):
            self.expect_punct("(")
            values = [self.parse_value()]
            while self.current.text == ",":
                self.advance()
                values.append(self.parse_value())
            self.expect_punct(")")
            sql = self.condition(
                target,
                lambda col: "(" + " OR ".join(self.equality(col, target, v) for v in values) + ")",
            )
            return f"(NOT {sql})" if negate else sql
        if self.accept_word("between"):
            low = self.parse_value()
            if not self.accept_word("and"):
                raise self.error("expected AND in BETWEEN ... AND ...")
            high = self.parse_value()
            sql = self.condition(
                target,
                lambda col: (
                    f"({self.ordered(col, target, '>=', low)} AND {self.ordered(col, target, '<=', high)})"
                ),
            )
            return f"(NOT {sql})" if negate else sql
        if token.kind == "word" and token.lower in ("like", "ilike"):
            self.advance()
            pattern = self.parse_value()
            if not isinstance(pattern, str):
                raise self.error("LIKE needs a quoted pattern", token)
            operator = "ILIKE" if token.lower == "ilike" else "LIKE"
            sql = self.condition(
                target,
                lambda col: self.bind(f"CAST({col['text']} AS VARCHAR) {operator} ?", pattern),
            )
            return f"(NOT {sql})" if negate else sql
        if negate:
            raise self.error("NOT here must be followed by IN, BETWEEN, LIKE or ILIKE", token)
        if token.kind != "op" or token.text not in COMPARATORS:
            raise self.error(
                "expected a comparison (=, !=, <, <=, >, >=, IN, BETWEEN, LIKE, ILIKE, IS NULL)"
            )
        self.advance()
        operator = {"==": "=", "<>": "!="}.get(token.text, token.text)
        value = self.parse_value()
        if operator == "=":
            return self.condition(target, lambda col: self.equality(col, target, value))
        if operator == "!=":
            # MLflow: runs without the key do not match `!=` either
            return self.condition(target, lambda col: f"NOT {self.equality(col, target, value)}")
        return self.condition(target, lambda col: self.ordered(col, target, operator, value))

    # -- SQL pieces ------------------------------------------------------------------------------
    def bind(self, sql: str, *values) -> str:
        self.params.extend(values)
        return sql

    def condition(self, target: Field, build) -> str:
        """Wrap a value condition in the lookup of the field for run r."""
        if target.entity == "attributes":
            column = ATTRIBUTES[target.key]
            return build(
                {
                    "text": column,
                    "num": column if target.key in NUMERIC_ATTRIBUTES else None,
                    "norm": column,
                }
            )
        if target.entity == "datasets":
            column = DATASET_FIELDS[target.key]
            inner = build({"text": column, "num": None, "norm": column})
            return f"EXISTS (SELECT 1 FROM dataset_inputs d WHERE d.source_id = r.source_id AND d.run_id = r.run_id AND {inner})"
        wide = self._wide_condition(target, build)
        if wide is not None:
            return wide
        mark = len(self.params)
        if target.entity == "params":
            inner = build({"text": "p.value", "num": "p.value_num", "norm": "p.value_norm"})
            sql = "EXISTS (SELECT 1 FROM params p WHERE p.source_id = r.source_id AND p.run_id = r.run_id AND p.key = ? AND {})"
        elif target.entity == "tags":
            inner = build(
                {"text": "t.value", "num": "TRY_CAST(t.value AS DOUBLE)", "norm": "t.value"}
            )
            sql = "EXISTS (SELECT 1 FROM tags t WHERE t.source_id = r.source_id AND t.run_id = r.run_id AND t.key = ? AND {})"
        elif target.aggregate is None:
            inner = build({"text": "m.value", "num": "m.value", "norm": "m.value"})
            # NaN never matches a comparison (DuckDB would order it above every number)
            sql = (
                "EXISTS (SELECT 1 FROM latest_metrics m WHERE m.source_id = r.source_id AND m.run_id = r.run_id "
                "AND m.key = ? AND NOT isnan(m.value) AND {})"
            )
        else:
            inner = build({"text": "a.v", "num": "a.v", "norm": "a.v"})
            sql = (
                "EXISTS (SELECT 1 FROM (SELECT "
                + target.aggregate
                + "(m.value ORDER BY m.step, m.ts) AS v "
                "FROM metrics m WHERE m.source_id = r.source_id AND m.run_id = r.run_id AND m.key = ? "
                "AND NOT isnan(m.value)) a WHERE a.v IS NOT NULL AND {})"
            )
        # the key's parameter comes first in the SQL text, before the value condition's
        inner_params = self.params[mark:]
        del self.params[mark:]
        self.params.extend([target.key, *inner_params])
        return sql.format(inner)

    def _wide_condition(self, target: Field, build) -> str | None:
        """The condition on a column of the wide search table, when the key has one.

        coalesce(..., false) gives a missing key the same meaning as a failed EXISTS.
        """
        from audit.importers.search_index import column

        if target.aggregate is not None or target.key not in self.wide.get(target.entity, set()):
            return None
        name = f"{target.entity}.{target.key}"
        if target.entity == "params":
            cols = {
                "text": "r." + column(name, "#raw"),
                "num": "r." + column(name, "#num"),
                "norm": "r." + column(name, "#norm"),
            }
            return f"({cols['text']} IS NOT NULL AND coalesce({build(cols)}, false))"
        ref = "r." + column(name)
        if target.entity == "tags":
            cols = {"text": ref, "num": f"TRY_CAST({ref} AS DOUBLE)", "norm": ref}
            return f"({ref} IS NOT NULL AND coalesce({build(cols)}, false))"
        return (
            f"coalesce(NOT isnan({ref}) AND {build({'text': ref, 'num': ref, 'norm': ref})}, false)"
        )

    def normalise(self, value) -> tuple[float | None, str]:
        text = repr(value) if isinstance(value, float) else str(value)
        return self.normalised.get(text) or normalise_value(text)

    def equality(self, col: dict, target: Field, value) -> str:
        number, canonical = self.normalise(value)
        if target.entity == "metrics":
            if number is None:
                raise self.error(f"metrics compare with numbers, got {value!r}", self.value_token)
            return self.bind(f"{col['num']} = ?", number)
        if target.entity == "params":
            # numeric (and boolean) equivalence: '1e-05' = '0.00001', 'True' = 'true'
            return self.bind(f"{col['norm']} = ?", canonical)
        if target.entity == "attributes" and target.key in NUMERIC_ATTRIBUTES:
            if number is None:
                raise self.error(
                    f"attributes.{target.key} compares with epoch milliseconds, got {value!r}",
                    self.value_token,
                )
            return self.bind(f"{col['num']} = ?", number)
        return self.bind(
            f"{col['text']} = ?", value if isinstance(value, str) else _number_text(value)
        )

    def ordered(self, col: dict, target: Field, operator: str, value) -> str:
        number, _ = self.normalise(value)
        if number is not None and col["num"] is not None:
            return self.bind(f"{col['num']} {operator} ?", number)
        if target.entity in ("metrics",) or (
            target.entity == "attributes" and target.key in NUMERIC_ATTRIBUTES
        ):
            raise self.error(
                f"{target.label} compares with numbers, got {value!r}", self.value_token
            )
        return self.bind(
            f"{col['text']} {operator} ?", value if isinstance(value, str) else _number_text(value)
        )

    def null_check(self, target: Field, is_null: bool) -> str:
        if target.entity == "attributes":
            return f"({ATTRIBUTES[target.key]} IS {'' if is_null else 'NOT '}NULL)"
        present = self.condition(target, lambda col: "TRUE")
        return f"(NOT {present})" if is_null else present


def _normalise_literals(tokens: list[Token]) -> dict[str, tuple[float | None, str]]:
    """Every literal of the filter normalised in one polars call (one call per literal is slow)."""
    texts = []
    for token in tokens:
        if token.kind == "string":
            texts.append(_unquote(token.text))
        elif token.kind == "number":
            texts.append(repr(float(token.text)))
    if not texts:
        return {}
    frame = normalised_params(pl.DataFrame({"value": texts}, schema={"value": pl.String}))
    return {
        row[0]: (row[1], row[2])
        for row in frame.select("value", "value_num", "value_norm").iter_rows()
    }


def _unquote(text: str) -> str:
    body = text[1:-1]
    if text[0] == "'":
        body = body.replace("''", "'")
    return re.sub(r"\\(.)", r"\1", body)


def _number_text(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def compile_filter(text: str, wide: dict[str, set[str]] | None = None) -> Compiled:
    return Parser(text or "", wide).parse()


ORDER = re.compile(r"^\s*(.+?)\s*(?:\s(asc|desc))?\s*$", re.IGNORECASE)


def compile_order(expressions: list[str]) -> tuple[str, list]:
    """``metrics.acc DESC``, ``params.lr``, ``attributes.start_time`` -> ORDER BY (numeric-aware)."""
    parts, params = [], []
    for expression in expressions:
        match = ORDER.match(expression)
        direction = (match.group(2) or "asc").upper()
        parser = Parser(match.group(1))
        target = parser.parse_field()
        if parser.current.kind != "end":
            raise parser.error("expected ASC or DESC after the field")
        if target.entity == "attributes":
            parts.append(f"{ATTRIBUTES[target.key]} {direction} NULLS LAST")
            continue
        if target.entity == "params":
            table, num, text = "params", "value_num", "value"
        elif target.entity == "tags":
            table, num, text = "tags", "TRY_CAST(value AS DOUBLE)", "value"
        elif target.entity == "metrics":
            table, num, text = "latest_metrics", "value", "CAST(value AS VARCHAR)"
        else:
            raise parser.error("order by params, metrics, tags or attributes")
        lookup = (
            f"FROM {table} x WHERE x.source_id = r.source_id AND x.run_id = r.run_id AND x.key = ?"
        )
        parts.append(f"(SELECT {num} {lookup}) {direction} NULLS LAST")
        parts.append(f"(SELECT {text} {lookup}) {direction} NULLS LAST")
        params += [target.key, target.key]
    return ", ".join(parts), params

"""What never reaches the warehouse: e-mail addresses and credentials, one policy for every
tracker.

Run names, users, params, tags, metric keys, command lines and a W&B run's kept state are
text other people wrote, and configs and command lines carry secrets: ``--hf_token=hf_…``,
``WANDB_API_KEY=…`` in a launcher's arguments, ``https://user:pass@host`` in a dataset URL,
an address as the MLflow user. The importers hand every such text to this module before it
is stored, and the warehouse migration that scrubs older warehouses uses the same patterns.

Replaced:

- e-mail addresses, by ``<e-mail removed>`` (a user id that is one address keeps its local
  part, ``alice@corp.com`` -> ``alice``, so attribution by user still tells people apart);
- the user information of a URL (``scheme://user:password@``);
- the value of an argument or assignment whose name is a credential's (``--hf_token=…``,
  ``--api-key …``, ``DB_PASSWORD=…``, ``client_secret: …``): names holding ``password``,
  ``passwd``, ``secret`` or ``credential``, or ending in ``token``/``key`` after a
  credential's prefix (``hf_``, ``api_``, ``access_``, ``WANDB_API_``, ...) — not
  ``max_new_tokens`` or ``pad_token``, which are training settings;
- a param or tag whose key is such a name: its whole value;
- known token shapes wherever they stand: Hugging Face ``hf_…``, OpenAI ``sk-…``, GitHub
  ``ghp_…``/``github_pat_…``, GitLab ``glpat-…``, AWS ``AKIA…``, Slack ``xox?-…``,
  ``Bearer …``.

The patterns are RE2/Rust regular expressions (no look-around, no back-references), run by
polars here and by DuckDB in the migration: both engines take time linear in the text, so a
50 MB prompt in a config costs a fraction of a second, never minutes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import polars as pl

EMAIL_MARK = "<e-mail removed>"
SECRET_MARK = "<redacted>"

_EMAIL = r"[\w.%+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}"
_WHOLE_EMAIL = r"^\s*([\w.%+-]+)@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}\s*$"  # a user id
# A credential's name: a password or secret anywhere in it, or a token/key after a prefix
# that says whose (api_key, hf_token, WANDB_API_KEY); the bare words only after dashes.
_PREFIXES = (
    "api|access|auth|bearer|client|github|gh|gitlab|hf|hub|huggingface|hugging_face|oauth|"
    "openai|anthropic|private|refresh|session|slack|wandb|aws|ssh|secret|signing|encryption|"
    "license|deploy|personal_access"
)
_COMPOUND_NAME = (
    r"[\w.-]*(?:passw(?:or)?d|secret|credential)[\w.-]*"
    rf"|(?:[\w.-]*[._-])?(?:{_PREFIXES})[_-]?(?:token|key)"
    r"|apikey|access_?token"
)
_VALUE = r"""[^\s"'\\,;&|]+"""
_START = r"(^|[^\w.-])"  # group 1: what precedes the name (no look-behind in RE2/Rust)
# (pattern, groups kept before the mark): every pattern ends with what is replaced
_SECRET_PATTERNS: tuple[tuple[str, int], ...] = (
    # scheme://user:password@ -> scheme://<redacted>@ (the @ is group 2, kept after)
    (r"([A-Za-z][A-Za-z0-9+.-]*://)[^\s/@\"'\\]+(@)", -1),
    # --hf_token=…, DB_PASSWORD=…, "client_secret": "…", --token=…
    (rf"""(?i){_START}(--?(?:{_COMPOUND_NAME}|token|key)\s*[=:]\s*["']?){_VALUE}""", 2),
    (rf"""(?i){_START}((?:{_COMPOUND_NAME})["']?\s*[=:]\s*["']?){_VALUE}""", 2),
    # --hf_token hf_…, --password hunter2 (a separate argument; not the next flag), also
    # as the next item of a JSON list of arguments ("--password", "hunter2")
    (
        rf"""(?i){_START}(--?(?:{_COMPOUND_NAME}|token|key)(?:\s+|["']\s*,\s*["']))"""
        r"""[^\s"'\\,;&|-][^\s"'\\,;&|]*""",
        2,
    ),
    (r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{12,}", 1),
    (r"\bhf_[A-Za-z0-9]{30,}", 0),
    (r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}", 0),
    (r"\bgh[pousr]_[A-Za-z0-9]{30,}", 0),
    (r"\bgithub_pat_[A-Za-z0-9_]{30,}", 0),
    (r"\bglpat-[A-Za-z0-9_-]{20,}", 0),
    (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", 0),
    (r"\bxox[abeoprs]-[A-Za-z0-9-]{10,}", 0),
)
# A param or tag whose key is a credential's name has its whole value replaced.
_CREDENTIAL_KEY = rf"(?i)^(?:--?)?(?:{_COMPOUND_NAME}|token)$"
# Anything any pattern could match contains one of these: texts without them (most param
# values: numbers, paths, words) are not searched further.
_ANY = r"(?i)@|://|passw|secret|credential|token|key|bearer|hf_|sk-|gh[pousr]_|github_pat|glpat|akia|asia|xox"


def _rust_replacement(kept: int, mark: str) -> str:
    if kept < 0:  # the user information of a URL: between groups 1 and 2
        return "${1}" + mark + "${2}"
    return "".join(f"${{{i}}}" for i in range(1, kept + 1)) + mark


def _re2_replacement(kept: int, mark: str) -> str:
    if kept < 0:
        return "\\1" + mark + "\\2"
    return "".join(f"\\{i}" for i in range(1, kept + 1)) + mark


def redacted(text: pl.Expr) -> pl.Expr:
    """``text`` with e-mail addresses and credentials replaced (a polars expression)."""
    out = text
    for pattern, kept in _SECRET_PATTERNS:
        out = out.str.replace_all(pattern, _rust_replacement(kept, SECRET_MARK))
    return out.str.replace_all(_EMAIL, EMAIL_MARK)


def redacted_user(text: pl.Expr) -> pl.Expr:
    """A user id: one e-mail address keeps its local part (``alice@corp.com`` -> ``alice``);
    anything else as ``redacted``."""
    return (
        pl.when(text.str.contains(_WHOLE_EMAIL))
        .then(text.str.replace(_WHOLE_EMAIL, "${1}"))
        .otherwise(redacted(text))
    )


def redact_frame(
    frame: pl.DataFrame,
    columns: Iterable[str],
    users: Iterable[str] = (),
    keyed: tuple[str, str] | None = None,
) -> pl.DataFrame:
    """The frame with ``columns`` redacted (``users`` as user ids). ``keyed`` = (key column,
    value column): a value whose key is a credential's name is replaced whole.

    Only rows that may hold something are rewritten: a cheap test first (literal words),
    the patterns on the few rows that pass it, so a column of millions of params costs one
    scan, not a dozen rewrites.
    """
    texts = [c for c in (*columns, *users) if c in frame.columns]
    if frame.is_empty() or not texts:
        return frame
    suspect = pl.any_horizontal(pl.col(c).str.contains(_ANY).fill_null(False) for c in texts)
    secret_key = pl.lit(False)
    if keyed is not None:
        names = frame[keyed[0]].unique().drop_nulls().to_list()
        secret = [
            n for n, is_secret in zip(names, credential_names(names), strict=True) if is_secret
        ]
        secret_key = pl.col(keyed[0]).is_in(secret)
    rows = frame.select(suspect | secret_key).to_series().arg_true()
    if rows.is_empty():
        return frame
    rewritten = []
    for name in texts:
        column = pl.col(name)
        new = redacted_user(column) if name in users else redacted(column)
        if keyed is not None and name == keyed[1]:
            new = (
                pl.when(secret_key & column.is_not_null()).then(pl.lit(SECRET_MARK)).otherwise(new)
            )
        rewritten.append(new.alias(name))
    hit = frame[rows].with_columns(rewritten)
    return frame.with_columns(frame[name].clone().scatter(rows, hit[name]) for name in texts)


def redact_keys(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """A column of few distinct texts (metric keys of millions of points): each distinct
    text redacted once, the column rewritten only when one changed."""
    if frame.is_empty() or column not in frame.columns:
        return frame
    distinct = frame[column].unique().drop_nulls().to_list()
    changed = {
        old: new for old, new in zip(distinct, redact_texts(distinct), strict=True) if new != old
    }
    if not changed:
        return frame
    return frame.with_columns(pl.col(column).replace(changed))


def redact_texts(texts: list[str | None]) -> list[str | None]:
    """Many texts at once (one polars pass, not one per text)."""
    if not texts:
        return texts
    frame = pl.DataFrame({"t": texts}, schema={"t": pl.String})
    return redact_frame(frame, ["t"])["t"].to_list()


def redact_text(text: str | None) -> str | None:
    if text is None:
        return None
    return redact_texts([text])[0]


def redact_user_id(text: str | None) -> str | None:
    if text is None:
        return None
    frame = pl.DataFrame({"u": [text]}, schema={"u": pl.String})
    return redact_frame(frame, [], users=["u"])["u"][0]


def credential_names(names: list[str]) -> list[bool]:
    """Whether each name is a credential's (``hf_token``, ``api_key``, ``password``)."""
    if not names:
        return []
    return pl.Series(names, dtype=pl.String).str.contains(_CREDENTIAL_KEY).to_list()


def redact_arguments(args: list[str]) -> list[str]:
    """A command line as a list: each argument redacted, and the argument after a
    credential flag (``--hf_token`` ``hf_…``) replaced whole."""
    out = redact_texts(list(args))
    flags = pl.Series(args, dtype=pl.String).str.contains(
        rf"(?i)^--?(?:{_COMPOUND_NAME}|token|key)$"
    )
    for index, is_flag in enumerate(flags.to_list()):
        if is_flag and index + 1 < len(out) and not str(out[index + 1]).startswith("-"):
            out[index + 1] = SECRET_MARK
    return out


def redact_tree(tree):
    """A JSON-like tree (dicts, lists, text, numbers) with every text and key redacted, and
    the value under a credential's name replaced whole. Walked without recursion; all texts
    are redacted in one pass, whatever their number."""
    root = [tree]
    leaves: list[tuple[object, object]] = []  # (container, index or key) of a text
    keys: list[tuple[dict, str]] = []
    stack: list[tuple[object, object]] = [(root, 0)]
    while stack:
        container, index = stack.pop()
        value = container[index]
        if isinstance(value, str):
            leaves.append((container, index))
        elif isinstance(value, dict):
            for key in value:
                if isinstance(key, str):
                    keys.append((value, key))
                stack.append((value, key))
        elif isinstance(value, list):
            stack.extend((value, i) for i in range(len(value)))
    names = [key for _, key in keys]
    secret = set()
    for (mapping, key), is_secret in zip(keys, credential_names(names), strict=True):
        if is_secret:
            mapping[key] = SECRET_MARK
            secret.add((id(mapping), key))
    leaves = [(c, i) for c, i in leaves if (id(c), i) not in secret]
    for (container, index), text in zip(
        leaves, redact_texts([container[index] for container, index in leaves]), strict=True
    ):
        container[index] = text
    for (mapping, key), new in zip(keys, redact_texts(names), strict=True):
        if new != key:
            mapping[new] = mapping.pop(key)
    return root[0]


def redact_json_values(values: dict[str, str]) -> dict[str, str]:
    """A flat mapping of names to JSON texts (a W&B summary): names redacted, each value
    that may hold something parsed, redacted as a tree and written back as JSON (redacting
    the text itself could not see into its escaped quotes)."""
    if not values:
        return values
    names = list(values)
    texts = list(values.values())
    suspect = pl.Series(texts, dtype=pl.String).str.contains(_ANY).fill_null(False).to_list()
    secret = credential_names(names)
    out = {}
    for new_name, text, may_hold, is_secret in zip(
        redact_texts(names), texts, suspect, secret, strict=True
    ):
        if is_secret:
            text = json.dumps(SECRET_MARK)
        elif may_hold:
            try:
                text = json.dumps(redact_tree(json.loads(text)))
            except (ValueError, RecursionError):  # not JSON: redacted as text
                text = redact_text(text)
        out[new_name] = text
    return out


def sql_redacted(column: str) -> str:
    """The same redaction as a DuckDB SQL expression over ``column`` (RE2), for the
    migration that scrubs warehouses written before this policy."""
    out = column
    for pattern, kept in _SECRET_PATTERNS:
        out = f"regexp_replace({out}, '{_sql(pattern)}', '{_sql(_re2_replacement(kept, SECRET_MARK))}', 'g')"
    return f"regexp_replace({out}, '{_sql(_EMAIL)}', '{EMAIL_MARK}', 'g')"


def sql_redacted_user(column: str) -> str:
    return (
        f"CASE WHEN regexp_matches({column}, '{_sql(_WHOLE_EMAIL)}') "
        f"THEN regexp_extract({column}, '{_sql(_WHOLE_EMAIL)}', 1) ELSE {sql_redacted(column)} END"
    )


def sql_suspect(column: str) -> str:
    return f"coalesce(regexp_matches({column}, '{_sql(_ANY)}'), false)"


def sql_credential_key(column: str) -> str:
    return f"coalesce(regexp_matches({column}, '{_sql(_CREDENTIAL_KEY)}'), false)"


def _sql(text: str) -> str:
    return text.replace("'", "''")

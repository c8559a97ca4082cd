"""Loading and validating ``audit.toml``.

The configuration is data with a schema: every section and key is declared here with its
type and default, and an unknown key is an error that lists the valid ones.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from audit.errors import InputError

DEFAULT_CONFIG_NAME = "audit.toml"

# section -> key -> (expected python type(s), default). A nested dict default means the
# key holds a free-form table whose values are validated by their consumer.
SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], Any]]] = {
    "cluster": {
        "timezone": ((str,), "UTC"),
    },
    "links": {
        "job_tag_keys": ((list,), ["slurm_job_id", "slurm.job_id", "SLURM_JOB_ID"]),
        "time_slack_minutes": ((int, float), 5),
        # paths as logged on the cluster -> where the same files are seen from here
        "path_prefixes": ((dict,), {}),
    },
    "mlflow": {
        "http_timeout_seconds": ((int, float), 30),
        "http_max_retries": ((int,), 5),
        "http_backoff_seconds": ((int, float), 0.5),
        "page_size": ((int,), 1000),
    },
}


@dataclass
class Config:
    """Validated configuration, with defaults filled in."""

    values: dict[str, dict[str, Any]]
    path: Path | None = None
    raw_text: str = field(default="", repr=False)

    def get(self, section: str, key: str) -> Any:
        return self.values[section][key]

    def local_path(self, text: str) -> str:
        """A path from a config value: relative ones are relative to the config file."""
        if self.path is None or Path(text).is_absolute():
            return text
        return str((self.path.parent / text).resolve())

    @property
    def timezone(self) -> ZoneInfo:
        return ZoneInfo(self.values["cluster"]["timezone"])


def defaults() -> dict[str, dict[str, Any]]:
    return {
        section: {key: copy.deepcopy(spec[1]) for key, spec in keys.items()}
        for section, keys in SCHEMA.items()
    }


def load_config(path: Path | None) -> Config:
    """Read ``path`` (or defaults when ``None``) and validate it against ``SCHEMA``."""
    values = defaults()
    if path is None:
        return Config(values=values)
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise InputError(f"config {path}: is a directory, expected a TOML file") from None
    except FileNotFoundError:
        raise InputError(f"config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"config {path}: cannot read ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"config {path}: invalid TOML: {exc}") from None
    _merge(values, data, path)
    return Config(values=values, path=path, raw_text=text)


def _merge(values: dict[str, dict[str, Any]], data: dict[str, Any], path: Path) -> None:
    for section, table in data.items():
        if section not in SCHEMA:
            valid = ", ".join(sorted(SCHEMA))
            raise InputError(f"config {path}: unknown section [{section}]; valid sections: {valid}")
        if not isinstance(table, dict):
            raise InputError(f"config {path}: [{section}] must be a table")
        for key, value in table.items():
            spec = SCHEMA[section].get(key)
            if spec is None:
                valid = ", ".join(sorted(SCHEMA[section]))
                raise InputError(
                    f"config {path}: unknown key '{key}' in [{section}]; valid keys: {valid}"
                )
            types, _default = spec
            if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
                wanted = " or ".join(t.__name__ for t in types)
                raise InputError(
                    f"config {path}: [{section}] {key} must be {wanted}, got {value!r}"
                )
            if isinstance(value, list) and not all(isinstance(v, str) for v in value):
                raise InputError(f"config {path}: [{section}] {key} must be a list of strings")
            if isinstance(value, dict) and not all(isinstance(v, str) for v in value.values()):
                raise InputError(f"config {path}: [{section}] {key} must map strings to strings")
            values[section][key] = value
    try:
        ZoneInfo(values["cluster"]["timezone"])
    except (ZoneInfoNotFoundError, ValueError):
        tz = values["cluster"]["timezone"]
        raise InputError(
            f"config {path}: [cluster] timezone {tz!r} is not an IANA time zone "
            "(e.g. 'UTC', 'Europe/Amsterdam')"
        ) from None

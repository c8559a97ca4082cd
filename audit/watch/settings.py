"""``[watch]``, ``[watch.notify]`` and ``[watch.policy.NAME]`` of ``audit.toml``: validated
here (``audit.config`` hands the table over), every unknown key an error naming it.

Defaults of the ``idle`` policy come from Princeton's Job Defense Shield, whose
``cancel_zero_gpu_jobs`` alert judges a GPU idle when every measurement in the period is
0 %, sends its first warning at 60 minutes and cancels at 120 (docs/alert/cancel_gpu_jobs.md
of PrincetonUniversity/job_defense_shield): ``util_pct = 0``, ``warn_after = "1h"``,
``cancel_after = "1h"`` (one hour after the warning). The run policies warn at the
finding and give an hour, the time STB001 allows a person to react.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from audit.errors import InputError

KINDS = ("idle", "unstable", "red_line", "duplicate_launch")
# the rule behind each run policy (the idle policy reads telemetry itself)
RULE_OF_KIND = {"unstable": "STB001", "red_line": "RED001", "duplicate_launch": "DUP001"}
CONTROLLER_COMMANDS = ("squeue", "scontrol", "")
COMMENT_FIELDS = ("AdminComment", "Comment", "")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value, where: str) -> float:
    """``"90s"``, ``"15m"``, ``"1h"``, ``"2d"`` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise InputError(f"{where} must be a duration like '30m' or '1h', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value) if isinstance(value, str) else None
        if not match:
            raise InputError(f"{where} must be a duration like '30m' or '1h', got {value!r}")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not 0 <= seconds <= 366 * 86400:
        raise InputError(f"{where} must be between 0 s and a year, got {value!r}")
    return seconds


@dataclass(frozen=True)
class Policy:
    name: str
    kind: str
    partitions: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    warn_after: float = 0.0  # seconds the condition holds before the warning
    cancel_after: float = 3600.0  # seconds from the warning to the cancellation
    enforce: bool = False
    util_pct: float = 0.0  # idle: a GPU at or under this is idle
    notify: tuple[str, ...] = ()  # more recipients of this policy's messages

    @property
    def rule(self) -> str | None:
        return RULE_OF_KIND.get(self.kind)


@dataclass(frozen=True)
class NotifySettings:
    urls: tuple[str, ...] = ()  # apprise URLs that get every message (admins, channels)
    email_url: str = ""  # apprise mailto URL used to reach an address (to= appended)
    mail_domain: str = ""  # a user without an entry in users: USER@mail_domain
    users: dict[str, str] = field(default_factory=dict)  # user -> address or apprise URL
    teams: dict[str, str] = field(default_factory=dict)  # team -> address or apprise URL
    timeout_seconds: float = 20.0


@dataclass(frozen=True)
class WatchSettings:
    interval: float = 300.0
    cluster: str = "default"
    slurm: str = "squeue"
    sacct: bool = True
    command_timeout: float = 30.0
    nvidia_smi: tuple[str, ...] = ()
    dcgm: tuple[str, ...] = ()
    mlflow: tuple[str, ...] = ()
    wandb: tuple[str, ...] = ()
    stale_after: float = 600.0  # telemetry older than this has stopped arriving
    lookback: float = 86400.0  # runs judged by the run policies started within this
    comment_field: str = "AdminComment"  # where a cancelled job says why
    notify: NotifySettings = field(default_factory=NotifySettings)
    policies: tuple[Policy, ...] = ()


_TOP = {
    "interval": "duration",
    "cluster": str,
    "slurm": str,
    "sacct": bool,
    "command_timeout": "duration",
    "nvidia_smi": list,
    "dcgm": list,
    "mlflow": list,
    "wandb": list,
    "stale_after": "duration",
    "lookback": "duration",
    "comment_field": str,
    "notify": dict,
    "policy": dict,
}
_NOTIFY = {
    "urls": list,
    "email_url": str,
    "mail_domain": str,
    "users": dict,
    "teams": dict,
    "timeout": "duration",
}
_POLICY = {
    "kind": str,
    "partitions": list,
    "accounts": list,
    "teams": list,
    "users": list,
    "warn_after": "duration",
    "cancel_after": "duration",
    "enforce": bool,
    "util_pct": float,
    "notify": list,
}
_POLICY_DEFAULTS = {
    "idle": {"warn_after": 3600.0, "cancel_after": 3600.0},
    "unstable": {"warn_after": 0.0, "cancel_after": 3600.0},
    "red_line": {"warn_after": 0.0, "cancel_after": 3600.0},
    "duplicate_launch": {"warn_after": 0.0, "cancel_after": 3600.0},
}


def _check(table: dict, schema: dict, where: str, section: str) -> dict[str, Any]:
    out = {}
    for key, value in table.items():
        kind = schema.get(key)
        if kind is None:
            raise InputError(
                f"{where}: unknown key '{key}' in [{section}]; valid keys: {', '.join(sorted(schema))}"
            )
        shown = f"{where}: [{section}] {key}"
        if kind == "duration":
            out[key] = parse_duration(value, shown)
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InputError(f"{shown} must be a number, got {value!r}")
            out[key] = float(value)
        elif kind is list:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise InputError(f"{shown} must be a list of strings, got {value!r}")
            out[key] = tuple(value)
        elif kind is dict:
            if not isinstance(value, dict):
                raise InputError(f"{shown} must be a table")
            out[key] = value
        elif isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            raise InputError(f"{shown} must be {kind.__name__}, got {value!r}")
        else:
            out[key] = value
    return out


def validate_watch(table: Any, where: str) -> WatchSettings:
    """The ``[watch]`` table of a config file (``where`` names the file)."""
    if not isinstance(table, dict):
        raise InputError(f"{where}: [watch] must be a table")
    top = _check(table, _TOP, where, "watch")
    notify = NotifySettings()
    if "notify" in top:
        values = _check(top.pop("notify"), _NOTIFY, where, "watch.notify")
        for key in ("users", "teams"):
            bad = [k for k, v in values.get(key, {}).items() if not isinstance(v, str) or not v]
            if bad:
                raise InputError(
                    f"{where}: [watch.notify] {key}.{bad[0]} must be an e-mail address or an apprise URL"
                )
        if "timeout" in values:
            values["timeout_seconds"] = values.pop("timeout")
        notify = NotifySettings(**values)
    policies = []
    for name, body in sorted(top.pop("policy", {}).items()):
        section = f"watch.policy.{name}"
        if not isinstance(body, dict):
            raise InputError(f"{where}: [{section}] must be a table")
        values = _check(body, _POLICY, where, section)
        kind = values.get("kind")
        if kind not in KINDS:
            raise InputError(
                f"{where}: [{section}] kind must be one of {', '.join(KINDS)}, got {kind!r}"
            )
        if "util_pct" in values and (kind != "idle" or not 0 <= values["util_pct"] <= 100):
            raise InputError(
                f"{where}: [{section}] util_pct is a GPU utilisation from 0 to 100 % of an idle policy"
            )
        policies.append(Policy(name=name, **{**_POLICY_DEFAULTS[kind], **values}))
    settings = WatchSettings(**top, notify=notify, policies=tuple(policies))
    if settings.slurm not in CONTROLLER_COMMANDS:
        raise InputError(
            f"{where}: [watch] slurm must be squeue, scontrol (Slurm 23.02+) or '' (no Slurm), "
            f"got {settings.slurm!r}"
        )
    if settings.comment_field not in COMMENT_FIELDS:
        raise InputError(
            f"{where}: [watch] comment_field must be AdminComment, Comment or '' (none), "
            f"got {settings.comment_field!r}"
        )
    if settings.interval < 1:
        raise InputError(f"{where}: [watch] interval must be at least 1 s")
    return settings

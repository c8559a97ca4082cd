"""A run's state as read so far, kept in ``run_files`` between imports so a grown log is
read on from where the last import stopped."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from audit.errors import InputError
from audit.importers.read import parse_json
from audit.redact import redact_arguments, redact_json_values, redact_tree, redact_user_id

STATE_VERSION = 1


@dataclass
class RunState:
    """Everything about a run that later records update, as plain JSON-able data."""

    run_id: str = ""
    project: str = ""
    entity: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    notes: str = ""
    labels: list[str] = field(default_factory=list)
    sweep_id: str = ""
    host: str = ""
    user: str = ""
    program: str = ""
    commit: str = ""
    version: str = ""
    start_ms: int | None = None
    last_ms: int | None = None
    exit_code: int | None = None
    runtime_s: float | None = None
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)  # flat key -> value as JSON text
    slurm: dict = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    gpus: dict = field(default_factory=dict)  # index -> {name, memory_mib, uuid}
    gpu_type: str = ""
    gpu_count: int | None = None  # the machine's GPUs, not the run's
    world_size: int | None = None  # as the run's console log states it
    world_size_said: str = ""
    history_rows: int = 0
    records: int = 0
    latest: list = field(default_factory=list)  # [key, step, ts_ms, value] per history key
    head: str = ""  # hash of the log's first head_bytes: the same file grown, or another
    head_bytes: int = 0

    def as_json(self) -> str:
        """The state as stored in ``run_files.state``: redacted like every stored text."""
        plain = {k: v for k, v in self.__dict__.items() if k not in ("args", "summary")}
        data = redact_tree(json.loads(json.dumps(plain, allow_nan=True)))
        data["user"] = redact_user_id(self.user)
        data["args"] = redact_arguments(self.args)
        data["summary"] = redact_json_values(self.summary)
        return json.dumps({**data, "state_format": STATE_VERSION}, allow_nan=True)

    @classmethod
    def from_json(cls, text: str) -> RunState | None:
        data = json.loads(text)
        if data.pop("state_format", None) != STATE_VERSION:
            return None
        return cls(**data)

    def see_time(self, ms: int | None) -> None:
        if ms is not None and (self.last_ms is None or ms > self.last_ms):
            self.last_ms = ms


def json_value(text: str, where: object):
    try:
        return parse_json(text, where)
    except InputError:
        raise InputError(f"{where}: a value is not JSON ({text[:40]!r})") from None

"""The watch's record in the warehouse: invocations and every action (``watch_invocations``,
``watch_actions``), and what a restart reads back (the episode of each live finding).

An action that reaches outside (a message, a cancellation) is written first as
``sending`` / ``cancelling`` and committed, then done, then set to its outcome: a watch
killed in between leaves the mark, and the next invocation finds the attempt
``interrupted`` and makes it again (a message may then arrive twice, never not at all).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime

from audit.importers.files import now_utc

IN_FLIGHT = ("sending", "cancelling")


@dataclass
class Episode:
    """What was done about one live finding since it last opened."""

    opened: bool = False
    warned: dict[str, datetime] = field(default_factory=dict)  # recipient -> when sent
    reminded: set[str] = field(default_factory=set)
    cancelled: bool = False  # a cancellation done (or the job found ended at it)
    would_cancel: bool = False

    @property
    def warned_at(self) -> datetime | None:
        return min(self.warned.values()) if self.warned else None


def start_invocation(wh, enforce: bool, once: bool, config_hash: str) -> int:
    with wh.transaction() as con:
        number = con.execute(
            "SELECT coalesce(max(invocation_id), 0) + 1 FROM watch_invocations"
        ).fetchall()[0][0]
        con.execute(
            "INSERT INTO watch_invocations VALUES (?, ?, NULL, ?, ?, ?, ?, 0, ?, 'running')",
            [number, now_utc(), socket.gethostname(), os.getpid(), enforce, once, config_hash],
        )
        # attempts of earlier invocations still marked in flight were cut short
        con.execute(
            "UPDATE watch_actions SET status = 'interrupted', detail = coalesce(detail, '') || "
            "'the watch stopped during this attempt' WHERE list_contains(?, status)",
            [list(IN_FLIGHT)],
        )
        con.execute(
            "UPDATE watch_invocations SET outcome = 'interrupted' "
            "WHERE outcome = 'running' AND invocation_id <> ?",
            [number],
        )
    return number


def end_invocation(wh, invocation_id: int, intervals: int, outcome: str) -> None:
    with wh.transaction() as con:
        con.execute(
            "UPDATE watch_invocations SET finished_at = ?, intervals = ?, outcome = ? "
            "WHERE invocation_id = ?",
            [now_utc(), intervals, outcome, invocation_id],
        )


def count_interval(wh, invocation_id: int, intervals: int) -> None:
    with wh.transaction() as con:
        con.execute(
            "UPDATE watch_invocations SET intervals = ? WHERE invocation_id = ?",
            [intervals, invocation_id],
        )


def episodes(con, keys: list[str]) -> dict[str, Episode]:
    """Each key's current episode: its actions after its last ``resolve``."""
    out: dict[str, Episode] = {key: Episode() for key in keys}
    if not keys:
        return out
    rows = con.execute(
        """
        WITH last_resolve AS (
            SELECT finding_key, max(action_id) AS at FROM watch_actions
            WHERE action = 'resolve' AND list_contains($1, finding_key) GROUP BY 1
        )
        SELECT a.finding_key, a.action, a.status, a.recipient, a.acted_at
        FROM watch_actions a LEFT JOIN last_resolve r USING (finding_key)
        WHERE list_contains($1, a.finding_key) AND a.action_id > coalesce(r.at, -1)
        ORDER BY a.action_id
        """,
        [keys],
    ).fetchall()
    for key, action, status, recipient, acted_at in rows:
        episode = out[key]
        if action == "open":
            episode.opened = True
        elif action == "warn" and status == "sent":
            episode.warned.setdefault(recipient, acted_at)
        elif action == "remind" and status == "sent":
            episode.reminded.add(recipient)
        elif action == "cancel" and status in ("cancelled", "ended"):
            episode.cancelled = True
        elif action == "would_cancel":
            episode.would_cancel = True
    return out


def open_episodes(con) -> list[tuple[str, str, str, str, str]]:
    """(key, policy, kind, cluster, job_id) of every finding opened and not resolved or
    cancelled."""
    return con.execute(
        """
        WITH last AS (
            SELECT finding_key, max(action_id) FILTER (WHERE action = 'open') AS opened,
                   max(action_id) FILTER (WHERE action = 'resolve') AS resolved,
                   max(action_id) FILTER (WHERE action = 'cancel'
                                          AND status IN ('cancelled', 'ended')) AS cancelled
            FROM watch_actions GROUP BY 1
        )
        SELECT a.finding_key, a.policy, a.kind, a.cluster, a.job_id
        FROM watch_actions a JOIN last l ON l.finding_key = a.finding_key AND a.action_id = l.opened
        WHERE l.opened > coalesce(l.resolved, -1) AND l.opened > coalesce(l.cancelled, -1)
        ORDER BY a.action_id
        """
    ).fetchall()


def record(
    wh,
    invocation_id: int,
    finding,
    action: str,
    status: str,
    recipient: str | None = None,
    message: str | None = None,
    detail: str | None = None,
    saved_gpu_hours: float | None = None,
    evidence: dict | None = None,
) -> int:
    """One action, committed now; its id (to set the outcome of an attempt)."""
    with wh.transaction() as con:
        action_id = con.execute(
            "SELECT coalesce(max(action_id), 0) + 1 FROM watch_actions"
        ).fetchall()[0][0]
        job = finding.job
        con.execute(
            "INSERT INTO watch_actions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                action_id,
                invocation_id,
                now_utc(),
                finding.policy.name,
                finding.policy.kind,
                finding.key,
                job.cluster,
                job.job_id,
                finding.run_id,
                job.user,
                job.team,
                action,
                recipient,
                status,
                message,
                None if evidence is None else json.dumps(evidence, default=str, sort_keys=True),
                job.gpus,
                finding.usd_per_hour,
                saved_gpu_hours,
                detail,
            ],
        )
    return action_id


def set_status(wh, action_id: int, status: str, detail: str | None = None) -> None:
    with wh.transaction() as con:
        con.execute(
            "UPDATE watch_actions SET status = ?, detail = coalesce(?, detail) WHERE action_id = ?",
            [status, detail, action_id],
        )


def resolve(
    wh, invocation_id: int, key: str, policy: str, kind: str, cluster, job_id, why: str
) -> None:
    with wh.transaction() as con:
        action_id = con.execute(
            "SELECT coalesce(max(action_id), 0) + 1 FROM watch_actions"
        ).fetchall()[0][0]
        con.execute(
            "INSERT INTO watch_actions (action_id, invocation_id, acted_at, policy, kind, "
            "finding_key, cluster, job_id, action, status, detail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'resolve', 'done', ?)",
            [action_id, invocation_id, now_utc(), policy, kind, key, cluster, job_id, why],
        )

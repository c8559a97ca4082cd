"""The watch's record in the warehouse: invocations and every action (``watch_invocations``,
``watch_actions``), and what a restart reads back (the episode of each live finding).

Messages go through an outbox: a message is recorded ``queued`` first, then marked
``sending`` and committed, sent, and set to its outcome. A cancellation is recorded
``cancelling`` together with its notices (``held``: not to be sent before it is done),
then ``scancel`` runs, then one transaction marks it ``cancelled`` and releases the notices.
A watch killed in between leaves the mark: the next invocation finds the attempt
``interrupted`` and makes it again (a message may then arrive twice, never not at all), and
a cancellation that did happen is confirmed from Slurm, its notices released.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime

from audit.windows import now_utc

IN_FLIGHT = ("sending", "cancelling")
UNSENT = ("queued", "failed", "interrupted")  # messages the outbox sends (again)
NOTICES = ("warn", "remind")


@dataclass
class Episode:
    """What was done about one live finding since it last opened."""

    opened: bool = False
    warned: set[str] = field(default_factory=set)  # recipients a warning is for (any state)
    warned_at: datetime | None = None  # when the first warning was sent
    reminded: set[str] = field(default_factory=set)
    cancelled: bool = False  # a cancellation done (or the job found ended at it)
    cut_cancel: bool = False  # a cancellation attempt the watch was stopped in
    would_cancel: bool = False


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
            "UPDATE watch_actions SET status = 'interrupted', detail = 'the watch stopped "
            "during an attempt' WHERE list_contains(?, status)",
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
        elif action == "warn":
            episode.warned.add(recipient)
            if status == "sent" and (episode.warned_at is None or acted_at < episode.warned_at):
                episode.warned_at = acted_at
        elif action == "remind":
            episode.reminded.add(recipient)
        elif action == "cancel" and status in ("cancelled", "ended"):
            episode.cancelled = True
        elif action == "cancel" and status == "interrupted":
            episode.cut_cancel = True
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


def _insert(con, invocation_id: int, finding, action: str, status: str, **values) -> int:
    action_id = con.execute("SELECT coalesce(max(action_id), 0) + 1 FROM watch_actions").fetchall()[
        0
    ][0]
    job = finding.job
    evidence = values.get("evidence")
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
            values.get("recipient"),
            status,
            values.get("message"),
            None if evidence is None else json.dumps(evidence, default=str, sort_keys=True),
            job.gpus,
            finding.usd_per_hour,
            values.get("saved_gpu_hours"),
            values.get("detail"),
        ],
    )
    return action_id


def record(wh, invocation_id: int, finding, action: str, status: str, **values) -> int:
    """One action, committed now; its id."""
    with wh.transaction() as con:
        return _insert(con, invocation_id, finding, action, status, **values)


def queue(wh, invocation_id: int, finding, action: str, messages: list[tuple[str, str]]) -> None:
    """Messages (recipient, title + newline + body) to send, in one transaction."""
    with wh.transaction() as con:
        for recipient, text in messages:
            _insert(
                con, invocation_id, finding, action, "queued", recipient=recipient, message=text
            )


def begin_cancel(wh, invocation_id: int, finding, reason: str, saved, notices) -> int:
    """The cancellation and its notices (held until it is done), in one transaction."""
    with wh.transaction() as con:
        action_id = _insert(
            con,
            invocation_id,
            finding,
            "cancel",
            "cancelling",
            message=reason,
            evidence=finding.evidence,
            saved_gpu_hours=saved,
        )
        for recipient, text in notices:
            _insert(
                con, invocation_id, finding, "remind", "held", recipient=recipient, message=text
            )
    return action_id


def finish_cancel(wh, action_id: int, key: str, problem: str | None, confirmed: str = "") -> None:
    """The cancellation's outcome; done, its notices are released to the outbox."""
    with wh.transaction() as con:
        con.execute(
            "UPDATE watch_actions SET status = ?, detail = coalesce(?, detail) WHERE action_id = ?",
            ["failed" if problem else "cancelled", problem or confirmed or None, action_id],
        )
        if not problem:
            con.execute(
                "UPDATE watch_actions SET status = 'queued' WHERE finding_key = ? AND status = 'held'",
                [key],
            )


def cut_cancellation(con, key: str) -> int | None:
    """The latest cancellation of ``key`` the watch was stopped in, if any."""
    rows = con.execute(
        "SELECT max(action_id) FROM watch_actions WHERE finding_key = ? AND action = 'cancel' "
        "AND status = 'interrupted'",
        [key],
    ).fetchall()
    return rows[0][0] if rows else None


def outbox(con) -> list[tuple[int, str, str, str, str]]:
    """(action id, policy, job id, recipient, title + body) of every message to send."""
    return con.execute(
        "SELECT action_id, policy, job_id, recipient, message FROM watch_actions "
        "WHERE list_contains(?, action) AND list_contains(?, status) ORDER BY action_id",
        [list(NOTICES), list(UNSENT)],
    ).fetchall()


def set_status(wh, action_id: int, status: str, detail: str | None = None) -> None:
    """A message's progress; ``sent`` also dates it (a warning period runs from then)."""
    with wh.transaction() as con:
        con.execute(
            "UPDATE watch_actions SET status = ?, detail = coalesce(?, detail), "
            "acted_at = CASE WHEN ? = 'sent' THEN ? ELSE acted_at END WHERE action_id = ?",
            [status, detail, status, now_utc(), action_id],
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


def stopped(con, since: datetime | None, until: datetime | None) -> dict:
    """Jobs cancelled after a warning in a window, and what they would still have held:
    the counterfactual is that each would have kept its GPUs to its time limit (a job
    without one is counted, its hours not)."""
    rows = con.execute(
        """
        SELECT kind, policy, job_id, user_name, gpus, saved_gpu_hours, usd_per_hour, acted_at
        FROM watch_actions
        WHERE action = 'cancel' AND status = 'cancelled'
          AND ($1 IS NULL OR acted_at >= $1) AND ($2 IS NULL OR acted_at < $2)
        ORDER BY acted_at, action_id
        """,
        [since, until],
    ).fetchall()
    warned = con.execute(
        """
        SELECT count(DISTINCT finding_key) FROM watch_actions
        WHERE action = 'warn' AND status = 'sent'
          AND ($1 IS NULL OR acted_at >= $1) AND ($2 IS NULL OR acted_at < $2)
        """,
        [since, until],
    ).fetchall()[0][0]
    jobs = [
        {
            "kind": kind,
            "policy": policy,
            "job_id": job_id,
            "user": user,
            "gpus": gpus,
            "saved_gpu_hours": saved,
            "saved_usd": None if saved is None or not gpus or usd is None else saved * usd / gpus,
            "at": at,
        }
        for kind, policy, job_id, user, gpus, saved, usd, at in rows
    ]
    by_kind: dict[str, int] = {}
    for job in jobs:
        by_kind[job["kind"]] = by_kind.get(job["kind"], 0) + 1
    known = [j for j in jobs if j["saved_gpu_hours"] is not None]
    return {
        "cancelled": len(jobs),
        "by_kind": sorted(by_kind.items()),
        "saved_gpu_hours": sum(j["saved_gpu_hours"] for j in known),
        "saved_usd": sum(j["saved_usd"] or 0.0 for j in known),
        "without_limit": len(jobs) - len(known),
        "warned": warned,
        "jobs": jobs,
        "counterfactual": (
            "had they not been cancelled, each would have held its GPUs until its time "
            "limit; jobs without a time limit are counted without hours"
        ),
    }


def recent(con, limit: int = 10) -> dict:
    """What ``audit status`` shows: the last invocation, counts, the latest actions."""
    last = con.execute(
        "SELECT invocation_id, started_at, finished_at, enforce, intervals, outcome "
        "FROM watch_invocations ORDER BY invocation_id DESC LIMIT 1"
    ).fetchall()
    counts = dict(
        con.execute(
            "SELECT action || ' ' || status, count(*) FROM watch_actions GROUP BY 1 ORDER BY 1"
        ).fetchall()
    )
    actions = con.execute(
        "SELECT acted_at, policy, job_id, action, status, coalesce(recipient, ''), "
        "coalesce(detail, '') FROM watch_actions WHERE action <> 'open' "
        "ORDER BY action_id DESC LIMIT ?",
        [limit],
    ).fetchall()
    return {
        "last": last[0] if last else None,
        "counts": counts,
        "open": len(open_episodes(con)),
        "actions": actions,
    }

"""``audit watch`` against a real single-node Slurm (tests/slurm_cluster.py), a real SMTP
server, a webhook receiver and a dcgm-exporter-format endpoint: the idle job is cancelled
after its warning period, and not the busy one, not the one outside the policy, not the
one whose telemetry stopped, not anything in a dry run; each finding reaches each
recipient once; a watch stopped mid-run and started again neither loses nor repeats an
action."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import duckdb
import pytest

from tests.watch_parts import (
    Exporter,
    Inbox,
    WatchProcess,
    exporter_endpoint,
    job_gpus,
    smtp_server,
    wait_for,
    webhook_receiver,
)

WARN_AFTER, CANCEL_AFTER = 6, 12  # seconds: short in tests, hours at a site


@pytest.fixture
def parts(slurm, tmp_path):
    """The cluster emptied, an inbox, and the three endpoints; yields a dict."""
    slurm.cancel_all()
    inbox = Inbox()
    exporter = Exporter(slurm.hostname)
    with (
        smtp_server(inbox) as smtp_port,
        webhook_receiver(inbox) as hook,
        exporter_endpoint(exporter) as metrics,
    ):
        yield {
            "slurm": slurm,
            "inbox": inbox,
            "exporter": exporter,
            "smtp": smtp_port,
            "hook": hook,
            "metrics": metrics,
            "tmp": tmp_path,
        }
    slurm.cancel_all()


def write_config(parts, enforce: bool = True):
    config = parts["tmp"] / "audit.toml"
    config.write_text(
        f"""
[watch]
interval = "2s"
stale_after = "6s"
dcgm = ["{parts["metrics"]}"]

[watch.notify]
email_url = "mailto://127.0.0.1:{parts["smtp"]}?from=audit@example.com&mode=insecure"
mail_domain = "example.com"
urls = ["{parts["hook"]}"]
timeout = "10s"

[watch.policy.idle-gpu]
kind = "idle"
partitions = ["gpu"]
util_pct = 0
warn_after = "{WARN_AFTER}s"
cancel_after = "{CANCEL_AFTER}s"
enforce = {"true" if enforce else "false"}
"""
    )
    return config


def start_jobs(parts) -> dict[str, str]:
    """idle (2 GPUs at 0 %), busy (2 at 80 %), outside (debug partition, 1 at 0 %),
    silent (1 at 0 %, its telemetry stopped after its warning)."""
    slurm, exporter = parts["slurm"], parts["exporter"]
    jobs = {
        "idle": slurm.submit(2, "idle"),
        "busy": slurm.submit(2, "busy"),
        "outside": slurm.submit(1, "outside", partition="debug"),
        "silent": slurm.submit(1, "silent"),
    }
    for name, job in jobs.items():
        assert slurm.wait_state(job, {"RUNNING"}) == "RUNNING", name
        exporter.set(job_gpus(slurm, job), 80.0 if name == "busy" else 0.0)
    return jobs


def actions(db) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            "SELECT job_id, action, status, recipient, acted_at, detail FROM watch_actions "
            "ORDER BY action_id"
        ).fetchall()


def warned(inbox: Inbox, job: str) -> bool:
    return any(f"job {job} " in t for t in inbox.titles()) and any(
        f"job {job} " in s for s in inbox.subjects()
    )


def test_enforce_cancels_the_idle_job_only(parts):
    slurm, inbox, exporter = parts["slurm"], parts["inbox"], parts["exporter"]
    config, db = write_config(parts), parts["tmp"] / "audit.duckdb"
    jobs = start_jobs(parts)
    log = parts["tmp"] / "watch.log"
    watch = WatchProcess(db, config, slurm.env, "--enforce", log=log)
    try:
        # both idle jobs of the policy are warned; then the silent one's telemetry stops
        wait_for(
            lambda: warned(inbox, jobs["idle"]) and warned(inbox, jobs["silent"]),
            60,
            "warnings",
            log,
        )
        exporter.set(job_gpus(slurm, jobs["silent"]), None)
        wait_for(lambda: slurm.state(jobs["idle"]) == "CANCELLED", 60, "the cancellation", log)
        # well past the silent job's own warning period: it must still run
        time.sleep(CANCEL_AFTER / 2 + 4)
    finally:
        assert watch.stop() == 143, watch.output()[-3000:]
    output = watch.output()
    assert {name: slurm.state(job) for name, job in jobs.items()} == {
        "idle": "CANCELLED",
        "busy": "RUNNING",
        "outside": "RUNNING",
        "silent": "RUNNING",
    }, output[-3000:]
    comment = slurm.run("scontrol", "show", "job", jobs["idle"])
    assert "AdminComment=audit watch: cancelled by policy idle-gpu" in comment
    assert "telemetry of GPU" in output and "stopped arriving" in output
    # exactly once per finding and recipient: a warning, then the cancellation notice
    idle = jobs["idle"]
    assert (
        inbox.subjects("root@example.com").count(f"[audit watch] warning: job {idle} (idle-gpu)")
        == 1
    )
    assert (
        inbox.subjects("root@example.com").count(f"[audit watch] cancelled: job {idle} (idle-gpu)")
        == 1
    )
    assert inbox.titles().count(f"[audit watch] warning: job {idle} (idle-gpu)") == 1
    assert inbox.titles().count(f"[audit watch] cancelled: job {idle} (idle-gpu)") == 1
    for name in ("busy", "outside"):
        assert not any(f"job {jobs[name]} " in s for s in inbox.subjects() + inbox.titles())
    silent = jobs["silent"]
    assert inbox.subjects().count(f"[audit watch] warning: job {silent} (idle-gpu)") == 1
    assert not any(f"cancelled: job {silent} " in s for s in inbox.subjects() + inbox.titles())
    mail = next(
        m for m in inbox.mails if m["subject"].startswith(f"[audit watch] warning: job {idle}")
    )
    assert (
        "2 GPUs at $2.00/GPU-h (default (card model unknown)) = $4.00 for every hour"
        in mail["body"]
    )
    assert f"scancel {idle}" in mail["body"] and "CANCELLED at" in mail["body"]
    # recorded: the warning period was kept
    rows = actions(db)
    warns = [r[4] for r in rows if r[0] == idle and r[1] == "warn" and r[2] == "sent"]
    cancels = [r for r in rows if r[0] == idle and r[1] == "cancel"]
    assert len(cancels) == 1 and cancels[0][2] == "cancelled"
    assert (cancels[0][4] - min(warns)).total_seconds() >= CANCEL_AFTER
    # shown by audit status and the report of the week
    status = audit_cli(db, config, "status")
    assert "jobs cancelled 1" in status and "warnings sent 4" in status, status
    day = cancels[0][4].date()
    report = audit_cli(
        db,
        config,
        "report",
        "weekly",
        "--format",
        "md",
        "--since",
        f"{day}",
        "--until",
        f"{day + timedelta(days=1)}",
    )
    assert "Waste stopped this week: 1 jobs cancelled after warning (1 idle)" in report, report
    assert "would have held its GPUs until its time limit" in report


def audit_cli(db, config, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "audit", "--db", str(db), "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_dry_run_cancels_nothing_and_reminds_once(parts):
    slurm, inbox = parts["slurm"], parts["inbox"]
    config, db = write_config(parts), parts["tmp"] / "audit.duckdb"
    jobs = start_jobs(parts)
    log = parts["tmp"] / "watch.log"
    watch = WatchProcess(db, config, slurm.env, log=log)  # no --enforce
    idle = jobs["idle"]
    try:
        wait_for(lambda: warned(inbox, idle), 60, "the warning", log)
        # other commands share the warehouse meanwhile (the watch holds it only during an
        # interval), under the usual lock
        assert "watch: last run #1" in audit_cli(db, config, "status")
        assert audit_cli(db, config, "sql", "select count(*) from jobs").strip()
        wait_for(
            lambda: f"dry run: would cancel job {idle}" in watch.output(), 90, "the dry run", log
        )
        time.sleep(5)  # more intervals: no second reminder
    finally:
        assert watch.stop(signal.SIGINT) == 130
    assert all(slurm.state(job) == "RUNNING" for job in jobs.values())
    subjects = inbox.subjects("root@example.com")
    assert subjects.count(f"[audit watch] warning: job {idle} (idle-gpu)") == 1
    assert (
        subjects.count(f"[audit watch] reminder: the warning period is over: job {idle} (idle-gpu)")
        == 1
    )
    assert not [r for r in actions(db) if r[1] == "cancel"]
    would = [r for r in actions(db) if r[1] == "would_cancel"]
    assert {r[0] for r in would} >= {idle} and len([r for r in would if r[0] == idle]) == 1


def test_stopped_and_started_again_keeps_the_warning_period(parts):
    """SIGTERM after the warning, a pause of most of the warning period, a new watch: it
    does not warn again and cancels when the first warning's period ends."""
    slurm, inbox = parts["slurm"], parts["inbox"]
    config, db = write_config(parts), parts["tmp"] / "audit.duckdb"
    jobs = start_jobs(parts)
    idle = jobs["idle"]
    log = parts["tmp"] / "watch.log"
    first = WatchProcess(db, config, slurm.env, "--enforce", log=log)
    try:
        wait_for(lambda: warned(inbox, idle), 60, "the warning", log)
    finally:
        assert first.stop() == 143
    time.sleep(CANCEL_AFTER - 3)
    assert slurm.state(idle) == "RUNNING"
    restarted = time.monotonic()
    second = WatchProcess(db, config, slurm.env, "--enforce", log=log)
    try:
        wait_for(lambda: slurm.state(idle) == "CANCELLED", 60, "the cancellation", log)
    finally:
        second.stop()
    # The restart leaves a gap in the scraped telemetry, so the job is judged idle again
    # WARN_AFTER after it; then the first warning's deadline has passed: cancelled at once,
    # not a whole new warning period later (that would take WARN_AFTER + CANCEL_AFTER).
    assert time.monotonic() - restarted < WARN_AFTER + CANCEL_AFTER - 3
    # stopped at once after the cancellation: its notices wait in the outbox, and the next
    # run sends them (once)
    notice = f"[audit watch] cancelled: job {idle} (idle-gpu)"
    unsent = [r for r in actions(db) if r[0] == idle and r[1] == "remind" and r[2] != "sent"]
    assert len(unsent) + inbox.subjects().count(notice) + inbox.titles().count(notice) == 2
    third = WatchProcess(db, config, slurm.env, "--once", log=log)
    assert third.proc.wait(timeout=120) == 0
    for where in (inbox.subjects("root@example.com"), inbox.titles()):
        assert where.count(f"[audit watch] warning: job {idle} (idle-gpu)") == 1
        assert where.count(notice) == 1
    with duckdb.connect(str(db), read_only=True) as con:
        outcomes = con.execute(
            "SELECT invocation_id, outcome FROM watch_invocations ORDER BY 1"
        ).fetchall()
    assert outcomes == [(1, "interrupted"), (2, "interrupted"), (3, "stopped")]


def test_killed_at_random_moments_loses_and_repeats_nothing(parts):
    """kill -9 at moments spread over the run, a new watch each time: the idle job is
    cancelled once, each recipient hears of each step once (a message may come twice only
    where the record shows the kill cut its attempt)."""
    slurm, inbox = parts["slurm"], parts["inbox"]
    config, db = write_config(parts), parts["tmp"] / "audit.duckdb"
    jobs = start_jobs(parts)
    idle = jobs["idle"]
    log = parts["tmp"] / "watch.log"
    deadline = time.monotonic() + 120
    kills = 0
    while slurm.state(idle) != "CANCELLED" and time.monotonic() < deadline:
        watch = WatchProcess(db, config, slurm.env, "--enforce", log=log)
        time.sleep(1.3 + 0.9 * kills)  # into the middle of an interval, later each time
        watch.stop(signal.SIGKILL)
        kills += 1
    final = WatchProcess(db, config, slurm.env, "--enforce", log=log)
    try:
        wait_for(lambda: slurm.state(idle) == "CANCELLED", 60, "the cancellation", log)
        time.sleep(3)
    finally:
        final.stop()
    rows = [r for r in actions(db) if r[0] == idle]
    assert [r[2] for r in rows if r[1] == "cancel" and r[2] != "interrupted"] == ["cancelled"]
    # an attempt a kill cut short is marked, and only such a message may have come twice
    cut = {(r[1], r[3]) for r in rows if "stopped during" in (r[5] or "")}
    for step, subject in (("warn", "warning"), ("remind", "cancelled")):
        title = f"[audit watch] {subject}: job {idle} (idle-gpu)"
        allowed_mail = 2 if (step, "root@example.com") in cut else 1
        assert 1 <= inbox.subjects("root@example.com").count(title) <= allowed_mail, (kills, rows)
        hook = next(r[3] for r in rows if r[3] and r[3].startswith("json://"))
        allowed_hook = 2 if (step, hook) in cut else 1
        assert 1 <= inbox.titles().count(title) <= allowed_hook, (kills, rows)
    assert kills >= 2


def test_unreachable_slurm_is_not_a_cancelled_job(parts, tmp_path):
    """With the controller unreachable nothing is judged, resolved or cancelled."""
    slurm = parts["slurm"]
    config, db = write_config(parts), parts["tmp"] / "audit.duckdb"
    jobs = start_jobs(parts)
    log = parts["tmp"] / "watch.log"
    watch = WatchProcess(db, config, slurm.env, "--enforce", log=log)
    try:
        wait_for(lambda: warned(parts["inbox"], jobs["idle"]), 60, "the warning", log)
    finally:
        watch.stop()
    broken = tmp_path / "broken.conf"
    broken.write_text(
        slurm.conf.read_text().replace(
            f"SlurmctldPort={slurm.ports['slurmctld']}", "SlurmctldPort=1"
        )
    )
    env = {**slurm.env, "SLURM_CONF": str(broken)}
    once = WatchProcess(db, config, env, "--enforce", "--once", log=log)
    assert once.proc.wait(timeout=120) == 0
    out = once.output()
    assert "warning: slurm:" in out and "trying again next interval" in out
    assert "no job list from Slurm this interval: nothing judged" in out
    assert [r for r in actions(db) if r[1] in ("resolve", "cancel")] == []
    assert slurm.state(jobs["idle"]) == "RUNNING"


def test_sources_and_records_are_in_the_warehouse(parts):
    slurm = parts["slurm"]
    config, db = write_config(parts), parts["tmp"] / "audit.duckdb"
    jobs = start_jobs(parts)
    log = parts["tmp"] / "watch.log"
    once = WatchProcess(db, config, slurm.env, "--once", log=log)
    assert once.proc.wait(timeout=120) == 0, once.output()
    with duckdb.connect(str(db), read_only=True) as con:
        stored = dict(con.execute("SELECT job_id, gpus FROM jobs").fetchall())
        indices = con.execute("SELECT job_id, count(*) FROM job_gpus GROUP BY 1").fetchall()
        samples = con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0]
        kinds = {r[0] for r in con.execute("SELECT DISTINCT kind FROM file_imports").fetchall()}
    assert {stored[jobs[n]] for n in ("idle", "busy")} == {2}
    assert dict(indices)[jobs["idle"]] == 2
    assert samples >= 8
    assert {"slurm-live", "dcgm-live", "slurm"} <= kinds, once.output()


def test_run_policies_act_on_the_linked_jobs(parts):
    """STB001 and DUP001 through their library code: the job of a run whose KL blew up is
    warned and cancelled; the job of a launch repeating a finished configuration is warned,
    and, its policy not enforcing, named as what would be cancelled."""
    from audit.testing import T0, build_warehouse

    slurm, inbox = parts["slurm"], parts["inbox"]
    unstable, repeat = slurm.submit(1, "grpo"), slurm.submit(1, "sft-again")
    for job in (unstable, repeat):
        assert slurm.wait_state(job, {"RUNNING"}) == "RUNNING"
    now = (datetime.now(UTC).replace(tzinfo=None) - T0).total_seconds() / 3600
    config = parts["tmp"] / "audit.toml"
    same = {"method": "sft", "learning_rate": "2e-05", "dataset": "codeedit-v3"}
    wh, _ = build_warehouse(
        parts["tmp"] / "audit.duckdb",
        {
            "runs": [
                {
                    "run_id": "a",
                    "name": "grpo",
                    "status": "RUNNING",
                    "start": now - 2,
                    "end": None,
                    "params": {"method": "rl", "num_gpus": 1},
                    "tags": {"slurm_job_id": unstable},
                    "metrics": {
                        "kl": {
                            "steps": [0, 1000, 20],
                            "hours": [now - 2, now - 0.01],
                            "values": [[0, 0.01], [400, 1.5]],
                        }
                    },
                },
                {"run_id": "b", "name": "sft", "start": now - 20, "end": now - 10, "params": same},
                {
                    "run_id": "c",
                    "name": "sft-again",
                    "status": "RUNNING",
                    "start": now - 1,
                    "end": None,
                    "params": same,
                    "tags": {"slurm_job_id": repeat},
                },
            ]
        },
    )
    wh.close()
    config.write_text(
        f"""
[watch]
interval = "2s"
[watch.notify]
email_url = "mailto://127.0.0.1:{parts["smtp"]}?from=audit@example.com&mode=insecure"
mail_domain = "example.com"
[watch.policy.diverged]
kind = "unstable"
cancel_after = "4s"
enforce = true
[watch.policy.repeats]
kind = "duplicate_launch"
cancel_after = "4s"
"""
    )
    log = parts["tmp"] / "watch.log"
    watch = WatchProcess(parts["tmp"] / "audit.duckdb", config, slurm.env, "--enforce", log=log)
    try:
        wait_for(lambda: slurm.state(unstable) == "CANCELLED", 90, "the cancellation", log)
        wait_for(
            lambda: f"dry run: would cancel job {repeat}" in watch.output(), 60, "the dry run", log
        )
        wait_for(lambda: len(inbox.mails) >= 4, 30, "the messages", log)
    finally:
        watch.stop()
    assert slurm.state(repeat) == "RUNNING"
    subjects = inbox.subjects("root@example.com")
    assert subjects.count(f"[audit watch] warning: job {unstable} (diverged)") == 1
    assert subjects.count(f"[audit watch] cancelled: job {unstable} (diverged)") == 1
    assert subjects.count(f"[audit watch] warning: job {repeat} (repeats)") == 1
    body = next(m["body"] for m in inbox.mails if f"job {unstable} (diverged)" in m["subject"])
    assert "KL blow-up in kl at step 400" in body
    assert "[policy has enforce = false]" in watch.output()

"""One interval of ``audit watch``, and the loop that repeats it.

Each interval: read every live source into the warehouse (a source that fails is reported
and tried again next time; the others go on), judge the live policies, then act in steps
per finding: open it, warn each recipient once, and when the policy's warning period has
passed either cancel (``--enforce`` and ``enforce = true``) or say what would be cancelled,
with one reminder on that escalation. The warehouse is opened for an interval and closed
between intervals, so imports, scans and reports of other commands share it under the
usual lock. Ctrl-C and SIGTERM end the watch between steps: an action (a message and its
record, a cancellation and its record) is never cut in two by them.
"""

from __future__ import annotations

import glob
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from audit import interrupts
from audit.atomic import warehouse_lock
from audit.config import Config
from audit.errors import AuditError, InputError
from audit.importers.live import (
    SourceError,
    follow_files,
    import_live_jobs,
    import_sacct_since,
    read_controller,
    run_command,
    sacct_window,
    scrape_endpoints,
)
from audit.suppressions import Suppressions
from audit.warehouse import open_warehouse
from audit.watch import records
from audit.watch.messages import compose
from audit.watch.notify import Notifier, Recipient, recipient_for, recipients
from audit.watch.policies import (
    LiveFinding,
    Verdicts,
    duration,
    judge_idle,
    judge_runs,
    live_jobs,
)
from audit.watch.settings import WatchSettings
from audit.windows import now_utc

SACCT_CURSOR = "sacct --json"


@dataclass
class IntervalReport:
    lines: list[str] = field(default_factory=list)  # what was read and done
    problems: list[str] = field(default_factory=list)  # sources that failed, sends that failed
    notes: list[str] = field(default_factory=list)  # jobs not judged, and why


@contextmanager
def one_step() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the step ends, then stop the watch."""
    with interrupts.held():
        yield
    if interrupts.requested():
        raise KeyboardInterrupt


def watch_lock(db: Path):
    """One watch per warehouse (``<warehouse>.watch-lock``): two would warn twice."""
    return warehouse_lock(
        db, "watch", f"another audit watch is running on {db} ({{lock}} is locked)"
    )


class Watch:
    def __init__(
        self,
        db: Path,
        config: Config,
        enforce: bool,
        echo: Callable[[str], None],
        err: Callable[[str], None],
    ):
        self.db = db
        self.config = config
        self.settings: WatchSettings = config.watch
        self.enforce = enforce
        self.echo, self.err = echo, err
        self.notifier = Notifier(self.settings.notify)
        self.sacct = self.settings.sacct and bool(self.settings.slurm)
        self.invocation = 0
        self.intervals = 0
        self._said: set[str] = set()  # notes already shown (each once while it holds)

    # -- the loop -------------------------------------------------------------------------
    def start(self, once: bool) -> None:
        with open_warehouse(self.db, create=True) as wh:
            self.invocation = records.start_invocation(wh, self.enforce, once, self.config.digest)

    def finish(self, outcome: str) -> None:
        with interrupts.held(), open_warehouse(self.db, create=True) as wh:
            records.end_invocation(wh, self.invocation, self.intervals, outcome)

    def run(self, once: bool, interval: float) -> None:
        next_at = time.monotonic()
        while True:
            report = self.interval()
            self.intervals += 1
            self._show(report)
            if once:
                return
            next_at += interval
            while next_at <= time.monotonic():  # an interval longer than the period: skip
                next_at += interval
            time.sleep(max(next_at - time.monotonic(), 0))

    def _show(self, report: IntervalReport) -> None:
        stamp = f"{now_utc():%Y-%m-%d %H:%M:%S}"
        for line in report.lines:
            self.echo(f"{stamp} {line}")
        for problem in report.problems:
            self.err(f"{stamp} warning: {problem}")
        current = set(report.notes)
        for note in report.notes:
            if note not in self._said:
                self.echo(f"{stamp} note: {note}")
        self._said = current

    # -- one interval ---------------------------------------------------------------------
    def interval(self) -> IntervalReport:
        report = IntervalReport()
        try:
            wh = open_warehouse(self.db, create=True)
        except AuditError as exc:  # busy beyond the lock wait: try again next interval
            report.problems.append(f"warehouse: {exc}; trying again next interval")
            return report
        with wh:
            live = self._read_sources(wh, report)
            if live is None:
                if self.settings.slurm:
                    report.notes.append("no job list from Slurm this interval: nothing judged")
                self._flush(wh, report)  # what earlier intervals queued still goes out
                return report
            with one_step():
                records.count_interval(wh, self.invocation, self.intervals + 1)
            self._judge_and_act(wh, live, report)
        return report

    def _read_sources(self, wh, report: IntervalReport):
        s = self.settings
        live = None
        if s.slurm:
            try:
                with one_step():
                    live = read_controller(s.slurm, self.config, s.cluster, s.command_timeout)
                    import_live_jobs(wh, live, self.config)
                report.lines.append(
                    f"slurm: {live.jobs.height} jobs ({len(live.holding)} holding an allocation; "
                    f"{live.layout})"
                )
            except (SourceError, InputError) as exc:
                live = None
                report.problems.append(f"slurm: {exc}; trying again next interval")
        if self.sacct and live is not None:
            self._read_accounting(wh, report)
        if s.nvidia_smi:
            # relative patterns and folders are relative to the config file, as in [links]
            paths = sorted(
                {
                    Path(p)
                    for pattern in s.nvidia_smi
                    for p in glob.glob(self.config.local_path(pattern))
                }
            )
            self._source(report, "nvidia-smi", lambda: follow_files(wh, paths, self.config))
        if s.dcgm:
            self._source(
                report,
                "dcgm",
                lambda: scrape_endpoints(wh, list(s.dcgm), self.config, s.command_timeout),
            )
        for uri in s.mlflow:
            from audit.importers.mlflow import import_mlflow

            self._source(
                report, f"mlflow {uri}", lambda uri=uri: import_mlflow(wh, uri, None, self.config)
            )
        if s.wandb:
            from audit.importers.wandb import import_wandb

            paths = [Path(self.config.local_path(p)) for p in s.wandb]
            self._source(report, "wandb", lambda: import_wandb(wh, paths, self.config))
        # A Prometheus server becomes one more source here: a reader that imports its
        # range query for the interval, called like the ones above.
        return live

    def _source(self, report: IntervalReport, name: str, read) -> None:
        try:
            with one_step():
                summary = read()
            report.lines.append(f"{name}: {summary.line()}")
        except (SourceError, InputError) as exc:
            report.problems.append(f"{name}: {exc}; trying again next interval")

    def _read_accounting(self, wh, report: IntervalReport) -> None:
        last = wh.scalar("SELECT updated_at FROM watch_cursors WHERE location = ?", [SACCT_CURSOR])
        now = now_utc()
        since = sacct_window(last, now, self.settings.interval)
        since = max(since, now - timedelta(seconds=self.settings.lookback))
        try:
            with one_step():
                summary = import_sacct_since(
                    wh, self.config, since, self.settings.cluster, self.settings.command_timeout
                )
                with wh.transaction() as con:
                    con.execute("DELETE FROM watch_cursors WHERE location = ?", [SACCT_CURSOR])
                    con.execute(
                        "INSERT INTO watch_cursors VALUES (?, 0, '', ?)", [SACCT_CURSOR, now]
                    )
            report.lines.append(f"sacct: {summary.line()}")
        except (SourceError, InputError) as exc:
            if "accounting storage is disabled" in str(exc).lower():
                self.sacct = False  # a site without slurmdbd: the controller's list alone
                report.problems.append(
                    "sacct: Slurm accounting is disabled here; ended jobs are read from the "
                    f"controller's list only (kept for MinJobAge) ({exc})"
                )
            else:
                report.problems.append(f"sacct: {exc}; trying again next interval")

    def _judge_and_act(self, wh, live, report: IntervalReport) -> None:
        s = self.settings
        con = wh.con
        now = now_utc()
        jobs = live_jobs(con, live, self.config)
        verdicts = Verdicts()
        for policy in s.policies:
            if policy.kind == "idle":
                judge_idle(con, policy, jobs, live, s, self.config, now, verdicts)
        run_policies = [p for p in s.policies if p.rule]
        judge_runs(con, run_policies, jobs, s, self.config, now, verdicts)
        report.notes.extend(verdicts.notes)
        suppressions = Suppressions.load(con, self.config)
        findings = []
        for finding in verdicts.findings:
            why = _exempt(suppressions, finding)
            if why:
                report.notes.append(
                    f"{finding.policy.name}: job {finding.job.job_id} exempt ({why})"
                )
                continue
            findings.append(finding)
        found = {f.key for f in findings}
        state = records.episodes(con, sorted(found))
        for finding in findings:
            self._act(wh, finding, state[finding.key], now, report)
        self._resolve(wh, live, found, verdicts, report)
        self._flush(wh, report)

    # -- acting in steps --------------------------------------------------------------------
    def _act(
        self, wh, finding: LiveFinding, episode: records.Episode, now: datetime, report
    ) -> None:
        policy, job = finding.policy, finding.job
        will_cancel = self.enforce and policy.enforce
        if episode.cancelled:
            return
        if not episode.opened:
            with one_step():
                records.record(
                    wh,
                    self.invocation,
                    finding,
                    "open",
                    "done",
                    message=finding.message,
                    evidence=finding.evidence,
                )
            report.lines.append(f"{policy.name}: {finding.message}")
        people = recipients(self.settings.notify, policy, job.user, job.team)
        if not people:
            report.notes.append(
                f"{policy.name}: job {job.job_id}: nobody to warn (no [watch.notify] recipient "
                "for its user or team): it is never cancelled"
            )
            return
        deadline = now + timedelta(seconds=policy.cancel_after)
        title, body = compose("warn", finding, will_cancel, deadline)
        new = [(p.label, f"{title}\n{body}") for p in people if p.label not in episode.warned]
        if new:
            with one_step():
                records.queue(wh, self.invocation, finding, "warn", new)
        if episode.warned_at is None:
            return  # the period runs from the first warning sent
        if now < episode.warned_at + timedelta(seconds=policy.cancel_after):
            return
        if will_cancel:
            self._cancel(wh, finding, episode, people, report)
            return
        what = (
            f"dry run: would cancel job {job.job_id} ({policy.name}, warned "
            f"{duration((now - episode.warned_at).total_seconds())} ago): {finding.message}"
            + ("" if policy.enforce else " [policy has enforce = false]")
            + ("" if self.enforce else " [watch runs without --enforce]")
        )
        report.lines.append(what)
        if not episode.would_cancel:
            title, body = compose("remind", finding, False, now)
            with one_step():
                records.record(
                    wh,
                    self.invocation,
                    finding,
                    "would_cancel",
                    "done",
                    message=what,
                    evidence=finding.evidence,
                    saved_gpu_hours=_time_left(finding, now),
                )
                records.queue(
                    wh,
                    self.invocation,
                    finding,
                    "remind",
                    [
                        (p.label, f"{title}\n{body}")
                        for p in people
                        if p.label not in episode.reminded
                    ],
                )

    def _cancel(self, wh, finding: LiveFinding, episode, people, report) -> None:
        job = finding.job
        now = now_utc()
        reason = (
            f"audit watch: cancelled by policy {finding.policy.name} ({finding.policy.kind}) "
            f"at {now:%Y-%m-%d %H:%M} UTC after a warning: {finding.message}"
        )[:1000]
        title, body = compose("cancelled", finding, True, now)
        notices = [(p.label, f"{title}\n{body}") for p in people if p.label not in episode.reminded]
        timeout = self.settings.command_timeout
        with one_step():
            action_id = records.begin_cancel(
                wh, self.invocation, finding, reason, _time_left(finding, now), notices
            )
            problem = None
            try:
                if self.settings.comment_field:
                    field = self.settings.comment_field
                    run_command(
                        ["scontrol", "update", f"JobId={job.job_id}", f"{field}={reason}"], timeout
                    )
                run_command(["scancel", job.job_id], timeout)
            except SourceError as exc:
                problem = str(exc)
            records.finish_cancel(wh, action_id, finding.key, problem)
        if problem:
            report.problems.append(
                f"{finding.policy.name}: cancelling job {job.job_id} failed ({problem}); "
                "trying again next interval"
            )
            return
        report.lines.append(f"{finding.policy.name}: cancelled job {job.job_id}: {finding.message}")

    def _flush(self, wh, report) -> None:
        """Send every queued message (and those a failure or a stop left unsent)."""
        urls = self._urls()
        for action_id, policy, job_id, label, text in records.outbox(wh.con):
            title, _, body = text.partition("\n")
            with one_step():
                records.set_status(wh, action_id, "sending")
                person = _recipient_of(label, urls, self.settings)
                problem = self.notifier.send(person, title, body)
                records.set_status(wh, action_id, "failed" if problem else "sent", problem)
            if problem:
                report.problems.append(
                    f"{policy}: job {job_id}: message to {label} not sent ({problem}); "
                    "trying again next interval"
                )
            else:
                report.lines.append(f"{policy}: job {job_id}: sent to {label}: {title}")

    def _urls(self) -> dict[str, str]:
        """Recorded label -> apprise URL, for every URL the config names."""
        from audit.watch.notify import shown_url

        n = self.settings.notify
        every = [*n.urls, *n.users.values(), *n.teams.values()]
        every += [u for policy in self.settings.policies for u in policy.notify]
        return {shown_url(u): u for u in every if "://" in u}

    def _resolve(self, wh, live, found: set[str], verdicts: Verdicts, report) -> None:
        """Close findings whose job no longer holds its allocation, or that were judged
        again with full evidence and did not hold; never on missing evidence."""
        states = dict(live.jobs.select("job_id", "state").iter_rows())
        for key, policy, kind, cluster, job_id in records.open_episodes(wh.con):
            if key in found or cluster != self.settings.cluster:
                continue
            if job_id not in live.holding:
                cut = records.cut_cancellation(wh.con, key)
                if cut is not None and states.get(job_id) == "CANCELLED":
                    with one_step():  # the stopped attempt did cancel it: its notices go out
                        records.finish_cancel(
                            wh,
                            cut,
                            key,
                            None,
                            "confirmed CANCELLED by Slurm after the watch stopped",
                        )
                    report.lines.append(f"{policy}: job {job_id} was cancelled (confirmed)")
                    continue
                why = f"job {job_id} ended ({states.get(job_id, 'left the job list')})"
            elif key in verdicts.cleared or (kind != "idle" and policy in verdicts.ran):
                why = f"job {job_id}: no longer found by {policy}"
            else:
                continue
            with one_step():
                records.resolve(wh, self.invocation, key, policy, kind, cluster, job_id, why)
            report.lines.append(f"{policy}: {why}")


def _recipient_of(label: str, urls: dict[str, str], settings: WatchSettings) -> Recipient:
    if label in urls:
        return Recipient(label, urls[label])
    if "://" in label:  # a URL no longer in the config
        return Recipient(label, None, "no longer in [watch.notify]")
    return recipient_for(label, settings.notify)


def _time_left(finding: LiveFinding, now: datetime) -> float | None:
    """GPU-hours the job would still have held had it run to its time limit (the
    counterfactual of a cancellation); None without a limit."""
    end = finding.job.limit_end
    if end is None:
        return None
    return round(finding.job.gpus * max((end - now).total_seconds(), 0) / 3600, 4)


def _exempt(suppressions: Suppressions, finding: LiveFinding) -> str | None:
    """A ``[[suppress]]`` entry with rule ``WATCH`` (every policy) or the policy's name,
    or the run tag ``audit.ignore=WATCH``, exempts a job; a run policy's finding muted for
    its rule is exempt too."""
    subject = {
        "cluster": finding.job.cluster,
        "job_id": finding.job.job_id,
        "user": finding.job.user,
        "run_id": finding.run_id,
    }
    why = suppressions.reason(finding.policy.name.upper(), "WATCH", subject)
    rule = finding.evidence.get("rule")
    if why is None and rule:
        why = suppressions.reason(rule, rule[:3], subject)
    return why

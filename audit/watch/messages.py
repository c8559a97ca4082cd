"""The words of a watch message: what was found, what is at stake, what happens next and
what the user can do. Plain text, the same for e-mail, chat and webhooks."""

from __future__ import annotations

import json
from datetime import datetime

from audit.watch.policies import LiveFinding

WHAT_TO_DO = {
    "idle": [
        "if the job is done with its GPUs, cancel it: scancel {job}",
        "if it needs fewer GPUs, resubmit it with fewer (--gres=gpu:N)",
        "if the GPUs are idle on purpose, reply with why: an administrator can exempt the job",
    ],
    "unstable": [
        "stop it (scancel {job}) and resume from the last checkpoint before the onset with a "
        "lower learning rate, a larger KL coefficient or tighter clipping",
        "if the change is intended (a new phase), reply with why: an administrator can exempt it",
    ],
    "red_line": [
        "stop it (scancel {job}): a model below a red line cannot ship whatever else it gains",
        "mix safety data back in and gate each evaluation on the red lines (audit gate)",
        "if the drop is evaluation noise, reply with why: an administrator can exempt it",
    ],
    "duplicate_launch": [
        "reuse the earlier result (audit runs similar --run RUN_ID) and cancel this one: "
        "scancel {job}",
        "if the repeat is deliberate (a reproducibility check), tag the run audit.ignore=DUP001",
    ],
}


def compose(step: str, finding: LiveFinding, will_cancel: bool, at: datetime) -> tuple[str, str]:
    """(title, body) of a ``warn``, a ``remind`` (warning period over, not cancelled) or
    a ``cancelled`` notice."""
    policy, job = finding.policy, finding.job
    head = {
        "warn": "warning",
        "remind": "reminder: the warning period is over",
        "cancelled": "cancelled",
    }[step]
    title = f"[audit watch] {head}: job {job.job_id} ({policy.name})"
    if step == "warn":
        next_step = (
            f"It will be CANCELLED at {at:%Y-%m-%d %H:%M} UTC unless this stops holding."
            if will_cancel
            else "This watch does not cancel it; please act on it."
        )
    elif step == "cancelled":
        next_step = f"It was cancelled at {at:%Y-%m-%d %H:%M} UTC, after the warning."
    else:
        next_step = "It would have been cancelled now; it keeps running while this holds."
    stake = (
        f"At stake: {job.gpus} GPU{'s' if job.gpus != 1 else ''} at "
        f"${finding.usd_per_hour / max(job.gpus, 1):.2f}/GPU-h ({finding.price_key}) = "
        f"${finding.usd_per_hour:,.2f} for every hour it holds them"
        if finding.usd_per_hour is not None
        else "At stake: unknown (no price for its GPUs)"
    )
    limit = job.limit_end
    if limit is not None:
        stake += f"; ${finding.usd_per_hour * max((limit - at).total_seconds(), 0) / 3600:,.2f} to its time limit ({limit:%Y-%m-%d %H:%M} UTC)"
    todo = "\n".join(f"  - {line.format(job=job.job_id)}" for line in WHAT_TO_DO[policy.kind])
    evidence = json.dumps(finding.evidence, default=str, sort_keys=True, indent=1)
    if len(evidence) > 4000:
        evidence = evidence[:4000] + "\n  ..."
    body = (
        f"Hello {job.user or 'there'},\n\n"
        f"{finding.message}\n\n"
        f"Job {job.job_id} ({job.name or 'unnamed'}) of user {job.user or '?'}, account "
        f"{job.account or '?'}, partition {job.partition or '?'}, team {job.team or '?'}; "
        f"policy {policy.name} ({policy.kind}).\n"
        f"{stake}.\n"
        f"{next_step}\n\n"
        f"What you can do:\n{todo}\n\n"
        f"Evidence:\n{evidence}\n"
    )
    return title, body

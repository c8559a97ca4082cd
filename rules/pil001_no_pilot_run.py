from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, Threshold, Waste, needing

from ._shared import recipes, regressed_runs
from ._stability import unstable_runs

BAD_JOB_STATES = ("FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED")


class NoPilotRun(Rule):
    """A large run of a recipe nobody had tried at a smaller size first.

    What it detects:
    Training runs of at least `large_gpus` GPUs or `large_gpu_hours` GPU-hours whose
    configuration family (`[attribution] family_keys`, default method, base model and
    dataset) had no earlier, smaller run: no pilot. A pilot of `pilot_gpus` GPUs for
    `pilot_hours` shows only what goes wrong within its first `pilot_hours`: when the large
    run crashed, was killed or ran out of memory within that time from its start, or its
    training went unstable (STB001's onset) or regressed (REG002's crossing) that early,
    the finding claims the run's cost minus the pilot's: what a pilot would have saved.
    A failure that came later (a crash after 34 hours) is one a pilot would not plausibly
    have shown: the finding is a hint that names the GPU-hours at risk, and so is a first
    large run that went well.

    Why it is waste:
    A configuration error, a diverging learning rate or a missing dataset field shows up
    in the first hour at 8 GPUs as well as at 512; found at full scale it costs the whole
    allocation. A pilot buys that knowledge for a small fraction of the price.

    Known false positives:
    Recipes piloted under another method, base model or dataset name (align the names, or
    set `[attribution] family_keys`), pilots run outside the tracker, and failures that had
    nothing to do with the recipe (a node failure: tag the run `audit.ignore=PIL001`).

    Example:
    `rl-llama-tools-grpo` (RL, llama3.1-8b, toolcalls-v1) ran 30 h on 8 GPUs as the first
    run of its family and failed: 240 GPU-h − a pilot's 8 GPUs × 1 h = 232 GPU-h.

    How to fix:
    Launch every new recipe first at one node for an hour (a few hundred steps), check its
    loss, KL and throughput, then scale it up.

    References:
    The monitoring and governance advice for post-training teams (pilot experiments before
    large ones).
    """

    code = "PIL001"
    name = "no-pilot-run"
    severity = Severity.HIGH
    family_label = "missing pilots"
    reads_shared = frozenset(
        {
            "PIL001 families",
            "evaluation runs",
            "facts",
            "recipes",
            "regressed-runs",
            "stability-points",
            "stability-series",
            "unstable-runs",
        }
    )
    needs = needing("runs")
    thresholds = {
        "large_gpus": Threshold(
            32,
            "a run on at least this many GPUs is large (four 8-GPU nodes: multi-node)",
            1,
            unit="GPUs",
        ),
        "large_gpu_hours": Threshold(
            256,
            "a run of at least this many GPU-hours is large (one 8-GPU node for 32 h)",
            0,
            unit="GPU-h",
        ),
        "pilot_gpus": Threshold(
            8, "GPUs of the pilot the large run should have had (one node)", 1, unit="GPUs"
        ),
        "pilot_hours": Threshold(
            1.0,
            "duration of that pilot (start-up, a few hundred steps and a checkpoint)",
            0,
            unit="h",
        ),
    }
    recommendation = "Pilot a new recipe at one node for an hour before launching it at scale."

    def check(self, ctx: RuleContext):
        found = recipes(ctx)
        unstable = unstable_runs(ctx)
        regressed = regressed_runs(ctx)
        large_gpus, large_hours = ctx.thresholds["large_gpus"], ctx.thresholds["large_gpu_hours"]
        families = ctx.once(("PIL001 families",), lambda: _families(ctx, found))
        for run in ctx.facts.runs_in(ctx.window):
            if (
                run.start_time is None
                or run.lifecycle_stage != "active"
                or not found.is_training(run)
            ):
                continue
            cost = run.cost
            if not cost.known:
                continue  # its size is unknown: nothing to judge
            if cost.gpus < large_gpus and cost.gpu_hours < large_hours:
                continue
            family = dict(found.family(run))
            if any(
                other.key != run.key
                and other.start_time is not None
                and other.start_time < run.start_time
                and (not other.cost.known or other.cost.gpu_hours < cost.gpu_hours)
                for other in families[tuple(sorted(family.items()))]
            ):
                continue  # a smaller earlier run of the recipe was its pilot
            horizon = ctx.thresholds["pilot_hours"]
            outcome, early = _outcome(run, unstable, regressed, horizon)
            pilot_gpus = min(ctx.thresholds["pilot_gpus"], cost.gpus)
            pilot_hours = min(horizon, cost.hours)
            pilot = pilot_gpus * pilot_hours
            size = f"{cost.gpus:g} GPUs × {cost.hours:.2f} h = {cost.gpu_hours:.1f} GPU-h"
            large = f"large: ≥ {large_gpus:g} GPUs or ≥ {large_hours:g} GPU-h"
            recipe = ", ".join(f"{k}={v}" for k, v in family.items())
            evidence = {
                "family": family,
                "size": size,
                "large_when": large,
                "earlier_runs_of_family": 0,
                "outcome": outcome,
                "pilot_horizon_hours": horizon,
                "cost_basis": cost.basis,
            }
            if not early:
                evidence["gpu_hours_at_risk"] = round(cost.gpu_hours, 3)
                if outcome is None:
                    evidence["formula"] = "hint only: the run went well, no waste is claimed"
                    went = f"{cost.gpu_hours:.1f} GPU-h were at risk without a pilot"
                else:
                    evidence["formula"] = (
                        f"hint only: it {outcome}, later than a {horizon:g}-h pilot would have "
                        "run, so a pilot would not plausibly have shown it; no waste is claimed"
                    )
                    went = (
                        f"it {outcome}, too late for a {horizon:g}-h pilot to have shown; "
                        f"{cost.gpu_hours:.1f} GPU-h were at risk"
                    )
                yield self.run_finding(
                    run,
                    message=(
                        f"run {run.name!r} ({size}, {large}) was the first run of its recipe "
                        f"({recipe}): {went}"
                    ),
                    evidence=evidence,
                    severity=Severity.INFO,
                    risk_gpu_hours=cost.gpu_hours,
                )
                continue
            waste = max(cost.gpu_hours - pilot, 0.0)
            evidence["pilot"] = f"{pilot_gpus:g} GPUs × {pilot_hours:.2f} h = {pilot:.1f} GPU-h"
            evidence["formula"] = (
                f"it {outcome}, within a {horizon:g}-h pilot's horizon: "
                f"{cost.gpu_hours:.2f} GPU-h of the run − {pilot:.2f} GPU-h of a pilot = "
                f"{cost.formula(waste)}"
            )
            yield self.run_finding(
                run,
                message=(
                    f"run {run.name!r} ({size}, {large}) was the first run of its recipe "
                    f"({recipe}) and {outcome}, which a {horizon:g}-h pilot would have shown: "
                    "no smaller run had tried it"
                ),
                evidence=evidence,
                cost=Waste(waste, waste * cost.price, basis=cost.basis),
            )


def _outcome(run, unstable: dict, regressed: dict, horizon: float) -> tuple[str | None, bool]:
    """How the large run went wrong (None when it did not), and whether it went wrong
    within ``horizon`` hours of its start: early enough for a pilot to have shown it."""
    hours = run.run_hours

    def early_at(moment) -> bool:
        if moment is None or run.start_time is None:
            return False
        return (moment - run.start_time).total_seconds() / 3600 <= horizon

    if run.key in unstable:
        signal = unstable[run.key][0]
        onset = signal.onset_time
        when = f" {(onset - run.start_time).total_seconds() / 3600:.1f} h in" if onset else ""
        return (
            f"went unstable ({signal.kind} in {signal.metric} at step {signal.onset_step}{when})",
            early_at(onset),
        )
    if run.status in ("FAILED", "KILLED") or run.job_state in BAD_JOB_STATES:
        state = (
            f"its Slurm job ended {run.job_state}"
            if run.job_state in BAD_JOB_STATES
            else f"ended {run.status}"
        )
        after = f" after {hours:.1f} h" if hours is not None else ""
        return f"{state}{after}", hours is not None and hours <= horizon
    if run.key in regressed:
        worst = min(regressed[run.key].items(), key=lambda kv: kv[1])
        return f"regressed ({worst[0]} {worst[1]:+.3f} against its baseline)", False
    return None, False


def _families(ctx: RuleContext, found) -> dict[tuple, list]:
    """Active training runs by recipe family, over all history (the same for every window)."""
    families: dict[tuple, list] = {}
    for run in ctx.facts.runs:
        if run.lifecycle_stage == "active" and found.is_training(run):
            families.setdefault(tuple(sorted(found.family(run).items())), []).append(run)
    return families

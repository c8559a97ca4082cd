from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, Skip, Threshold, Waste, needing
from audit.text import counted

from ._metrics import lookalike_metrics
from ._shared import evaluation_runs
from ._stability import (
    KINDS,
    LOOKALIKE_WORDS,
    chart_points,
    series_points,
    stability_names,
    unstable_runs,
)


class UnstableTraining(Rule):
    """Training went unstable (loss spike, NaN, KL blow-up, entropy or reward collapse) and went on.

    What it detects:
    Runs whose metric history shows an instability that lasted: a NaN or infinite loss or
    grad norm; a loss or grad norm at least `loss_spike_factor` / `grad_norm_factor` times
    its running median; a KL divergence at least `kl_factor` times its running median and
    above `kl_floor`; an entropy at or below `entropy_collapse_fraction` of its early
    level; a reward fallen below its early level by more than `reward_drop_fraction` of the
    range it had spanned; more than `truncation_max` of the responses cut at the length
    limit; more than `policy_clip_max` of the tokens clipped by the PPO trust region. The
    first `warmup_points` points are never an onset, and a signal counts only when it held
    for `sustain_points` logged points (or to the run's last point): a spike that recovered
    is not flagged. Metric names come from `[metrics] loss`, `grad_norm`, `kl`, `entropy`,
    `reward`, `truncation` and `policy_clip`, whose defaults cover TRL, verl, OpenRLHF,
    NeMo-RL and Megatron naming. When no metric matches any of them the rule says so
    once (skipped, naming the metrics that look like them).

    Why it is waste:
    A run that diverged at step 800 and trained on for two more days bought nothing after
    the onset: its checkpoints after the blow-up are thrown away and the run is redone. The
    waste is the allocation's GPU-hours (the run's GPUs as `audit.costs` finds them) from
    the onset plus a grace (time for a person or an alert to react: `grace_hours`, but at
    most `grace_fraction` of the run, so a 2-hour run is not judged by a 1-hour grace) to
    the run's end; a run stopped within the grace is not flagged. A log with steps and no
    clock times (an HF Trainer state) is judged by step: when the run's duration is known
    (`train_runtime`, `elapsed_time`), the hours after the onset are the steps after it
    over all its steps × that duration (stated as an estimate); when it is not, the
    finding names the steps and says the hours are unknown.

    Known false positives:
    A deliberate change of phase that moves a series (a new data mix, a learning-rate
    restart, an intended entropy drop in late RL), or very noisy rewards (raise
    `reward_drop_fraction`); tag the run `audit.ignore=STB001`. A KL estimator that logs
    per-sequence sums (larger numbers) may need a higher `kl_floor`.

    Example:
    `rl-qwen-grpo-lr5e-6`: `train/kl` 0.84 at step 360 (≥ 10 × running median 0.021 and
    ≥ 0.1), still above at the next points; training ran 6.5 h more on 8 GPUs: 8 × (10.0 h −
    3.0 h − 1 h grace) = 48 GPU-h.

    How to fix:
    Stop the run at the onset (an alert on these series, or `audit gate` style checks in
    the training loop), resume from the last checkpoint before it with a lower learning
    rate, a larger KL coefficient or tighter clipping; raise the response length limit when
    truncation is the signal.

    References:
    Megatron-LM's rerun state machine (spiky loss: 10 × the largest loss seen);
    TRL logging guide (values to watch for stability: diverging or collapsing to 0);
    verl `response_length/clip_ratio`; Yu et al., "DAPO" (2025), on entropy collapse.
    """

    code = "STB001"
    name = "unstable-training"
    severity = Severity.HIGH
    family_label = "unstable training"
    reads_shared = frozenset(
        {"evaluation runs", "facts", "stability-points", "stability-series", "unstable-runs"}
    )
    needs = needing("runs", "metrics")
    thresholds = {
        "warmup_points": Threshold(
            5, "logged points at the start that are never an onset (early steps move fast)", 0
        ),
        "sustain_points": Threshold(
            3,
            "consecutive abnormal points that make a signal (a spike that recovers, e.g. a skipped fp16 overflow step, is not one)",
            1,
        ),
        "grace_hours": Threshold(
            1.0, "time for an alert and a person to react after the onset: not waste", 0, unit="h"
        ),
        "grace_fraction": Threshold(
            0.1,
            "the grace is at most this share of the run's duration (an alert on a 2-hour run fires in minutes, not an hour)",
            0,
            1,
        ),
        "loss_spike_factor": Threshold(
            10.0, "loss ≥ this × its running median (Megatron-LM SPIKY_LOSS_FACTOR = 10)", 1
        ),
        "grad_norm_factor": Threshold(
            10.0, "grad norm ≥ this × its running median (Megatron-LM's spiky-loss factor)", 1
        ),
        "kl_factor": Threshold(
            10.0,
            "KL ≥ this × its running median and ≥ kl_floor (Megatron-LM's spiky-loss factor)",
            1,
        ),
        "kl_floor": Threshold(
            0.1,
            "a KL below this is never a blow-up (the top of the 0.01-0.1 per-token KL RLHF runs keep)",
            0,
            unit="nats",
        ),
        "entropy_collapse_fraction": Threshold(
            0.1,
            "entropy ≤ this × its early (warm-up) median: near zero is collapse (TRL logging guide, DAPO); relative because token entropy differs by model",
            0,
            1,
        ),
        "reward_drop_fraction": Threshold(
            0.5,
            "reward below its early median by this × the range it had spanned (half its progress lost and more)",
            0,
        ),
        "truncation_max": Threshold(
            0.1,
            "share of responses cut at the length limit (verl response_length/clip_ratio guidance)",
            0,
            1,
        ),
        "policy_clip_max": Threshold(
            0.3,
            "share of tokens clipped by the trust region (PPO clip fractions of 0.1-0.3 are usual; TRL: high clipfrac means too drastic updates)",
            0,
            1,
        ),
    }
    recommendation = "Alert on the stability series and stop at the onset; resume from the last good checkpoint with safer settings."

    def check(self, ctx: RuleContext):
        if not stability_names(ctx):
            globs = [g for kind in KINDS for g in ctx.metric_globs(kind)]
            lookalikes = lookalike_metrics(ctx, LOOKALIKE_WORDS, substrings=())
            seen = (
                "metric names that look like training-stability series here: "
                + ", ".join(f"{k} ({n} runs)" for k, n in lookalikes)
                if lookalikes
                else "no metric name here looks like one either"
            )
            raise Skip(
                f"no metric of any run matches the [metrics] loss, grad_norm, kl, entropy, "
                f"reward, truncation or policy_clip globs ({len(globs)} globs); {seen}. "
                "Set those keys to the names your trainer logs"
            )
        unstable = unstable_runs(ctx)
        # an evaluation run's loss curve is not a training instability
        evaluates = evaluation_runs(ctx).is_evaluation_run
        for run in ctx.facts.runs_in(ctx.window):
            signals = unstable.get(run.key)
            if not signals or evaluates(run):
                continue
            first = signals[0]
            points = series_points(ctx)[run.key][first.metric]
            span = self._after_onset(ctx, run, first, points)
            if span is None:
                continue  # stopped within the grace: what should happen
            after, went, how = span
            more = f"; {counted(len(signals) - 1, 'more signal')}" if len(signals) > 1 else ""
            evidence = {
                "signals": [s.as_json() for s in signals],
                "chart": {
                    "metric": first.metric,
                    "onset_step": first.onset_step,
                    "points": chart_points(points),
                },
            }
            if after is None:
                evidence["formula"] = (
                    f"{how}: the hours after the onset are unknown; no GPU-hour figure"
                )
                gpu_hours = usd = run_hours = None
                went_on = how
            else:
                gpu_hours, usd = run.cost.part(after)
                evidence["trained_on_hours"] = round(after, 3)
                evidence["formula"] = (
                    f"{run.cost.gpus:g} GPUs × {after:.2f} h ({how}) = "
                    f"{run.cost.formula(gpu_hours)}"
                    if gpu_hours is not None
                    else f"{after:.2f} h ({how}); {run.cost.basis}: no GPU-hour or dollar figure"
                )
                run_hours = after if gpu_hours is None else None
                went_on = f"training went on for {went:.1f} h"
            yield self.run_finding(
                run,
                message=(
                    f"run {run.name!r}: {first.kind} in {first.metric} at step {first.onset_step} "
                    f"({_value(first.value)}, {first.test}) and {went_on}{more}"
                ),
                evidence=evidence,
                cost=Waste(gpu_hours, usd, run_hours),
                happened_at=first.onset_time or run.start_time,
            )

    @staticmethod
    def _after_onset(ctx, run, first, points) -> tuple[float | None, float | None, str] | None:
        """(hours claimed: trained after the onset and its grace; hours trained after the
        onset; how they were found); None when the run stopped within the grace; hours None
        when nothing tells them."""
        duration = run.run_hours
        grace = ctx.thresholds["grace_hours"]
        if duration is not None:
            grace = min(grace, ctx.thresholds["grace_fraction"] * duration)
        end = run.job_end or run.last_seen
        if first.onset_time is not None and end is not None:
            return _past_grace(
                (end - first.onset_time).total_seconds() / 3600,
                grace,
                f"from the onset at {first.onset_time:%Y-%m-%d %H:%M} + {grace:.2f} h grace "
                f"to the end at {end:%Y-%m-%d %H:%M}",
            )
        steps = [step for step, _ts, _v in points if step is not None]
        onset = first.onset_step
        if not steps or onset is None:
            return None, None, "the log holds neither times nor steps for the onset"
        low, high = min(steps), max(steps)
        share = (high - onset) / (high - low) if high > low else 0.0
        where = f"steps {onset}-{high} of {low}-{high}, the log has no clock times"
        if duration is None:
            return (None, None, f"trained on from step {onset} to step {high} ({share:.0%} of the "
                    "logged steps); the log has no clock times and no duration")  # fmt: skip
        return _past_grace(
            share * duration,
            grace,
            f"{where}: {share:.0%} of the run's {duration:.2f} h, positioned by step, "
            f"− {grace:.2f} h grace",
        )


def _past_grace(went: float, grace: float, how: str) -> tuple[float, float, str] | None:
    """(hours trained past the grace, hours trained after the onset, how), or None when the
    run stopped within the grace."""
    after = went - grace
    return None if after <= 0 else (after, went, how)


def _value(value: float) -> str:
    return f"{value:.4g}" if value == value and abs(value) != float("inf") else str(value)

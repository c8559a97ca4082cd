from __future__ import annotations

from audit.recipes import method_matrix
from audit.rule_api import Rule, RuleContext, Severity, Skip, Threshold, needing

from ._shared import recipes


class DominatedRun(Rule):
    """Another recipe on the same base model and task did at least as well for less compute.

    What it detects:
    Finished training runs with a known cost, a target gain and a general change against
    their base model's baseline, for which another run on the same base model and task
    (its dataset, else its target metrics) reached at least the same target gain with no
    more general loss for at most `cost_ratio` × its GPU-hours. The finding points at the
    cheapest such run: the recipe to reuse. It is information, not waste: the comparison
    is only possible after both ran.

    Why it is waste:
    A recipe that costs more and gives no more (an SFT run at three times the cost of an
    on-policy distillation run, with less target gain and more forgetting) will be run
    again unless someone says so; the method matrix of the weekly report shows all of them.

    Known false positives:
    Runs that differ in what the benchmarks do not measure (latency, a longer context),
    and benchmark noise on small suites: the dominating run must be clearly cheaper
    (`cost_ratio`), but equal gains within noise count as "at least".

    Example:
    `sft-qwen-lr1e-4` (72.5 GPU-h, target +0.121, general −0.165) is dominated by
    `sft-qwen-lr2e-5` (48.3 GPU-h, target +0.143, general −0.008).

    How to fix:
    Reuse the dominating recipe for this base model and task; compare recipes in the
    weekly report's method matrix before planning the next sweep.

    References:
    Shenfeld, Pari, Agrawal, "RL's Razor" (2025); Thinking Machines Lab, "On-Policy
    Distillation" (2025); the monitoring and governance advice for post-training teams
    (method matrix).
    """

    code = "MTX001"
    name = "dominated-run"
    severity_from_impact = False  # a hint: a cheaper recipe did as well, no waste claimed
    severity = Severity.INFO
    family_label = "method matrix"
    reads_shared = frozenset({"evaluation runs", "facts", "recipes"})
    needs = needing("runs", "metrics")
    thresholds = {
        "cost_ratio": Threshold(
            0.9,
            "the dominating run cost at most this × the dominated one's GPU-hours (10 % cheaper: beyond timing noise)",
            0,
            1,
        )
    }
    recommendation = (
        "Reuse the cheaper recipe that did at least as well for this base model and task."
    )

    def check(self, ctx: RuleContext):
        found = recipes(ctx)
        if not found.baselines:
            raise Skip(
                "no baseline run (tag audit.baseline=true with a base_model): no run's gain "
                "or general change can be measured"
            )
        ratio = ctx.thresholds["cost_ratio"]
        for (base_model, task), items in method_matrix(found, ctx.window, ratio).items():
            for item in items:
                best = item.dominated_by
                if best is None:
                    continue
                run, other = item.run, best.run
                saved = item.gpu_hours - best.gpu_hours
                yield self.run_finding(
                    run,
                    message=(
                        f"run {run.name!r} ({run.method}, {item.gpu_hours:.1f} GPU-h, target "
                        f"{item.outcome.target_gain:+.3f}, general {item.outcome.general_change:+.3f}) "
                        f"is dominated by {other.name!r} ({other.method}, {best.gpu_hours:.1f} GPU-h, "
                        f"target {best.outcome.target_gain:+.3f}, general "
                        f"{best.outcome.general_change:+.3f}) on {base_model} / {task}"
                    ),
                    evidence={
                        "base_model": base_model,
                        "task": task,
                        "run": _figures(item),
                        "cheaper_run": _figures(best),
                        "cost_ratio": ratio,
                        "gpu_hours_difference": round(saved, 3),
                        "formula": (
                            f"hint only: {best.gpu_hours:.2f} GPU-h ≤ {ratio:g} × "
                            f"{item.gpu_hours:.2f} GPU-h with target gain "
                            f"{best.outcome.target_gain:+.4f} ≥ {item.outcome.target_gain:+.4f} "
                            f"and general change {best.outcome.general_change:+.4f} ≥ "
                            f"{item.outcome.general_change:+.4f}; no waste is claimed"
                        ),
                    },
                    risk_gpu_hours=saved,
                )


def _figures(item) -> dict:
    run = item.run
    return {
        "run_id": run.run_id,
        "name": run.name,
        "method": run.method,
        "gpu_hours": round(item.gpu_hours, 3),
        "target_gain": round(item.outcome.target_gain, 4),
        "general_change": round(item.outcome.general_change, 4),
        "baseline": item.outcome.baseline.name,
        "cost_basis": run.cost.basis,
    }

from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, needing
from audit.text import counted, listed
from audit.windows import iso_week

from ._metrics import runs_with_learning_rate
from ._shared import SHORT_RUN, recipes


class SamplingSourceNotRecorded(Rule):
    """Training runs that do not record their method (SFT, RL, on-policy distillation) or teacher.

    What it detects:
    Training runs (a learning-rate param, or a method) at least `min_run_minutes` long
    without a method in `[attribution] method_keys`, which is also their sampling source
    (SFT trains on fixed data, RL and on-policy distillation on the model's own samples),
    and distillation runs (method in `[attribution] distillation_methods`) without a
    teacher model in `[attribution] teacher_keys`. One finding per experiment and ISO week
    lists the runs and the GPU-hours that cannot be attributed by method.

    Why it is waste:
    Spend that cannot be attributed by method cannot be compared by method: nobody can
    tell whether SFT or on-policy training bought the gains, or which teacher a distilled
    model copied, so the next recipe is chosen blind. No GPU-hours are claimed.

    Known false positives:
    Methods recorded under other names (add them to `[attribution] method_keys`), and
    runs that are not training at all but log a learning rate.

    Example:
    3 runs of `agent-tools` in 2026-W47 (96 GPU-h) log no `method` param or tag.

    How to fix:
    Log `method` (sft, rl, opd, dpo, ...) as a param from the training script, and for
    distillation the `teacher` model.

    References:
    The monitoring and governance advice for post-training teams (sampling-source
    tracking).
    """

    code = "SRC001"
    name = "sampling-source-not-recorded"
    severity = Severity.LOW
    family_label = "attribution gaps"
    reads_shared = frozenset(
        {"evaluation runs", "facts", "learning-rate runs", "recipes", "teacher runs"}
    )
    needs = needing("runs")
    thresholds = {"min_run_minutes": SHORT_RUN}
    recommendation = "Log the training method (and, for distillation, the teacher model) as params."

    def check(self, ctx: RuleContext):
        attribution = ctx.config.attribution
        with_lr = runs_with_learning_rate(ctx)
        teacher_keys = list(attribution.teacher_keys)
        with_teacher = ctx.once(  # once for a report's weeks
            ("teacher runs", tuple(teacher_keys)),
            lambda: set(
                ctx.con.execute(
                    "SELECT source_id, run_id FROM params "
                    "WHERE list_contains(?, key) AND value <> '' "
                    "UNION SELECT source_id, run_id FROM tags "
                    "WHERE list_contains(?, key) AND value <> ''",
                    [teacher_keys, teacher_keys],
                ).fetchall()
            ),
        )
        distillation = set(attribution.distillation_methods)
        groups: dict[tuple, list] = {}
        is_training = recipes(ctx).is_training
        for run in ctx.facts.runs_in(ctx.window):
            if (
                run.lifecycle_stage != "active"
                or not is_training(run)
                or (run.run_hours or 0) * 60 < ctx.thresholds["min_run_minutes"]
                or (run.method is None and run.key not in with_lr)
            ):
                continue
            if run.method is None:
                missing = "method"
            elif run.method in distillation and run.key not in with_teacher:
                missing = "teacher"
            else:
                continue
            week = iso_week(run.start_time, ctx.config.timezone)
            groups.setdefault((run.experiment or run.experiment_id or "?", week), []).append(
                (run, missing)
            )
        for (experiment, week), runs in sorted(groups.items()):
            known = [r.cost.gpu_hours for r, _ in runs if r.cost.gpu_hours is not None]
            no_method = [r for r, m in runs if m == "method"]
            no_teacher = [r for r, m in runs if m == "teacher"]
            parts = []
            if no_method:
                parts.append(f"{len(no_method)} without a method")
            if no_teacher:
                parts.append(f"{counted(len(no_teacher), 'distillation run')} without a teacher")
            teams = {r.team for r, _ in runs}
            names = listed(repr(r.name) for r, _ in runs)
            yield self.finding(
                subject={"experiment": experiment, "week": week},
                message=(
                    f"{counted(len(runs), 'training run')} of experiment {experiment!r} started "
                    f"in {week}: "
                    f"{' and '.join(parts)} ({names})"
                    + (f"; {sum(known):.1f} GPU-h cannot be attributed by method" if known else "")
                ),
                evidence={
                    "method_keys": list(attribution.method_keys),
                    "teacher_keys": teacher_keys,
                    "runs": [
                        {
                            "run_id": r.run_id,
                            "name": r.name,
                            "missing": m,
                            "method": r.method,
                            "team": r.team,
                            "gpu_hours": r.cost.gpu_hours,
                        }
                        for r, m in runs
                    ],
                    "gpu_hours_unattributed": round(sum(known), 3) if known else None,
                    "formula": "attribution gap: no waste figure is claimed",
                },
                risk_gpu_hours=sum(known) if known else None,
                team=teams.pop() if len(teams) == 1 else None,
                happened_at=runs[0][0].start_time,
            )

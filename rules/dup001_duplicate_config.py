from __future__ import annotations

import polars as pl

from audit.engine import Finding, Rule, RuleContext, Severity, Threshold

from ._common import money, run_facts


class DuplicateConfig(Rule):
    """A run trained a configuration that an earlier finished run had already trained.

    What it detects:
    Runs whose effective configuration equals that of an earlier FINISHED run: the same
    params after normalisation (`2e-05` == `0.00002`, `0.05` == `0.050`, `True` == `true`),
    ignoring volatile params (`[attribution] volatile_params`: output paths, run names,
    logging cadence, GPU count), with
    the same source commit and the same training dataset digests when datasets are logged.

    Why it is waste:
    The result already existed and was searchable; the rerun bought nothing new. Its
    GPU-hours (and dollars) are the waste.

    Known false positives:
    Deliberate reproducibility checks, and reruns whose difference lives outside MLflow
    (a changed data file under the same name without a logged digest, an environment
    upgrade). A rerun after a FAILED or KILLED run is a retry and is never flagged; runs
    that differ in `seed` are a seed sweep and differ in config.

    Example:
    `sft-qwen-lr2e-5` finished on Monday with learning_rate=`2e-05`; on Tuesday
    `sft-qwen-lr2e-5-again` ran with learning_rate=`0.00002` and everything else equal:
    48 GPU-hours spent to reproduce a known result.

    How to fix:
    Check history before launching: `audit runs similar --config train.yaml
    --fail-if-exists` in the launch script. Tag intentional reproductions with
    `audit.ignore=DUP001`.

    References:
    MLflow search compares params as strings, so `1e-5` and `0.00001` never match there.
    """

    code = "DUP001"
    name = "duplicate-config"
    severity = Severity.MEDIUM
    needs = {"runs": "no MLflow runs imported", "params": "no run params imported"}
    thresholds = {
        "min_gpu_hours": Threshold(
            0.0, "ignore duplicates cheaper than this", minimum=0, unit="GPU-h"
        ),
    }
    recommendation = "Search history before launching (audit runs similar --fail-if-exists); reuse the earlier run's result."

    def check(self, ctx: RuleContext):
        volatile = list(ctx.config.values["attribution"]["volatile_params"])
        facts = {(r["source_id"], r["run_id"]): r for r in run_facts(ctx)}
        signatures = ctx.rows(
            """
            WITH cfg AS (
                SELECT source_id, run_id,
                       string_agg(key || '=' || value_norm, chr(31) ORDER BY key) AS params
                FROM params WHERE NOT list_contains(?, key) GROUP BY ALL
            ),
            data AS (
                SELECT source_id, run_id, string_agg(DISTINCT digest, ',' ORDER BY digest) AS digests
                FROM dataset_inputs WHERE coalesce(context, 'train') = 'train' GROUP BY ALL
            )
            SELECT r.source_id, r.run_id, c.params, coalesce(r.source_commit, '') AS commit,
                   coalesce(d.digests, '') AS digests
            FROM runs r JOIN cfg c USING (source_id, run_id)
            LEFT JOIN data d USING (source_id, run_id)
            """,
            [volatile],
        )
        groups: dict[tuple, list[dict]] = {}
        for row in signatures:
            groups.setdefault((row["params"], row["commit"], row["digests"]), []).append(
                facts[(row["source_id"], row["run_id"])]
            )
        condition_since, condition_until = ctx.since, ctx.until
        pairs: list[tuple[dict, dict]] = []
        for runs in groups.values():
            runs.sort(key=lambda r: (r["start_time"], r["run_id"]))
            for index, run in enumerate(runs):
                earlier = next(
                    (
                        e
                        for e in runs[:index]
                        if e["status"] == "FINISHED"
                        and e["end_time"]
                        and e["end_time"] <= run["start_time"]
                    ),
                    None,
                )
                if earlier is None or run["gpu_hours"] is None:
                    continue
                if (condition_since and run["start_time"] < condition_since) or (
                    condition_until and run["start_time"] >= condition_until
                ):
                    continue
                if run["gpu_hours"] < ctx.thresholds["min_gpu_hours"]:
                    continue
                pairs.append((run, earlier))
        spelled = _spelled_differently(ctx, pairs)
        for number, (run, earlier) in enumerate(pairs):
            yield self._finding(ctx, run, earlier, volatile, spelled.get(number, []))

    def _finding(
        self, ctx: RuleContext, run: dict, earlier: dict, volatile: list[str], differences: list
    ) -> Finding:
        hours = run["gpu_hours"]
        return self.finding(
            ctx,
            subject={
                "run_id": run["run_id"],
                "run_name": run["name"],
                "duplicate_of": earlier["run_id"],
            },
            message=(
                f"run {run['name']!r} repeats the configuration of {earlier['name']!r} "
                f"(finished {earlier['end_time']:%Y-%m-%d %H:%M}): {hours:.1f} GPU-h spent, "
                f"threshold {ctx.thresholds['min_gpu_hours']:g} GPU-h"
            ),
            evidence={
                "earlier_run": {
                    "run_id": earlier["run_id"],
                    "name": earlier["name"],
                    "status": earlier["status"],
                },
                "params_spelled_differently": differences,
                "ignored_volatile_params": volatile,
                "source_commit": "same",
                "cost_basis": run["cost_basis"],
                "formula": money(hours, run["price"], run["price_key"]),
            },
            gpu_hours=hours,
            usd=run["usd"],
            team=run["team"],
            method=run["method"],
            happened_at=run["start_time"],
        )


def _spelled_differently(ctx: RuleContext, pairs: list[tuple[dict, dict]]) -> dict[int, list]:
    """Per pair, the params whose values differ only in spelling (one query for all pairs)."""
    if not pairs:
        return {}
    frame = pl.DataFrame(
        [
            (n, r["source_id"], r["run_id"], e["source_id"], e["run_id"])
            for n, (r, e) in enumerate(pairs)
        ],
        schema=["pair", "source_id", "run_id", "earlier_source_id", "earlier_run_id"],
        orient="row",
    )
    ctx.con.register("audit_pairs", frame)
    try:
        rows = ctx.rows(
            """
            SELECT p.pair, a.key, a.value AS this_run, b.value AS earlier_run,
                   a.value_norm AS normalised
            FROM audit_pairs p
            JOIN params a ON a.source_id = p.source_id AND a.run_id = p.run_id
            JOIN params b ON b.source_id = p.earlier_source_id AND b.run_id = p.earlier_run_id
                 AND b.key = a.key
            WHERE a.value <> b.value AND a.value_norm = b.value_norm
            ORDER BY p.pair, a.key
            """
        )
    finally:
        ctx.con.unregister("audit_pairs")
    out: dict[int, list] = {}
    for row in rows:
        out.setdefault(row.pop("pair"), []).append(row)
    return out

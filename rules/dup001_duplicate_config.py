from __future__ import annotations

import hashlib
from dataclasses import replace

import polars as pl

from audit.costs import RunFacts
from audit.rule_api import (
    Finding,
    Rule,
    RuleContext,
    Severity,
    Threshold,
    Waste,
    needing,
    run_entry,
)
from audit.text import listed

RESULT_STATES = ("FINISHED", "RUNNING")  # a launch with such a run has (or will have) a result


class DuplicateConfig(Rule):
    """A configuration was trained again while an earlier launch had already trained it.

    What it detects:
    Runs whose effective configuration equals that of an earlier launch: the same params
    after normalisation (`2e-05` == `0.00002`, `0.05` == `0.050`, `True` == `true`),
    ignoring volatile params (`[attribution] volatile_params`: output paths, run names,
    logging cadence, GPU count), with the same source commit and the same training dataset
    digests when datasets are logged, across every tracker imported. A later launch
    repeats an earlier one that finished (or is still running: two people training the
    same config at overlapping times is the classic duplicate; the one that started later
    carries the waste). Runs of one user from one entry point that start back to back
    (within `batch_gap_minutes` of the previous one's start or end), or children of one
    parent run, are one launch: repeated trials or folds of one script are not flagged
    against each other, but a later launch repeating the configuration is, as a whole.
    One finding per configuration and window lists every run; when the repeats of several
    configurations all come from one source (one notebook, script or command of one user:
    `mlflow.source.name`, the entry point) re-run in the window, that behaviour is one
    finding listing the configurations it repeated (a notebook re-run 19 times that trains
    21 models is one habit, not 21 findings).

    Why it is waste:
    The result already existed (or was being produced) and was searchable; the repeat bought
    nothing new. Its GPU-hours (and dollars) are the waste; when no source knows a run's GPU
    count, its run-hours are reported and its cost stays unknown.

    Known false positives:
    Deliberate reproducibility checks (tag them `audit.ignore=DUP001`: they are left out),
    and reruns whose difference lives outside the tracker (a changed data file under the
    same name without a logged digest, an environment upgrade). A rerun after a FAILED or
    KILLED run is a retry and is never flagged; runs that differ in `seed` are a seed sweep
    and differ in config.

    Example:
    `sft-qwen-lr2e-5` finished on Monday with learning_rate=`2e-05`; on Tuesday
    `sft-qwen-lr2e-5-again` ran with learning_rate=`0.00002` and everything else equal:
    48 GPU-hours spent to reproduce a known result.

    How to fix:
    Check history before launching: `audit runs similar --config train.yaml
    --fail-if-exists` in the launch script.

    References:
    MLflow search compares params as strings, so `1e-5` and `0.00001` never match there.
    """

    code = "DUP001"
    name = "duplicate-config"
    severity = Severity.MEDIUM
    family_label = "duplicate experiments"
    reads_shared = frozenset({"DUP001 repeats", "facts"})
    needs = needing("runs", "params")
    thresholds = {
        "min_gpu_hours": Threshold(
            0.0, "ignore repeats cheaper than this (when their cost is known)", 0, unit="GPU-h"
        ),
        "batch_gap_minutes": Threshold(
            5.0,
            "runs of one user and entry point starting within this of the previous one's "
            "start or end are one launch",
            0,
            unit="min",
        ),
    }
    recommendation = "Search history before launching (audit runs similar --fail-if-exists); reuse the earlier run's result."

    def check(self, ctx: RuleContext):
        volatile = list(ctx.config.attribution.volatile_params)
        gap = ctx.thresholds["batch_gap_minutes"] * 60
        repeated = ctx.once(
            ("DUP001 repeats", tuple(volatile), gap), lambda: _repeated_configs(ctx, volatile, gap)
        )
        found: list[tuple[str, list[list[RunFacts]], list[RunFacts], RunFacts]] = []
        for signature, launches, repeats, original in repeated:
            in_window = [r for r in repeats if ctx.window.contains(r.start_time)]
            if not in_window:
                continue
            known = [r.cost.gpu_hours for r in in_window if r.cost.gpu_hours is not None]
            if len(known) == len(in_window) and sum(known) < ctx.thresholds["min_gpu_hours"]:
                continue
            digest = hashlib.sha1("\x1f".join(signature).encode()).hexdigest()[:12]
            found.append((digest, launches, in_window, original))
        spelled = _spelled_differently(ctx, [(f[2][0], f[3]) for f in found])
        by_source: dict[tuple, list[int]] = {}
        for number, (_digest, _launches, repeats, _original) in enumerate(found):
            sources = {(r.entry_point, r.user_id) for r in repeats}
            if len(sources) == 1 and next(iter(sources))[0]:
                by_source.setdefault(next(iter(sources)), []).append(number)
        merged = {n for numbers in by_source.values() if len(numbers) > 1 for n in numbers}
        for number, (digest, launches, repeats, original) in enumerate(found):
            if number not in merged:
                yield self._finding(
                    ctx, digest, launches, repeats, original, volatile, spelled.get(number, [])
                )
        for (entry_point, user), numbers in sorted(by_source.items(), key=lambda kv: kv[1][0]):
            if len(numbers) > 1:
                yield self._source_finding(ctx, entry_point, user, [found[n] for n in numbers])

    def _finding(
        self,
        ctx: RuleContext,
        digest: str,
        launches: list[list[RunFacts]],
        repeats: list[RunFacts],
        original: RunFacts,
        volatile: list[str],
        differences: list,
    ) -> Finding:
        every = sorted((r for launch in launches for r in launch), key=_order)
        launch_of = {r.key: n for n, launch in enumerate(launches, start=1) for r in launch}
        repeat_keys = {r.key for r in repeats}
        waste = Waste.of_runs(repeats)
        known = [r for r in repeats if r.cost.known]
        unknown = [r for r in repeats if not r.cost.known]
        gpu_hours, run_hours = waste.gpu_hours, waste.run_hours
        repeat_launches = len({launch_of[r.key] for r in repeats})
        first = repeats[0]
        ended = (
            f", finished {original.end_time:%Y-%m-%d %H:%M}"
            if original.status == "FINISHED" and original.end_time
            else f", {(original.status or 'unknown').lower()}"
        )
        return self.finding(
            subject={"config": digest, "run_id": first.run_id, "run_name": first.name},
            message=(
                f"{len(every)} runs of one configuration between {every[0].start_time:%Y-%m-%d %H:%M} "
                f"and {every[-1].start_time:%Y-%m-%d %H:%M} in {len(launches)} launches: "
                f"{len(repeats)} run{'s' if len(repeats) != 1 else ''} in {repeat_launches} later "
                f"launch{'es' if repeat_launches != 1 else ''} repeat{'s' if len(repeats) == 1 else ''} "
                f"{original.name!r} (started {original.start_time:%Y-%m-%d %H:%M}{ended}); "
                f"{_cost_text(gpu_hours, run_hours, len(unknown))}, "
                f"threshold {ctx.thresholds['min_gpu_hours']:g} GPU-h"
            ),
            evidence={
                "runs": [
                    run_entry(
                        r,
                        user=r.user_id,
                        entry_point=r.entry_point,
                        status=r.status,
                        start=r.start_time,
                        end=r.end_time,
                        launch=launch_of[r.key],
                        role="original"
                        if r.key == original.key
                        else "repeat"
                        if r.key in repeat_keys
                        else "not counted",
                    )
                    for r in every
                ],
                "launch_rule": (
                    "runs of one user and entry point starting within "
                    f"{ctx.thresholds['batch_gap_minutes']:g} min of the previous one's start or "
                    "end, or children of one parent run, are one launch"
                ),
                "params_spelled_differently": differences,
                "ignored_volatile_params": volatile,
                "source_commit": "same",
                "formula": _formula(known, unknown, waste),
            },
            cost=replace(waste, basis=_basis(repeats)),
            owner=first,
            happened_at=first.start_time,
        )

    def _source_finding(
        self, ctx: RuleContext, entry_point: str, user: str | None, items: list[tuple]
    ) -> Finding:
        """One finding for the repeats of several configurations by one source."""
        repeats = sorted((r for item in items for r in item[2]), key=_order)
        every = sorted(
            {r.key: r for item in items for launch in item[1] for r in launch}.values(),
            key=_order,
        )
        waste = Waste.of_runs(repeats)
        known = [r for r in repeats if r.cost.known]
        unknown = [r for r in repeats if not r.cost.known]
        gpu_hours, run_hours = waste.gpu_hours, waste.run_hours
        launches = max(len(item[1]) for item in items)
        configs = [
            {
                "config": digest,
                "original": {"run_id": original.run_id, "name": original.name},
                "repeats": len(item_repeats),
                "launches": len(item_launches),
            }
            for digest, item_launches, item_repeats, original in items
        ]
        names = sorted({item[3].name or item[3].run_id for item in items})
        shown = listed(repr(n) for n in names)
        first = repeats[0]
        return self.finding(
            subject={"entry_point": entry_point, "user": user},
            message=(
                f"{entry_point!r}{f' of user {user!r}' if user else ''} was re-run in up to "
                f"{launches} launches between {every[0].start_time:%Y-%m-%d %H:%M} and "
                f"{every[-1].start_time:%Y-%m-%d %H:%M}, repeating {len(items)} configurations "
                f"it had trained before ({shown}): {len(repeats)} repeat runs; "
                f"{_cost_text(gpu_hours, run_hours, len(unknown))}, "
                f"threshold {ctx.thresholds['min_gpu_hours']:g} GPU-h"
            ),
            evidence={
                "entry_point": entry_point,
                "user": user,
                "configurations": configs,
                "repeat_runs": [
                    {"run_id": r.run_id, "name": r.name, "start": r.start_time} for r in repeats
                ],
                "formula": _formula(known, unknown, waste),
            },
            cost=replace(waste, basis=_basis(repeats)),
            owner=first,
            method=first.method if len({r.method for r in repeats}) == 1 else None,
            happened_at=first.start_time,
        )


SIGNATURES_SQL = """
WITH hashed AS (  -- per run: a hash of its param set, whatever the order of its rows
    SELECT source_id, run_id, sum(hash(key, coalesce(value_norm, ''))) AS set_hash,
           count(*) AS pairs,
           bool_or(contains(key, '=') OR contains(key, chr(31))
                   OR contains(coalesce(value_norm, ''), chr(31))) AS unusual
    FROM params WHERE NOT list_contains($volatile, key) GROUP BY ALL
),
maybe AS (  -- runs that may share their param set with another run
    SELECT source_id, run_id FROM hashed
    QUALIFY bool_or(unusual) OVER () OR count(*) OVER (PARTITION BY set_hash, pairs) >= 2
),
cfg AS (
    SELECT source_id, run_id,
           string_agg(key || '=' || coalesce(value_norm, ''), chr(31) ORDER BY key) AS params
    FROM params SEMI JOIN maybe USING (source_id, run_id)
    WHERE NOT list_contains($volatile, key) GROUP BY ALL
),
data AS (
    SELECT source_id, run_id, string_agg(DISTINCT digest, ',' ORDER BY digest) AS digests
    FROM dataset_inputs WHERE coalesce(context, 'train') = 'train' GROUP BY ALL
),
intended AS (  -- deliberate reproductions, tagged audit.ignore=DUP001 (or DUP)
    SELECT DISTINCT source_id, run_id FROM tags
    WHERE key = $ignore_tag
      AND list_has_any(string_split(upper(replace(value, ' ', '')), ','), ['DUP', 'DUP001'])
)
SELECT r.source_id, r.run_id, c.params, coalesce(r.source_commit, '') AS commit,
       coalesce(d.digests, '') AS digests
FROM runs r JOIN cfg c USING (source_id, run_id)
LEFT JOIN data d USING (source_id, run_id)
WHERE NOT EXISTS (SELECT 1 FROM intended i WHERE i.source_id = r.source_id AND i.run_id = r.run_id)
-- A param set run once cannot repeat (commits and digests only split a set further): most
-- of 100,000s are, and reading their signatures cost a scan 1 s and 300 MB.
QUALIFY count(*) OVER (PARTITION BY c.params) >= 2
"""
# Two runs share a signature (``params``) only if they share the multiset of (key, value)
# pairs, which the order-free ``set_hash`` and ``pairs`` then share too; unless a key holds
# "=" or chr(31) or a value chr(31): then different pairs could join into one text, and
# every run's signature is built. Building and sorting every run's signature text cost
# 0.7 s of a scan at 100,000 runs, the hashes 0.15 s.


def _repeated_configs(ctx: RuleContext, volatile: list[str], gap: float) -> list[tuple]:
    """Every configuration run more than once over all history, in signature order: its
    launches, the runs that repeat the original, and the original (the same for every
    window, so a report's weekly scans group the history once)."""
    ignore_tag = ctx.config.attribution.ignore_tag
    by_params: dict[str, list[tuple[RunFacts, str, str]]] = {}
    for row in ctx.rows(SIGNATURES_SQL, {"volatile": volatile, "ignore_tag": ignore_tag}):
        run = ctx.facts.run(row["source_id"], row["run_id"])
        if run is not None and run.start_time is not None:
            by_params.setdefault(row["params"], []).append((run, row["commit"], row["digests"]))
    groups: dict[tuple, list[RunFacts]] = {}
    for params, members in by_params.items():
        for (commit, digests), runs in _by_known(members).items():
            groups[(params, commit, digests)] = runs
    out = []
    repeated = [(signature, runs) for signature, runs in groups.items() if len(runs) >= 2]
    for signature, runs in sorted(repeated):  # most of 100,000s of signatures are run once
        launches = group_launches(runs, gap)
        repeats, original = _repeats(launches)
        out.append((signature, launches, repeats, original))
    return out


def _by_known(members: list[tuple[RunFacts, str, str]]) -> dict[tuple[str, str], list[RunFacts]]:
    """Runs of one param set, split by source commit and training-data digests.

    A value a tracker did not record (W&B runs log no dataset digests, many runs no commit)
    is unknown, not different: such a run joins the others when they all agree on that
    value, and stays apart when they disagree (it could be either).
    """
    commits = {c for _, c, _ in members if c}
    digests = {d for _, _, d in members if d}
    out: dict[tuple[str, str], list[RunFacts]] = {}
    for run, commit, digest in members:
        commit = commit or (next(iter(commits)) if len(commits) == 1 else "")
        digest = digest or (next(iter(digests)) if len(digests) == 1 else "")
        out.setdefault((commit, digest), []).append(run)
    return out


def _order(run: RunFacts) -> tuple:
    return (run.start_time, run.source_id, run.run_id)


def group_launches(runs: list[RunFacts], gap_seconds: float) -> list[list[RunFacts]]:
    """Runs of one configuration grouped into launches, in order of their first start.

    A run joins the open launch of its parent run, else the open launch of its user and
    entry point when it starts within ``gap_seconds`` of that launch's last run's start or
    end (last logged sign of life when the run has no end).
    """
    launches: list[list[RunFacts]] = []
    open_by_key: dict[tuple, list[RunFacts]] = {}
    for run in sorted(runs, key=_order):
        key = (
            ("parent", run.source_id, run.parent_run_id)
            if run.parent_run_id
            else ("user", run.user_id, run.entry_point)
        )
        launch = open_by_key.get(key)
        if launch is not None and not run.parent_run_id:
            previous = launch[-1]
            reference = max(t for t in (previous.start_time, previous.last_seen) if t is not None)
            if (run.start_time - reference).total_seconds() > gap_seconds:
                launch = None
        if launch is None:
            launch = []
            launches.append(launch)
            open_by_key[key] = launch
        launch.append(run)
    return launches


def _repeats(launches: list[list[RunFacts]]) -> tuple[list[RunFacts], RunFacts | None]:
    """The runs of launches that started after a launch with a result, and that first result.

    A launch whose runs all failed or were killed produced nothing: the next launch is a
    retry, not a repeat.
    """
    original: RunFacts | None = None
    repeats: list[RunFacts] = []
    for launch in launches:
        if original is not None and launch[0].start_time > original.start_time:
            repeats.extend(launch)
            continue
        if original is None:
            original = next((r for r in launch if r.status in RESULT_STATES), None)
    return sorted(repeats, key=_order), original


def _cost_text(gpu_hours: float | None, run_hours: float | None, unknown: int) -> str:
    parts = []
    if gpu_hours is not None:
        parts.append(f"{gpu_hours:.1f} GPU-h spent")
    if run_hours is not None:
        parts.append(
            f"{run_hours:.2f} run-hours with unknown GPU count ({unknown} run{'s' if unknown != 1 else ''})"
        )
    return " + ".join(parts)


def _basis(repeats: list[RunFacts]) -> str:
    """What the repeats' cost stands on: one run's basis, else the rungs they were priced by."""
    if len(repeats) == 1:
        return repeats[0].cost.basis
    return "; ".join(sorted({r.cost.rung_label for r in repeats}))


def _formula(known, unknown, waste: Waste) -> str:
    gpu_hours, usd, run_hours = waste.gpu_hours, waste.usd, waste.run_hours
    parts = []
    if len(known) == 1:
        parts.append(known[0].cost.formula())
    elif known:
        parts.append(
            " + ".join(f"{r.cost.gpu_hours:.2f}" for r in known[:20])
            + (f" + … ({len(known) - 20} more)" if len(known) > 20 else "")
            + f" = {gpu_hours:.2f} GPU-h of {len(known)} repeats at their prices = ${usd:,.2f}"
        )
    if unknown:
        parts.append(
            f"{len(unknown)} repeats without a GPU count: {run_hours:.4f} run-hours, no dollar figure"
        )
    return "; ".join(parts)


def _spelled_differently(
    ctx: RuleContext, pairs: list[tuple[RunFacts, RunFacts]]
) -> dict[int, list]:
    """Per pair, the params whose values differ only in spelling (one query for all pairs)."""
    if not pairs:
        return {}
    frame = pl.DataFrame(
        [(n, r.source_id, r.run_id, e.source_id, e.run_id) for n, (r, e) in enumerate(pairs)],
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

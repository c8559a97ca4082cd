from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, needing


class DatasetSilo(Rule):
    """The same dataset content is used under different names or by different teams.

    What it detects:
    MLflow dataset inputs with equal digests (the same content) logged under more than
    one name, or by more than one team (the run's team as `[attribution] team_order`
    decides it: run tag, Slurm account, user). One finding per digest, with the names, teams and runs involved. One name with
    several digests is a dataset with versions, not a silo.

    Why it is waste:
    Two teams preparing, cleaning and storing the same data duplicate the work and miss
    each other's fixes. The preparation cost is not in the data, so no figure is claimed.

    Known false positives:
    Deliberate aliases of a shared dataset (register one name), and tiny or synthetic
    datasets whose digests collide by construction.

    Example:
    digest 9f2c4e1ab7d03c55 is `codeedit-v3` for team coder and `edit-pairs` for team agents.

    How to fix:
    Register the dataset once (a shared catalogue or MLflow dataset source) and have
    both teams use that name and version.

    References:
    MLflow dataset tracking (`mlflow.log_input`, dataset digests).
    """

    code = "SIL001"
    name = "dataset-silo"
    severity = Severity.MEDIUM
    family_label = "data silos"
    reads_shared = frozenset({"facts"})
    needs = needing("dataset_inputs")
    thresholds = {}
    recommendation = "Register the dataset once and share one name and version across teams."

    def check(self, ctx: RuleContext):
        by_digest: dict[str, list[dict]] = {}
        for row in ctx.rows(
            """
            SELECT source_id, run_id, digest, name, source FROM dataset_inputs
            WHERE digest IS NOT NULL AND digest <> '' ORDER BY digest, name, run_id
            """
        ):
            run = ctx.facts.run(row["source_id"], row["run_id"])
            if run is not None and run.start_time is not None:
                by_digest.setdefault(row["digest"], []).append({**row, "run": run})
        for digest, uses in sorted(by_digest.items()):
            uses.sort(key=lambda u: (u["run"].start_time, u["run_id"], u["name"] or ""))
            names = sorted({u["name"] or "" for u in uses})
            teams = sorted({u["run"].team or "unknown" for u in uses})
            if len(names) < 2 and len(teams) < 2:
                continue
            first, last = uses[0]["run"].start_time, uses[-1]["run"].start_time
            if not ctx.window.overlaps(first, last):
                continue
            yield self.finding(
                subject={"dataset_digest": digest},
                message=(
                    f"dataset digest {digest} is used under {len(names)} names ({', '.join(names)}) by "
                    f"{len(teams)} teams ({', '.join(teams)}); expected 1 name and 1 team"
                ),
                evidence={
                    "uses": [
                        {
                            "name": u["name"],
                            "team": u["run"].team,
                            "team_from": u["run"].team_source,
                            "run_id": u["run_id"],
                            "run_name": u["run"].name,
                            "source": u["source"],
                        }
                        for u in uses
                    ],
                    "formula": "duplicated preparation effort is not in the data: no figure is claimed",
                },
                happened_at=first,
            )

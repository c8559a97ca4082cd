from __future__ import annotations

from audit.engine import Rule, RuleContext, Severity


class DatasetSilo(Rule):
    """The same dataset content is used under different names or by different teams.

    What it detects:
    MLflow dataset inputs with equal digests (the same content) logged under more than
    one name, or by more than one team (team = run tag `team`, else Slurm account, else
    user). One finding per digest, with the names, teams and runs involved. One name with
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
    needs = {"dataset_inputs": "no MLflow dataset inputs imported"}
    thresholds = {}
    recommendation = "Register the dataset once and share one name and version across teams."

    def check(self, ctx: RuleContext):
        team_tag = ctx.config.values["attribution"]["team_tag"]
        rows = ctx.rows(
            """
            SELECT d.digest, d.name, d.source, r.run_id, r.name AS run_name, r.start_time,
                   coalesce(t.value, j.account, r.user_id) AS team
            FROM dataset_inputs d
            JOIN runs r USING (source_id, run_id)
            LEFT JOIN tags t ON t.source_id = r.source_id AND t.run_id = r.run_id AND t.key = ?
            LEFT JOIN run_jobs l ON l.source_id = r.source_id AND l.run_id = r.run_id
            LEFT JOIN jobs j ON j.cluster = l.cluster AND j.job_id = l.job_id
            WHERE d.digest IS NOT NULL AND d.digest <> ''
            ORDER BY d.digest, r.start_time, r.run_id
            """,
            [team_tag],
        )
        by_digest: dict[str, list[dict]] = {}
        for row in rows:
            by_digest.setdefault(row["digest"], []).append(row)
        for digest, uses in sorted(by_digest.items()):
            names = sorted({u["name"] for u in uses})
            teams = sorted({u["team"] or "unknown" for u in uses})
            if len(names) < 2 and len(teams) < 2:
                continue
            if (ctx.since and max(u["start_time"] for u in uses) < ctx.since) or (
                ctx.until and min(u["start_time"] for u in uses) >= ctx.until
            ):
                continue
            yield self.finding(
                ctx,
                subject={"dataset_digest": digest},
                message=(
                    f"dataset digest {digest} is used under {len(names)} names ({', '.join(names)}) by "
                    f"{len(teams)} teams ({', '.join(teams)}); expected 1 name and 1 team"
                ),
                evidence={
                    "uses": [
                        {
                            "name": u["name"],
                            "team": u["team"],
                            "run_id": u["run_id"],
                            "run_name": u["run_name"],
                            "source": u["source"],
                        }
                        for u in uses
                    ],
                    "formula": "duplicated preparation effort is not in the data: no figure is claimed",
                },
                happened_at=min(u["start_time"] for u in uses),
            )

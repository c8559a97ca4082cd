"""Checkpoint facts shared by the CKP rules and ``audit prune``: which checkpoints are
protected and why.

A checkpoint is protected when it is the best one (``trainer_state.json``
``best_model_checkpoint``), the last one of its run or of its folder (highest step; a
final ``model.safetensors`` without a step saved after it is the last too), or a
registered model version's source (mapped through ``[links] path_prefixes`` and resolved;
a source inside the checkpoint or a checkpoint inside the source both count).
"""

from __future__ import annotations

import os
from collections import defaultdict

from audit.config import Config
from audit.importers.links import LinkSettings
from audit.suppressions import Suppressions

CKP_RULES = ("CKP001", "CKP002", "CKP003")


def warehouse_checkpoints(con, config: Config) -> list[dict]:
    """Every checkpoint with its run (if any) and the reasons it must be kept."""
    cursor = con.execute(
        """
        SELECT c.*, l.source_id, l.run_id, l.method AS link_method, r.name AS run_name,
               r.lifecycle_stage, r.user_id
        FROM checkpoints c
        LEFT JOIN checkpoint_runs l ON l.path = c.path
        LEFT JOIN runs r ON r.source_id = l.source_id AND r.run_id = l.run_id
        ORDER BY c.path
        """
    )
    names = [d[0] for d in cursor.description]
    rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    registered = RegisteredSources.load(con, config)
    lasts = last_of_groups(rows, lambda r: r["run_id"]) | last_of_groups(
        rows, lambda r: r["run_dir"]
    )
    for row in rows:
        reasons = []
        if row["is_best"]:
            reasons.append("best")
        if row["path"] in lasts:
            reasons.append("last")
        if registered.covers(row["path"]):
            reasons.append("registered model")
        row["registered"] = "registered model" in reasons
        row["protected"] = reasons
    return rows


def kept_by_suppression(rows: list[dict], suppressions: Suppressions) -> dict[str, str]:
    """Path -> why a suppression keeps it: a ``[[suppress]]`` entry or ``audit.ignore`` tag
    that mutes a CKP finding which would list the checkpoint. Its subject is matched as the
    CKP rules write it (run id, run name, the folder of the run's first checkpoint, else its
    own folder) and, for prune's sake, against the checkpoint's own path as well."""
    first_dir: dict[tuple, str] = {}
    for row in rows:  # ordered by path, as the CKP rules see them
        if row["run_id"]:
            first_dir.setdefault((row["source_id"], row["run_id"]), row["run_dir"])
    kept = {}
    for row in rows:
        subject = {"run_dir": row["run_dir"], "path": row["path"]}
        if row["run_id"]:
            subject.update(
                run_id=row["run_id"],
                run_name=row["run_name"],
                run_folder=first_dir[(row["source_id"], row["run_id"])],
            )
        reason = suppressions.covers_any(CKP_RULES, "CKP", subject)
        if reason:
            kept[row["path"]] = reason
    return kept


def orphan_explainer(con):
    """``why(run_dir)``: why no run claims the checkpoints of a folder, with the likely fix."""
    by_name: dict[str, list[tuple]] = defaultdict(list)
    by_dir: dict[str, tuple] = {}
    for value, name, run_id in con.execute(
        "SELECT p.value, r.name, r.run_id FROM params p JOIN runs r USING (source_id, run_id) "
        "WHERE p.key = 'output_dir' ORDER BY r.name, r.run_id"
    ).fetchall():
        by_name[value.rstrip("/").rsplit("/", 1)[-1]].append((value, name, run_id))
        by_dir.setdefault(value.rstrip("/"), (value, name, run_id))

    def why(run_dir: str) -> str:
        text = (
            "no imported run claims it: no run's output_dir (after [links] path_prefixes) "
            "holds it, no run id is in its path, no run's local artifact_uri holds it"
        )
        twins = by_name.get(run_dir.rstrip("/").rsplit("/", 1)[-1], [])
        if twins:
            value, name, run_id = twins[0]
            text += (
                f"; run {name or run_id!r} logged output_dir {value}, a folder of the same "
                "name: if that is this folder, map its prefix with [links] path_prefixes "
                "and run `audit ingest links`"
            )
        above = next((by_dir[a] for a in reversed(_ancestors(run_dir)[:-1]) if a in by_dir), None)
        if above:
            value, name, run_id = above
            text += (
                f"; run {name or run_id!r} logged output_dir {value} above it, but a folder "
                "in between is not one a training framework makes, so that run does not "
                "claim it"
            )
        return text

    return why


def last_of_groups(rows: list[dict], group_of) -> set[str]:
    """Paths that are the last of their group: the highest (step, time), and a checkpoint
    without a step (a final ``model.safetensors``) saved at the same time or after it."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        group = group_of(row)
        if group is not None:
            groups[group].append(row)
    lasts = set()
    for members in groups.values():
        last = max(members, key=_by_step)
        lasts.add(last["path"])
        stepless = [m for m in members if m["step"] is None]
        if stepless:
            newest = max(stepless, key=lambda m: (_time(m), m["path"]))
            if _time(newest) >= _time(last):
                lasts.add(newest["path"])
    return lasts


def _by_step(row: dict) -> tuple:
    return (row["step"] if row["step"] is not None else -1, _time(row), row["path"])


def _time(row: dict):
    # datetimes from the warehouse, nanoseconds from the file system; never compared together
    return row["mtime"] if row["mtime"] is not None else 0


class RegisteredSources:
    """Local, resolved paths of registered model versions' sources."""

    def __init__(self, paths: set[str], unmapped_tails: set[tuple[str, str]]):
        self.paths = paths
        self.enclosing = {a for p in paths for a in _ancestors(p)}  # p and every folder above
        # cluster paths not found here: matched by their last two names (run folder and
        # checkpoint), so a prune run without the right path_prefixes still keeps them
        self.unmapped_tails = unmapped_tails

    @classmethod
    def load(cls, con, config: Config) -> RegisteredSources:
        settings = LinkSettings.from_config(config)
        paths, tails = set(), set()
        for (source,) in con.execute(
            "SELECT DISTINCT source FROM model_versions WHERE source IS NOT NULL"
        ).fetchall():
            if "\0" in source:
                continue  # no file has that name
            local = settings.local_path(source)
            if not local.startswith("/"):
                continue  # runs:/, models:/, s3:// ...: not a file here
            paths.add(local)
            if not os.path.lexists(local):
                parts = local.rstrip("/").split("/")
                if len(parts) >= 3:
                    tails.add((parts[-2], parts[-1]))
        return cls(paths, tails)

    def covers(self, path: str) -> bool:
        """``path`` is a source, holds one, or lies inside one."""
        if path in self.enclosing or any(a in self.paths for a in _ancestors(path)):
            return True
        parts = path.split("/")
        return len(parts) >= 2 and (parts[-2], parts[-1]) in self.unmapped_tails


def _ancestors(path: str) -> list[str]:
    parts = path.rstrip("/").split("/")
    return ["/".join(parts[:i]) for i in range(2, len(parts) + 1)]


def gb(n: int) -> float:
    return n / 1e9


def storage_formula(total: int, price: float) -> str:
    return f"{gb(total):,.1f} GB × ${price:.3f}/GB-month = ${gb(total) * price:,.2f}/month"

"""``audit prune``: delete exactly the reclaimable checkpoints a plan lists, nothing else.

Planning reads the current CKP findings (which never include a run's best or last
checkpoint or a registered model's source) and records, for every path, its size and
modification time as seen now. Applying re-checks each entry (still there, not a
symlink, still inside an ingested checkpoint root, same size and time as planned) and
deletes only those, appending each outcome to a manifest as it goes, so an interrupted
apply leaves a manifest of the entries done so far.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from audit import interrupts
from audit.config import Config
from audit.errors import InputError
from audit.rule_registry import select_rules
from audit.scans import run_rules
from audit.warehouse import open_warehouse
from audit.windows import ALL_HISTORY

PLAN_VERSION = 1


@dataclass
class Measure:
    bytes: int
    mtime_ns: int
    is_dir: bool
    # every entry's name, size and time: a file put back with an older time or swapped
    # for another of the same size changes this, not the newest time or the total
    fingerprint: str


def measure(path: Path) -> Measure | None:
    """Size and newest modification time, never following a symlink; None when gone."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return None
    digest = hashlib.sha256()
    if not stat.S_ISDIR(info.st_mode):
        digest.update(f"{info.st_size}:{info.st_mtime_ns}:{info.st_ino}".encode())
        return Measure(info.st_size, info.st_mtime_ns, False, digest.hexdigest())
    total, newest = 0, info.st_mtime_ns
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames) + dirnames:
            full = os.path.join(dirpath, name)
            entry = os.lstat(full)
            if stat.S_ISREG(entry.st_mode) and name in filenames:
                total += entry.st_size
            newest = max(newest, entry.st_mtime_ns)
            relative = os.path.relpath(full, path)
            digest.update(
                f"{relative}\0{entry.st_mode}:{entry.st_size}:{entry.st_mtime_ns}:{entry.st_ino}\n".encode()
            )
    return Measure(total, newest, True, digest.hexdigest())


def inside(path: Path, root: Path) -> bool:
    """``path`` lies under ``root`` with no symlinked folder on the way (nothing resolves out)."""
    try:
        parent = Path(os.path.realpath(path.parent))
        return parent == root or root in parent.parents
    except OSError:
        return False


def make_plan(db: Path, config: Config) -> dict:
    with open_warehouse(db, read_only=True) as wh:
        results = run_rules(wh.con, config, select_rules("CKP", None), ALL_HISTORY)
        roots = {r[0] for r in wh.con.execute("SELECT DISTINCT root FROM checkpoints").fetchall()}
        runs = dict(wh.con.execute("SELECT path, run_id FROM checkpoint_runs").fetchall())
    skipped = [f"{r.rule}: {r.reason}" for r in results if r.status != "ok"]
    entries, refused = [], []
    for result in results:
        for finding in result.findings:
            paths = finding.evidence.get("reclaimable") or finding.evidence.get("checkpoints") or []
            for item in paths:
                path = Path(item["path"])
                root = next((Path(r) for r in roots if inside(path, Path(r))), None)
                now = measure(path)
                if root is None:
                    refused.append(
                        {"path": str(path), "reason": "outside every ingested checkpoint root"}
                    )
                elif now is None:
                    refused.append({"path": str(path), "reason": "missing or a symlink"})
                else:
                    entries.append(
                        {
                            "path": str(path),
                            "root": str(root),
                            "bytes": now.bytes,
                            "mtime_ns": now.mtime_ns,
                            "fingerprint": now.fingerprint,
                            "is_dir": now.is_dir,
                            "rule": finding.rule,
                            "run_id": finding.subject.get("run_id") or runs.get(str(path)),
                            "reason": finding.message,
                        }
                    )
    return {
        "version": PLAN_VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "warehouse": str(db),
        "entries": sorted(entries, key=lambda e: e["path"]),
        "refused": refused,
        "rules_skipped": skipped,
        "total_bytes": sum(e["bytes"] for e in entries),
    }


def load_plan(path: Path) -> dict:
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{path}: no such plan file; create one with audit prune --plan {path}"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable plan ({exc})") from None
    if (
        not isinstance(plan, dict)
        or plan.get("version") != PLAN_VERSION
        or not isinstance(plan.get("entries"), list)
    ):
        raise InputError(f"{path}: not an audit prune plan (version {PLAN_VERSION})")
    for number, entry in enumerate(plan["entries"], start=1):
        if not isinstance(entry, dict) or not {"path", "root", "bytes", "mtime_ns"} <= set(entry):
            raise InputError(f"{path}: entry {number} lacks path, root, bytes or mtime_ns")
    return plan


def apply_plan(plan_path: Path, db: Path, manifest_path: Path) -> dict:
    plan = load_plan(plan_path)
    with open_warehouse(db, read_only=True) as wh:
        roots = {r[0] for r in wh.con.execute("SELECT DISTINCT root FROM checkpoints").fetchall()}
    done = []
    with open(manifest_path, "a", encoding="utf-8") as manifest:
        for entry in plan["entries"]:
            if interrupts.requested():
                break
            # Ctrl-C lets the entry being deleted finish and be recorded: a half-deleted
            # checkpoint the manifest does not mention is what the user would lose.
            with interrupts.held():
                outcome = _apply_one(entry, roots)
                done.append(outcome)
                manifest.write(json.dumps(outcome) + "\n")
                manifest.flush()
                os.fsync(manifest.fileno())
    summary = {
        "planned": len(plan["entries"]),
        "deleted": sum(1 for o in done if o["status"] == "deleted"),
        "skipped": sum(1 for o in done if o["status"] == "skipped"),
        "freed_bytes": sum(o["freed_bytes"] for o in done),
        "outcomes": done,
        "interrupted": interrupts.requested(),
    }
    if not done:
        return summary
    with interrupts.held(), open_warehouse(db) as wh, wh.transaction() as con:
        applied_at = datetime.now(UTC).replace(tzinfo=None)
        con.executemany(
            "INSERT INTO prune_log VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    applied_at,
                    str(plan_path),
                    o["path"],
                    o.get("rule"),
                    o.get("run_id"),
                    o["freed_bytes"],
                    o["status"],
                    o.get("reason"),
                )
                for o in done
            ],
        )
        deleted = [o["path"] for o in done if o["status"] == "deleted"]
        if deleted:
            con.execute("DELETE FROM checkpoints WHERE list_contains(?, path)", [deleted])
            con.execute("DELETE FROM checkpoint_runs WHERE list_contains(?, path)", [deleted])
    return summary


def _apply_one(entry: dict, roots: set[str]) -> dict:
    path, root = Path(entry["path"]), Path(entry["root"])
    outcome = {
        "path": str(path),
        "rule": entry.get("rule"),
        "run_id": entry.get("run_id"),
        "freed_bytes": 0,
    }

    def skip(reason: str) -> dict:
        return {**outcome, "status": "skipped", "reason": reason}

    if entry["root"] not in roots:
        return skip("its root is not an ingested checkpoint root")
    if not inside(path, root) or path == root:
        return skip("no longer inside its checkpoint root")
    if os.path.islink(path):
        return skip("is a symlink")
    now = measure(path)
    if now is None:
        return skip("no longer exists")
    if (
        now.bytes != entry["bytes"]
        or now.mtime_ns != entry["mtime_ns"]
        or now.fingerprint != entry.get("fingerprint", now.fingerprint)
    ):
        return skip(f"changed since planning ({now.bytes} bytes now, {entry['bytes']} planned)")
    errors: list[str] = []
    try:
        if now.is_dir:
            shutil.rmtree(path, onerror=lambda fn, p, info: errors.append(f"{p}: {info[1]}"))
        else:
            os.unlink(path)
    except OSError as exc:
        errors.append(str(exc))
    if errors:
        left = measure(path)
        freed = entry["bytes"] - (left.bytes if left else 0)
        return {
            **outcome,
            "status": "skipped",
            "reason": "; ".join(errors)[:500],
            "freed_bytes": max(freed, 0),
        }
    return {**outcome, "status": "deleted", "freed_bytes": entry["bytes"]}

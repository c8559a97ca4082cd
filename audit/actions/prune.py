"""``audit prune``: delete exactly the reclaimable checkpoints a plan lists, nothing else.

Planning reads the current CKP findings and records, for every reclaimable path, its
size, modification time and a fingerprint of every file below it. Orphan checkpoints
(CKP003) are planned only when asked for (``include_orphans``), each with the reason no
run claims it.

Applying trusts nothing in the plan but the list of paths to consider. Each path is
deleted only when all of these hold at that moment:

- it is absolute, free of NUL bytes, ``.``/``..`` and symlinks (``realpath`` gives it back
  unchanged), and lies strictly inside its checkpoint root as the warehouse records it;
- it is a checkpoint of the warehouse inventory (not merely a file under a root), and an
  orphan only when the plan was made with orphans included;
- it is not protected, as derived again now from the warehouse and from the files: a
  best checkpoint (the inventory, or any ``trainer_state.json`` of its folder), the last
  of its run or of its folder (highest step or newest, among the checkpoints on disk now),
  or a registered model's source (through ``[links] path_prefixes`` of the config in force);
- it is unchanged since planning (size, time and the fingerprint of every file), or it is
  what an interrupted earlier apply left of it (see below).

Every outcome is appended to the manifest, and before deleting an entry a ``started``
record with the list of its files is appended and synced. Deletion walks from the root
with ``O_NOFOLLOW`` folder handles, so a folder swapped for a symlink after the checks is
never followed. If the process is killed while deleting an entry, applying the plan again
finds the ``started`` record: when what is left of the entry is a subset of the files
recorded there (same names, sizes, times and inodes), it finishes the deletion; when
anything else is there, it skips the entry and says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from audit import interrupts
from audit.atomic import AppendOnlyLog, read_log, warehouse_lock
from audit.config import Config
from audit.errors import InputError
from audit.facts.checkpoints import (
    kept_by_suppression,
    last_of_groups,
    orphan_explainer,
    warehouse_checkpoints,
)
from audit.importers.checkpoints import best_candidates, checkpoint_entry, read_trainer_state
from audit.rule_registry import select_rules
from audit.scans import apply_suppressions, run_rules
from audit.suppressions import Suppressions
from audit.walk import walk
from audit.warehouse import open_warehouse
from audit.windows import ALL_HISTORY, now_utc

PLAN_VERSION = 1
ORPHAN_RULE = "CKP003"


@dataclass
class Measure:
    bytes: int
    mtime_ns: int
    is_dir: bool
    # every entry's name, size and time: a file put back with an older time or swapped
    # for another of the same size changes this, not the newest time or the total
    fingerprint: str
    # (relative path, type, size, mtime_ns, inode) of the entry and everything below it
    files: list[list] = field(default_factory=list)


def measure(path: Path) -> Measure | None:
    """Size, newest modification time and file list, never following a symlink; None when
    gone or a symlink."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(info.st_mode):
        return None
    digest = hashlib.sha256()
    if not stat.S_ISDIR(info.st_mode):
        digest.update(f"{info.st_size}:{info.st_mtime_ns}:{info.st_ino}".encode())
        files = [[".", _kind(info.st_mode), info.st_size, info.st_mtime_ns, info.st_ino]]
        return Measure(info.st_size, info.st_mtime_ns, False, digest.hexdigest(), files)
    total, newest = 0, info.st_mtime_ns
    files = [[".", "d", 0, 0, info.st_ino]]

    for dirpath, dirnames, filenames in walk(path):
        for name in filenames + dirnames:
            full = os.path.join(dirpath, name)
            entry = os.lstat(full)
            if stat.S_ISREG(entry.st_mode) and name in filenames:
                total += entry.st_size
            newest = max(newest, entry.st_mtime_ns)
            relative = os.path.relpath(full, path)
            digest.update(
                f"{relative}\0{entry.st_mode}:{entry.st_size}:{entry.st_mtime_ns}:{entry.st_ino}\n".encode()
            )
            kind = _kind(entry.st_mode)
            # a folder's own size and time change as its files go: only its name counts
            files.append(
                [relative, kind, 0, 0, 0]
                if kind == "d"
                else [relative, kind, entry.st_size, entry.st_mtime_ns, entry.st_ino]
            )
    return Measure(total, newest, True, digest.hexdigest(), files)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISREG(mode):
        return "f"
    if stat.S_ISLNK(mode):
        return "l"
    return "o"


def canonical_problem(path: object) -> str | None:
    """Why ``path`` is not a plain absolute path that resolves to itself, or None."""
    if not isinstance(path, str) or not path:
        return "the path is not a string"
    if "\0" in path:
        return "the path contains a NUL byte"
    if not os.path.isabs(path):
        return "the path is not absolute"
    if os.path.normpath(path) != path or path.startswith("//"):
        return "the path has '.', '..', '//' or a trailing '/' in it"
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return "the path cannot be resolved"
    if real != path:
        if os.path.islink(path):
            return "it is a symlink"
        return f"it is reached through a symlink (it resolves to {real})"
    return None


def inside(path: str, root: str) -> bool:
    """``path`` lies strictly inside ``root``; both resolve to themselves (no '..', no
    symlinked folder on the way, whatever mount-style prefix they were written with)."""
    if canonical_problem(path) or canonical_problem(root):
        return False
    return path.startswith(root.rstrip("/") + "/") and path != root


class Inventory:
    """The warehouse's checkpoints with the protection the warehouse gives them."""

    def __init__(self, rows: list[dict], kept: dict[str, str]):
        self.rows = {r["path"]: r for r in rows}
        self.kept = kept  # path -> the suppression that keeps it
        self.states = TrainerStates()

    @classmethod
    def load(cls, con, config: Config) -> Inventory:
        rows = warehouse_checkpoints(con, config)
        return cls(rows, kept_by_suppression(rows, Suppressions.load(con, config)))

    def protection_now(self, path: str) -> list[str]:
        """Reasons to keep ``path``: from the warehouse, the suppressions in force, and the
        files as they are now."""
        row = self.rows[path]
        reasons = list(row["protected"])
        if path in self.kept:
            reasons.append(f"kept by a suppression ({self.kept[path]})")
        folder = os.path.dirname(path)
        on_disk, best, unreadable = _folder_on_disk(folder, self.states)
        if unreadable:
            reasons.append(f"the best checkpoint cannot be told ({unreadable})")
        if path in best and "best" not in reasons:
            reasons.append("best (trainer_state.json on disk)")
        if on_disk and path in last_of_groups(on_disk, lambda r: folder):
            reasons.append("last of its folder on disk")
        return reasons


class TrainerStates:
    """``trainer_state.json`` files read again only when their size, time or inode
    changed: each entry re-derives protection from its whole folder, and these files
    grow to megabytes on long runs."""

    def __init__(self):
        self.seen: dict[str, tuple[tuple, dict]] = {}

    def read(self, checkpoint: Path) -> dict:
        try:
            info = os.stat(checkpoint / "trainer_state.json", follow_symlinks=False)
        except FileNotFoundError:
            return {}
        signature = (info.st_size, info.st_mtime_ns, info.st_ino, info.st_mode)
        known = self.seen.get(str(checkpoint))
        if known is not None and known[0] == signature:
            return known[1]
        state = read_trainer_state(checkpoint)
        self.seen[str(checkpoint)] = (signature, state)
        return state


def _folder_on_disk(folder: str, states: TrainerStates) -> tuple[list[dict], set[str], str | None]:
    """The checkpoints in ``folder`` now (path, step, time), the best ones the newest
    trainer state among them names (an older state's best is history), and what could not
    be read (None when everything could)."""
    rows: list[dict] = []
    newest: tuple[int, set[str]] | None = None
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        return rows, set(), f"{folder}: {exc.strerror}"
    for entry in entries:
        try:
            row = checkpoint_entry(entry)
            if row is None:
                continue
            if row["kind"] == "hf":
                state = states.read(Path(entry.path))
                if isinstance(state.get("global_step"), int):
                    row["step"] = state["global_step"]
                if state and (newest is None or row["step"] > newest[0]):
                    newest = (row["step"], best_candidates(state, Path(folder)))
        except (OSError, InputError) as exc:
            return rows, set(), f"{entry.path}: {getattr(exc, 'strerror', None) or exc}"
        rows.append(row)
    return rows, newest[1] if newest else set(), None


def make_plan(db: Path, config: Config, include_orphans: bool = False) -> dict:
    with open_warehouse(db, read_only=True) as wh:
        results = run_rules(wh.con, config, select_rules("CKP", None), ALL_HISTORY)
        apply_suppressions(wh.con, config, results)
        inventory = Inventory.load(wh.con, config)
        why_orphan = orphan_explainer(wh.con)
    skipped = [f"{r.rule}: {r.reason}" for r in results if r.status != "ok"]
    entries, refused, seen, kept = [], [], set(), []
    orphans_left_out = 0
    for result in results:
        for finding in result.findings:
            items = finding.evidence.get("reclaimable") or []
            if finding.suppressed:
                kept.extend(
                    {"path": item["path"], "reason": finding.suppressed_reason}
                    for item in items or finding.evidence.get("checkpoints") or []
                )
                continue
            if finding.rule == ORPHAN_RULE:
                # CKP003 lists a folder's orphans, best and last included: never planned
                items = [
                    {**item, "why": why_orphan(finding.subject.get("run_dir") or "")}
                    for item in finding.evidence.get("checkpoints") or []
                    if not inventory.rows.get(item["path"], {}).get("protected")
                ]
                if not include_orphans:
                    orphans_left_out += len(items)
                    continue
            for item in items:
                path = item["path"]
                if path in seen:
                    continue
                seen.add(path)
                problem = _refusal(path, inventory, include_orphans)
                now = None if problem else _measure_or_problem(path)
                if isinstance(now, str):
                    problem, now = now, None
                if problem:
                    refused.append({"path": path, "reason": problem})
                    continue
                row = inventory.rows[path]
                reason = finding.message
                if finding.rule == ORPHAN_RULE:
                    reason = f"orphan: {item.get('why') or finding.message}"
                entries.append(
                    {
                        "path": path,
                        "root": row["root"],
                        "bytes": now.bytes,
                        "mtime_ns": now.mtime_ns,
                        "fingerprint": now.fingerprint,
                        "is_dir": now.is_dir,
                        "rule": finding.rule,
                        "run_id": finding.subject.get("run_id") or row["run_id"],
                        "reason": reason,
                    }
                )
    return {
        "version": PLAN_VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "warehouse": str(db),
        "include_orphans": include_orphans,
        "entries": sorted(entries, key=lambda e: e["path"]),
        "refused": refused,
        "orphans_left_out": orphans_left_out,
        "kept_by_suppression": sorted(kept, key=lambda k: k["path"]),
        "rules_skipped": skipped,
        "total_bytes": sum(e["bytes"] for e in entries),
    }


def _measure_or_problem(path: str) -> Measure | str:
    try:
        now = measure(Path(path))
    except OSError as exc:
        return f"cannot be measured ({exc.strerror}: {exc.filename})"
    return now if now is not None else "missing or a symlink"


def _refusal(path: object, inventory: Inventory, include_orphans: bool) -> str | None:
    """Why ``path`` must not be deleted now (None: it may be, if unchanged)."""
    problem = canonical_problem(path)
    if problem:
        return problem
    row = inventory.rows.get(path)
    if row is None:
        return "not a checkpoint in the warehouse inventory (only those are ever deleted)"
    if not inside(path, row["root"]):
        return f"not strictly inside its checkpoint root {row['root']} (or the root moved)"
    if row["run_id"] is None and not include_orphans:
        return "an orphan (no run claims it) in a plan made without --include-orphans"
    reasons = inventory.protection_now(path)
    if reasons:
        return f"protected now: {', '.join(reasons)}"
    return None


def load_plan(path: Path) -> dict:
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{path}: no such plan file; create one with audit prune --plan {path}"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{path}: not a readable plan ({type(exc).__name__}: {exc})") from None
    if (
        not isinstance(plan, dict)
        or plan.get("version") != PLAN_VERSION
        or not isinstance(plan.get("entries"), list)
    ):
        raise InputError(f"{path}: not an audit prune plan (version {PLAN_VERSION})")
    for number, entry in enumerate(plan["entries"], start=1):
        if not isinstance(entry, dict) or not {"path", "root", "bytes", "mtime_ns"} <= set(entry):
            raise InputError(f"{path}: entry {number} lacks path, root, bytes or mtime_ns")
        if not isinstance(entry["path"], str):
            raise InputError(f"{path}: entry {number}: path is not a string")
    return plan


def apply_plan(plan_path: Path, db: Path, manifest_path: Path, config: Config) -> dict:
    plan = load_plan(plan_path)
    include_orphans = plan.get("include_orphans") is True
    # One apply at a time per warehouse: two applies of one plan (or of two plans that
    # share entries) would both measure an entry, both delete it and both count its bytes.
    # The lock is taken before the inventory and the manifest are read, so the second
    # apply sees what the first one deleted.
    with _apply_lock(db), interrupts.held():
        with open_warehouse(db, read_only=True) as wh:
            inventory = Inventory.load(wh.con, config)
        # the last record of each path in earlier applies of this manifest
        history = {r.get("path"): r for r in read_log(manifest_path) if isinstance(r, dict)}
        # Ctrl-C is held from the first entry to the warehouse's record of the last: it
        # stops the loop before the next entry, never inside one (a half-deleted checkpoint
        # the manifest does not mention is what the user would lose), and never between an
        # entry's record in the manifest and its record in the warehouse.
        done = _apply_entries(plan, inventory, include_orphans, history, manifest_path)
        summary = {
            "planned": len(plan["entries"]),
            "deleted": sum(1 for o in done if o["status"] == "deleted"),
            "skipped": sum(1 for o in done if o["status"] != "deleted"),
            "freed_bytes": sum(o["freed_bytes"] for o in done),
            "outcomes": done,
            "interrupted": interrupts.requested(),
        }
        if done:
            _record_applied(db, plan_path, done)
    return summary


def _apply_lock(db: Path):
    """An exclusive lock on ``<warehouse>.prune-lock`` for the whole apply, or InputError
    naming the process that holds it."""
    return warehouse_lock(
        db,
        "prune",
        f"another audit prune --apply is running on {db} (process {{holder}}); "
        "nothing was deleted by this one: run it again when that one ends",
    )


def _apply_entries(
    plan: dict, inventory: Inventory, include_orphans: bool, history: dict, manifest_path: Path
) -> list[dict]:
    done = []
    with AppendOnlyLog(manifest_path) as manifest:
        for entry in plan["entries"]:
            if interrupts.requested():
                break
            try:
                outcome = _apply_one(
                    entry, inventory, include_orphans, history.get(entry["path"]), manifest
                )
            except (OSError, InputError, RecursionError, MemoryError, ValueError) as exc:
                # one damaged entry (an unreadable trainer state, a tree too deep to walk)
                # must not stop the plan: what was deleted before it is recorded below
                outcome = {
                    "path": entry["path"],
                    "rule": _text(entry.get("rule")),
                    "run_id": _text(entry.get("run_id")),
                    "freed_bytes": 0,
                    "status": "failed",
                    "reason": f"not deleted: {type(exc).__name__}: {exc}"[:500],
                }
            manifest.append(outcome)
            done.append(outcome)
    return done


def _record_applied(db: Path, plan_path: Path, done: list[dict]) -> None:
    """The outcomes in ``prune_log``; deleted checkpoints leave the inventory."""
    with open_warehouse(db) as wh, wh.transaction() as con:
        applied_at = now_utc()
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
        gone = [o["path"] for o in done if o["status"] == "deleted"]
        if gone:
            con.execute("DELETE FROM checkpoints WHERE list_contains(?, path)", [gone])
            con.execute("DELETE FROM checkpoint_runs WHERE list_contains(?, path)", [gone])


def _apply_one(
    entry: dict,
    inventory: Inventory,
    include_orphans: bool,
    earlier: dict | None,
    manifest: AppendOnlyLog,
) -> dict:
    path = entry["path"]
    outcome = {
        "path": path,
        # a hand-edited plan may put anything there: only text reaches the warehouse
        "rule": _text(entry.get("rule")),
        "run_id": _text(entry.get("run_id")),
        "freed_bytes": 0,
    }

    def skip(reason: str) -> dict:
        return {**outcome, "status": "skipped", "reason": reason}

    interrupted = earlier is not None and earlier.get("status") in ("started", "incomplete")
    problem = canonical_problem(path)
    if problem:
        return skip(problem)
    if path not in inventory.rows and earlier is not None and not os.path.lexists(path):
        return skip("already deleted by an earlier apply (see the manifest)")
    problem = _refusal(path, inventory, include_orphans)
    if problem:
        return skip(problem)
    root = inventory.rows[path]["root"]
    try:
        now = measure(Path(path))
    except OSError as exc:
        return skip(f"cannot be measured ({exc.strerror}: {exc.filename})")
    if now is None:
        if interrupted:
            freed = int(earlier.get("bytes") or 0)
            return {
                **outcome,
                "status": "deleted",
                "freed_bytes": freed,
                "reason": "an earlier apply was stopped after deleting it",
            }
        return skip("no longer exists")
    unchanged = (
        now.bytes == entry["bytes"]
        and now.mtime_ns == entry["mtime_ns"]
        and now.fingerprint == entry.get("fingerprint", now.fingerprint)
    )
    finishing = False
    if not unchanged:
        if not interrupted:
            return skip(f"changed since planning ({now.bytes} bytes now, {entry['bytes']} planned)")
        extra = _not_recorded(now.files, earlier.get("files"))
        if extra:
            return skip(
                "an earlier apply was stopped while deleting it, and it changed since: "
                f"{len(extra)} entries are not in the manifest's record (e.g. {extra[0]}); "
                "check it by hand"
            )
        finishing = True
    planned_bytes = int(earlier.get("bytes") or now.bytes) if finishing else now.bytes
    manifest.append(
        {
            "path": path,
            "status": "started",
            "bytes": planned_bytes,
            "files": now.files,
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )
    errors = _delete(root, path)
    if errors:
        try:
            left = measure(Path(path))
        except OSError:
            left = now
        freed = max(now.bytes - (left.bytes if left else 0), 0)
        return {
            **outcome,
            "status": "incomplete",
            "reason": "; ".join(errors)[:500],
            "freed_bytes": freed,
        }
    done = {**outcome, "status": "deleted", "freed_bytes": planned_bytes}
    if finishing:
        done["reason"] = "finished an entry an earlier apply was stopped while deleting"
    return done


def _text(value: object) -> str | None:
    return value[:200] if isinstance(value, str) else None


def _not_recorded(files: list[list], recorded: object) -> list[str]:
    """Entries of ``files`` that the ``started`` record does not list exactly."""
    if not isinstance(recorded, list):
        return [f[0] for f in files] or ["."]
    known = {tuple(f) for f in recorded if isinstance(f, list)}
    return [f[0] for f in files if tuple(f) not in known]


def _delete(root: str, path: str) -> list[str]:
    """Delete ``path`` through folder handles opened from ``root`` without following links."""
    parts = os.path.relpath(path, root).split(os.sep)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    errors: list[str] = []
    try:
        folder = os.open(root, flags)
    except OSError as exc:
        return [f"{root}: {exc.strerror}"]
    try:
        for part in parts[:-1]:
            inner = os.open(part, flags, dir_fd=folder)
            os.close(folder)
            folder = inner
        name = parts[-1]
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            errors.extend(_remove_tree(folder, name, path))
        elif stat.S_ISREG(info.st_mode):
            os.unlink(name, dir_fd=folder)
        else:
            errors.append(f"{path}: neither a folder nor a regular file now")
    except OSError as exc:
        errors.append(f"{exc.filename or path}: {exc.strerror}")
    finally:
        with contextlib.suppress(OSError):
            os.close(folder)
    return errors


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _remove_tree(parent: int, name: str, path: str) -> list[str]:
    """Delete folder ``name`` of the folder open as ``parent`` and everything in it, never
    following a link, at any depth: one folder handle open at a time (``shutil.rmtree``
    recurses once per level and holds a handle per level: a tree 1,500 deep raised
    RecursionError halfway through a deletion). Going back up opens ``..`` and checks it
    is the folder it came from; a folder moved meanwhile stops the deletion there."""
    errors: list[str] = []
    failed: set[tuple[int, int]] = set()  # entries that could not be deleted: not retried
    try:
        current = os.open(name, _FOLDER_FLAGS, dir_fd=parent)
    except OSError as exc:
        return [f"{path}: {exc.strerror}"]
    above: list[tuple[tuple[int, int], str]] = []  # (identity of the folder above, my name)
    where = [path]
    try:
        while True:
            child = None
            with os.scandir(current) as entries:
                listed = sorted(entries, key=lambda e: e.name)
            for entry in listed:
                info = entry.stat(follow_symlinks=False)
                if (info.st_dev, info.st_ino) in failed:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    child = entry.name
                    break
                try:
                    os.unlink(entry.name, dir_fd=current)
                except OSError as exc:
                    failed.add((info.st_dev, info.st_ino))
                    errors.append(f"{where[-1]}/{entry.name}: {exc.strerror}")
            if child is not None:
                inner = os.open(child, _FOLDER_FLAGS, dir_fd=current)
                above.append((_identity(current), child))
                where.append(f"{where[-1]}/{child}")
                os.close(current)
                current = inner
                continue
            mine = _identity(current)
            if not above:
                os.close(current)
                current = -1
                try:
                    os.rmdir(name, dir_fd=parent)
                except OSError as exc:
                    errors.append(f"{path}: {exc.strerror}")
                return errors
            expected, my_name = above.pop()
            up = os.open("..", _FOLDER_FLAGS, dir_fd=current)
            os.close(current)
            current = up
            if _identity(current) != expected:
                errors.append(f"{where[-1]}: its folder was moved while it was deleted; stopped")
                return errors
            where.pop()
            try:
                os.rmdir(my_name, dir_fd=current)
            except OSError as exc:
                failed.add(mine)
                errors.append(f"{where[-1]}/{my_name}: {exc.strerror}")
    except OSError as exc:
        errors.append(f"{exc.filename or where[-1]}: {exc.strerror}")
        return errors
    finally:
        if current >= 0:
            os.close(current)

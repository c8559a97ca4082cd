"""Prune keeps what users keep on purpose, and claims checkpoints by their closest folder.

Each case was seen deleting data on the code before it was fixed: a run tagged
``audit.ignore=CKP001`` lost 5 of its 6 checkpoints; ``[[suppress]] rule = "CKP", subject =
"*"`` planned and deleted everything; a run that logged a parent folder as ``output_dir``
took over a sibling run's checkpoints and let orphans below it be deleted without
``--include-orphans``; two concurrent applies counted freed bytes twice; one damaged entry
stopped an apply with the entries already deleted unrecorded; an older trainer state that
once named itself best kept its checkpoint forever.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from mlflow import MlflowClient
from mlflow.entities import Param, RunTag

from tests.cli.test_prune_cases import plan_paths, write_config
from tests.helpers import REPO, hf_checkpoint


def _runs(store: Path, runs: dict[str, str], tags: dict[str, dict[str, str]] | None = None):
    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.create_experiment("e")
    ids = {}
    for name, output_dir in runs.items():
        run = client.create_run(experiment, run_name=name)
        client.log_batch(
            run.info.run_id,
            params=[Param("output_dir", output_dir)],
            tags=[RunTag(k, v) for k, v in (tags or {}).get(name, {}).items()],
        )
        client.set_terminated(run.info.run_id)
        ids[name] = run.info.run_id
    return ids


def _setup(tmp_path, run_cli, runs, tags=None, extra_config=""):
    root = tmp_path / "scratch"
    store = tmp_path / "mlruns"
    ids = _runs(store, runs, tags)
    config = write_config(tmp_path / "audit.toml")
    if extra_config:
        config.write_text(config.read_text() + extra_config)
    db = tmp_path / "w.duckdb"
    base = ("--db", str(db), "--config", str(config))
    assert run_cli(*base, "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0
    assert run_cli(*base, "ingest", "checkpoints", str(root))[0] == 0
    return base, db, ids


def _six(run_dir: Path) -> list[Path]:
    folders = [run_dir / f"checkpoint-{step}" for step in (100, 200, 300, 400, 500, 600)]
    for folder in folders:
        hf_checkpoint(folder)
    return folders


def test_a_run_tagged_audit_ignore_keeps_every_checkpoint(tmp_path, run_cli):
    run_dir = tmp_path / "scratch" / "kept"
    folders = _six(run_dir)
    other = _six(tmp_path / "scratch" / "other")
    base, _, _ = _setup(
        tmp_path,
        run_cli,
        {"kept": str(run_dir), "other": str(other[0].parent)},
        tags={"kept": {"audit.ignore": "CKP001"}},
    )
    plan_file = tmp_path / "plan.json"
    code, _, err = run_cli(*base, "prune", "--plan", str(plan_file))
    assert code == 0, err
    planned = plan_paths(plan_file)
    assert not any(p.startswith(str(run_dir) + "/") for p in planned)
    assert len(planned) == 5  # the other run: all but its last
    kept = json.loads(plan_file.read_text())["kept_by_suppression"]
    assert {k["path"] for k in kept} == {str(f) for f in folders[:5]}
    assert "audit.ignore=CKP001" in kept[0]["reason"]
    assert "kept by a suppression" in err

    # a hand-edited plan that lists them anyway is refused at apply
    plan = json.loads(plan_file.read_text())
    template = plan["entries"][0]
    from audit.actions.prune import measure

    for folder in folders[:5]:
        now = measure(folder)
        plan["entries"].append(
            {
                **template,
                "path": str(folder),
                "bytes": now.bytes,
                "mtime_ns": now.mtime_ns,
                "fingerprint": now.fingerprint,
            }
        )
    plan_file.write_text(json.dumps(plan))
    code, out, err = run_cli(*base, "prune", "--apply", str(plan_file))
    assert code == 0, err
    assert all(f.is_dir() for f in folders)
    assert err.count("kept by a suppression") == 5
    assert "deleted 5 entries" in out


def test_a_config_suppression_of_the_family_keeps_everything_even_in_an_older_plan(
    tmp_path, run_cli
):
    run_dir = tmp_path / "scratch" / "r"
    folders = _six(run_dir)
    base, _, _ = _setup(tmp_path, run_cli, {"r": str(run_dir)})
    plan_file = tmp_path / "plan.json"
    assert run_cli(*base, "prune", "--plan", str(plan_file))[0] == 0
    assert len(plan_paths(plan_file)) == 5

    # the suppression is added after the plan was made: apply re-checks it
    config = Path(base[3])
    config.write_text(
        config.read_text() + '[[suppress]]\nrule = "CKP"\nsubject = "*"\nreason = "paper"\n'
    )
    code, out, err = run_cli(*base, "prune", "--apply", str(plan_file))
    assert code == 0, err
    assert all(f.is_dir() for f in folders)
    assert "deleted 0 entries" in out
    assert "config: paper" in err

    # and a new plan plans nothing
    code, out, err = run_cli(*base, "prune", "--plan", str(plan_file))
    assert code == 0 and plan_paths(plan_file) == []


def test_rule_and_subject_patterns_cover_ckp(tmp_path, run_cli):
    keep_dir, drop_dir = tmp_path / "scratch" / "keep-me", tmp_path / "scratch" / "drop"
    _six(keep_dir)
    _six(drop_dir)
    base, _, _ = _setup(
        tmp_path,
        run_cli,
        {"a": str(keep_dir), "b": str(drop_dir)},
        extra_config='[[suppress]]\nrule = "*"\nsubject = "*/keep-me"\nreason = "ablation"\n',
    )
    plan_file = tmp_path / "plan.json"
    assert run_cli(*base, "prune", "--plan", str(plan_file))[0] == 0
    planned = plan_paths(plan_file)
    assert planned and all(p.startswith(str(drop_dir) + "/") for p in planned)
    # scan mutes the same finding
    _code, out, _ = run_cli(*base, "scan", "--select", "CKP", "--format", "json")
    findings = json.loads(out)["findings"]
    muted = {f["subject"]["run_dir"]: f["suppressed"] for f in findings}
    assert muted == {str(keep_dir): True, str(drop_dir): False}


def test_a_broad_output_dir_claims_neither_sibling_runs_nor_orphans(tmp_path, run_cli):
    root = tmp_path / "scratch"
    own = _six(root)  # the broad run's own checkpoints, straight in its output_dir
    exact = _six(root / "exact")
    orphans = _six(root / "nobody")
    lightning = root / "lightning_logs" / "version_0" / "checkpoints"
    lightning.mkdir(parents=True)
    (lightning / "epoch=1-step=10.ckpt").write_bytes(b"c" * 100)
    (lightning / "epoch=2-step=20.ckpt").write_bytes(b"c" * 100)
    # "exact" sorts after "broad" by run id in half the cases: the closest folder must win
    # whatever the ids are
    base, db, ids = _setup(tmp_path, run_cli, {"broad": str(root), "exact": str(root / "exact")})
    con = duckdb.connect(str(db), read_only=True)
    owner = dict(con.execute("SELECT path, run_id FROM checkpoint_runs").fetchall())
    con.close()
    assert {owner[str(p)] for p in own} == {ids["broad"]}
    assert {owner[str(p)] for p in exact} == {ids["exact"]}
    assert not any(str(p) in owner for p in orphans)
    # a framework's own folders below the output_dir are the run's
    assert owner[str(lightning / "epoch=1-step=10.ckpt")] == ids["broad"]

    plan_file = tmp_path / "plan.json"
    code, _, err = run_cli(*base, "prune", "--plan", str(plan_file))
    assert code == 0, err
    planned = set(plan_paths(plan_file))
    assert not planned & {str(p) for p in orphans}, "orphans planned without --include-orphans"
    assert "5 orphan checkpoints" in err  # the folder's last is kept anyway
    assert {str(p) for p in exact[:5]} <= planned
    code, _, err = run_cli(*base, "prune", "--include-orphans", "--plan", str(plan_file))
    assert code == 0
    assert {str(p) for p in orphans[:5]} <= set(plan_paths(plan_file))


def test_one_apply_at_a_time_and_freed_bytes_counted_once(tmp_path, run_cli):
    run_dir = tmp_path / "scratch" / "r"
    _six(run_dir)
    base, db, _ = _setup(tmp_path, run_cli, {"r": str(run_dir)})
    plan_file = tmp_path / "plan.json"
    assert run_cli(*base, "prune", "--plan", str(plan_file))[0] == 0
    total = json.loads(plan_file.read_text())["total_bytes"]

    # a held lock: the apply stops before touching anything, with exit 2
    lock = os.open(f"{db}.prune-lock", os.O_RDWR | os.O_CREAT)
    os.write(lock, b"4242")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        code, _out, err = run_cli(*base, "prune", "--apply", str(plan_file))
    finally:
        os.close(lock)
    assert code == 2
    assert "another audit prune --apply is running" in err and "4242" in err
    assert len(list(run_dir.iterdir())) == 6

    # two real processes at once: one applies, the other is refused or finds it done
    command = [sys.executable, "-m", "audit", *base, "prune", "--apply", str(plan_file)]
    procs = [
        subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert sorted(p.returncode for p in procs) in ([0, 0], [0, 2])
    con = duckdb.connect(str(db), read_only=True)
    freed = con.execute("SELECT sum(bytes) FROM prune_log WHERE status = 'deleted'").fetchall()[0][
        0
    ]
    con.close()
    assert freed == total, results
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint-600"]


def _deep_tree(folder: Path, depth: int) -> None:
    """``folder/d/d/...``, deeper than Python's recursion limit and than PATH_MAX allows
    to name in one path."""
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=handle)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=handle)
        os.close(handle)
        handle = inner
    with open(os.open("weights.bin", os.O_WRONLY | os.O_CREAT, dir_fd=handle), "wb") as fh:
        fh.write(b"w" * 10)
    os.close(handle)


@pytest.fixture
def deep_tmp(tmp_path):
    """tmp_path, emptied without recursion afterwards: a tree deeper than the recursion
    limit left behind would break pytest's own clean-up of old folders (shutil.rmtree)."""
    yield tmp_path
    from audit.actions.prune import _remove_tree

    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in os.listdir(parent):
            if os.path.isdir(tmp_path / name) and not os.path.islink(tmp_path / name):
                _remove_tree(parent, name, str(tmp_path / name))
    finally:
        os.close(parent)


def test_a_damaged_entry_is_recorded_as_failed_and_the_apply_goes_on(deep_tmp, run_cli):
    tmp_path = deep_tmp
    first, second = tmp_path / "scratch" / "a", tmp_path / "scratch" / "b"
    a = _six(first)
    b = _six(second)
    # a planned entry holding a tree 1,500 folders deep: measured and deleted all the same
    _deep_tree(a[0], 1500)
    base, db, _ = _setup(tmp_path, run_cli, {"a": str(first), "b": str(second)})
    plan_file = tmp_path / "plan.json"
    assert run_cli(*base, "prune", "--plan", str(plan_file))[0] == 0
    assert len(plan_paths(plan_file)) == 10
    # after planning, b's folder gets a trainer state nested too deep to read
    (second / "checkpoint-700").mkdir()
    (second / "checkpoint-700" / "trainer_state.json").write_text("[" * 100_000 + "]" * 100_000)
    code, _out, err = run_cli(*base, "prune", "--apply", str(plan_file))
    assert code == 0, err
    # a's five entries are deleted and recorded; b's are refused (the best checkpoint of
    # their folder cannot be told), never half-done and unrecorded
    assert sorted(p.name for p in first.iterdir()) == ["checkpoint-600"]
    assert all(f.is_dir() for f in b)
    assert "the best checkpoint cannot be told" in err
    con = duckdb.connect(str(db), read_only=True)
    statuses = dict(con.execute("SELECT path, status FROM prune_log").fetchall())
    con.close()
    assert len(statuses) == 10
    assert sum(1 for s in statuses.values() if s == "deleted") == 5
    manifest = [
        json.loads(line)
        for line in (tmp_path / "plan.json.manifest.jsonl").read_text().splitlines()
    ]
    assert sum(1 for r in manifest if r["status"] == "deleted") == 5


def test_only_the_newest_trainer_state_names_the_best_checkpoint(tmp_path, run_cli):
    run_dir = tmp_path / "scratch" / "r"
    # checkpoint-100 once named itself best; from step 300 on the trainer named 300
    hf_checkpoint(run_dir / "checkpoint-100", best=str(run_dir / "checkpoint-100"))
    hf_checkpoint(run_dir / "checkpoint-200", best=str(run_dir / "checkpoint-100"))
    for step in (300, 400, 500):
        hf_checkpoint(run_dir / f"checkpoint-{step}", best=str(run_dir / "checkpoint-300"))
    base, db, _ = _setup(tmp_path, run_cli, {"r": str(run_dir)})
    con = duckdb.connect(str(db), read_only=True)
    best = [p for (p,) in con.execute("SELECT path FROM checkpoints WHERE is_best").fetchall()]
    con.close()
    assert best == [str(run_dir / "checkpoint-300")]
    plan_file = tmp_path / "plan.json"
    assert run_cli(*base, "prune", "--plan", str(plan_file))[0] == 0
    assert sorted(Path(p).name for p in plan_paths(plan_file)) == [
        "checkpoint-100",
        "checkpoint-200",
        "checkpoint-400",
    ]
    assert run_cli(*base, "prune", "--apply", str(plan_file))[0] == 0
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint-300", "checkpoint-500"]

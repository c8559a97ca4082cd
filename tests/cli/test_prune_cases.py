"""The cases of issue 13 where prune broke its promises, one test each, on real trees.

Every tree here is real folders and files, every run is logged by the real MLflow client
into a file store, every command goes through the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pytest
from mlflow import MlflowClient
from mlflow.entities import Param

from tests.helpers import REPO, SHARED, audit_process, hf_checkpoint

SAMPLE = REPO / "sample_logs"


def log_runs(store: Path, runs: dict[str, str], registered: dict[str, str] | None = None) -> dict:
    """Runs named by key with the output_dir they logged; registered: run name -> source."""
    client = MlflowClient(tracking_uri=store.as_uri(), registry_uri=store.as_uri())
    experiment = client.create_experiment("e")
    ids = {}
    for name, output_dir in runs.items():
        run = client.create_run(experiment, run_name=name)
        client.log_batch(run.info.run_id, params=[Param("output_dir", output_dir)])
        client.set_terminated(run.info.run_id)
        ids[name] = run.info.run_id
    for index, (name, source) in enumerate((registered or {}).items()):
        client.create_registered_model(f"model-{index}")
        client.create_model_version(f"model-{index}", source, run_id=ids[name])
    return ids


def write_config(path: Path, prefixes: dict[str, str] | None = None) -> Path:
    text = "[rules.CKP001]\nmin_reclaimable_gb = 0\n[rules.CKP003]\nmin_gb = 0\n"
    if prefixes:
        text += "[links]\npath_prefixes = { " + ", ".join(
            f'"{k}" = "{v}"' for k, v in prefixes.items()
        )
        text += " }\n"
    path.write_text(text)
    return path


def plan_paths(plan_file: Path) -> list[str]:
    return [e["path"] for e in json.loads(plan_file.read_text())["entries"]]


def links(db: Path) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM checkpoint_runs").fetchall()[0][0]
    finally:
        con.close()


@pytest.fixture
def tree(tmp_path, run_cli):
    """root/run-a/checkpoint-100..500 (best 200, last 500) of run a, a note, an outside file."""
    root, run_dir = tmp_path / "scratch", tmp_path / "scratch" / "run-a"
    for step in (100, 200, 300, 400, 500):
        hf_checkpoint(run_dir / f"checkpoint-{step}", best=str(run_dir / "checkpoint-200"))
    (root / "notes.txt").write_text("not a checkpoint\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.bin").write_bytes(b"p" * 500)
    log_runs(tmp_path / "mlruns", {"a": str(run_dir)})
    db, config = tmp_path / "w.duckdb", write_config(tmp_path / "audit.toml")
    base = ("--db", str(db), "--config", str(config))
    assert run_cli(*base, "ingest", "mlflow", "--tracking-uri", str(tmp_path / "mlruns"))[0] == 0
    assert run_cli(*base, "ingest", "checkpoints", str(root))[0] == 0
    return {"root": root, "run_dir": run_dir, "outside": outside, "base": base, "tmp": tmp_path}


# -- case 1 ------------------------------------------------------------------------------------
def test_a_hand_edited_plan_deletes_nothing_but_inventoried_checkpoints(tree, run_cli):
    """`<root>/run/..` measured on that path once deleted the whole root, a text file too."""
    from audit.actions.prune import measure

    root, run_dir, outside = tree["root"], tree["run_dir"], tree["outside"]
    plan_file = tree["tmp"] / "plan.json"
    assert run_cli(*tree["base"], "prune", "--plan", str(plan_file))[0] == 0
    plan = json.loads(plan_file.read_text())
    template = plan["entries"][0]

    def entry(path: str, measured: Path) -> dict:
        now = measure(measured)
        return {
            **template,
            "path": path,
            "bytes": now.bytes,
            "mtime_ns": now.mtime_ns,
            "fingerprint": now.fingerprint,
            "is_dir": now.is_dir,
        }

    plan["entries"] = [
        entry(f"{run_dir}/..", root),  # walks back up to the root
        entry(f"{run_dir}/checkpoint-300/../../run-a", run_dir),
        entry(str(root / "notes.txt"), root / "notes.txt"),  # under the root, no checkpoint
        entry(str(outside / "precious.bin"), outside / "precious.bin"),  # elsewhere
        {**template, "path": f"{run_dir}/checkpoint-300\x00/x"},
        entry(f"{run_dir}/checkpoint-200", run_dir / "checkpoint-200"),  # the best
        entry(f"{run_dir}/checkpoint-500", run_dir / "checkpoint-500"),  # the last
    ]
    plan_file.write_text(json.dumps(plan))
    before = sorted(str(p) for p in tree["tmp"].rglob("*"))
    code, out, err = run_cli(*tree["base"], "prune", "--apply", str(plan_file))
    assert code == 0, err
    assert out.startswith("deleted 0 entries"), out
    # what an apply writes itself: its manifest and its lock file beside the warehouse
    own = ("manifest", "prune-lock")
    assert sorted(str(p) for p in tree["tmp"].rglob("*") if not any(o in p.name for o in own)) == [
        p for p in before if not any(o in p for o in own)
    ]
    assert f"{run_dir}/..: the path has '.', '..'" in err
    assert f"{root / 'notes.txt'}: not a checkpoint in the warehouse inventory" in err
    assert f"{outside / 'precious.bin'}: not a checkpoint in the warehouse inventory" in err
    assert "the path contains a NUL byte" in err
    assert f"{run_dir}/checkpoint-200: protected now: best" in err
    assert f"{run_dir}/checkpoint-500: protected now: last" in err


def test_a_symlinked_root_or_entry_is_never_followed(tree, run_cli):
    """The root swapped for a link to elsewhere after planning: nothing is deleted there."""
    root, outside = tree["root"], tree["outside"]
    plan_file = tree["tmp"] / "plan.json"
    assert run_cli(*tree["base"], "prune", "--plan", str(plan_file))[0] == 0
    planned = plan_paths(plan_file)
    moved = tree["tmp"] / "moved"
    root.rename(moved)
    shutil.copytree(moved, outside / "scratch", symlinks=True)
    root.symlink_to(outside / "scratch", target_is_directory=True)
    snapshot = sorted(str(p) for p in outside.rglob("*"))
    code, out, err = run_cli(*tree["base"], "prune", "--apply", str(plan_file))
    assert code == 0 and out.startswith("deleted 0 entries"), err
    assert sorted(str(p) for p in outside.rglob("*")) == snapshot
    assert all(f"{p}: it is reached through a symlink" in err for p in planned)


# -- case 2 ------------------------------------------------------------------------------------
def test_demo_dry_run_never_lists_a_best_or_last_orphan(demo_db, run_cli):
    """old-sweep-0917/checkpoint-4000 is best and last of its folder: never planned."""
    code, out, err = run_cli(
        "--db", str(demo_db["db"]), "--config", str(demo_db["config"]), "prune"
    )
    assert code == 0, err
    assert "old-sweep-0917" not in out
    code, out, err = run_cli(
        "--db",
        str(demo_db["db"]),
        "--config",
        str(demo_db["config"]),
        "prune",
        "--include-orphans",
    )
    assert code == 0, err
    assert "old-sweep-0917" not in out


def test_orphans_are_planned_only_on_request_and_never_best_or_last(tmp_path, run_cli):
    root, orphan_dir = tmp_path / "scratch", tmp_path / "scratch" / "old-sweep"
    for step in (100, 200, 300, 400):
        hf_checkpoint(
            orphan_dir / f"checkpoint-{step}", best=f"/cluster/old-sweep/checkpoint-{200}"
        )
    log_runs(tmp_path / "mlruns", {"other": "/cluster/other"})
    db, config = tmp_path / "w.duckdb", write_config(tmp_path / "audit.toml")
    base = ("--db", str(db), "--config", str(config))
    assert run_cli(*base, "ingest", "mlflow", "--tracking-uri", str(tmp_path / "mlruns"))[0] == 0
    assert run_cli(*base, "ingest", "checkpoints", str(root))[0] == 0
    plan_file = tmp_path / "plan.json"
    code, out, err = run_cli(*base, "prune", "--plan", str(plan_file))
    assert code == 0, err
    assert plan_paths(plan_file) == []
    assert "not planned: 2 orphan checkpoints (CKP003, no run claims them)" in err
    code, out, err = run_cli(*base, "prune", "--include-orphans", "--plan", str(plan_file))
    assert code == 0, err
    plan = json.loads(plan_file.read_text())
    assert [os.path.basename(e["path"]) for e in plan["entries"]] == [
        "checkpoint-100",
        "checkpoint-300",
    ]
    assert all(e["reason"].startswith("orphan: no imported run claims it") for e in plan["entries"])
    code, out, err = run_cli(*base, "prune", "--apply", str(plan_file))
    assert code == 0 and out.startswith("deleted 2 entries"), err
    assert sorted(p.name for p in orphan_dir.iterdir()) == ["checkpoint-200", "checkpoint-400"]


# -- case 3 ------------------------------------------------------------------------------------
def test_an_import_without_the_config_keeps_the_links(fresh_demo_db, tmp_path):
    """From another folder, without --config: refused, links and prune outcome unchanged."""
    db = fresh_demo_db["db"]
    before = links(db)
    assert before == 26
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    command = ["ingest", "mlflow", "--tracking-uri", str(SAMPLE / "mlruns")]
    result = subprocess.run(
        [sys.executable, "-m", "audit", "--db", str(db), *command],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stderr
    assert "nothing was imported: this import would unlink 26 checkpoints" in result.stderr
    assert '"/scratch": ' in result.stderr  # names the settings the links were made with
    assert links(db) == before


def test_prefix_mapped_to_a_symlinked_folder_links_checkpoints(tmp_path, run_cli):
    real, link = tmp_path / "real", tmp_path / "mnt"
    for step in (100, 200, 300):
        hf_checkpoint(real / "team" / "run-a" / f"checkpoint-{step}")
    link.symlink_to(real, target_is_directory=True)
    log_runs(tmp_path / "mlruns", {"a": "/scratch/team/run-a"})
    db = tmp_path / "w.duckdb"
    config = write_config(tmp_path / "audit.toml", {"/scratch": str(link)})
    base = ("--db", str(db), "--config", str(config))
    assert run_cli(*base, "ingest", "mlflow", "--tracking-uri", str(tmp_path / "mlruns"))[0] == 0
    assert run_cli(*base, "ingest", "checkpoints", str(link))[0] == 0
    assert links(db) == 3


def test_checkpoints_whose_links_were_lost_keep_best_and_last(tree, run_cli):
    """A warehouse whose links an older version dropped: orphans then, best and last kept."""
    db = Path(tree["base"][1])
    con = duckdb.connect(str(db))
    con.execute("DELETE FROM checkpoint_runs")
    con.close()
    plan_file = tree["tmp"] / "plan.json"
    code, _, err = run_cli(*tree["base"], "prune", "--include-orphans", "--plan", str(plan_file))
    assert code == 0, err
    code, _, err = run_cli(*tree["base"], "prune", "--apply", str(plan_file))
    assert code == 0, err
    assert sorted(p.name for p in tree["run_dir"].iterdir()) == [
        "checkpoint-200",
        "checkpoint-500",
    ]


# -- case 4 ------------------------------------------------------------------------------------
def test_registered_source_given_as_cluster_path_is_kept(tmp_path, run_cli):
    scratch = tmp_path / "scratch"
    run_dir = scratch / "coder" / "ckpt" / "sft-qwen-lr1e-4"
    for step in (500, 1000, 1500, 2000):
        hf_checkpoint(run_dir / f"checkpoint-{step}")
    log_runs(
        tmp_path / "mlruns",
        {"sft": "/scratch/coder/ckpt/sft-qwen-lr1e-4"},
        registered={"sft": "/scratch/coder/ckpt/sft-qwen-lr1e-4/checkpoint-1500"},
    )
    db = tmp_path / "w.duckdb"
    config = write_config(tmp_path / "audit.toml", {"/scratch": str(scratch)})
    base = ("--db", str(db), "--config", str(config))
    assert run_cli(*base, "ingest", "mlflow", "--tracking-uri", str(tmp_path / "mlruns"))[0] == 0
    assert run_cli(*base, "ingest", "checkpoints", str(scratch))[0] == 0
    plan_file = tmp_path / "plan.json"
    assert run_cli(*base, "prune", "--plan", str(plan_file))[0] == 0
    assert [os.path.basename(p) for p in plan_paths(plan_file)] == [
        "checkpoint-1000",
        "checkpoint-500",
    ]
    # planned with the prefixes, applied with a config that lacks them: still kept
    plan = json.loads(plan_file.read_text())
    plan["entries"].append({**plan["entries"][0], "path": str(run_dir / "checkpoint-1500")})
    plan_file.write_text(json.dumps(plan))
    bare = write_config(tmp_path / "bare.toml")
    code, out, err = run_cli(
        "--db", str(db), "--config", str(bare), "prune", "--apply", str(plan_file)
    )
    assert code == 0 and out.startswith("deleted 2 entries"), err
    assert f"{run_dir / 'checkpoint-1500'}: protected now: " in err and "registered model" in err
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint-1500", "checkpoint-2000"]


# -- case 5 ------------------------------------------------------------------------------------
def test_best_recorded_through_a_symlinked_folder_is_best(tmp_path, run_cli):
    real, link = tmp_path / "real", tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    run_dir = real / "run-a"
    for step in (100, 200, 300, 400):
        hf_checkpoint(run_dir / f"checkpoint-{step}", best=str(link / "run-a" / "checkpoint-200"))
    log_runs(tmp_path / "mlruns", {"a": str(run_dir)})
    db, config = tmp_path / "w.duckdb", write_config(tmp_path / "audit.toml")
    base = ("--db", str(db), "--config", str(config))
    assert run_cli(*base, "ingest", "mlflow", "--tracking-uri", str(tmp_path / "mlruns"))[0] == 0
    assert run_cli(*base, "ingest", "checkpoints", str(real))[0] == 0
    con = duckdb.connect(str(db), read_only=True)
    best = con.execute("SELECT path FROM checkpoints WHERE is_best").fetchall()
    con.close()
    assert best == [(str(run_dir / "checkpoint-200"),)]
    plan_file = tmp_path / "plan.json"
    assert run_cli(*base, "prune", "--plan", str(plan_file))[0] == 0
    assert [os.path.basename(p) for p in plan_paths(plan_file)] == [
        "checkpoint-100",
        "checkpoint-300",
    ]


# -- case 6 ------------------------------------------------------------------------------------
def _kill_mid_entry(tmp_path, run_cli, files: int):
    """Apply a plan in a process of its own and kill -9 it while it deletes an entry."""
    root, run_dir = tmp_path / "scratch", tmp_path / "scratch" / "run-a"
    for step in (100, 200, 300, 400):
        hf_checkpoint(
            run_dir / f"checkpoint-{step}",
            best=str(run_dir / "checkpoint-200"),
            files=files if step in (100, 300) else 0,
        )
    log_runs(tmp_path / "mlruns", {"a": str(run_dir)})
    db, config = tmp_path / "w.duckdb", write_config(tmp_path / "audit.toml")
    base = ("--db", str(db), "--config", str(config))
    assert run_cli(*base, "ingest", "mlflow", "--tracking-uri", str(tmp_path / "mlruns"))[0] == 0
    assert run_cli(*base, "ingest", "checkpoints", str(root))[0] == 0
    plan_file = tmp_path / "plan.json"
    assert run_cli(*base, "prune", "--plan", str(plan_file))[0] == 0
    first = run_dir / "checkpoint-100"
    assert plan_paths(plan_file)[0] == str(first)
    total = files + 2
    proc = audit_process(db, "--config", str(config), "prune", "--apply", str(plan_file))
    deadline = time.monotonic() + 60
    while True:
        left = len(os.listdir(first)) if first.exists() else 0
        if 0 < left < total or proc.poll() is not None or time.monotonic() > deadline:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    left = len(os.listdir(first)) if first.exists() else 0
    return {"base": base, "plan": plan_file, "first": first, "left": left, "total": total}


def _half_deleted(tmp_path, run_cli):
    for attempt in range(4):
        folder = tmp_path / f"try-{attempt}"
        folder.mkdir()
        killed = _kill_mid_entry(folder, run_cli, files=5_000)
        if 0 < killed["left"] < killed["total"]:
            return killed
    pytest.fail("the kill never landed while an entry was being deleted")


def test_reapplying_after_kill_9_mid_entry_finishes_it(tmp_path, run_cli):
    killed = _half_deleted(tmp_path, run_cli)
    manifest = killed["plan"].with_name(killed["plan"].name + ".manifest.jsonl")
    records = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    assert records[-1]["status"] == "started" and records[-1]["path"] == str(killed["first"])
    code, out, err = run_cli(*killed["base"], "prune", "--apply", str(killed["plan"]))
    assert code == 0, err
    assert out.startswith("deleted 2 entries"), out + err
    assert not killed["first"].exists()
    assert sorted(p.name for p in killed["first"].parent.iterdir()) == [
        "checkpoint-200",
        "checkpoint-400",
    ]
    records = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    finished = [
        r for r in records if r["path"] == str(killed["first"]) and r["status"] == "deleted"
    ]
    assert (
        finished
        and "finished an entry an earlier apply was stopped while deleting"
        in (finished[0]["reason"])
    )


def test_a_half_deleted_entry_that_changed_since_is_reported_not_deleted(tmp_path, run_cli):
    killed = _half_deleted(tmp_path, run_cli)
    (killed["first"] / "written-later.bin").write_bytes(b"new")
    code, _, err = run_cli(*killed["base"], "prune", "--apply", str(killed["plan"]))
    assert code == 0, err
    assert f"skipped {killed['first']}: an earlier apply was stopped while deleting it" in err
    assert "written-later.bin" in err
    assert (killed["first"] / "written-later.bin").exists()


# -- issue 14, case 10 -------------------------------------------------------------------------
def test_an_unreadable_subfolder_is_skipped_and_named():
    # a folder of its own under /tmp: pytest's are private to root, who reads anything
    work = Path(tempfile.mkdtemp(prefix="audit-unreadable-"))
    root = work / "scratch"
    hf_checkpoint(root / "readable" / "checkpoint-100")
    locked = root / "locked"
    hf_checkpoint(locked / "checkpoint-100")
    db = work / "w.duckdb"
    command = [sys.executable, "-m", "audit", "--db", str(db), "ingest", "checkpoints", str(root)]
    if os.geteuid() == 0:  # root reads anything: run as nobody, who owns the tree
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a folder unreadable")
        for path in [work, *work.rglob("*")]:
            os.chown(path, 65534, 65534, follow_symlinks=False)
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    locked.chmod(0o000)
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "HOME": str(work)}
        )
    finally:
        locked.chmod(0o755)
        shutil.rmtree(work, ignore_errors=True)
    assert result.returncode == 0, result.stderr
    assert f"skipped: {locked}: cannot list (Permission denied)" in result.stderr
    assert result.stdout.startswith("imported 1 checkpoint from 1 root folder")
    assert "skipped 1 unreadable entry)" in result.stdout


# -- real data ---------------------------------------------------------------------------------
def test_real_llamafactory_checkpoints_keep_their_last(tmp_path, run_cli):
    """17 real checkpoint-*/trainer_state.json of a LLaMA-Factory run (best null)."""
    source = SHARED / "llamafactory" / "sft-mistral7b-translator"
    if not source.is_dir():
        pytest.skip(f"{source} not present")
    root = tmp_path / "scratch"
    shutil.copytree(source, root / "translator")
    log_runs(tmp_path / "mlruns", {"other": "/cluster/other"})  # CKP003 needs runs
    db, config = tmp_path / "w.duckdb", write_config(tmp_path / "audit.toml")
    base = ("--db", str(db), "--config", str(config))
    assert run_cli(*base, "ingest", "mlflow", "--tracking-uri", str(tmp_path / "mlruns"))[0] == 0
    code, out, _ = run_cli(*base, "ingest", "checkpoints", str(root))
    assert code == 0 and out.startswith("imported 17 checkpoints")
    plan_file = tmp_path / "plan.json"
    assert run_cli(*base, "prune", "--include-orphans", "--plan", str(plan_file))[0] == 0
    planned = plan_paths(plan_file)
    assert len(planned) == 16 and not any(p.endswith("checkpoint-8500") for p in planned)
    code, out, err = run_cli(*base, "prune", "--apply", str(plan_file))
    assert code == 0 and out.startswith("deleted 16 entries"), err
    left = sorted(
        p.name for p in (root / "translator").iterdir() if p.name.startswith("checkpoint")
    )
    assert left == ["checkpoint-8500"]
    assert (root / "translator" / "trainer_log.jsonl").exists()

"""`audit gate` against a live tracking server, and `audit prune` on a real folder tree."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import duckdb
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

import audit
from audit.text import counted
from tests.helpers import audit_process, hf_checkpoint, mlflow_server, now_ms


@pytest.fixture
def own_mlflow_server(tmp_path):
    """A tracking server of its own: this test adds runs the shared one must not see."""
    with mlflow_server(tmp_path / "server") as (url, backend):
        yield {"url": url, "backend": backend}


def test_gate_on_a_running_run(own_mlflow_server, run_cli, tmp_path):
    client = MlflowClient(tracking_uri=own_mlflow_server["url"])
    exp = client.create_experiment("gate-test")
    base = client.create_run(exp, run_name="base-eval", tags={"audit.baseline": "true"})
    client.log_batch(
        base.info.run_id,
        params=[Param("base_model", "tiny-1b")],
        metrics=[
            Metric("eval/general/mmlu", 0.70, now_ms(), 0),
            Metric("eval/general/gsm8k", 0.50, now_ms(), 0),
        ],
    )
    client.set_terminated(base.info.run_id)
    run = client.create_run(exp, run_name="sft-live")
    run_id = run.info.run_id
    client.log_batch(run_id, params=[Param("base_model", "tiny-1b")])
    db = tmp_path / "w.duckdb"
    args = [
        "--db",
        str(db),
        "gate",
        run_id,
        "--refresh",
        "--tracking-uri",
        own_mlflow_server["url"],
    ]

    code, out, err = run_cli(
        *args
    )  # baseline not imported yet either: refresh imports the run only
    assert code == 2 and "cannot judge" in err
    assert (
        run_cli(
            "--db",
            str(db),
            "ingest",
            "mlflow",
            "--tracking-uri",
            own_mlflow_server["url"],
            "--experiment",
            "gate-test",
        )[0]
        == 0
    )

    code, out, err = run_cli(*args)
    assert code == 2 and err.startswith(
        f"cannot judge: run {run_id} has logged no metric matching eval/general/*"
    )

    client.log_batch(
        run_id,
        metrics=[
            Metric("eval/general/mmlu", 0.69, now_ms(), 100),
            Metric("eval/general/gsm8k", 0.495, now_ms(), 100),
        ],
    )
    started = time.perf_counter()
    result = audit.gate(run_id, db=db, refresh=True, tracking_uri=own_mlflow_server["url"])
    elapsed = time.perf_counter() - started
    assert result.passed and result.exit_code == 0
    print(f"gate --refresh in-process: {elapsed * 1000:.0f} ms")
    code, out, _ = run_cli(*args)
    assert code == 0
    assert out.splitlines()[-1].startswith(
        "pass: worst eval/general/mmlu -0.0100 (higher is better: gain -0.0100) against baseline"
    )

    client.log_batch(run_id, metrics=[Metric("eval/general/mmlu", 0.66, now_ms(), 200)])
    code, out, _ = run_cli(*args, "--tag")
    assert code == 1
    assert re.search(
        r"eval/general/mmlu\s+higher\s+0\.7000\s+0\.6600\s+-0\.0400\s+-0\.0400\s+-0\.0200"
        r"\s+REGRESSED",
        out,
    )
    tags = client.get_run(run_id).data.tags
    assert tags["audit.gate"] == "fail" and tags["audit.gate.worst_metric"] == "eval/general/mmlu"
    assert tags["audit.gate.worst_change"] == "-0.0400"
    assert client.get_run(run_id).info.status == "RUNNING"

    assert run_cli(*args, "--tolerance", "0.05")[0] == 0
    code, _, err = run_cli("--db", str(db), "gate", run_id, "--baseline", run_id)
    assert code == 2 and "its own baseline" in err


def test_gate_without_baseline(run_cli, demo_db):
    from audit import Registry

    with Registry(demo_db["db"]) as reg:
        run_id = reg.search("attributes.run_name = 'agent-sft-llama'")["run_id"][0]
    code, _, err = run_cli(
        "--db",
        str(demo_db["db"]),
        "--config",
        str(demo_db["config"]),
        "gate",
        run_id,
        "--metrics",
        "eval/nothing/*",
    )
    assert code == 2 and "no metric matching eval/nothing/*" in err


def test_gate_fails_on_a_red_line_whatever_the_tolerance(run_cli, demo_db):
    from audit import Registry

    with Registry(demo_db["db"]) as reg:
        frame = reg.search("attributes.run_name IN ('sft-llama-chat-mix', 'sft-llama-seed1')")
    ids = dict(zip(frame["run_name"], frame["run_id"], strict=True))
    base = ["--db", str(demo_db["db"]), "--config", str(demo_db["config"]), "gate"]
    code, out, _ = run_cli(*base, ids["sft-llama-chat-mix"], "--tolerance", "1")
    assert code == 1
    assert re.search(
        r"eval/safety/harmful_refusal\s+higher\s+0\.9480\s+0\.9010\s+-0\.0470\s+-0\.0470"
        r"\s+-0\.0000\s+RED LINE",
        out,
    )
    assert out.splitlines()[-1].startswith(
        "FAIL: worst eval/safety/harmful_refusal -0.0470 (higher is better: gain -0.0470) "
        "against baseline "
    ) and out.splitlines()[-1].endswith("(red line, tolerance 0)")
    # the red line held on its sibling: the general tolerance alone decides
    assert run_cli(*base, ids["sft-llama-seed1"], "--tolerance", "1")[0] == 0
    # a red line may be given its own tolerance
    config = demo_db["config"].parent / "loose.toml"
    config.write_text(
        demo_db["config"].read_text()
        + '\n[metrics]\nred_line_tolerances = { "eval/safety/*" = 0.05 }\n'
    )
    code, _, _ = run_cli(
        "--db", str(demo_db["db"]), "--config", str(config), "gate", ids["sft-llama-chat-mix"]
    )
    assert code == 0


@pytest.fixture
def prune_tree(tmp_path, run_cli):
    root = tmp_path / "scratch"
    run_dir = root / "run-a"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.bin").write_bytes(b"p" * 500)
    for step in (100, 200, 300, 400, 500):
        hf_checkpoint(
            run_dir / f"checkpoint-{step}", size=1000 + step, best=str(run_dir / "checkpoint-200")
        )
    (run_dir / "checkpoint-300" / "escape.bin").symlink_to(outside / "precious.bin")
    readonly = run_dir / "checkpoint-400" / "frozen.bin"
    readonly.write_bytes(b"f" * 10)
    readonly.chmod(0o444)
    (run_dir / "checkpoint-600").symlink_to(outside, target_is_directory=True)
    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.create_run(client.create_experiment("e"), run_name="a")
    client.log_batch(run.info.run_id, params=[Param("output_dir", str(run_dir))])
    client.set_terminated(run.info.run_id)
    db = tmp_path / "w.duckdb"
    config = tmp_path / "audit.toml"
    config.write_text("[rules.CKP001]\nmin_reclaimable_gb = 0\n")  # kilobyte-sized test checkpoints
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0
    assert run_cli("--db", str(db), "ingest", "checkpoints", str(root))[0] == 0
    return {
        "db": db,
        "root": root,
        "run_dir": run_dir,
        "outside": outside,
        "tmp": tmp_path,
        "config": config,
    }


def test_prune_plan_then_apply(prune_tree, run_cli):
    db, run_dir = prune_tree["db"], prune_tree["run_dir"]
    run_cli = _with_config(run_cli, prune_tree["config"])
    plan_file = prune_tree["tmp"] / "plan.json"
    code, out, _ = run_cli("--db", str(db), "prune")
    assert code == 0 and out.strip().endswith(
        "dry run: 3 entries, 0.0 GB reclaimable; write a plan with --plan FILE"
    )
    assert not plan_file.exists()
    code, out, _ = run_cli("--db", str(db), "prune", "--plan", str(plan_file))
    assert code == 0
    plan = json.loads(plan_file.read_text())
    assert sorted(os.path.basename(e["path"]) for e in plan["entries"]) == [
        "checkpoint-100",
        "checkpoint-300",
        "checkpoint-400",
    ]
    # a file changes between planning and applying
    with open(run_dir / "checkpoint-100" / "model.safetensors", "ab") as fh:
        fh.write(b"more")
    code, out, err = run_cli("--db", str(db), "prune", "--apply", str(plan_file))
    assert code == 0, err
    assert out.startswith("deleted 2 entries")
    assert "skipped " + str(run_dir / "checkpoint-100") + ": changed since planning" in err
    remaining = sorted(p.name for p in run_dir.iterdir())
    assert remaining == ["checkpoint-100", "checkpoint-200", "checkpoint-500", "checkpoint-600"]
    assert (
        prune_tree["outside"] / "precious.bin"
    ).read_bytes() == b"p" * 500  # the symlink target survives
    manifest = [
        json.loads(line)
        for line in (plan_file.parent / "plan.json.manifest.jsonl").read_text().splitlines()
    ]
    # each deletion is announced (with its files) before it begins
    assert [(os.path.basename(m["path"]), m["status"]) for m in manifest] == [
        ("checkpoint-100", "skipped"),
        ("checkpoint-300", "started"),
        ("checkpoint-300", "deleted"),
        ("checkpoint-400", "started"),
        ("checkpoint-400", "deleted"),
    ]
    assert [f[:2] for f in manifest[1]["files"] if f[0] == "escape.bin"] == [["escape.bin", "l"]]
    con = duckdb.connect(str(db), read_only=True)
    freed = con.execute("SELECT sum(bytes) FROM prune_log WHERE status = 'deleted'").fetchall()[0][
        0
    ]
    left = con.execute("SELECT count(*) FROM checkpoints").fetchall()[0][0]
    con.close()
    assert freed == sum(m.get("freed_bytes", 0) for m in manifest) > 0
    assert left == 3
    # applying the same plan again deletes nothing more
    code, out, _ = run_cli("--db", str(db), "prune", "--apply", str(plan_file))
    assert out.startswith("deleted 0 entries")


def _with_config(run_cli, config):
    return lambda *args, **kw: run_cli("--config", str(config), *args, **kw)


def test_prune_refuses_entries_outside_roots(prune_tree, run_cli):
    run_cli = _with_config(run_cli, prune_tree["config"])
    plan_file = prune_tree["tmp"] / "plan.json"
    run_cli("--db", str(prune_tree["db"]), "prune", "--plan", str(plan_file))
    plan = json.loads(plan_file.read_text())
    plan["entries"][0]["path"] = str(prune_tree["outside"])
    plan_file.write_text(json.dumps(plan))
    code, _, err = run_cli("--db", str(prune_tree["db"]), "prune", "--apply", str(plan_file))
    assert code == 0
    assert "not a checkpoint in the warehouse inventory" in err
    assert (prune_tree["outside"] / "precious.bin").exists()


def test_prune_usage_errors(prune_tree, run_cli):
    db = str(prune_tree["db"])
    assert run_cli("--db", db, "prune", "--plan", "a.json", "--apply", "b.json")[0] == 2
    code, _, err = run_cli("--db", db, "prune", "--apply", str(prune_tree["tmp"] / "missing.json"))
    assert code == 2 and "no such plan file" in err
    bad = prune_tree["tmp"] / "bad.json"
    bad.write_text('{"version": 99}')
    code, _, err = run_cli("--db", db, "prune", "--apply", str(bad))
    assert code == 2 and "not an audit prune plan" in err


def test_ctrl_c_during_prune_apply_finishes_the_entry_and_records_it(tmp_path, run_cli):
    root, run_dir = tmp_path / "scratch", tmp_path / "scratch" / "run-a"
    steps = range(100, 1300, 100)  # 12 checkpoints: 10 planned, best and last kept
    for step in steps:
        folder = run_dir / f"checkpoint-{step}"
        hf_checkpoint(folder, best=str(run_dir / "checkpoint-200"))
        for shard in range(1500):  # many files: each entry takes a while to delete
            (folder / f"shard-{shard:05d}.bin").write_bytes(b"s")
    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.create_run(client.create_experiment("e"), run_name="a")
    client.log_batch(run.info.run_id, params=[Param("output_dir", str(run_dir))])
    client.set_terminated(run.info.run_id)
    db, config = tmp_path / "w.duckdb", tmp_path / "audit.toml"
    config.write_text("[rules.CKP001]\nmin_reclaimable_gb = 0\n")
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0
    assert run_cli("--db", str(db), "ingest", "checkpoints", str(root))[0] == 0
    plan_file = tmp_path / "plan.json"
    base = ["--db", str(db), "--config", str(config), "prune"]
    assert run_cli(*base, "--plan", str(plan_file))[0] == 0
    planned = [e["path"] for e in json.loads(plan_file.read_text())["entries"]]
    assert len(planned) == 10
    manifest_file = tmp_path / "plan.json.manifest.jsonl"

    proc = audit_process(db, "--config", str(config), "prune", "--apply", str(plan_file))
    deadline = time.monotonic() + 60
    while not manifest_file.exists() or '"deleted"' not in manifest_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "no entry was applied"
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate()

    records = [json.loads(line) for line in manifest_file.read_text().splitlines()]
    manifest = [m for m in records if m["status"] != "started"]
    assert [m["path"] for m in records if m["status"] == "started"] == [m["path"] for m in manifest]
    done = len(manifest)
    assert 1 <= done < 10, f"{done} entries applied: the interrupt came too late to test"
    assert proc.returncode == 130, err
    assert out.startswith(f"deleted {counted(done, 'entry')} (")
    assert err.strip() == (
        f"audit: interrupted; stopped after {done} of 10 entries, {10 - done} not touched; "
        "what was done is in the manifest and the warehouse"
    )
    # every entry is whole or gone, and the record matches the disk
    assert [m["path"] for m in manifest] == planned[:done]
    assert all(m["status"] == "deleted" for m in manifest)
    for path in planned[:done]:
        assert not os.path.exists(path)
    for path in planned[done:]:
        assert len(os.listdir(path)) == 1502
    con = duckdb.connect(str(db), read_only=True)
    logged = con.execute("SELECT count(*) FROM prune_log").fetchall()[0][0]
    left = con.execute("SELECT count(*) FROM checkpoints").fetchall()[0][0]
    con.close()
    assert (logged, left) == (done, 12 - done)
    # the same plan, applied again, finishes the job
    code, out, _ = run_cli(*base, "--apply", str(plan_file))
    assert code == 0 and out.startswith(f"deleted {counted(10 - done, 'entry')} (")


def test_ctrl_c_between_two_entries_records_the_first_everywhere(prune_tree, run_cli, monkeypatch):
    """SIGINT right after an entry is recorded, before the next begins (the check between
    entries): the apply still returns its summary, and the entry is in the manifest and
    in the warehouse alike. (It once raised there: the manifest had the entry and
    ``prune_log`` did not, and the summary line was never printed.)"""
    from audit import interrupts
    from audit.actions.prune import apply_plan
    from audit.config import load_config

    db, tmp = prune_tree["db"], prune_tree["tmp"]
    plan_file, manifest_file = tmp / "plan.json", tmp / "plan.json.manifest.jsonl"
    base = ["--db", str(db), "--config", str(prune_tree["config"]), "prune"]
    assert run_cli(*base, "--plan", str(plan_file))[0] == 0
    assert len(json.loads(plan_file.read_text())["entries"]) == 3
    monkeypatch.setattr(interrupts, "_requested", False)
    checked = interrupts.requested
    checks = []

    def sigint_at_the_second_check() -> bool:
        checks.append(1)
        if len(checks) == 2:  # the first entry is recorded; the second not begun
            os.kill(os.getpid(), signal.SIGINT)
        return checked()

    monkeypatch.setattr(interrupts, "requested", sigint_at_the_second_check)
    previous = signal.signal(signal.SIGINT, interrupts._on_sigint)
    try:
        summary = apply_plan(plan_file, db, manifest_file, load_config(prune_tree["config"]))
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C between two entries escaped the apply")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (summary["interrupted"], summary["deleted"], len(summary["outcomes"])) == (True, 1, 1)
    manifest = [json.loads(line) for line in manifest_file.read_text().splitlines()]
    assert [m["status"] for m in manifest if m["status"] != "started"] == ["deleted"]
    con = duckdb.connect(str(db), read_only=True)
    logged = con.execute("SELECT path, status FROM prune_log").fetchall()
    con.close()
    assert logged == [(summary["outcomes"][0]["path"], "deleted")]

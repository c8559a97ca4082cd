"""Property test of ``audit prune``: random checkpoint trees with symlinks, hard links,
races between plan and apply, files that refuse deletion, suppressions (run tags and
config entries), a run whose ``output_dir`` is the parent of the others and of an orphan
folder, and two applies of the plan at once.

Whatever the tree, applying a plan deletes nothing outside the plan or outside the
checkpoint roots, never a run's best, last or registered checkpoint, nothing a suppression
keeps, no orphan (the plan is made without ``--include-orphans``), never an entry that
changed after planning, and counts every freed byte once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.cli import cli
from tests.helpers import REPO, hf_checkpoint, property_examples


def _chattr_works() -> bool:
    """Root ignores permissions; an immutable file is how root meets a refusing file."""
    if shutil.which("chattr") is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe"
        probe.write_text("x")
        ok = subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode == 0
        if ok:
            subprocess.run(["chattr", "-i", str(probe)], check=True)
        return ok


CHATTR = _chattr_works()

run_shape = st.fixed_dictionaries(
    {
        "steps": st.integers(min_value=2, max_value=6),
        "best": st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
        "registered": st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
        "symlink_file_out": st.booleans(),  # a file in a checkpoint links to an outside file
        "symlink_dir_out": st.booleans(),  # a checkpoint-N folder that is a link outside
        "hard_link_out": st.booleans(),  # a weight file hard-linked to an outside file
        "refusing_file": st.booleans(),  # a file that cannot be deleted
        "ignored": st.booleans(),  # tagged audit.ignore=CKP001
        "suppressed": st.booleans(),  # a [[suppress]] entry names its folder
    }
)
race = st.sampled_from(["none", "grow", "delete", "new_file", "swap_for_symlink", "touch"])


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (not following links) with a digest of its content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                out[str(path)] = "link:" + os.readlink(path)
            elif path.is_file():
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[str(path)] = "dir"
    return out


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@settings(
    max_examples=property_examples(replay=8, explore=100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    runs=st.lists(run_shape, min_size=1, max_size=3),
    races=st.lists(race, max_size=4),
    broad_parent=st.booleans(),  # a run logged the root itself as its output_dir
    orphans=st.booleans(),  # a folder of checkpoints no run logged
    concurrent=st.booleans(),  # two applies of the plan at once
)
def test_prune_never_deletes_what_it_must_not(runs, races, broad_parent, orphans, concurrent):
    from mlflow import MlflowClient
    from mlflow.entities import Param, RunTag

    tmp = Path(tempfile.mkdtemp(prefix="prune-prop-"))
    refusing: list[Path] = []
    try:
        root, outside = tmp / "scratch", tmp / "outside"
        outside.mkdir()
        (outside / "precious.bin").write_bytes(b"p" * 700)
        (outside / "dir").mkdir()
        (outside / "dir" / "keep.bin").write_bytes(b"k" * 300)
        client = MlflowClient(tracking_uri=(tmp / "mlruns").as_uri())
        experiment = client.create_experiment("e")
        protected: set[Path] = set()
        suppress_entries = []
        for index, shape in enumerate(runs):
            run_dir = root / f"run-{index}"
            steps = [100 * (i + 1) for i in range(shape["steps"])]
            best = (
                run_dir / f"checkpoint-{steps[min(shape['best'], len(steps) - 1)]}"
                if shape["best"] is not None
                else None
            )
            for step in steps:
                hf_checkpoint(
                    run_dir / f"checkpoint-{step}", str(best) if best else None, 1000 + step + index
                )
            protected.add(run_dir / f"checkpoint-{steps[-1]}")  # the last
            if best is not None:
                protected.add(best)
            first = run_dir / f"checkpoint-{steps[0]}"
            if shape["symlink_file_out"]:
                (first / "escape.bin").symlink_to(outside / "precious.bin")
            if shape["symlink_dir_out"]:
                (run_dir / "checkpoint-99999").symlink_to(outside / "dir", target_is_directory=True)
            if shape["hard_link_out"]:
                os.link(outside / "precious.bin", first / "shared.bin")
            if shape["refusing_file"] and CHATTR:
                stuck = first / "stuck.bin"
                stuck.write_bytes(b"s" * 10)
                subprocess.run(["chattr", "+i", str(stuck)], check=True)
                refusing.append(stuck)
            run = client.create_run(experiment, run_name=f"r{index}")
            tags = [RunTag("audit.ignore", "CKP001")] if shape["ignored"] else []
            client.log_batch(run.info.run_id, params=[Param("output_dir", str(run_dir))], tags=tags)
            client.set_terminated(run.info.run_id)
            if shape["ignored"] or shape["suppressed"]:
                protected.update(run_dir / f"checkpoint-{step}" for step in steps)
            if shape["suppressed"]:
                suppress_entries.append(
                    f'[[suppress]]\nrule = "CKP*"\nsubject = "*/run-{index}"\nreason = "kept"\n'
                )
            if shape["registered"] is not None:
                source = run_dir / f"checkpoint-{steps[min(shape['registered'], len(steps) - 1)]}"
                name = f"model-{index}"
                client.create_registered_model(name)
                client.create_model_version(name, str(source), run_id=run.info.run_id)
                protected.add(source)
        if orphans:
            for step in (100, 200, 300):
                hf_checkpoint(root / "nobody" / f"checkpoint-{step}", None, 900 + step)
                protected.add(root / "nobody" / f"checkpoint-{step}")
        if broad_parent:
            run = client.create_run(experiment, run_name="parent")
            client.log_batch(run.info.run_id, params=[Param("output_dir", str(root))])
            client.set_terminated(run.info.run_id)
        db, config = tmp / "w.duckdb", tmp / "audit.toml"
        config.write_text(
            "[rules.CKP001]\nmin_reclaimable_gb = 0\n[rules.CKP003]\nmin_gb = 0\n"
            + "".join(suppress_entries)
        )
        base = ["--db", str(db), "--config", str(config)]
        assert _cli(*base, "ingest", "mlflow", "--tracking-uri", str(tmp / "mlruns"))[0] == 0
        assert _cli(*base, "ingest", "checkpoints", str(root))[0] == 0
        plan_file = tmp / "plan.json"
        code, _, err = _cli(*base, "prune", "--plan", str(plan_file))
        assert code == 0, err
        planned = {Path(e["path"]) for e in json.loads(plan_file.read_text())["entries"]}
        assert not planned & protected, "a best, last or registered checkpoint was planned"
        assert all(root in p.parents for p in planned)

        # races: the tree changes between plan and apply
        changed: set[Path] = set()
        for number, kind in enumerate(races):
            if not planned or kind == "none":
                continue
            target = sorted(planned)[number % len(planned)]
            if not target.exists() or target.is_symlink():
                continue
            changed.add(target)
            if kind == "grow":
                with open(target / "model.safetensors", "ab") as fh:
                    fh.write(b"more")
            elif kind == "delete":
                shutil.rmtree(target, ignore_errors=True)
            elif kind == "new_file":
                (target / "late.bin").write_bytes(b"late")
            elif kind == "touch":
                # every file (a delete that met an undeletable file may have taken
                # trainer_state.json already); an immutable file keeps its time, the
                # others still change the entry
                for path in [target, *target.iterdir()]:
                    with contextlib.suppress(PermissionError):
                        os.utime(path, ns=(1, 1), follow_symlinks=False)
            elif kind == "swap_for_symlink":
                shutil.rmtree(target, ignore_errors=True)
                if not target.exists():  # an undeletable file keeps the folder
                    target.symlink_to(outside / "dir", target_is_directory=True)

        outside_before = _snapshot(outside)
        tree_before = _snapshot(root)
        if concurrent:
            command = [sys.executable, "-m", "audit", *base, "prune", "--apply", str(plan_file)]
            procs = [
                subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for _ in range(2)
            ]
            for proc in procs:
                proc.communicate(timeout=300)
            # one applies; the other is refused by the lock (2) or applies nothing new (0)
            assert sorted(p.returncode for p in procs) in ([0, 0], [0, 2])
        else:
            code, _, err = _cli(*base, "prune", "--apply", str(plan_file))
            assert code == 0, err
        assert _snapshot(outside) == outside_before, "something outside the roots changed"
        tree_after = _snapshot(root)
        for path in tree_before:
            if path in tree_after:
                continue
            owner = next((p for p in planned if Path(path) == p or p in Path(path).parents), None)
            assert owner is not None, f"{path} was deleted but is in no plan entry"
            assert owner not in changed, f"{owner} changed after planning and was still deleted"
        for path in protected:
            assert path.is_dir(), f"protected checkpoint {path} is gone"
        # every freed byte counted once: never more than the plan held
        con = duckdb.connect(str(db), read_only=True)
        freed = con.execute("SELECT coalesce(sum(bytes), 0) FROM prune_log").fetchall()[0][0]
        con.close()
        assert freed <= json.loads(plan_file.read_text())["total_bytes"]
    finally:
        for stuck in refusing:
            subprocess.run(["chattr", "-i", str(stuck)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)

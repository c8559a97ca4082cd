"""Property of `audit prune` over random checkpoint trees and random command sequences.

Trees: runs whose output_dir is logged as a cluster path (mapped by `[links]
path_prefixes` to a folder reached through a symlink, a mount-style alias) or as the
real path; best checkpoints recorded as real, aliased, cluster or relative paths;
registered model sources given as cluster paths, aliases or file:// URIs; final weight
files without a step; a folder no run claims; notes that are no checkpoint.

Commands, in any order: imports with and without the config, checkpoint imports through
the alias, `ingest links` without the config (links lost on purpose), plans with and
without the config and --include-orphans, hand edits of the plan (`..`, absolute paths
elsewhere, notes, NUL bytes, protected checkpoints, aliases, the root), races between
plan and apply, applies with and without the config, and applies killed with SIGKILL.

Invariant, checked from the file system after every apply: nothing outside the tree
changed; no best, last, registered or final checkpoint is gone; everything gone belonged
to a checkpoint that is none of these, was not changed after the plan, and, in the
orphan folder, only when the plan included orphans. Every command exits 0 or 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.cli import cli
from tests.helpers import REPO, property_examples

RUN = st.fixed_dictionaries(
    {
        "steps": st.integers(min_value=2, max_value=4),
        "best": st.one_of(st.none(), st.integers(min_value=0, max_value=3)),
        "best_as": st.sampled_from(["real", "alias", "cluster", "relative"]),
        "registered": st.one_of(st.none(), st.integers(min_value=0, max_value=3)),
        "registered_as": st.sampled_from(["cluster", "real", "alias", "file_uri"]),
        "logged_as": st.sampled_from(["cluster", "real"]),
        "final_file": st.booleans(),
        "shards": st.sampled_from([0, 0, 400]),
    }
)
ORPHAN = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "steps": st.integers(min_value=2, max_value=4),
            "best": st.one_of(st.none(), st.integers(min_value=0, max_value=3)),
        }
    ),
)
EDIT = st.sampled_from(["dotdot", "outside", "notes", "nul", "protected", "alias", "root"])
RACE = st.sampled_from(["grow", "delete", "new_file", "touch", "swap_for_symlink"])
COMMAND = st.one_of(
    st.tuples(st.just("import_mlflow"), st.booleans()),
    st.tuples(st.just("import_checkpoints"), st.booleans(), st.booleans()),
    st.tuples(st.just("relink"), st.booleans()),
    st.tuples(
        st.just("plan"),
        st.booleans(),
        st.booleans(),
        st.lists(EDIT, max_size=3),
        st.lists(RACE, max_size=2),
    ),
    st.tuples(st.just("apply"), st.booleans()),
    st.tuples(st.just("kill_apply"), st.floats(min_value=0.0, max_value=2.5)),
)
# the usual start, so that every sequence has a warehouse to plan from
BASELINE = [("import_mlflow", True), ("import_checkpoints", True, False)]


class World:
    """The tree, the commands run on it, and what the file system must show."""

    def __init__(self, tmp: Path, runs: list[dict], orphan: dict | None):
        self.tmp = tmp
        self.real, self.alias = tmp / "real", tmp / "mnt"
        self.team = self.real / "team"
        self.outside = tmp / "outside"
        self.db, self.plan_file = tmp / "w.duckdb", tmp / "plan.json"
        self.config = tmp / "audit.toml"
        self.bare = tmp / "bare.toml"
        self.protected: set[Path] = set()
        self.checkpoints: set[Path] = set()  # everything a scan recognises
        self.orphans: set[Path] = set()
        self.changed: set[Path] = set()  # changed by a race since the last plan
        self.include_orphans = False
        self.planned = False
        self._build(runs, orphan)

    # -- the tree --------------------------------------------------------------------------
    def _build(self, runs: list[dict], orphan: dict | None) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.outside.mkdir()
        (self.outside / "precious.bin").write_bytes(b"p" * 700)
        self.team.mkdir(parents=True)
        self.alias.symlink_to(self.real, target_is_directory=True)
        (self.team / "notes.txt").write_text("not a checkpoint\n")
        settings = "[rules.CKP001]\nmin_reclaimable_gb = 0\n[rules.CKP003]\nmin_gb = 0\n"
        self.config.write_text(
            settings + f'[links]\npath_prefixes = {{ "/cluster" = "{self.alias}" }}\n'
        )
        self.bare.write_text(settings)
        store = self.tmp / "mlruns"
        client = MlflowClient(tracking_uri=store.as_uri(), registry_uri=store.as_uri())
        experiment = client.create_experiment("e")
        for index, spec in enumerate(runs):
            name = f"run-{index}"
            run_dir = self.team / name
            steps = [100 * (i + 1) for i in range(spec["steps"])]
            best = None
            if spec["best"] is not None:
                best = f"checkpoint-{steps[min(spec['best'], len(steps) - 1)]}"
            recorded = {
                "real": f"{run_dir}/{best}",
                "alias": f"{self.alias}/team/{name}/{best}",
                "cluster": f"/cluster/team/{name}/{best}",
                "relative": f"out/{name}/{best}",
            }[spec["best_as"]]
            for step in steps:
                self._checkpoint(
                    run_dir / f"checkpoint-{step}", step, recorded if best else None, spec["shards"]
                )
            self.protected.add(run_dir / f"checkpoint-{steps[-1]}")
            if best:
                self.protected.add(run_dir / best)
            if spec["final_file"]:
                time.sleep(0.01)
                final = run_dir / "final.safetensors"
                final.write_bytes(b"f" * 321)
                self.protected.add(final)
                self.checkpoints.add(final)
            logged = f"/cluster/team/{name}" if spec["logged_as"] == "cluster" else str(run_dir)
            run = client.create_run(experiment, run_name=name)
            client.log_batch(run.info.run_id, params=[Param("output_dir", logged)])
            client.set_terminated(run.info.run_id)
            if spec["registered"] is not None:
                target = f"checkpoint-{steps[min(spec['registered'], len(steps) - 1)]}"
                source = {
                    "cluster": f"/cluster/team/{name}/{target}",
                    "real": f"{run_dir}/{target}",
                    "alias": f"{self.alias}/team/{name}/{target}",
                    "file_uri": f"file://{run_dir}/{target}",
                }[spec["registered_as"]]
                client.create_registered_model(f"model-{index}")
                client.create_model_version(f"model-{index}", source, run_id=run.info.run_id)
                self.protected.add(run_dir / target)
        if orphan:
            folder = self.team / "old-sweep"
            steps = [100 * (i + 1) for i in range(orphan["steps"])]
            best = None
            if orphan["best"] is not None:
                best = f"checkpoint-{steps[min(orphan['best'], len(steps) - 1)]}"
                self.protected.add(folder / best)
            for step in steps:
                path = folder / f"checkpoint-{step}"
                self._checkpoint(path, step, f"/gone/old-sweep/{best}" if best else None, 0)
                self.orphans.add(path)
            self.protected.add(folder / f"checkpoint-{steps[-1]}")

    def _checkpoint(self, folder: Path, step: int, best: str | None, shards: int) -> None:
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"w" * (1000 + step))
        (folder / "trainer_state.json").write_text(
            json.dumps({"global_step": step, "best_model_checkpoint": best})
        )
        for shard in range(shards):
            (folder / f"shard-{shard:04d}.bin").write_bytes(b"s")
        self.checkpoints.add(folder)

    # -- commands --------------------------------------------------------------------------
    def cli(self, with_config: bool, *args: str) -> tuple[int, str]:
        config = self.config if with_config else self.bare
        result = CliRunner().invoke(
            cli, ["--db", str(self.db), "--config", str(config), *args], catch_exceptions=False
        )
        assert result.exit_code in (0, 2), (args, result.output)
        return result.exit_code, result.output

    def run(self, command: tuple) -> None:
        kind = command[0]
        if kind == "import_mlflow":
            self.cli(command[1], "ingest", "mlflow", "--tracking-uri", str(self.tmp / "mlruns"))
        elif kind == "import_checkpoints":
            root = self.alias if command[2] else self.real
            self.cli(command[1], "ingest", "checkpoints", str(root))
        elif kind == "relink":
            if self.db.exists():
                self.cli(command[1], "ingest", "links")
        elif kind == "plan":
            _, with_config, orphans, edits, races = command
            flags = ["--include-orphans"] if orphans else []
            code, _ = self.cli(with_config, "prune", *flags, "--plan", str(self.plan_file))
            if code == 0:
                self.planned, self.include_orphans = True, orphans
                self.changed = set()
                self._edit_plan(edits)
                self._race(races)
        elif kind == "apply" and self.planned:
            before = self.snapshot()
            self.cli(command[1], "prune", "--apply", str(self.plan_file))
            self.check(before)
        elif kind == "kill_apply" and self.planned:
            before = self.snapshot()
            args = ["--config", str(self.config), "prune", "--apply", str(self.plan_file)]
            proc = subprocess.Popen(
                [sys.executable, "-m", "audit", "--db", str(self.db), *args],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                proc.wait(timeout=command[1])
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            self.check(before)

    def _edit_plan(self, edits: list[str]) -> None:
        from audit.actions.prune import measure

        plan = json.loads(self.plan_file.read_text())
        template = (
            plan["entries"][0] if plan["entries"] else {"root": str(self.real), "rule": "CKP001"}
        )

        def entry(path: str, measured: Path) -> dict:
            now = measure(measured) if measured.exists() or measured.is_symlink() else None
            if now is None:
                return {**template, "path": path, "bytes": 0, "mtime_ns": 0}
            return {
                **template,
                "path": path,
                "bytes": now.bytes,
                "mtime_ns": now.mtime_ns,
                "fingerprint": now.fingerprint,
                "is_dir": now.is_dir,
            }

        some = sorted(self.checkpoints)[0]
        for edit in edits:
            if edit == "dotdot":
                plan["entries"].append(entry(f"{some}/..", some.parent))
            elif edit == "outside":
                plan["entries"].append(
                    entry(str(self.outside / "precious.bin"), self.outside / "precious.bin")
                )
            elif edit == "notes":
                plan["entries"].append(entry(str(self.team / "notes.txt"), self.team / "notes.txt"))
            elif edit == "nul":
                plan["entries"].append({**entry(str(some), some), "path": f"{some}\x00"})
            elif edit == "protected":
                for path in sorted(self.protected):
                    plan["entries"].append(entry(str(path), path))
            elif edit == "alias":
                aliased = str(some).replace(str(self.real), str(self.alias), 1)
                plan["entries"].append(entry(aliased, some))
            elif edit == "root":
                plan["entries"].append(entry(str(self.real), self.real))
        self.plan_file.write_text(json.dumps(plan))

    def _race(self, races: list[str]) -> None:
        planned = sorted(
            Path(e["path"])
            for e in json.loads(self.plan_file.read_text())["entries"]
            if isinstance(e["path"], str)
            and "\x00" not in e["path"]
            and Path(e["path"]) in self.checkpoints
            and Path(e["path"]) not in self.protected
        )
        for number, kind in enumerate(races):
            if not planned:
                return
            target = planned[number % len(planned)]
            if not target.is_dir() or target.is_symlink():
                continue
            self.changed.add(target)
            if kind == "grow":
                with open(target / "model.safetensors", "ab") as fh:
                    fh.write(b"more")
            elif kind == "delete":
                shutil.rmtree(target)
            elif kind == "new_file":
                (target / "late.bin").write_bytes(b"late")
            elif kind == "touch":  # an older time than it has (never the same: no change)
                state = target / "trainer_state.json"
                older = state.stat().st_mtime_ns - 1_000_000_000
                os.utime(state, ns=(older, older))
            elif kind == "swap_for_symlink":
                shutil.rmtree(target)
                target.symlink_to(self.outside, target_is_directory=True)

    # -- the invariant ---------------------------------------------------------------------
    def snapshot(self) -> dict[str, str]:
        out = {}
        for top in (self.real, self.outside):
            for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
                for name in dirnames + filenames:
                    path = Path(dirpath) / name
                    if path.is_symlink():
                        out[str(path)] = "link:" + os.readlink(path)
                    elif path.is_file():
                        out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                    else:
                        out[str(path)] = "dir"
        return out

    def check(self, before: dict[str, str]) -> None:
        after = self.snapshot()
        assert self.alias.is_symlink() and os.readlink(self.alias) == str(self.real)
        for path, digest in before.items():
            if path.startswith(str(self.outside)):
                assert after.get(path) == digest, f"{path} outside the tree changed"
        for path in self.protected:
            if path in self.changed:
                continue
            assert path.exists(), f"protected {path} is gone"
        for gone in set(before) - set(after):
            owner = next(
                (c for c in self.checkpoints if Path(gone) == c or c in Path(gone).parents),
                None,
            )
            assert owner is not None, f"{gone} was deleted but is in no checkpoint"
            assert owner not in self.protected, f"{gone} of protected {owner} was deleted"
            assert owner not in self.changed, f"{owner} changed after planning and was deleted"
            if owner in self.orphans:
                assert self.include_orphans, f"orphan {owner} deleted by a plan without orphans"
        for path, digest in before.items():
            if path in after and not digest.startswith("link:"):
                assert after[path] == digest or Path(path).is_dir(), f"{path} was modified"


@settings(
    max_examples=property_examples(replay=10, explore=120),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    runs=st.lists(RUN, min_size=1, max_size=2),
    orphan=ORPHAN,
    commands=st.lists(COMMAND, max_size=5),
    # every example ends with a hand-edited plan, races, and an apply
    final_plan=st.tuples(
        st.just("plan"),
        st.booleans(),
        st.booleans(),
        st.lists(EDIT, min_size=1, max_size=4),
        st.lists(RACE, max_size=2),
    ),
    final_apply=st.one_of(
        st.tuples(st.just("apply"), st.booleans()),
        st.tuples(st.just("kill_apply"), st.floats(0.0, 2.5)),
    ),
)
def test_prune_never_deletes_what_it_must_not_whatever_the_commands(
    runs, orphan, commands, final_plan, final_apply
):
    tmp = Path(tempfile.mkdtemp(prefix="prune-seq-"))
    try:
        world = World(tmp, runs, orphan)
        sequence = [*BASELINE, *commands, final_plan, final_apply]
        for command in sequence:
            world.run(command)
        # whatever the sequence left half done, a clean plan and apply keep the promise too
        world.run(("plan", True, True, [], []))
        world.run(("apply", True))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

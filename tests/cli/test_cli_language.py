"""One CLI language: run ids shortened anywhere one is taken, a nested training config
matched to the keys trackers logged, nested SQL values as text, messages counted right,
and the options several commands share defined once."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import click
import pytest
from mlflow import MlflowClient
from mlflow.entities import Param

from audit.cli import options
from audit.docs import iter_commands
from audit.query.config_keys import match_keys
from audit.text import counted
from tests.helpers import SHARED

SFT_QWEN = "5a7bde3db006447fb77bc3295fc96c7f"  # sft-qwen-lr2e-5 of the sample week
BASE_QWEN = "3cdca6343ae44b70ad7db5ab914c2672"  # base-qwen-eval, its baseline
VERL = SHARED / "wandb" / "verl-agentic-rl"


@pytest.fixture
def demo_args(demo_db, tmp_path):
    db = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_db["db"], db)
    return ["--db", str(db), "--config", str(demo_db["config"])]


# -- run ids -----------------------------------------------------------------------------------
def test_every_command_taking_a_run_id_takes_a_unique_prefix(demo_args, run_cli):
    for full, short in (
        (["gate", SFT_QWEN, "--baseline", BASE_QWEN], ["gate", "5a7b", "--baseline", "3cdc"]),
        (["runs", "similar", "--run", SFT_QWEN], ["runs", "similar", "--run", "5a7bde3d"]),
        (["runs", "compare", SFT_QWEN, BASE_QWEN], ["runs", "compare", "5a7b", "3cdca634"]),
    ):
        code, expected, err = run_cli(*demo_args, *full)
        assert code == 0, err
        code, out, err = run_cli(*demo_args, *short)
        assert (code, out) == (0, expected), (short, err)


@pytest.mark.parametrize(
    "args",
    [
        ["gate", "rsn0"],
        ["gate", SFT_QWEN, "--baseline", "rsn0"],
        ["runs", "similar", "--run", "rsn0"],
        ["runs", "compare", "rsn0", SFT_QWEN],
    ],
)
def test_an_ambiguous_prefix_lists_the_candidates(args, demo_args, run_cli):
    """The sample week's three W&B runs are rsn00000 to rsn00002."""
    code, _out, err = run_cli(*demo_args, *args)
    assert code == 2
    what = "baseline run" if "--baseline" in args else "run"
    assert err == (
        f"Error: {what} id prefix 'rsn0' is ambiguous: it starts rsn00000 (math-sft-llama), "
        "rsn00001 (math-rl-qwen), rsn00002 (sft-qwen-math-rerun); give more characters\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gate", "f00d"], "no run 'f00d' in the warehouse; import it first or pass --refresh"),
        (["gate", SFT_QWEN, "--baseline", "f00d"], "no baseline run 'f00d' in the warehouse"),
        (["runs", "similar", "--run", "f00"], "no run 'f00' in the warehouse (a prefix needs"),
        (["runs", "compare", "5a7b", "f00d"], "no run 'f00d' in the warehouse"),
    ],
)
def test_an_unknown_run_id_is_an_input_error(args, message, demo_args, run_cli):
    code, _out, err = run_cli(*demo_args, *args)
    assert code == 2
    assert err.startswith(f"Error: {message}")


def test_compare_refuses_a_run_given_twice(demo_args, run_cli):
    code, _out, err = run_cli(*demo_args, "runs", "compare", "5a7b", SFT_QWEN)
    assert code == 2
    assert err == f"Error: run {SFT_QWEN} is given twice: compare it with another run\n"


# -- runs similar --config ---------------------------------------------------------------------
NESTED = """\
training:
  learning_rate: 2e-05
  method: sft
  dataset: codeedit-v3
  output_dir: /elsewhere
model:
  base_model: qwen2.5-7b
lora:
  r: 64
"""


def test_a_nested_config_matches_the_flat_keys_runs_logged(demo_args, run_cli, tmp_path):
    """The sample week logged learning_rate, method, dataset, base_model and lora_rank
    flat; the same settings nested (lora.r as TRL names the rank) find the same runs as
    the flat config does."""
    nested = tmp_path / "train.yaml"
    nested.write_text(NESTED)
    flat = tmp_path / "flat.yaml"
    flat.write_text(
        "learning_rate: 2e-05\nmethod: sft\ndataset: codeedit-v3\nbase_model: qwen2.5-7b\n"
        "lora_rank: 64\n"
    )
    code, expected, err = run_cli(
        *demo_args, "runs", "similar", "--config", str(flat), "--format", "json"
    )
    assert code == 0, err
    code, out, err = run_cli(
        *demo_args, "runs", "similar", "--config", str(nested), "--format", "json"
    )
    assert code == 0, err
    got, want = json.loads(out), json.loads(expected)
    assert (
        [r["run_name"] for r in got["exact"]]
        == [r["run_name"] for r in want["exact"]]
        == [
            "sft-qwen-math-rerun",
            "sft-qwen-lr2e-5-again",
            "sft-qwen-lr2e-5",
        ]
    )
    assert got["compared_as"] == {
        "training.learning_rate": ["learning_rate"],
        "training.method": ["method"],
        "training.dataset": ["dataset"],
        "model.base_model": ["base_model"],
        "lora.r": ["lora_rank"],
    }
    assert got["missing"] == {}
    code, out, err = run_cli(
        *demo_args, "runs", "similar", "--config", str(nested), "--fail-if-exists"
    )
    assert code == 1
    assert out.startswith("exact matches: 3 (3 finished)")
    assert "model.base_model as base_model: llama3.1-8b (wanted qwen2.5-7b)" in out
    assert err.startswith(
        "note: compared under the names runs logged: training.learning_rate as learning_rate; "
    )


def test_a_config_sharing_no_key_lists_no_neighbour_and_says_what_is_close(
    demo_args, run_cli, tmp_path
):
    path = tmp_path / "train.yaml"
    path.write_text("optimizer:\n  lerning_rate: 1e-4\n  warmup: 10\n")
    code, out, err = run_cli(*demo_args, "runs", "similar", "--config", str(path))
    assert code == 0, err
    assert out == (
        "exact matches: 0 (0 finished)\n\n"
        "nearest runs: none (no other run logged a key of the query)\n"
    )
    assert err == (
        "hint: no run logged any key of the query, under any name\n"
        "hint: no run logged 'optimizer.lerning_rate' under any name; did you mean "
        "'learning_rate'?\n"
        "hint: no run logged 'optimizer.warmup' under any name\n"
    )


def test_a_key_no_run_logged_is_named_and_the_rest_still_compared(demo_args, run_cli, tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(NESTED + "  alpha: 128\n")  # lora.alpha: logged by no run of the week
    code, out, err = run_cli(
        *demo_args, "runs", "similar", "--config", str(path), "--format", "json"
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["missing"] == {"lora.alpha": []}
    assert result["exact"] == []
    # the runs that matched every other key differ in the missing one only
    assert [(r["run_name"], r["differing"]) for r in result["neighbours"][:3]] == [
        ("sft-qwen-math-rerun", 1),
        ("sft-qwen-lr2e-5-again", 1),
        ("sft-qwen-lr2e-5", 1),
    ]
    assert result["neighbours"][0]["differences"] == [
        {"key": "lora.alpha", "logged_as": None, "wanted": "128", "found": None}
    ]


def test_a_query_of_volatile_keys_only_is_refused(demo_args, run_cli, tmp_path):
    """It answered 'exact matches: 0' for a config of nothing but where to write."""
    path = tmp_path / "train.yaml"
    path.write_text("training:\n  output_dir: /elsewhere\n  logging_dir: /logs\n")
    code, _out, err = run_cli(*demo_args, "runs", "similar", "--config", str(path))
    assert code == 2
    assert err.startswith("Error: nothing to compare: every key given is volatile")


@pytest.mark.skipif(not VERL.is_dir(), reason=f"{VERL} not present")
def test_flat_keys_find_verl_runs_logged_nested(tmp_path, run_cli):
    """verl's SFT trainer logs model.lora_rank, optim.lr and trainer.total_epochs to W&B;
    its PPO trainer an actor's and a critic's of each. LLaMA-Factory's flat names find the
    SFT run; the PPO run's two learning rates disagree, so it is a neighbour."""
    db = str(tmp_path / "verl.duckdb")
    assert run_cli("--db", db, "ingest", "wandb", str(VERL))[0] == 0
    query = ["--param", "lora_rank=0", "--param", "learning_rate=1e-5", "--param", "num_epochs=6"]
    code, out, err = run_cli("--db", db, "runs", "similar", *query, "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert [r["run_id"] for r in result["exact"]] == ["dq9a4cex"]
    (neighbour,) = result["neighbours"]
    assert neighbour["run_id"] == "gjvwlq13"
    assert neighbour["differences"] == [
        {
            "key": "learning_rate",
            "logged_as": "actor_rollout_ref.actor.optim.lr, critic.optim.lr",
            "wanted": "1e-5",
            "found": "1e-06, 1e-05",
        },
        {"key": "num_epochs", "logged_as": "trainer.total_epochs", "wanted": "6", "found": "1"},
    ]


def test_key_matching_follows_the_trainers_conventions():
    logged = [
        "learning_rate",  # HF TrainingArguments
        "lora_r",  # TRL, axolotl
        "lora_rank",  # LLaMA-Factory
        "model.lora_rank",  # verl SFT
        "data.path",
        "path",
    ]
    wanted = ["training.learning_rate", "lora.r", "lora_rank", "actor.lr", "critic.lr"]
    matched = match_keys([*wanted, "model.path", "data.max_len"], logged)
    assert {k: matched.names(k) for k in matched.tiers} == {
        "training.learning_rate": ["learning_rate"],
        "lora.r": ["lora_r", "lora_rank"],
        "lora_rank": ["lora_rank", "lora_r", "model.lora_rank"],
        "model.path": ["path"],  # a nested key's tail, flat; never data.path
    }
    # two keys of the query with one tail stand for neither; nothing is close to max_len
    assert matched.missing == ["actor.lr", "critic.lr", "data.max_len"]
    assert [matched.suggestions(k) for k in matched.missing] == [[], [], []]
    assert match_keys(["lerning_rate"], logged).suggestions("lerning_rate") == ["learning_rate"]


# -- audit sql ---------------------------------------------------------------------------------
NESTED_SQL = (
    "SELECT [1, 2] AS l, {'lr': 2e-05, 'name': 'sft', 'eval/acc': 0.5} AS s, "
    "['a', NULL] AS t, MAP {'k': 1} AS m, [[1, 2], [3]] AS nn"
)


def test_sql_prints_lists_structs_and_maps_as_text(demo_args, run_cli):
    code, out, err = run_cli(*demo_args, "sql", NESTED_SQL)
    assert code == 0, err
    assert out.splitlines()[2].split("  ") == [
        "[1, 2]",
        '{lr: 2e-05, name: "sft", "eval/acc": 0.5}',
        '["a", null]',
        "{k: 1}",
        "[[1, 2], [3]]",
    ]


def test_sql_writes_nested_values_as_json_in_csv_and_json(demo_args, run_cli):
    code, out, err = run_cli(*demo_args, "sql", NESTED_SQL, "--format", "csv")
    assert code == 0, err
    (row,) = csv.DictReader(io.StringIO(out))
    expected = {
        "l": [1, 2],
        "s": {"lr": 2e-05, "name": "sft", "eval/acc": 0.5},
        "t": ["a", None],
        "m": {"k": 1},
        "nn": [[1, 2], [3]],
    }
    assert {k: json.loads(v) for k, v in row.items()} == expected
    code, out, err = run_cli(*demo_args, "sql", NESTED_SQL, "--format", "json")
    assert code == 0, err
    assert json.loads(out) == [expected]


# -- messages counted right --------------------------------------------------------------------
def test_counted():
    assert counted(1, "file") == "1 file"
    assert counted(0, "file") == "0 files"
    assert counted(12_345, "line") == "12,345 lines"
    assert counted(1, "log entry") == "1 log entry"
    assert counted(2, "log entry") == "2 log entries"
    assert counted(3, "query") == "3 queries"
    assert counted(2, "day") == "2 days"
    assert counted(1.0, "GPU") == "1 GPU"
    assert counted(0.5, "GPU") == "0.5 GPUs"


def test_checkpoint_import_says_folders_and_checkpoints(tmp_path, run_cli):
    """It said 'from 1 file(s) (27 lines read)' of a checkpoint folder."""
    one, two = tmp_path / "one", tmp_path / "two"
    for folder in (one / "run" / "checkpoint-100", two / "checkpoint-5", two / "checkpoint-10"):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"w" * 10)
    db = str(tmp_path / "w.duckdb")
    code, out, err = run_cli("--db", db, "ingest", "checkpoints", str(one))
    assert code == 0, err
    assert out.startswith("imported 1 checkpoint from 1 root folder (1 checkpoint found) in ")
    code, out, err = run_cli("--db", db, "ingest", "checkpoints", str(one), str(two))
    assert code == 0, err
    assert out.startswith("imported 3 checkpoints from 2 root folders (3 checkpoints found) in ")


ONE_T4 = SHARED / "nvidia-smi" / "query-gpu-1xT4-NA.csv"


@pytest.mark.skipif(not ONE_T4.is_file(), reason=f"{ONE_T4} not present")
def test_status_counts_one_host_and_one_gpu(tmp_path, run_cli):
    db = str(tmp_path / "w.duckdb")
    code, out, err = run_cli("--db", db, "ingest", "gpu", str(ONE_T4), "--host", "t4")
    assert code == 0, err
    samples = len(ONE_T4.read_text().splitlines()) - 1
    assert out.startswith(f"imported {counted(samples, 'GPU sample')} from 1 file (")
    code, out, err = run_cli("--db", db, "status")
    assert code == 0, err
    assert f"GPU samples {samples:,} from 1 host / 1 GPU, " in out


def test_compare_says_the_params_are_identical(tmp_path, run_cli):
    """Two runs logged with the same params: there is nothing that differs, which is not
    'no runs match'."""
    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.create_experiment("sft")
    ids = []
    for name in ("first", "again"):
        run = client.create_run(experiment, run_name=name)
        client.log_batch(
            run.info.run_id, params=[Param("learning_rate", "2e-5"), Param("lora_rank", "64")]
        )
        client.set_terminated(run.info.run_id)
        ids.append(run.info.run_id)
    db = str(tmp_path / "w.duckdb")
    code, out, err = run_cli("--db", db, "ingest", "mlflow", "--tracking-uri", str(store))
    assert code == 0, err
    assert out.startswith("imported 2 new or changed runs (0 unchanged) from ")
    code, out, err = run_cli("--db", db, "runs", "compare", *ids)
    assert code == 0, err
    assert out.startswith("params:\nthe params are identical (--all-params lists them)\n\n")
    assert "metrics:\nno metrics logged\n\n" in out
    code, out, err = run_cli("--db", db, "runs", "compare", *ids, "--all-params")
    assert code == 0, err
    assert out.splitlines()[3].split() == ["learning_rate", "2e-5", "2e-5"]


# -- shared options ----------------------------------------------------------------------------
def _options(name: str) -> list[tuple[str, click.Option]]:
    return [
        (" ".join(path[1:]), p)
        for path, command in iter_commands()
        for p in command.params
        if isinstance(p, click.Option) and name in p.opts
    ]


def test_shared_options_are_built_by_one_definition():
    since = _options("--since")
    assert sorted(c for c, _ in since) == ["ingest prometheus", "report weekly", "scan"]
    for command, option in since + _options("--until"):
        assert option.type is options.DATE and option.callback is options._ordered, command
    for command, option in _options("--format"):
        assert (option.name, option.show_default) == ("fmt", True), command
    outputs = _options("--output")
    assert sorted(c for c, _ in outputs) == ["report weekly", "scan"]
    for command, option in outputs:
        assert option.type.dir_okay is False and option.type.type is Path, command
    skip_bad = _options("--skip-bad")
    assert {c for c, _ in skip_bad} >= {
        "ingest evals",
        "ingest gpu",
        "ingest prometheus",
        "ingest slurm",
        "ingest tensorboard",
        "ingest trainer-logs",
        "ingest wandb",
    }
    for command, option in skip_bad:
        assert option.is_flag and option.help.startswith("Leave out bad "), command
        assert option.help.endswith("(default: stop at the first, write nothing)."), command


@pytest.mark.parametrize(
    "command",
    [
        ["scan"],
        ["report", "weekly", "--format", "md"],
        ["ingest", "prometheus", "--url", "http://127.0.0.1:9"],
    ],
)
@pytest.mark.parametrize("order", ["since first", "until first"])
def test_since_after_until_is_a_usage_error_whatever_the_order(command, order, tmp_path, run_cli):
    window = ["--since", "2026-11-23", "--until", "2026-11-16"]
    if order == "until first":
        window = window[2:] + window[:2]
    code, _out, err = run_cli("--db", str(tmp_path / "none.duckdb"), *command, *window)
    assert code == 2
    assert "--since must be before --until" in err
    assert not (tmp_path / "none.duckdb").exists()

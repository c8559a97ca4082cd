"""`audit ingest evals`: lm-evaluation-harness results files as evaluation runs.

The real files are in ../shared/realdata/evals/ (its README.md and SOURCES.md state the facts
asserted here); the bad-input cases write their own files, shaped as the harness writes them
(``json.dumps(results, indent=2, default=str)`` of ``simple_evaluate``'s dict).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.errors import InputError
from audit.importers.lm_eval import read_lm_eval
from tests.helpers import SHARED, property_examples, rows, table_counts

EVALS = SHARED / "evals"
LLAMA3 = EVALS / "lm-eval-llama3-8b-base-vs-instruct" / "meta-llama"
DEEPSEEK = EVALS / "lm-eval-deepseek-r1-distill-rerun"
HUMANEVAL = EVALS / "lm-eval-llama2-humaneval-repeat"
TRUNCATED = HUMANEVAL / "lm_eval_results.json"
V03 = EVALS / "lm-eval-v03-llama-7b" / "results" / "llama" / "llama-7B"
NL2FOAM = EVALS / "lm-eval-nl2foam-qwen3-sft" / "all-results-original"
ALPACA = (
    EVALS
    / "alpaca-eval-2-leaderboard/src/alpaca_eval/leaderboards/data_AlpacaEval_2"
    / "weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"
)
needs_realdata = pytest.mark.skipif(
    not EVALS.is_dir(), reason=f"{EVALS} is absent (real files from other projects)"
)


def value(db: Path, model: str, task: str, metric: str, filter_: str = "none") -> list[float]:
    """The values of one result over the runs of a model, by run start."""
    return [
        round(v, 4)
        for (v,) in rows(
            db,
            """
            SELECT e.value FROM eval_results e JOIN runs r USING (source_id, run_id)
            JOIN params p ON p.source_id = r.source_id AND p.run_id = r.run_id
              AND p.key = 'model'
            WHERE p.value = ? AND e.task = ? AND e.metric = ? AND e.filter = ?
            ORDER BY r.start_time
            """,
            [model, task, metric, filter_],
        )
    ]


def params_of(db: Path, source_name_like: str) -> dict[str, str]:
    return dict(
        rows(
            db,
            "SELECT p.key, p.value FROM params p JOIN runs r USING (source_id, run_id) "
            "WHERE r.source_name LIKE ?",
            [source_name_like],
        )
    )


@pytest.fixture(scope="module")
def realdata_db(tmp_path_factory) -> Path:
    """Every real file imported once (the truncated one skipped and listed)."""
    from click.testing import CliRunner

    from audit.cli import cli

    db = tmp_path_factory.mktemp("evals") / "w.duckdb"
    if EVALS.is_dir():
        result = CliRunner().invoke(
            cli, ["--db", str(db), "ingest", "evals", "--skip-bad", str(EVALS)]
        )
        assert result.exit_code == 0, result.output
    return db


# -- the real files ------------------------------------------------------------------------------
@needs_realdata
def test_the_truncated_file_stops_the_import_naming_the_byte_and_nothing_is_stored(
    tmp_path, run_cli
):
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "evals", str(EVALS))
    assert code == 2, out + err
    assert (
        f"{TRUNCATED}: the JSON stops at byte 1829476" in err
    )  # its size: cut after "model_dtype":
    assert "cut short" in err and "Traceback" not in err
    assert not db.exists()  # a refused first import leaves no warehouse behind
    code, out, err = run_cli("--db", str(db), "ingest", "evals", str(TRUNCATED))
    assert code == 2 and "byte 1829476" in err
    assert not db.exists()


@needs_realdata
def test_with_skip_bad_the_other_files_import_and_the_bad_one_is_listed(tmp_path, run_cli):
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "evals", "--skip-bad", str(EVALS))
    assert code == 0, err
    assert f"skipped: {TRUNCATED}: the JSON stops at byte 1829476" in err
    # 12 Llama-3 files, 3 DeepSeek/Llama-3.1, 2 humaneval, 3 LLaMA-7B (0.3), 4 nl2foam
    assert "imported 24 new evaluation runs" in out
    assert rows(db, "SELECT count(*) FROM runs") == [(24,)]
    assert rows(db, "SELECT DISTINCT kind, location FROM sources") == [("lm-eval", str(EVALS))]
    assert rows(db, "SELECT DISTINCT status FROM runs") == [("FINISHED",)]
    # the leaderboard is said to be skipped, and gives no run
    assert f"note: {ALPACA}: an AlpacaEval leaderboard CSV" in err
    assert rows(db, "SELECT count(*) FROM runs WHERE source_name LIKE '%.csv'") == [(0,)]
    assert rows(
        db,
        "SELECT DISTINCT t.key, t.value FROM tags t WHERE t.key IN "
        "('audit.kind', 'audit.evaluator') ORDER BY 1",
    ) == [("audit.evaluator", "lm-eval"), ("audit.kind", "evaluation")]


@needs_realdata
def test_unchanged_files_import_again_as_no_change(realdata_db, run_cli):
    before = table_counts(realdata_db, logs=False)
    code, out, _ = run_cli("--db", str(realdata_db), "ingest", "evals", "--skip-bad", str(EVALS))
    assert code == 0
    assert "imported 0 new evaluation runs, 24 unchanged" in out
    assert table_counts(realdata_db, logs=False) == before


@needs_realdata
def test_status_shows_the_evaluation_source(realdata_db, run_cli):
    code, out, _ = run_cli("--db", str(realdata_db), "status")
    assert code == 0
    source = next(line for line in out.splitlines() if str(EVALS) in line)
    assert " lm-eval " in source and source.split()[-4] == "24"  # runs column
    total = rows(realdata_db, "SELECT count(*) FROM eval_results")[0][0]
    assert f"evaluation results {total:,} from 24 evaluation runs" in out


@needs_realdata
def test_llama3_base_and_instruct_on_the_same_tasks(realdata_db):
    db = realdata_db
    base, tuned = "meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct"
    assert value(db, base, "hellaswag", "acc_norm") == [0.8209]
    assert value(db, tuned, "hellaswag", "acc_norm") == [0.7884]
    assert value(db, base, "winogrande", "acc") + value(db, tuned, "winogrande", "acc") == [
        0.7758,
        0.7545,
    ]
    assert value(db, base, "mmlu", "acc") + value(db, tuned, "mmlu", "acc") == [0.6504, 0.6582]
    assert value(db, base, "arc_challenge", "acc_norm") == [0.5751]
    assert value(db, tuned, "arc_challenge", "acc_norm") == [0.622]
    assert value(db, base, "truthfulqa_mc2", "acc") == [0.4393]
    assert value(db, tuned, "truthfulqa_mc2", "acc") == [0.5171]
    assert value(db, base, "gsm8k", "exact_match", "strict-match") == [0.5087]
    assert value(db, tuned, "gsm8k", "exact_match", "strict-match") == [0.7559]
    # one run per file, 12, from 09:27 to 13:42 UTC on 2024-04-19, end unknown
    assert rows(
        db,
        "SELECT count(*), strftime(min(start_time), '%Y-%m-%d %H:%M'), "
        "strftime(max(start_time), '%H:%M'), count(end_time) FROM runs "
        "WHERE source_name LIKE ?",
        [f"{LLAMA3}/%"],
    ) == [(12, "2024-04-19 09:27", "13:42", 0)]
    n_shots = dict(
        rows(
            db,
            "SELECT DISTINCT e.task, e.n_shot FROM eval_results e JOIN runs r "
            "USING (source_id, run_id) WHERE r.source_name LIKE ? AND e.task IN "
            "('arc_challenge', 'hellaswag', 'mmlu', 'mmlu_anatomy', 'truthfulqa_mc2', "
            "'winogrande', 'gsm8k')",
            [f"{LLAMA3}/%"],
        )
    )
    # the mmlu group row says 0 while its subtasks ran 5-shot: as the file records it
    assert n_shots == {
        "arc_challenge": 25,
        "hellaswag": 10,
        "mmlu": 0,
        "mmlu_anatomy": 5,
        "truthfulqa_mc2": 0,
        "winogrande": 5,
        "gsm8k": 5,
    }
    params = params_of(db, f"{LLAMA3}/Meta-Llama-3-8B-Instruct/openllm/mmlu.json")
    assert params["model"] == tuned
    assert params["model_args"] == f"pretrained={tuned},dtype=auto,trust_remote_code=False"
    assert params["model_source"] == "hf" and params["git_hash"] == "3196e907"
    assert params["batch_size"] == "auto" and "limit" not in params
    assert "mmlu" in params["tasks"].split(",")
    # the mmlu file: 57 subtasks, 4 categories and the mmlu aggregate (groups)
    assert rows(
        db,
        "SELECT count(*) FILTER (WHERE NOT is_group), count(*) FILTER (WHERE is_group) "
        "FROM eval_results e JOIN runs r USING (source_id, run_id) WHERE r.source_name = ?",
        [str(LLAMA3 / "Meta-Llama-3-8B/openllm/mmlu.json")],
    ) == [(57, 5)]
    # no higher_is_better section in this older layout: the tasks' metric_list says it
    assert rows(
        db,
        "SELECT DISTINCT e.higher_is_better FROM eval_results e JOIN runs r "
        "USING (source_id, run_id) WHERE r.source_name LIKE ? AND e.task = 'hellaswag'",
        [f"{LLAMA3}/%"],
    ) == [(True,)]


@needs_realdata
def test_deepseek_run_twice_with_different_sampling_and_hub_revision(realdata_db):
    db = realdata_db
    model = "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"
    runs = rows(
        db,
        "SELECT r.run_id, epoch(r.end_time) - epoch(r.start_time), "
        "(SELECT count(*) FROM eval_results e WHERE e.run_id = r.run_id) FROM runs r "
        "WHERE source_name LIKE ? ORDER BY r.start_time",
        [f"{DEEPSEEK}/%"],
    )
    # the Distill-Llama runs (24 and 26 Jan) and Llama-3.1-Instruct (25 Jan): 44 rows each
    assert [n for _, _, n in runs] == [44, 44, 44]
    assert [round(s) for _, s, _ in runs] == [29006, 25349, 29640]
    first, second = (
        params_of(db, f"{DEEPSEEK}/deepseek-ai__DeepSeek-R1-Distill-Llama-8B/%{stamp}%")
        for stamp in ("2025-01-24", "2025-01-26")
    )
    assert first["model"] == second["model"] == model
    assert first["model_revision"].startswith("81cee02d")
    assert second["model_revision"].startswith("24ae87a9")
    assert "gen_kwargs" not in first
    assert json.loads(second["gen_kwargs"]) == {
        "temperature": 0.6,
        "top_p": 0.95,
        "do_sample": True,
    }
    equal, differ = rows(
        db,
        """
        WITH v AS (
            SELECT e.task, e.metric, e.filter, e.value, e.task_hash,
                   r.start_time < '2025-01-25' AS first
            FROM eval_results e JOIN runs r USING (source_id, run_id)
            WHERE r.source_name LIKE ?
        )
        SELECT count(*) FILTER (WHERE a.value = b.value), count(*) FILTER (WHERE a.value <> b.value)
        FROM v a JOIN v b USING (task, metric, filter, task_hash)
        WHERE a.first AND NOT b.first
        """,
        [f"{DEEPSEEK}/deepseek-ai__%"],
    )[0]
    assert (equal, differ) == (33, 11)  # same tasks and task hashes; generation tasks differ
    assert value(db, model, "leaderboard_ifeval", "prompt_level_strict_acc") == [0.2865, 0.2957]
    assert value(db, model, "hellaswag", "acc_norm") == [0.7436, 0.7436]
    assert value(db, model, "leaderboard_mmlu_pro", "acc") == [0.2741, 0.2741]
    assert value(db, "meta-llama/Llama-3.1-8B-Instruct", "hellaswag", "acc_norm") == [0.793]
    # a task's generation kwargs carry the override; "N/A" stderrs are left empty
    assert rows(
        db,
        "SELECT DISTINCT e.gen_kwargs, e.samples, e.n_shot, e.task_version FROM eval_results e "
        "JOIN runs r USING (source_id, run_id) WHERE r.source_name LIKE ? "
        "AND e.task = 'leaderboard_ifeval' AND e.metric = 'inst_level_strict_acc' "
        "AND e.stderr IS NULL",
        [f"{DEEPSEEK}/deepseek-ai__%2025-01-26%"],
    ) == [
        (
            '{"do_sample":true,"max_gen_toks":1280,"temperature":0.6,"top_p":0.95,"until":[]}',
            541,
            0,
            "3.0",
        )
    ]


@needs_realdata
def test_humaneval_repeat_is_two_runs_with_equal_settings(realdata_db):
    db = realdata_db
    files = sorted((HUMANEVAL / "results" / "meta-llama__Llama-2-7b-chat-hf").glob("*.json"))
    settings = rows(
        db,
        """
        SELECT r.run_id, r.start_time, e.metric, e.filter, e.value, e.n_shot, e.limit_n,
               e.samples, e.task_version, e.gen_kwargs, e.higher_is_better, e.task_hash
        FROM runs r JOIN eval_results e USING (source_id, run_id)
        WHERE r.source_name = ANY(?) ORDER BY r.start_time
        """,
        [[str(f) for f in files]],
    )
    assert len(settings) == 2 and settings[0][0] != settings[1][0]  # two runs, 7 minutes apart
    assert (settings[1][1] - settings[0][1]).total_seconds() == pytest.approx(427.5, abs=1)
    for run in settings:
        assert run[2:5] == ("pass@1", "create_test", pytest.approx(0.152439, abs=1e-6))
        assert run[5:8] == (0, None, 164)  # 0-shot, no limit, 164 samples
        # direction recorded for "pass_at_k", not for the value's name "pass@1"
        assert run[10] is None
    assert settings[0][8:10] == settings[1][8:10]  # task version, generation kwargs
    assert (settings[0][11], settings[1][11] is not None) == (None, True)  # hashes: {} vs filled
    first, second = (params_of(db, str(f)) for f in files)
    assert {k: v for k, v in first.items() if k != "batch_size"} == {
        k: v for k, v in second.items() if k != "batch_size"
    }
    assert (first["batch_size"], second["batch_size"]) == ("1", "auto")
    assert first["model"] == "meta-llama/Llama-2-7b-chat-hf" and first["model_source"] == "vllm"
    keys = rows(
        db,
        "SELECT DISTINCT m.key FROM metrics m JOIN runs r USING (source_id, run_id) "
        "WHERE r.source_name = ?",
        [str(files[0])],
    )
    assert keys == [("humaneval/pass@1,create_test",)]  # as lm-eval's W&B logger names it


@needs_realdata
def test_v03_llama_7b(realdata_db):
    db = realdata_db
    model = "/gaueko1/hizkuntza-ereduak/LLaMA/lm/huggingface/7B"
    assert value(db, model, "hellaswag", "acc_norm", "") == [0.7298]
    assert value(db, model, "gsm8k", "acc", "") == [0.0804]
    mmlu = rows(
        db,
        "SELECT count(DISTINCT task), avg(value), min(n_shot), max(n_shot), "
        "bool_or(is_group) FROM eval_results WHERE task LIKE 'hendrycksTest-%' AND metric = 'acc'",
    )[0]
    assert mmlu[0] == 57 and round(mmlu[1], 4) == 0.3829 and mmlu[2:] == (5, 5, False)
    assert rows(
        db,
        "SELECT e.n_shot, e.filter, e.task_version, e.stderr IS NOT NULL, r.start_time, "
        "r.name FROM eval_results e JOIN runs r USING (source_id, run_id) "
        "WHERE e.task = 'gsm8k' AND r.source_name LIKE ?",
        [f"{V03}/%"],
    ) == [(8, "", "0", True, None, f"{model} on gsm8k")]  # no date: time unknown
    params = params_of(db, f"{V03}/llama-7B_common_sense_reasoning_0-shot.json")
    assert params["model_source"] == "hf-causal-experimental"
    assert params["model_args"] == f"pretrained={model},use_accelerate=True"
    assert len(params["tasks"].split(",")) == 12
    keys = {
        k
        for (k,) in rows(
            db,
            "SELECT m.key FROM metrics m JOIN runs r USING (source_id, run_id) "
            "WHERE r.source_name LIKE ? AND m.key LIKE 'hellaswag/%'",
            [f"{V03}/%"],
        )
    }
    assert keys == {"hellaswag/acc", "hellaswag/acc_norm"}  # stderr is no metric of its own
    assert rows(
        db,
        "SELECT r.start_time, r.end_time, t.value FROM runs r JOIN tags t USING "
        "(source_id, run_id) WHERE r.source_name LIKE ? AND t.key = 'audit.log_format'",
        [f"{V03}/%gsm8k%"],
    ) == [(None, None, "lm-eval 0.3")]


@needs_realdata
def test_nl2foam_base_and_sft_with_lower_is_better_perplexities(realdata_db):
    db = realdata_db
    base = "Qwen/Qwen3-8B"
    sft = "/scratch/hieu/nl2foam_sft_0/outputs/nl2foam_sft_0__8__1765350318"
    judge = ("nl2foam_llm_judge_original", "llm_judge")
    assert value(db, base, *judge) + value(db, sft, *judge) == [34.128, 89.156]
    bleu = ("nl2foam_gen_original", "bleu")
    assert value(db, base, *bleu) + value(db, sft, *bleu) == [0.2703, 0.5771]
    ppl = ("nl2foam_perplexity_original", "word_perplexity")
    assert value(db, base, *ppl) + value(db, sft, *ppl) == [6.9251, 2.6066]
    assert rows(
        db,
        "SELECT DISTINCT metric FROM eval_results WHERE higher_is_better = false ORDER BY 1",
    ) == [("bits_per_byte",), ("byte_perplexity",), ("word_perplexity",)]
    params = params_of(db, f"{NL2FOAM}/results_2025-12-17T20-24-58%")
    assert params["model"] == sft
    assert params["model_args"] == f"pretrained={sft},tensor_parallel_size=8"  # an object, sorted
    assert params["lm_eval_version"] == "0.4.9.2"
    assert json.loads(params["gen_kwargs"]) == {"max_gen_toks": 4096}
    assert rows(
        db,
        "SELECT DISTINCT e.samples FROM eval_results e JOIN runs r USING (source_id, run_id) "
        "WHERE r.source_name LIKE ? AND e.task = 'nl2foam_gen_original'",
        [f"{NL2FOAM}/%"],
    ) == [(2849,)]


@needs_realdata
def test_the_leaderboard_csv_named_directly_is_refused(tmp_path, run_cli):
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "evals", str(ALPACA))
    assert code == 2 and "AlpacaEval leaderboard CSV" in err and "Traceback" not in err
    code, _, err = run_cli(
        "--db", str(db), "ingest", "evals", str(EVALS / "alpaca-eval-2-leaderboard")
    )
    assert code == 2 and "no evaluation results file" in err and "AlpacaEval leaderboard" in err
    assert not db.exists() or rows(db, "SELECT count(*) FROM runs") == [(0,)]


@needs_realdata
def test_a_copy_is_the_same_run(tmp_path, run_cli):
    db = tmp_path / "w.duckdb"
    original = V03 / "llama-7B_gsm8k_8-shot.json"
    copies = tmp_path / "copies"
    copies.mkdir()
    (copies / "renamed.json").write_bytes(original.read_bytes())
    code, out, err = run_cli("--db", str(db), "ingest", "evals", str(original), str(copies))
    assert code == 0, err
    assert "imported 1 new evaluation run, 1 unchanged" in out
    assert f"{copies / 'renamed.json'}: the same bytes as {original}" in err
    code, out, err = run_cli("--db", str(db), "ingest", "evals", str(copies))
    assert code == 0 and "imported 0 new evaluation runs, 1 unchanged" in out
    assert rows(db, "SELECT count(*), count(DISTINCT source_id) FROM runs") == [(1, 1)]
    assert rows(db, "SELECT count(*) FROM sources") == [(1,)]


# -- bad input, through the CLI ------------------------------------------------------------------
def results_document(model: str = "org/model", acc: float = 0.5) -> dict:
    """A small 0.4 results dict as simple_evaluate returns it."""
    return {
        "results": {"arc_easy": {"alias": "arc_easy", "acc,none": acc, "acc_stderr,none": 0.01}},
        "group_subtasks": {"arc_easy": []},
        "configs": {"arc_easy": {"num_fewshot": 0, "metadata": {"version": 1.0}}},
        "versions": {"arc_easy": 1.0},
        "n-shot": {"arc_easy": 0},
        "higher_is_better": {"arc_easy": {"acc": True}},
        "n-samples": {"arc_easy": {"original": 2376, "effective": 2376}},
        "config": {"model": "hf", "model_args": f"pretrained={model}", "limit": None},
        "git_hash": "abc1234",
        "date": 1718896233.5,
        "total_evaluation_time_seconds": "120.5",
    }


def write_results(path: Path, document: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = document if isinstance(document, str) else json.dumps(document, indent=2)
    path.write_text(text, encoding="utf-8")
    return path


GOOD = json.dumps(results_document(), indent=2)
BAD_INPUTS = {
    "cut short": (GOOD[: GOOD.index('"config"')], "the JSON stops at byte"),
    "broken inside": (GOOD.replace('"versions"', '"versions" "', 1), "not valid JSON at byte"),
    "not JSON": ("acc,none\n0.5\n", "not valid JSON at byte 0"),
    "empty": ("", "empty file"),
    "results not an object": ('{"results": [1], "versions": {}}', "results is a list"),
    "task not an object": (
        '{"results": {"t": 0.5}, "versions": {}}',
        "results.t is a number 0.5, expected an object of metric values",
    ),
    "config not an object": ('{"results": {}, "config": "hf"}', "config is text"),
    "too deep": ('{"results": ' + "[" * 100_000, "nested too deeply"),
    "huge integer": ('{"results": {}, "versions": {"t": ' + "9" * 5000 + "}}", "not readable JSON"),
    "binary": ("\x00\x01\x02", "binary data"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_files_exit_2_with_nothing_written(tmp_path, run_cli, case):
    content, message = BAD_INPUTS[case]
    folder = tmp_path / "results"
    write_results(folder / "a_good.json", GOOD)
    bad = write_results(folder / "bad.json", content)
    db = tmp_path / "w.duckdb"
    for target in (folder, bad):  # found in a folder and named
        code, out, err = run_cli("--db", str(db), "ingest", "evals", str(target))
        assert code == 2, (out, err)
        assert f"{bad}: " in err and message in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert not db.exists() or rows(db, "SELECT count(*) FROM runs") == [(0,)]
    code, out, err = run_cli("--db", str(db), "ingest", "evals", "--skip-bad", str(folder))
    assert code == 0 and f"skipped: {bad}: " in err
    assert rows(db, "SELECT source_name FROM runs") == [(str(folder / "a_good.json"),)]


def test_the_break_is_named_by_its_byte_offset(tmp_path, run_cli):
    text = GOOD.replace('"versions"', '"versions" "', 1)
    bad = write_results(tmp_path / "r.json", text)
    code, _, err = run_cli("--db", str(tmp_path / "w.duckdb"), "ingest", "evals", str(bad))
    offset = len(text.encode()[: text.index('"versions" "') + len('"versions" ')])
    assert code == 2 and f"byte {offset} " in err, err


def test_a_file_above_the_size_bound_is_refused_before_it_is_read(tmp_path, run_cli):
    huge = tmp_path / "results_huge.json"
    with open(huge, "wb") as handle:  # sparse: no disk space, the size is what counts
        handle.truncate((256 << 20) + 1)
    code, _, err = run_cli("--db", str(tmp_path / "w.duckdb"), "ingest", "evals", str(huge))
    assert code == 2 and "more than the 268,435,456 bytes" in err, err


def test_other_files_in_a_folder_are_skipped_with_a_note_and_refused_when_named(tmp_path, run_cli):
    folder = tmp_path / "out"
    write_results(folder / "results_2024-06-20T15-10-33.123456.json", results_document())
    config = write_results(folder / "config.json", {"architectures": ["LlamaForCausalLM"]})
    listed = write_results(folder / "list.json", [1, 2])
    table = write_results(folder / "summary.csv", "dataset,version,metric,mode,m\nx,1,acc,gen,5\n")
    (folder / "samples_arc_easy_2024-06-20T15-10-33.123456.jsonl").write_text("{}\n")
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "evals", str(folder))
    assert code == 0, err
    assert f"note: {config}: no 'results' object" in err
    assert f"note: {listed}: the JSON is a list" in err
    assert f"note: {table}: a CSV file" in err
    assert "imported 1 new evaluation run" in out
    for named in (config, listed, table):
        code, _, err = run_cli("--db", str(db), "ingest", "evals", str(named))
        assert code == 2 and f"{named}: " in err
    code, _, err = run_cli("--db", str(db), "ingest", "evals", str(tmp_path / "missing"))
    assert code == 2 and "no such file or folder" in err


def test_a_folder_without_any_results_file_is_refused(tmp_path, run_cli):
    # the wrong folder (a model's files, a W&B run) is an error, not "0 imported"
    folder = tmp_path / "model"
    config = write_results(folder / "config.json", {"architectures": ["LlamaForCausalLM"]})
    write_results(folder / "tokenizer_config.json", {"model_max_length": 4096})
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "evals", str(folder))
    assert code == 2 and "no evaluation results file among the files found" in err, (out, err)
    assert str(config) in err and "(and 1 other file)" in err and len(err.strip().splitlines()) == 1
    assert not db.exists() or rows(db, "SELECT count(*) FROM runs") == [(0,)]
    # with a results file beside them, the others are notes and the import goes on; read
    # again, the results file is unchanged, not missing
    write_results(folder / "results_2024-06-20T15-10-33.123456.json", results_document())
    for imported in (
        "imported 1 new evaluation run",
        "imported 0 new evaluation runs, 1 unchanged",
    ):
        code, out, err = run_cli("--db", str(db), "ingest", "evals", str(folder))
        assert code == 0 and imported in out, (out, err)


def test_settings_values_and_times_as_recorded(tmp_path, run_cli):
    document = results_document()
    document["results"]["arc_easy"].update(
        {
            "acc_norm,none": float("nan"),
            "f1,none": "N/A",
            "em,none": 1e400,
            "acc_norm_stderr,none": 1,
        }
    )
    document["n-shot"]["arc_easy"] = 2**40  # beyond INTEGER: not stored
    document["config"].update(
        {
            "model_args": "pretrained=org/base,peft=/ckpt/adapter-7,revision=v2,add_bos_token=True,"
            "token=hf_SECRETTOKEN,api_key=sk-SECRETKEY,base_url=http://bob:pw-SECRET@host:8000/v1",
            "gen_kwargs": "temperature=0,do_sample=False,max_new_tokens=64",
            "batch_size": 8,
            "limit": 0.25,
        }
    )
    document.update(
        {
            "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
            "system_instruction": "Mail answers to ops@example.com",
            "fewshot_as_multiturn": True,
            "model_source": "hf",
            "lm_eval_version": "0.4.8",
        }
    )
    text = json.dumps(document, indent=2)  # NaN and Infinity, as Python's json writes them
    assert "NaN" in text and "Infinity" in text
    path = write_results(tmp_path / "results_2024-06-20T15-10-33.123456.json", text)
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "evals", str(path))
    assert code == 0, err
    assert "3 values left out: no finite number (NaN, inf, N/A)" in err
    assert rows(db, "SELECT metric, filter, value, stderr, higher_is_better, n_shot, "
                "limit_n, samples, task_version FROM eval_results") == [
        ("acc", "none", 0.5, 0.01, True, None, 0.25, 2376, "1.0")
    ]  # fmt: skip
    params = params_of(db, str(path))
    assert params == {
        "model": "org/base",
        "model_args": "pretrained=org/base,peft=/ckpt/adapter-7,revision=v2,add_bos_token=True,"
        "base_url=http://host:8000/v1",
        "model_revision": "v2",
        "peft": "/ckpt/adapter-7",
        "model_source": "hf",
        "chat_template": params["chat_template"],
        "system_instruction": params["system_instruction"],
        "fewshot_as_multiturn": "True",
        "gen_kwargs": '{"do_sample":false,"max_new_tokens":64,"temperature":0}',
        "batch_size": "8",
        "limit": "0.25",
        "lm_eval_version": "0.4.8",
        "git_hash": "abc1234",
        "tasks": "arc_easy",
    }
    assert len(params["chat_template"]) == len(params["system_instruction"]) == 64  # SHA-256
    assert rows(db, "SELECT name, epoch(start_time), epoch(end_time) FROM runs") == [
        ("org/base on arc_easy", 1718896233.5, 1718896354.0)
    ]
    assert rows(db, "SELECT key, value, step, epoch(ts) FROM metrics") == [
        ("arc_easy/acc", 0.5, 0, 1718896233.5)
    ]
    con = duckdb.connect(str(db))
    con.execute("CHECKPOINT")
    con.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("w.duckdb*"))
    for secret in (b"SECRETTOKEN", b"SECRETKEY", b"pw-SECRET", b"example.com", b"m.content"):
        assert secret not in stored


def test_without_a_date_the_time_comes_from_the_file_name_else_stays_unknown(tmp_path, run_cli):
    document = results_document()
    del document["date"]
    named = write_results(tmp_path / "a" / "results_2024-06-20T15-10-33.123456.json", document)
    document["config"]["model_args"] = "pretrained=org/other"
    plain = write_results(tmp_path / "b" / "results.json", document)
    os.utime(plain, (1_600_000_000, 1_600_000_000))  # the modification time is never used
    db = tmp_path / "w.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "evals", str(named), str(plain))
    assert code == 0, err
    assert rows(
        db,
        "SELECT strftime(start_time, '%Y-%m-%d %H:%M:%S.%g'), "
        "strftime(end_time, '%Y-%m-%d %H:%M:%S.%g') FROM runs ORDER BY source_name",
    ) == [("2024-06-20 15:08:32.623", "2024-06-20 15:10:33.123"), (None, None)]
    assert rows(db, "SELECT count(*) FROM metrics WHERE ts IS NULL") == [(1,)]


def test_a_new_file_of_a_rerun_is_a_new_run_and_an_unchanged_one_is_not_read_again(
    tmp_path, run_cli
):
    folder = tmp_path / "results"
    write_results(folder / "results_1.json", results_document(acc=0.5))
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "evals", str(folder))[0] == 0
    before = table_counts(db)
    write_results(folder / "results_2.json", results_document(acc=0.6))
    code, out, _ = run_cli("--db", str(db), "ingest", "evals", str(folder))
    assert code == 0 and "imported 1 new evaluation run, 1 unchanged" in out
    after = table_counts(db)
    assert after["runs"] == before["runs"] + 1
    assert after["eval_results"] == before["eval_results"] + 1
    assert sorted(v for (v,) in rows(db, "SELECT value FROM eval_results")) == [0.5, 0.6]


# -- any document: a result or the tool's own error ----------------------------------------------
KEYS = [
    "results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
    "n-samples", "config", "date", "task_hashes", "model_args", "limit", "gen_kwargs", "acc,none",
    "acc_stderr,none", "acc", "acc_stderr", "alias", "effective", "num_fewshot", "metric_list",
    "metric", "generation_kwargs", "t", " ", "pretrained", "total_evaluation_time_seconds",
]  # fmt: skip
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["N/A", "", "pretrained=a,token=x", "1e400", "t", "0"])
)
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(
    max_examples=property_examples(200, 3000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    document=st.fixed_dictionaries(
        {"results": DOCUMENTS, "versions": DOCUMENTS},
        optional={k: DOCUMENTS for k in KEYS if k not in ("results", "versions")},
    )
)
def test_any_results_document_gives_finite_values_or_an_input_error(document):
    path = Path("results.json")
    try:
        evaluation = read_lm_eval(document, path)
    except InputError as exc:
        assert str(exc).startswith(f"{path}: ")
        return
    for result in evaluation.results:
        assert math.isfinite(result.value)
        assert result.stderr is None or math.isfinite(result.stderr)
        assert result.n_shot is None or -(2**31) <= result.n_shot < 2**31
        assert result.samples is None or -(2**63) <= result.samples < 2**63
        assert result.limit_n is None or math.isfinite(result.limit_n)
    assert "token=x" not in evaluation.params.get("model_args", "")

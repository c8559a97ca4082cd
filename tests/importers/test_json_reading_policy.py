"""One JSON reading policy (``audit.importers.read``) for every importer: a document that
may parse into more values than ``MAX_JSON_VALUES`` is refused before it is parsed, by the
readers of sacct --json, saved Prometheus answers and lm-eval results too (they parsed
such a document whole: 22 MB of ``[],`` is 7.5 million lists, about 600 MB)."""

from __future__ import annotations

import pytest

from audit.importers.read import MAX_JSON_VALUES

MANY = "[]," * (MAX_JSON_VALUES // 2 + 1)  # two values in three bytes


@pytest.mark.parametrize(
    ("kind", "name", "document"),
    [
        ("slurm", "sacct.json", '{"jobs": [' + MANY + "[]]}"),
        ("gpu", "query.json", '{"data": {"resultType": "matrix", "result": [' + MANY + "[]]}}"),
        ("evals", "results_2026-01-01T00-00-00.json", '{"results": [' + MANY + "[]]}"),
    ],
)
def test_a_json_document_of_too_many_values_is_refused_before_it_is_parsed(
    tmp_path, run_cli, db, kind, name, document
):
    path = tmp_path / name
    path.write_text(document, encoding="utf-8")
    code, _out, err = run_cli("--db", str(db), "ingest", kind, str(path))
    assert code == 2, err
    assert str(path) in err
    assert f"more than the {MAX_JSON_VALUES:,} audit reads from one document" in err

"""The typed config sections: built once from the validated TOML, frozen, and what the
code reads instead of raw ``values[...]`` lookups."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

import pytest

from audit.config import SCHEMA, SECTIONS, load_config
from audit.errors import InputError


def test_the_schema_is_the_sections_and_no_file_gives_their_defaults():
    """SCHEMA (what a file is validated against, and what docs/configuration.md shows) is
    read off the sections: the defaults a file starts from are the sections' own."""
    config = load_config(None)
    assert list(SCHEMA) == list(SECTIONS)
    for name, section in SECTIONS.items():
        assert getattr(config, name) == section(), name
        assert [f.name for f in dataclasses.fields(section)] == list(SCHEMA[name])
    assert config.metrics.general == ("eval/general/*",)


def test_sections_hold_the_file_values_and_cannot_be_changed(tmp_path):
    path = tmp_path / "audit.toml"
    path.write_text(
        "[metrics]\n"
        'red_lines = ["safety/*"]\n'
        'red_line_tolerances = { "safety/refusal*" = 0.02 }\n'
        'lower_is_better = ["eval/toxicity"]\n'
        "[attribution]\n"
        'eval_methods = ["bench"]\n'
        "[shift]\n"
        "min_history = 7\n"
    )
    config = load_config(path)
    assert config.shift.min_history == 7
    assert config.attribution.eval_methods == ("bench",)
    assert config.attribution.is_evaluation_method("bench")
    assert not config.attribution.is_evaluation_method("eval")  # replaced, not added
    assert not config.attribution.is_evaluation_method(None)
    assert config.metrics.kind_of("safety/refusal_rate") == "red_lines"
    assert config.metrics.kind_of("eval/general/mmlu") == "general"
    assert config.metrics.kind_of("loss") is None
    assert config.metrics.red_line_tolerance("safety/refusal_rate") == 0.02
    assert config.metrics.red_line_tolerance("safety/jailbreak") == 0.0
    assert config.metrics.direction_of("eval/toxicity") == ("lower_is_better", "eval/toxicity")
    assert config.metrics.direction_of("eval/other") is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.shift.min_history = 1
    with pytest.raises(TypeError):
        config.metrics.red_line_tolerances["x"] = 1.0
    # a copy for another process or a watch's live settings keeps the sections
    again = pickle.loads(pickle.dumps(config))
    assert again.metrics == config.metrics and again.digest == config.digest


def test_a_rule_settings_copy_rebuilds_nothing_else_and_leaves_the_original():
    config = load_config(None)
    live = config.with_rule_settings("STB001", grace_hours=0.0)
    assert live.rules["STB001"] == {"grace_hours": 0.0}
    assert "STB001" not in config.rules
    assert live.metrics == config.metrics


def test_a_bad_value_is_still_an_input_error_naming_the_key(tmp_path):
    path = tmp_path / "audit.toml"
    path.write_text("[shift]\nmin_history = 0\n")
    with pytest.raises(InputError, match=r"audit.toml:2: \[shift\] min_history"):
        load_config(path)


def test_the_cli_exits_2_on_a_bad_section_value(tmp_path):
    path = tmp_path / "audit.toml"
    path.write_text('[metrics]\nred_line_tolerances = { "safety/*" = -1 }\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "audit",
            "--config",
            str(path),
            "--db",
            str(tmp_path / "w.duckdb"),
            "status",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert "red_line_tolerances.safety/*" in done.stderr and "Traceback" not in done.stderr

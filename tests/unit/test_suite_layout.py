"""Every test file sits in the folder of its layer (tests/conftest.py says which is which):
a test file written straight into tests/ or into a folder of its own fails here."""

from __future__ import annotations

import tests.conftest
from tests.helpers import REPO

LAYERS = ("unit", "importers", "rules", "cli", "reports", "robustness", "scale")
# the example plug-in carries its own tests, as an out-of-tree plug-in would
OWN_SUITES = ("plugin_example",)


def test_every_test_file_is_in_a_layer_folder():
    root = REPO / "tests"
    misplaced = []
    for path in root.rglob("test_*.py"):
        parts = path.relative_to(root).parts
        if parts[0] in OWN_SUITES:
            continue
        if len(parts) != 2 or parts[0] not in LAYERS:
            misplaced.append("/".join(parts))
    assert not misplaced, f"put these in one of tests/{{{','.join(LAYERS)}}}/: {sorted(misplaced)}"


def test_every_layer_is_described():
    described = tests.conftest.__doc__
    assert all(f"``{layer}/``" in described for layer in LAYERS)
    assert all((REPO / "tests" / layer / "__init__.py").is_file() for layer in LAYERS)

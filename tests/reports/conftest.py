"""Fixtures of the reports' tests (the option is the root conftest's: pytest reads options
only there)."""

from __future__ import annotations

import pytest


@pytest.fixture
def regenerate_golden(request) -> bool:
    return request.config.getoption("--regenerate-golden")

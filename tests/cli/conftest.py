"""Fixtures of the commands' tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def slurm():
    """A real single-node Slurm (tests/slurm_cluster.py), one per test session. Its folder
    is not under pytest's (mode 700): munged wants every folder above its socket
    world-executable."""
    import tempfile

    from tests.slurm_cluster import DEBIAN_PACKAGES, missing_programs, slurm_cluster

    missing = missing_programs()
    if missing or os.geteuid() != 0:
        why = (
            f"not installed: {', '.join(missing)} (apt-get install {DEBIAN_PACKAGES})"
            if missing
            else "the test Slurm runs its daemons as root"
        )
        if os.environ.get("CI"):  # .ci/run installs them: a missing one is a failure there
            pytest.fail(f"real Slurm: {why}")
        pytest.skip(f"real Slurm: {why}")
    root = Path(tempfile.mkdtemp(prefix="audit-slurm-"))
    try:
        with slurm_cluster(root) as cluster:
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)

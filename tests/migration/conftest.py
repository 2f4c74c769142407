"""Fixtures of the migration tests: the local provider (jobs as subprocesses of this machine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from costopt.migration.records import ALIVE_STATES
from costopt.settings import PROJECT_ROOT
from providers.local import LocalProvider


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalProvider]:
    """A local provider in the test's directory; every copy still alive at the end is terminated."""
    prov = LocalProvider(tmp_path / "cloud", cwd=PROJECT_ROOT, grace_seconds=3.0)
    yield prov
    for inst in prov.list({}):
        if inst.state in ALIVE_STATES:
            prov.terminate(inst.instance_id)
    prov.close()

"""The service's heap settles at start-up (api/heap.py, COSTOPT_GC_FREEZE): the objects alive then leave
the garbage collector's full passes, and what is made afterwards is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from api.heap import settle
from tests.api.jobs_helpers import BODY, service

pytestmark = pytest.mark.one_backend_each


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """This test process's heap thawed again afterwards (the suite runs with COSTOPT_GC_FREEZE off)."""
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_settle_freezes_what_lives_and_collects_what_comes_after(unfrozen: None) -> None:
    before = _Node()
    frozen = settle()
    assert frozen > 1000  # the interpreter's and the test's own objects at least
    assert gc.get_freeze_count() == frozen
    assert all(before is not o for o in gc.get_objects())  # out of the tracked generations
    after = _Node()
    ref = weakref.ref(after)
    del after
    gc.collect()
    assert ref() is None  # a cycle made after the freeze is still collected


def test_the_service_settles_its_heap_at_start_up(engine: Engine, tmp_path: Path, unfrozen: None) -> None:
    for svc in service(engine, tmp_path, gc_freeze=True):
        assert gc.get_freeze_count() > 100_000  # modules, schemas and the planner's catalog
        resp = svc.client.post("/v1/jobs", json=BODY, headers=svc.alpha)
        assert resp.status_code == 201, resp.text


def test_the_suite_runs_with_the_heap_collectable(engine: Engine, tmp_path: Path, unfrozen: None) -> None:
    for _svc in service(engine, tmp_path):  # COSTOPT_GC_FREEZE=false from tests/conftest.py
        assert gc.get_freeze_count() == 0

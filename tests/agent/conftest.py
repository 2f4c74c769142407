"""Fixtures of the agent tests: a checkpoint location and a clock the test moves by hand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from costopt.agent import Agent


class FakeClock:
    """Wall-clock seconds that only move when the test says so (no sleeping in tests)."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return str(tmp_path / "ckpt")


@pytest.fixture
def make_agent(uri: str, clock: FakeClock) -> Callable[..., Agent]:
    def make(epoch: int = 1, **kwargs: Any) -> Agent:
        kwargs.setdefault("clock", clock)
        return Agent("job-1", kwargs.pop("uri", uri), epoch, **kwargs)

    return make

"""A fake price source that fails unless a test gives it something to return."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pricing.base import FetchResult, PriceHistoryView


@dataclass
class FakeSource:
    """Each ``fetch`` pops the next scripted answer: a FetchResult to return or an exception to raise.
    With nothing scripted it raises AssertionError (a test forgot to say what should happen)."""

    name: str
    script: list[FetchResult | BaseException] = field(default_factory=list)
    calls: int = 0
    on_fetch: Callable[[PriceHistoryView], None] | None = None

    def fetch(self, history: PriceHistoryView) -> FetchResult:
        self.calls += 1
        if self.on_fetch is not None:
            self.on_fetch(history)
        if not self.script:
            raise AssertionError(f"fake source {self.name} was fetched but the test scripted no answer")
        answer = self.script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

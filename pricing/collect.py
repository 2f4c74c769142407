"""Running collectors: fetch -> screen -> store, with per-source health and back-off.

Every fetched point passes :func:`pricing.screen.screen_frame` (zero, absurd per GPU-hour, future
times, odd names, unknown regions, conflicting prices); refused points are counted as bad records,
logged with the source and recorded in ``source_status`` with the first reason; the rest is stored.

One source failing never stops the others: :func:`collect_once` catches each source's failure,
records it (``costopt prices sources`` shows it) and goes on. A partial fetch stores its good
points and is recorded as partial; nothing is ever deleted because a fetch failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from costopt.errors import CostoptError, SourceUnavailable
from pricing.base import MAX_PROBLEMS_KEPT, FetchResult, PriceSource
from pricing.screen import gpu_counts, screen_frame, screen_types
from pricing.store import PriceStore, points_frame

log = logging.getLogger("costopt.collect")


@dataclass(frozen=True, slots=True)
class CollectOutcome:
    """What one run of one source did. ``error`` is None on success (partial or not)."""

    source: str
    ok: bool
    points: int
    inserted: int
    bad_records: int
    skipped: int
    partial: bool
    seconds: float
    error: str | None = None


def _now() -> datetime:
    return datetime.now(UTC)


def run_source(store: PriceStore, source: PriceSource, *, clock: Callable[[], datetime] = _now) -> CollectOutcome:
    """Fetch one source and store what it returned. Never raises for the source's own failures."""
    started = time.perf_counter()
    at = clock()
    try:
        result: FetchResult = source.fetch(store)
    except Exception as exc:  # a failing source must never stop the scheduler or the others
        msg = f"{type(exc).__name__}: {exc}" if not isinstance(exc, CostoptError) else str(exc)
        log.error("price source %s failed: %s", source.name, msg)
        refused = exc.refused_pages if isinstance(exc, SourceUnavailable) else 0
        store.record_fetch(
            source.name, ok=False, at=at, error=msg, refused_pages=refused, rejection=msg if refused else None
        )
        return CollectOutcome(source.name, False, 0, 0, 0, 0, False, time.perf_counter() - started, msg)
    try:
        catalog = store.instance_types()
        types, refused_types = screen_types(result.instance_types)
        for why in refused_types:
            log.warning("price source %s: refused %s", source.name, why)
        screened = screen_frame(
            points_frame(result.points),
            gpus=gpu_counts([*catalog, *types]),
            rules=store.screen_rules,
            now=at,
        )
        for why in screened.reasons:
            log.warning("price source %s: refused %s", source.name, why)
        result.bad_records += screened.refused + len(refused_types)
        result.reasons.extend(screened.reasons[: max(0, MAX_PROBLEMS_KEPT - len(result.reasons))])
        if types:
            known = {(t.cloud, t.name) for t in catalog}
            new_types = [t for t in types if (t.cloud, t.name) not in known or t.source.endswith("-api")]
            store.upsert_instance_types(new_types)
        written = store.write(screened.frame)
        points = len(screened.frame)
    except Exception as exc:  # the store refused the batch: record, keep the previous prices
        msg = f"storing {len(result.points)} points failed: {type(exc).__name__}: {exc}"
        log.error("price source %s: %s", source.name, msg)
        store.record_fetch(
            source.name,
            ok=False,
            at=at,
            error=msg,
            bad_records=result.bad_records,
            refused_pages=result.refused_pages,
            rejection=result.reasons[0] if result.reasons else None,
        )
        return CollectOutcome(
            source.name,
            False,
            len(result.points),
            0,
            result.bad_records,
            result.skipped,
            result.partial,
            time.perf_counter() - started,
            msg,
        )
    note = "; ".join(result.errors) if result.errors else None
    store.record_fetch(
        source.name,
        ok=True,
        at=at,
        points=points,
        bad_records=result.bad_records,
        skipped=result.skipped,
        partial=result.partial,
        error=note,
        refused_pages=result.refused_pages,
        rejection=result.reasons[0] if result.reasons else None,
    )
    log.info(
        "price source %s: %d points (%d new), %d bad, %d pages refused, %d skipped%s",
        source.name,
        points,
        written.inserted,
        result.bad_records,
        result.refused_pages,
        result.skipped,
        " (partial)" if result.partial else "",
    )
    return CollectOutcome(
        source.name,
        True,
        points,
        written.inserted,
        result.bad_records,
        result.skipped,
        result.partial,
        time.perf_counter() - started,
        note,
    )


def collect_once(store: PriceStore, sources: Sequence[PriceSource]) -> list[CollectOutcome]:
    """Run every source once, in order; each failure is recorded and the next source still runs."""
    return [run_source(store, s) for s in sources]


def backoff_delay(interval: timedelta, consecutive_failures: int, *, cap: timedelta = timedelta(hours=6)) -> timedelta:
    """How long to wait after ``consecutive_failures`` failures: the interval, doubled per failure
    beyond the first, never above ``cap`` (nor below the interval)."""
    if consecutive_failures <= 1:
        return interval
    grown: timedelta = interval * (2 ** min(consecutive_failures - 1, 16))
    return min(max(interval, cap), grown)

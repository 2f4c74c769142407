"""APScheduler 3.x jobs: one interval job per price source.

Each job has ``max_instances=1`` (a slow fetch never overlaps itself) and ``coalesce=True`` (missed
runs collapse into one). A source that keeps failing backs off: a run is skipped while the time
since its last attempt is shorter than :func:`pricing.collect.backoff_delay`.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from api.wiring import source_intervals
from costopt.settings import Settings
from pricing.base import PriceSource
from pricing.collect import backoff_delay, run_source
from pricing.store import PriceStore

log = logging.getLogger("costopt.scheduler")


def _job(store: PriceStore, source: PriceSource, interval: timedelta) -> None:
    status = {s.name: s for s in store.sources()}.get(source.name)
    now = datetime.now(UTC)
    if status is not None and status.consecutive_failures >= 2 and status.last_attempt_at is not None:
        wait = backoff_delay(interval, status.consecutive_failures)
        if now - status.last_attempt_at < wait - timedelta(seconds=1):
            log.info(
                "price source %s: backing off after %d failures (next try after %s)",
                source.name,
                status.consecutive_failures,
                status.last_attempt_at + wait,
            )
            return
    run_source(store, source)


def build_scheduler(store: PriceStore, sources: Sequence[PriceSource], settings: Settings) -> BackgroundScheduler:
    """A scheduler (not started) with one job per source, first run right away."""
    scheduler = BackgroundScheduler(timezone=UTC, job_defaults={"max_instances": 1, "coalesce": True})
    intervals = source_intervals(settings)
    for source in sources:
        seconds = intervals.get(source.name, 3600.0)
        scheduler.add_job(
            _job,
            IntervalTrigger(seconds=seconds, timezone=UTC),
            args=[store, source, timedelta(seconds=seconds)],
            id=f"collect:{source.name}",
            name=f"collect prices from {source.name}",
            next_run_time=datetime.now(UTC),
            max_instances=1,
            coalesce=True,
            misfire_grace_time=int(seconds),
        )
    return scheduler


def run_forever(store: PriceStore, sources: Sequence[PriceSource], settings: Settings) -> None:
    """Run the collectors on their schedule until SIGINT/SIGTERM."""
    scheduler = build_scheduler(store, sources, settings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    scheduler.start()
    log.warning("collecting prices from %s; Ctrl-C to stop", ", ".join(s.name for s in sources))
    try:
        stop.wait()
    finally:
        scheduler.shutdown(wait=False)

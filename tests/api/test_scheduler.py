"""The collector schedule: one interval job per source, never overlapping, backing off on failure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import Engine

from api.scheduler import _job, build_scheduler
from costopt.errors import SourceUnavailable
from costopt.settings import Settings
from pricing.base import FetchResult
from pricing.store import PriceStore
from tests.fakes.sources import FakeSource


def test_each_source_gets_one_interval_job_that_never_overlaps_itself(engine: Engine) -> None:
    store = PriceStore(engine)
    settings = Settings(aws_spot_interval=timedelta(minutes=15), azure_interval=timedelta(hours=2))
    sched = build_scheduler(store, [FakeSource("aws-spot"), FakeSource("azure")], settings)
    jobs = {j.id: j for j in sched.get_jobs()}
    assert set(jobs) == {"collect:aws-spot", "collect:azure"}
    for job in jobs.values():
        assert job.max_instances == 1
        assert job.coalesce is True
        assert isinstance(job.trigger, IntervalTrigger)
    assert jobs["collect:aws-spot"].trigger.interval == timedelta(minutes=15)
    assert jobs["collect:azure"].trigger.interval == timedelta(hours=2)


def test_a_failing_source_is_skipped_while_it_backs_off(engine: Engine) -> None:
    store = PriceStore(engine)
    src = FakeSource("azure", [SourceUnavailable("down"), SourceUnavailable("down")])
    hour = timedelta(hours=1)
    _job(store, src, hour)  # first failure: recorded
    _job(store, src, hour)  # one failure: the next run goes ahead
    assert src.calls == 2
    _job(store, src, hour)  # two failures in a row: wait two intervals since the last attempt
    assert src.calls == 2


def test_a_source_that_failed_long_ago_is_tried_again(engine: Engine) -> None:
    store = PriceStore(engine)
    long_ago = datetime.now(UTC) - timedelta(days=2)
    for _ in range(3):
        store.record_fetch("gcp", ok=False, at=long_ago, error="down")
    src = FakeSource("gcp", [FetchResult("gcp")])
    _job(store, src, timedelta(hours=1))
    assert src.calls == 1
    assert store.sources()[0].consecutive_failures == 0

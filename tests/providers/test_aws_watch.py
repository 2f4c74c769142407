"""The interruption watcher on AWS's notice queue (moto's SQS on loopback): a notice's message is deleted
only after the watcher acted on it, so a watcher that dies between reading and acting loses nothing."""

from __future__ import annotations

import builtins
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from costopt.agent import control
from costopt.cloud import Interruption
from costopt.domain import Cloud, Market, OfferKey
from costopt.migration.machine import Migrator
from costopt.migration.watch import InterruptionWatcher, MemoryWatermark, notice_request_id
from providers.aws import AwsProvider, setup_interruption_queue
from tests.aws_support import REGION, fake_session
from tests.migration.test_watch import Clock, InProcessCloud
from tests.providers.test_aws_provider import queued, send_notice

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

T0 = datetime(2026, 3, 2, 14, 0, tzinfo=UTC)
OFFERS = (
    OfferKey(Cloud.AWS, REGION, "us-east-1a", "g5.xlarge", Market.SPOT),
    OfferKey(Cloud.AWS, REGION, "us-east-1b", "g5.xlarge", Market.SPOT),
)
VISIBILITY = 1
"""Seconds a notice read but not acknowledged stays hidden (SQS VisibilityTimeout) in these tests."""


class QueueCloud(InProcessCloud):
    """Instances 'run' in this process (the migration tests' in-process cloud: a launch restores, steps and
    checkpoints with a real Agent, so the migrator's verification passes at once); interruptions come from
    the real AWS provider's queue, and acknowledgements go back to it."""

    name = "aws"

    def __init__(self, aws: AwsProvider, clock: Clock) -> None:
        super().__init__(clock, prefix="i-0")
        self.aws = aws

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        return [e for e in self.aws.interruptions(since) if e.kind == "notice"]

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        super().acknowledge(interruptions)
        self.aws.acknowledge(interruptions)


class Setup:
    def __init__(self, engine: Engine, moto_url: str, tmp_path: Path) -> None:
        self.moto_url = moto_url
        self.queue_url = setup_interruption_queue(
            REGION, session=fake_session(), endpoint_url=moto_url, queue_name=f"watch-{uuid.uuid4().hex[:8]}"
        ).queue_url
        self.clock = Clock(T0)
        aws = AwsProvider(
            [REGION], session=fake_session(), endpoint_url=moto_url, interruption_queue_urls={REGION: self.queue_url},
            queue_wait_seconds=0, notice_visibility_seconds=VISIBILITY, max_attempts=2,
        )  # fmt: skip
        self.cloud = QueueCloud(aws, self.clock)
        self.migrator = Migrator(engine, self.cloud, backoff_base=0.001, now=self.clock)  # type: ignore[arg-type]
        self.uri = str(tmp_path / "ckpt" / "job-1")
        self.watermark = MemoryWatermark()

    def start(self) -> str:
        self.migrator.register_job("job-1", ["train"], self.uri)
        rec = self.migrator.start("job-1", OFFERS)
        assert rec.state.value == "done", rec.reason
        iid = self.migrator.job("job-1").instance_id
        assert iid is not None
        return iid

    def watcher(self) -> InterruptionWatcher:
        """A watcher as a (re)started service process makes it (nothing in memory)."""
        return InterruptionWatcher(
            self.migrator, lambda job: OFFERS, clock=self.clock, overlap=timedelta(minutes=5),
            watermark=self.watermark,
        )  # fmt: skip

    def aws_warns(self, instance_id: str) -> None:
        send_notice(self.moto_url, self.queue_url, instance_id, self.clock())

    def queued(self) -> int:
        return queued(self.moto_url, self.queue_url)


@pytest.fixture
def s(engine: Engine, moto_url: str, tmp_path: Path) -> Setup:
    return Setup(engine, moto_url, tmp_path)


def test_a_notice_acted_on_is_deleted_from_the_queue(s: Setup) -> None:
    iid = s.start()
    s.aws_warns(iid)
    watcher = s.watcher()

    report = watcher.poll()

    assert [(n.instance_id, n.request_id) for n in report.notices] == [(iid, notice_request_id(iid, T0))]
    assert control.pending_request(s.uri) is not None
    assert s.queued() == 0, "acknowledged once the checkpoint request was written"
    assert [e.instance_id for e in s.cloud.acknowledged] == [iid]
    time.sleep(VISIBILITY + 0.3)
    assert watcher.poll().events == 0  # gone for good


def test_a_watcher_that_dies_between_reading_and_acting_leaves_the_notice_for_the_next_one(
    s: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    iid = s.start()
    s.aws_warns(iid)
    crashing = s.watcher()

    def crash(self: Migrator, **_: Any) -> list[Any]:
        raise RuntimeError("the service died after reading the queue")

    monkeypatch.setattr(Migrator, "active_migrations", crash)  # read right after the queue
    with pytest.raises(RuntimeError, match="died"):
        crashing.poll()
    monkeypatch.undo()
    assert s.queued() == 1 and control.pending_request(s.uri) is None and s.cloud.acknowledged == []

    time.sleep(VISIBILITY + 0.3)  # the message is visible again
    report = s.watcher().poll()  # the restarted service

    assert [n.instance_id for n in report.notices] == [iid]
    request = control.pending_request(s.uri)
    assert request is not None and request["id"] == notice_request_id(iid, T0)
    assert s.queued() == 0


def test_a_failed_action_is_not_acknowledged_and_the_same_watcher_acts_on_the_notice_when_it_comes_again(
    s: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    iid = s.start()
    s.aws_warns(iid)
    watcher = s.watcher()

    def unreachable_store(*args: Any, **kwargs: Any) -> str:
        raise OSError("checkpoint store unreachable")

    monkeypatch.setattr("costopt.migration.watch.control.request_checkpoint", unreachable_store)
    first = watcher.poll()
    monkeypatch.undo()
    assert first.notices == () and s.queued() == 1 and s.cloud.acknowledged == []

    time.sleep(VISIBILITY + 0.3)
    again = watcher.poll()

    assert again.duplicates == 0 and [n.instance_id for n in again.notices] == [iid]
    assert control.pending_request(s.uri) is not None
    assert s.queued() == 0

"""When to checkpoint and when to stop: requests, signals, preemption notices and their deadlines.

Every deadline is computed from an injected clock: nothing sleeps.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from costopt.agent import CHECKPOINT_MARGIN_SECONDS, NOTICE_SECONDS, control
from costopt.agent.notices import (
    AwsNoticeSource,
    AzureNoticeSource,
    FileNoticeSource,
    GcpNoticeSource,
    Notice,
    parse_time,
    sources_from_env,
)
from costopt.agent.storage import LocalStorage

T0 = 1_700_000_000.0


class FixedSource:
    """A notice source that posts a notice from a given time on."""

    name = "fixed"
    interval = 1.0

    def __init__(self, at: float, window: float) -> None:
        self.at, self.window = at, window

    def poll(self, now: float) -> Notice | None:
        return Notice("fixed", self.at, self.at + self.window) if now >= self.at else None


# -- requests ------------------------------------------------------------------------------------


def test_a_migrators_request_triggers_one_checkpoint_that_carries_its_id(make_agent, uri, clock):
    agent = make_agent(poll_interval=1.0)
    agent.restore()
    assert not agent.should_checkpoint()
    rid = control.request_checkpoint(uri, epoch=1, reason="move")
    clock.advance(1.0)
    assert agent.should_checkpoint()
    assert not control.request_served(uri, rid)
    agent.checkpoint(42, {"s": 42})
    assert control.request_served(uri, rid)
    info = control.latest(uri)
    assert info is not None and info.request_id == rid
    clock.advance(1.0)
    assert not agent.should_checkpoint()  # served: the same request does not trigger again
    rid2 = control.request_checkpoint(uri)
    clock.advance(1.0)
    assert agent.should_checkpoint() and rid2 != rid


def test_a_request_for_another_epoch_is_ignored(make_agent, uri, clock):
    agent = make_agent(epoch=2)
    agent.restore()
    control.request_checkpoint(uri, epoch=1)
    clock.advance(5.0)
    assert not agent.should_checkpoint()


def test_the_successor_does_not_answer_the_request_its_predecessor_served(make_agent, uri, clock):
    old = make_agent(epoch=1)
    old.restore()
    control.request_checkpoint(uri)
    clock.advance(1.0)
    assert old.should_checkpoint()
    old.checkpoint(10, {})
    new = make_agent(epoch=2)
    new.restore()
    clock.advance(1.0)
    assert not new.should_checkpoint()


def test_request_polling_is_throttled_by_the_clock(make_agent, uri, clock):
    agent = make_agent(poll_interval=2.0)
    agent.restore()
    agent.should_checkpoint()
    control.request_checkpoint(uri)
    clock.advance(1.0)
    assert not agent.should_checkpoint()
    clock.advance(1.0)
    assert agent.should_checkpoint()


# -- signals -------------------------------------------------------------------------------------


def test_sigusr1_requests_a_checkpoint_and_sigterm_a_checkpoint_then_a_stop(make_agent):
    agent = make_agent()
    assert agent.install_signal_handlers()
    try:
        agent.restore()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert agent.should_checkpoint() and not agent.should_stop()
        agent.checkpoint(1, {})
        assert not agent.should_checkpoint()
        os.kill(os.getpid(), signal.SIGTERM)
        assert agent.should_checkpoint() and not agent.should_stop()
        agent.checkpoint(2, {})
        assert agent.should_stop()
    finally:
        agent.close()
    assert signal.getsignal(signal.SIGTERM) is not agent._on_stop_signal


# -- notices and deadlines -----------------------------------------------------------------------


@pytest.mark.parametrize(("cloud", "window"), sorted(NOTICE_SECONDS.items()))
def test_the_checkpoint_must_finish_five_seconds_before_the_deadline(make_agent, clock, cloud, window):
    agent = make_agent(notice_sources=[FixedSource(clock() + 3.0, window)])
    agent.restore()
    assert agent.time_left() is None and not agent.should_checkpoint()
    clock.advance(3.0)
    assert agent.should_checkpoint()  # eager: at once
    assert agent.deadline == pytest.approx(clock() + window)
    assert agent.time_left() == pytest.approx(window - CHECKPOINT_MARGIN_SECONDS)
    clock.advance(10.0)
    assert agent.time_left() == pytest.approx(window - CHECKPOINT_MARGIN_SECONDS - 10.0)
    clock.advance(window)
    assert agent.time_left() < 0  # late: still asked to checkpoint
    assert agent.should_checkpoint() and not agent.should_stop()
    agent.checkpoint(9, {})
    assert agent.should_stop() and not agent.should_checkpoint()


def test_a_gcp_or_azure_notice_leaves_25_seconds_to_checkpoint(make_agent, clock):
    agent = make_agent(notice_sources=[FixedSource(clock(), NOTICE_SECONDS["gcp"])])
    agent.restore()
    agent.should_checkpoint()
    assert agent.time_left() == pytest.approx(25.0)


def test_the_lazy_policy_trains_on_until_the_time_left_reaches_the_budget(make_agent, uri, clock):
    # AWS: 120 s notice, finish by 115 s. Steps take 1 s, a checkpoint takes 6 s, the minimum budget is 10 s.
    class SlowStorage(LocalStorage):
        def write_atomic(self, name: str, data: bytes, *, temp_tag: str = "") -> None:
            if name.startswith("checkpoints/") and name.endswith(".ckpt"):  # the payload, not its small manifest
                clock.advance(6.0)
            super().write_atomic(name, data, temp_tag=temp_tag)

    source = FixedSource(float("inf"), 120.0)
    agent = make_agent(notice_policy="lazy", lazy_min_budget=10.0, storage=SlowStorage(uri), notice_sources=[source])
    agent.restore()
    agent.checkpoint(0, {})
    for step in range(1, 5):
        clock.advance(1.0)
        agent.report(step)
    assert agent.checkpoint_budget() == pytest.approx(max(2 * 6.0, 10.0) + 2 * 1.0)
    source.at = clock()
    assert not agent.should_checkpoint()  # 115 s left: keep training
    assert agent.time_left() == pytest.approx(115.0)
    clock.advance(115.0 - 14.0 - 0.5)
    assert not agent.should_checkpoint()
    clock.advance(1.0)
    assert agent.should_checkpoint()  # 13.5 s left <= 14 s budget


def test_a_notice_file_with_an_iso_deadline_is_read(tmp_path, make_agent, clock):
    path = tmp_path / "notice.json"
    agent = make_agent(notice_sources=[FileNoticeSource(path)])
    agent.restore()
    assert not agent.should_checkpoint()
    path.write_text(json.dumps({"deadline": "2023-11-14T22:14:00Z", "source": "local"}))
    assert agent.should_checkpoint()
    assert agent.deadline == parse_time("2023-11-14T22:14:00+00:00")
    assert agent.notice is not None and agent.notice.source == "local"


def test_an_unreadable_notice_file_is_ignored(tmp_path):
    path = tmp_path / "notice.json"
    path.write_text("{not json")
    assert FileNoticeSource(path).poll(T0) is None


def test_a_notice_is_logged_in_the_progress_once(make_agent, uri, clock):
    agent = make_agent(notice_sources=[FixedSource(clock(), 30.0)])
    agent.restore()
    for _ in range(3):
        agent.should_checkpoint()
        clock.advance(1.0)
    assert [r["event"] for r in control.records(uri)].count("notice") == 1


def test_an_unreachable_source_is_polled_with_backoff(make_agent, clock):
    calls: list[float] = []

    class Down:
        name = "down"
        interval = 1.0

        def poll(self, now: float) -> Notice | None:
            calls.append(now)
            raise OSError("connection refused")

    agent = make_agent(notice_sources=[Down()])
    agent.restore()
    for _ in range(10):
        agent.should_checkpoint()
        clock.advance(1.0)
    assert len(calls) <= 4  # 1 s, then backing off 2, 4, 8 s ...


# -- the clouds' metadata (fake HTTP, no network) ------------------------------------------------


class FakeMetadata:
    def __init__(self, routes: dict[tuple[str, str], tuple[int, bytes]]) -> None:
        self.routes = routes
        self.seen: list[tuple[str, str, dict[str, str]]] = []

    def __call__(self, method: str, url: str, headers, timeout: float) -> tuple[int, bytes]:
        self.seen.append((method, url, dict(headers)))
        return self.routes.get((method, url), (404, b""))


def test_aws_instance_action_gives_the_deadline_through_imdsv2():
    base = "http://169.254.169.254"
    fake = FakeMetadata(
        {
            ("PUT", f"{base}/latest/api/token"): (200, b"TOKEN"),
            ("GET", f"{base}/latest/meta-data/spot/instance-action"): (
                200,
                b'{"action": "terminate", "time": "2023-11-14T22:15:20Z"}',
            ),
        }
    )
    src = AwsNoticeSource(fake)
    notice = src.poll(parse_time("2023-11-14T22:13:20Z"))
    assert notice is not None and notice.detail == "terminate"
    assert notice.deadline - notice.noticed_at == pytest.approx(120.0)
    assert fake.seen[1][2] == {"X-aws-ec2-metadata-token": "TOKEN"}


def test_aws_without_an_interruption_is_no_notice():
    base = "http://169.254.169.254"
    fake = FakeMetadata({("PUT", f"{base}/latest/api/token"): (200, b"T")})
    assert AwsNoticeSource(fake).poll(T0) is None


def test_gcp_preempted_true_gives_30_seconds_from_the_first_sighting():
    url = "http://metadata.google.internal/computeMetadata/v1/instance/preempted"
    fake = FakeMetadata({("GET", url): (200, b"FALSE")})
    src = GcpNoticeSource(fake)
    assert src.poll(T0) is None
    fake.routes[("GET", url)] = (200, b"TRUE")
    first = src.poll(T0 + 1)
    later = src.poll(T0 + 5)
    assert first is not None and later is not None
    assert first.deadline == later.deadline == T0 + 1 + 30.0
    assert fake.seen[0][2] == {"Metadata-Flavor": "Google"}


def test_azure_preempt_event_uses_its_not_before_time():
    url = "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"
    doc = {
        "DocumentIncarnation": 2,
        "Events": [
            {"EventId": "A", "EventType": "Freeze", "NotBefore": "Tue, 14 Nov 2023 22:13:25 GMT"},
            {"EventId": "B", "EventType": "Preempt", "NotBefore": "Tue, 14 Nov 2023 22:13:50 GMT"},
        ],
    }
    fake = FakeMetadata({("GET", url): (200, json.dumps(doc).encode())})
    now = parse_time("2023-11-14T22:13:20Z")
    notice = AzureNoticeSource(fake).poll(now)
    assert notice is not None and notice.deadline - now == pytest.approx(30.0)
    assert "Preempt" in notice.detail and fake.seen[0][2] == {"Metadata": "true"}


def test_azure_preempt_without_not_before_means_30_seconds():
    url = "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"
    doc = {"Events": [{"EventId": "B", "EventType": "Preempt", "NotBefore": ""}]}
    notice = AzureNoticeSource(FakeMetadata({("GET", url): (200, json.dumps(doc).encode())})).poll(T0)
    assert notice is not None and notice.deadline == T0 + 30.0


def test_notice_sources_come_from_the_environment(tmp_path: Path):
    srcs = sources_from_env(
        {"COSTOPT_NOTICE_FILE": str(tmp_path / "n.json"), "COSTOPT_NOTICE_SOURCE": "aws, gcp,azure,file:/x,none"}
    )
    assert [s.name for s in srcs] == ["file", "aws", "gcp", "azure", "file"]
    assert sources_from_env({}) == []

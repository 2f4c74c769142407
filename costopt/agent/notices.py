"""Preemption notices: where they come from and how much time they leave.

Each cloud warns a spot instance before taking it back: AWS two minutes ahead (the instance metadata
``spot/instance-action`` document, with the time), GCP and Azure 30 seconds ahead (GCP's metadata
``instance/preempted`` turns ``TRUE``; Azure's Scheduled Events list a ``Preempt`` event with its
``NotBefore`` time). On this machine the local provider writes a notice file (and sends SIGUSR1).

A :class:`Notice` holds the *deadline* (when the instance is taken). The agent wants the checkpoint
finished :data:`CHECKPOINT_MARGIN_SECONDS` before it, i.e. within 25 s of a 30 s notice.

Every source is polled with the agent's clock (``poll(now)``), so deadline arithmetic is tested with
an injected clock; the metadata sources take an injected ``fetch`` (tests never touch the network).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("costopt.agent")

Clock = Callable[[], float]
"""Wall-clock seconds since the Unix epoch (``time.time``); injected in tests."""

NOTICE_SECONDS: dict[str, float] = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
"""How long before the instance is taken each cloud warns."""

CHECKPOINT_MARGIN_SECONDS = 5.0
"""Finish the checkpoint this long before the deadline (25 s into a 30 s notice)."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A preemption notice: the instance will be taken at ``deadline`` (Unix seconds)."""

    source: str
    noticed_at: float
    deadline: float
    detail: str = ""

    def remaining(self, now: float) -> float:
        """Seconds until the instance is taken (negative once past)."""
        return self.deadline - now

    def checkpoint_by(self, margin: float = CHECKPOINT_MARGIN_SECONDS) -> float:
        """When the checkpoint must be finished: ``margin`` seconds before the deadline."""
        return self.deadline - margin


class NoticeSource(Protocol):
    """Something the agent polls for a preemption notice."""

    name: str
    interval: float
    """Seconds between two polls."""

    def poll(self, now: float) -> Notice | None:
        """The notice if one is posted, else None. May raise ``OSError`` (the agent backs off)."""
        ...


def parse_time(value: object) -> float:
    """Unix seconds from a number, an ISO 8601 time (``2017-09-18T08:22:00Z``) or an RFC 1123 date."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"not a time: {value!r}")
    text = value.strip()
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        dt = parsedate_to_datetime(text)  # "Mon, 19 Sep 2016 18:29:47 GMT" (raises ValueError)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


class FileNoticeSource:
    """A JSON notice file (``{"deadline": <unix seconds or ISO time>, "noticed_at": ..., "source": ...}``),
    written by the local provider (``COSTOPT_NOTICE_FILE``) or by anything that can write a file."""

    name = "file"

    def __init__(self, path: str | Path, *, interval: float = 0.0) -> None:
        self.path = Path(path)
        self.interval = interval

    def poll(self, now: float) -> Notice | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
            deadline = parse_time(doc["deadline"])
            noticed = parse_time(doc["noticed_at"]) if doc.get("noticed_at") is not None else now
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("ignoring unreadable notice file %s: %s", self.path, exc)
            return None
        return Notice(str(doc.get("source", "file")), noticed, deadline, str(doc.get("detail", "")))


Fetch = Callable[[str, str, Mapping[str, str], float], tuple[int, bytes]]
"""``fetch(method, url, headers, timeout) -> (status, body)``; raises ``OSError`` when unreachable."""


def urllib_fetch(method: str, url: str, headers: Mapping[str, str], timeout: float) -> tuple[int, bytes]:
    """The default :data:`Fetch`: one HTTP request with the standard library, no proxy (link-local)."""
    req = urllib.request.Request(url, method=method, headers=dict(headers))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read() or b"")


class _MetadataSource:
    """A notice source read from an instance metadata service with ``fetch`` (one per cloud)."""

    name: str
    BASE_URL: str
    INTERVAL: float

    def __init__(
        self,
        fetch: Fetch = urllib_fetch,
        *,
        base_url: str | None = None,
        interval: float | None = None,
        timeout: float = 0.5,
    ) -> None:
        self.fetch = fetch
        self.base_url = (base_url or self.BASE_URL).rstrip("/")
        self.interval = self.INTERVAL if interval is None else interval
        self.timeout = timeout


class AwsNoticeSource(_MetadataSource):
    """EC2 spot interruption notice from the instance metadata service (IMDSv2 with a session token,
    falling back to IMDSv1): ``GET /latest/meta-data/spot/instance-action`` is 404 until AWS schedules
    the interruption, then ``{"action": "terminate"|"stop"|"hibernate", "time": "...Z"}``."""

    name = "aws"
    BASE_URL = "http://169.254.169.254"
    INTERVAL = 5.0
    TOKEN_TTL = 21600

    _token: str | None = None
    _token_expires = 0.0

    def _headers(self, now: float) -> dict[str, str]:
        if self._token is None or now >= self._token_expires:
            status, body = self.fetch(
                "PUT",
                f"{self.base_url}/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL)},
                self.timeout,
            )
            if status == 200 and body:
                self._token = body.decode().strip()
                self._token_expires = now + self.TOKEN_TTL - 60
            else:
                self._token = None
        return {"X-aws-ec2-metadata-token": self._token} if self._token else {}

    def poll(self, now: float) -> Notice | None:
        headers = self._headers(now)
        status, body = self.fetch(
            "GET", f"{self.base_url}/latest/meta-data/spot/instance-action", headers, self.timeout
        )
        if status == 401:
            self._token = None  # expired: fetch a new one next time
            return None
        if status != 200:
            return None
        try:
            doc = json.loads(body)
            deadline = parse_time(doc["time"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("unreadable EC2 instance-action document %r: %s", body[:200], exc)
            deadline = now + NOTICE_SECONDS["aws"]
            doc = {}
        return Notice("aws", now, deadline, str(doc.get("action", "")))


class GcpNoticeSource(_MetadataSource):
    """GCE preemption: metadata ``instance/preempted`` reads ``TRUE`` once the spot VM is being
    preempted; the VM is stopped 30 s later, so the deadline is 30 s after the first sighting."""

    name = "gcp"
    BASE_URL = "http://metadata.google.internal"
    INTERVAL = 1.0

    _first_seen: float | None = None

    def poll(self, now: float) -> Notice | None:
        status, body = self.fetch(
            "GET",
            f"{self.base_url}/computeMetadata/v1/instance/preempted",
            {"Metadata-Flavor": "Google"},
            self.timeout,
        )
        if status != 200 or body.strip().upper() != b"TRUE":
            return None
        if self._first_seen is None:
            self._first_seen = now
        return Notice("gcp", self._first_seen, self._first_seen + NOTICE_SECONDS["gcp"], "preempted")


class AzureNoticeSource(_MetadataSource):
    """Azure Scheduled Events: a ``Preempt`` (spot eviction) or ``Terminate`` event for this VM with its
    ``NotBefore`` time (RFC 1123); an empty ``NotBefore`` means now + 30 s."""

    name = "azure"
    BASE_URL = "http://169.254.169.254"
    INTERVAL = 1.0
    EVENT_TYPES = frozenset({"Preempt", "Terminate"})

    def __init__(self, fetch: Fetch = urllib_fetch, **options: Any) -> None:
        super().__init__(fetch, **options)
        self._first_seen: dict[str, float] = {}

    def poll(self, now: float) -> Notice | None:
        status, body = self.fetch(
            "GET",
            f"{self.base_url}/metadata/scheduledevents?api-version=2020-07-01",
            {"Metadata": "true"},
            self.timeout,
        )
        if status != 200:
            return None
        try:
            events = json.loads(body).get("Events") or []
        except (AttributeError, ValueError):
            return None
        best: Notice | None = None
        for ev in events:
            if not isinstance(ev, dict) or ev.get("EventType") not in self.EVENT_TYPES:
                continue
            event_id = str(ev.get("EventId", ""))
            seen = self._first_seen.setdefault(event_id, now)
            try:
                deadline = parse_time(ev.get("NotBefore"))
            except (ValueError, TypeError):
                deadline = seen + NOTICE_SECONDS["azure"]
            notice = Notice("azure", seen, deadline, f"{ev.get('EventType')} {event_id}".strip())
            if best is None or notice.deadline < best.deadline:
                best = notice
        return best


def sources_from_env(environ: Mapping[str, str]) -> list[NoticeSource]:
    """Notice sources named by the environment.

    ``COSTOPT_NOTICE_FILE``: a notice file (set by the local provider). ``COSTOPT_NOTICE_SOURCE``: a
    comma-separated list of ``aws``, ``gcp``, ``azure``, ``file:<path>`` or ``none`` (set by each cloud
    provider in the job's environment). Nothing set: no source (signals and requests still work).
    """
    sources: list[NoticeSource] = []
    path = environ.get("COSTOPT_NOTICE_FILE", "").strip()
    if path:
        sources.append(FileNoticeSource(path))
    for item in environ.get("COSTOPT_NOTICE_SOURCE", "").split(","):
        item = item.strip()
        if not item or item == "none":
            continue
        if item == "aws":
            sources.append(AwsNoticeSource())
        elif item == "gcp":
            sources.append(GcpNoticeSource())
        elif item == "azure":
            sources.append(AzureNoticeSource())
        elif item.startswith("file:"):
            sources.append(FileNoticeSource(item[5:]))
        else:
            log.warning("unknown notice source %r in COSTOPT_NOTICE_SOURCE (known: aws, gcp, azure, file:PATH)", item)
    return sources

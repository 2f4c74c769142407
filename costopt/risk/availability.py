"""Spot/preemptible lifetimes from availability logs, and preemption hazards estimated from them.

The logs (``logs/{aws,gcp}/availability/*.out`` of the dynamic-pricing paper's repository) are
timestamped lines written while instances were launched and then checked about every 15 minutes:

    [2020-03-15T10:07:33.000Z] Created instance i-0ad1... with 1 GPU(s) of type v100 in zone us-east-1b
    [2020-03-15T10:21:22.000Z] Instance i-0ad1... running in zone us-east-1b
    [2020-03-15T15:11:45.000Z] Instance i-0ae7... not running in zone us-east-1c
    [2020-03-15T10:11:21.000Z] Instance with 8 GPU(s) of type k80 creation failed
    [2020-03-01T10:12:22.000Z] Instance instance1 creation failed

An instance's *lifetime* runs from its creation to the check that found it gone (an event) or to
its last check still running (censored). GCP names are reused (``instance0`` again and again), so a
lifetime belongs to the latest ``Created`` line of that name. GCP preemptible VMs are stopped at
24 hours whatever happens: a lifetime that reaches 23.5 h is censored there, not a preemption.

The hazard (preemptions per instance-hour, a constant-rate model) of a group is estimated as
``(prior_events + events) / (prior_hours + exposure_hours)``: a Gamma prior worth one event at the
documented default rate, so groups the logs barely saw stay near the default.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from costopt.domain import Cloud, normalize_accelerator, parse_utc
from costopt.errors import MalformedInput

_LINE = re.compile(r"^\[(?P<ts>[^\]]+)\]\s+(?P<msg>.*)$")
_CREATED = re.compile(
    r"^Created instance (?P<id>\S+) with (?P<n>\d+) GPU\(s\) of type (?P<gpu>\S+) in zone (?P<zone>\S+)$"
)
_RUNNING = re.compile(r"^Instance (?P<id>\S+) running in zone (?P<zone>\S+)$")
_GONE = re.compile(r"^Instance (?P<id>\S+) not running in zone (?P<zone>\S+)$")
_FAILED_NAMED = re.compile(r"^Instance (?P<id>\S+) creation failed$")
_FAILED_SHAPE = re.compile(r"^Instance with (?P<n>\d+) GPU\(s\) of type (?P<gpu>\S+) creation failed$")
_DELETED = re.compile(r"^Successfully deleted instance (?P<id>\S+)$")

GCP_MAX_LIFETIME_H = 24.0
GCP_CENSOR_AT_H = 23.5


@dataclass(frozen=True, slots=True)
class Lifetime:
    """One launched instance. ``hours`` is exposure; ``preempted`` False means censored."""

    cloud: Cloud
    zone: str
    accelerator: str
    gpu_count: int
    started: datetime
    hours: float
    preempted: bool


@dataclass(frozen=True, slots=True)
class LaunchStats:
    """Launch attempts and capacity failures per (cloud, accelerator, gpu_count) where known."""

    cloud: Cloud
    accelerator: str
    gpu_count: int
    attempts: int
    failures: int


@dataclass(frozen=True, slots=True)
class Hazard:
    """Estimated preemption rate of a group, per instance-hour, with the evidence behind it."""

    cloud: Cloud
    zone: str
    accelerator: str
    gpu_count: int
    instances: int
    events: int
    exposure_hours: float
    per_hour: float
    prior_per_hour: float

    @property
    def mean_lifetime_hours(self) -> float:
        return 1.0 / self.per_hour if self.per_hour > 0 else float("inf")


def _cloud_of_zone(zone: str) -> Cloud:
    # AWS zones end in a letter after a digit (us-east-1b); GCP zones end in "-<letter>" (us-west1-b).
    return Cloud.GCP if re.search(r"\d-[a-z]$", zone) else Cloud.AWS


def parse_availability_log(lines: Iterable[str], *, where: str = "log") -> tuple[list[Lifetime], list[LaunchStats]]:
    """Lifetimes and launch statistics from one availability log. Raises MalformedInput on a line
    that is not ``[time] message``; unknown messages are ignored."""
    open_: dict[str, tuple[Cloud, str, str, int, datetime, datetime]] = {}
    lifetimes: list[Lifetime] = []
    attempts: dict[tuple[Cloud, str, int], list[int]] = {}
    last_shape: dict[str, tuple[Cloud, str, int]] = {}
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        m = _LINE.match(line)
        if m is None:
            raise MalformedInput(f"{where} line {lineno}: not '[time] message': {line[:80]!r}")
        ts = parse_utc(m["ts"])
        msg = m["msg"]
        if c := _CREATED.match(msg):
            cloud = _cloud_of_zone(c["zone"])
            acc = normalize_accelerator(c["gpu"])
            shape = (cloud, acc, int(c["n"]))
            attempts.setdefault(shape, [0, 0])[0] += 1
            last_shape[c["id"]] = shape
            open_[c["id"]] = (cloud, c["zone"], acc, int(c["n"]), ts, ts)
        elif r := _RUNNING.match(msg):
            if r["id"] in open_:
                cloud, zone, acc, n, start, _ = open_[r["id"]]
                open_[r["id"]] = (cloud, zone, acc, n, start, ts)
        elif g := _GONE.match(msg):
            if g["id"] in open_:
                cloud, zone, acc, n, start, _ = open_.pop(g["id"])
                hours = (ts - start).total_seconds() / 3600
                if cloud is Cloud.GCP and hours >= GCP_CENSOR_AT_H:
                    lifetimes.append(Lifetime(cloud, zone, acc, n, start, GCP_CENSOR_AT_H, False))
                else:
                    lifetimes.append(Lifetime(cloud, zone, acc, n, start, hours, True))
        elif s := _FAILED_SHAPE.match(msg):
            # AWS names no instance on failure, only the shape; the log is us-east-1 only.
            shape = (Cloud.AWS, normalize_accelerator(s["gpu"]), int(s["n"]))
            counts = attempts.setdefault(shape, [0, 0])
            counts[0] += 1
            counts[1] += 1
        elif f := _FAILED_NAMED.match(msg):
            shape_known = last_shape.get(f["id"])
            if shape_known is not None:
                counts = attempts.setdefault(shape_known, [0, 0])
                counts[0] += 1
                counts[1] += 1
        elif _DELETED.match(msg):
            continue
    for cloud, zone, acc, n, start, last_seen in open_.values():
        lifetimes.append(Lifetime(cloud, zone, acc, n, start, (last_seen - start).total_seconds() / 3600, False))
    stats = [LaunchStats(c, a, n, v[0], v[1]) for (c, a, n), v in sorted(attempts.items())]
    return lifetimes, stats


def load_availability_logs(paths: Iterable[Path]) -> tuple[list[Lifetime], list[LaunchStats]]:
    """Parse several logs (e.g. ``logs/*/availability/*.out``)."""
    lifetimes: list[Lifetime] = []
    stats: dict[tuple[Cloud, str, int], list[int]] = {}
    for path in sorted(paths):
        with path.open(encoding="utf-8") as fh:
            lt, st = parse_availability_log(fh, where=str(path))
        lifetimes.extend(lt)
        for s in st:
            acc = stats.setdefault((s.cloud, s.accelerator, s.gpu_count), [0, 0])
            acc[0] += s.attempts
            acc[1] += s.failures
    return lifetimes, [LaunchStats(c, a, n, v[0], v[1]) for (c, a, n), v in sorted(stats.items())]


def estimate_hazards(lifetimes: Iterable[Lifetime], prior_per_hour: dict[Cloud, float]) -> list[Hazard]:
    """Per (cloud, zone, accelerator, gpu_count) hazard with a one-event Gamma prior at the cloud's
    default rate. Groups are sorted by cloud, zone, accelerator, GPU count."""
    groups: dict[tuple[Cloud, str, str, int], list[Lifetime]] = {}
    for lt in lifetimes:
        groups.setdefault((lt.cloud, lt.zone, lt.accelerator, lt.gpu_count), []).append(lt)
    out: list[Hazard] = []
    for (cloud, zone, acc, n), items in sorted(groups.items(), key=lambda kv: (kv[0][0].value, *kv[0][1:])):
        prior = prior_per_hour[cloud]
        events = sum(1 for i in items if i.preempted)
        hours = sum(i.hours for i in items)
        rate = (1.0 + events) / (1.0 / prior + hours)
        out.append(Hazard(cloud, zone, acc, n, len(items), events, hours, rate, prior))
    return out

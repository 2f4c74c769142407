"""A month to look at, without a cloud: ``costopt demo`` fills the configured database with several teams'
jobs, run by the service's own code on the simulated cloud over the real 2020 prices.

:func:`fill_demo` starts the real app (:func:`api.app.create_app`, seeding an empty store from the data
folder as ``make run`` does) with the simulated cloud as its provider, its clock at ``start`` and stopped
(time moves only when the demo moves it: an accelerated clock, as fast as the machine goes). Then, on
that clock:

- each team (created through the team repository, with a member key) submits its jobs over REST
  (``POST /v1/jobs``: the route's planner quote and insert), at seeded times through the period;
- the service's own loops act as the scheduler runs them (``api.scheduler``): the job engine's tick, the
  interruption watcher (recovering preempted copies on each job's placements), the reconciler and the
  rebalancer (:func:`api.rebalancing.build_rebalancer`, with the settings' rule) every
  ``rebalance_every``; the migrators bill every copy to the ledger at the store's prices;
- between two passes the simulated cloud runs to the next thing the service would react to
  (:meth:`providers.sim.SimCloud.run_until`: a preemption drawn from the availability logs' hazards, a
  finished workload), at most ``step`` ahead, the next submission or the next rebalancing pass.

It ends when every job has ended, or at ``start + days + grace`` (a job still running then stays so).
Nothing here is a second engine: the loop is the scheduler's sequence of calls with the clock moved by
hand, as the end-to-end service test does. Money is Decimal USD; times tz-aware UTC.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from costopt.errors import CostoptError
from costopt.settings import Settings

__all__ = [
    "DEMO_JOB_TYPES",
    "DEMO_START",
    "DatabaseNotEmpty",
    "DemoError",
    "DemoJob",
    "DemoResult",
    "demo_jobs",
    "fill_demo",
]

DEMO_START = datetime(2020, 1, 1, tzinfo=UTC)
"""The demo's default period starts here: inside the seeded AWS spot history (Dec 2019 - Mar 2020), with
room for ``--days 30`` and the last jobs' tails."""

DATA_END = datetime(2020, 3, 23, tzinfo=UTC)
"""The seeded AWS spot history ends on 2020-03-23: a demo period must end (with its grace) by then."""

DEMO_JOB_TYPES: tuple[str, ...] = (
    "ResNet-50 (batch size 128)",
    "ResNet-18 (batch size 64)",
    "Transformer (batch size 64)",
)
"""Job types of the throughput catalog the demo's teams train (one per team, in turn)."""

_TEAM_NAMES = ("vision", "language", "speech", "recsys", "research", "platform", "robotics", "search")


class DemoError(CostoptError, ValueError):
    """The demo cannot run as asked (a database with jobs already, a period outside the data, bad counts)."""


class DatabaseNotEmpty(DemoError):
    """The database has jobs already: the demo fills an empty one only."""


@dataclass(frozen=True, slots=True)
class DemoJob:
    """One job a team submits at ``at``: the ``POST /v1/jobs`` body."""

    team: str
    at: datetime
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DemoResult:
    """What the demo left: teams (name -> id), jobs submitted and their end states, the simulated period,
    the rebalancing passes run, and the wall seconds it took."""

    teams: dict[str, str]
    submitted: int
    states: dict[str, int]
    started_at: datetime
    ended_at: datetime
    rebalances: int
    wall_seconds: float
    job_ids: tuple[str, ...] = field(default=())

    @property
    def finished(self) -> bool:
        return (
            self.states.get("succeeded", 0) + self.states.get("failed", 0) + self.states.get("cancelled", 0)
            == self.submitted
            and self.submitted > 0
        )


def demo_jobs(
    teams: int, days: int, seed: int, start: datetime = DEMO_START, *, jobs_per_day: float = 1.0
) -> list[DemoJob]:
    """The seeded job mix: each team submits about ``jobs_per_day`` jobs a day (at least one), at uniform
    times over the first ``days`` days, each 2 to 30 hours of training on one V100 (steps from the job
    type's catalog throughput are not needed: the planner quotes whatever is asked); all on AWS (the only
    cloud whose real spot history covers the period), two thirds spot only, a third any market."""
    if teams < 1 or teams > len(_TEAM_NAMES):
        raise DemoError(f"--teams must be 1 to {len(_TEAM_NAMES)}, got {teams}")
    if days < 1:
        raise DemoError(f"--days must be >= 1, got {days}")
    if jobs_per_day <= 0:
        raise DemoError(f"jobs per team per day must be > 0, got {jobs_per_day}")
    rng = random.Random(seed)
    out: list[DemoJob] = []
    for t in range(teams):
        name = f"team-{_TEAM_NAMES[t]}"
        job_type = DEMO_JOB_TYPES[t % len(DEMO_JOB_TYPES)]
        n = max(1, round(days * jobs_per_day))
        for i in range(n):
            at = start + timedelta(seconds=rng.uniform(0, days * 86400 * 0.9))
            hours = rng.uniform(2, 30)
            constraints: dict[str, Any] = (
                {"clouds": ["aws"], "markets": ["spot"]} if rng.random() < 2 / 3 else {"clouds": ["aws"]}
            )
            body = {
                "name": f"{_TEAM_NAMES[t]}-{i + 1:03d}",
                "job_type": job_type,
                # steps at ~1 step/s/GPU-ish scale: the simulated agent runs at the catalog's throughput, so
                # the job's length in hours follows from it; this count is what the team asks
                "steps": int(hours * 3600 * 2.5),
                "command": ["python", "train.py"],
                "checkpoint_gb": round(rng.uniform(1, 20), 1),
                "constraints": constraints,
            }
            out.append(DemoJob(team=name, at=at, body=body))
    out.sort(key=lambda j: j.at)
    return out


def fill_demo(
    settings: Settings,
    *,
    teams: int = 3,
    days: int = 30,
    seed: int = 0,
    start: datetime = DEMO_START,
    jobs_per_day: float = 1.0,
    step: timedelta = timedelta(hours=2),
    rebalance_every: timedelta = timedelta(hours=6),
    grace: timedelta = timedelta(days=5),
    progress: Callable[[datetime, int, int], None] | None = None,
) -> DemoResult:
    """Fill ``settings``' database with the demo (module docstring). Refuses a database that has jobs
    already (:class:`DemoError`). ``progress(now, ended, submitted)`` is called after each pass."""
    import warnings

    with warnings.catch_warnings():  # starlette's note about httpx, for test suites: not the demo's user's
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
        from fastapi.testclient import TestClient
    from sqlalchemy import func, select

    from api.app import create_app
    from api.rebalancing import build_rebalancer
    from costopt.db.jobs_schema import jobs as jobs_table
    from costopt.jobs.teams import Role
    from providers.sim import SimCloud

    start = start.astimezone(UTC) if start.tzinfo else start.replace(tzinfo=UTC)
    until = start + timedelta(days=days) + grace
    if until > DATA_END:
        raise DemoError(
            f"the period {start.date()} + {days} days (+{grace.days} days for the last jobs) ends after the "
            f"seeded AWS spot history ({DATA_END.date()}): start earlier or ask fewer days"
        )
    plan = demo_jobs(teams, days, seed, start, jobs_per_day=jobs_per_day)
    demo_settings = settings.model_copy(
        update={
            "provider": "sim",
            "providers": [],
            "sim_start": start,
            "collectors_enabled": False,
            "migration_jobs_enabled": False,  # the demo runs the engine, watcher, reconciler and rebalancer
            "engine_workers": 0,
        }
    )
    wall0 = time.monotonic()
    app = create_app(demo_settings)
    with TestClient(app) as client:
        if app.state.sim_clock is not None:
            app.state.sim_clock.stop()  # time moves only when the demo moves it
        service = app.state.job_service
        with service.repo.reading() as conn:
            existing = conn.execute(select(func.count()).select_from(jobs_table)).scalar_one()
        if existing:
            raise DatabaseNotEmpty(
                f"the database ({settings.database_url.split('@')[-1]}) has {existing} jobs already: the demo "
                "fills an empty database (point COSTOPT_DATABASE_URL at a new one)"
            )
        sim = service.providers["sim"]
        if not isinstance(sim, SimCloud):  # pragma: no cover - the settings above make it so
            raise DemoError("the demo runs on the simulated cloud")
        team_ids: dict[str, str] = {}
        keys: dict[str, dict[str, str]] = {}
        for name in dict.fromkeys(j.team for j in plan):
            team = service.teams.create_team(name)
            team_ids[name] = team.id
            keys[name] = {"Authorization": f"Bearer {service.teams.create_key(team.id, Role.MEMBER).secret}"}
        rebalancer = build_rebalancer(service, demo_settings)
        pending = list(plan)
        ids: list[str] = []
        next_rebalance = start + rebalance_every
        passes = 0
        while True:
            now = sim.now()
            while pending and pending[0].at <= now:
                job = pending.pop(0)
                r = client.post("/v1/jobs", json=job.body, headers=keys[job.team])
                if r.status_code not in (200, 201):
                    raise DemoError(f"submitting {job.body['name']} failed ({r.status_code}): {r.text}")
                ids.append(r.json()["id"])
            service.engine.tick()
            service.migration.watch()
            if sim.now() >= next_rebalance:
                service.migration.reconcile()
                rebalancer.run_once(dry_run=False)
                passes += 1
                while next_rebalance <= sim.now():
                    next_rebalance += rebalance_every
            counts = service.repo.count_by_state()
            ended = sum(n for s, n in counts.items() if s.terminal)
            if progress is not None:
                progress(sim.now(), ended, len(ids))
            if not pending and ended == len(ids):
                break
            now = sim.now()
            if now >= until:
                break
            stop = min(now + step, next_rebalance, until)
            if pending:
                stop = min(stop, max(pending[0].at, now))
            if stop > now:
                sim.run_until(stop)
        counts = service.repo.count_by_state()
        ended_at = sim.now()
    return DemoResult(
        teams=team_ids,
        submitted=len(ids),
        states={s.value: n for s, n in counts.items() if n},
        started_at=start,
        ended_at=ended_at,
        rebalances=passes,
        wall_seconds=time.monotonic() - wall0,
        job_ids=tuple(ids),
    )

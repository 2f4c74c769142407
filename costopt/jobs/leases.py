"""Scheduler leases: every scheduled job runs once per tick across service replicas.

Several service processes (replicas) may share one PostgreSQL database, each with its own in-memory
APScheduler; their jobs fire at the same aligned times (a *tick*: the trigger's scheduled fire time,
the same in every replica). One row of ``scheduler_leases`` per job name decides who runs a tick:

- **once per tick**: :meth:`LeaseStore.claim_tick` is one compare-and-set ``UPDATE`` that succeeds only
  when the row's ``last_tick`` is older than the tick (and no live lease is held), and sets
  ``last_tick`` to it. PostgreSQL re-checks the ``WHERE`` of a concurrent update against the committed
  row (the loser updates nothing); SQLite serializes writers. So of the replicas racing for a tick,
  exactly one wins, and a replica that fires late finds the tick taken;
- **no overlap**: the winner holds a short lease (``owner``, ``expires_at`` = now + ``ttl``) that a
  heartbeat thread renews every ``ttl / 3`` while the run lasts, and releases (``expires_at`` NULL)
  when it ends. No replica claims a tick while a live lease is held, so a run longer than its
  interval is never overlapped by another replica (the ticks it overlaps are skipped, as
  ``max_instances=1`` does in one process);
- **hand-over**: a replica killed mid-run stops renewing; its lease expires after at most ``ttl`` and
  the next tick is claimed by another replica. Killed between runs, it holds nothing: the next tick
  goes to whichever replica fires first.

``owner`` stays on the row after a release (who ran last); the lease is *held* only while
``expires_at`` is in the future. Lease times are the machine's wall clock (UTC; replicas are assumed
to keep their clocks within a small fraction of ``ttl`` of each other, e.g. by NTP), never the
simulated service clock. With SQLite, one service process per database file (SQLite has no
replicas); the lease works the same.

:meth:`LeaseStore.acquire` holds a lease without a tick (``costopt rebalance --once`` takes the
service's ``rebalance`` lease that way, so it never runs beside the service's pass).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from costopt.db.jobs_schema import scheduler_leases

__all__ = ["LeaseState", "LeaseStore", "default_owner"]

log = logging.getLogger("costopt.jobs.leases")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def default_owner() -> str:
    """This process's owner name: ``<host>:<pid>:<random>`` (unique even across a pid reused)."""
    return f"{socket.gethostname()[:80]}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class LeaseState:
    """One ``scheduler_leases`` row. ``owner``: who holds it, or held it last; ``expires_at``: until when
    it is held (None: released); ``last_tick``: the newest tick run (None: never); ``runs``: how many
    ticks (and lease-only passes) ran under it."""

    name: str
    owner: str | None
    expires_at: datetime | None
    last_tick: datetime | None
    runs: int
    updated_at: datetime

    def held_at(self, at: datetime) -> bool:
        """True when a live lease is held at ``at``."""
        return self.expires_at is not None and self.expires_at > at

    @classmethod
    def of(cls, row: Any) -> LeaseState:
        return cls(
            name=row.name,
            owner=row.owner,
            expires_at=row.expires_at,
            last_tick=row.last_tick,
            runs=int(row.runs),
            updated_at=row.updated_at,
        )


def _check_ttl(ttl: timedelta) -> None:
    if ttl <= timedelta(0):
        raise ValueError(f"a lease's ttl must be positive, got {ttl}")


class LeaseStore:
    """The leases of one database, as seen by one ``owner`` (default: :func:`default_owner`).
    ``now``: the wall clock (tz-aware UTC; tests pass their own)."""

    def __init__(self, engine: Engine, *, owner: str | None = None, now: Callable[[], datetime] = _utcnow) -> None:
        self.engine = engine
        self.owner = owner or default_owner()
        self.now = now
        self._held: dict[str, tuple[timedelta, float]] = {}  # name -> (ttl, next renewal, monotonic s)
        self._cond = threading.Condition()
        self._beat: threading.Thread | None = None

    # -- writes ----------------------------------------------------------------------------------------

    def claim_tick(self, name: str, tick: datetime, ttl: timedelta) -> bool:
        """Take the run of ``tick`` (tz-aware UTC) of job ``name``: True for exactly one caller across
        processes, and only when no newer or equal tick ran and no live lease is held. The winner holds
        the lease for ``ttl`` (renew it with :meth:`renew`, end it with :meth:`release`)."""
        _check_ttl(ttl)
        if tick.tzinfo is None:
            raise ValueError(f"tick must be tz-aware UTC, got {tick!r}")
        c = scheduler_leases.c
        return self._take(name, ttl, (or_(c.last_tick.is_(None), c.last_tick < tick),), last_tick=tick)

    def acquire(self, name: str, ttl: timedelta) -> bool:
        """Hold the lease of ``name`` for ``ttl`` without a tick (a pass run by hand): True when no live
        lease was held. ``last_tick`` is unchanged, so the scheduled ticks still run at their times."""
        _check_ttl(ttl)
        return self._take(name, ttl, ())

    def renew(self, name: str, ttl: timedelta) -> bool:
        """Extend a lease this owner holds (or held, if it expired and nobody took it since) to now +
        ``ttl``; False when another owner took it, or it was released."""
        _check_ttl(ttl)
        now = self.now()
        c = scheduler_leases.c
        with self.engine.begin() as conn:
            done = conn.execute(
                update(scheduler_leases)
                .where(c.name == name, c.owner == self.owner, c.expires_at.is_not(None))
                .values(expires_at=now + ttl, updated_at=now)
            ).rowcount
        return done == 1

    def release(self, name: str) -> None:
        """End this owner's lease of ``name`` (no-op when it does not hold it)."""
        now = self.now()
        c = scheduler_leases.c
        with self.engine.begin() as conn:
            conn.execute(
                update(scheduler_leases)
                .where(c.name == name, c.owner == self.owner, c.expires_at.is_not(None))
                .values(expires_at=None, updated_at=now)
            )

    @contextmanager
    def hold(
        self, name: str, ttl: timedelta, *, tick: datetime | None = None, wait: timedelta = timedelta(0)
    ) -> Iterator[bool]:
        """Claim ``tick`` of ``name`` (None: :meth:`acquire` without a tick) and yield whether this owner
        won; while the block runs, the store's heartbeat thread (one per store, started on first use)
        renews the lease every ``ttl / 3``; it is released when the block ends (also on an exception).

        ``wait``: while another run holds the lease (e.g. the previous tick's, a little longer than the
        interval), keep trying for up to this long (wall time) instead of giving the tick up; stop at
        once when the tick (or a newer one) is seen taken."""
        won = self.claim_tick(name, tick, ttl) if tick is not None else self.acquire(name, ttl)
        deadline = time.monotonic() + wait.total_seconds()
        poll = max(0.01, min(1.0, wait.total_seconds() / 10))
        while not won and time.monotonic() + poll < deadline:
            state = self.get(name)
            if tick is not None and state is not None and state.last_tick is not None and state.last_tick >= tick:
                break
            time.sleep(poll)
            won = self.claim_tick(name, tick, ttl) if tick is not None else self.acquire(name, ttl)
        if not won:
            yield False
            return
        self._beat_for(name, ttl)
        try:
            yield True
        finally:
            with self._cond:
                self._held.pop(name, None)
            try:
                self.release(name)
            except Exception:
                log.exception("lease %s: release failed (it expires by itself within %s)", name, ttl)

    # -- reads -----------------------------------------------------------------------------------------

    def get(self, name: str) -> LeaseState | None:
        """The lease row of ``name`` (None: never taken)."""
        with self.engine.connect() as conn:
            row = conn.execute(select(scheduler_leases).where(scheduler_leases.c.name == name)).first()
        return None if row is None else LeaseState.of(row)

    def holder(self, name: str) -> LeaseState | None:
        """The row of ``name`` when a live lease is held now (by anyone), else None."""
        state = self.get(name)
        return state if state is not None and state.held_at(self.now()) else None

    def all(self) -> list[LeaseState]:
        """Every lease row, by name."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(scheduler_leases).order_by(scheduler_leases.c.name)).all()
        return [LeaseState.of(r) for r in rows]

    # -- helpers ---------------------------------------------------------------------------------------

    def _take(self, name: str, ttl: timedelta, conds: tuple[Any, ...], **values: Any) -> bool:
        c = scheduler_leases.c
        for attempt in range(2):
            now = self.now()
            query = (
                update(scheduler_leases)
                .where(c.name == name, or_(c.expires_at.is_(None), c.expires_at <= now), *conds)
                .values(owner=self.owner, expires_at=now + ttl, runs=c.runs + 1, updated_at=now, **values)
            )
            with self.engine.begin() as conn:
                if conn.execute(query).rowcount == 1:
                    return True
            if attempt == 0 and not self._ensure_row(name):
                return False
        return False

    def _ensure_row(self, name: str) -> bool:
        """Insert the row of ``name`` when missing; True when it was missing (worth a second try)."""
        with self.engine.connect() as conn:
            if conn.execute(select(scheduler_leases.c.name).where(scheduler_leases.c.name == name)).first():
                return False
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(scheduler_leases).values(name=name, runs=0, updated_at=self.now()))
        except IntegrityError:
            pass  # another replica inserted it first: the compare-and-set decides
        return True

    def _beat_for(self, name: str, ttl: timedelta) -> None:
        """Renew ``name`` every ``ttl / 3`` until it is dropped from ``_held``."""
        with self._cond:
            self._held[name] = (ttl, time.monotonic() + ttl.total_seconds() / 3)
            if self._beat is None:
                self._beat = threading.Thread(target=self._heartbeat, name="lease-heartbeat", daemon=True)
                self._beat.start()
            self._cond.notify()

    def _heartbeat(self) -> None:
        while True:
            with self._cond:
                while not self._held:
                    self._cond.wait()
                now = time.monotonic()
                due = [(name, ttl) for name, (ttl, at) in self._held.items() if at <= now]
                if not due:
                    self._cond.wait(timeout=min(at for _, at in self._held.values()) - now)
                    continue
                for name, ttl in due:
                    self._held[name] = (ttl, now + ttl.total_seconds() / 3)
            for name, ttl in due:
                try:
                    if not self.renew(name, ttl):
                        with self._cond:
                            lost = self._held.pop(name, None) is not None  # else: released meanwhile
                        if lost:
                            log.warning("lease %s: lost (expired and taken over?); the run goes on", name)
                except Exception:
                    log.exception("lease %s: heartbeat failed; retrying", name)

"""The interruption-reaction loop: notices and preemptions of jobs' current copies, acted upon.

:class:`InterruptionWatcher` watches one provider for the jobs the :class:`~.machine.Migrator` runs on
it. One :meth:`InterruptionWatcher.poll` is one pass:

1. read ``provider.interruptions(since)``, where ``since`` is the time the previous pass started minus
   ``overlap`` (a watermark kept in the database, so a restarted watcher re-reads the window it may
   have been killed in instead of missing a preemption); events already seen are skipped, keyed by
   ``(instance, kind, time)``;
2. an event on a job's *current* copy (the instance the job row names):

   - ``notice``: ask the copy to checkpoint now (:func:`costopt.agent.control.request_checkpoint`,
     addressed to its epoch, with an id derived from the notice, so repeating it is a no-op for the
     agent). The copy has until the notice's deadline (AWS 2 min, GCP and Azure 30 s) to finish it;
     the agent also sees the notice itself. A job with a migration in flight is left to it (the
     migration owns the request file and handles a copy that vanishes);
   - ``preempted``: mark the offer unavailable (reason ``preempted``) and recover the job
     (:meth:`Migrator.recover` on ``offers_for(job)`` minus the unavailable offers; when every
     candidate is unavailable, on all of them as a last resort: an idle job costs more than a retry);

   events on other instances (stale copies of older epochs, instances that are not costopt's) are
   ignored and logged;
3. a copy under notice is described at every pass until it is gone: found not alive (taken, exited
   after its notice checkpoint, vanished) it is treated as preempted;
4. jobs marked for recovery (status ``recovering`` without an active migration: the reconciler's
   marks, rolled-back recoveries) are recovered too, with a backoff after each failed attempt.

Events are acknowledged to the provider (:meth:`~costopt.cloud.CloudProvider.acknowledge`: AWS deletes
their queue messages) only once acted on (a notice once its request is written, a preemption once its
recovery ran), and count as seen only then: a watcher that dies between reading and acting gets them
again. Idempotent: the same events polled again do nothing (seen keys; and a job whose current copy
changed no longer matches); the migrator's one-active-migration-per-job rule guards the rest. A pass returns a
frozen :class:`WatchReport`. Recoveries run inside the pass (each waits for the new copy to progress),
up to ``workers`` at once: a reclaim that takes many copies at once (every instance of an offer) is
recovered side by side, not one job after another (one at a time, 40 jobs of the kill drill waited up to
22 simulated hours for their turn, each recovery 25-37 minutes). One at a time (the default) where
``sleep`` moves the clock itself (offline runs: concurrent sleepers would each move it).

The recovery cap (``cap``; the service: ``COSTOPT_RECOVERY_WORKERS``) is a property of the database, not
of the process: a pass starts at most ``cap`` minus the RECOVER migrations of the provider's jobs already
active in the database, whoever drives them (the job engine and the reconciler resume those a killed
service left in flight; a pass waits for its own). Before, the cap was the size of one pass's
thread pool: a restarted service's empty pool started ``cap`` more beside the resumed ones (the kill drill:
9 recoveries at once, a batch 2 minutes early, copies sent to a zone reclaimed next). With a cap, due recoveries
are started in a stable order, by the time their copy was lost (the preemption, or the notice of a copy
found gone; a job only marked ``recovering`` last) then by job id, so a restarted watcher that reads the
same events starts the same next ones. Those left for a later pass are reported in ``waiting``; their
preemptions are not acknowledged and the watermark is not saved past the oldest of them, so a watcher
killed meanwhile reads them again.
Times are tz-aware UTC on ``clock`` (the provider's clock: wall time for real clouds).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import Connection, Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from costopt.agent import control
from costopt.clock import join as clock_join
from costopt.clock import submit as clock_submit
from costopt.cloud import CloudProvider, Interruption, NotFoundError
from costopt.db.schema import store_meta
from costopt.domain import OfferKey, utc
from costopt.migration.machine import Migrator
from costopt.migration.records import ALIVE_STATES, RACES, JobRecord, JobStatus, Kind, MigrationRecord, State
from costopt.migration.unavailable import REASON_PREEMPTED, UnavailableOffers

log = logging.getLogger("costopt.migration.watch")

NOTICE = "notice"
PREEMPTED = "preempted"

OffersFor = Callable[[JobRecord], Sequence[OfferKey]]
"""The candidate offers to recover a job on, best first (before the unavailable ones are removed)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def notice_request_id(instance_id: str, noticed_at: datetime) -> str:
    """The checkpoint request id answering one notice: the same notice always gives the same id."""
    digest = hashlib.sha256(f"{instance_id}|{utc(noticed_at).isoformat()}".encode()).hexdigest()
    return f"notice-{digest[:32]}"


# -- the watermark ----------------------------------------------------------------------------------


class Watermark(Protocol):
    """Where a watcher keeps the start time of its last complete pass."""

    def load(self) -> datetime | None: ...

    def save(self, at: datetime) -> None: ...


class MemoryWatermark:
    """A watermark that lives as long as the process (tests, one-off drills)."""

    def __init__(self, at: datetime | None = None) -> None:
        self.at = at

    def load(self) -> datetime | None:
        return self.at

    def save(self, at: datetime) -> None:
        self.at = at


class DbWatermark:
    """A watermark in the ``store_meta`` table (``name`` -> integer microseconds since the Unix epoch),
    shared by every process on the database."""

    def __init__(self, engine: Engine, name: str) -> None:
        if not name or len(name) > 64:
            raise ValueError(f"a watermark name must be 1..64 characters, got {name!r}")
        self.engine = engine
        self.name = name

    def load(self) -> datetime | None:
        with self.engine.connect() as conn:
            value = conn.execute(select(store_meta.c.value).where(store_meta.c.name == self.name)).scalar()
        return None if value is None else _EPOCH + timedelta(microseconds=int(value))

    def save(self, at: datetime) -> None:
        value = (utc(at) - _EPOCH) // timedelta(microseconds=1)
        for _ in range(3):
            try:
                with self.engine.begin() as conn:
                    res = conn.execute(update(store_meta).where(store_meta.c.name == self.name).values(value=value))
                    if res.rowcount == 0:
                        conn.execute(insert(store_meta).values(name=self.name, value=value))
                return
            except IntegrityError:  # another process inserted it first: update it
                continue
        raise RuntimeError(f"could not save the watermark {self.name!r}: the row kept changing under other writers")


def _key(ev: Interruption) -> tuple[str, str, datetime]:
    """What makes an event the same event when it is read again."""
    return (ev.instance_id, ev.kind, utc(ev.noticed_at))


# -- the report -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NoticeHandled:
    """A notice on a job's current copy. ``request_id`` None: no request was sent (a migration of the
    job is in flight and owns the checkpoint request)."""

    job_id: str
    instance_id: str
    epoch: int
    noticed_at: datetime
    deadline: datetime | None
    request_id: str | None


@dataclass(frozen=True, slots=True)
class RecoveryStarted:
    """A recovery the pass ran: ``state`` is the migration's final state (``done`` or ``rolled_back``)."""

    job_id: str
    instance_id: str | None
    cause: str
    migration_id: int
    state: str
    reason: str

    @property
    def recovered(self) -> bool:
        return self.state == State.DONE.value


@dataclass(frozen=True, slots=True)
class IgnoredEvent:
    instance_id: str
    kind: str
    at: datetime
    why: str


@dataclass(frozen=True, slots=True)
class Waiting:
    """A job that needs a recovery the pass did not start, and why."""

    job_id: str
    why: str


@dataclass(frozen=True, slots=True)
class WatchReport:
    """One pass: the window read (``since`` to the pass's start ``checked_at``), how many events came
    back and how many had been seen before, and what was done."""

    since: datetime
    checked_at: datetime
    events: int
    duplicates: int
    notices: tuple[NoticeHandled, ...] = ()
    recoveries: tuple[RecoveryStarted, ...] = ()
    ignored: tuple[IgnoredEvent, ...] = ()
    waiting: tuple[Waiting, ...] = ()

    @property
    def idle(self) -> bool:
        """Nothing was handled (no notice, no recovery)."""
        return not self.notices and not self.recoveries


# -- the watcher ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Suspect:
    """A current copy under notice (``taken`` False: alive until described otherwise) or taken; ``at``:
    the event's time (the preemption's once taken, else the notice's), the recoveries' order."""

    job_id: str
    taken: bool
    at: datetime


_MARKED_AT = datetime.max.replace(tzinfo=UTC)
"""The order key of a job only marked ``recovering`` (no event of this process): after the lost copies."""


class InterruptionWatcher:
    """Reacts to the interruptions of one provider's jobs (module docstring).

    - ``migrator``: runs the recoveries; its ``provider`` is the one watched, and only jobs registered
      with that provider's name are considered;
    - ``offers_for(job)``: candidate offers for a recovery, best first;
    - ``unavailable``: the unavailable-offers cache (marked on preemptions, used to filter candidates;
      default: one on the migrator's database). Give it the same clock as the watcher;
    - ``watermark``: where the last pass's start is kept (default: ``store_meta`` row
      ``watch:<provider>``); ``overlap``: how far before it the next pass reads again;
    - ``clock``: now (tz-aware UTC) on the provider's clock;
    - ``recover_marked``: also recover jobs marked ``recovering`` (by the reconciler, or a rollback);
    - ``retry_base`` / ``retry_cap`` (seconds): after a recovery of a job fails, the next attempt waits
      ``min(cap, base * 2**failures)``;
    - ``workers``: how many recoveries of one pass run at once (each in its own thread; the migrator runs
      different jobs' migrations concurrently, as the job engine's workers do); 1: one after another
      (offline, where the migrator's ``sleep`` moves the simulated clock, it must be 1);
    - ``cap``: the most RECOVER migrations of the provider's jobs active at once in the database: a pass
      starts at most ``cap`` minus those already active (whoever drives them), the others wait for a
      later pass (module docstring). None: no cap, every due recovery runs in the pass.
    """

    def __init__(
        self,
        migrator: Migrator,
        offers_for: OffersFor,
        *,
        unavailable: UnavailableOffers | None = None,
        watermark: Watermark | None = None,
        overlap: timedelta = timedelta(minutes=10),
        clock: Callable[[], datetime] | None = None,
        recover_marked: bool = True,
        retry_base: float = 5.0,
        retry_cap: float = 300.0,
        workers: int = 1,
        cap: int | None = None,
    ) -> None:
        if overlap < timedelta(0):
            raise ValueError(f"overlap must be >= 0, got {overlap}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if cap is not None and cap < 1:
            raise ValueError(f"cap must be >= 1 or None, got {cap}")
        self.workers = workers
        self.cap = cap
        self.migrator = migrator
        self.provider: CloudProvider = migrator.provider
        self.offers_for = offers_for
        self.unavailable = unavailable if unavailable is not None else UnavailableOffers(migrator.engine)
        self.watermark: Watermark = (
            watermark if watermark is not None else DbWatermark(migrator.engine, f"watch:{self.provider.name}"[:64])
        )
        self.overlap = overlap
        self.clock: Callable[[], datetime] = clock or _utcnow
        self.recover_marked = recover_marked
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self._seen: dict[tuple[str, str, datetime], datetime] = {}
        self._suspects: dict[str, _Suspect] = {}
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, datetime] = {}

    # -- helpers -------------------------------------------------------------------------------------

    def _now(self) -> datetime:
        now = self.clock()
        if now.tzinfo is None:
            raise ValueError(f"the watcher's clock returned a naive datetime {now!r}: it must be tz-aware UTC")
        return now.astimezone(UTC)

    def _since(self, now: datetime) -> datetime:
        last = self.watermark.load()
        if last is not None and last > now:
            log.warning(
                "watch %s: the saved watermark %s is after now (%s): another clock wrote it; reading from now - %s",
                self.provider.name,
                last,
                now,
                self.overlap,
            )
            last = None
        return (last if last is not None else now) - self.overlap

    def _jobs(self, conn: Connection | None = None) -> dict[str, JobRecord]:
        return {j.job_id: j for j in self.migrator.jobs(conn=conn) if j.provider == self.provider.name}

    def _mark(self, job: JobRecord, at: datetime, detail: str) -> None:
        if job.offer is None:
            return
        try:
            self.unavailable.mark(job.offer, REASON_PREEMPTED, at=at, detail=detail)
        except Exception:  # the cache is advice: a failed mark must not stop the recovery
            log.exception("watch %s: could not mark %s unavailable", self.provider.name, job.offer)

    def _alive(self, instance_id: str) -> bool:
        try:
            return self.provider.describe(instance_id).state in ALIVE_STATES
        except NotFoundError:
            return False

    def _request(self, job: JobRecord, ev: Interruption) -> str:
        rid = notice_request_id(ev.instance_id, ev.noticed_at)
        left = f"; taken at {utc(ev.deadline).isoformat()}" if ev.deadline is not None else ""
        control.request_checkpoint(
            job.checkpoint_uri,
            epoch=job.epoch,
            request_id=rid,
            reason=f"preemption notice on {ev.instance_id}{left}",
            at=self.clock().timestamp(),
        )
        return rid

    # -- one pass ------------------------------------------------------------------------------------

    def poll(self) -> WatchReport:
        """One pass (module docstring). Raises what ``provider.interruptions`` raises (the watermark is
        then not advanced); a failure of one job's recovery is logged and reported in ``waiting``."""
        now = self._now()
        since = self._since(now)
        events = self.provider.interruptions(since)
        with self.migrator.engine.connect() as conn:  # both reads on one connection (one pool checkout)
            jobs = self._jobs(conn)
            running = self.migrator.active_migrations(conn=conn)  # the jobs in migration and the recovery cap's count
        current = {j.instance_id: j for j in jobs.values() if j.instance_id is not None}
        active = {m.job_id for m in running}
        busy = sum(1 for m in running if m.kind is Kind.RECOVER and m.job_id in jobs)

        fresh: list[Interruption] = []
        acting: dict[tuple[str, str, datetime], datetime] = {}  # seen once acted on (below), not before
        duplicates = 0
        for ev in sorted(events, key=lambda e: (utc(e.noticed_at), e.kind != NOTICE, e.instance_id)):
            key = _key(ev)
            if key in self._seen or key in acting:
                duplicates += 1
                continue
            acting[key] = utc(ev.noticed_at)
            fresh.append(ev)
        taken_now = {ev.instance_id for ev in fresh if ev.kind == PREEMPTED}

        notices: list[NoticeHandled] = []
        ignored: list[IgnoredEvent] = []
        for ev in fresh:
            at = utc(ev.noticed_at)
            job = current.get(ev.instance_id)
            if job is None:
                why = "not the current copy of any job (a stale copy of an older epoch, or not costopt's)"
            elif job.status is JobStatus.FINISHED:
                why = f"job {job.job_id} has finished"
            elif ev.kind not in (NOTICE, PREEMPTED):
                why = f"unknown interruption kind {ev.kind!r}"
            else:
                why = ""
            if why:
                log.info("watch %s: ignoring %s of %s at %s: %s", self.provider.name, ev.kind, ev.instance_id, at, why)
                ignored.append(IgnoredEvent(ev.instance_id, ev.kind, at, why))
                continue
            assert job is not None
            if ev.kind == PREEMPTED:
                log.warning(
                    "watch %s: %s (job %s) was preempted at %s", self.provider.name, ev.instance_id, job.job_id, at
                )
                self._mark(job, at, f"{ev.instance_id} preempted (job {job.job_id})")
                self._suspects[ev.instance_id] = _Suspect(job.job_id, True, at)
                continue
            self._suspects.setdefault(ev.instance_id, _Suspect(job.job_id, False, at))
            if ev.instance_id in taken_now:
                ignored.append(IgnoredEvent(ev.instance_id, ev.kind, at, "the copy was taken in the same window"))
                continue
            rid: str | None = None
            if job.job_id in active:
                log.info(
                    "watch %s: notice on %s (job %s): a migration is in flight, it owns the checkpoint request",
                    self.provider.name,
                    ev.instance_id,
                    job.job_id,
                )
            else:
                try:
                    rid = self._request(job, ev)
                except Exception:
                    # The agent reads the notice itself too; the next pass asks again.
                    log.exception("watch %s: could not request a checkpoint of job %s", self.provider.name, job.job_id)
                    del acting[(ev.instance_id, ev.kind, at)]  # not acted on: not acknowledged either
                    continue
                log.warning(
                    "watch %s: notice on %s (job %s, epoch %d): checkpoint requested (%s), taken at %s",
                    self.provider.name,
                    ev.instance_id,
                    job.job_id,
                    job.epoch,
                    rid,
                    ev.deadline,
                )
            notices.append(NoticeHandled(job.job_id, ev.instance_id, job.epoch, at, ev.deadline, rid))

        # Every event read is acted on now (a notice's checkpoint request is written) or deliberately
        # ignored, but for failed requests: only now does the provider forget them (AWS deletes their
        # queue messages), so a watcher that dies before this line sees them again. Preemptions are
        # acknowledged once their recoveries ran.
        self._seen.update(acting)
        acted = [ev for ev in events if _key(ev) in self._seen]
        self._acknowledge([ev for ev in acted if ev.kind != PREEMPTED])
        due = self._due(jobs, active, now)
        recoveries, waiting, deferred = self._recover(jobs, due, now, busy)
        # A preemption whose recovery waits for the cap is neither acknowledged nor left behind the
        # watermark: a watcher killed before it starts reads it again.
        self._acknowledge([ev for ev in acted if ev.kind == PREEMPTED and ev.instance_id not in deferred])
        self.watermark.save(min([now, *deferred.values()]))
        self._prune(since)
        return WatchReport(
            since=since,
            checked_at=now,
            events=len(events),
            duplicates=duplicates,
            notices=tuple(notices),
            recoveries=tuple(recoveries),
            ignored=tuple(ignored),
            waiting=tuple(waiting),
        )

    def _due(
        self, jobs: dict[str, JobRecord], active: set[str], now: datetime
    ) -> dict[str, tuple[str | None, str, datetime]]:
        """Jobs to recover now: job id -> (the lost instance, the cause, when it was lost: the order)."""
        due: dict[str, tuple[str | None, str, datetime]] = {}
        for iid, suspect in list(self._suspects.items()):
            job = jobs.get(suspect.job_id)
            if job is None or job.instance_id != iid or job.status is JobStatus.FINISHED:
                del self._suspects[iid]  # the job moved on (recovered, moved) or finished
                continue
            if job.job_id in active:
                continue  # the migration in flight handles a copy that vanishes
            if not suspect.taken:
                if self._alive(iid):
                    continue
                log.warning("watch %s: %s (job %s) is gone after its notice", self.provider.name, iid, job.job_id)
                self._mark(job, now, f"{iid} gone after a preemption notice (job {job.job_id})")
                suspect.taken = True
            if job.status is JobStatus.RUNNING and control.progress(job.checkpoint_uri, job.epoch).done:
                log.info("watch %s: job %s finished on %s before it was taken", self.provider.name, job.job_id, iid)
                del self._suspects[iid]
                continue
            due[job.job_id] = (iid, PREEMPTED, suspect.at)
        if self.recover_marked:
            for job in jobs.values():
                if job.status is JobStatus.RECOVERING and job.job_id not in active:
                    due.setdefault(job.job_id, (job.instance_id, "marked for recovery", _MARKED_AT))
        return due

    def _recover(
        self,
        jobs: dict[str, JobRecord],
        due: dict[str, tuple[str | None, str, datetime]],
        now: datetime,
        busy: int,
    ) -> tuple[list[RecoveryStarted], list[Waiting], dict[str, datetime]]:
        """Start the due recoveries the cap allows (``busy``: the RECOVER migrations of these jobs already
        active, as the pass read them), in order (time lost, job id), and wait for them. Returns what ran,
        what waits, and the lost copies whose recoveries wait for the cap (instance -> time)."""
        recoveries: list[RecoveryStarted] = []
        waiting: list[Waiting] = []
        deferred: dict[str, datetime] = {}
        ready: list[tuple[str, str | None, str, list[OfferKey]]] = []  # (job, its lost copy, cause, offers)
        slots = None if self.cap is None else max(0, self.cap - busy)
        # With a cap, in a stable order (a restart picks the same next ones); without one, every due job
        # starts in this pass, in the order found (the offline runs' order, unchanged).
        order = list(due.items()) if slots is None else sorted(due.items(), key=lambda d: (d[1][2], d[0]))
        for job_id, (iid, cause, lost_at) in order:
            if slots is not None and len(ready) >= slots:
                waiting.append(Waiting(job_id, f"the recovery cap: {busy + len(ready)} of {self.cap} active"))
                if iid is not None and lost_at != _MARKED_AT:
                    deferred[iid] = lost_at
                continue
            retry = self._retry_at.get(job_id)
            if retry is not None and now < retry:
                waiting.append(Waiting(job_id, f"backing off after a failed recovery until {retry.isoformat()}"))
                continue
            job = jobs[job_id]
            try:
                candidates = list(self.offers_for(job))
                offers = self.unavailable.filter(candidates, at=now)
            except Exception as exc:
                log.exception("watch %s: no candidate offers for job %s", self.provider.name, job_id)
                waiting.append(Waiting(job_id, f"offers_for failed: {type(exc).__name__}: {exc}"))
                continue
            if not candidates:
                why = "offers_for returned no candidate offer: configure where this job may run"
                log.warning("watch %s: cannot recover job %s: %s", self.provider.name, job_id, why)
                waiting.append(Waiting(job_id, why))
                continue
            if not offers:
                # A job that is not running costs more than a retry on a recently refused offer.
                log.warning(
                    "watch %s: every candidate offer of job %s is marked unavailable: trying them anyway",
                    self.provider.name,
                    job_id,
                )
                offers, cause = candidates, f"{cause}; every candidate marked unavailable, tried anyway"
            log.warning(
                "watch %s: recovering job %s (%s) on %d offer(s)", self.provider.name, job_id, cause, len(offers)
            )
            ready.append((job_id, iid, cause, list(offers)))
        if len(ready) > 1 and self.workers > 1:
            size = min(self.workers, len(ready))
            with ThreadPoolExecutor(size, thread_name_prefix="costopt-recover") as pool:
                # counted by a lockstep clock (the kill drill's stepped simulated clock) when one drives the service
                futures = [
                    clock_submit(pool, functools.partial(self.migrator.recover, job_id, offers), capacity=size)
                    for job_id, _, _, offers in ready
                ]
                clock_join(futures)
            outcomes: list[Callable[[], MigrationRecord]] = [f.result for f in futures]
        else:
            outcomes = [functools.partial(self.migrator.recover, job_id, offers) for job_id, _, _, offers in ready]
        for (job_id, iid, cause, _), outcome in zip(ready, outcomes, strict=True):
            try:
                rec = outcome()
            except RACES as exc:  # the job finished, or another actor advanced its recovery, meanwhile
                log.warning("watch %s: job %s: %s: %s", self.provider.name, job_id, type(exc).__name__, exc)
                self._back_off(job_id)
                waiting.append(Waiting(job_id, f"recovery failed: {type(exc).__name__}: {exc}"))
                continue
            except Exception as exc:
                log.exception("watch %s: the recovery of job %s failed", self.provider.name, job_id)
                self._back_off(job_id)
                waiting.append(Waiting(job_id, f"recovery failed: {type(exc).__name__}: {exc}"))
                continue
            recoveries.append(RecoveryStarted(job_id, iid, cause, rec.id, rec.state.value, rec.reason))
            if iid is not None:
                self._suspects.pop(iid, None)
            if rec.state is State.DONE:
                self._failures.pop(job_id, None)
                self._retry_at.pop(job_id, None)
            else:
                self._back_off(job_id)
        return recoveries, waiting, deferred

    def _acknowledge(self, events: Sequence[Interruption]) -> None:
        if not events:
            return
        try:
            self.provider.acknowledge(events)
        except Exception:  # the contract says it never raises; a notice not acknowledged only comes again
            log.exception("watch %s: could not acknowledge %d event(s)", self.provider.name, len(events))

    def _back_off(self, job_id: str) -> None:
        n = self._failures.get(job_id, 0)
        self._failures[job_id] = n + 1
        self._retry_at[job_id] = self._now() + timedelta(seconds=min(self.retry_cap, self.retry_base * 2**n))

    def _prune(self, since: datetime) -> None:
        horizon = since - self.overlap
        for key in [k for k, t in self._seen.items() if t < horizon]:
            del self._seen[key]

"""Fleets in the database: :class:`FleetRepository` is the one writer of the fleet tables
(:mod:`costopt.db.fleets_schema`).

Contracts:

- :meth:`FleetRepository.create` writes the fleet and its first instances in one transaction and is
  idempotent per ``(team_id, idempotency_key)`` (a retried request returns the first fleet, also when two
  race: the unique constraint decides, the loser reads the winner);
- ``team_id`` None in a read means every team (an admin); another team's fleet is "not found";
- :meth:`FleetRepository.add_job` registers a job submitted into a fleet; it is idempotent per job id
  (a retried registration changes nothing), so the submission path and the executor's repair of a
  submission cut short between its two writes may both call it;
- times are tz-aware UTC from the repository's ``now`` (the service clock);
- **lock order**: a transaction that writes a fleet's row and rows of its instances or jobs locks the
  fleet's row first (:meth:`FleetRepository._lock_fleet`), so a release (the fleet, then its instances)
  never deadlocks with a lost instance (the instance and its jobs, then the fleet) or a scale-down on
  PostgreSQL: the soak's run M had one release answered 503 by such a deadlock (docs/reliability.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, case, exists, func, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from costopt.db.cursors import make_cursor, parse_cursor
from costopt.db.fleets_schema import fleet_instances, fleet_jobs, fleet_rounds, fleets
from costopt.fleets.model import (
    FleetInstance,
    FleetJob,
    FleetJobStatus,
    FleetNotFound,
    FleetRecord,
    FleetState,
    FleetStateError,
    InstanceState,
    NewFleet,
    NewInstance,
    RoundCredits,
    RoundLeases,
    RoundRecord,
)

__all__ = ["FleetPage", "FleetRepository", "NewFleetJob"]

MAX_PAGE = 500


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _dumps(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class NewFleetJob:
    """A job submitted into a fleet (its ``jobs`` row is written by the job repository)."""

    job_id: str
    fleet_id: str
    team_id: str
    gpus: int
    throughput: Mapping[str, float]
    steps_total: int
    arrived_at: datetime
    weight: float = 1.0
    slo_s: float | None = None


@dataclass(frozen=True, slots=True)
class FleetPage:
    items: tuple[FleetRecord, ...]
    next_cursor: str | None
    total: int


def _instance_rows(fleet_id: str, new: Sequence[NewInstance], now: datetime) -> list[dict[str, Any]]:
    """The rows of ``new``, a microsecond apart so that "oldest first" is the order they were given in."""
    return [_instance_values(fleet_id, inst, now + timedelta(microseconds=k)) for k, inst in enumerate(new)]


def _instance_values(fleet_id: str, new: NewInstance, now: datetime) -> dict[str, Any]:
    return {
        "id": new.instance_id,
        "fleet_id": fleet_id,
        "provider": new.provider,
        "offer": _dumps(new.offer.to_doc()),
        "accelerator": new.accelerator,
        "gpus": int(new.gpus),
        "usd_per_hour": new.usd_per_hour,
        "state": InstanceState.PENDING.value,
        "replaces": new.replaces,
        "created_at": now,
    }


@dataclass(slots=True)
class FleetRepository:
    """Reads and writes fleets in ``engine`` (see the module doc for the contracts)."""

    engine: Engine
    now: Callable[[], datetime] = _utcnow

    # -- connections -----------------------------------------------------------------------------------

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """One connection for several reads (autocommit: each statement reads what is committed)."""
        with self.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn

    @contextmanager
    def _reads(self, conn: Connection | None) -> Iterator[Connection]:
        if conn is not None:
            yield conn
        else:
            with self.reading() as own:
                yield own

    # -- fleets ----------------------------------------------------------------------------------------

    def create(self, new: NewFleet) -> tuple[FleetRecord, bool]:
        """Insert ``new`` (``active``) and its instances (``pending``) in one transaction; returns
        ``(fleet, created)`` (``created`` False: the team's idempotency key was used before, the first
        fleet is returned and nothing is written)."""
        if new.idempotency_key is not None:
            first = self.by_idempotency_key(new.team_id, new.idempotency_key)
            if first is not None:
                return first, False
        now = self.now()
        try:
            with self.engine.begin() as conn:
                row = conn.execute(
                    insert(fleets)
                    .values(
                        id=new.fleet_id,
                        team_id=new.team_id,
                        name=new.name,
                        policy=new.policy,
                        round_s=float(new.round_s),
                        resolve_rounds=int(new.resolve_rounds),
                        state=FleetState.ACTIVE.value,
                        spec=_dumps(new.spec),
                        round=0,
                        dirty=True,
                        idempotency_key=new.idempotency_key,
                        version=0,
                        created_at=now,
                        updated_at=now,
                    )
                    .returning(*fleets.c)
                ).one()
                conn.execute(insert(fleet_instances), _instance_rows(new.fleet_id, new.instances, now))
        except IntegrityError:
            if new.idempotency_key is None:
                raise
            first = self.by_idempotency_key(new.team_id, new.idempotency_key)
            if first is None:
                raise
            return first, False
        return FleetRecord.of(row), True

    def get(self, fleet_id: str, team_id: str | None = None, *, conn: Connection | None = None) -> FleetRecord:
        """The fleet (of ``team_id`` when given); raises :class:`FleetNotFound`."""
        conds = [fleets.c.id == fleet_id]
        if team_id is not None:
            conds.append(fleets.c.team_id == team_id)
        with self._reads(conn) as c:
            row = c.execute(select(fleets).where(*conds)).first()
        if row is None:
            raise FleetNotFound(f"no fleet {fleet_id!r}")
        return FleetRecord.of(row)

    def by_idempotency_key(self, team_id: str, key: str, *, conn: Connection | None = None) -> FleetRecord | None:
        with self._reads(conn) as c:
            row = c.execute(select(fleets).where(fleets.c.team_id == team_id, fleets.c.idempotency_key == key)).first()
        return None if row is None else FleetRecord.of(row)

    def page(
        self, *, team_id: str | None = None, limit: int = 50, cursor: str | None = None, conn: Connection | None = None
    ) -> FleetPage:
        """Fleets oldest first (``(created_at, id)``), of one team or all; ValueError for a bad cursor."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        conds: list[Any] = [] if team_id is None else [fleets.c.team_id == team_id]
        page_conds = list(conds)
        if cursor is not None:
            at, last = parse_cursor(cursor)
            page_conds.append(or_(fleets.c.created_at > at, and_(fleets.c.created_at == at, fleets.c.id > last)))
        with self._reads(conn) as c:
            rows = c.execute(
                select(fleets).where(*page_conds).order_by(fleets.c.created_at, fleets.c.id).limit(limit + 1)
            ).all()
            total = int(c.execute(select(func.count()).select_from(fleets).where(*conds)).scalar_one())
        items = tuple(FleetRecord.of(r) for r in rows[:limit])
        return FleetPage(
            items, make_cursor(items[-1].created_at, items[-1].id) if len(rows) > limit and items else None, total
        )

    def active(self, *, conn: Connection | None = None) -> list[FleetRecord]:
        """Every active fleet, oldest first (the executor's work list)."""
        with self._reads(conn) as c:
            rows = c.execute(
                select(fleets).where(fleets.c.state == FleetState.ACTIVE.value).order_by(fleets.c.created_at)
            ).all()
        return [FleetRecord.of(r) for r in rows]

    def release(self, fleet_id: str, team_id: str | None = None) -> FleetRecord:
        """Release the fleet: no new jobs, its instances drain (their jobs checkpoint and stop at the next
        round, then the executor terminates them). Idempotent."""
        fleet = self.get(fleet_id, team_id)
        if fleet.state is FleetState.RELEASED:
            return fleet
        now = self.now()
        with self.engine.begin() as conn:
            row = conn.execute(
                update(fleets)
                .where(fleets.c.id == fleet_id, fleets.c.state == FleetState.ACTIVE.value)
                .values(
                    state=FleetState.RELEASED.value,
                    released_at=now,
                    updated_at=now,
                    dirty=True,
                    version=fleets.c.version + 1,
                )
                .returning(*fleets.c)
            ).first()
            conn.execute(
                update(fleet_instances)
                .where(
                    fleet_instances.c.fleet_id == fleet_id,
                    fleet_instances.c.state.in_(
                        [InstanceState.PENDING.value, InstanceState.LAUNCHING.value, InstanceState.RUNNING.value]
                    ),
                )
                .values(state=InstanceState.DRAINING.value, end_reason="fleet released")
            )
        return FleetRecord.of(row) if row is not None else self.get(fleet_id)

    # -- instances -------------------------------------------------------------------------------------

    def instances(
        self, fleet_id: str, *, states: Collection[InstanceState] | None = None, conn: Connection | None = None
    ) -> list[FleetInstance]:
        """The fleet's instances, oldest first (in ``states`` when given)."""
        conds: list[Any] = [fleet_instances.c.fleet_id == fleet_id]
        if states is not None:
            conds.append(fleet_instances.c.state.in_([InstanceState(s).value for s in states]))
        with self._reads(conn) as c:
            rows = c.execute(
                select(fleet_instances).where(*conds).order_by(fleet_instances.c.created_at, fleet_instances.c.id)
            ).all()
        return [FleetInstance.of(r) for r in rows]

    def instance(self, instance_id: str, *, conn: Connection | None = None) -> FleetInstance | None:
        with self._reads(conn) as c:
            row = c.execute(select(fleet_instances).where(fleet_instances.c.id == instance_id)).first()
        return None if row is None else FleetInstance.of(row)

    def add_instances(self, fleet_id: str, new: Sequence[NewInstance], team_id: str | None = None) -> None:
        """Scale up: add ``new`` (``pending``) to an active fleet."""
        fleet = self.get(fleet_id, team_id)
        if fleet.state is not FleetState.ACTIVE:
            raise FleetStateError(f"fleet {fleet_id} is {fleet.state.value}: it cannot be scaled")
        if not new:
            return
        now = self.now()
        with self.engine.begin() as conn:
            conn.execute(insert(fleet_instances), _instance_rows(fleet_id, new, now))
            self._touch(conn, fleet_id, now)

    def drain(self, fleet_id: str, instance_ids: Iterable[str], team_id: str | None = None) -> list[str]:
        """Scale down: the instances stop taking jobs at the next round (their jobs checkpoint and move),
        then are terminated. Returns the ids that were drained now (others: already draining or gone).
        Raises :class:`FleetNotFound` for an id that is not the fleet's."""
        fleet = self.get(fleet_id, team_id)
        if fleet.state is not FleetState.ACTIVE:
            raise FleetStateError(f"fleet {fleet_id} is {fleet.state.value}: it cannot be scaled")
        ids = list(dict.fromkeys(instance_ids))
        mine = {i.id: i for i in self.instances(fleet_id)}
        unknown = [i for i in ids if i not in mine]
        if unknown:
            raise FleetNotFound(f"fleet {fleet_id} has no instance {', '.join(map(repr, unknown))}")
        live = [i for i in ids if mine[i].state.member]
        if live:
            now = self.now()
            with self.engine.begin() as conn:
                self._lock_fleet(conn, fleet_id)  # the fleet's row before its instances' (module doc)
                conn.execute(
                    update(fleet_instances)
                    .where(fleet_instances.c.id.in_(live))
                    .values(state=InstanceState.DRAINING.value, end_reason="scaled down")
                )
                self._touch(conn, fleet_id, now)
        return live

    @staticmethod
    def _lock_fleet(conn: Connection, fleet_id: str) -> None:
        """Lock the fleet's row for the rest of ``conn``'s transaction (``SELECT ... FOR UPDATE`` on PostgreSQL;
        SQLite's writer holds the whole file already): the first lock of any transaction that also writes the
        fleet's instances or jobs and its row (the module doc's lock order)."""
        conn.execute(select(fleets.c.id).where(fleets.c.id == fleet_id).with_for_update())

    def _touch(self, conn: Connection, fleet_id: str, now: datetime) -> None:
        conn.execute(
            update(fleets)
            .where(fleets.c.id == fleet_id)
            .values(dirty=True, updated_at=now, version=fleets.c.version + 1)
        )

    # -- jobs ------------------------------------------------------------------------------------------

    def add_job(self, new: NewFleetJob) -> FleetJob:
        """Register a job submitted into a fleet (``waiting``); idempotent per job id. Marks the fleet
        dirty (the policy is re-solved at the next round)."""
        now = self.now()
        try:
            with self.engine.begin() as conn:
                row = conn.execute(
                    insert(fleet_jobs)
                    .values(
                        job_id=new.job_id,
                        fleet_id=new.fleet_id,
                        team_id=new.team_id,
                        weight=float(new.weight),
                        slo_s=None if new.slo_s is None else float(new.slo_s),
                        gpus=int(new.gpus),
                        throughput=_dumps({k: float(v) for k, v in new.throughput.items()}),
                        steps_total=int(new.steps_total),
                        arrived_at=new.arrived_at,
                        status=FleetJobStatus.WAITING.value,
                        received="{}",
                        owed="{}",
                        updated_at=now,
                    )
                    .returning(*fleet_jobs.c)
                ).one()
                self._touch(conn, new.fleet_id, now)
        except IntegrityError:
            found = self.job(new.job_id)
            if found is None:
                raise
            return found
        return FleetJob.of(row)

    def job(self, job_id: str, *, conn: Connection | None = None) -> FleetJob | None:
        with self._reads(conn) as c:
            row = c.execute(select(fleet_jobs).where(fleet_jobs.c.job_id == job_id)).first()
        return None if row is None else FleetJob.of(row)

    def jobs(
        self,
        fleet_id: str,
        *,
        statuses: Collection[FleetJobStatus] | None = None,
        job_ids: Collection[str] | None = None,
        conn: Connection | None = None,
    ) -> list[FleetJob]:
        """The fleet's jobs in arrival order (in ``statuses``, among ``job_ids``, when given)."""
        conds: list[Any] = [fleet_jobs.c.fleet_id == fleet_id]
        if statuses is not None:
            conds.append(fleet_jobs.c.status.in_([FleetJobStatus(s).value for s in statuses]))
        if job_ids is not None:
            if not job_ids:
                return []
            conds.append(fleet_jobs.c.job_id.in_(list(job_ids)))
        with self._reads(conn) as c:
            rows = c.execute(
                select(fleet_jobs).where(*conds).order_by(fleet_jobs.c.arrived_at, fleet_jobs.c.job_id)
            ).all()
        return [FleetJob.of(r) for r in rows]

    # -- rounds ----------------------------------------------------------------------------------------

    def round(self, fleet_id: str, number: int, *, conn: Connection | None = None) -> RoundRecord | None:
        with self._reads(conn) as c:
            row = c.execute(
                select(fleet_rounds).where(fleet_rounds.c.fleet_id == fleet_id, fleet_rounds.c.round == number)
            ).first()
        return None if row is None else RoundRecord.of(row)

    def rounds(self, fleet_id: str, *, since: int = 0, conn: Connection | None = None) -> list[RoundRecord]:
        """The fleet's rounds numbered ``since`` or more (default: every one), in order."""
        with self._reads(conn) as c:
            rows = c.execute(
                select(fleet_rounds)
                .where(fleet_rounds.c.fleet_id == fleet_id, fleet_rounds.c.round >= since)
                .order_by(fleet_rounds.c.round)
            ).all()
        return [RoundRecord.of(r) for r in rows]

    def leases_since(self, fleet_id: str, since: datetime, *, conn: Connection | None = None) -> list[RoundLeases]:
        """The leases of the fleet's rounds that started at ``since`` or later, in order: the history the
        decayed shares are recomputed from (:func:`costopt.fleets.rounds.history_since`). Reads four
        columns and two keys of each lease."""
        with self._reads(conn) as c:
            rows = c.execute(
                select(
                    fleet_rounds.c.round, fleet_rounds.c.started_at, fleet_rounds.c.ended_at, fleet_rounds.c.assignment
                )
                .where(fleet_rounds.c.fleet_id == fleet_id, fleet_rounds.c.started_at >= since)
                .order_by(fleet_rounds.c.round)
            ).all()
        return [
            RoundLeases(
                int(r.round),
                r.started_at,
                r.ended_at,
                tuple((str(d["job_id"]), str(d["type"])) for d in json.loads(r.assignment)),
            )
            for r in rows
        ]

    def first_unbilled(self, fleet_id: str, *, conn: Connection | None = None) -> int | None:
        """The number of the fleet's first round not billed yet (None: every round is)."""
        with self._reads(conn) as c:
            found = c.execute(
                select(func.min(fleet_rounds.c.round)).where(
                    fleet_rounds.c.fleet_id == fleet_id, fleet_rounds.c.billed.is_(False)
                )
            ).scalar_one()
        return None if found is None else int(found)

    # -- the round executor's writes ---------------------------------------------------------------------

    def released_with_instances(self, *, billed: bool = True, conn: Connection | None = None) -> list[FleetRecord]:
        """Released fleets that still have instances to terminate or bill to their end, jobs to end, or a
        round to end (a release that landed while a pass ran: the round ends at the release). A ``lost``
        instance is done once billed to its end (``billed_to``; with ``billed`` False, for an executor that
        bills nothing: at once); a ``released`` one is done. An instance whose launch was cut short is not
        done, whatever its state, until the executor cleared it on the cloud
        (:attr:`FleetInstance.launch_unresolved`)."""
        live = [InstanceState.PENDING, InstanceState.LAUNCHING, InstanceState.RUNNING, InstanceState.DRAINING]
        pending: ColumnElement[bool] = or_(
            fleet_instances.c.state.in_([s.value for s in live]),
            # a launch cut short not cleared yet (FleetInstance.launch_unresolved), in any state
            and_(fleet_instances.c.launch_token.is_not(None), fleet_instances.c.instance_id.is_(None)),
        )
        if billed:
            pending = or_(
                pending,
                and_(fleet_instances.c.state == InstanceState.LOST.value, fleet_instances.c.billed_to.is_(None)),
            )
        with self._reads(conn) as c:
            rows = c.execute(
                select(fleets)
                .where(
                    fleets.c.state == FleetState.RELEASED.value,
                    or_(
                        fleets.c.id.in_(select(fleet_instances.c.fleet_id).where(pending)),
                        fleets.c.id.in_(
                            select(fleet_jobs.c.fleet_id).where(
                                fleet_jobs.c.status.in_([FleetJobStatus.WAITING.value, FleetJobStatus.RUNNING.value])
                            )
                        ),
                        exists().where(  # its last round open (only the last can be): one key look-up
                            fleet_rounds.c.fleet_id == fleets.c.id,
                            fleet_rounds.c.round == fleets.c.round,
                            fleet_rounds.c.ended_at.is_(None),
                        ),
                    ),
                )
                .order_by(fleets.c.created_at)
            ).all()
        return [FleetRecord.of(r) for r in rows]

    def mark_billed_to(self, instance_id: str, at: datetime) -> None:
        """The ledger has the instance's life up to ``at`` (its end: :class:`costopt.fleets.billing.
        FleetBilling` writes it once it recorded the last stretch)."""
        with self.engine.begin() as conn:
            conn.execute(update(fleet_instances).where(fleet_instances.c.id == instance_id).values(billed_to=at))

    def update_instance(
        self, fleet_instance: str, /, *, expect: Collection[InstanceState] | None = None, **values: Any
    ) -> bool:
        """Set columns of an instance (``state`` as an :class:`InstanceState`), only from the states in
        ``expect`` when given; True when the row was changed."""
        if isinstance(values.get("state"), InstanceState):
            values["state"] = values["state"].value
        if "offer" in values:
            raise ValueError("an instance's offer never changes")
        conds: list[Any] = [fleet_instances.c.id == fleet_instance]
        if expect is not None:
            conds.append(fleet_instances.c.state.in_([InstanceState(s).value for s in expect]))
        with self.engine.begin() as conn:
            return bool(conn.execute(update(fleet_instances).where(*conds).values(**values)).rowcount)

    def mark_dirty(self, fleet_id: str) -> None:
        with self.engine.begin() as conn:
            self._touch(conn, fleet_id, self.now())

    def lose_instance(self, instance_id: str, reason: str, *, replace: NewInstance | None = None) -> bool:
        """The instance's worker is gone: ``lost``, its jobs' copies are given up (their holder cleared: they
        resume elsewhere from their last checkpoint, with a new epoch), the leases of this round that name it
        are dropped, the fleet is re-solved, and ``replace`` (when given) is added ``pending``. One
        transaction; False (nothing done) when the instance was not live any more."""
        now = self.now()
        with self.engine.begin() as conn:
            fleet_id = conn.execute(
                select(fleet_instances.c.fleet_id).where(fleet_instances.c.id == instance_id)
            ).scalar_one_or_none()
            if fleet_id is None:
                return False
            self._lock_fleet(conn, fleet_id)  # the fleet's row before the instance's and its jobs' (module doc)
            row = conn.execute(
                update(fleet_instances)
                .where(
                    fleet_instances.c.id == instance_id,
                    fleet_instances.c.state.in_(
                        [InstanceState.LAUNCHING.value, InstanceState.RUNNING.value, InstanceState.DRAINING.value]
                    ),
                )
                .values(state=InstanceState.LOST.value, ended_at=now, end_reason=reason)
                .returning(fleet_instances.c.fleet_id)
            ).first()
            if row is None:
                return False
            conn.execute(
                update(fleet_jobs)
                .where(fleet_jobs.c.holder == instance_id)
                .values(holder=None, holder_epoch=None, status=FleetJobStatus.WAITING.value, updated_at=now)
            )
            conn.execute(
                update(fleet_jobs)
                .where(fleet_jobs.c.target == instance_id)
                .values(target=None, target_gpus=None, updated_at=now)
            )
            if replace is not None:
                conn.execute(insert(fleet_instances), _instance_rows(row.fleet_id, [replace], now))
            self._touch(conn, row.fleet_id, now)
        return True

    def holders(self, instance_id: str, *, conn: Connection | None = None) -> list[FleetJob]:
        """Jobs whose copy may run on the instance now, or that the current round puts there."""
        with self._reads(conn) as c:
            rows = c.execute(
                select(fleet_jobs).where(or_(fleet_jobs.c.holder == instance_id, fleet_jobs.c.target == instance_id))
            ).all()
        return [FleetJob.of(r) for r in rows]

    def set_job(
        self, job_id: str, *, expect_holder: tuple[str | None, int | None] | None = None, **values: Any
    ) -> bool:
        """Set columns of a fleet job (``status`` as a :class:`FleetJobStatus`; ``received``, ``owed``
        and ``target_gpus`` as JSON-able values), only while its holder is ``expect_holder`` (instance, epoch)
        when given; True when the row was changed."""
        if isinstance(values.get("status"), FleetJobStatus):
            values["status"] = values["status"].value
        for key in ("received", "owed", "target_gpus", "throughput"):
            if key in values and values[key] is not None and not isinstance(values[key], str):
                values[key] = _dumps(values[key])
        values["updated_at"] = self.now()
        conds: list[Any] = [fleet_jobs.c.job_id == job_id]
        if expect_holder is not None:
            inst, epoch = expect_holder
            conds.append(fleet_jobs.c.holder.is_(None) if inst is None else fleet_jobs.c.holder == inst)
            if inst is not None:
                conds.append(fleet_jobs.c.holder_epoch == epoch)
        with self.engine.begin() as conn:
            return bool(conn.execute(update(fleet_jobs).where(*conds).values(**values)).rowcount)

    def claim(self, job_id: str, instance_id: str, round_number: int) -> FleetJob | None:
        """Give the job's next copy to ``instance_id`` (compare-and-set: only when no copy holds the job and
        round ``round_number`` puts it there): the epoch goes up by one. The job, or None when not claimed."""
        now = self.now()
        with self.engine.begin() as conn:
            row = conn.execute(
                update(fleet_jobs)
                .where(
                    fleet_jobs.c.job_id == job_id,
                    fleet_jobs.c.holder.is_(None),
                    fleet_jobs.c.target == instance_id,
                    fleet_jobs.c.target_round == round_number,
                    fleet_jobs.c.status.in_([FleetJobStatus.WAITING.value, FleetJobStatus.RUNNING.value]),
                )
                .values(
                    holder=instance_id,
                    epoch=fleet_jobs.c.epoch + 1,
                    holder_epoch=fleet_jobs.c.epoch + 1,
                    status=FleetJobStatus.RUNNING.value,
                    started_at=func.coalesce(fleet_jobs.c.started_at, now),
                    updated_at=now,
                )
                .returning(*fleet_jobs.c)
            ).first()
        return None if row is None else FleetJob.of(row)

    def begin_round(
        self,
        fleet: FleetRecord,
        *,
        started_at: datetime,
        ends_at: datetime,
        capacity: Mapping[str, int],
        assignment: Sequence[Mapping[str, Any]],
        allocation: Mapping[str, Any] | None,
        received: Mapping[str, Mapping[str, float]],
        active: Sequence[str],
        previous_ended_at: datetime | None,
        owed: Mapping[str, Mapping[str, float]] | None = None,
        closing: RoundCredits | None = None,
    ) -> bool:
        """Start round ``fleet.round + 1`` (compare-and-set on the fleet's round: False when another replica
        started it first): close the previous round at ``previous_ended_at``, write the new one, its
        leases as each job's target, the received seconds of ``active`` jobs, their seconds of allocation
        owed (``owed``, as of ``started_at``; None: left as they are), the credits of the previous round's
        other jobs (``closing``), and the allocation (when solved). One transaction: a boundary retried
        after a lost compare-and-set or a crash folds the same round into the same stored counts, never
        twice."""
        nxt = fleet.round + 1
        now = self.now()
        with self.engine.begin() as conn:
            values: dict[str, Any] = {
                "round": nxt,
                "round_started_at": started_at,
                "round_ends_at": ends_at,
                "updated_at": now,
                "version": fleets.c.version + 1,
            }
            if allocation is not None:  # solved: clean, unless something marked it dirty since it was read
                values.update(
                    allocation=_dumps(allocation),
                    solved_round=nxt,
                    dirty=case((fleets.c.version == fleet.version, False), else_=fleets.c.dirty),
                )
            won = conn.execute(
                update(fleets).where(fleets.c.id == fleet.id, fleets.c.round == fleet.round).values(**values)
            ).rowcount
            if not won:
                return False
            if fleet.round and previous_ended_at is not None:
                conn.execute(
                    update(fleet_rounds)
                    .where(fleet_rounds.c.fleet_id == fleet.id, fleet_rounds.c.round == fleet.round)
                    .values(ended_at=previous_ended_at)
                )
            conn.execute(
                insert(fleet_rounds).values(
                    fleet_id=fleet.id,
                    round=nxt,
                    started_at=started_at,
                    ends_at=ends_at,
                    capacity=_dumps(dict(capacity)),
                    assignment=_dumps(list(assignment)),
                    solved=allocation is not None,
                    billed=False,
                )
            )
            leases = {str(a["job_id"]): a for a in assignment}
            for job_id in active:
                lease = leases.get(job_id)
                job_values: dict[str, Any] = {
                    "received": _dumps(dict(received.get(job_id, {}))),
                    "target": None if lease is None else lease["instance"],
                    "target_gpus": None if lease is None else _dumps(list(lease["gpus"])),
                    "target_round": nxt,
                    "updated_at": now,
                }
                if owed is not None:
                    job_values["owed"] = _dumps(dict(owed.get(job_id, {})))
                    job_values["owed_at"] = started_at
                if lease is not None:
                    job_values["ever_ran"] = True
                conn.execute(update(fleet_jobs).where(fleet_jobs.c.job_id == job_id).values(**job_values))
            self._credit(conn, closing, now)
        return True

    @staticmethod
    def _credit(conn: Connection, credits: RoundCredits | None, now: datetime) -> None:
        if credits is None:
            return
        for job_id, got in credits.received.items():
            values: dict[str, Any] = {"received": _dumps(dict(got)), "updated_at": now}
            if credits.owed is not None and job_id in credits.owed:
                values["owed"] = _dumps(dict(credits.owed[job_id]))
                values["owed_at"] = credits.at
            conn.execute(update(fleet_jobs).where(fleet_jobs.c.job_id == job_id).values(**values))

    def end_round(self, fleet: FleetRecord, ended_at: datetime, closing: RoundCredits | None = None) -> bool:
        """Close the current round at ``ended_at`` without starting another (no job left to run, or the
        fleet released), writing ``closing`` (the credits of its leases) in the same transaction: False
        when the fleet moved on meanwhile (nothing written)."""
        with self.engine.begin() as conn:
            won = conn.execute(
                update(fleets)
                .where(fleets.c.id == fleet.id, fleets.c.round == fleet.round, fleets.c.version == fleet.version)
                .values(round_ends_at=ended_at, updated_at=self.now(), version=fleets.c.version + 1)
            ).rowcount
            if won and fleet.round:
                conn.execute(
                    update(fleet_rounds)
                    .where(fleet_rounds.c.fleet_id == fleet.id, fleet_rounds.c.round == fleet.round)
                    .values(ended_at=ended_at)
                )
            if won:
                self._credit(conn, closing, self.now())
        return bool(won)

    def missing_jobs(self, *, conn: Connection | None = None) -> list[tuple[str, str]]:
        """``(job id, team)`` of queued fleet jobs without their fleet row (a submission cut short between
        its two writes): the executor registers them."""
        from costopt.db.jobs_schema import jobs as jobs_table
        from costopt.fleets.model import FLEET_PROVIDER

        with self._reads(conn) as c:
            rows = c.execute(
                select(jobs_table.c.id, jobs_table.c.team_id).where(
                    jobs_table.c.provider == FLEET_PROVIDER,
                    jobs_table.c.state == "queued",
                    jobs_table.c.id.not_in(select(fleet_jobs.c.job_id)),
                )
            ).all()
        return [(str(r.id), str(r.team_id)) for r in rows]

    def mark_billed(self, fleet_id: str, number: int) -> None:
        """Round ``number`` of the fleet is in the ledger."""
        with self.engine.begin() as conn:
            conn.execute(
                update(fleet_rounds)
                .where(fleet_rounds.c.fleet_id == fleet_id, fleet_rounds.c.round == number)
                .values(billed=True)
            )

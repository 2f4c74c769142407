"""Managed jobs in the database: records and the repository every writer goes through.

:class:`JobRepository` is the one place that writes ``jobs`` and ``job_events`` (tables of
:mod:`costopt.db.jobs_schema`). Contracts:

- :meth:`JobRepository.create` is idempotent per ``(team_id, idempotency_key)``: a retried submission
  returns the first job (``created=False``), never a second one, also when two requests race (the
  unique constraint decides, the loser reads the winner).
- :meth:`JobRepository.transition` is a compare-and-set: it changes the state only from the states
  given in ``expect`` (default: any state from which the change is allowed by
  :data:`costopt.jobs.model.TRANSITIONS`), bumps ``version`` and writes the ``state`` event with its
  reason in the same transaction. A change that is not allowed raises :class:`IllegalTransition`;
  a row changed meanwhile by another writer raises :class:`ConcurrentUpdate` (re-read and decide
  again).
- Listing is ordered by ``(created_at, id)``, stable under inserts: the cursor is the last item's
  ``created_at`` and ``id``.
- ``team_id`` None in a read means "every team" (an admin); a job of another team is "not found", so
  a caller cannot tell it exists.
- Reads take an optional ``conn``: a request reads the job, its events (and the ledger) on one
  connection from :meth:`JobRepository.reading` (one pool checkout; autocommit, so no BEGIN/ROLLBACK
  round trips: each statement reads what is committed, as it does inside a READ COMMITTED transaction).
  Writes return the row they wrote (``RETURNING``), not a second read.

Times are tz-aware UTC from the repository's ``now`` (the service clock: simulated time over the
simulated cloud). Money is Decimal USD.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, and_, bindparam, false, func, insert, null, or_, select, update
from sqlalchemy.engine import Connection

from costopt.db.cursors import make_cursor, parse_cursor
from costopt.db.inlist import InList
from costopt.db.jobs_schema import job_events, jobs
from costopt.db.upserts import per_dialect
from costopt.domain import OfferKey
from costopt.errors import CostoptError
from costopt.jobs.model import JobState, can_transition
from costopt.seeded_ids import seeded_id

__all__ = [
    "ConcurrentUpdate",
    "IllegalTransition",
    "JobEvent",
    "JobNotFound",
    "JobPage",
    "JobRecord",
    "JobRepository",
    "NewJob",
    "new_job_id",
]

MAX_PAGE = 500
"""The largest page :meth:`JobRepository.page` returns."""


class JobNotFound(CostoptError, LookupError):
    """No such job (or it belongs to another team)."""


class IllegalTransition(CostoptError):
    """A state change the job model does not allow (e.g. out of a terminal state)."""


class ConcurrentUpdate(CostoptError):
    """The job changed meanwhile (another writer): re-read it and decide again."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def new_job_id() -> str:
    """A fresh job id: ``job-`` and 16 hex digits (also the migrator's and the ledger's job id)."""
    return f"job-{secrets.token_hex(8)}"


def seeded_job_id(seed: str, team_name: str, idempotency_key: str) -> str:
    """The id of the job a team submits with ``idempotency_key`` under a drill's ``seed``
    (``Settings.job_id_seed``): ``job-`` and the first 16 hex digits of a SHA-256 of the three, so two runs
    with one seed give each submission the same id (the service orders work by job id) and a retry with
    the key gets the id of the first job."""
    return seeded_id("job-", seed, team_name, idempotency_key)


def _dumps(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to insert (state ``queued``). ``spec`` is the normalized submission, ``quote`` the plan at
    submission (JSON-able; money as decimal strings)."""

    team_id: str
    spec: Mapping[str, Any]
    steps_total: int
    provider: str
    name: str = ""
    quote: Mapping[str, Any] | None = None
    batch_id: str | None = None
    idempotency_key: str | None = None
    job_id: str = field(default_factory=new_job_id)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One row of ``jobs``. ``offer``/``usd_per_hour``: the current placement (None before the first
    launch); ``steps_done``: the last progress the agent reported; ``exit_code``: the command's, when it
    ended (None: unknown or still running)."""

    id: str
    team_id: str
    batch_id: str | None
    name: str
    state: JobState
    reason: str
    spec: Mapping[str, Any]
    quote: Mapping[str, Any] | None
    provider: str
    offer: OfferKey | None
    usd_per_hour: Decimal | None
    steps_total: int
    steps_done: int
    exit_code: int | None
    idempotency_key: str | None
    version: int
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None

    @classmethod
    def of(cls, row: Any) -> JobRecord:
        return cls(
            id=row.id,
            team_id=row.team_id,
            batch_id=row.batch_id,
            name=row.name or "",
            state=JobState(row.state),
            reason=row.reason or "",
            spec=json.loads(row.spec),
            quote=json.loads(row.quote) if row.quote else None,
            provider=row.provider,
            offer=OfferKey.from_doc(json.loads(row.offer)) if row.offer else None,
            usd_per_hour=row.usd_per_hour,
            steps_total=int(row.steps_total),
            steps_done=int(row.steps_done),
            exit_code=row.exit_code,
            idempotency_key=row.idempotency_key,
            version=int(row.version),
            created_at=row.created_at,
            updated_at=row.updated_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            cancel_requested_at=row.cancel_requested_at,
        )


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One row of ``job_events``: a state change (``kind="state"``), a move, a preemption, a recovery, a
    failure... with its reason and, when known, the cost it caused (Decimal USD)."""

    id: int
    job_id: str
    at: datetime
    kind: str
    from_state: str | None
    to_state: str | None
    reason: str
    cost_usd: Decimal | None
    detail: Mapping[str, Any] | None

    @classmethod
    def of(cls, row: Any) -> JobEvent:
        return cls(
            id=int(row.id),
            job_id=row.job_id,
            at=row.at,
            kind=row.kind,
            from_state=row.from_state,
            to_state=row.to_state,
            reason=row.reason or "",
            cost_usd=row.cost_usd,
            detail=json.loads(row.detail) if row.detail else None,
        )


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of jobs; ``next_cursor`` None: the last page."""

    items: tuple[JobRecord, ...]
    next_cursor: str | None
    total: int


_GET = select(jobs).where(jobs.c.id == bindparam("b_id"))
"""The engine's hot reads, built once (SQLAlchemy reuses a statement object's cache key)."""
_IN_STATES: dict[tuple[frozenset[str], bool], Any] = {}
_WITHOUT_QUOTE = tuple(c if c.name != "quote" else null().label("quote") for c in jobs.c)
"""A job's columns with NULL for its quote (~2 KB of JSON the work lists do not read)."""
_MANY = InList(lambda cond: select(*_WITHOUT_QUOTE).where(cond), jobs.c.id, "b_ids", most=16)
"""A set of jobs by id without their quotes (a fleet's jobs at each executor pass)."""


# The request path's statements, built once: their values are parameters, so SQLAlchemy finds each one's
# compiled form in its cache without rebuilding the statement and its cache key per call (a statement
# with literal values, e.g. ``insert(jobs).values(...)``, costs more to build than to run here).
_TEAM_JOB = _GET.where(jobs.c.team_id == bindparam("b_team"))
_KEYED_JOB = select(jobs).where(jobs.c.team_id == bindparam("b_team"), jobs.c.idempotency_key == bindparam("b_key"))
_EVENTS = (
    select(job_events)
    .where(job_events.c.job_id == bindparam("b_job"), job_events.c.id > bindparam("b_after"))
    .order_by(job_events.c.id)
    .limit(bindparam("b_limit"))
)
# a retried submission's insert does nothing (the team's key is taken) instead of failing its transaction
_INSERT_JOB = per_dialect(lambda insert_of: insert_of(jobs).on_conflict_do_nothing().returning(*jobs.c))
_INSERT_EVENT = insert(job_events)
_TRANSITION = (
    update(jobs).where(jobs.c.id == bindparam("b_id"), jobs.c.version == bindparam("b_version")).returning(*jobs.c)
)
"""Compare-and-set of a job's row; the columns to set are the parameters besides ``b_*``."""
_PROGRESS = (
    update(jobs)
    .where(jobs.c.id == bindparam("b_id"), jobs.c.steps_done < bindparam("b_steps"))
    .values(steps_done=bindparam("b_steps"), updated_at=bindparam("b_now"))
)


def _in_states(values: frozenset[str], with_quote: bool) -> Any:
    stmt = _IN_STATES.get((values, with_quote))
    if stmt is None:
        # ``state = ? OR state = ? ...`` with plain bound values, not ``IN (...)``: SQLAlchemy expands a list's
        # parameters anew at every execution, and the engine runs this every tick
        cond = or_(*(jobs.c.state == v for v in sorted(values))) if values else false()
        stmt = select(*(jobs.c if with_quote else _WITHOUT_QUOTE)).where(cond).order_by(jobs.c.created_at, jobs.c.id)
        if len(_IN_STATES) < 64:
            _IN_STATES[values, with_quote] = stmt
    return stmt


@dataclass(slots=True)
class JobRepository:
    """Reads and writes managed jobs in ``engine`` (see the module doc for the contracts)."""

    engine: Engine
    now: Callable[[], datetime] = _utcnow

    # -- writes ----------------------------------------------------------------------------------------

    def create(self, new: NewJob) -> tuple[JobRecord, bool]:
        """Insert ``new`` as ``queued`` (with its ``submitted`` event) in one transaction; returns
        ``(job, created)``. With an idempotency key already used by the team, the first job is returned and
        nothing is written (also when two submissions race: the unique constraint decides, the loser
        reads the winner)."""
        if new.idempotency_key is not None:
            existing = self._by_key(new.team_id, new.idempotency_key)
            if existing is not None:
                return existing, False
        return self.insert(new)

    def insert(self, new: NewJob) -> tuple[JobRecord, bool]:
        """:meth:`create` in one transaction, without looking for the idempotency key first: the job is
        inserted unless the team's key is taken (``ON CONFLICT DO NOTHING``, which waits for a racing
        insert of the same key to commit or roll back), then its event; a taken key reads the first job
        on the same connection. Written with ``RETURNING``: nothing is read back."""
        now = self.now()
        params = {
            "id": new.job_id,
            "team_id": new.team_id,
            "batch_id": new.batch_id,
            "name": new.name,
            "state": JobState.QUEUED.value,
            "reason": "submitted",
            "spec": _dumps(new.spec),
            "quote": _dumps(new.quote) if new.quote is not None else None,
            "provider": new.provider,
            "steps_total": int(new.steps_total),
            "steps_done": 0,
            "idempotency_key": new.idempotency_key,
            "version": 0,
            "created_at": now,
            "updated_at": now,
        }
        with self.engine.begin() as conn:
            row = conn.execute(_INSERT_JOB[self.engine.dialect.name], params).first()
            if row is not None:
                self._event(conn, new.job_id, "state", None, JobState.QUEUED, "submitted", at=now)
                return JobRecord.of(row), True
            key = new.idempotency_key
            existing = None if key is None else self._by_key(new.team_id, key, conn=conn)
        if existing is None:  # the job id is taken (64 random bits): nothing was written
            raise RuntimeError(f"job id {new.job_id} is taken: submit again")
        return existing, False

    def transition(
        self,
        job_id: str,
        to: JobState,
        reason: str,
        *,
        expect: JobState | Collection[JobState] | None = None,
        cost_usd: Decimal | None = None,
        detail: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> JobRecord:
        """Change the job's state to ``to`` (compare-and-set; see the module doc), setting ``fields``
        (columns of ``jobs``: ``offer`` may be an :class:`OfferKey`) in the same write. Entering a
        terminal state sets ``finished_at``; leaving ``queued``/``launching`` for ``running`` sets
        ``started_at`` once."""
        with self.engine.begin() as conn:
            current = self.get(job_id, conn=conn)
            allowed = {expect} if isinstance(expect, JobState) else set(expect) if expect is not None else None
            if allowed is not None and current.state not in allowed:
                raise ConcurrentUpdate(
                    f"job {job_id} is {current.state.value}, expected {sorted(s.value for s in allowed)}"
                )
            if not can_transition(current.state, to):
                raise IllegalTransition(f"job {job_id} cannot go from {current.state.value} to {to.value}")
            now = self.now()
            values = self._columns(fields)
            values.update(state=to.value, reason=reason, version=current.version + 1, updated_at=now)
            if to.terminal and current.finished_at is None:
                values.setdefault("finished_at", now)
            if to is JobState.RUNNING and current.started_at is None:
                values.setdefault("started_at", now)
            row = conn.execute(_TRANSITION, {**values, "b_id": job_id, "b_version": current.version}).first()
            if row is None:
                raise ConcurrentUpdate(f"job {job_id} changed meanwhile (version {current.version}): re-read it")
            self._event(conn, job_id, "state", current.state, to, reason, at=now, cost_usd=cost_usd, detail=detail)
        return JobRecord.of(row)

    def update(self, job_id: str, **fields: Any) -> JobRecord:
        """Set columns that are not the state (``steps_done``, ``offer``, ``usd_per_hour``, ``exit_code``,
        ``quote``...): no event, no version bump (progress is written often)."""
        if "state" in fields or "version" in fields:
            raise ValueError("change the state with transition()")
        values = self._columns(fields)
        values["updated_at"] = self.now()
        with self.engine.begin() as conn:
            row = conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values).returning(*jobs.c)).first()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return JobRecord.of(row)

    def set_progress(self, job_id: str, steps_done: int) -> None:
        """Record the agent's progress; never moves it backwards (a late report of an older copy)."""
        with self.engine.begin() as conn:
            conn.execute(_PROGRESS, {"b_id": job_id, "b_steps": int(steps_done), "b_now": self.now()})

    def request_cancel(self, job_id: str, team_id: str | None = None) -> JobRecord:
        """Ask the engine to cancel the job (checkpoint, terminate, ``cancelled``); a queued job that never
        launched is cancelled at once. Idempotent; a finished job is returned unchanged."""
        job = self.get(job_id, team_id)
        if job.state.terminal or job.cancel_requested_at is not None:
            return job
        if job.state is JobState.QUEUED:
            try:
                return self.transition(job_id, JobState.CANCELLED, "cancelled before launch", expect=JobState.QUEUED)
            except ConcurrentUpdate:
                job = self.get(job_id)
        now = self.now()
        with self.engine.begin() as conn:
            row = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.cancel_requested_at.is_(None))
                .values(cancel_requested_at=now, updated_at=now)
                .returning(*jobs.c)
            ).first()
            if row is None:  # requested meanwhile by another caller: nothing to add
                return self.get(job_id, conn=conn)
            self._event(conn, job_id, "cancel_requested", None, None, "cancel requested by the team", at=now)
        return JobRecord.of(row)

    def add_event(
        self,
        job_id: str,
        kind: str,
        reason: str,
        *,
        cost_usd: Decimal | None = None,
        detail: Mapping[str, Any] | None = None,
        at: datetime | None = None,
    ) -> None:
        """Record an event that is not a state change (a move's saving, a checkpoint, an error...)."""
        with self.engine.begin() as conn:
            self._event(conn, job_id, kind, None, None, reason, at=at or self.now(), cost_usd=cost_usd, detail=detail)

    # -- reads -----------------------------------------------------------------------------------------

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """One connection for several reads (a request's: the job, its events, the ledger): one pool
        checkout, autocommit (no BEGIN/ROLLBACK round trips; each statement reads what is committed). On
        SQLite the driver opens no transaction for a read anyway, and switching its isolation level costs
        more than the read (about 0.1 ms a checkout): the connection is used as it is."""
        with self.engine.connect() as conn:
            if conn.dialect.name != "sqlite":
                conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn

    @contextmanager
    def _reads(self, conn: Connection | None) -> Iterator[Connection]:
        if conn is not None:
            yield conn
        else:
            with self.reading() as own:
                yield own

    def get(self, job_id: str, team_id: str | None = None, *, conn: Connection | None = None) -> JobRecord:
        """The job (of ``team_id`` when given); raises :class:`JobNotFound`."""
        if team_id is None:
            with self._reads(conn) as c:
                row = c.execute(_GET, {"b_id": job_id}).first()
        else:
            with self._reads(conn) as c:
                row = c.execute(_TEAM_JOB, {"b_id": job_id, "b_team": team_id}).first()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return JobRecord.of(row)

    def many(self, job_ids: Collection[str], *, conn: Connection | None = None) -> dict[str, JobRecord]:
        """The jobs of ``job_ids`` that exist, by id, in one query; an id without a job is not in the answer.
        Their ``quote`` is None (as :meth:`in_states` without it): the fleet executor's pass reads states."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        stmt, params = _MANY.bind(ids)
        with self._reads(conn) as c:
            rows = c.execute(stmt, params).all()
        return {str(r.id): JobRecord.of(r) for r in rows}

    def by_idempotency_key(self, team_id: str, key: str, *, conn: Connection | None = None) -> JobRecord | None:
        """The team's job submitted with ``key`` (None: the key was not used by the team)."""
        return self._by_key(team_id, key, conn=conn)

    def page(
        self,
        *,
        team_id: str | None = None,
        states: Iterable[JobState] | None = None,
        batch_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        conn: Connection | None = None,
    ) -> JobPage:
        """A page of jobs, oldest first (``(created_at, id)``), filtered by team, states and batch.
        ``total`` counts every job matching the filters. Raises ValueError for a bad cursor or limit."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        conds: list[Any] = []
        if team_id is not None:
            conds.append(jobs.c.team_id == team_id)
        if states is not None:
            conds.append(jobs.c.state.in_([JobState(s).value for s in states]))
        if batch_id is not None:
            conds.append(jobs.c.batch_id == batch_id)
        page_conds = list(conds)
        if cursor is not None:
            at, last_id = parse_cursor(cursor)
            page_conds.append(or_(jobs.c.created_at > at, and_(jobs.c.created_at == at, jobs.c.id > last_id)))
        query = select(jobs).where(*page_conds).order_by(jobs.c.created_at, jobs.c.id).limit(limit + 1)
        with self._reads(conn) as c:
            rows = c.execute(query).all()
            total = int(c.execute(select(func.count()).select_from(jobs).where(*conds)).scalar_one())
        items = tuple(JobRecord.of(r) for r in rows[:limit])
        next_cursor = make_cursor(items[-1].created_at, items[-1].id) if len(rows) > limit and items else None
        return JobPage(items, next_cursor, total)

    def in_states(
        self, states: Iterable[JobState], *, with_quote: bool = False, conn: Connection | None = None
    ) -> list[JobRecord]:
        """Every job in ``states`` (the engine's and the rebalancer's work lists), oldest first. Their
        ``quote`` is None unless ``with_quote``: neither reads it, and it is ~2 KB of JSON a job parsed at
        every tick (the REST views and the reports read it)."""
        query = _in_states(frozenset(JobState(s).value for s in states), with_quote)
        with self._reads(conn) as c:
            rows = c.execute(query).all()
        return [JobRecord.of(r) for r in rows]

    def events(
        self, job_id: str, *, after_id: int = 0, limit: int = MAX_PAGE, conn: Connection | None = None
    ) -> list[JobEvent]:
        """The job's events in order, those after ``after_id``."""
        with self._reads(conn) as c:
            rows = c.execute(_EVENTS, {"b_job": job_id, "b_after": int(after_id), "b_limit": int(limit)}).all()
        return [JobEvent.of(r) for r in rows]

    def events_of(
        self,
        job_ids: Sequence[str],
        *,
        kinds: Collection[str] | None = None,
        limit: int | None = MAX_PAGE,
        conn: Connection | None = None,
    ) -> dict[str, list[JobEvent]]:
        """The events of each of ``job_ids`` in order (of ``kinds`` only, when given; the first ``limit`` of
        each, by default :data:`MAX_PAGE` as :meth:`events`; None: all), in one query: a page of jobs rendered
        at once. A job without events maps to []."""
        out: dict[str, list[JobEvent]] = {j: [] for j in job_ids}
        if not out:
            return out
        conds = [job_events.c.job_id.in_(list(out))]
        if kinds is not None:
            conds.append(job_events.c.kind.in_(list(kinds)))
        with self._reads(conn) as c:
            rows = c.execute(select(job_events).where(*conds).order_by(job_events.c.job_id, job_events.c.id)).all()
        for r in rows:
            got = out[str(r.job_id)]
            if limit is None or len(got) < limit:
                got.append(JobEvent.of(r))
        return out

    def count_by_state(self) -> dict[JobState, int]:
        """How many jobs are in each state (every state present, zeros included)."""
        with self.reading() as conn:
            rows = conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all()
        out = dict.fromkeys(JobState, 0)
        for state, n in rows:
            out[JobState(state)] = int(n)
        return out

    # -- helpers ---------------------------------------------------------------------------------------

    def _by_key(self, team_id: str, key: str, *, conn: Connection | None = None) -> JobRecord | None:
        with self._reads(conn) as c:
            row = c.execute(_KEYED_JOB, {"b_team": team_id, "b_key": key}).first()
        return JobRecord.of(row) if row is not None else None

    @staticmethod
    def _columns(fields: Mapping[str, Any]) -> dict[str, Any]:
        values = dict(fields)
        unknown = set(values) - set(jobs.c.keys())
        if unknown:
            raise ValueError(f"unknown job column(s) {sorted(unknown)}")
        if isinstance(values.get("offer"), OfferKey):
            values["offer"] = _dumps(values["offer"].to_doc())
        if "quote" in values and values["quote"] is not None and not isinstance(values["quote"], str):
            values["quote"] = _dumps(values["quote"])
        if "spec" in values and not isinstance(values["spec"], str):
            values["spec"] = _dumps(values["spec"])
        return values

    @staticmethod
    def _event(
        conn: Connection,
        job_id: str,
        kind: str,
        src: JobState | None,
        dst: JobState | None,
        reason: str,
        *,
        at: datetime,
        cost_usd: Decimal | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        conn.execute(
            _INSERT_EVENT,
            {
                "job_id": job_id,
                "at": at,
                "kind": kind,
                "from_state": src.value if src is not None else None,
                "to_state": dst.value if dst is not None else None,
                "reason": reason,
                "cost_usd": cost_usd,
                "detail": _dumps(detail) if detail is not None else None,
            },
        )

"""The migrator's records: what ``migration_jobs``, ``migrations`` and ``migration_copies`` hold
(:mod:`costopt.db.migration_schema`), their states and the keys and tags derived from them.

- states: :class:`State` (a migration's, in the order a move goes through them: :data:`TRANSITIONS`),
  :class:`Kind` (move or recover), :class:`JobStatus` (a job's, as the migrator sees it),
  :class:`EndReason` (why a copy's interval ended);
- records (frozen, read from rows with ``of``): :class:`JobRecord`, :class:`MigrationRecord`,
  :class:`CopyRecord` (one copy of a job with its billed facts), and the facts a transition writes:
  :class:`CopyStart`, :class:`CopyEnd`;
- keys: :func:`launch_token` (idempotency token of one launch attempt), :func:`request_id` (the
  checkpoint request of a move), :func:`interval_key` (the ledger key of one copy); tags:
  :func:`job_tags` (:data:`TAG_MANAGED`, :data:`TAG_JOB`, :data:`TAG_EPOCH` on every instance);
- errors: :class:`MigrationError`, :class:`ConcurrentTransition`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from functools import lru_cache
from typing import Any

from sqlalchemy import and_

from costopt.cloud import ACTIVE_STATES
from costopt.db.migration_schema import migrations
from costopt.domain import OfferKey
from costopt.errors import CostoptError

TAG_MANAGED = "costopt-managed"
TAG_JOB = "costopt-job"
TAG_EPOCH = "costopt-epoch"

ALIVE_STATES = ACTIVE_STATES
"""A copy in these states may still run (and write): see :data:`costopt.cloud.ACTIVE_STATES`. A STOPPED
copy is not alive (the job is recovered elsewhere) but is still terminated as a leftover or an orphan
(:data:`costopt.cloud.HELD_STATES`): it bills for its disks."""


class State(StrEnum):
    PLANNED = "planned"
    CHECKPOINTING = "checkpointing"
    CHECKPOINTED = "checkpointed"
    LAUNCHING = "launching"
    LAUNCHED = "launched"
    VERIFYING = "verifying"
    TERMINATING_OLD = "terminating_old"
    DONE = "done"
    ROLLED_BACK = "rolled_back"


TERMINAL = (State.DONE, State.ROLLED_BACK)
TRANSITIONS: tuple[State, ...] = tuple(s for s in State if s is not State.ROLLED_BACK)
"""The states a successful move goes through, in order (the fault-injection points)."""


class Kind(StrEnum):
    MOVE = "move"
    RECOVER = "recover"


class JobStatus(StrEnum):
    PENDING = "pending"  # registered, never launched
    RUNNING = "running"
    MIGRATING = "migrating"
    RECOVERING = "recovering"  # needs a new copy from the last checkpoint
    FINISHED = "finished"


class MigrationError(CostoptError):
    """A move cannot be planned (unknown job, wrong status) or another migrator advanced it."""


class ConcurrentTransition(MigrationError):
    """The row was not in the expected state: another migrator advanced it."""


class JobFinished(MigrationError):
    """A move or recovery was asked of a job that finished meanwhile (a race with its last step)."""


RACES = (ConcurrentTransition, JobFinished)
"""What a step of one actor (engine, watcher, rebalancer) raises when another advanced the same job first:
handled, logged in one line without a traceback; the next pass looks at the job afresh."""


class EndReason(StrEnum):
    """Why a copy's interval ended (the ledger's ``end_reason``)."""

    MOVED = "moved"  # terminated once its successor was verified
    PREEMPTED = "preempted"  # taken back by the cloud
    GONE = "gone"  # exited or vanished without a preemption, the job not done
    FINISHED = "finished"  # exited after finishing the job
    FAILED_VERIFICATION = "failed_verification"  # stopped because a move's new copy did not progress
    ROLLBACK = "rollback"  # a new copy stopped because its move rolled back (a newer epoch owns the job)
    REPLACED = "replaced"  # still alive when a recovery replaced it
    FAILED_LAUNCH = "failed_launch"  # left by a launch attempt that failed
    ORPHAN = "orphan"  # a stale epoch's copy, or one of no job, terminated by the reconciler


@lru_cache(maxsize=4096)
def offer_of(text: str) -> OfferKey:
    """The offer of a stored JSON document (:meth:`OfferKey.to_doc`). Parsed once per distinct text: the
    records of a job name the same few offers in every row, and ``OfferKey`` is immutable."""
    return OfferKey.from_doc(json.loads(text))


@lru_cache(maxsize=1024)
def offers_of(text: str) -> tuple[OfferKey, ...]:
    """The offers of a stored JSON list of documents (a migration's candidates), parsed once per text."""
    return tuple(OfferKey.from_doc(d) for d in json.loads(text))


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    provider: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    checkpoint_uri: str
    epoch: int
    instance_id: str | None
    offer: OfferKey | None
    status: JobStatus
    reason: str
    image: str | None = None
    """The image its copies launch (the job's own; None: the provider's default)."""

    @classmethod
    def of(cls, row: Any) -> JobRecord:
        return cls(
            job_id=row.job_id,
            provider=row.provider,
            command=tuple(json.loads(row.command)),
            env=json.loads(row.env or "{}"),
            checkpoint_uri=row.checkpoint_uri,
            epoch=int(row.epoch),
            instance_id=row.instance_id,
            offer=offer_of(row.offer) if row.offer else None,
            status=JobStatus(row.status),
            reason=row.reason or "",
            image=row.image,
        )


@dataclass(frozen=True, slots=True)
class MigrationRecord:
    id: int
    job_id: str
    kind: Kind
    state: State
    from_epoch: int
    to_epoch: int
    old_instance_id: str | None
    new_instance_id: str | None
    request_id: str | None
    token: str | None
    offers: tuple[OfferKey, ...]
    offer_index: int
    attempts: int
    reason: str
    deadline_at: datetime | None
    checkpoint_gb: Decimal | None = None

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @classmethod
    def of(cls, row: Any) -> MigrationRecord:
        return cls(
            id=int(row.id),
            job_id=row.job_id,
            kind=Kind(row.kind),
            state=State(row.state),
            from_epoch=int(row.from_epoch),
            to_epoch=int(row.to_epoch),
            old_instance_id=row.old_instance_id,
            new_instance_id=row.new_instance_id,
            request_id=row.request_id,
            token=row.token,
            offers=offers_of(row.offers),
            offer_index=int(row.offer_index),
            attempts=int(row.attempts),
            reason=row.reason or "",
            deadline_at=row.deadline_at,
            checkpoint_gb=row.checkpoint_gb,
        )


@dataclass(frozen=True, slots=True)
class CopyRecord:
    """One copy of a job (an instance of one epoch) with the facts the ledger bills (``migration_copies``).

    ``[started_at, ended_at)`` is the ledger interval ``interval_key`` (open while ``ended_at`` is None);
    ``verified_at``: when it was first seen progressing; ``source_offer``/``egress_gb``: where the
    checkpoint it restores came from and its size (the move's egress). ``ledger_*``: what the ledger
    already holds (opened, the restart memo, closed) and the last error recording it.
    """

    interval_key: str
    job_id: str
    epoch: int
    instance_id: str
    provider: str
    offer: OfferKey
    migration_id: int | None
    source_offer: OfferKey | None
    egress_gb: Decimal | None
    started_at: datetime
    verified_at: datetime | None
    ended_at: datetime | None
    end_reason: str | None
    ledger_opened: bool
    ledger_memo: bool
    ledger_closed: bool
    ledger_error: str | None

    @property
    def synced(self) -> bool:
        """True when the ledger holds everything known about this copy."""
        memo_due = self.verified_at is not None or self.ended_at is not None
        return (
            self.ledger_opened and (self.ledger_memo or not memo_due) and (self.ledger_closed or self.ended_at is None)
        )

    @classmethod
    def of(cls, row: Any) -> CopyRecord:
        return cls(
            interval_key=row.interval_key,
            job_id=row.job_id,
            epoch=int(row.epoch),
            instance_id=row.instance_id,
            provider=row.provider,
            offer=offer_of(row.offer),
            migration_id=None if row.migration_id is None else int(row.migration_id),
            source_offer=offer_of(row.source_offer) if row.source_offer else None,
            egress_gb=row.egress_gb,
            started_at=row.started_at,
            verified_at=row.verified_at,
            ended_at=row.ended_at,
            end_reason=row.end_reason,
            ledger_opened=bool(row.ledger_opened),
            ledger_memo=bool(row.ledger_memo),
            ledger_closed=bool(row.ledger_closed),
            ledger_error=row.ledger_error,
        )


@dataclass(frozen=True, slots=True)
class CopyStart:
    """A copy just launched (written with the transition to ``launched``)."""

    job_id: str
    epoch: int
    instance_id: str
    offer: OfferKey
    started_at: datetime
    migration_id: int | None = None
    source_offer: OfferKey | None = None
    egress_gb: Decimal | None = None


@dataclass(frozen=True, slots=True)
class CopyEnd:
    """A copy found ended (written with the transition that ended it). ``offer``/``launched_at`` (from
    the provider) are only used when no row of the copy exists yet (an orphan nobody recorded)."""

    job_id: str
    epoch: int
    instance_id: str
    offer: OfferKey | None
    launched_at: datetime | None
    ended_at: datetime
    reason: EndReason


def launch_token(job_id: str, epoch: int, attempt: int) -> str:
    """The idempotency token of one launch attempt: derived from job id, epoch and attempt number
    (at most 64 characters, AWS's ClientToken limit)."""
    raw = f"costopt:{job_id}:e{epoch}:a{attempt}"
    if len(raw) <= 64:
        return raw
    return f"costopt:{hashlib.sha256(raw.encode()).hexdigest()[:40]}:e{epoch}:a{attempt}"[:64]


def request_id(job_id: str, epoch: int) -> str:
    """The id of the checkpoint request of the move to ``epoch`` (stored before it is sent)."""
    raw = f"mig-{job_id}-e{epoch}"
    return raw if len(raw) <= 64 else f"mig-{hashlib.sha256(raw.encode()).hexdigest()[:40]}-e{epoch}"


def interval_key(provider: str, job_id: str, epoch: int, instance_id: str) -> str:
    """The ledger key of one copy: provider, job, epoch and instance (at most 255 characters)."""
    raw = f"{provider}:{job_id}:e{epoch}:{instance_id}"
    if len(raw) <= 255:
        return raw
    return f"{provider[:32]}:{hashlib.sha256(raw.encode()).hexdigest()[:40]}:e{epoch}:{instance_id}"[:255]


def job_tags(job_id: str, epoch: int) -> dict[str, str]:
    return {TAG_MANAGED: "true", TAG_JOB: job_id, TAG_EPOCH: str(epoch)}


def active_condition() -> Any:
    """The SQL condition of the migrations not finished yet (neither done nor rolled back).

    Written as ``state != 'done' AND state != 'rolled_back'`` (plain bound values) rather than ``NOT IN
    (...)``: SQLAlchemy expands a list's parameters anew at every execution (~15-20 µs a statement, and
    these statements run several times per migration); the rows are the same."""
    return and_(*(migrations.c.state != v for v in sorted(s.value for s in TERMINAL)))

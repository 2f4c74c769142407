"""The migration execution state machine: move one job, or recover it, persisted and crash-safe.

A move goes through::

    planned -> checkpointing -> checkpointed -> launching -> launched -> verifying -> terminating_old -> done

and a failure ends it in ``rolled_back`` with a reason (the job keeps running on its old copy, or is
marked ``recovering`` when the old copy can no longer run). A recovery (after a preemption: the old
copy is gone) skips the checkpoint request: ``planned`` terminates whatever is left of the old copy
(idempotent) and goes straight to ``checkpointed``: the new epoch restores the last checkpoint.

Every state is a row in ``migrations`` (:mod:`costopt.db.migration_schema`); every transition is a
compare-and-set on that row, committed *before* the next side effect, and every side effect is
idempotent, so :meth:`Migrator.resume` continues from whatever state a crash left:

- ``planned``: the checkpoint request id is stored in the row; repeating the request is a no-op for
  the agent;
- ``launching``: the idempotency token (job id + epoch + attempt) is stored before ``launch`` is
  called; a crash after ``launch`` returned but before the instance id was saved calls ``launch``
  again with the same token, and the provider returns the same instance. Before a new attempt (next
  offer) every instance left by an earlier attempt of the same epoch is terminated, so an ambiguous
  failure never leaves two copies of one epoch;
- ``launched``: :func:`costopt.agent.control.claim_epoch` (idempotent) raises the fencing marker, in
  the same transaction the job's epoch and instance move to the new copy. From then on the old copy
  cannot publish a checkpoint (the agent's fencing), so two copies never both write;
- ``verifying``: the new copy restored and is progressing (``control.progress(uri, epoch)``);
- ``terminating_old``: ``terminate`` is idempotent.

The epoch is claimed only *after* a successful launch, so a move whose launches all fail leaves the
old copy running, unfenced: that is the rollback. A new copy that does not progress is terminated and
the job is marked ``recovering`` (its old copy is fenced by then).

Fault injection: ``hook(point)`` is called after each committed transition (``"enter:<state>"``) and
right after ``launch`` returned (``"launch:returned"``). The default hook SIGKILLs this process when
``COSTOPT_MIGRATOR_KILL_AT`` names the point (the crash tests run the migrator in a subprocess).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine, insert, select, update

from costopt.agent import control
from costopt.agent.contract import contract_env
from costopt.agent.errors import StaleEpoch
from costopt.cloud import CloudError, CloudProvider, InstanceState, LaunchSpec, NotFoundError
from costopt.db.migration_schema import migration_jobs, migrations
from costopt.domain import Cloud, Market, OfferKey
from costopt.errors import CostoptError

log = logging.getLogger("costopt.migration.machine")

ENV_KILL_AT = "COSTOPT_MIGRATOR_KILL_AT"

TAG_MANAGED = "costopt-managed"
TAG_JOB = "costopt-job"
TAG_EPOCH = "costopt-epoch"

ALIVE_STATES = (InstanceState.PENDING, InstanceState.RUNNING, InstanceState.STOPPING)


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


# -- records ------------------------------------------------------------------------------------------


def offer_to_doc(offer: OfferKey) -> dict[str, str]:
    return {
        "cloud": offer.cloud.value,
        "region": offer.region,
        "zone": offer.zone,
        "instance_type": offer.instance_type,
        "market": offer.market.value,
    }


def offer_from_doc(doc: Mapping[str, str]) -> OfferKey:
    return OfferKey(Cloud(doc["cloud"]), doc["region"], doc["zone"], doc["instance_type"], Market(doc["market"]))


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
            offer=offer_from_doc(json.loads(row.offer)) if row.offer else None,
            status=JobStatus(row.status),
            reason=row.reason or "",
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
            offers=tuple(offer_from_doc(d) for d in json.loads(row.offers)),
            offer_index=int(row.offer_index),
            attempts=int(row.attempts),
            reason=row.reason or "",
            deadline_at=row.deadline_at,
        )


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


def job_tags(job_id: str, epoch: int) -> dict[str, str]:
    return {TAG_MANAGED: "true", TAG_JOB: job_id, TAG_EPOCH: str(epoch)}


def env_kill_hook(point: str) -> None:
    """SIGKILL this process at the point named by ``COSTOPT_MIGRATOR_KILL_AT`` (fault injection)."""
    if os.environ.get(ENV_KILL_AT) == point:
        log.warning("fault injection: SIGKILL at %s", point)
        os.kill(os.getpid(), signal.SIGKILL)


def _utcnow() -> datetime:
    return datetime.now(UTC)


# -- the migrator -------------------------------------------------------------------------------------


@dataclass(slots=True)
class Migrator:
    """Runs moves and recoveries of jobs on one provider, persisted in ``engine``.

    - ``checkpoint_timeout``: how long the old copy has to answer the checkpoint request;
    - ``verify_timeout``: how long the new copy has to restore and progress;
    - ``backoff``: seconds before the n-th retry on another offer: ``min(cap, base * 2**n)``;
    - ``hook``: fault-injection hook (see the module doc).
    """

    engine: Engine
    provider: CloudProvider
    checkpoint_timeout: float = 60.0
    verify_timeout: float = 60.0
    poll_seconds: float = 0.05
    backoff_base: float = 0.1
    backoff_cap: float = 5.0
    sleep: Callable[[float], None] = time.sleep
    now: Callable[[], datetime] = _utcnow
    hook: Callable[[str], None] = env_kill_hook
    image: str | None = None

    # -- jobs ------------------------------------------------------------------------------------------

    def register_job(
        self, job_id: str, command: Sequence[str], checkpoint_uri: str, *, env: Mapping[str, str] | None = None
    ) -> JobRecord:
        """Register a job (idempotent: an existing job is returned unchanged)."""
        with self.engine.begin() as conn:
            row = conn.execute(select(migration_jobs).where(migration_jobs.c.job_id == job_id)).first()
            if row is None:
                conn.execute(
                    insert(migration_jobs).values(
                        job_id=job_id,
                        provider=self.provider.name,
                        command=json.dumps(list(command)),
                        env=json.dumps(dict(env or {})),
                        checkpoint_uri=checkpoint_uri,
                        epoch=0,
                        status=JobStatus.PENDING.value,
                        reason="registered",
                        updated_at=self.now(),
                    )
                )
        return self.job(job_id)

    def job(self, job_id: str) -> JobRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(migration_jobs).where(migration_jobs.c.job_id == job_id)).first()
        if row is None:
            raise MigrationError(f"unknown job {job_id!r}")
        return JobRecord.of(row)

    def jobs(self) -> list[JobRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(migration_jobs).order_by(migration_jobs.c.job_id)).all()
        return [JobRecord.of(r) for r in rows]

    def _set_job(self, conn: Any, job_id: str, **values: Any) -> None:
        values["updated_at"] = self.now()
        if isinstance(values.get("status"), JobStatus):
            values["status"] = values["status"].value
        conn.execute(update(migration_jobs).where(migration_jobs.c.job_id == job_id).values(**values))

    # -- migrations ------------------------------------------------------------------------------------

    def migration(self, migration_id: int) -> MigrationRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(migrations).where(migrations.c.id == migration_id)).first()
        if row is None:
            raise MigrationError(f"unknown migration {migration_id}")
        return MigrationRecord.of(row)

    def active_migration(self, job_id: str) -> MigrationRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(migrations)
                .where(migrations.c.job_id == job_id, migrations.c.state.notin_([s.value for s in TERMINAL]))
                .order_by(migrations.c.id)
            ).first()
        return MigrationRecord.of(row) if row is not None else None

    def active_migrations(self) -> list[MigrationRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(migrations)
                .where(migrations.c.state.notin_([s.value for s in TERMINAL]))
                .order_by(migrations.c.id)
            ).all()
        return [MigrationRecord.of(r) for r in rows]

    def history(self, job_id: str) -> list[MigrationRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(migrations).where(migrations.c.job_id == job_id).order_by(migrations.c.id)).all()
        return [MigrationRecord.of(r) for r in rows]

    def plan(self, job_id: str, offers: Sequence[OfferKey], kind: Kind = Kind.MOVE) -> MigrationRecord:
        """Persist a planned move (or recovery) of ``job_id`` to the first offer that launches.

        Idempotent per job: while a migration of the job is active, that one is returned.
        """
        if not offers:
            raise MigrationError("a migration needs at least one candidate offer")
        with self.engine.begin() as conn:
            active = conn.execute(
                select(migrations).where(
                    migrations.c.job_id == job_id, migrations.c.state.notin_([s.value for s in TERMINAL])
                )
            ).first()
            if active is not None:
                return MigrationRecord.of(active)
            row = conn.execute(select(migration_jobs).where(migration_jobs.c.job_id == job_id)).first()
            if row is None:
                raise MigrationError(f"unknown job {job_id!r}")
            job = JobRecord.of(row)
            if job.status is JobStatus.FINISHED:
                raise MigrationError(f"job {job_id!r} has finished")
            if kind is Kind.MOVE and (job.status is not JobStatus.RUNNING or job.instance_id is None):
                raise MigrationError(f"job {job_id!r} is {job.status.value}, not running: recover it instead")
            marker = control.current_epoch(job.checkpoint_uri)
            to_epoch = max(job.epoch, marker) + 1
            now = self.now()
            result = conn.execute(
                insert(migrations).values(
                    job_id=job_id,
                    kind=kind.value,
                    state=State.PLANNED.value,
                    from_epoch=job.epoch,
                    to_epoch=to_epoch,
                    old_instance_id=job.instance_id,
                    request_id=request_id(job_id, to_epoch),
                    offers=json.dumps([offer_to_doc(o) for o in offers]),
                    offer_index=0,
                    attempts=0,
                    reason="",
                    created_at=now,
                    updated_at=now,
                )
            )
            pk = result.inserted_primary_key
            assert pk is not None
            mid = int(pk[0])
            self._set_job(conn, job_id, status=JobStatus.MIGRATING if kind is Kind.MOVE else JobStatus.RECOVERING)
        self.hook(f"enter:{State.PLANNED.value}")
        return self.migration(mid)

    def move(self, job_id: str, offers: Sequence[OfferKey]) -> MigrationRecord:
        """Plan and run a move of a running job; returns the finished migration (done or rolled back)."""
        return self.run(self.plan(job_id, offers, Kind.MOVE).id)

    def recover(self, job_id: str, offers: Sequence[OfferKey]) -> MigrationRecord:
        """Launch a new epoch from the last checkpoint at once (the old copy is gone, e.g. preempted).
        Also starts a registered job that never ran (epoch 1, from scratch)."""
        return self.run(self.plan(job_id, offers, Kind.RECOVER).id)

    start = recover

    def resume(self, job_id: str | None = None) -> list[MigrationRecord]:
        """Continue every active migration (of ``job_id``, or all) from the state its row records."""
        out = []
        for mig in self.active_migrations():
            if job_id is None or mig.job_id == job_id:
                out.append(self.run(mig.id))
        return out

    def run(self, migration_id: int) -> MigrationRecord:
        """Drive one migration until it is done or rolled back."""
        mig = self.migration(migration_id)
        while not mig.finished:
            step = getattr(self, f"_step_{mig.state.value}")
            mig = step(mig)
        return mig

    # -- transitions -----------------------------------------------------------------------------------

    def _advance(
        self, mig: MigrationRecord, state: State, *, job: Mapping[str, Any] | None = None, **values: Any
    ) -> MigrationRecord:
        """Compare-and-set the row from ``mig.state`` to ``state`` (and the job, in the same transaction)."""
        values = {k: (v.value if isinstance(v, StrEnum) else v) for k, v in values.items()}
        with self.engine.begin() as conn:
            res = conn.execute(
                update(migrations)
                .where(migrations.c.id == mig.id, migrations.c.state == mig.state.value)
                .values(state=state.value, updated_at=self.now(), **values)
            )
            if res.rowcount != 1:
                raise ConcurrentTransition(f"migration {mig.id} is no longer {mig.state.value}")
            if job:
                self._set_job(conn, mig.job_id, **job)
        log.info("migration %d (%s): %s -> %s %s", mig.id, mig.job_id, mig.state.value, state.value, values or "")
        if state is not mig.state:
            self.hook(f"enter:{state.value}")
        return self.migration(mig.id)

    def _rollback(self, mig: MigrationRecord, reason: str, *, job: Mapping[str, Any]) -> MigrationRecord:
        log.warning("migration %d (%s) rolled back: %s", mig.id, mig.job_id, reason)
        return self._advance(mig, State.ROLLED_BACK, reason=reason, job={**job, "reason": reason})

    def _deadline(self, seconds: float) -> datetime:
        return self.now() + timedelta(seconds=seconds)

    def _alive(self, instance_id: str | None) -> bool:
        if instance_id is None:
            return False
        try:
            return self.provider.describe(instance_id).state in ALIVE_STATES
        except NotFoundError:
            return False

    # planned: ask the old copy for a checkpoint (move) or make sure it is gone (recover).
    def _step_planned(self, mig: MigrationRecord) -> MigrationRecord:
        job = self.job(mig.job_id)
        if mig.kind is Kind.RECOVER:
            if mig.old_instance_id is not None:
                self.provider.terminate(mig.old_instance_id)
            return self._advance(mig, State.CHECKPOINTED, reason="recovery: old copy gone")
        assert mig.request_id is not None
        control.request_checkpoint(
            job.checkpoint_uri, epoch=mig.from_epoch, request_id=mig.request_id, reason=f"migration {mig.id}"
        )
        return self._advance(mig, State.CHECKPOINTING, deadline_at=self._deadline(self.checkpoint_timeout))

    # checkpointing: wait until the old copy has answered the request.
    def _step_checkpointing(self, mig: MigrationRecord) -> MigrationRecord:
        job = self.job(mig.job_id)
        assert mig.request_id is not None
        deadline = mig.deadline_at or self._deadline(self.checkpoint_timeout)
        while True:
            if control.request_served(job.checkpoint_uri, mig.request_id):
                return self._advance(mig, State.CHECKPOINTED, deadline_at=None)
            if control.progress(job.checkpoint_uri, mig.from_epoch).done:
                return self._rollback(
                    mig, "the job finished before it could be moved", job={"status": JobStatus.FINISHED}
                )
            if not self._alive(mig.old_instance_id):
                # Preempted (or gone) during the move: continue from the last checkpoint at once.
                return self._advance(
                    mig, State.CHECKPOINTED, deadline_at=None, reason="old copy gone while checkpointing"
                )
            if self.now() >= deadline:
                return self._rollback(
                    mig,
                    f"checkpoint request {mig.request_id} not served within {self.checkpoint_timeout:g} s; "
                    "the old copy keeps running",
                    job={"status": JobStatus.RUNNING},
                )
            self.sleep(self.poll_seconds)

    # checkpointed: choose the attempt's token and store it before any launch call.
    def _step_checkpointed(self, mig: MigrationRecord) -> MigrationRecord:
        return self._advance(
            mig, State.LAUNCHING, token=launch_token(mig.job_id, mig.to_epoch, mig.attempts), deadline_at=None
        )

    def _spec(self, job: JobRecord, mig: MigrationRecord, offer: OfferKey) -> LaunchSpec:
        env = {**job.env, **contract_env(job.job_id, job.checkpoint_uri, mig.to_epoch)}
        return LaunchSpec(
            offer=offer, command=job.command, env=env, tags=job_tags(job.job_id, mig.to_epoch), image=self.image
        )

    def _terminate_epoch_leftovers(self, job_id: str, epoch: int, keep: str | None = None) -> list[str]:
        gone = []
        for inst in self.provider.list({TAG_JOB: job_id, TAG_EPOCH: str(epoch)}):
            if inst.instance_id != keep and inst.state in ALIVE_STATES:
                self.provider.terminate(inst.instance_id)
                gone.append(inst.instance_id)
        return gone

    # launching: launch with the stored token; on failure back off and try the next offer.
    def _step_launching(self, mig: MigrationRecord) -> MigrationRecord:
        job = self.job(mig.job_id)
        assert mig.token is not None
        offer = mig.offers[mig.offer_index]
        try:
            inst = self.provider.launch(self._spec(job, mig, offer), mig.token)
        except CloudError as exc:
            reason = f"launch on {offer} failed: {type(exc).__name__}: {exc}"
            log.warning("migration %d: %s", mig.id, reason)
            # An ambiguous failure may have left an instance: never two copies of one epoch.
            self._terminate_epoch_leftovers(mig.job_id, mig.to_epoch)
            nxt = mig.offer_index + 1
            if nxt >= len(mig.offers):
                all_reason = f"launch failed on all {len(mig.offers)} offer(s); last: {reason}"
                if mig.kind is Kind.MOVE:
                    return self._rollback(
                        mig, all_reason + "; the old copy keeps running", job={"status": JobStatus.RUNNING}
                    )
                return self._rollback(mig, all_reason, job={"status": JobStatus.RECOVERING})
            self.sleep(min(self.backoff_cap, self.backoff_base * 2**mig.attempts))
            return self._advance(
                mig,
                State.LAUNCHING,
                offer_index=nxt,
                attempts=mig.attempts + 1,
                token=launch_token(mig.job_id, mig.to_epoch, mig.attempts + 1),
                reason=reason,
            )
        self.hook("launch:returned")
        return self._advance(mig, State.LAUNCHED, new_instance_id=inst.instance_id)

    # launched: fence (claim the new epoch) and hand the job to the new copy, atomically in the row.
    def _step_launched(self, mig: MigrationRecord) -> MigrationRecord:
        job = self.job(mig.job_id)
        try:
            control.claim_epoch(job.checkpoint_uri, mig.to_epoch)
        except StaleEpoch as exc:
            if mig.new_instance_id:
                self.provider.terminate(mig.new_instance_id)
            return self._rollback(mig, f"a newer epoch owns the job ({exc})", job={"status": JobStatus.RECOVERING})
        offer = mig.offers[mig.offer_index]
        return self._advance(
            mig,
            State.VERIFYING,
            deadline_at=self._deadline(self.verify_timeout),
            job={
                "epoch": mig.to_epoch,
                "instance_id": mig.new_instance_id,
                "offer": json.dumps(offer_to_doc(offer)),
            },
        )

    # verifying: the new copy restored and is progressing (or finished the job).
    def _step_verifying(self, mig: MigrationRecord) -> MigrationRecord:
        job = self.job(mig.job_id)
        deadline = mig.deadline_at or self._deadline(self.verify_timeout)
        while True:
            prog = control.progress(job.checkpoint_uri, mig.to_epoch)
            if prog.progressing or prog.done:
                return self._advance(mig, State.TERMINATING_OLD, deadline_at=None)
            gone = not self._alive(mig.new_instance_id)
            if gone or self.now() >= deadline:
                prog = control.progress(job.checkpoint_uri, mig.to_epoch)  # it may have just finished
                if prog.progressing or prog.done:
                    continue
                why = "exited" if gone else f"did not progress within {self.verify_timeout:g} s"
                # The new epoch is claimed: the old copy is fenced and can only waste work. Stop both;
                # the job is recovered from the last checkpoint by a new epoch.
                for iid in (mig.new_instance_id, mig.old_instance_id):
                    if iid is not None:
                        self.provider.terminate(iid)
                return self._rollback(
                    mig,
                    f"new copy {mig.new_instance_id} (epoch {mig.to_epoch}) {why}; the job needs recovery",
                    job={"status": JobStatus.RECOVERING},
                )
            self.sleep(self.poll_seconds)

    # terminating_old: idempotent.
    def _step_terminating_old(self, mig: MigrationRecord) -> MigrationRecord:
        if mig.old_instance_id is not None and mig.old_instance_id != mig.new_instance_id:
            self.provider.terminate(mig.old_instance_id)
        # Anything else tagged with an older epoch of this job is an orphan by now.
        for epoch in range(1, mig.to_epoch):
            self._terminate_epoch_leftovers(mig.job_id, epoch)
        return self._advance(
            mig, State.DONE, job={"status": JobStatus.RUNNING, "reason": f"{mig.kind.value} {mig.id} done"}
        )

    def reconcile(self) -> ReconcileReport:
        return reconcile(self.engine, self.provider)


# -- the reconciler -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    orphans_terminated: tuple[str, ...]
    marked_for_recovery: tuple[str, ...]
    finished: tuple[str, ...]


def reconcile(engine: Engine, provider: CloudProvider, *, dry_run: bool = False) -> ReconcileReport:
    """List the instances carrying costopt's tags on ``provider``; terminate orphans (no job, an epoch
    below the job's, or an epoch no active migration launched); mark jobs whose instance vanished for
    recovery (or finished, when the copy wrote its ``done`` record)."""
    with engine.connect() as conn:
        jobs = {r.job_id: JobRecord.of(r) for r in conn.execute(select(migration_jobs)).all()}
        active = {
            r.job_id: MigrationRecord.of(r)
            for r in conn.execute(
                select(migrations).where(migrations.c.state.notin_([s.value for s in TERMINAL]))
            ).all()
        }
    orphans: list[str] = []
    for inst in provider.list({TAG_MANAGED: "true"}):
        if inst.state not in ALIVE_STATES:
            continue
        job = jobs.get(inst.tags.get(TAG_JOB, ""))
        try:
            epoch = int(inst.tags.get(TAG_EPOCH, "-1"))
        except ValueError:
            epoch = -1
        mig = active.get(job.job_id) if job else None
        if job is None:
            why = "no such job"
        elif epoch < job.epoch:
            why = f"stale epoch {epoch} < {job.epoch}"
        elif mig is not None and epoch in (mig.from_epoch, mig.to_epoch):
            continue  # in flight: the migrator owns it
        elif epoch > job.epoch:
            why = f"epoch {epoch} launched by no active migration"
        elif inst.instance_id != job.instance_id:
            why = f"a second copy of epoch {epoch}"
        else:
            continue
        log.warning("orphan %s (%s): terminating", inst.instance_id, why)
        orphans.append(inst.instance_id)
        if not dry_run:
            provider.terminate(inst.instance_id)

    recover: list[str] = []
    finished: list[str] = []
    for job in jobs.values():
        if job.status is not JobStatus.RUNNING or job.job_id in active or job.instance_id is None:
            continue
        try:
            state: InstanceState | None = provider.describe(job.instance_id).state
        except NotFoundError:
            state = None
        if state in ALIVE_STATES:
            continue
        if control.progress(job.checkpoint_uri, job.epoch).done:
            finished.append(job.job_id)
            status, reason = JobStatus.FINISHED, f"instance {job.instance_id} finished the job"
        else:
            recover.append(job.job_id)
            status, reason = JobStatus.RECOVERING, f"instance {job.instance_id} vanished ({state or 'not found'})"
        if not dry_run:
            with engine.begin() as conn:
                conn.execute(
                    update(migration_jobs)
                    .where(migration_jobs.c.job_id == job.job_id, migration_jobs.c.status == JobStatus.RUNNING.value)
                    .values(status=status.value, reason=reason, updated_at=_utcnow())
                )
    return ReconcileReport(tuple(orphans), tuple(recover), tuple(finished))

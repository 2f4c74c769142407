"""The reconciler: one pass over a provider's instances against the migrator's records.

:func:`reconcile` terminates orphans (instances of no job, of an epoch below the job's, or of an epoch
no active migration launched), marks jobs whose instance vanished for recovery (or finished, when their
copy wrote its ``done`` record), closes every copy it finds ended in ``migration_copies`` and syncs the
ledger (:mod:`costopt.migration.ledger_sync`). It runs as a scheduled job in the service
(``api.scheduler``) and at the end of a drill; :meth:`Migrator.reconcile
<costopt.migration.machine.Migrator.reconcile>` runs it on the migrator's provider.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine, select, update

from costopt.cloud import HELD_STATES, CloudProvider
from costopt.db.migration_schema import migration_jobs, migrations
from costopt.ledger.book import Ledger
from costopt.migration.ledger_sync import (
    LedgerSync,
    copies,
    copy_end,
    describe_or_none,
    end_reason_of,
    mark_preempted,
    sync_ledger,
    write_copy_end,
)
from costopt.migration.records import (
    ALIVE_STATES,
    TAG_EPOCH,
    TAG_JOB,
    TAG_MANAGED,
    CopyEnd,
    EndReason,
    JobRecord,
    JobStatus,
    MigrationRecord,
    active_condition,
    interval_key,
)
from costopt.migration.unavailable import UnavailableOffers
from costopt.planning.model import DEFAULT_EGRESS, EgressRates

log = logging.getLogger("costopt.migration.reconcile")


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What a reconciler pass did. ``copies_closed``: interval keys of copies it found ended (orphans
    included); ``ledger``: the ledger sync after it (None without a ledger)."""

    orphans_terminated: tuple[str, ...]
    marked_for_recovery: tuple[str, ...]
    finished: tuple[str, ...]
    copies_closed: tuple[str, ...] = ()
    ledger: LedgerSync | None = None


def reconcile(
    engine: Engine,
    provider: CloudProvider,
    *,
    dry_run: bool = False,
    ledger: Ledger | None = None,
    unavailable: UnavailableOffers | None = None,
    egress: EgressRates = DEFAULT_EGRESS,
    now: Callable[[], datetime] = _utcnow,
    job_id: str | None = None,
) -> ReconcileReport:
    """List the instances carrying costopt's tags on ``provider``; terminate orphans (no job, an epoch
    below the job's, or an epoch no active migration launched); mark this provider's jobs (registered
    with its name) whose instance vanished for recovery (or finished, when the copy wrote its ``done``
    record).

    ``job_id``: that job alone (its instance and open copies, its ledger lines), with no listing and no
    orphan sweep: the job engine's close of one finished job's copy, which ran the whole pass (every
    instance listed, every job's row read, every open copy described, the whole ledger synced) once per
    finished job, its cost growing with the history (docs/reliability.md "Soak", session 11).

    Billing: every copy it finds ended (orphans it terminated, a job's vanished instance, any recorded
    copy of a job without an active migration that is no longer alive) is closed in
    ``migration_copies`` with the provider's end time, then the ledger is synced (when given). A copy
    found preempted marks its offer in ``unavailable`` (when given). ``now``: the service clock (tz-aware
    UTC; the simulated cloud's time over it), the end of a copy whose provider does not know it."""
    clock = now
    now_at = clock()
    pname = provider.name
    only = job_id  # (the orphans' loop below binds ``job_id`` to each orphan's tag)
    jobs_query, active_query = select(migration_jobs), select(migrations).where(active_condition())
    if only is not None:
        jobs_query = jobs_query.where(migration_jobs.c.job_id == only)
        active_query = active_query.where(migrations.c.job_id == only)
    with engine.connect() as conn:
        jobs = {r.job_id: JobRecord.of(r) for r in conn.execute(jobs_query).all()}
        active = {r.job_id: MigrationRecord.of(r) for r in conn.execute(active_query).all()}
    ends: list[CopyEnd] = []
    orphans: list[str] = []
    for inst in provider.list({TAG_MANAGED: "true"}) if only is None else ():
        if inst.state not in HELD_STATES:
            continue  # ended (a preempted copy is the cloud's to remove); a STOPPED one still bills
        job = jobs.get(inst.tags.get(TAG_JOB, ""))
        try:
            epoch = int(inst.tags.get(TAG_EPOCH, "-1"))
        except ValueError:
            epoch = -1
        why = _orphan_reason(job, active.get(job.job_id) if job else None, epoch, inst.instance_id)
        if why is not None:
            # The snapshot was read before the list: another service replica may have registered the job,
            # started a migration (token stored, instance id not saved yet) or finished one since. Only
            # what is still an orphan in the database now is one.
            job, mig = _fresh(engine, inst.tags.get(TAG_JOB, ""))
            why = _orphan_reason(job, mig, epoch, inst.instance_id)
        if why is None:
            continue
        log.warning("orphan %s (%s): terminating", inst.instance_id, why)
        orphans.append(inst.instance_id)
        if not dry_run:
            provider.terminate(inst.instance_id)
            gone = describe_or_none(provider, inst.instance_id) or inst
            job_id = inst.tags.get(TAG_JOB) or "(untagged)"
            ends.append(copy_end(gone, job_id, epoch, inst.instance_id, EndReason.ORPHAN, clock()))

    recover: list[str] = []
    finished: list[str] = []
    for job in jobs.values():
        if job.status is not JobStatus.RUNNING or job.job_id in active or job.instance_id is None:
            continue
        if job.provider != pname:
            continue  # another provider's job: its instance is not this provider's to describe
        found = describe_or_none(provider, job.instance_id)
        state = found.state if found is not None else None
        if state in ALIVE_STATES:
            continue
        end_reason = end_reason_of(found, job.checkpoint_uri, job.epoch)
        if end_reason is EndReason.FINISHED:
            finished.append(job.job_id)
            status, reason = JobStatus.FINISHED, f"instance {job.instance_id} finished the job"
        else:
            recover.append(job.job_id)
            status, reason = JobStatus.RECOVERING, f"instance {job.instance_id} vanished ({state or 'not found'})"
        if not dry_run:
            with engine.begin() as conn:
                changed = conn.execute(
                    update(migration_jobs)
                    .where(
                        migration_jobs.c.job_id == job.job_id,
                        migration_jobs.c.status == JobStatus.RUNNING.value,
                        # unchanged since the snapshot (another replica may have moved it meanwhile)
                        migration_jobs.c.epoch == job.epoch,
                        migration_jobs.c.instance_id == job.instance_id,
                    )
                    .values(status=status.value, reason=reason, updated_at=clock())
                ).rowcount
            if changed != 1:
                (finished if end_reason is EndReason.FINISHED else recover).remove(job.job_id)
                continue
            ends.append(copy_end(found, job.job_id, job.epoch, job.instance_id, end_reason, clock()))

    # Any other recorded copy still open whose instance is gone (jobs in flight are their migrator's).
    seen = {e.instance_id for e in ends}
    for copy in copies(engine, only, open_only=True):
        if copy.job_id in active or copy.instance_id in seen or copy.provider != pname:
            continue
        found = describe_or_none(provider, copy.instance_id)
        if found is not None and found.state in ALIVE_STATES:
            continue
        if _fresh(engine, copy.job_id)[1] is not None:
            continue  # a migration started since the snapshot (another replica): its migrator closes it
        job = jobs.get(copy.job_id)
        reason = end_reason_of(found, job.checkpoint_uri if job else None, copy.epoch)
        ends.append(copy_end(found, copy.job_id, copy.epoch, copy.instance_id, reason, now_at))

    closed: list[str] = []
    if not dry_run:
        for end in ends:
            mark_preempted(unavailable, end)
            with engine.begin() as conn:
                if write_copy_end(conn, pname, end, clock()):
                    closed.append(interval_key(pname, end.job_id, end.epoch, end.instance_id))
    synced = sync_ledger(engine, ledger, job_id=only, egress=egress) if ledger is not None and not dry_run else None
    return ReconcileReport(tuple(orphans), tuple(recover), tuple(finished), tuple(closed), synced)


def _orphan_reason(job: JobRecord | None, mig: MigrationRecord | None, epoch: int, instance_id: str) -> str | None:
    """Why an instance of ``job`` tagged ``epoch`` is an orphan (None: it is not). ``mig``: the job's active
    migration; an instance of one of its epochs is in flight (its migrator owns it, e.g. launched with
    the token stored and the instance id not saved yet)."""
    if job is None:
        return "no such job"
    if epoch < job.epoch:
        return f"stale epoch {epoch} < {job.epoch}"
    if mig is not None and epoch in (mig.from_epoch, mig.to_epoch):
        return None
    if epoch > job.epoch:
        return f"epoch {epoch} launched by no active migration"
    if instance_id != job.instance_id:
        return f"a second copy of epoch {epoch}"
    return None


def _fresh(engine: Engine, job_id: str) -> tuple[JobRecord | None, MigrationRecord | None]:
    """The job and its active migration as the database holds them now."""
    with engine.connect() as conn:
        row = conn.execute(select(migration_jobs).where(migration_jobs.c.job_id == job_id)).first()
        mig = conn.execute(
            select(migrations).where(migrations.c.job_id == job_id, active_condition()).order_by(migrations.c.id)
        ).first()
    return (JobRecord.of(row) if row is not None else None), (MigrationRecord.of(mig) if mig is not None else None)

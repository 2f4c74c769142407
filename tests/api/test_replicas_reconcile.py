"""The reconciler beside other service replicas, on both backends: an instance another replica is
launching (migration active, its token stored, the instance id not saved yet) or has just finished moving
to is not an orphan, and a job moved meanwhile is not marked for recovery. The other replica acts while
the reconciler lists the provider's instances (after it read the database)."""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from sqlalchemy import Engine, insert, update

from costopt.cloud import Instance, InstanceState, Interruption, LaunchSpec, NotFoundError
from costopt.db.migration_schema import migration_jobs, migrations
from costopt.domain import Cloud, Market, OfferKey
from costopt.migration.reconcile import reconcile
from costopt.migration.records import JobStatus, Kind, State, job_tags, launch_token

OFFER = OfferKey(Cloud.SIM, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
T0 = datetime(2026, 12, 1, tzinfo=UTC)


class Cloud_:
    """A provider whose ``list`` first lets another replica act (``during_list``)."""

    name = "sim"

    def __init__(self) -> None:
        self.instances: dict[str, Instance] = {}
        self.during_list: Callable[[], None] = lambda: None
        self.terminated: list[str] = []

    def add(self, instance_id: str, job_id: str, epoch: int, state: InstanceState = InstanceState.RUNNING) -> None:
        self.instances[instance_id] = Instance(instance_id, OFFER, state, job_tags(job_id, epoch), launched_at=T0)

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        self.during_list()
        return [i for i in self.instances.values() if all(i.tags.get(k) == v for k, v in tags.items())]

    def describe(self, instance_id: str) -> Instance:
        if instance_id not in self.instances:
            raise NotFoundError(instance_id)
        return self.instances[instance_id]

    def terminate(self, instance_id: str) -> None:
        self.terminated.append(instance_id)
        inst = self.instances[instance_id]
        self.instances[instance_id] = Instance(instance_id, inst.offer, InstanceState.TERMINATED, inst.tags, T0)

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        raise AssertionError("the reconciler never launches")

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        return []


def _job(engine: Engine, job_id: str, epoch: int, instance_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(migration_jobs).values(
                job_id=job_id,
                provider="sim",
                command=json.dumps(["train"]),
                env="{}",
                checkpoint_uri=f"file:///tmp/ckpt/{job_id}",
                epoch=epoch,
                instance_id=instance_id,
                offer=json.dumps(OFFER.to_doc()),
                status=JobStatus.RUNNING.value,
                reason="running",
                updated_at=T0,
            )
        )


def _migration(engine: Engine, job_id: str, state: State, from_epoch: int, to_epoch: int, new: str | None) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(migrations).values(
                job_id=job_id,
                kind=Kind.MOVE.value,
                state=state.value,
                from_epoch=from_epoch,
                to_epoch=to_epoch,
                old_instance_id="i-1",
                new_instance_id=new,
                token=launch_token(job_id, to_epoch, 1),
                offers=json.dumps([OFFER.to_doc()]),
                created_at=T0,
                updated_at=T0,
            )
        )


def test_a_launch_in_flight_on_another_replica_is_not_an_orphan(engine: Engine) -> None:
    _job(engine, "job-1", 1, "i-1")
    cloud = Cloud_()
    cloud.add("i-1", "job-1", 1)

    def other_replica_launches() -> None:
        # Its migrator stored the token and called launch; the instance id is not saved yet.
        _migration(engine, "job-1", State.LAUNCHING, 1, 2, None)
        cloud.add("i-2", "job-1", 2)

    cloud.during_list = other_replica_launches
    report = reconcile(engine, cloud)  # type: ignore[arg-type]
    assert report.orphans_terminated == () and cloud.terminated == []
    assert report.marked_for_recovery == ()

    # A real orphan is still one: an epoch no migration launched, and a job nobody registered.
    cloud.during_list = lambda: None
    cloud.add("i-9", "job-1", 7)
    cloud.add("i-8", "job-nobody", 1)
    assert sorted(reconcile(engine, cloud).orphans_terminated) == ["i-8", "i-9"]  # type: ignore[arg-type]
    assert sorted(cloud.terminated) == ["i-8", "i-9"]


def test_a_job_registered_and_launched_by_another_replica_meanwhile_is_not_an_orphan(engine: Engine) -> None:
    cloud = Cloud_()

    def other_replica_starts_a_job() -> None:
        _job(engine, "job-new", 0, None)  # type: ignore[arg-type]
        _migration(engine, "job-new", State.LAUNCHING, 0, 1, None)
        cloud.add("i-new", "job-new", 1)

    cloud.during_list = other_replica_starts_a_job
    report = reconcile(engine, cloud)  # type: ignore[arg-type]
    assert report.orphans_terminated == () and cloud.terminated == []


def test_a_move_finished_by_another_replica_meanwhile_is_neither_an_orphan_nor_a_lost_job(engine: Engine) -> None:
    _job(engine, "job-1", 1, "i-1")
    cloud = Cloud_()
    cloud.add("i-1", "job-1", 1)

    def other_replica_moves() -> None:
        _migration(engine, "job-1", State.DONE, 1, 2, "i-2")
        with engine.begin() as conn:
            conn.execute(
                update(migration_jobs).where(migration_jobs.c.job_id == "job-1").values(epoch=2, instance_id="i-2")
            )
        cloud.add("i-2", "job-1", 2)
        cloud.add("i-1", "job-1", 1, InstanceState.TERMINATED)  # the old copy, terminated by the move

    cloud.during_list = other_replica_moves
    report = reconcile(engine, cloud)  # type: ignore[arg-type]
    assert report.orphans_terminated == () and cloud.terminated == []
    assert report.marked_for_recovery == ()
    with engine.connect() as conn:
        row = conn.execute(migration_jobs.select()).one()
    assert (row.status, row.epoch, row.instance_id) == (JobStatus.RUNNING.value, 2, "i-2")

    # Without another replica, a vanished instance is still recovered.
    cloud.during_list = lambda: None
    cloud.add("i-2", "job-1", 2, InstanceState.PREEMPTED)
    assert reconcile(engine, cloud).marked_for_recovery == ("job-1",)  # type: ignore[arg-type]

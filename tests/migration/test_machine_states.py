"""The migrator and the reconciler with instance states the local provider cannot produce by itself:
a STOPPED copy (GCP's TERMINATED, Azure's deallocated) and a launch refused by the provider's own
configuration (an offer outside its regions)."""

from __future__ import annotations

import builtins
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine

from costopt.cloud import Instance, InstanceState, Interruption, LaunchSpec, ProviderConfigError
from costopt.migration.reconcile import reconcile
from costopt.migration.records import JobStatus, State, job_tags
from providers.local import LocalProvider
from tests.migration.test_machine import (
    OFFER_A,
    OFFER_B,
    OFFERS,
    assert_one_copy,
    make_migrator,
    started_job,
)


class StoppingProvider:
    """The local provider, except that instances named in ``stopped`` are reported STOPPED (their process
    is killed, as a stop would) and launches on ``outside`` offers are refused as misconfigured."""

    def __init__(self, inner: LocalProvider, outside: frozenset[object] = frozenset()) -> None:
        self.inner = inner
        self.name = inner.name
        self.stopped: set[str] = set()
        self.outside = outside
        self.terminated: list[str] = []

    def stop(self, instance_id: str) -> None:
        self.inner.terminate(instance_id)
        self.stopped.add(instance_id)

    def _view(self, inst: Instance) -> Instance:
        if inst.instance_id in self.stopped and inst.instance_id not in self.terminated:
            return replace(inst, state=InstanceState.STOPPED)
        return inst

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        if spec.offer in self.outside:
            raise ProviderConfigError(f"{spec.offer.region} is not watched: add it to COSTOPT_AWS_REGIONS")
        return self.inner.launch(spec, idempotency_token)

    def terminate(self, instance_id: str) -> None:
        self.terminated.append(instance_id)
        self.inner.terminate(instance_id)

    def describe(self, instance_id: str) -> Instance:
        return self._view(self.inner.describe(instance_id))

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        return [self._view(i) for i in self.inner.list(tags)]

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        return self.inner.interruptions(since)

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        self.inner.acknowledge(interruptions)

    def output(self, instance_id: str, *, tail: int | None = None) -> str:
        return self.inner.output(instance_id, tail=tail)


def test_a_launch_refused_by_the_providers_configuration_moves_on_to_the_next_offer(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    started_job(engine, local, tmp_path)
    prov = StoppingProvider(local, outside=frozenset({OFFER_A}))
    rec = make_migrator(engine, prov, sleep=lambda s: None).move("job-1", OFFERS)
    assert rec.state is State.DONE, rec.reason
    assert make_migrator(engine, prov).job("job-1").offer == OFFER_B
    assert_one_copy(make_migrator(engine, local), local)


def test_a_stopped_copy_is_recovered_and_terminated_and_a_stopped_orphan_is_terminated(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    mig = started_job(engine, local, tmp_path)
    prov = StoppingProvider(local)
    job = mig.job("job-1")
    assert job.instance_id is not None
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    orphan = local.launch(LaunchSpec(OFFER_A, sleeper, tags=job_tags("job-1", 0)), "stopped-orphan")
    prov.stop(orphan.instance_id)
    prov.stop(job.instance_id)

    report = reconcile(engine, prov)
    assert report.orphans_terminated == (orphan.instance_id,)  # stopped, but it bills for its disks
    assert report.marked_for_recovery == ("job-1",)  # a stopped copy runs nothing: recover elsewhere
    assert mig.job("job-1").status is JobStatus.RECOVERING

    rec = make_migrator(engine, prov).recover("job-1", OFFERS)
    assert rec.state is State.DONE, rec.reason
    assert job.instance_id in prov.terminated  # the stopped old copy is not left holding its disks
    assert_one_copy(mig, local)

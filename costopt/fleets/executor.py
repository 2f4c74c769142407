"""The round executor: drives every fleet, one idempotent pass per tick (the service runs it once per tick
across replicas under the ``fleets`` lease, :mod:`api.scheduler`).

Per fleet, each pass:

1. **registers** jobs whose submission was cut short between its two writes (from the job's spec);
2. **cancels**: a job whose cancel was asked (or whose fleet was released) loses its lease at once (its
   worker stops its copy at the next sync; the copy's exit cancels it), or is cancelled now when no copy
   runs;
3. **liveness**: an instance whose worker has not synced for ``dead_after_s`` (or never within
   ``boot_timeout_s`` of its launch), or that its provider reports ended, is ``lost``: its GPUs leave the
   fleet, its jobs' copies are given up (they resume elsewhere from their last checkpoint under a new
   epoch), the cloud instance is terminated and a replacement is launched (active fleets); **launches cut
   short** (:attr:`FleetInstance.launch_unresolved`) are found on their provider by their tags
   (``costopt:fleet``, ``costopt:fleet-instance``), terminated and billed as the fleet's idle time
   (:meth:`FleetExecutor._cut_short`);
4. **draining** instances (scaled down, or the fleet released) are terminated once no job holds them
   (their end written; they stay ``draining`` until billed to it, step 8), a launch of theirs cut short
   cleared on its cloud first;
5. **launches** pending instances: each runs a worker (``worker_command``) with its fleet, its id and a
   token whose SHA-256 only is stored;
6. **round boundary**: when the round in force ends (rounds are ``round_s`` apart on one grid, as the
   simulator's), credits each lease of the ended round with its seconds, and (aware policies) each job
   the allocation in force named with that allocation's seconds (its allocation integral,
   :func:`costopt.fleets.rounds.owed_through`), re-solves the policy when jobs arrived or left, the GPUs
   changed or ``resolve_rounds`` rounds passed, runs the mechanism under the simulator's rule
   (:func:`costopt.fleets.rounds.plan_round`; for aware policies the allocation integral, decayed when
   the rule forgets, and a hysteresis from ``restart_overhead_s`` that holds running jobs) and writes the
   new round, each job's target and both credits in one transaction (the workers read the targets at
   their next sync). A job that arrived after the boundary's time waits for the next one (as in the
   simulator). Starting a round is a compare-and-set on the fleet's round number;
7. **billing** (``billing``, when given): the ledger lines of the rounds that ended (a released fleet's
   last round ends at its release first, whatever the fleet's state when the pass began);
8. **settles**: a terminated instance whose life is billed to its end (``billed_to``, in the database) is
   ``released``. A released fleet stays on the work list until every instance is, or is ``lost`` and
   billed to its end: its money is final once it reports them so. A full pass then forgets what this
   process kept of it (its policy object, its decayed shares).
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from costopt.cloud import CloudError, CloudProvider, Instance, LaunchSpec, NotFoundError
from costopt.cloud import InstanceState as CloudState
from costopt.errors import CostoptError
from costopt.fleets.model import (
    FleetInstance,
    FleetJob,
    FleetJobStatus,
    FleetRecord,
    FleetState,
    InstanceState,
    NewInstance,
    RoundCredits,
    RoundRecord,
    capacity_of,
    seeded_id,
)
from costopt.fleets.rounds import decayed_received, history_since, owed_through, plan_round
from costopt.fleets.store import FleetRepository, NewFleetJob
from costopt.fleets.sync import hash_token, new_token
from costopt.gavel.mechanism import MechanismRule, mechanism_rule
from costopt.gavel.policies import Policy
from costopt.jobs.model import JobState
from costopt.jobs.records import ConcurrentUpdate, IllegalTransition, JobNotFound, JobRecord, JobRepository
from costopt.ledger.model import LedgerError

log = logging.getLogger("costopt.fleets")

__all__ = ["ExecutorReport", "FleetBiller", "FleetExecutor"]

TICK_ANCHOR = datetime(2000, 1, 1, tzinfo=UTC)
"""Where the service's interval schedules count their ticks from (``api.ticks.ANCHOR``)."""
ENDED = (CloudState.TERMINATED, CloudState.PREEMPTED, CloudState.STOPPED)
LAUNCH_RETRY_S = 30.0
CUT_SHORT_AFTER = timedelta(seconds=60)
"""A fleet instance ``launching`` (or ``running``) this long after it was created with no cloud instance id
recorded had its launch cut short (before that, another replica's launch may still be in flight)."""
TAG_FLEET = "costopt:fleet"
TAG_FLEET_INSTANCE = "costopt:fleet-instance"
"""The tags of every cloud instance launched for a fleet instance: the fleet's id and the fleet instance's
(the same on every launch attempt of it), by which a launch cut short is found on its provider."""


class FleetBiller(Protocol):
    """What the executor bills with (:class:`costopt.fleets.billing.FleetBilling`)."""

    def __call__(self, fleet: FleetRecord, now: datetime) -> object:
        """Record in the ledger what of ``fleet`` ended by ``now``; an ended instance billed to its end has
        its ``billed_to`` written (:attr:`FleetInstance.billed_to_end`)."""
        ...

    def stray(
        self,
        fleet: FleetRecord,
        inst: FleetInstance,
        cloud_instance_id: str,
        started_at: datetime,
        ended_at: datetime | None,
    ) -> bool:
        """Record the life of a cloud instance launched for ``inst`` but never recorded on it (a launch cut
        short) as ``fleet``'s idle time, open while ``ended_at`` is None, the first end recorded staying;
        True once closed (:meth:`costopt.fleets.billing.FleetBilling.stray`)."""
        ...

    def open_strays(self, fleet: FleetRecord, inst: FleetInstance) -> list[tuple[str, datetime]]:
        """``(cloud instance id, start)`` of the bills :meth:`stray` opened for ``inst`` and not closed."""
        ...


@dataclass(frozen=True, slots=True)
class _Folded:
    """A fleet's decayed seconds per job and worker type (``counts``) of its rounds numbered up to
    ``through``, all closed, decayed to ``at`` (the boundary that started round ``through + 1``)."""

    through: int
    at: datetime
    counts: Mapping[str, Mapping[str, float]]


@dataclass(slots=True)
class ExecutorReport:
    at: datetime
    fleets: int = 0
    rounds: list[str] = field(default_factory=list)
    launched: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class FleetExecutor:
    """See the module docstring. ``providers``: by name (an instance's ``provider``); ``worker_command``:
    the worker's command for a provider name; ``worker_env``: extra variables of every worker (e.g.
    ``COSTOPT_WORKER_POLL``); ``billing``: called with each fleet and now after its boundary; ``grid_s``: the
    period the executor is ticked at (a fleet's first round starts on that grid, so its boundaries fall on
    ticks); ``full_every_s``: a fleet whose round is not over is looked at (liveness, launches, cancels,
    billing) at most this often; one whose round ended, at every tick; ``unreachable``: provider name -> why
    a worker on its instances could not reach ``service_url`` (those instances wait, pending, saying so,
    instead of booting workers that never sync); ``restart_overhead_s``: seconds a job loses when it moves
    (its copy checkpoints, exits and starts again elsewhere): heterogeneity-aware policies hold a running
    job unless a challenger's priority beats it by ``1 + 6 x restart_overhead_s / round_s``, as in the
    simulator (:func:`costopt.gavel.mechanism.mechanism_rule`; 0: no hysteresis). ``id_seed`` (drills only,
    ``Settings.job_id_seed``): replacements' ids and launch tokens derived from it (:func:`seeded_id`), so
    every run of a seed gives them the same ones; None: random.

    A launch the provider refuses (:class:`~costopt.cloud.CloudError`, or ``ValueError`` for a spec it
    cannot send, e.g. a boot script above the cloud's size limit or a region it does not watch) puts the
    instance back to ``pending`` with the reason (``end_reason``, and the report's errors) and is retried
    ``LAUNCH_RETRY_S`` later; the fleet's pass goes on (its rounds are not held up by one instance)."""

    def __init__(
        self,
        repo: FleetRepository,
        jobs: JobRepository,
        providers: Mapping[str, CloudProvider],
        *,
        worker_command: Callable[[str], Sequence[str]],
        service_url: str,
        worker_env: Mapping[str, str] | None = None,
        dead_after_s: float = 30.0,
        boot_timeout_s: float = 600.0,
        billing: FleetBiller | None = None,
        grid_s: float | None = None,
        full_every_s: float = 1.0,
        unreachable: Mapping[str, str] | None = None,
        restart_overhead_s: float = 0.0,
        id_seed: str | None = None,
    ) -> None:
        if dead_after_s <= 0 or boot_timeout_s <= 0 or (grid_s is not None and grid_s <= 0):
            raise ValueError("dead_after_s, boot_timeout_s and grid_s must be > 0")
        if not restart_overhead_s >= 0:
            raise ValueError("restart_overhead_s must be >= 0 seconds")
        self.restart_overhead_s = float(restart_overhead_s)
        self.id_seed = id_seed
        self.grid_s = grid_s
        self.repo = repo
        self.jobs = jobs
        self.providers = dict(providers)
        self.worker_command = worker_command
        self.service_url = service_url.rstrip("/")
        self.worker_env = dict(worker_env or {})
        self.unreachable = dict(unreachable or {})
        self.dead_after = timedelta(seconds=dead_after_s)
        self.boot_timeout = timedelta(seconds=boot_timeout_s)
        self.billing = billing
        self._retry_at: dict[str, datetime] = {}
        self._lock = threading.Lock()
        self.full_every_s = full_every_s
        self._policies: dict[str, Policy] = {}
        self._folded: dict[str, _Folded] = {}
        self.history_read: deque[int] = deque(maxlen=1000)  # rounds read per boundary for decayed shares
        self._last_full = datetime.min.replace(tzinfo=UTC)
        self._stopping = threading.Event()

    def tick(self) -> ExecutorReport:
        """One pass over every fleet (module docstring); a concurrent call, or one after :meth:`stop`,
        returns at once. A full pass forgets what this process kept of fleets no longer on the work list
        (released and billed to the end: :meth:`kept`)."""
        now = self.repo.now()
        out = ExecutorReport(now)
        if self._stopping.is_set() or not self._lock.acquire(blocking=False):
            return out
        try:
            full = (now - self._last_full).total_seconds() >= self.full_every_s or now < self._last_full
            if full:
                self._last_full = now
                self._register_missing(out)
            released = self.repo.released_with_instances(billed=self.billing is not None) if full else []
            fleets = self.repo.active() + released
            out.fleets = len(fleets)
            if full:
                self._prune({f.id for f in fleets}, now)
            for fleet in fleets:
                if self._stopping.is_set():  # shutting down: the rest waits for the next process's pass
                    break
                due = fleet.round_ends_at is None or now >= fleet.round_ends_at
                if not (full or due):
                    continue
                try:
                    self._fleet(fleet, out)
                except (CostoptError, CloudError, OSError, ValueError) as exc:
                    log.exception("fleet %s: the pass failed", fleet.id)
                    out.errors.append(f"{fleet.id}: {type(exc).__name__}: {exc}")
            return out
        finally:
            self._lock.release()

    def stop(self) -> None:
        """No new pass starts (:meth:`tick` returns at once) and a running one ends after the fleet it is
        at: what it did is committed fleet by fleet, and whatever it left is taken up by the next pass of
        any process (every step is idempotent). For the service's shutdown (:mod:`api.app`)."""
        self._stopping.set()

    def wait_idle(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until no pass runs; True when none does."""
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return False
        self._lock.release()
        return True

    def kept(self) -> dict[str, frozenset[str]]:
        """What this process keeps between passes, by kind: fleet ids (``policies``: the policy objects;
        ``folded``: decayed shares) and instance ids (``retry_at``: launches to retry later)."""
        return {
            "policies": frozenset(self._policies),
            "folded": frozenset(self._folded),
            "retry_at": frozenset(self._retry_at),
        }

    def _prune(self, listed: Collection[str], now: datetime) -> None:
        """Forget the fleets not on the work list (released, with every instance terminated and billed to
        its end, no job and no round left: nothing of them is looked at again) and the launch retries
        that are due (a due retry is the same as none). Only what this process keeps to save work: nothing
        billed or stored depends on it (a fresh process starts without it)."""
        for kept in (self._policies, self._folded):
            for fleet_id in [f for f in kept if f not in listed]:
                del kept[fleet_id]
        for inst_id in [i for i, at in self._retry_at.items() if at <= now]:
            del self._retry_at[inst_id]

    # -- one fleet -------------------------------------------------------------------------------------

    def _fleet(self, fleet: FleetRecord, out: ExecutorReport) -> None:
        now = self.repo.now()
        jobs = self.repo.jobs(fleet.id, statuses=(FleetJobStatus.WAITING, FleetJobStatus.RUNNING))
        # one read for the fleet's jobs, not one each (states and cancel requests; no quotes)
        records: dict[str, JobRecord | None] = dict(self.jobs.many([j.job_id for j in jobs]))
        if fleet.state is FleetState.RELEASED:
            for j in jobs:
                rec = records.get(j.job_id)
                if rec is not None and rec.cancel_requested_at is None and not rec.state.terminal:
                    records[j.job_id] = self.jobs.request_cancel(j.job_id)
        runnable = self._cancels(jobs, records)
        self._liveness(fleet, self.repo.instances(fleet.id), now, out)
        instances = self.repo.instances(fleet.id)
        if self._cut_short(fleet, instances, now, out):
            instances = self.repo.instances(fleet.id)  # read again only when a launch cut short was cleared
        self._drain(fleet, instances, out)
        # Read again: the fleet may have been released since this pass read it (its instances drained just
        # now). Its last round then ends here, at the release, before anything of it is billed.
        fleet = self.repo.get(fleet.id)
        if fleet.state is FleetState.RELEASED and fleet.round and fleet.released_at is not None:
            current = self.repo.round(fleet.id, fleet.round)
            if current is not None and current.ended_at is None:  # the last round ends with the fleet
                self._end_round(fleet, current, fleet.released_at)
        if fleet.state is FleetState.ACTIVE:
            self._launch(
                fleet, [i for i in instances if i.state in (InstanceState.PENDING, InstanceState.LAUNCHING)], now, out
            )
            self._boundary(self.repo.get(fleet.id), instances, runnable, now, out)
        if self.billing is not None:
            self.billing(self.repo.get(fleet.id), now)
        self._settle(fleet, out)

    def _cancels(self, jobs: Sequence[FleetJob], records: Mapping[str, JobRecord | None]) -> list[FleetJob]:
        """Leases of cancelled jobs are taken back; returns the jobs that may run."""
        keep: list[FleetJob] = []
        for j in jobs:
            rec = records.get(j.job_id)
            if rec is None:
                continue
            if rec.state.terminal or rec.cancel_requested_at is not None:
                if j.holder is None:
                    if self.repo.set_job(
                        j.job_id,
                        expect_holder=(None, None),
                        status=FleetJobStatus.CANCELLED,
                        target=None,
                        finished_at=self.repo.now(),
                        reason="cancelled",
                    ):
                        self._to(rec, JobState.CANCELLED, "cancelled before its next lease")
                        self.repo.mark_dirty(j.fleet_id)
                elif j.target is not None:
                    self.repo.set_job(j.job_id, target=None, target_gpus=None)  # its worker stops the copy
                continue
            keep.append(j)
        return keep

    def _liveness(
        self, fleet: FleetRecord, instances: Sequence[FleetInstance], now: datetime, out: ExecutorReport
    ) -> None:
        for inst in instances:
            reason = None
            if inst.ended_at is not None:
                continue  # terminated (drained), its bill not complete yet: not lost
            if inst.state in (InstanceState.RUNNING, InstanceState.DRAINING) and inst.last_seen_at is not None:
                if now - inst.last_seen_at > self.dead_after:
                    reason = f"its worker has not synced for {(now - inst.last_seen_at).total_seconds():.0f} s"
            elif (
                inst.state is InstanceState.LAUNCHING
                and inst.launched_at is not None
                and inst.first_seen_at is None
                and now - inst.launched_at > self.boot_timeout
            ):
                reason = f"its worker did not sync within {self.boot_timeout.total_seconds():.0f} s of the launch"
            if (
                reason is None
                and inst.instance_id
                and inst.state
                in (
                    InstanceState.LAUNCHING,
                    InstanceState.RUNNING,
                    InstanceState.DRAINING,
                )
            ):
                stale = inst.last_seen_at is None or now - inst.last_seen_at > self.dead_after / 10
                if stale:
                    reason = self._ended(inst)
            if reason is None:
                continue
            # terminated before it is lost: a lost instance is billed to now, so one the cloud still runs must
            # not be lost (its bill would stop while the cloud's goes on); a terminate that failed is asked
            # again at the next pass
            if self._terminate(inst):
                self._lose(fleet, inst, reason, out)

    def _lose(self, fleet: FleetRecord, inst: FleetInstance, reason: str, out: ExecutorReport) -> bool:
        """``inst`` is ``lost`` (:meth:`FleetRepository.lose_instance`), replaced when its fleet is active and
        it was not draining; False when it was not live any more."""
        replace = None
        if fleet.state is FleetState.ACTIVE and inst.state is not InstanceState.DRAINING:
            replace = NewInstance(
                offer=inst.offer,
                accelerator=inst.accelerator,
                gpus=inst.gpus,
                provider=inst.provider,
                usd_per_hour=inst.usd_per_hour,
                replaces=inst.id,
                **self._replacement_id(inst),
            )
        if not self.repo.lose_instance(inst.id, reason, replace=replace):
            return False
        then = "; launching a replacement" if replace else ""
        log.warning("fleet %s: instance %s lost: %s%s", fleet.id, inst.id, reason, then)
        out.lost.append(inst.id)
        return True

    def _replacement_id(self, inst: FleetInstance) -> dict[str, str]:
        """The id of ``inst``'s replacement when it is derived (a drill's seed); else none (random)."""
        return {} if self.id_seed is None else {"instance_id": seeded_id("fi-", self.id_seed, "replaces", inst.id)}

    def _ended(self, inst: FleetInstance) -> str | None:
        provider = self.providers.get(inst.provider)
        if provider is None or inst.instance_id is None:
            return None
        try:
            state = provider.describe(inst.instance_id).state
        except NotFoundError:
            return "its provider no longer knows the instance"
        except CloudError as exc:
            log.info("fleet instance %s: describe failed: %s", inst.id, exc)
            return None
        return f"the instance is {state.value}" if state in ENDED else None

    def _terminate(self, inst: FleetInstance) -> bool:
        """Terminate ``inst``'s cloud instance; True when the provider took it or knows no such instance (or
        none was launched), False when it failed (the caller asks again at its next pass). An instance of a
        provider not configured here is left alone: True (another replica's providers or none; as before)."""
        provider = self.providers.get(inst.provider)
        if provider is None or inst.instance_id is None:
            return True
        try:
            provider.terminate(inst.instance_id)
        except NotFoundError:
            return True
        except CloudError as exc:
            log.warning("fleet instance %s: terminate failed, asked again at the next pass: %s", inst.id, exc)
            return False
        return True

    def _drain(self, fleet: FleetRecord, instances: Sequence[FleetInstance], out: ExecutorReport) -> None:
        """Terminate the draining instances no job holds any more: their end is written (``ended_at``), they
        stay ``draining`` until their bill is complete (:meth:`_settle`). One whose launch was cut short
        (a released fleet's instance that was ``launching``, or ``pending`` after a failed launch) is
        cleared on the cloud first (:meth:`_clear_strays`); its end is written with the clean-up's record,
        only once that succeeded (until then it is looked at again at every pass). One that was launched is
        looked for strays too before its end is written (a failed launch whose instance the cloud created
        only after the retry's look-up), when its provider is here."""
        for inst in instances:
            if inst.state is not InstanceState.DRAINING or inst.ended_at is not None:
                continue
            if any(
                j.holder == inst.id or (j.target == inst.id and not j.status.finished)
                for j in self.repo.holders(inst.id)
            ):
                continue  # its jobs stop at the next round first
            if inst.launch_unresolved:
                if not self._clear_strays(fleet, inst, out):
                    continue
                self.repo.update_instance(
                    inst.id, expect=(InstanceState.DRAINING,), ended_at=self.repo.now(), launch_token=None
                )
            else:
                if (
                    inst.launch_token is not None
                    and inst.provider in self.providers
                    and not self._clear_strays(fleet, inst, out)
                ):
                    continue  # an earlier failed launch's instance the cloud created late: cleared first
                if not self._terminate(inst):
                    continue  # its end is written (its bill stops) only once the cloud took the terminate
                self.repo.update_instance(inst.id, expect=(InstanceState.DRAINING,), ended_at=self.repo.now())
            log.info("fleet %s: instance %s terminated (%s)", fleet.id, inst.id, inst.end_reason or "drained")

    def _settle(self, fleet: FleetRecord, out: ExecutorReport) -> None:
        """Terminated instances whose life is in the ledger to their end (every round they took part in
        ended and billed, and their time after the last one) are ``released``: a released instance's money is
        final. Until then they stay ``draining`` and the fleet stays on the executor's work list, so a
        release that lands while a pass runs, or a pass cut short, still bills the last round (without
        billing: at once)."""
        for inst in self.repo.instances(fleet.id, states=(InstanceState.DRAINING,)):
            if inst.ended_at is None:
                continue
            if self.billing is not None and not inst.billed_to_end:
                continue
            if self.repo.update_instance(inst.id, expect=(InstanceState.DRAINING,), state=InstanceState.RELEASED):
                out.released.append(inst.id)
                log.info("fleet %s: instance %s released (%s)", fleet.id, inst.id, inst.end_reason or "drained")

    def _launch(self, fleet: FleetRecord, pending: Sequence[FleetInstance], now: datetime, out: ExecutorReport) -> None:
        for inst in pending:
            if inst.state is InstanceState.LAUNCHING:
                continue  # a launch cut short is cleared by _cut_short
            if self._retry_at.get(inst.id, now) > now or inst.launch_unresolved:
                continue  # a failed launch not cleared on its cloud yet: never two
            provider = self.providers.get(inst.provider)
            why = (
                f"provider {inst.provider!r} cannot run a fleet worker in this service: the instance waits"
                if provider is None
                else self.unreachable.get(inst.provider)
            )
            if provider is None or why is not None:  # said once (on the instance and in the log), not at every pass
                if inst.end_reason != why:
                    self.repo.update_instance(inst.id, expect=(InstanceState.PENDING,), end_reason=why)
                    out.errors.append(f"{inst.id}: {why}")
                continue
            # the launch's idempotency token, new at each attempt (a launch cut short is abandoned, not retried
            # under its token); under a drill's seed, derived from the attempt's (service clock) time
            suffix = (
                secrets.token_hex(4)
                if self.id_seed is None
                else seeded_id("", self.id_seed, inst.id, now.isoformat())[:8]
            )
            token, launch_token = new_token(), f"{inst.id}-{suffix}"
            if not self.repo.update_instance(
                inst.id,
                expect=(InstanceState.PENDING,),
                state=InstanceState.LAUNCHING,
                token_hash=hash_token(token),
                launch_token=launch_token,
            ):
                continue
            spec = LaunchSpec(
                offer=inst.offer,
                command=list(self.worker_command(inst.provider)),
                env={
                    **self.worker_env,
                    "COSTOPT_SERVICE_URL": self.service_url,
                    "COSTOPT_FLEET_ID": fleet.id,
                    "COSTOPT_WORKER_ID": inst.id,
                    "COSTOPT_WORKER_TOKEN": token,
                    "COSTOPT_WORKER_GPUS": str(inst.gpus),
                },
                tags={TAG_FLEET: fleet.id, TAG_FLEET_INSTANCE: inst.id},
            )
            try:
                launched = provider.launch(spec, launch_token)
            except (CloudError, ValueError) as exc:  # ValueError: the provider refused the spec, sent nothing
                # after a CloudError the cloud may have created the instance all the same (a time-out, a
                # failure part-way): launch_token stays, so it is looked for by its tags before the retry
                self.repo.update_instance(
                    inst.id,
                    expect=(InstanceState.LAUNCHING,),
                    state=InstanceState.PENDING,
                    token_hash=None,
                    end_reason=f"launch failed: {exc}"[:2000],
                    **({"launch_token": None} if isinstance(exc, ValueError) else {}),
                )
                self._retry_at[inst.id] = now + timedelta(seconds=LAUNCH_RETRY_S)
                out.errors.append(f"{inst.id}: launch failed: {exc}")
                continue
            self.repo.update_instance(  # a reason it waited for no longer holds
                inst.id, instance_id=launched.instance_id, launched_at=self.repo.now(), end_reason=None
            )
            out.launched.append(inst.id)
            log.info("fleet %s: launched %s (%s) as %s", fleet.id, inst.id, inst.offer, launched.instance_id)

    def _cut_short(
        self, fleet: FleetRecord, instances: Sequence[FleetInstance], now: datetime, out: ExecutorReport
    ) -> bool:
        """Clear the launches cut short (:attr:`FleetInstance.launch_unresolved`): the cloud instances
        launched for the fleet instance and never recorded on it are found on its provider by their tags,
        terminated and billed as the fleet's idle time (:meth:`_clear_strays`); then, by the fleet
        instance's state:

        - ``launching`` (``CUT_SHORT_AFTER`` after it was created): back to ``pending``, launched again with
          a new token (the dead process took the first one's secret);
        - ``running`` (the worker of the instance cut short came up and synced, ``CUT_SHORT_AFTER`` after
          it was created): that instance is gone now, so the fleet instance is ``lost`` (its jobs resume
          elsewhere from their last checkpoint) and replaced when the fleet is active;
        - ``pending`` after a failed launch (the cloud may have created it all the same): cleared when its
          retry is due, before it is tried again (never two launches of one fleet instance);
        - ``lost`` or ``released``: cleared;
        - ``draining``: cleared when it is terminated (:meth:`_drain`).

        Each record (``launch_token`` cleared) is written after the clean-up and its bill: a pass cut short
        in between leaves the fleet instance unresolved, and the next pass (this process's or a restarted
        one's) does it again, terminating nothing new and recording the same ledger lines (the same keys
        and times), so the bill counts once. Until cleared, a released fleet stays on the work list.
        True when a fleet instance was written (``instances`` is stale then)."""
        wrote = False
        for inst in instances:
            if not inst.launch_unresolved or inst.state is InstanceState.DRAINING:
                continue
            young = now - inst.created_at <= CUT_SHORT_AFTER
            if young and inst.state in (InstanceState.LAUNCHING, InstanceState.RUNNING):
                continue  # another replica's launch may still be in flight
            if inst.state is InstanceState.PENDING and self._retry_at.get(inst.id, now) > now:
                continue
            if not self._clear_strays(fleet, inst, out):
                continue
            wrote = True
            if inst.state is InstanceState.LAUNCHING:
                self.repo.update_instance(
                    inst.id,
                    expect=(InstanceState.LAUNCHING,),
                    state=InstanceState.PENDING,
                    token_hash=None,
                    launch_token=None,
                )
                continue  # its worker came up meanwhile (now running): the next pass loses it
            if inst.state is InstanceState.RUNNING:
                why = "its launch was cut short: its cloud instance, never recorded, was terminated"
                if not self._lose(fleet, inst, why, out):
                    continue
            self.repo.update_instance(inst.id, launch_token=None)
        return wrote

    def _clear_strays(self, fleet: FleetRecord, inst: FleetInstance, out: ExecutorReport) -> bool:
        """Find on ``inst``'s provider the cloud instances tagged with ``inst`` (its id and its fleet's) other
        than the one recorded on it; for each not billed to its end yet: its bill is opened from its launch
        (the provider's launch time, else the fleet instance's creation) as the fleet's idle time
        (``billing.stray``), it is terminated unless the provider reports it terminated, and its bill is
        closed at its end (the provider's end time, else now: a provider that reports no end time, or no
        longer knows the instance). The bill's first end stays: a pass cut short anywhere in this and done
        again bills each instance once; a bill a pass opened and did not close is closed too when the
        provider no longer lists the instance (at its end, or now when the provider no longer knows it).
        True when every one is terminated and billed (or none was found); False to try again at the next
        pass (the provider cannot be asked, a terminate has not taken, or the bill failed)."""
        provider = self.providers.get(inst.provider)
        if provider is None:
            log.warning("fleet instance %s: launch cut short, its provider %r is not here", inst.id, inst.provider)
            return False
        try:
            listed = {
                i.instance_id: i
                for i in provider.list({TAG_FLEET_INSTANCE: inst.id})
                if i.tags.get(TAG_FLEET_INSTANCE) == inst.id
                and i.tags.get(TAG_FLEET) == fleet.id
                and i.instance_id != inst.instance_id
            }
            done = True
            starts = {cloud_id: i.launched_at or inst.created_at for cloud_id, i in listed.items()}
            if self.billing is not None:  # opened by a pass that died before closing them, listed or not
                for cloud_id, opened in self.billing.open_strays(fleet, inst):
                    starts[cloud_id] = opened  # the start its bill was opened with
            for cloud_id, start in starts.items():
                if self.billing is not None and self.billing.stray(fleet, inst, cloud_id, start, None):
                    continue  # terminated and billed to its end by a pass cut short before its record
                gone = self._terminate_stray(fleet, inst, provider, cloud_id, listed.get(cloud_id))
                if gone is not None and gone.state in (CloudState.PENDING, CloudState.RUNNING):
                    done = False  # the terminate has not taken yet: asked again at the next pass
                    continue
                end = gone.terminated_at if gone is not None and gone.terminated_at is not None else self.repo.now()
                if self.billing is not None:
                    self.billing.stray(fleet, inst, cloud_id, start, end)
        except (CloudError, LedgerError) as exc:
            log.warning("fleet instance %s: could not clear a launch cut short: %s", inst.id, exc)
            out.errors.append(f"{inst.id}: could not clear a launch cut short: {exc}")
            return False
        return done

    def _terminate_stray(
        self,
        fleet: FleetRecord,
        inst: FleetInstance,
        provider: CloudProvider,
        cloud_id: str,
        listed: Instance | None,
    ) -> Instance | None:
        """Terminate the stray ``cloud_id`` (``listed``: as its provider listed it; None: described) unless
        its provider reports it terminated; returns it as its provider reports it then (after a terminate:
        described again), None when its provider does not know it. Raises
        :class:`~costopt.cloud.CloudError`."""
        try:
            stray = listed or provider.describe(cloud_id)
        except NotFoundError:
            return None
        if stray.state is CloudState.TERMINATED:
            return stray
        log.warning(
            "fleet %s: instance %s's launch cut short left cloud instance %s (%s): terminating",
            fleet.id,
            inst.id,
            cloud_id,
            stray.state.value,
        )
        provider.terminate(cloud_id)
        try:
            return provider.describe(cloud_id)
        except NotFoundError:
            return None

    # -- the boundary ----------------------------------------------------------------------------------

    def _boundary(
        self,
        fleet: FleetRecord,
        instances: Sequence[FleetInstance],
        jobs: Sequence[FleetJob],
        now: datetime,
        out: ExecutorReport,
    ) -> None:
        if fleet.round_ends_at is not None and now < fleet.round_ends_at:
            return
        length = timedelta(seconds=fleet.round_s)
        if fleet.round_ends_at is None:
            start = self._on_ticks(now)
        else:  # the latest grid point at or before now (re-anchored when the executor was away long)
            k = math.floor((now - fleet.round_ends_at) / length)
            start = fleet.round_ends_at + k * length
            if now - start > length / 2:
                start = self._on_ticks(now)
        current = self.repo.round(fleet.id, fleet.round) if fleet.round else None
        open_round = current is not None and current.ended_at is None
        runnable = {x.job_id for x in jobs}
        unfinished = self.repo.jobs(fleet.id, statuses=(FleetJobStatus.WAITING, FleetJobStatus.RUNNING))
        jobs = [j for j in unfinished if j.job_id in runnable and j.arrived_at <= start]
        live = [i for i in self.repo.instances(fleet.id) if i.state is InstanceState.RUNNING]
        if not jobs or not live:
            if open_round and current is not None:
                self._end_round(fleet, current, start)
            return
        received: dict[str, dict[str, float]] = {j.job_id: dict(j.received) for j in jobs}
        held = 0.0
        if open_round and current is not None:
            held = (start - current.started_at).total_seconds()
            for lease in current.assignment:
                if lease.job_id in received:
                    got = received[lease.job_id]
                    got[lease.wtype] = got.get(lease.wtype, 0.0) + held
        previous = current.assignment if open_round and current is not None else ()
        solve = self._must_solve(fleet, jobs, live)
        policy = self._policy(fleet)
        rule = mechanism_rule(policy.heterogeneity_aware, self.restart_overhead_s, fleet.round_s)
        decayed = None
        if rule.memory_s is not None:  # shares that forget: decayed from the stored leases
            decayed = self._decayed(fleet, jobs, {j.job_id for j in unfinished}, start, rule.memory_s)
        owed = None
        if rule.allocation_integral:  # the allocation in force in the round that ends, folded in as received is
            owed = owed_through(
                jobs,
                fleet.allocation if open_round else None,
                current.started_at if open_round and current is not None else None,
                held,
                start,
                rule.memory_s,
            )
        decision = plan_round(
            fleet,
            live,
            jobs,
            previous,
            received,
            start,
            solve=solve,
            policy=policy,
            restart_overhead_s=self.restart_overhead_s,
            decayed=decayed,
            owed=owed,
        )
        if decision.unplaced:
            log.info(
                "fleet %s: round %d: no single instance could hold %s",
                fleet.id,
                fleet.round + 1,
                list(decision.unplaced),
            )
        allocation = decision.allocation
        if allocation is not None:
            allocation = {**allocation, "capacity": dict(decision.capacity)}
        if self.repo.begin_round(
            fleet,
            started_at=start,
            ends_at=start + length,
            capacity=decision.capacity,
            assignment=[a.to_doc() for a in decision.assignment],
            allocation=allocation,
            received=received,
            active=[j.job_id for j in jobs],
            previous_ended_at=start if open_round else None,
            owed=owed,
            closing=None if current is None or not open_round else self._closing(fleet, current, start, received, rule),
        ):
            if decayed is not None:  # every round up to fleet.round is now closed and folded in, to start
                self._folded[fleet.id] = _Folded(fleet.round, start, decayed)
            out.rounds.append(f"{fleet.id}:{fleet.round + 1}")
            log.info(
                "fleet %s: round %d at %s: %d leases over %s%s",
                fleet.id,
                fleet.round + 1,
                start.isoformat(),
                len(decision.assignment),
                dict(decision.capacity),
                " (policy solved)" if allocation is not None else "",
            )

    def _end_round(self, fleet: FleetRecord, current: RoundRecord, until: datetime) -> None:
        """Close ``current`` (no round follows) at ``until``, within its span, crediting its leases."""
        at = max(current.started_at, min(until, current.ends_at))
        rule = mechanism_rule(self._policy(fleet).heterogeneity_aware, self.restart_overhead_s, fleet.round_s)
        self.repo.end_round(fleet, at, self._closing(fleet, current, at, (), rule))

    def _closing(
        self,
        fleet: FleetRecord,
        current: RoundRecord,
        at: datetime,
        credited: Collection[str],
        rule: MechanismRule,
    ) -> RoundCredits | None:
        """The credits of the round ``current``, ending at ``at``, to the jobs leased in it other than
        ``credited`` (those the boundary folds itself): each job's ``received`` gains the seconds from the
        round's start to ``at`` or to its finish when it finished first, per lease, and its ``owed`` (under
        the allocation integral) the allocation in force over the same seconds. So a job's last round
        counts, and a job that finished after the boundary's time but before the boundary ran keeps the
        round it was running at it. Such a job is not leased in the next round, so no round is counted
        twice. None: nothing to credit."""
        leased = {a.job_id for a in current.assignment} - set(credited)
        if not leased:
            return None
        received: dict[str, dict[str, float]] = {}
        owed: dict[str, dict[str, float]] = {}
        for job in self.repo.jobs(fleet.id, job_ids=leased):
            end = at if job.finished_at is None else min(at, job.finished_at)
            held = max((end - current.started_at).total_seconds(), 0.0)
            got = received[job.job_id] = dict(job.received)
            for lease in current.assignment:
                if lease.job_id == job.job_id:
                    got[lease.wtype] = got.get(lease.wtype, 0.0) + held
            if rule.allocation_integral:
                owed.update(owed_through([job], fleet.allocation, current.started_at, held, at, rule.memory_s))
        if not received:
            return None
        return RoundCredits(received, owed if rule.allocation_integral else None, at)

    def _decayed(
        self,
        fleet: FleetRecord,
        jobs: Sequence[FleetJob],
        unfinished: Collection[str],
        start: datetime,
        memory_s: float,
    ) -> dict[str, dict[str, float]]:
        """Each unfinished job's seconds of leases per worker type decayed to ``start``
        (:func:`costopt.fleets.rounds.decayed_received`): the counts this process folded at the fleet's
        last boundary, aged, plus the rounds since (usually one) when those are exactly the rounds after
        it; else (the first boundary this process runs, or another replica's rounds in between that it
        cannot account for) recomputed from the leases of the rounds since
        :func:`~costopt.fleets.rounds.history_since`."""
        kept = self._folded.pop(fleet.id, None)
        if kept is not None and kept.at <= start:
            new = [r for r in self.repo.leases_since(fleet.id, kept.at) if r.number > kept.through]
            if [r.number for r in new] == list(range(kept.through + 1, fleet.round + 1)):
                self.history_read.append(len(new))
                got = decayed_received(new, None, start, memory_s, start=kept.counts, start_at=kept.at)
                return {j: c for j, c in got.items() if j in unfinished}
        history = self.repo.leases_since(fleet.id, history_since((j.arrived_at for j in jobs), start, memory_s))
        self.history_read.append(len(history))
        got = decayed_received(history, None, start, memory_s)
        return {j: c for j, c in got.items() if j in unfinished}

    def _policy(self, fleet: FleetRecord) -> Policy:
        """The fleet's policy object, kept between boundaries in this process (a policy keeps its LP models
        between solves, as in the simulator; another replica starts with a new one)."""
        from costopt.gavel.policies import get_policy

        kept = self._policies.get(fleet.id)
        if kept is None or kept.name != fleet.policy:
            kept = self._policies[fleet.id] = get_policy(fleet.policy)
        return kept

    def _on_ticks(self, now: datetime) -> datetime:
        """``now`` down to the executor's own tick grid (``grid_s``): a round anchored there ends when a
        tick fires, not just after one (None: ``now``)."""
        if self.grid_s is None:
            return now
        grid = timedelta(seconds=self.grid_s)
        return TICK_ANCHOR + ((now - TICK_ANCHOR) // grid) * grid

    @staticmethod
    def _must_solve(fleet: FleetRecord, jobs: Sequence[FleetJob], live: Sequence[FleetInstance]) -> bool:
        doc = fleet.allocation
        if fleet.dirty or not doc or fleet.solved_round is None:
            return True
        if fleet.round + 1 - fleet.solved_round >= fleet.resolve_rounds:
            return True
        if set(doc.get("job_ids", [])) != {j.job_id for j in jobs}:
            return True
        return dict(doc.get("capacity", {})) != capacity_of(live)

    # -- jobs ------------------------------------------------------------------------------------------

    def _register_missing(self, out: ExecutorReport) -> None:
        for job_id, team in self.repo.missing_jobs():
            rec = self._job(job_id)
            spec = rec.spec if rec is not None else {}
            if rec is None or not spec.get("fleet_id"):
                continue
            try:
                self.repo.add_job(
                    NewFleetJob(
                        job_id=job_id,
                        fleet_id=str(spec["fleet_id"]),
                        team_id=team,
                        gpus=int(spec.get("gpus", 1)),
                        throughput={str(k): float(v) for k, v in (spec.get("fleet_throughput") or {}).items()},
                        steps_total=rec.steps_total,
                        arrived_at=rec.created_at,
                        weight=float(spec.get("weight", 1.0)),
                        slo_s=None if spec.get("slo_s") is None else float(spec["slo_s"]),
                    )
                )
                log.warning("job %s: registered with fleet %s (its submission was cut short)", job_id, spec["fleet_id"])
            except (CostoptError, ValueError) as exc:
                out.errors.append(f"{job_id}: {exc}")

    def _job(self, job_id: str) -> JobRecord | None:
        try:
            return self.jobs.get(job_id)
        except JobNotFound:
            return None

    def _to(self, rec: JobRecord | None, to: JobState, reason: str) -> None:
        if rec is None or rec.state.terminal:
            return
        try:
            self.jobs.transition(rec.id, to, reason)
        except (ConcurrentUpdate, IllegalTransition) as exc:
            log.info("job %s: %s", rec.id, exc)

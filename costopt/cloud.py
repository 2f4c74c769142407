"""What the core needs from a cloud: launch, terminate, describe, list, interruptions.

Every provider (``providers/aws.py``, ``gcp.py``, ``azure.py``, ``sim.py``, ``local.py``) implements
:class:`CloudProvider`; the migrator and the rebalancer only see this protocol (as Karpenter's
scheduler only sees its CloudProvider). Errors are the typed ones below, translated from each SDK.

Contracts (every provider keeps them; ``tests/providers/test_contract.py`` checks each one):

- ``launch(spec, idempotency_token)`` creates at most one instance per token: calling it again
  with the same token (from the same or a restarted process) returns the instance already launched,
  never a second one. Use a fresh token for every distinct launch.
- ``terminate(instance_id)`` is idempotent: terminating an instance that is already gone, or an id
  the cloud does not know (a cloud cannot tell "never existed" from "deleted long ago"), is not an
  error. It may return before the instance is fully gone (``describe`` then says STOPPING).
- ``describe(instance_id)`` raises :class:`NotFoundError` for an instance the provider cannot find
  (never launched, or deleted and forgotten by the cloud).
- ``list(tags)`` returns every instance launched through the provider (instances costopt did not
  launch are never listed) whose tags include all the given key/value pairs, compared exactly (no
  wildcards; ``{}`` matches every instance), in launch order (oldest first):

  * every instance that still exists at the cloud is listed, whatever its state: PENDING, RUNNING,
    STOPPING, STOPPED, and PREEMPTED while the cloud still holds it (a Spot VM kept stopped or
    deallocated after its preemption);
  * an instance that has ended and been released (TERMINATED, or PREEMPTED and deleted) is never
    listed once it ended more than :data:`ENDED_RETENTION` ago, and may or may not be listed before
    that (GCP and Azure forget deleted instances at once, EC2 reports terminated ones for about an
    hour, ``sim`` and ``local`` keep them until the retention is over).

  So a reconciler sees everything that may still cost money or still run a job, and must filter on
  :attr:`Instance.state`; nobody should count launches with ``list``.
- ``interruptions(since)`` returns preemption notices and preemptions observed since a time.
- ``acknowledge(interruptions)``: the caller has acted on these events. A provider that reads notices
  from a queue (AWS: SQS) deletes them only now; until then ``interruptions`` may return them again
  (AWS: once the queue's visibility timeout ends), so a caller that dies between reading and acting
  still sees them. Idempotent, never raises (an event not acknowledged comes again); a no-op for
  providers that keep no queue.
- ``output(instance_id, tail=None)`` is the instance's own console (the job's stdout/stderr, or what the
  cloud captured of its console), its last ``tail`` lines each ending in a newline; "" when there is none
  yet; :class:`NotFoundError` for an unknown instance.
- ``Instance.exit_code`` is the job's exit code once its command ended (0: finished); None while it runs,
  when it was killed without one, and on clouds that cannot tell (the VM outlives its command). ``sim``
  and ``local`` know it; their instance ends when its job exits (``sim``: exit 0 always, another code
  unless a preemption notice runs, the cloud then taking the instance at its deadline).
- Times are tz-aware UTC; prices USD per hour.

States, and what the migrator should make of them (may the job run there? does it still bill?):

- PENDING: accepted, booting; the job may start any moment (runs: maybe; bills: yes).
- RUNNING: running; the job runs, or ran and exited (runs: yes; bills: yes).
- STOPPING: shutting down, towards stopped or terminated; the job may still be writing (yes; yes).
- STOPPED: stopped or deallocated; the disks are kept, nothing runs (runs: no; bills: disks).
- TERMINATED: deleted by costopt or by its owner (no; no).
- PREEMPTED: taken back by the cloud (spot); usually deleted, sometimes kept stopped (no; maybe).

:data:`ACTIVE_STATES` (may still run the job's command, so fencing must assume it can still write) is
PENDING, RUNNING and STOPPING. A STOPPED instance runs nothing and will not run again unless someone
starts it, but it still bills for its disks (and a restart would run the old epoch, which fencing
refuses): treat it as gone for the job (recover from the last checkpoint) and as an instance to
terminate (:data:`HELD_STATES`). Each cloud's native states map as follows (details in each provider):

- AWS: ``pending`` -> PENDING, ``running`` -> RUNNING, ``stopping``/``shutting-down`` -> STOPPING,
  ``stopped`` -> STOPPED, ``terminated`` -> TERMINATED; a spot instance AWS took back -> PREEMPTED.
- GCP: ``PROVISIONING``/``STAGING``/``REPAIRING``/``PENDING`` -> PENDING, ``RUNNING`` -> RUNNING,
  ``STOPPING``/``SUSPENDING``/``PENDING_STOP``/``DEPROVISIONING`` -> STOPPING, ``TERMINATED`` (which
  on GCP means *stopped*: the VM and its disks still exist)/``STOPPED``/``SUSPENDED`` -> STOPPED; a
  Spot VM GCP preempted -> PREEMPTED. A deleted instance no longer exists: ``describe`` raises
  :class:`NotFoundError`.
- Azure: ``PowerState/running`` -> RUNNING, ``starting``/creating -> PENDING, ``stopping``/
  ``deallocating``/``ProvisioningState/deleting`` -> STOPPING, ``stopped``/``deallocated`` -> STOPPED;
  a Spot VM evicted -> PREEMPTED; a VM costopt deleted -> TERMINATED (while the provider remembers it).
- ``sim`` and ``local`` have no STOPPED: their instances run, then end.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

from costopt.domain import OfferKey
from costopt.errors import CostoptError


class InstanceState(StrEnum):
    """An instance's state as the migrator needs it (meanings and cloud mappings: module docstring)."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    TERMINATED = "terminated"
    PREEMPTED = "preempted"


ACTIVE_STATES: frozenset[InstanceState] = frozenset(
    {InstanceState.PENDING, InstanceState.RUNNING, InstanceState.STOPPING}
)
"""States in which the instance may (still) run the job's command: a copy there may still write."""

HELD_STATES: frozenset[InstanceState] = ACTIVE_STATES | {InstanceState.STOPPED}
"""States in which the instance certainly still exists and bills (compute, or disks when STOPPED); a
PREEMPTED instance may also still exist (terminating it is always safe)."""

ENDED_RETENTION = timedelta(hours=1)
"""How long after its end a released instance may still be listed (see ``list`` in the module docstring)."""


def tags_match(have: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """True when ``have`` holds every ``wanted`` key with exactly its value (no wildcards)."""
    return all(k in have and have[k] == v for k, v in wanted.items())


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What to launch: an offer, the job's environment and command, and identifying tags.

    ``env`` carries the job contract (``COSTOPT_JOB_ID``, ``COSTOPT_CHECKPOINT_URI``,
    ``COSTOPT_EPOCH``); ``tags`` identify job and epoch so a reconciler can find every instance.
    """

    offer: OfferKey
    command: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None


@dataclass(frozen=True, slots=True)
class Instance:
    """A launched instance as the cloud reports it. ``launched_at`` None: not known yet."""

    instance_id: str
    offer: OfferKey
    state: InstanceState
    tags: Mapping[str, str]
    launched_at: datetime | None = None
    terminated_at: datetime | None = None
    exit_code: int | None = None
    """The job's exit code once its command ended (0: it finished; ``sim`` and ``local`` know it); None:
    still running, killed without one (terminated, preempted), or not known to the cloud."""


@dataclass(frozen=True, slots=True)
class Interruption:
    """A preemption notice (``deadline``: when the instance will be taken) or a preemption seen."""

    instance_id: str
    noticed_at: datetime
    deadline: datetime | None
    kind: str  # "notice" | "preempted"
    receipt: str | None = field(default=None, compare=False, repr=False)
    """What the provider needs to :meth:`~CloudProvider.acknowledge` the event (opaque; None: nothing to
    acknowledge, e.g. a preemption read from instance states)."""


class CloudProvider(Protocol):
    """One cloud (or the simulated cloud, or this machine); the contracts are in the module docstring."""

    name: str

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        """Launch ``spec`` once per token; a repeated token returns the instance it launched."""
        ...

    def terminate(self, instance_id: str) -> None:
        """Terminate (delete) the instance; gone or unknown instances are not an error."""
        ...

    def describe(self, instance_id: str) -> Instance:
        """The instance now; :class:`NotFoundError` when the provider cannot find it."""
        ...

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        """costopt's instances whose tags include ``tags`` exactly: all that still exist, in any state,
        plus possibly ones released less than :data:`ENDED_RETENTION` ago; oldest launch first."""
        ...

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        """Preemption notices and preemptions observed at or after ``since``."""
        ...

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        """The caller acted on ``interruptions``: a provider that queues notices forgets them now (until
        then they may come again). Events without a ``receipt`` are ignored; never raises."""
        ...

    def output(self, instance_id: str, *, tail: int | None = None) -> str:
        """The instance's own console output (its job's stdout/stderr, or what the cloud captured of its
        console), the last ``tail`` lines (None: all it keeps); "" when there is none yet.
        :class:`NotFoundError` for an instance the provider cannot find."""
        ...


class CloudError(CostoptError):
    """A cloud refused or failed a request; subclasses say why."""


class CapacityError(CloudError):
    """No capacity for that offer now (spot or on-demand): try another offer later."""


class QuotaError(CloudError):
    """The account's quota is exhausted for that instance type or region: raise it or go elsewhere."""


class AuthError(CloudError):
    """Credentials missing or refused: check the SDK's default credential chain."""


class NotFoundError(CloudError):
    """The instance (or resource) does not exist (any more)."""


class ProviderConfigError(CostoptError, ValueError):
    """A provider cannot be built from the settings: the message names the ``COSTOPT_*`` variable to set."""

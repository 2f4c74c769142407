"""What the core needs from a cloud: launch, terminate, describe, list, interruptions.

Every provider (``providers/aws.py``, ``gcp.py``, ``azure.py``, ``sim.py``, ``local.py``) implements
:class:`CloudProvider`; the migrator and the rebalancer only see this protocol (as Karpenter's
scheduler only sees its CloudProvider). Errors are the typed ones below, translated from each SDK.

Contracts:
- ``launch(spec, idempotency_token)`` creates at most one instance per token: calling it again
  with the same token returns the instance already launched (found by tag), never a second one.
- ``terminate(instance_id)`` is idempotent: terminating a gone instance is not an error.
- ``interruptions(since)`` returns preemption notices and preemptions observed since a time.
- Times are tz-aware UTC; prices USD per hour.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from costopt.domain import OfferKey
from costopt.errors import CostoptError


class InstanceState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    TERMINATED = "terminated"
    PREEMPTED = "preempted"


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


@dataclass(frozen=True, slots=True)
class Interruption:
    """A preemption notice (``deadline``: when the instance will be taken) or a preemption seen."""

    instance_id: str
    noticed_at: datetime
    deadline: datetime | None
    kind: str  # "notice" | "preempted"


class CloudProvider(Protocol):
    """One cloud (or the simulated cloud, or this machine)."""

    name: str

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance: ...

    def terminate(self, instance_id: str) -> None: ...

    def describe(self, instance_id: str) -> Instance: ...

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]: ...

    def interruptions(self, since: datetime) -> builtins.list[Interruption]: ...


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

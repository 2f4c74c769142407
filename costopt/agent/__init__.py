"""The job's side of the contract: a small library for training loops (standard library only).

A training image needs nothing but Python and this package: no numpy, no fsspec, none of the
service's dependencies (fsspec is imported only when a checkpoint URI names a remote store).

- :class:`Agent` (``Agent.from_env()``): ``restore()``, ``report(step)``, ``checkpoint(step, state)``
  (atomic, fenced by the epoch: :class:`StaleEpoch`), ``should_checkpoint()``, ``should_stop()``,
  ``time_left()`` before a preemption notice's deadline, ``finish(step)``;
- :mod:`costopt.agent.control`: the migrator's side (claim an epoch, request a checkpoint, read the
  latest checkpoint and the progress, audit a job's steps);
- :mod:`costopt.agent.notices`: preemption notices (file, AWS, GCP, Azure metadata) and deadlines.
"""

from costopt.agent.contract import (
    CONTRACT_VARIABLES,
    ENV_CHECKPOINT_URI,
    ENV_EPOCH,
    ENV_JOB_ID,
    ENV_JOB_STEPS,
    ENV_JOB_TYPE,
    ENV_NOTICE_FILE,
    ENV_NOTICE_SOURCE,
    ENV_STEPS_PER_SECOND,
    JOB_VARIABLES,
    contract_env,
    job_env,
)
from costopt.agent.core import Agent
from costopt.agent.errors import AgentConfigError, AgentError, CheckpointError, ForeignCheckpoint, StaleEpoch
from costopt.agent.layout import Checkpoint, CheckpointRef
from costopt.agent.notices import CHECKPOINT_MARGIN_SECONDS, NOTICE_SECONDS, Notice
from costopt.agent.progress import EpochProgress, ProgressAudit, audit
from costopt.agent.storage import Storage, open_storage

__all__ = [
    "CHECKPOINT_MARGIN_SECONDS",
    "CONTRACT_VARIABLES",
    "ENV_CHECKPOINT_URI",
    "ENV_EPOCH",
    "ENV_JOB_ID",
    "ENV_JOB_STEPS",
    "ENV_JOB_TYPE",
    "ENV_NOTICE_FILE",
    "ENV_NOTICE_SOURCE",
    "ENV_STEPS_PER_SECOND",
    "JOB_VARIABLES",
    "NOTICE_SECONDS",
    "Agent",
    "AgentConfigError",
    "AgentError",
    "Checkpoint",
    "CheckpointError",
    "CheckpointRef",
    "EpochProgress",
    "ForeignCheckpoint",
    "Notice",
    "ProgressAudit",
    "StaleEpoch",
    "Storage",
    "audit",
    "contract_env",
    "job_env",
    "open_storage",
]

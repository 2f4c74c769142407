"""Errors of the job-side agent (standard library only, like the rest of :mod:`costopt.agent`)."""

from __future__ import annotations

from costopt.errors import CostoptError


class AgentError(CostoptError):
    """Base of the agent's errors."""


class AgentConfigError(AgentError, ValueError):
    """The job's environment does not carry the contract (``COSTOPT_JOB_ID``, ``COSTOPT_CHECKPOINT_URI``,
    ``COSTOPT_EPOCH``) or carries an invalid value: the launcher must set them."""


class StaleEpoch(AgentError):
    """This copy's fencing epoch is older than the epoch claimed at the checkpoint location (or than
    the latest checkpoint's): another copy owns the job now. Stop without writing anything."""

    def __init__(self, epoch: int, current: int, what: str = "the epoch marker") -> None:
        super().__init__(
            f"epoch {epoch} is stale: {what} is at epoch {current}; a newer copy owns this job, "
            "so this copy must stop without writing"
        )
        self.epoch = epoch
        self.current = current


class CheckpointError(AgentError, ValueError):
    """A checkpoint cannot be written as asked (a step older than the one restored or last written,
    a state that is neither bytes nor JSON-serializable)."""


class ForeignCheckpoint(AgentError):
    """The checkpoint location holds another job's checkpoints: the URI is shared by mistake."""

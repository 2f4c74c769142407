"""A managed job's states and the transitions between them.

::

    queued -> launching -> running -> (migrating | recovering) -> running ... -> succeeded | failed | cancelled

- ``queued``: accepted and planned (the quote), waiting for the engine to launch it;
- ``launching``: the first copy is being launched (the migrator's recovery from epoch 0);
- ``running``: a copy runs and reports progress;
- ``migrating``: a move is in flight (checkpoint, new copy, fencing, verification);
- ``recovering``: the copy was lost (preempted, vanished) and a new one is being launched from the
  last checkpoint;
- ``succeeded``: the agent reported the job done with exactly ``steps_total`` steps;
- ``failed``: the command failed (its exit code is kept), or no offer could run it; never retried for ever;
- ``cancelled``: cancelled by its team (checkpointed, terminated; the record stays).

Every change is written with its reason as a ``job_events`` row (``kind="state"``).
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    LAUNCHING = "launching"
    RUNNING = "running"
    MIGRATING = "migrating"
    RECOVERING = "recovering"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES: frozenset[JobState] = frozenset(JobState) - TERMINAL_STATES

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.LAUNCHING, JobState.FAILED, JobState.CANCELLED}),
    JobState.LAUNCHING: frozenset({JobState.RUNNING, JobState.RECOVERING, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset(
        {JobState.MIGRATING, JobState.RECOVERING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.MIGRATING: frozenset(
        {JobState.RUNNING, JobState.RECOVERING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.RECOVERING: frozenset({JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
"""Allowed changes: anything else is a bug (the writer raises)."""


def can_transition(src: JobState, dst: JobState) -> bool:
    """True when ``src -> dst`` is an allowed change (a state never changes to itself)."""
    return dst in TRANSITIONS[src]

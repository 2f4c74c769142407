"""The environment contract between the launcher (migrator, provider) and a training job."""

from __future__ import annotations

import math

ENV_JOB_ID = "COSTOPT_JOB_ID"
ENV_CHECKPOINT_URI = "COSTOPT_CHECKPOINT_URI"
ENV_EPOCH = "COSTOPT_EPOCH"
ENV_NOTICE_FILE = "COSTOPT_NOTICE_FILE"
"""Optional: a file the agent watches for a preemption notice (the local provider sets it)."""
ENV_NOTICE_SOURCE = "COSTOPT_NOTICE_SOURCE"
"""Optional: ``aws``, ``gcp``, ``azure``, ``file:<path>`` (comma-separated): metadata to poll for notices."""
ENV_CHECKPOINT_MARGIN = "COSTOPT_CHECKPOINT_MARGIN"
"""Optional: seconds before a notice's deadline by which the checkpoint must be finished (default 5)."""

ENV_JOB_STEPS = "COSTOPT_JOB_STEPS"
"""Optional: the job's total steps (a positive integer); the service sets it for every job it submits. The
simulated cloud runs an agent only for a spec that carries it (it must know when the job is done)."""
ENV_JOB_TYPE = "COSTOPT_JOB_TYPE"
"""Optional: the job's type in the throughput catalog (e.g. ``ResNet-50 (batch size 128)``); the simulated
cloud's throughput for the job on each offer comes from the catalog."""
ENV_STEPS_PER_SECOND = "COSTOPT_STEPS_PER_SECOND"
"""Optional: the job's own throughput (steps/s, > 0) for jobs submitted with it; wins over the catalog."""
ENV_PRECISION = "COSTOPT_PRECISION"
"""Optional: how the job computes, ``fp32`` (PyTorch's default), ``tf32`` or ``amp`` (docs/throughput.md);
the simulated cloud runs a catalog job at the catalog's throughput for that precision. Absent: ``fp32``."""
PRECISIONS = ("fp32", "tf32", "amp")

CONTRACT_VARIABLES = (ENV_JOB_ID, ENV_CHECKPOINT_URI, ENV_EPOCH)
JOB_VARIABLES = (ENV_JOB_STEPS, ENV_JOB_TYPE, ENV_STEPS_PER_SECOND, ENV_PRECISION)
"""The optional variables describing the work (how much, what kind, how fast), beyond the contract."""


def contract_env(job_id: str, checkpoint_uri: str, epoch: int) -> dict[str, str]:
    """The variables a launcher puts in ``LaunchSpec.env`` for one copy of a job."""
    if not job_id:
        raise ValueError("job id must not be empty")
    if not checkpoint_uri:
        raise ValueError("checkpoint URI must not be empty")
    if epoch < 1:
        raise ValueError(f"fencing epochs start at 1, got {epoch}")
    return {ENV_JOB_ID: job_id, ENV_CHECKPOINT_URI: checkpoint_uri, ENV_EPOCH: str(int(epoch))}


def job_env(
    steps: int,
    *,
    job_type: str | None = None,
    steps_per_second: float | None = None,
    precision: str | None = None,
) -> dict[str, str]:
    """The optional job variables (:data:`JOB_VARIABLES`) a service puts in a job's ``env``: its total
    ``steps`` (> 0), its catalog type, its own throughput (steps/s, > 0) and its precision (one of
    :data:`PRECISIONS`) when given."""
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise ValueError(f"a job's steps must be a positive integer, got {steps!r}")
    env = {ENV_JOB_STEPS: str(int(steps))}
    if job_type is not None:
        if not job_type.strip():
            raise ValueError("job type must not be empty")
        env[ENV_JOB_TYPE] = job_type.strip()
    if steps_per_second is not None:
        if not (steps_per_second > 0 and math.isfinite(steps_per_second)):
            raise ValueError(f"steps per second must be a finite number > 0, got {steps_per_second!r}")
        env[ENV_STEPS_PER_SECOND] = repr(float(steps_per_second))
    if precision is not None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        env[ENV_PRECISION] = precision
    return env

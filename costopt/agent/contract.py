"""The environment contract between the launcher (migrator, provider) and a training job."""

from __future__ import annotations

ENV_JOB_ID = "COSTOPT_JOB_ID"
ENV_CHECKPOINT_URI = "COSTOPT_CHECKPOINT_URI"
ENV_EPOCH = "COSTOPT_EPOCH"
ENV_NOTICE_FILE = "COSTOPT_NOTICE_FILE"
"""Optional: a file the agent watches for a preemption notice (the local provider sets it)."""
ENV_NOTICE_SOURCE = "COSTOPT_NOTICE_SOURCE"
"""Optional: ``aws``, ``gcp``, ``azure``, ``file:<path>`` (comma-separated): metadata to poll for notices."""
ENV_CHECKPOINT_MARGIN = "COSTOPT_CHECKPOINT_MARGIN"
"""Optional: seconds before a notice's deadline by which the checkpoint must be finished (default 5)."""

CONTRACT_VARIABLES = (ENV_JOB_ID, ENV_CHECKPOINT_URI, ENV_EPOCH)


def contract_env(job_id: str, checkpoint_uri: str, epoch: int) -> dict[str, str]:
    """The variables a launcher puts in ``LaunchSpec.env`` for one copy of a job."""
    if not job_id:
        raise ValueError("job id must not be empty")
    if not checkpoint_uri:
        raise ValueError("checkpoint URI must not be empty")
    if epoch < 1:
        raise ValueError(f"fencing epochs start at 1, got {epoch}")
    return {ENV_JOB_ID: job_id, ENV_CHECKPOINT_URI: checkpoint_uri, ENV_EPOCH: str(int(epoch))}

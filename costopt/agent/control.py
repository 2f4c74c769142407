"""The service's side of the checkpoint location: what the migrator and ``costopt drill`` call.

- :func:`claim_epoch` raises the fencing marker before a new copy is launched (so the old copy's
  next checkpoint is refused), idempotently;
- :func:`request_checkpoint` asks the running copy for a checkpoint; :func:`request_served` tells
  when the latest checkpoint answers it;
- :func:`latest` describes the latest checkpoint without handing its state around: from its manifest
  (a small JSON file the agent publishes next to it), so a poll never reads the checkpoint itself;
  only a checkpoint without a manifest (an older agent's) is read, the old way;
- :func:`progress` / :func:`audit_job` read the progress logs (is the new copy progressing? did the
  job do exactly the steps it asked for?).

Standard library only (fsspec for remote URIs, lazily), like the rest of :mod:`costopt.agent`.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from costopt.agent.errors import StaleEpoch
from costopt.agent.layout import (
    REQUEST_FILE,
    Checkpoint,
    Manifest,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_epoch_marker,
    read_manifest,
    read_request,
    write_epoch_marker,
)
from costopt.agent.progress import EpochProgress, ProgressAudit, audit, read_records, storage_epoch_progress
from costopt.agent.storage import Storage, open_storage


def _storage(location: str | Storage) -> Storage:
    return open_storage(location) if isinstance(location, str) else location


def current_epoch(location: str | Storage) -> int:
    """The epoch claimed at a checkpoint location (0: never claimed)."""
    return read_epoch_marker(_storage(location))


def claim_epoch(location: str | Storage, epoch: int, *, at: float | None = None) -> int:
    """Raise the fencing marker to ``epoch`` before launching the copy that carries it.

    Idempotent: claiming the epoch already claimed changes nothing. Refuses (:class:`StaleEpoch`) to
    lower the marker: a migrator resuming with an older epoch than the location's must not launch.
    Returns the marker's value.
    """
    if epoch < 1:
        raise ValueError(f"fencing epochs start at 1, got {epoch}")
    storage = _storage(location)
    current = read_epoch_marker(storage)
    if current > epoch:
        raise StaleEpoch(epoch, current)
    newest = list_checkpoints(storage)
    if newest and newest[-1].epoch > epoch:
        raise StaleEpoch(epoch, newest[-1].epoch, "the latest checkpoint")
    if current < epoch:
        write_epoch_marker(storage, epoch, at=time.time() if at is None else at, by="migrator", temp_tag="m")
    return epoch


def request_checkpoint(
    location: str | Storage,
    *,
    epoch: int | None = None,
    request_id: str | None = None,
    reason: str = "",
    at: float | None = None,
) -> str:
    """Ask the running copy (of ``epoch``, or whichever runs) for a checkpoint; returns the request id.

    The agent answers at its next poll (about a second on local storage, five on object stores): the
    checkpoint it writes carries the id (:func:`request_served`). Writing the same id again is a no-op
    for the agent, so a resumed migrator may repeat the call with its stored id.
    """
    storage = _storage(location)
    rid = request_id or f"req-{secrets.token_hex(8)}"
    doc: dict[str, Any] = {"id": rid, "requested_at": time.time() if at is None else at, "reason": reason}
    if epoch is not None:
        doc["epoch"] = epoch
    storage.write_atomic(REQUEST_FILE, json.dumps(doc).encode(), temp_tag="m")
    return rid


def pending_request(location: str | Storage) -> dict[str, Any] | None:
    """The request file's content, if any."""
    return read_request(_storage(location))


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """The latest checkpoint, without its state.

    ``served_request_ids``: requests it or an earlier checkpoint of its lineage answered (from its
    manifest; only ``request_id`` for a checkpoint without one). ``size`` / ``sha256``: of the file /
    its payload (None when read from a checkpoint without a manifest)."""

    epoch: int
    step: int
    job_id: str
    run_id: str
    created_at: float
    request_id: str | None
    name: str
    served_request_ids: tuple[str, ...] = ()
    size: int | None = None
    sha256: str | None = None

    @classmethod
    def of(cls, ckpt: Checkpoint) -> CheckpointInfo:
        served = (ckpt.request_id,) if ckpt.request_id else ()
        return cls(ckpt.epoch, ckpt.step, ckpt.job_id, ckpt.run_id, ckpt.created_at, ckpt.request_id, ckpt.name, served)

    @classmethod
    def of_manifest(cls, m: Manifest) -> CheckpointInfo:
        return cls(
            m.epoch,
            m.step,
            m.job_id,
            m.run_id,
            m.created_at,
            m.request_id,
            m.name,
            m.served_request_ids,
            m.size,
            m.sha256,
        )


def latest(location: str | Storage) -> CheckpointInfo | None:
    """The latest checkpoint (greatest ``(epoch, step)``), or None.

    Reads one directory listing and the newest checkpoint's manifest; a checkpoint without a
    (readable) manifest is read and verified instead, and skipped when torn, as :func:`restore_latest`
    does. The state is never verified through a manifest: the agent publishes a manifest only after
    its checkpoint, and a restore verifies the checksum (falling back to an older checkpoint)."""
    storage = _storage(location)
    for ref in reversed(list_checkpoints(storage)):
        manifest = read_manifest(storage, ref)
        if manifest is not None:
            return CheckpointInfo.of_manifest(manifest)
        ckpt = load_checkpoint(storage, ref)
        if ckpt is not None:
            return CheckpointInfo.of(ckpt)
    return None


def restore_latest(location: str | Storage) -> Checkpoint | None:
    """The latest valid checkpoint with its state (read-only: claims nothing)."""
    return latest_checkpoint(_storage(location))


def request_served(location: str | Storage, request_id: str) -> bool:
    """True when the latest checkpoint was written in answer to ``request_id``, or any checkpoint
    after it (a newer checkpoint contains at least as much work)."""
    storage = _storage(location)
    info = latest(storage)
    if info is None:
        return False
    if info.request_id == request_id or request_id in info.served_request_ids:
        return True
    req = read_request(storage)
    # A later checkpoint of the same or a newer epoch, written after the request, serves it too.
    return bool(
        req is not None and req.get("id") == request_id and info.created_at >= float(req.get("requested_at", 0))
    )


def progress(location: str | Storage, epoch: int) -> EpochProgress:
    """How the copy of ``epoch`` is doing (started, restored step, last step, checkpoints, done)."""
    return storage_epoch_progress(_storage(location), epoch)


def records(location: str | Storage, epoch: int | None = None) -> list[dict[str, Any]]:
    """The progress records at the location: every epoch's, or ``epoch``'s only."""
    return read_records(_storage(location), epoch)


def audit_job(location: str | Storage, steps_requested: int | None = None) -> ProgressAudit:
    """Audit the job's progress logs: steps done, lost, repeated (see :mod:`costopt.agent.progress`)."""
    return audit(read_records(_storage(location)), steps_requested)

"""The service's side of the worker protocol (:mod:`costopt.agent.worker`): one sync of one worker.

A worker reports its copies (job, epoch, last step and latest checkpoint from the agent's log, exit code
once exited); :meth:`WorkerSync.sync` records what they say and answers the desired state:

- **liveness**: the instance's ``last_seen_at``; its first sync makes it ``running`` (its GPUs count from
  the next round);
- **progress**: the holder copy's last step and checkpoint go to the fleet job (what the policy sees as
  steps remaining) and to the ``jobs`` row (``launching`` -> ``running`` at its first step);
- **exits** (compare-and-set on the job's holder and epoch, so a late or repeated report changes nothing):
  the job is free again (its next copy may start anywhere), ``done`` when the copy finished its steps
  (``jobs``: ``succeeded``), ``cancelled`` when a cancel was asked, ``failed`` after
  :data:`MAX_FAILURES` copies exited on their own with an error; every exited copy is acknowledged;
- **run**: the jobs the current round puts on this instance whose copy runs here already, or that no copy
  holds (claimed now: epoch + 1, :meth:`FleetRepository.claim`); a job whose previous copy still runs
  elsewhere waits until that copy's exit is reported (never two writers).

An instance that is ``lost`` or ``released`` gets ``release: true`` and nothing to run: its worker stops
its copies and ends. A worker that reports ``stopping`` (it got SIGTERM, or its instance a preemption
notice) gets nothing to run and no job is claimed for it: a job whose copy it stopped stays free for the
next round elsewhere. A token that does not match is refused (:class:`WorkerRefused`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from costopt.agent.contract import contract_env, job_env
from costopt.errors import CostoptError
from costopt.fleets.model import FleetJob, FleetJobStatus, InstanceState
from costopt.fleets.store import FleetRepository
from costopt.jobs.model import JobState
from costopt.jobs.records import ConcurrentUpdate, IllegalTransition, JobNotFound, JobRecord, JobRepository

log = logging.getLogger("costopt.fleets")

__all__ = ["MAX_FAILURES", "WorkerRefused", "WorkerSync", "hash_token", "new_token"]

MAX_FAILURES = 3
"""Copies of a job that may exit with an error on their own (not stopped) before the job is failed."""

STOPPED_CODES = frozenset({75, 3, -15, 143})
"""Exit codes of a copy that stopped as asked (checkpointed: 75), was fenced out (3) or was terminated."""


class WorkerRefused(CostoptError):
    """Unknown worker or wrong token."""


def new_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _utc(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(float(t), UTC)


@dataclass(slots=True)
class WorkerSync:
    """Answers workers' syncs over ``repo`` and ``jobs``. ``poll_s``: the poll interval workers are told.

    A sync is cheap when nothing changes: one read of the fleet's row and one of the jobs the worker holds
    or is given; the worker's ``last_seen_at`` and its copies' progress are written at most every
    ``write_every_s`` seconds (a checkpoint, an exit or a first step are written at once); job specs (for
    the command and the checkpoint location) are read once per job."""

    repo: FleetRepository
    jobs: JobRepository
    poll_s: float = 0.5
    now: Callable[[], datetime] | None = None
    write_every_s: float = 1.0
    _specs: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    def sync(self, worker_id: str, token: str, report: Mapping[str, Any]) -> dict[str, Any]:
        inst = self.repo.instance(worker_id)
        if inst is None or inst.token_hash is None or not hmac.compare_digest(inst.token_hash, hash_token(token)):
            raise WorkerRefused(f"unknown worker {worker_id!r} or wrong token")
        now = self.now() if self.now is not None else self.repo.now()
        if inst.state in (InstanceState.LAUNCHING, InstanceState.RUNNING, InstanceState.DRAINING) and (
            inst.last_seen_at is None
            or (now - inst.last_seen_at).total_seconds() >= self.write_every_s
            or inst.state is InstanceState.LAUNCHING
        ):
            values: dict[str, Any] = {"last_seen_at": now}
            if inst.first_seen_at is None:
                values["first_seen_at"] = now
            if inst.state is InstanceState.LAUNCHING:
                values["state"] = InstanceState.RUNNING
                self.repo.mark_dirty(inst.fleet_id)  # its GPUs count from the next round
                log.info(
                    "fleet %s: worker %s is up (%d %s GPUs)", inst.fleet_id, worker_id, inst.gpus, inst.accelerator
                )
            self.repo.update_instance(worker_id, expect=(inst.state,), **values)
        fleet = self.repo.get(inst.fleet_id)
        mine_now = {fj.job_id: fj for fj in self.repo.holders(worker_id)}
        ack: list[dict[str, Any]] = []
        changed = False
        for copy in report.get("copies") or ():
            job_id, epoch = str(copy.get("job_id")), int(copy.get("epoch", 0))
            fj = mine_now.get(job_id) or self.repo.job(job_id)
            exited = copy.get("state") == "exited"
            if fj is None or fj.fleet_id != fleet.id:
                if exited:
                    ack.append({"job_id": job_id, "epoch": epoch})
                continue
            mine = fj.holder == worker_id and fj.holder_epoch == epoch
            if mine:
                changed |= self._progress(fj, copy, now, force=exited)
            if exited:
                if mine:
                    self._exited(fj, worker_id, epoch, copy)
                    changed = True
                ack.append({"job_id": job_id, "epoch": epoch})
        if changed:
            mine_now = {fj.job_id: fj for fj in self.repo.holders(worker_id)}
        # terminated (an ended draining instance waits for its bill before it is released): nothing more runs
        gone = inst.state in (InstanceState.LOST, InstanceState.RELEASED) or inst.ended_at is not None
        stopping = bool(report.get("stopping"))  # SIGTERM, or its instance's preemption notice
        run, waiting = (
            ([], 0) if gone or stopping else self._run(fleet.id, fleet.round, worker_id, inst.accelerator, mine_now)
        )
        return {
            "round": fleet.round,
            "round_ends_at": fleet.round_ends_at.isoformat() if fleet.round_ends_at else None,
            "poll_s": self.poll_s,
            "run": run,
            "waiting": waiting,
            "ack": ack,
            "release": gone,
        }

    # -- reports ---------------------------------------------------------------------------------------

    def _progress(self, fj: FleetJob, copy: Mapping[str, Any], now: datetime, *, force: bool = False) -> bool:
        """Record the holder copy's progress (at most every ``write_every_s``, at once for a new checkpoint,
        a first step or ``force``); True when something was written."""
        step, ckpt = copy.get("step"), copy.get("checkpoint_step")
        values: dict[str, Any] = {}
        if step is not None and int(step) != fj.steps_done:
            values["steps_done"] = int(step)
        if ckpt is not None and int(ckpt) > fj.checkpoint_step:
            values["checkpoint_step"] = int(ckpt)
        restored = int(copy.get("restored_step") or 0)
        first = step is not None and int(step) > restored and fj.steps_done <= restored
        due = (now - fj.updated_at).total_seconds() >= self.write_every_s
        if not values or not (due or force or first or "checkpoint_step" in values):
            return False
        self.repo.set_job(fj.job_id, expect_holder=(fj.holder, fj.holder_epoch), **values)
        if step is not None:
            self.jobs.set_progress(fj.job_id, int(step))
            if int(step) > restored:
                self._job_to(fj.job_id, JobState.RUNNING, "stepping", expect=JobState.LAUNCHING)
        return True

    def _exited(self, fj: FleetJob, worker_id: str, epoch: int, copy: Mapping[str, Any]) -> None:
        code = copy.get("exit_code")
        code = None if code is None else int(code)
        step = int(copy.get("step") or 0)
        ckpt = copy.get("checkpoint_step")
        holder = (worker_id, epoch)
        job = self._job(fj.job_id)
        common: dict[str, Any] = {"holder": None, "holder_epoch": None}
        if ckpt is not None:
            common["checkpoint_step"] = max(int(ckpt), fj.checkpoint_step)
        if code == 0 and bool(copy.get("done")) and step >= fj.steps_total:
            at = _utc(copy.get("ended_at")) or self.repo.now()
            if self.repo.set_job(
                fj.job_id,
                expect_holder=holder,
                status=FleetJobStatus.DONE,
                steps_done=step,
                finished_at=at,
                target=None,
                reason="finished",
                **common,
            ):
                self.jobs.set_progress(fj.job_id, step)
                self._job_to(
                    fj.job_id, JobState.SUCCEEDED, f"finished its {fj.steps_total} steps in the fleet", exit_code=0
                )
                self.repo.mark_dirty(fj.fleet_id)
            return
        if job is not None and job.cancel_requested_at is not None:
            if self.repo.set_job(
                fj.job_id,
                expect_holder=holder,
                status=FleetJobStatus.CANCELLED,
                finished_at=self.repo.now(),
                target=None,
                reason="cancelled by its team",
                **common,
            ):
                self._job_to(
                    fj.job_id,
                    JobState.CANCELLED,
                    f"cancelled (checkpointed at step {common.get('checkpoint_step', fj.checkpoint_step)})",
                )
                self.repo.mark_dirty(fj.fleet_id)
            return
        stopped = code in STOPPED_CODES or code == -9
        failures = fj.failures + (0 if stopped else 1)
        if failures >= MAX_FAILURES:
            reason = f"{failures} copies exited with an error (the last with code {code})"
            if self.repo.set_job(
                fj.job_id,
                expect_holder=holder,
                status=FleetJobStatus.FAILED,
                failures=failures,
                finished_at=self.repo.now(),
                target=None,
                reason=reason,
                **common,
            ):
                self._job_to(fj.job_id, JobState.FAILED, reason, exit_code=code)
                self.repo.mark_dirty(fj.fleet_id)
            return
        self.repo.set_job(
            fj.job_id,
            expect_holder=holder,
            status=FleetJobStatus.WAITING,
            failures=failures,
            reason="" if stopped else f"copy of epoch {epoch} exited with code {code}",
            **common,
        )

    # -- desired state ---------------------------------------------------------------------------------

    def _run(
        self, fleet_id: str, round_number: int, worker_id: str, accelerator: str, mine: Mapping[str, FleetJob]
    ) -> tuple[list[dict[str, Any]], int]:
        """The copies that may run on the worker now, and how many jobs the round gives it whose previous
        copy still runs elsewhere (the worker polls sooner while some do)."""
        out: list[dict[str, Any]] = []
        waiting = 0
        for fj in mine.values():
            if fj.fleet_id != fleet_id or fj.status.finished or fj.target != worker_id:
                continue
            if fj.target_round != round_number:
                continue
            if fj.holder is None:
                job = self._job(fj.job_id)
                if job is None or job.cancel_requested_at is not None:
                    continue
                claimed = self.repo.claim(fj.job_id, worker_id, round_number)
                if claimed is None:
                    continue
                fj = claimed
                self._job_to(
                    fj.job_id, JobState.LAUNCHING, f"leased GPUs of fleet instance {worker_id}", expect=JobState.QUEUED
                )
            elif fj.holder != worker_id:
                waiting += 1
                continue  # its previous copy still runs elsewhere: next sync
            spec = self._spec(fj.job_id)
            if spec is None:
                continue
            out.append(self._entry(fj, spec, accelerator))
        return out, waiting

    def _entry(self, fj: FleetJob, spec: Mapping[str, Any], accelerator: str) -> dict[str, Any]:
        uri = str(spec.get("checkpoint_uri") or "")
        epoch = int(fj.holder_epoch or fj.epoch)
        env = contract_env(fj.job_id, uri, epoch)
        rate = fj.throughput.get(accelerator)
        env.update(job_env(fj.steps_total, job_type=spec.get("job_type"), steps_per_second=rate))
        return {
            "job_id": fj.job_id,
            "epoch": epoch,
            "gpus": list(fj.target_gpus),
            "command": [str(a) for a in spec.get("command") or ()],
            "env": env,
            "checkpoint_uri": uri,
            "steps_total": fj.steps_total,
        }

    # -- jobs rows -------------------------------------------------------------------------------------

    def _job(self, job_id: str) -> JobRecord | None:
        try:
            job = self.jobs.get(job_id)
        except JobNotFound:
            return None
        self._specs[job_id] = job.spec
        return job

    def _spec(self, job_id: str) -> Mapping[str, Any] | None:
        """The job's submitted spec (read once: it never changes)."""
        spec = self._specs.get(job_id)
        if spec is None:
            job = self._job(job_id)
            spec = None if job is None else job.spec
        if len(self._specs) > 100_000:
            self._specs.clear()
        return spec

    def _job_to(self, job_id: str, to: JobState, reason: str, *, expect: JobState | None = None, **fields: Any) -> None:
        """Move the ``jobs`` row (a fleet job goes queued -> launching -> running -> a terminal state)."""
        job = self._job(job_id)
        if job is None or job.state is to or job.state.terminal:
            return
        if expect is not None and job.state is not expect:
            return
        path = {
            JobState.RUNNING: [JobState.RUNNING],
            JobState.LAUNCHING: [JobState.LAUNCHING],
        }.get(to, [to])
        if job.state is JobState.QUEUED and to in (JobState.RUNNING, JobState.SUCCEEDED):
            path = [JobState.LAUNCHING, JobState.RUNNING, *([to] if to is JobState.SUCCEEDED else [])]
        elif job.state is JobState.LAUNCHING and to is JobState.SUCCEEDED:
            path = [JobState.RUNNING, JobState.SUCCEEDED]
        for step in path:
            try:
                job = self.jobs.transition(job_id, step, reason, **(fields if step is to else {}))
            except (ConcurrentUpdate, IllegalTransition) as exc:
                log.info("job %s: %s", job_id, exc)
                return

"""The fleet worker: runs on each instance of a fleet and starts and stops the jobs its round assigns it.

Standard library only, like the rest of :mod:`costopt.agent` (an instance needs Python and this package,
nothing else). Started by the instance's boot script on a cloud, and by the local provider as a process:

    COSTOPT_SERVICE_URL=http://service:8000 COSTOPT_FLEET_ID=fleet-... COSTOPT_WORKER_ID=fi-... \\
        COSTOPT_WORKER_TOKEN=... COSTOPT_WORKER_GPUS=4 python -m costopt.agent.worker

**Transport: HTTP to the service.** Every ``COSTOPT_WORKER_POLL`` seconds, at once when a job it runs
exits, just after its round's end, and every 50 ms while a lease waits for a copy elsewhere to stop, the
worker ``POST``s ``/v1/fleet-workers/<worker id>/sync`` with its token, reporting each copy it
runs or ran (job, fencing epoch, the last step and the latest checkpoint its agent logged, and, once it
exited, its exit code). The answer is the desired state: the copies that may run on this instance now
(``run``: job, epoch, GPU indices, command, environment). The worker then

- stops every copy that is not in ``run`` (its lease ended, or the job was cancelled): SIGTERM, which the
  agent answers with a checkpoint and an exit (``examples/train.py``: 75); SIGKILL after
  ``COSTOPT_WORKER_GRACE`` seconds;
- starts every copy of ``run`` it does not run yet, once no older copy of the same job runs here: it
  claims the copy's epoch at the job's checkpoint location (:func:`costopt.agent.control.claim_epoch`:
  an older copy anywhere can no longer write a checkpoint), then starts the command with the job contract
  (``COSTOPT_JOB_ID``, ``COSTOPT_CHECKPOINT_URI``, ``COSTOPT_EPOCH``), the job's variables (steps, its
  throughput here) and ``CUDA_VISIBLE_DEVICES`` set to its GPUs;
- reports an exited copy until the service acknowledges it (``ack``).

The service hands a job to a new worker only after its previous copy was reported exited (or its worker
was declared dead), and the new copy's epoch is claimed before it starts: never two writers, and a copy
that lost its worker is fenced out at its next checkpoint. Progress comes from the agents' own logs at
the checkpoint location, never from the worker's guess.

The worker ends (exit 0) when the service says its instance is released, after stopping its copies. On
SIGTERM (the instance is terminated) it stops its copies, reports them and exits. Job processes get
SIGKILL if the worker dies (``PR_SET_PDEATHSIG`` on Linux): a copy never outlives its worker unseen.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from costopt.agent import control
from costopt.agent.errors import StaleEpoch

log = logging.getLogger("costopt.agent.worker")

ENV_SERVICE_URL = "COSTOPT_SERVICE_URL"
ENV_FLEET_ID = "COSTOPT_FLEET_ID"
ENV_WORKER_ID = "COSTOPT_WORKER_ID"
ENV_WORKER_TOKEN = "COSTOPT_WORKER_TOKEN"
ENV_WORKER_GPUS = "COSTOPT_WORKER_GPUS"
ENV_WORKER_POLL = "COSTOPT_WORKER_POLL"
ENV_WORKER_GRACE = "COSTOPT_WORKER_GRACE"
ENV_WORKER_DIR = "COSTOPT_WORKER_DIR"
"""Where the worker writes its jobs' output (default: <temp dir>/costopt-worker/<worker id>)."""
WORKER_VARIABLES = (ENV_SERVICE_URL, ENV_FLEET_ID, ENV_WORKER_ID, ENV_WORKER_TOKEN, ENV_WORKER_GPUS)
"""What a worker needs in its environment (the service's launch sets them)."""

PASS_THROUGH = ("COSTOPT_NOTICE_FILE", "COSTOPT_NOTICE_SOURCE", "COSTOPT_CHECKPOINT_MARGIN")
"""The worker's own ``COSTOPT_*`` variables its jobs inherit (preemption notices); every other one (its
token above all) is withheld."""

EXIT_CONFIG = 2
EXIT_FENCED = 3
FAST_POLL_S = 0.05
"""How soon the worker syncs again while a lease waits for a copy elsewhere to stop, or a round just ended."""
BOUNDARY_DELAY_S = 0.05
"""The worker syncs this long after its round's end (the executor plans the next round at the boundary)."""


class WorkerError(Exception):
    """The worker cannot go on (bad configuration, or the service refused its token)."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    service_url: str
    fleet_id: str
    worker_id: str
    token: str
    gpus: int
    poll_s: float = 0.5
    grace_s: float = 30.0
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "costopt-worker")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerConfig:
        env = os.environ if env is None else env
        missing = [v for v in WORKER_VARIABLES if not env.get(v)]
        if missing:
            raise WorkerError(f"the worker needs {', '.join(missing)} in its environment")
        try:
            gpus = int(env[ENV_WORKER_GPUS])
            poll = float(env.get(ENV_WORKER_POLL) or 0.5)
            grace = float(env.get(ENV_WORKER_GRACE) or 30.0)
        except ValueError as exc:
            raise WorkerError(f"bad worker setting: {exc}") from exc
        if gpus < 1 or not poll > 0 or grace < 0:
            raise WorkerError(f"need {ENV_WORKER_GPUS} >= 1, {ENV_WORKER_POLL} > 0 and {ENV_WORKER_GRACE} >= 0")
        workdir = Path(env.get(ENV_WORKER_DIR) or Path(tempfile.gettempdir()) / "costopt-worker" / env[ENV_WORKER_ID])
        return cls(
            service_url=env[ENV_SERVICE_URL].rstrip("/"),
            fleet_id=env[ENV_FLEET_ID],
            worker_id=env[ENV_WORKER_ID],
            token=env[ENV_WORKER_TOKEN],
            gpus=gpus,
            poll_s=poll,
            grace_s=grace,
            workdir=workdir,
        )


@dataclass(slots=True)
class Copy:
    """One copy of a job this worker started (a process at a fencing epoch)."""

    job_id: str
    epoch: int
    uri: str
    gpus: tuple[int, ...]
    proc: subprocess.Popen[bytes] | None
    started_at: float
    stop_sent_at: float | None = None
    killed: bool = False
    exit_code: int | None = None
    ended_at: float | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.epoch)

    @property
    def running(self) -> bool:
        return self.exit_code is None


Transport = Callable[[str, Mapping[str, Any]], Mapping[str, Any]]
"""POSTs a JSON document to a path of the service and returns its JSON answer (raises OSError)."""


def http_transport(config: WorkerConfig, timeout: float = 10.0) -> Transport:
    def post(path: str, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        req = urllib.request.Request(
            config.service_url + path,
            data=json.dumps(doc).encode(),
            headers={"Authorization": f"Bearer {config.token}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                answer: Mapping[str, Any] = json.loads(resp.read() or b"{}")
                return answer
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403, 404):
                raise WorkerError(f"the service refused this worker ({exc.code}): {exc.read()[:500]!r}") from exc
            raise OSError(f"the service answered {exc.code}") from exc

    return post


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the worker dies (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


class Worker:
    """The worker of one fleet instance (see the module docstring). ``transport`` (tests) replaces HTTP;
    ``clock``: Unix seconds."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        transport: Transport | None = None,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.transport = transport or http_transport(config)
        self.base_env = {
            k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("COSTOPT_")
        } | {k: v for k, v in (os.environ if env is None else env).items() if k in PASS_THROUGH}
        self.clock = clock
        self.copies: dict[tuple[str, int], Copy] = {}
        self.stopping = False
        self.released = False
        self.syncs = 0
        self.waiting = 0
        self.round_ends_at: float | None = None
        config.workdir.mkdir(parents=True, exist_ok=True)

    # -- one sync --------------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """What the worker tells the service: every copy it runs, or ran and was not acknowledged."""
        out = []
        for c in self.copies.values():
            doc: dict[str, Any] = {
                "job_id": c.job_id,
                "epoch": c.epoch,
                "state": "running" if c.running else "exited",
                "exit_code": c.exit_code,
                "started_at": c.started_at,
                "ended_at": c.ended_at,
            }
            try:
                prog = control.progress(c.uri, c.epoch)
            except (OSError, ValueError) as exc:
                log.warning("job %s epoch %d: progress unreadable: %s", c.job_id, c.epoch, exc)
            else:
                doc["step"] = prog.last_step if prog.started else None
                doc["restored_step"] = prog.restored_step if prog.started else None
                doc["checkpoint_step"] = max(prog.checkpoints) if prog.checkpoints else None
                doc["done"] = prog.done
                doc["last_report_at"] = prog.last_report_at
            out.append(doc)
        return {"copies": out, "gpus": self.config.gpus, "stopping": self.stopping, "at": self.clock()}

    def sync(self) -> Mapping[str, Any]:
        """Report, read the desired state, apply it; returns the service's answer."""
        self.reap()
        answer = self.transport(f"/v1/fleet-workers/{self.config.worker_id}/sync", self.report())
        self.syncs += 1
        for ack in answer.get("ack") or ():
            key = (str(ack["job_id"]), int(ack["epoch"]))
            c = self.copies.get(key)
            if c is not None and not c.running:
                del self.copies[key]
        self.released = bool(answer.get("release"))
        wanted = [] if self.stopping or self.released else list(answer.get("run") or ())
        self.apply(wanted)
        self.waiting = int(answer.get("waiting") or 0) + sum(
            1 for w in wanted if (str(w["job_id"]), int(w["epoch"])) not in self.copies
        )
        ends = answer.get("round_ends_at")
        if ends:
            with contextlib.suppress(ValueError):
                self.round_ends_at = datetime.fromisoformat(str(ends)).timestamp()
        return answer

    def next_sync_in(self, poll_s: float) -> float:
        """Seconds until the next sync: the poll interval, sooner at the round's end (the new round's leases)
        and while a lease waits for a copy elsewhere to stop (:data:`FAST_POLL_S`)."""
        wait = poll_s
        if self.waiting:
            wait = min(wait, FAST_POLL_S)
        if self.round_ends_at is not None:
            until = self.round_ends_at + BOUNDARY_DELAY_S - self.clock()
            if until > 0:
                wait = min(wait, until)
            elif until > -poll_s:  # the round just ended: look again soon, the new one is being planned
                wait = min(wait, FAST_POLL_S)
        return wait

    def apply(self, wanted: Sequence[Mapping[str, Any]]) -> None:
        """Stop the copies not in ``wanted``; start those of ``wanted`` not running yet."""
        keys = {(str(w["job_id"]), int(w["epoch"])) for w in wanted}
        for c in list(self.copies.values()):
            if c.running and c.key not in keys:
                self.stop(c)
        for w in wanted:
            key = (str(w["job_id"]), int(w["epoch"]))
            if key in self.copies:
                continue
            if any(c.running and c.job_id == key[0] for c in self.copies.values()):
                continue  # an older copy of the job still stops here: start once it exited
            self.start(w)

    # -- copies ----------------------------------------------------------------------------------------

    def start(self, w: Mapping[str, Any]) -> Copy:
        """Claim the copy's epoch at its checkpoint location, then start it on its GPUs. A copy whose
        epoch is already overtaken is recorded as exited with :data:`EXIT_FENCED` (never started)."""
        job_id, epoch, uri = str(w["job_id"]), int(w["epoch"]), str(w["checkpoint_uri"])
        gpus = tuple(int(g) for g in w.get("gpus") or ())
        now = self.clock()
        try:
            control.claim_epoch(uri, epoch, at=now)
        except StaleEpoch as exc:
            log.warning("job %s: epoch %d is overtaken (%s): not started", job_id, epoch, exc)
            c = Copy(job_id, epoch, uri, gpus, None, now, exit_code=EXIT_FENCED, ended_at=now)
            self.copies[c.key] = c
            return c
        c = self.spawn(w, job_id, epoch, uri, gpus, now)
        self.copies[c.key] = c
        return c

    def spawn(self, w: Mapping[str, Any], job_id: str, epoch: int, uri: str, gpus: tuple[int, ...], now: float) -> Copy:
        """Start the copy's process (its epoch is claimed); a copy that cannot start is exited (127).
        The simulated cloud's worker (:mod:`providers.sim_worker`) runs a simulated agent here instead."""
        env = dict(self.base_env)
        env.update({str(k): str(v) for k, v in (w.get("env") or {}).items()})
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        out = self.config.workdir / f"{job_id}-e{epoch}.log"
        command = [str(a) for a in w["command"]]
        try:
            with open(out, "ab") as f:
                proc = subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    cwd=w.get("cwd") or None,
                    preexec_fn=_die_with_parent,
                )
        except OSError as exc:
            log.error("job %s epoch %d: cannot start %s: %s", job_id, epoch, command[:3], exc)
            c = Copy(job_id, epoch, uri, gpus, None, now, exit_code=127, ended_at=now)
        else:
            log.info("job %s epoch %d started on GPUs %s (pid %d)", job_id, epoch, list(gpus), proc.pid)
            c = Copy(job_id, epoch, uri, gpus, proc, now)
        return c

    def stop(self, c: Copy) -> None:
        """Ask the copy to checkpoint and stop (SIGTERM); SIGKILL it once the grace period is over."""
        if c.proc is None or not c.running:
            return
        now = self.clock()
        if c.stop_sent_at is None:
            c.stop_sent_at = now
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGTERM)
            log.info("job %s epoch %d: lease over, asked to checkpoint and stop", c.job_id, c.epoch)
        elif not c.killed and now - c.stop_sent_at > self.config.grace_s:
            c.killed = True
            with contextlib.suppress(ProcessLookupError):
                c.proc.kill()
            log.warning("job %s epoch %d ignored SIGTERM for %.0f s: SIGKILL", c.job_id, c.epoch, self.config.grace_s)

    def reap(self) -> bool:
        """Record the exit of copies that ended; True when one did since the last look."""
        ended = False
        for c in self.copies.values():
            if c.running and c.proc is not None:
                code = c.proc.poll()
                if code is not None:
                    c.exit_code, c.ended_at, ended = code, self.clock(), True
                    log.info("job %s epoch %d exited with %d", c.job_id, c.epoch, code)
                elif c.stop_sent_at is not None:
                    self.stop(c)  # SIGKILL when the grace period is over
        return ended

    # -- the loop --------------------------------------------------------------------------------------

    def run(self, *, max_seconds: float | None = None) -> int:
        """Sync every ``poll_s`` (and at once when a copy exits) until released (or ``max_seconds``)."""
        end = None if max_seconds is None else time.monotonic() + max_seconds
        signal.signal(signal.SIGTERM, self._on_term)
        next_sync = 0.0
        failures = 0
        while True:
            now = time.monotonic()
            if self.reap() or now >= next_sync:
                try:
                    self.sync()
                    failures = 0
                except WorkerError:
                    self.stop_all()
                    raise
                except (OSError, ValueError, KeyError) as exc:
                    failures += 1
                    if failures in (1, 10) or failures % 100 == 0:
                        log.warning("sync failed (%d in a row): %s", failures, exc)
                next_sync = time.monotonic() + self.next_sync_in(self.config.poll_s)
            if (self.released or self.stopping) and not any(c.running for c in self.copies.values()):
                with contextlib.suppress(OSError, ValueError, KeyError, WorkerError):
                    self.sync()  # the last report: every copy exited
                return 0
            if end is not None and time.monotonic() >= end:
                self.stop_all()
                return 0
            time.sleep(min(0.02, max(0.0, next_sync - time.monotonic())))

    def stop_all(self, timeout: float | None = None) -> None:
        """Stop every copy and wait for them (SIGKILL after the grace period)."""
        for c in self.copies.values():
            self.stop(c)
        limit = time.monotonic() + (self.config.grace_s + 5 if timeout is None else timeout)
        while any(c.running for c in self.copies.values()) and time.monotonic() < limit:
            self.reap()
            time.sleep(0.02)

    def _on_term(self, signum: int, frame: object) -> None:
        self.stopping = True


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("COSTOPT_WORKER_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        config = WorkerConfig.from_env()
    except WorkerError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    worker = Worker(config)
    log.info(
        "worker %s of fleet %s (%d GPUs) syncing with %s",
        config.worker_id,
        config.fleet_id,
        config.gpus,
        config.service_url,
    )
    try:
        return worker.run()
    except WorkerError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())

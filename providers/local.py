"""The ``local`` provider: each instance is a process on this machine; a preemption is a signal.

It implements :class:`costopt.cloud.CloudProvider` so the whole migration path (launch, notice,
checkpoint, preemption, relaunch, terminate, reconcile) runs for real in tests and in ``costopt drill``.

Every instance lives in ``<state_dir>/instances/<instance id>/``; nothing is kept only in memory, so a
migrator restarted after SIGKILL finds its instances, their tokens and their notices again:

- ``record.json``: offer, command, the spec's environment, tags, token, launch and termination times,
  the preemption notice (if any);
- ``claim`` (the supervisor's pid), ``started.json`` (supervisor and job pids), ``exit.json`` (the job's
  exit code), ``alive.lock`` (held by the supervisor for as long as it lives);
- ``stdout.log`` / ``stderr.log``; ``notice.json`` (the preemption notice the agent watches);
- ``<state_dir>/tokens/<sha256 of the token>.json`` maps an idempotency token to its instance;
- ``<state_dir>/events.jsonl``: notices and preemptions, for :meth:`LocalProvider.interruptions`.

The job runs under a small supervisor (``python -I -c``, standard library only) started in a new
session: the supervisor takes ``alive.lock`` and claims the instance with an exclusive create of
``claim`` (so an instance's command runs at most once, even if two launches race or a launcher dies
mid-launch), starts the command, and records its exit code. Liveness is "is ``alive.lock`` held", which
survives pid reuse and needs no parent-child relation. Signals go to the whole process group.

Preemption: :meth:`LocalProvider.preempt` writes ``notice.json`` (``{"deadline": ...}``, the job sees it
through ``COSTOPT_NOTICE_FILE``), optionally sends a signal (``notice_signal``, e.g. SIGUSR1), and
SIGKILLs the group once the notice period is over
(a timer, and every later call checks overdue notices, so a restarted provider still takes it).

Listing follows the rule of :mod:`costopt.cloud`: every instance whose process has not ended, and
ended ones (terminated, exited or preempted) until :data:`~costopt.cloud.ENDED_RETENTION` after their
end (by ``clock``); their records stay in ``state_dir`` for ``describe`` and :meth:`LocalProvider.history`
(every instance ever launched, for audits). There is no STOPPED state.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from costopt.cloud import (
    ENDED_RETENTION,
    CapacityError,
    CloudError,
    Instance,
    InstanceState,
    Interruption,
    LaunchSpec,
    NotFoundError,
    tags_match,
)
from costopt.domain import OfferKey
from costopt.settings import Settings
from providers.console import tail_lines

log = logging.getLogger("providers.local")

EXIT_DUPLICATE = 111
"""Exit code of a supervisor that found its instance already claimed (it runs nothing)."""

ENV_NOTICE_FILE = "COSTOPT_NOTICE_FILE"
ENV_INSTANCE_ID = "COSTOPT_INSTANCE_ID"
ENV_PROVIDER = "COSTOPT_PROVIDER"

# The supervisor: standard library only, run with -I so the job's PYTHONPATH cannot affect it.
_SUPERVISOR = r"""
import fcntl, json, os, signal, subprocess, sys, time

def atomic(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

def main():
    d, cmd = sys.argv[1], sys.argv[3:]
    lock = os.open(os.path.join(d, "alive.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    for _ in range(200):
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            time.sleep(0.01)
    else:
        return 111
    if os.path.exists(os.path.join(d, "cancelled")):
        return 0
    try:
        fd = os.open(os.path.join(d, "claim"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return 111
    os.write(fd, str(os.getpid()).encode())
    os.fsync(fd)
    os.close(fd)
    pending, box = [], []
    def on_signal(signum, frame):
        if not box:
            pending.append(signum)
    for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    try:
        child = subprocess.Popen(cmd)
    except OSError as exc:
        atomic(os.path.join(d, "started.json"), {"wrapper_pid": os.getpid(), "pid": None, "at": time.time()})
        atomic(os.path.join(d, "exit.json"), {"code": 127, "at": time.time(), "error": str(exc)})
        return 127
    box.append(child)
    atomic(os.path.join(d, "started.json"), {"wrapper_pid": os.getpid(), "pid": child.pid, "at": time.time()})
    for s in pending:
        child.send_signal(s)
    code = child.wait()
    atomic(os.path.join(d, "exit.json"), {"code": code, "at": time.time()})
    return 0

sys.exit(main())
"""


class InvalidSpec(CloudError, ValueError):
    """The launch spec cannot run here (no command, a working directory that does not exist)."""


@dataclass(frozen=True, slots=True)
class LocalStatus:
    """What this machine knows about an instance beyond :class:`~costopt.cloud.Instance`."""

    instance_id: str
    alive: bool
    supervisor_pid: int | None
    pid: int | None
    exit_code: int | None
    """The job's exit code (negative: killed by that signal); None while running or when the whole
    group was SIGKILLed (terminate's escalation, a preemption)."""
    stdout: Path
    stderr: Path
    notice_file: Path


def _now_dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class LocalProvider:
    """Runs each launched spec's command as a supervised process group on this machine.

    - ``state_dir``: where instances, tokens and events are kept (shared by every provider object and
      process pointed at it);
    - ``cwd``: working directory of the jobs (default: the provider process's);
    - ``grace_seconds``: :meth:`terminate` sends SIGTERM, then SIGKILL after this long;
    - ``notice_signal``: also sent to the job's group with a preemption notice (e.g. SIGUSR1 for jobs
      that handle it themselves). None by default: the agent reads the notice file at every
      ``should_checkpoint()`` anyway, and a signal whose default action is to terminate would kill a job
      that has already restored its default handlers on the way out;
    - ``inherit_env``: jobs start from this process's environment minus every ``COSTOPT_*`` variable,
      then the spec's ``env`` (the job contract), ``COSTOPT_NOTICE_FILE``, ``COSTOPT_INSTANCE_ID`` and
      ``COSTOPT_PROVIDER=local``;
    - ``clock``: Unix seconds, for recorded times and notice deadlines.
    """

    name = "local"

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        grace_seconds: float = 10.0,
        notice_signal: int | None = None,
        inherit_env: bool = True,
        python: str = sys.executable,
        start_timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.cwd = Path(cwd) if cwd is not None else None
        self.grace_seconds = grace_seconds
        self.notice_signal = notice_signal
        self.inherit_env = inherit_env
        self.python = python
        self.start_timeout = start_timeout
        self.clock = clock
        (self.state_dir / "instances").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "tokens").mkdir(parents=True, exist_ok=True)
        self._rlock = threading.RLock()
        self._depth = 0
        self._lock_fd: int | None = None
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._timers: dict[str, threading.Timer] = {}

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> LocalProvider:
        """Built from :class:`Settings`: its state lives in ``local_provider_dir``. ``overrides``
        (constructor arguments: ``cwd``, ``grace_seconds``, ...) win."""
        kwargs: dict[str, Any] = {"state_dir": settings.local_provider_dir}
        kwargs.update(overrides)
        return cls(**kwargs)

    # -- state directory -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive access to the state directory, across threads and processes (re-entrant)."""
        with self._rlock:
            if self._depth == 0:
                fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._lock_fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._lock_fd is not None:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                    os.close(self._lock_fd)
                    self._lock_fd = None

    def _dir(self, instance_id: str) -> Path:
        if not instance_id or "/" in instance_id or instance_id.startswith("."):
            raise NotFoundError(f"no local instance {instance_id!r}")
        return self.state_dir / "instances" / instance_id

    def _record(self, instance_id: str) -> dict[str, Any] | None:
        doc = _read_json(self._dir(instance_id) / "record.json")
        return doc if isinstance(doc, dict) else None

    def _require(self, instance_id: str) -> dict[str, Any]:
        rec = self._record(instance_id)
        if rec is None:
            raise NotFoundError(f"no local instance {instance_id!r} in {self.state_dir}")
        return rec

    def _save(self, instance_id: str, rec: dict[str, Any]) -> None:
        _write_json(self._dir(instance_id) / "record.json", rec)

    def _event(self, doc: dict[str, Any]) -> None:
        line = (json.dumps(doc, sort_keys=True) + "\n").encode()
        fd = os.open(self.state_dir / "events.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _token_path(self, token: str) -> Path:
        return self.state_dir / "tokens" / f"{hashlib.sha256(token.encode()).hexdigest()}.json"

    # -- process facts -------------------------------------------------------------------------------

    def _alive(self, instance_id: str) -> bool:
        """True while the instance's supervisor lives (it holds ``alive.lock``)."""
        self._reap(instance_id)
        path = self._dir(instance_id) / "alive.lock"
        if not path.exists():
            return False
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def _reap(self, instance_id: str) -> None:
        child = self._children.get(instance_id)
        if child is not None and child.poll() is not None:
            self._children.pop(instance_id, None)

    def _pgid(self, instance_id: str) -> int | None:
        """The job's process group: the supervisor's pid (it leads a new session)."""
        try:
            text = (self._dir(instance_id) / "claim").read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() else None

    def _signal(self, instance_id: str, sig: int) -> bool:
        pgid = self._pgid(instance_id)
        if pgid is None or not self._alive(instance_id):
            return False
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _wait_dead(self, instance_id: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while True:
            if not self._alive(instance_id):
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)

    # -- CloudProvider -------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        """Start ``spec.command`` as a new instance, or return the instance already launched with
        ``idempotency_token`` (never a second process, even after a crash mid-launch)."""
        if not idempotency_token:
            raise InvalidSpec("an idempotency token is required")
        if not spec.command:
            raise InvalidSpec("the local provider runs a command: LaunchSpec.command is empty")
        cwd = self.cwd
        if cwd is not None and not cwd.is_dir():
            raise InvalidSpec(f"working directory {cwd} does not exist")
        with self._locked():
            tok_path = self._token_path(idempotency_token)
            tok = _read_json(tok_path)
            if isinstance(tok, dict) and tok.get("instance_id"):
                instance_id = str(tok["instance_id"])
            else:
                instance_id = f"local-{secrets.token_hex(6)}"
                _write_json(tok_path, {"token": idempotency_token, "instance_id": instance_id, "at": self.clock()})
            inst_dir = self._dir(instance_id)
            inst_dir.mkdir(parents=True, exist_ok=True)
            rec = self._record(instance_id)
            if rec is None:
                rec = {
                    "instance_id": instance_id,
                    "token": idempotency_token,
                    "offer": spec.offer.to_doc(),
                    "command": list(spec.command),
                    "env": dict(spec.env),
                    "tags": dict(spec.tags),
                    "cwd": str(cwd) if cwd is not None else os.getcwd(),
                    "created_at": self.clock(),
                }
                self._save(instance_id, rec)
            elif list(spec.command) != rec.get("command"):
                log.warning(
                    "token %r already launched %s with another command; returning it", idempotency_token, instance_id
                )
            claimed = (inst_dir / "claim").exists()
            cancelled = (inst_dir / "cancelled").exists()
            if not claimed and not cancelled and not self._alive(instance_id):
                self._spawn(instance_id, rec)
        return self.describe(instance_id)

    def _job_env(self, instance_id: str, rec: Mapping[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.inherit_env:
            env.update({k: v for k, v in os.environ.items() if not k.startswith("COSTOPT_")})
        env.update({str(k): str(v) for k, v in dict(rec.get("env") or {}).items()})
        env[ENV_NOTICE_FILE] = str(self._dir(instance_id) / "notice.json")
        env[ENV_INSTANCE_ID] = instance_id
        env[ENV_PROVIDER] = "local"
        return env

    def _spawn(self, instance_id: str, rec: dict[str, Any]) -> None:
        inst_dir = self._dir(instance_id)
        argv = [self.python, "-I", "-c", _SUPERVISOR, str(inst_dir), "--", *rec["command"]]
        with open(inst_dir / "stdout.log", "ab") as out, open(inst_dir / "stderr.log", "ab") as err:
            try:
                child = subprocess.Popen(
                    argv,
                    cwd=rec.get("cwd") or None,
                    env=self._job_env(instance_id, rec),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                )
            except (FileNotFoundError, NotADirectoryError) as exc:
                raise InvalidSpec(f"cannot start {instance_id}: {exc}") from exc
            except OSError as exc:
                raise CapacityError(f"this machine cannot start a process now: {exc}") from exc
        self._children[instance_id] = child
        rec["spawned_at"] = self.clock()
        self._save(instance_id, rec)
        end = time.monotonic() + self.start_timeout
        while time.monotonic() < end:
            if (inst_dir / "started.json").exists() or (inst_dir / "exit.json").exists():
                return
            if child.poll() is not None:
                return  # the supervisor exited (a duplicate, or cancelled): describe tells
            time.sleep(0.005)
        log.warning("%s: the supervisor did not start the job within %.1f s", instance_id, self.start_timeout)

    def describe(self, instance_id: str) -> Instance:
        """The instance's state from its process: pending, running, stopping (terminating), terminated
        (exited or killed) or preempted (gone after a preemption notice)."""
        self._enforce(instance_id)
        rec = self._require(instance_id)
        inst_dir = self._dir(instance_id)
        alive = self._alive(instance_id)
        exit_doc = _read_json(inst_dir / "exit.json")
        preempt = rec.get("preempt")
        terminated_at: float | None = None
        if alive:
            state = InstanceState.STOPPING if rec.get("terminate_requested_at") else InstanceState.RUNNING
        elif not (inst_dir / "claim").exists() and exit_doc is None and not (inst_dir / "cancelled").exists():
            state = InstanceState.PENDING
        else:
            exit_at = float(exit_doc["at"]) if isinstance(exit_doc, dict) else None
            finished_first = (
                isinstance(exit_doc, dict)
                and exit_doc.get("code") == 0
                and preempt is not None
                and exit_at is not None
                and exit_at < float(preempt["deadline"])
            )
            preempted = preempt is not None and not finished_first
            state = InstanceState.PREEMPTED if preempted else InstanceState.TERMINATED
            candidates = [exit_at, rec.get("killed_at"), (preempt or {}).get("taken_at"), rec.get("ended_at")]
            known = [float(t) for t in candidates if t is not None]
            terminated_at = min(known) if known else None
        launched = rec.get("spawned_at", rec.get("created_at"))
        code = exit_doc.get("code") if isinstance(exit_doc, dict) and not alive else None
        return Instance(
            instance_id=instance_id,
            offer=OfferKey.from_doc(rec["offer"]),
            state=state,
            tags=dict(rec.get("tags") or {}),
            launched_at=_now_dt(float(launched)) if launched is not None else None,
            terminated_at=_now_dt(terminated_at) if terminated_at is not None else None,
            exit_code=int(code) if isinstance(code, int) else None,
        )

    def output(self, instance_id: str, *, tail: int | None = None) -> str:
        """The job's console: its ``stdout.log`` then its ``stderr.log`` (each as written), the last ``tail``
        lines of that (None: all); "" before it wrote anything. :class:`NotFoundError` for an unknown id."""
        if tail is not None and tail < 0:
            raise ValueError(f"tail must be >= 0 lines, got {tail}")
        self._require(instance_id)
        inst_dir = self._dir(instance_id)
        parts = []
        for name in ("stdout.log", "stderr.log"):
            try:
                parts.append((inst_dir / name).read_bytes().decode("utf-8", errors="replace"))
            except FileNotFoundError:
                continue
        text = "".join(p if p.endswith("\n") or not p else p + "\n" for p in parts)
        return tail_lines(text, tail)

    def terminate(self, instance_id: str) -> None:
        """SIGTERM the job's process group, SIGKILL it after ``grace_seconds``; returns once it is gone.
        Idempotent: a terminated, preempted or unknown instance is left as it is."""
        try:
            inst_dir = self._dir(instance_id)
        except NotFoundError:
            return
        with self._locked():
            rec = self._record(instance_id)
            if rec is None:
                return
            (inst_dir / "cancelled").touch()  # a supervisor not started yet will run nothing
            if not rec.get("terminate_requested_at"):
                rec["terminate_requested_at"] = self.clock()
                self._save(instance_id, rec)
        if self._signal(instance_id, signal.SIGTERM) and not self._wait_dead(instance_id, self.grace_seconds):
            log.warning("%s ignored SIGTERM for %.1f s: SIGKILL", instance_id, self.grace_seconds)
            self._signal(instance_id, signal.SIGKILL)
            self._wait_dead(instance_id, 10.0)
            with self._locked():
                rec = self._require(instance_id)
                rec.setdefault("killed_at", self.clock())
                self._save(instance_id, rec)
        with self._locked():
            rec = self._require(instance_id)
            if not self._alive(instance_id) and "ended_at" not in rec:
                rec["ended_at"] = self.clock()
                self._save(instance_id, rec)

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        """Every instance whose tags contain ``tags`` exactly, oldest first: all whose process has not ended,
        and ended ones until :data:`~costopt.cloud.ENDED_RETENTION` after their end (:meth:`history` keeps
        them all)."""
        horizon = self.clock() - ENDED_RETENTION.total_seconds()
        out: builtins.list[Instance] = []
        for created, inst in self._matching(tags):
            if inst.state in (InstanceState.TERMINATED, InstanceState.PREEMPTED):
                ended = inst.terminated_at.timestamp() if inst.terminated_at is not None else created
                if ended < horizon:
                    continue
            out.append(inst)
        return out

    def history(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        """Every instance ever launched in ``state_dir`` whose tags contain ``tags`` exactly, ended ones
        however long ago, oldest first: for audits (``costopt drill``), where ``list`` is for reconciling."""
        return [inst for _, inst in self._matching(tags)]

    def _matching(self, tags: Mapping[str, str]) -> builtins.list[tuple[float, Instance]]:
        """``(created_at, instance)`` of every recorded instance whose tags contain ``tags``, oldest first."""
        out: builtins.list[tuple[float, Instance]] = []
        for inst_dir in sorted((self.state_dir / "instances").iterdir()):
            rec = _read_json(inst_dir / "record.json")
            if not isinstance(rec, dict) or not tags_match(rec.get("tags") or {}, tags):
                continue
            out.append((float(rec.get("created_at", 0.0)), self.describe(inst_dir.name)))
        return sorted(out, key=lambda p: p[0])

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        """Nothing to do: notices are read from the instances' state, not a queue (see
        ``CloudProvider.acknowledge``)."""

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        """Notices and preemptions (``kind`` ``"notice"`` / ``"preempted"``) observed at or after ``since``."""
        self._enforce_all()
        since_ts = since.timestamp()
        out: builtins.list[Interruption] = []
        try:
            lines = (self.state_dir / "events.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if float(ev["at"]) < since_ts:
                continue
            deadline = ev.get("deadline")
            out.append(
                Interruption(
                    instance_id=str(ev["instance_id"]),
                    noticed_at=_now_dt(float(ev["at"])),
                    deadline=_now_dt(float(deadline)) if deadline is not None else None,
                    kind=str(ev["kind"]),
                )
            )
        return out

    # -- preemption ----------------------------------------------------------------------------------

    def preempt(self, instance_id: str, notice_seconds: float = 30.0, *, wait: bool = False) -> Interruption | None:
        """Preempt a running instance as a spot market would: post a notice (``notice.json`` with the
        deadline, and ``notice_signal`` if set), then SIGKILL the job's group ``notice_seconds`` later.
        ``notice_seconds <= 0``: taken at once, without any notice (a hard failure).

        Returns the notice (or, without notice, the preemption), None when the instance is not
        running. With ``wait``, returns only once the instance has been taken. A second call for an
        instance already under notice returns the first notice.
        """
        with self._locked():
            rec = self._require(instance_id)
            if rec.get("preempt"):
                p = rec["preempt"]
                kind = "notice" if p.get("notice", True) else "preempted"
                return Interruption(instance_id, _now_dt(p["noticed_at"]), _now_dt(p["deadline"]), kind)
            if not self._alive(instance_id):
                return None
            now = self.clock()
            if notice_seconds <= 0:
                rec["preempt"] = {"noticed_at": now, "deadline": now, "notice": False}
                self._save(instance_id, rec)
                self._enforce(instance_id, due=True)
                return Interruption(instance_id, _now_dt(now), _now_dt(now), "preempted")
            deadline = now + notice_seconds
            _write_json(
                self._dir(instance_id) / "notice.json",
                {"source": "local", "noticed_at": now, "deadline": deadline, "detail": "preemption"},
            )
            rec["preempt"] = {"noticed_at": now, "deadline": deadline, "notice": True}
            self._save(instance_id, rec)
            self._event({"instance_id": instance_id, "kind": "notice", "at": now, "deadline": deadline})
            if self.notice_signal is not None:
                self._signal(instance_id, self.notice_signal)
            timer = threading.Timer(notice_seconds, self._on_deadline, args=(instance_id,))
            timer.daemon = True
            self._timers[instance_id] = timer
            timer.start()
        if wait:
            time.sleep(max(0.0, deadline - self.clock()))
            self._enforce(instance_id, due=True)
        return Interruption(instance_id, _now_dt(now), _now_dt(deadline), "notice")

    def _on_deadline(self, instance_id: str) -> None:
        try:
            self._enforce(instance_id, due=True)
        except Exception:  # a timer thread has nobody to raise to; later calls enforce it again
            log.exception("%s: could not take the instance at the end of its notice", instance_id)

    def _enforce(self, instance_id: str, *, due: bool = False) -> None:
        """Take an instance whose notice period is over: SIGKILL its group, record the preemption."""
        with self._locked():
            rec = self._record(instance_id)
            p = (rec or {}).get("preempt")
            if rec is None or not p or p.get("taken_at") is not None:
                return
            now = self.clock()
            if not due and now < float(p["deadline"]):
                return
            was_alive = self._alive(instance_id)
            if was_alive:
                self._signal(instance_id, signal.SIGKILL)
                self._wait_dead(instance_id, 10.0)
            taken = max(now, float(p["deadline"])) if was_alive else float(p["deadline"])
            p["taken_at"] = taken
            rec["preempt"] = p
            self._save(instance_id, rec)
            self._event({"instance_id": instance_id, "kind": "preempted", "at": taken, "deadline": p["deadline"]})
            self._timers.pop(instance_id, None)

    def _enforce_all(self) -> None:
        for inst_dir in sorted((self.state_dir / "instances").iterdir()):
            rec = _read_json(inst_dir / "record.json")
            if isinstance(rec, dict) and rec.get("preempt") and rec["preempt"].get("taken_at") is None:
                self._enforce(inst_dir.name)

    # -- extras for tests, the drill and operators ---------------------------------------------------

    def status(self, instance_id: str) -> LocalStatus:
        """Pids, exit code and log paths of an instance."""
        self._require(instance_id)
        inst_dir = self._dir(instance_id)
        started = _read_json(inst_dir / "started.json") or {}
        exit_doc = _read_json(inst_dir / "exit.json") or {}
        return LocalStatus(
            instance_id=instance_id,
            alive=self._alive(instance_id),
            supervisor_pid=self._pgid(instance_id),
            pid=started.get("pid"),
            exit_code=exit_doc.get("code"),
            stdout=inst_dir / "stdout.log",
            stderr=inst_dir / "stderr.log",
            notice_file=inst_dir / "notice.json",
        )

    def exit_code(self, instance_id: str) -> int | None:
        return self.status(instance_id).exit_code

    def wait(self, instance_id: str, timeout: float) -> Instance:
        """Wait until the instance is no longer pending or running (or ``timeout`` seconds passed)."""
        end = time.monotonic() + timeout
        while True:
            inst = self.describe(instance_id)
            if inst.state in (InstanceState.TERMINATED, InstanceState.PREEMPTED) or time.monotonic() >= end:
                return inst
            time.sleep(0.02)

    def close(self) -> None:
        """Cancel pending preemption timers (overdue notices are still enforced by later calls)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

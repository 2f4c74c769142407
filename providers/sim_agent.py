"""Simulated agents: a real :class:`costopt.agent.Agent` per simulated instance, driven by the simulated clock.

When :meth:`providers.sim.SimCloud.launch` gets a spec whose ``env`` carries the job contract
(``COSTOPT_JOB_ID``, ``COSTOPT_CHECKPOINT_URI``, ``COSTOPT_EPOCH``) and the job's total steps
(``COSTOPT_JOB_STEPS``), the instance runs a :class:`SimAgent`: what a training loop with the agent does on
a real instance, at the instance's throughput, with no process. It talks to the service only through the
checkpoint location (the agent's layout), exactly as a real job does, so the migrator, the interruption
watcher and the job engine drive it with the code they use live.

Its life, on the simulated clock (times from :class:`~costopt.simulated.WorkloadTiming`):

- **boot** (``timing.boot``): nothing runs; then the agent starts: it claims its epoch and restores the
  latest checkpoint (:meth:`Agent.restore`); a newer epoch already claimed: it exits (75) at once;
- **restore** (``timing.restore``, only when it resumed from a checkpoint), then **training** from the
  restored step at the job's throughput (whole steps: ``floor(rate x seconds trained)``);
- **checkpoints**: every ``timing.checkpoint_interval`` of training, on a checkpoint request
  (``control/request.json``, addressed to its epoch: what the migrator sends before a move, the watcher on
  a notice), and on a preemption notice (the agent's eager policy: it starts one at once and stops after
  it; the checkpoint survives only if it is published before the instance is taken, i.e. when it fits in
  the lead time). A checkpoint pauses training for ``timing.checkpoint`` and is published at its end with
  the steps done when it started; a request seen while one is being written is served by it;
- **the end**: at the target it writes a final checkpoint, records ``done`` and exits with 0 (the instance
  is then TERMINATED, billed until then);
- **fencing**: at every event and every time the cloud is advanced the agent reads the epoch marker; a
  newer epoch claimed: it records ``stale``, logs the steps it ran since its last record and exits (75),
  writing no checkpoint (a write already under way is refused by the agent's own fence);
- **preemption and termination** kill it: no further record; the steps since its last checkpoint are lost
  (a successor restores that checkpoint and runs them again: the audit counts them as wasted).

Progress records are coarse so a simulated month stays cheap: one ``step`` record per range of steps
(:meth:`Agent.report_steps`), written at the first step after a start (the migrator's verification sees
progress at once), at most every ``report_every`` of simulated time, before every checkpoint, and when
fenced out. :meth:`SimAgent.lines` are the human-readable console output (one line per record).

Throughput: ``COSTOPT_STEPS_PER_SECOND`` in the spec's env wins; else the :data:`ThroughputFn` given to
the cloud for (``COSTOPT_JOB_TYPE``, GPUs of the instance, offer, ``COSTOPT_PRECISION``): the service's is
the catalog's cell at the job's precision (an ``amp`` job on an A100 runs at the ``amp`` estimate, as its
plan expects), the simulated cloud's "true" speed. Times are integer microseconds from the
simulated clock's start; the agent's clock is Unix seconds of simulated time.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from costopt.agent import Agent, AgentError, Notice
from costopt.agent.contract import (
    ENV_CHECKPOINT_URI,
    ENV_EPOCH,
    ENV_JOB_ID,
    ENV_JOB_STEPS,
    ENV_JOB_TYPE,
    ENV_PRECISION,
    ENV_STEPS_PER_SECOND,
    PRECISIONS,
)
from costopt.agent.errors import StaleEpoch
from costopt.agent.layout import EPOCH_MARKER, REQUEST_FILE
from costopt.agent.storage import (
    TEMP_PREFIX,
    LocalStorage,
    MemoryStorage,
    Storage,
    is_local_uri,
    local_path,
    open_storage,
)
from costopt.cloud import CloudError
from costopt.domain import OfferKey

if TYPE_CHECKING:
    from costopt.throughput.model import Precision

__all__ = [
    "CONSOLE_LINES",
    "EXIT_FAILED",
    "EXIT_FINISHED",
    "EXIT_STOPPED",
    "AgentEnv",
    "AgentEnvError",
    "SimAgent",
    "ThroughputFn",
    "commit",
    "format_record",
]

ThroughputFn = Callable[[str, int, OfferKey, str], float | None]
"""``rate(job_type, gpus, offer, precision)``: steps/s of a job of that type at that precision (``fp32``,
``tf32``, ``amp``) on ``gpus`` GPUs of the offer's instance type (None or 0: unknown, or it cannot run there).
``api.wiring.build_sim_throughput`` builds it from the throughput catalog at each precision."""

EXIT_FINISHED = 0
EXIT_STOPPED = 75
"""EX_TEMPFAIL: stopped after a checkpoint (notice) or fenced out; a new copy resumes from the checkpoint."""
EXIT_FAILED = 1
"""The agent failed (unreadable checkpoint location, a foreign job's checkpoints)."""
CONSOLE_LINES = 100
"""The console lines a simulated agent keeps (the latest), as a cloud keeps only the tail of a console (EC2: the
latest 64 KB): the durable cloud pickles every agent at each save, so an unbounded console made each save cost
more as simulated time passed. ``output(tail=...)`` gives at most these."""

_US_PER_S = 1_000_000


class AgentEnvError(CloudError, ValueError):
    """The spec's job variables are invalid (the launch is refused): the message names the variable."""


@dataclass(frozen=True, slots=True)
class AgentEnv:
    """The job a spec's env describes: the contract, its total steps and how its throughput is found."""

    job_id: str
    checkpoint_uri: str
    epoch: int
    steps: int
    job_type: str | None = None
    steps_per_second: float | None = None
    precision: Precision = "fp32"

    @classmethod
    def parse(cls, env: Mapping[str, str]) -> AgentEnv | None:
        """The job of ``env``; None when it lacks a contract variable or ``COSTOPT_JOB_STEPS`` (the instance
        then runs no agent). Raises :class:`AgentEnvError` for a value that is present but invalid."""
        values = {v: env.get(v, "").strip() for v in (ENV_JOB_ID, ENV_CHECKPOINT_URI, ENV_EPOCH, ENV_JOB_STEPS)}
        if not all(values.values()):
            return None
        try:
            epoch = int(values[ENV_EPOCH])
        except ValueError:
            raise AgentEnvError(f"{ENV_EPOCH}={values[ENV_EPOCH]!r} is not an integer") from None
        if epoch < 1:
            raise AgentEnvError(f"{ENV_EPOCH} must be >= 1, got {epoch}")
        try:
            steps = int(values[ENV_JOB_STEPS])
        except ValueError:
            raise AgentEnvError(f"{ENV_JOB_STEPS}={values[ENV_JOB_STEPS]!r} is not an integer") from None
        if steps < 1:
            raise AgentEnvError(f"{ENV_JOB_STEPS} must be a positive number of steps, got {steps}")
        rate_text = env.get(ENV_STEPS_PER_SECOND, "").strip()
        rate: float | None = None
        if rate_text:
            try:
                rate = float(rate_text)
            except ValueError:
                raise AgentEnvError(f"{ENV_STEPS_PER_SECOND}={rate_text!r} is not a number") from None
            if not (rate > 0 and math.isfinite(rate)):
                raise AgentEnvError(f"{ENV_STEPS_PER_SECOND} must be a finite number > 0, got {rate_text!r}")
        job_type = env.get(ENV_JOB_TYPE, "").strip() or None
        precision = env.get(ENV_PRECISION, "").strip() or "fp32"
        if precision not in PRECISIONS:
            raise AgentEnvError(f"{ENV_PRECISION} must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        return cls(
            values[ENV_JOB_ID], values[ENV_CHECKPOINT_URI], epoch, steps, job_type, rate, cast("Precision", precision)
        )

    def resolve_rate(self, rate: ThroughputFn | None, gpus: int, offer: OfferKey) -> float:
        """Steps/s on ``offer``: the env's own throughput, else ``rate`` for the job type at its precision. Raises
        :class:`AgentEnvError` saying what to give when neither knows."""
        if self.steps_per_second is not None:
            return self.steps_per_second
        if self.job_type is None:
            raise AgentEnvError(
                f"job {self.job_id} gives neither {ENV_JOB_TYPE} nor {ENV_STEPS_PER_SECOND}: the simulated cloud "
                "cannot tell how fast it trains"
            )
        value = None if rate is None else rate(self.job_type, gpus, offer, self.precision)
        if value is None or not (value > 0 and math.isfinite(value)):
            raise AgentEnvError(
                f"no throughput for job type {self.job_type!r} at {self.precision} on {gpus} GPU(s) of {offer}: "
                f"register a measurement, or submit the job with {ENV_STEPS_PER_SECOND}"
            )
        return float(value)


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def format_record(rec: Mapping[str, Any], when: datetime) -> str:
    """One human-readable console line for a progress record (``when``: its simulated time)."""
    stamp = _stamp(when)
    ev = rec.get("event")
    epoch = rec.get("epoch")
    if ev == "start":
        step = int(rec.get("restored_step") or 0)
        how = f"restored step {step} (epoch {rec.get('restored_epoch')})" if step else "from scratch"
        text = f"start: epoch {epoch}, {how}"
    elif ev == "step":
        first, last = rec.get("first", rec.get("step")), rec.get("step")
        text = f"steps {first}..{last}" if first != last else f"step {last}"
    elif ev == "checkpoint":
        req = rec.get("request_id")
        text = f"checkpoint: step {rec.get('step')} published" + (f" (request {req})" if req else "")
    elif ev == "notice":
        text = f"preemption notice from {rec.get('source')}: the instance is taken in {rec.get('left', '?')} s"
    elif ev == "stale":
        text = f"fenced out: epoch {rec.get('current_epoch')} owns the job; stopping without writing"
    elif ev == "done":
        text = f"done: step {rec.get('step')}"
    else:
        text = f"{ev}: " + ", ".join(f"{k}={v}" for k, v in rec.items() if k not in ("event", "t"))
    return f"{stamp} {text}"


UNDO = threading.local()
"""``UNDO.journal``: set by a durable simulated cloud (``SimCloud.persist_to``) while one of its calls runs in
this thread: each storage write of a simulated agent first records, through it, how to undo the write
(``journal(path, old)``: the file's old bytes, or None when it did not exist, or its old size as an int
for an append), so a restored cloud can put its agents' files back where its saved state left them.
``UNDO.commit``: set with it; ``commit()`` saves the cloud's state now when an agent wrote since the last save
(:func:`commit`)."""


def commit() -> None:
    """Make the simulated agents' writes so far durable before the service sees them (``UNDO.commit``: the
    durable cloud's state saved, its undo journal emptied); a no-op outside a durable cloud's call."""
    hook = getattr(UNDO, "commit", None)
    if hook is not None:
        hook()


def _undo_record(path: Path, *, append: bool) -> None:
    journal = getattr(UNDO, "journal", None)
    if journal is None:
        return
    try:
        old: bytes | int | None = path.stat().st_size if append else path.read_bytes()
    except FileNotFoundError:
        old = None
    journal(path, old)


class SimLocalStorage(LocalStorage):
    """A local checkpoint location written by a simulated agent: the same files and atomic renames as
    :class:`LocalStorage`, without the ``fsync`` calls (a simulation has no power cuts to survive; the
    fsyncs would be most of a simulated month's cost)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self._watched = tuple(os.fspath(self._path(n)) for n in (REQUEST_FILE, EPOCH_MARKER))

    def write_atomic(self, name: str, data: bytes, *, temp_tag: str = "") -> None:
        final = self._path(name)
        _undo_record(final, append=False)
        final.parent.mkdir(parents=True, exist_ok=True)
        tag = f"{temp_tag}-" if temp_tag else ""
        temp = final.parent / f"{TEMP_PREFIX}{tag}{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
        with open(temp, "xb") as f:
            f.write(data)
        os.replace(temp, final)

    def append_lines(self, name: str, lines: list[str]) -> None:
        if lines:
            _undo_record(self._path(name), append=True)
        super().append_lines(name, lines)

    def delete(self, name: str) -> None:
        _undo_record(self._path(name), append=False)
        super().delete(name)

    def fingerprint(self) -> tuple[tuple[int, int, int] | None, ...]:
        """What changes when the migrator writes the request file or claims an epoch (inode, size,
        modification time of each), so an agent reads them only then."""
        out: list[tuple[int, int, int] | None] = []
        for path in self._watched:
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                out.append(None)
                continue
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)


def sim_storage(uri: str) -> Storage:
    """The storage a simulated agent writes to: :class:`SimLocalStorage` for a local URI, else the
    agent's own (fsspec) storage."""
    return SimLocalStorage(local_path(uri)) if is_local_uri(uri) else open_storage(uri)


def _fingerprint(storage: Storage) -> object:
    """What changes when the migrator writes the request file or claims an epoch, for the locations that
    can tell cheaply (local, ``mem://``); None: read the location at every look."""
    if isinstance(storage, SimLocalStorage):
        return storage.fingerprint()
    if isinstance(storage, MemoryStorage):
        return tuple(storage.versions.get(n) for n in (REQUEST_FILE, EPOCH_MARKER))
    return None


class Phase(StrEnum):
    BOOTING = "booting"
    RESTORING = "restoring"
    TRAINING = "training"
    CHECKPOINTING = "checkpointing"
    EXITED = "exited"


@dataclass(slots=True)
class _Checkpoint:
    start: int
    end: int
    step: int
    final: bool


class _NoticeSource:
    """The instance's preemption notice, as the metadata service would post it (from ``notice`` on)."""

    name = "sim"
    interval = 0.0

    def __init__(self, notice_s: float | None, deadline_s: float | None) -> None:
        self.notice_s = notice_s
        self.deadline_s = deadline_s

    def poll(self, now: float) -> Notice | None:
        if self.notice_s is None or self.deadline_s is None or now < self.notice_s:
            return None
        return Notice(self.name, self.notice_s, self.deadline_s, "simulated preemption notice")


class SimAgent:
    """The agent of one simulated instance (module docstring). The cloud calls :meth:`next_event` /
    :meth:`on_event` in time order and :meth:`sync` when it is advanced, always with its agent clock
    (``clock``: Unix seconds of simulated time) standing at the time given."""

    def __init__(
        self,
        env: AgentEnv,
        *,
        instance_id: str,
        steps_per_s: float,
        launched: int,
        ready: int,
        notice: int | None,
        deadline: int | None,
        restore_us: int,
        checkpoint_us: int,
        interval_us: int,
        report_every_us: int,
        to_seconds: Callable[[int], float],
        to_datetime: Callable[[int], datetime],
        notice_source: str = "sim",
    ) -> None:
        if not (steps_per_s > 0 and math.isfinite(steps_per_s)):
            raise AgentEnvError(f"steps per second must be > 0, got {steps_per_s}")
        if interval_us <= 0 or report_every_us <= 0:
            raise ValueError("the checkpoint interval and the report cadence must be > 0")
        self.env = env
        self.instance_id = instance_id
        self.rate = float(steps_per_s)
        self.ready = ready
        self.notice = notice
        self.restore_us = restore_us
        self.checkpoint_us = checkpoint_us
        self.interval_us = interval_us
        self.report_every_us = report_every_us
        self._to_s = to_seconds
        self._to_dt = to_datetime
        self._source = _NoticeSource(
            None if notice is None else to_seconds(notice), None if deadline is None else to_seconds(deadline)
        )
        self._source.name = notice_source
        self._deadline_s = None if deadline is None else to_seconds(deadline)
        self.phase = Phase.BOOTING
        self.agent: Agent | None = None
        self.storage = sim_storage(env.checkpoint_uri)
        self._seen: object = None  # the location's fingerprint at the last look (local storage)
        self.base = 0
        self.t0 = 0
        self.reported = 0
        self.next_report = 0
        self.next_periodic = 0
        self.ckpt: _Checkpoint | None = None
        self.stop_after = False
        self.notice_seen = False
        self.exit_code: int | None = None
        self.exited_at: int | None = None
        # the console, formatted when read: (time, record) of each progress record, or (time, text); its
        # latest CONSOLE_LINES only, so the cloud's saved state does not grow with the job's age
        self._lines: deque[tuple[int, Mapping[str, Any] | str]] = deque(
            [(launched, f"boot: job {env.job_id} epoch {env.epoch}, {env.steps} steps at {self.rate:g} steps/s")],
            maxlen=CONSOLE_LINES,
        )
        self._now_us = launched

    def _clock(self) -> float:
        """The agent's clock: Unix seconds of the simulated time the cloud is at for this agent."""
        return self._to_s(self._now_us)

    # -- what the cloud reads ---------------------------------------------------------------------------

    def lines(self) -> list[str]:
        """The console output so far, one line per record."""
        out = []
        for t, what in self._lines:
            when = self._to_dt(t)
            out.append(f"{_stamp(when)} {what}" if isinstance(what, str) else format_record(what, when))
        return out

    @property
    def running(self) -> bool:
        return self.phase is not Phase.EXITED

    def steps_at(self, t: int) -> int:
        """Steps done at ``t`` while training (the count restored before it)."""
        if self.phase is not Phase.TRAINING or t <= self.t0:
            return self.base
        if t >= self._target_at():
            return self.env.steps
        return min(self.env.steps, self.base + math.floor(self.rate * (t - self.t0) / _US_PER_S))

    def _target_at(self) -> int:
        return self.t0 + math.ceil((self.env.steps - self.base) / self.rate * _US_PER_S)

    def next_event(self) -> int | None:
        """When this agent next does something on its own (None: it has exited)."""
        if self.phase is Phase.BOOTING:
            return self.ready
        if self.phase is Phase.RESTORING:
            return self._min(self.t0, self._notice_due())
        if self.phase is Phase.TRAINING:
            return self._min(self._target_at(), self.next_periodic, self.next_report, self._notice_due())
        if self.phase is Phase.CHECKPOINTING:
            assert self.ckpt is not None
            return self._min(self.ckpt.end, self._notice_due())
        return None

    def _notice_due(self) -> int | None:
        return None if self.notice_seen or self.notice is None else max(self.notice, self._now_us)

    @staticmethod
    def _min(*times: int | None) -> int | None:
        known = [t for t in times if t is not None]
        return min(known) if known else None

    # -- what the cloud calls ---------------------------------------------------------------------------

    def on_event(self, t: int) -> None:
        """Do what is due at ``t`` (== :meth:`next_event`)."""
        self._now_us = t
        try:
            if self.phase is Phase.BOOTING:
                self._start(t)
                return
            if self.notice is not None and not self.notice_seen and t >= self.notice:
                self.sync(t)
                self.notice_seen = True
                return
            if self.phase is Phase.RESTORING and t >= self.t0:
                self._train(t, self.base, first=True)
                self.sync(t)  # a request that came while restoring is served now
            elif self.phase is Phase.CHECKPOINTING:
                self._publish(t)
            elif self.phase is Phase.TRAINING:
                if t >= self._target_at():
                    self._begin_checkpoint(t, final=True)
                elif t >= self.next_periodic:
                    self._begin_checkpoint(t, final=False)
                elif t >= self.next_report:
                    self._report(t)
                    k = (t - self.t0) // self.report_every_us + 1
                    self.next_report = self.t0 + k * self.report_every_us  # on the training's own grid
                    self.sync(t, force=False)
        except StaleEpoch:
            self._fenced(t)
        except (AgentError, OSError) as exc:
            self._fail(t, exc)

    def sync(self, t: int, *, force: bool = True) -> None:
        """Look at the checkpoint location now (a request, a newer epoch) and at the notice. Without
        ``force``, a local location whose request file and epoch marker did not change since the last
        look is not read again (the cloud's look at every advance)."""
        self._now_us = t
        agent = self.agent
        if agent is None or self.phase in (Phase.BOOTING, Phase.EXITED):
            return
        seen = _fingerprint(self.storage)
        if seen is not None:
            if not force and seen == self._seen:
                return
            self._seen = seen
        try:
            wants = agent.should_checkpoint()
            if agent.notice is not None and not self.notice_seen:
                self.notice_seen = True
            if agent.stale:
                self._fenced(t)
            elif self.phase is Phase.TRAINING and wants:
                self._begin_checkpoint(t, final=False)
        except StaleEpoch:
            self._fenced(t)
        except (AgentError, OSError) as exc:
            self._fail(t, exc)

    def set_notice(self, notice: int, deadline: int) -> None:
        """The instance's preemption notice is now posted at ``notice`` and the instance taken at
        ``deadline`` (the cloud's microseconds; :meth:`SimCloud.preempt`); the cloud reschedules the agent."""
        self.notice = notice
        self._source.notice_s = self._to_s(notice)
        self._source.deadline_s = self._deadline_s = self._to_s(deadline)

    def request_stop(self, t: int) -> None:
        """What SIGTERM is to a real job under a fleet worker (its lease ended): checkpoint now and exit
        (75) after it (a checkpoint being written serves, the final one finishes the job); still booting or
        restoring: exit (75) at once, nothing trained since the checkpoint it restores. The cloud
        reschedules the agent."""
        self._now_us = t
        if self.phase in (Phase.BOOTING, Phase.RESTORING):
            self._exit(t, EXIT_STOPPED, "stopped before training (asked to stop)")
        elif self.phase is Phase.TRAINING:
            try:
                self._begin_checkpoint(t, final=False)
            except (AgentError, OSError) as exc:
                self._fail(t, exc)
                return
            self.stop_after = True
        elif self.phase is Phase.CHECKPOINTING:
            self.stop_after = True

    def flush(self, t: int) -> None:
        """Record the steps trained up to ``t`` now (a fleet worker reads them before each sync, as a real
        job's agent flushes its progress every few seconds)."""
        self._now_us = t
        if self.phase is not Phase.TRAINING:
            return
        try:
            self._report(t)
        except StaleEpoch:
            self._fenced(t)
        except (AgentError, OSError) as exc:
            self._fail(t, exc)

    def kill(self, t: int) -> None:
        """The instance is gone (preempted, terminated): nothing more is written, no exit code."""
        if self.phase is not Phase.EXITED:
            self.phase = Phase.EXITED
            self.exited_at = t
            self._now_us = t

    # -- the life -----------------------------------------------------------------------------------------

    def _on_record(self, rec: dict[str, Any]) -> None:
        if rec.get("event") == "notice" and self._deadline_s is not None:
            rec_for_line = dict(rec, left=round(self._deadline_s - float(rec["t"]), 1))
        else:
            rec_for_line = rec
        self._lines.append((self._now_us, rec_for_line))

    def _line(self, t: int, text: str) -> None:
        self._lines.append((t, text))

    def _start(self, t: int) -> None:
        self.agent = Agent(
            self.env.job_id,
            self.env.checkpoint_uri,
            self.env.epoch,
            storage=self.storage,
            clock=self._clock,
            notice_sources=[self._source],
            poll_interval=0.0,
            stale_check_interval=0.0,
            progress_flush_interval=0.0,
            on_progress=self._on_record,
        )
        try:
            restored = self.agent.restore()
        except StaleEpoch:
            self._exit(t, EXIT_STOPPED, "a newer epoch owns the job: exiting without running")
            return
        except (AgentError, OSError) as exc:
            self._fail(t, exc)
            return
        base = restored.step if restored is not None else 0
        if base > self.env.steps:
            self._fail(t, ValueError(f"restored step {base} is past the job's {self.env.steps} steps"))
            return
        self.base = base
        self.reported = base
        if restored is not None:
            self.phase = Phase.RESTORING
            self.t0 = t + self.restore_us
        else:
            self._train(t, base, first=True)
        self.sync(t)

    def _train(self, t: int, base: int, *, first: bool = False) -> None:
        """Train from ``t`` with ``base`` steps done; the first report comes after the first step when the
        copy has just started (the migrator's verification), else after ``report_every``."""
        self.phase = Phase.TRAINING
        self.base = base
        self.t0 = t
        self.next_periodic = t + self.interval_us
        self.next_report = t + (math.ceil(_US_PER_S / self.rate) if first else self.report_every_us)

    def _report(self, t: int) -> None:
        assert self.agent is not None
        done = self.steps_at(t)
        if done > self.reported:
            self.agent.report_steps(self.reported + 1, done)
            self.reported = done

    def _begin_checkpoint(self, t: int, *, final: bool) -> None:
        self._report(t)
        step = self.steps_at(t)
        final = final or step >= self.env.steps
        if self.agent is not None and self.agent.notice is not None:
            self.stop_after = True
        self.phase = Phase.CHECKPOINTING
        self.ckpt = _Checkpoint(t, t + self.checkpoint_us, step, final)

    def _publish(self, t: int) -> None:
        agent, ckpt = self.agent, self.ckpt
        assert agent is not None and ckpt is not None
        agent.should_checkpoint()  # a request seen while writing is served by this checkpoint
        if agent.stale:
            self._fenced(t)
            return
        agent.checkpoint(ckpt.step, {"job": self.env.job_id, "step": ckpt.step})
        self.ckpt = None
        if ckpt.final:
            agent.finish(ckpt.step)
            self._exit(t, EXIT_FINISHED, "finished")
        elif self.stop_after or agent.should_stop():
            self._exit(t, EXIT_STOPPED, "stopped after its checkpoint (preemption notice)")
        else:
            self._train(t, ckpt.step)

    def _fenced(self, t: int) -> None:
        agent = self.agent
        if self.phase is Phase.EXITED:
            return
        if agent is not None and self.phase is Phase.TRAINING:
            done = self.steps_at(t)
            if done > self.reported:
                agent.report_steps(self.reported + 1, done)  # what it ran before it looked
                self.reported = done
        self._exit(t, EXIT_STOPPED, "fenced out")

    def _fail(self, t: int, exc: BaseException) -> None:
        self._exit(t, EXIT_FAILED, f"failed: {type(exc).__name__}: {exc}")

    def _exit(self, t: int, code: int, why: str) -> None:
        if self.agent is not None:
            with contextlib.suppress(OSError):
                self.agent.close()
        self.phase = Phase.EXITED
        self.exit_code = code
        self.exited_at = t
        self._line(t, f"exit {code}: {why}")

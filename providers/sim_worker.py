"""The simulated cloud's fleet worker: :mod:`costopt.agent.worker` on a simulated instance, on the simulated
clock, with a simulated agent (:class:`providers.sim_agent.SimAgent`) per copy instead of a process.

When :meth:`providers.sim.SimCloud.launch` gets a spec carrying the fleet worker's variables
(``COSTOPT_WORKER_ID``, ``COSTOPT_WORKER_TOKEN``...: the round executor's launch) and the cloud has a fleet
service attached (:meth:`~providers.sim.SimCloud.attach_fleet`), the instance runs a :class:`SimWorker`. Its
protocol *is* a :class:`costopt.agent.worker.Worker`: the same report (each copy's last step, latest checkpoint and
``done`` read from its agent's progress log at the job's checkpoint location), the same sync document and
answer, the same acknowledgements, the same decisions to stop and start copies, the same epoch claim before
a copy starts. Only the copies differ: each is a :class:`SimAgent` (the simulated cloud's one engine of a
training job), driven by the cloud's agenda like the agent of a single-job instance.

Its life, on the simulated clock:

- **boot**: its first sync at the instance's ready time (``timing.boot`` after the launch);
- **syncs**: every ``SimConfig.worker_poll`` of simulated time (its heartbeat: keep it well under the
  executor's ``COSTOPT_FLEET_DEAD_AFTER``), just after its round's end (``BOUNDARY_DELAY_S``), at once when
  a copy exits (also one fenced out when the cloud is advanced: :meth:`SimCloud.run_until` lets the agents
  look at their locations first), and when another worker of its fleet had an exit acknowledged while
  this one waits for a copy elsewhere to stop (the cloud pokes it: a lease is handed over at once, as the
  real worker's 50 ms polls do);
- **a copy** starts at once (no boot): it claims nothing itself (the worker claimed its epoch), restores
  the latest checkpoint (``timing.restore``), trains at the job's throughput on this instance's
  accelerator (``COSTOPT_STEPS_PER_SECOND``, which the service sets from the job's catalog throughput
  there; else the cloud's rate for the job type on the copy's GPUs), checkpoints every
  ``timing.checkpoint_interval`` and when its lease ends (:meth:`SimAgent.request_stop`, what SIGTERM is to
  a real job), then exits 75; it exits 0 once it finished its steps;
- **progress**: each training agent's steps are flushed to its log before every sync, so the service reads
  the agents' own records, as from a real worker's jobs;
- **preemption**: the notice reaches every agent (each checkpoints if it fits and exits) and the worker
  starts nothing more; at the preemption the worker and its agents are killed without a word: the executor
  sees the instance silent and preempted, gives its jobs up (they resume elsewhere from their last
  checkpoint under a new epoch) and launches a replacement.

The transport (a :data:`~costopt.agent.worker.Transport` per worker, :data:`FleetTransport`) is the
service's: the simulated instance lives in the service's process, so its syncs go to the same
:class:`~costopt.fleets.sync.WorkerSync` as the HTTP route, with the same documents, without a socket
(``api.fleet_service.in_process_transport``). Times are the cloud's integer microseconds; the worker's clock
is Unix seconds of simulated time.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from costopt.agent.worker import BOUNDARY_DELAY_S, EXIT_CONFIG, Copy, Transport, Worker, WorkerConfig, WorkerError
from providers.sim_agent import EXIT_FAILED, AgentEnv, AgentEnvError, SimAgent, commit

log = logging.getLogger("costopt.sim")

__all__ = ["AgentFactory", "FleetTransport", "SimWorker"]

FleetTransport = Callable[[WorkerConfig], Transport]
"""The transport of each simulated worker (by its configuration: id and token)."""
AgentFactory = Callable[[AgentEnv, int, int], SimAgent]
"""``make(job, gpus, t)``: the simulated agent of a copy started at ``t`` on ``gpus`` GPUs of the instance
(raises :class:`~providers.sim_agent.AgentEnvError` when its throughput is unknown)."""

_US_PER_S = 1_000_000
CONSOLE_COPIES = 64
"""The copies whose agent lines the instance's console keeps (the latest), so a simulated month stays small."""
CONSOLE_LINES = 2_000
"""The worker's own console lines kept (the latest)."""


class _Protocol(Worker):
    """The real worker's protocol (report, sync, acknowledgements, stop and start decisions, epoch claims)
    whose copies are its owner's simulated agents."""

    def __init__(self, owner: SimWorker, config: WorkerConfig, transport: Transport) -> None:
        self.owner = owner
        super().__init__(config, transport=transport, env={}, clock=owner.clock)

    def spawn(self, w: Mapping[str, Any], job_id: str, epoch: int, uri: str, gpus: tuple[int, ...], now: float) -> Copy:
        return self.owner.spawn(w, job_id, epoch, uri, gpus, now)

    def stop(self, c: Copy) -> None:
        self.owner.stop(c)

    def reap(self) -> bool:
        return self.owner.reap()

    def __getstate__(self) -> dict[str, Any]:
        """Saved with the simulated cloud without its transport (the service's: given again by
        :meth:`SimCloud.attach_fleet` after a restore)."""
        state = dict(self.__dict__)
        state["transport"] = None
        return state


class SimWorker:
    """The worker of one simulated fleet instance (module docstring). The cloud calls :meth:`next_event` /
    :meth:`on_event` in time order, :meth:`sync` when it is advanced, :meth:`set_notice` and :meth:`kill`,
    as for a :class:`SimAgent`; :attr:`protocol` is the real worker's code."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        transport: Transport,
        launched: int,
        ready: int,
        notice: int | None,
        deadline: int | None,
        poll_us: int,
        make_agent: AgentFactory,
        to_seconds: Callable[[int], float],
        to_datetime: Callable[[int], datetime],
    ) -> None:
        if poll_us <= 0:
            raise ValueError("the worker's poll interval must be > 0")
        self._now_us = launched
        self._to_s = to_seconds
        self._to_dt = to_datetime
        self.config = config
        self.protocol = _Protocol(self, config, transport)
        self.ready = ready
        self.notice = notice
        self.deadline = deadline
        self.poll_us = poll_us
        self.make_agent = make_agent
        self.agents: dict[tuple[str, int], SimAgent] = {}
        self.history: deque[tuple[str, SimAgent]] = deque(maxlen=CONSOLE_COPIES)  # the console's copies
        self.booted = False
        self.next_sync_us: int | None = None
        self.last_sync_us: int | None = None
        self.handed_over = False  # an exit was acknowledged at the last sync (the cloud pokes the waiting)
        self.refused = False
        self.dead = False
        self.exit_code: int | None = None
        self.exited_at: int | None = None
        self._lines: deque[tuple[int, str]] = deque(maxlen=CONSOLE_LINES)
        self._lines.append(
            (launched, f"boot: fleet worker {config.worker_id} of {config.fleet_id}, {config.gpus} GPU(s)")
        )

    def clock(self) -> float:
        """Unix seconds of the simulated time the worker stands at."""
        return self._to_s(self._now_us)

    def _us_of(self, unix_s: float) -> int:
        return self._now_us + math.ceil((unix_s - self._to_s(self._now_us)) * _US_PER_S)

    # -- what the cloud reads -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.exit_code is None and not self.dead

    @property
    def fleet_id(self) -> str:
        return self.config.fleet_id

    def lines(self) -> list[str]:
        """The console: the worker's own lines and each copy's agent lines (prefixed by job and epoch), in
        time order (the latest :data:`CONSOLE_COPIES` copies and :data:`CONSOLE_LINES` lines of its own)."""
        out = [(self._to_dt(t).strftime("%Y-%m-%dT%H:%M:%SZ"), text) for t, text in self._lines]
        for who, agent in self.history:
            for line in agent.lines():
                stamp, _, text = line.partition(" ")
                out.append((stamp, f"[{who}] {text}"))
        out.sort(key=lambda x: x[0])
        return [f"{stamp} {text}" for stamp, text in out]

    def next_event(self) -> int | None:
        """When the worker or one of its copies next does something (None: it has ended)."""
        if not self.running:
            return None
        if not self.booted:
            return self.ready
        times = [t for a in self.agents.values() if (t := a.next_event()) is not None]
        if self.next_sync_us is not None:
            times.append(self.next_sync_us)
        return min(times) if times else None

    # -- what the cloud calls -------------------------------------------------------------------------

    def on_event(self, t: int) -> None:
        """Do what is due at ``t`` (== :meth:`next_event`): the copies' events, then a sync when one exited
        or the sync is due."""
        self._now_us = t
        if not self.booted:
            self.booted = True
            self._line(t, "worker up: first sync")
            self._service_sync(t)
            return
        for _ in range(10_000):
            due = [a for a in self.agents.values() if (n := a.next_event()) is not None and n <= t]
            if not due:
                break
            for agent in due:
                agent.on_event(t)
        if self.reap() or (self.next_sync_us is not None and t >= self.next_sync_us):
            self._service_sync(t)

    def sync(self, t: int, *, force: bool = True) -> None:
        """The cloud is advanced from ``t``: each copy looks at its checkpoint location (a newer epoch); the
        worker syncs when one exited."""
        self._now_us = t
        if not self.running or not self.booted:
            return
        for agent in list(self.agents.values()):
            agent.sync(t, force=force)
        if self.reap():
            self._service_sync(t)

    def poke(self, t: int) -> bool:
        """Sync at ``t`` when this worker waits for a copy elsewhere to stop (another worker of the fleet had
        an exit acknowledged); True when it will."""
        if self.running and self.booted and self.protocol.waiting:
            self.next_sync_us = t
            return True
        return False

    def set_notice(self, notice: int, deadline: int) -> None:
        """The instance's preemption notice (:meth:`SimCloud.preempt`): every copy gets it."""
        self.notice, self.deadline = notice, deadline
        for agent in self.agents.values():
            if agent.running:
                agent.set_notice(notice, deadline)

    def kill(self, t: int) -> None:
        """The instance is gone: the worker and its copies stop without a word (no exit code)."""
        if self.dead or self.exit_code is not None:
            return
        self.dead = True
        self.exited_at = t
        for agent in self.agents.values():
            agent.kill(t)
        self._line(t, "killed with its instance")

    # -- the sync -------------------------------------------------------------------------------------

    def _service_sync(self, t: int) -> None:
        self._now_us = t
        proto = self.protocol
        if self.notice is not None and t >= self.notice and not proto.stopping:
            proto.stopping = True  # the instance is going: its copies checkpoint and stop, nothing new starts
            self._line(t, "preemption notice: stopping every copy, starting none")
        for agent in self.agents.values():
            agent.flush(t)
        self.last_sync_us = t
        if proto.transport is None:  # a restored cloud whose service has not attached yet: try at the next poll
            self.next_sync_us = t + self.poll_us
            return
        # What the sync reports (the copies' steps, checkpoints, exits, read from their logs) is recorded by
        # the service: a durable cloud saves its state first, so a kill before the end of the call does not
        # undo the agents' writes behind it (the sync itself may be redone after a restore: a lost answer).
        commit()
        try:
            answer: Mapping[str, Any] = proto.sync()
        except WorkerError as exc:
            self._line(t, f"refused by the service: {exc}")
            self.refused = True
            for c in proto.copies.values():
                self.stop(c)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("simulated worker %s: sync failed: %s", self.config.worker_id, exc)
            self._line(t, f"sync failed: {exc}")
        else:
            if answer.get("ack"):
                self.handed_over = True
        self._forget_acknowledged()
        running = any(c.running for c in proto.copies.values())
        if (proto.released or self.refused) and not running:
            self.exit_code = EXIT_CONFIG if self.refused else 0
            self.exited_at = t
            self._line(t, f"exit {self.exit_code}: " + ("refused" if self.refused else "released by the service"))
            return
        self.next_sync_us = t if self._exited_unseen() else self._next_sync(t)

    def _next_sync(self, t: int) -> int:
        nxt = t + self.poll_us
        ends = self.protocol.round_ends_at
        if ends is not None:
            end = self._us_of(ends + BOUNDARY_DELAY_S)
            if end > t:
                nxt = min(nxt, end)
        return nxt

    def _exited_unseen(self) -> bool:
        """A copy whose agent exited during the sync (stopped while booting or restoring)."""
        return any(
            c.running and (a := self.agents.get(c.key)) is not None and not a.running
            for c in self.protocol.copies.values()
        )

    def _forget_acknowledged(self) -> None:
        for key in [k for k, a in self.agents.items() if k not in self.protocol.copies and not a.running]:
            del self.agents[key]

    # -- copies: simulated agents instead of processes ------------------------------------------------

    def spawn(self, w: Mapping[str, Any], job_id: str, epoch: int, uri: str, gpus: tuple[int, ...], now: float) -> Copy:
        """The copy's simulated agent, started now (its epoch is claimed); a lease whose job the cloud cannot
        simulate (no contract, unknown throughput) is a copy exited with :data:`EXIT_FAILED`."""
        env = {str(k): str(v) for k, v in (w.get("env") or {}).items()}
        t = self._now_us
        try:
            job = AgentEnv.parse(env)
            if job is None:
                raise AgentEnvError(f"the lease of job {job_id} carries no job contract")
            agent = self.make_agent(job, max(1, len(gpus)), t)
        except AgentEnvError as exc:
            self._line(t, f"job {job_id} epoch {epoch}: cannot start: {exc}")
            return Copy(job_id, epoch, uri, gpus, None, now, exit_code=EXIT_FAILED, ended_at=now)
        if self.notice is not None and self.deadline is not None:
            agent.set_notice(self.notice, self.deadline)
        self.agents[(job_id, epoch)] = agent
        self.history.append((f"{job_id} e{epoch}", agent))
        self._line(t, f"job {job_id} epoch {epoch} started on GPUs {list(gpus)} at {agent.rate:g} steps/s")
        return Copy(job_id, epoch, uri, gpus, None, now)

    def stop(self, c: Copy) -> None:
        """The lease is over: the agent checkpoints and exits (SIGTERM to a real job)."""
        agent = self.agents.get(c.key)
        if agent is None or not c.running or c.stop_sent_at is not None:
            return
        c.stop_sent_at = self.clock()
        agent.request_stop(self._now_us)

    def reap(self) -> bool:
        """Record the exit of copies whose agent ended; True when one did since the last look."""
        ended = False
        for c in self.protocol.copies.values():
            agent = self.agents.get(c.key)
            if c.running and agent is not None and not agent.running and agent.exit_code is not None:
                c.exit_code = agent.exit_code
                c.ended_at = self._to_s(agent.exited_at if agent.exited_at is not None else self._now_us)
                ended = True
        return ended

    def _line(self, t: int, text: str) -> None:
        self._lines.append((t, text))

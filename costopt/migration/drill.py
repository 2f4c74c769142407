"""The engine of ``costopt drill``: run a user's training script through forced moves and preemptions.

:func:`drill` registers the script as a job, starts it with the ``local`` provider, then alternates
forced migrations (:meth:`Migrator.move`: checkpoint request, launch of a new epoch, fencing,
verification, termination of the old copy) and preemptions (:meth:`LocalProvider.preempt` with a
notice, then :meth:`Migrator.recover` from the last checkpoint), each once the current copy is
progressing. It waits for the job to finish, reconciles (orphans are counted and terminated), and
audits the job's progress logs (:func:`costopt.agent.control.audit_job`): did it do exactly the steps it
asked for, none lost, none counted twice?

The CLI (``costopt drill --command ... --moves 5 --preemptions 5 [--provider local|sim] [--format
json]``) prints :meth:`DrillReport.to_dict`.
"""

from __future__ import annotations

import logging
import shlex
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from costopt.agent import control
from costopt.domain import Cloud, Market, OfferKey
from costopt.migration.machine import ALIVE_STATES, TAG_MANAGED, JobStatus, Migrator, State, reconcile

log = logging.getLogger("costopt.migration.drill")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_COMMAND = "python examples/train.py --steps 2000 --checkpoint-every 50 --step-seconds 0.01"

LOCAL_OFFERS = (
    OfferKey(Cloud.LOCAL, "local", "local-a", "cpu-1", Market.SPOT),
    OfferKey(Cloud.LOCAL, "local", "local-b", "cpu-1", Market.SPOT),
)


class DrillError(ValueError):
    """The drill cannot run as asked (unknown provider, empty command)."""


@dataclass(frozen=True, slots=True)
class DrillReport:
    steps_requested: int | None
    steps_done: int
    lost_steps: int
    repeated_steps: int
    moves: int
    preemptions: int
    orphans: int
    ok: bool
    wasted_steps: int = 0
    finished: bool = False
    seconds: float = 0.0
    problems: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["problems"] = list(self.problems)
        return doc


def parse_command(command: str | Sequence[str]) -> list[str]:
    """Split a command line; a leading ``python``/``python3`` runs this interpreter (its packages)."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise DrillError("the command is empty")
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def steps_in(argv: Sequence[str]) -> int | None:
    """The ``--steps N`` of a command line, if any."""
    for i, arg in enumerate(argv):
        if arg == "--steps" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--steps="):
            return int(arg.split("=", 1)[1])
    return None


def _wait(cond: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= end:
            return False
        time.sleep(poll)
    return True


def drill(
    command: str | Sequence[str] | None = None,
    moves: int = 5,
    preemptions: int = 5,
    provider: str = "local",
    *,
    steps: int | None = None,
    workdir: str | Path | None = None,
    cwd: str | Path | None = None,
    notice_seconds: float = 3.0,
    gap_steps: int = 5,
    timeout: float = 600.0,
    event_timeout: float = 60.0,
) -> DrillReport:
    """Run ``command`` (default: the example script) through ``moves`` forced migrations and
    ``preemptions`` preemptions (alternating), then audit it.

    - ``steps``: the steps the script asks for (default: its ``--steps``);
    - ``workdir``: where the database, checkpoints and instances live (default: a temporary directory);
    - ``cwd``: the script's working directory (default: the repository root);
    - ``notice_seconds``: preemption notice given to the script before it is killed;
    - ``gap_steps``: steps the current copy must make past its restore point before the next event;
    - ``timeout``: for the whole drill; ``event_timeout``: for one move or preemption.
    """
    from costopt.db.engine import make_engine, migrate
    from providers.local import LocalProvider

    if provider != "local":
        raise DrillError(f"provider {provider!r} is not supported by the drill yet (only 'local')")
    argv = parse_command(command or DEFAULT_COMMAND)
    steps_requested = steps if steps is not None else steps_in(argv)
    started = time.monotonic()
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="costopt-drill-")
        workdir = tmp.name
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    engine = make_engine(f"sqlite:///{root / 'drill.db'}")
    migrate(engine)
    prov = LocalProvider(root / "instances", cwd=cwd or REPO_ROOT, grace_seconds=5.0)
    mig = Migrator(engine, prov, checkpoint_timeout=event_timeout, verify_timeout=event_timeout)
    job_id = f"drill-{uuid.uuid4().hex[:8]}"
    uri = str(root / "checkpoints" / job_id)
    problems: list[str] = []
    done_moves = done_preemptions = 0
    orphans = 0
    try:
        mig.register_job(job_id, argv, uri)
        first = mig.start(job_id, LOCAL_OFFERS)
        if first.state is not State.DONE:
            problems.append(f"the job did not start: {first.reason}")
        events = []
        for i in range(max(moves, preemptions)):
            if i < moves:
                events.append("move")
            if i < preemptions:
                events.append("preempt")
        for event in events if first.state is State.DONE else []:
            job = mig.job(job_id)

            def ready(job_id: str = job_id) -> bool:
                j = mig.job(job_id)
                p = control.progress(uri, j.epoch)
                return p.done or p.last_step >= p.restored_step + gap_steps

            if not _wait(ready, event_timeout) or control.progress(uri, job.epoch).done:
                problems.append(f"the job finished (or stalled) before the {event} it was due")
                break
            if event == "move":
                rec = mig.move(job_id, LOCAL_OFFERS)
                if rec.state is State.DONE:
                    done_moves += 1
                else:
                    problems.append(f"move {rec.id} rolled back: {rec.reason}")
                    if mig.job(job_id).status is JobStatus.FINISHED:
                        break
                    if mig.job(job_id).status is JobStatus.RECOVERING:
                        mig.recover(job_id, LOCAL_OFFERS)
            else:
                assert job.instance_id is not None
                prov.preempt(job.instance_id, notice_seconds)
                prov.wait(job.instance_id, notice_seconds + 10.0)
                if control.progress(uri, job.epoch).done:
                    problems.append("the job finished during the preemption notice")
                    break
                rec = mig.recover(job_id, LOCAL_OFFERS)
                if rec.state is State.DONE:
                    done_preemptions += 1
                else:
                    problems.append(f"recovery {rec.id} rolled back: {rec.reason}")
        # Let the job run to its end (recovering it if its copy dies on its own).
        end = started + timeout
        while time.monotonic() < end:
            job = mig.job(job_id)
            if control.progress(uri, job.epoch).done:
                break
            report = reconcile(engine, prov)
            orphans += len(report.orphans_terminated)
            if mig.job(job_id).status is JobStatus.RECOVERING:
                problems.append("the job's copy died on its own: recovered")
                mig.recover(job_id, LOCAL_OFFERS)
            time.sleep(0.1)
        else:
            problems.append(f"the job did not finish within {timeout:g} s")
        job = mig.job(job_id)
        if job.instance_id is not None:
            prov.wait(job.instance_id, 30.0)
        report = reconcile(engine, prov)
        orphans += len(report.orphans_terminated)
        alive = [i.instance_id for i in prov.list({TAG_MANAGED: "true"}) if i.state in ALIVE_STATES]
        if alive:
            problems.append(f"instances still running after the job finished: {alive}")
            orphans += len(alive)
            for iid in alive:
                prov.terminate(iid)
        audit = control.audit_job(uri, steps_requested)
        problems.extend(audit.problems)
        ok = (
            audit.ok
            and audit.lost_steps == 0
            and audit.repeated_steps == 0
            and (steps_requested is None or audit.steps_done == steps_requested)
            and done_moves == moves
            and done_preemptions == preemptions
            and orphans == 0
        )
        return DrillReport(
            steps_requested=steps_requested,
            steps_done=audit.steps_done,
            lost_steps=audit.lost_steps,
            repeated_steps=audit.repeated_steps,
            moves=done_moves,
            preemptions=done_preemptions,
            orphans=orphans,
            ok=ok,
            wasted_steps=audit.wasted_steps,
            finished=audit.finished,
            seconds=round(time.monotonic() - started, 3),
            problems=tuple(problems),
        )
    finally:
        for inst in prov.list({TAG_MANAGED: "true"}):
            if inst.state in ALIVE_STATES:
                prov.terminate(inst.instance_id)
        prov.close()
        engine.dispose()
        if tmp is not None:
            tmp.cleanup()

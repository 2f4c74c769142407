"""Progress logs and their audit: did the job do exactly the steps it asked for?

Every copy of a job (a *run*: one process, one fencing epoch) appends JSON lines to
``progress/e<epoch>.jsonl`` at the checkpoint location:

- ``start``: the run began; ``restored_step`` / ``restored_epoch`` / ``restored_run`` name the
  checkpoint it resumed from (0 / None when it started from scratch);
- ``step``: training step ``step`` (1-based) completed; with ``first``, every step from ``first`` to
  ``step`` (one record for many: :meth:`Agent.report_steps`, the simulated cloud's coarse logs);
- ``checkpoint``: a checkpoint of ``step`` was published (``request_id`` when it served a request; written
  after the checkpoint itself, so a run killed in between leaves a checkpoint without its record: the audit
  accepts that for a run's last act, see :func:`_ended_writing_checkpoint`);
- ``stale``: a checkpoint was refused because a newer epoch owns the job;
- ``notice``: a preemption notice arrived (``deadline``);
- ``done``: the run reached the requested number of steps.

Every record carries ``event``, ``epoch``, ``run`` (a random id per process) and ``t`` (Unix seconds).

:func:`audit` reconstructs the *lineage* of the final state: the run that finished, the run whose
checkpoint it restored, and so on back to a run that started from scratch. A step is *counted* when
the run that executed it is in the lineage and the step lies between the checkpoint that run restored
and the checkpoint its successor restored. From there:

- ``steps_done``: step executions that went into the final state;
- ``repeated_steps``: executions counted more than once (a step run again after a restore already
  contained it, or logged twice by the same run);
- ``lost_steps``: steps missing from the lineage (gaps), plus steps a run threw away by resuming
  from an older checkpoint than the newest one already published when it started;
- ``wasted_steps``: executions that went nowhere (done after a copy's last checkpoint, then redone by
  the next copy); expected after a preemption, and at most a checkpoint interval each time.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from costopt.agent.layout import PROGRESS_DIR, compact_json, progress_name
from costopt.agent.storage import Storage

log = logging.getLogger("costopt.agent")


class RecordLine(str):
    """A progress log line that still carries the record it was written from (:func:`record_line`), so a
    log kept in memory (``MemoryStorage``) is not parsed back; written anywhere else it is just its text."""

    record: dict[str, Any]


_PLAIN = frozenset((str, int, float, bool, type(None)))


def record_line(rec: dict[str, Any]) -> str:
    """The log line of a progress record (compact JSON). A record of plain values (what a JSON round
    trip gives back unchanged) travels with its line, for a reader in the same process."""
    for k, v in rec.items():  # one pass, no generators: this runs for every record a simulated agent writes
        if type(v) not in _PLAIN or type(k) is not str:
            return json.dumps(rec, separators=(",", ":"))
    line = RecordLine(compact_json(rec))
    line.record = dict(rec)
    return line


def _parse(line: str, name: str) -> dict[str, Any] | None:
    """A progress record of a log line (None: unreadable, or not a record)."""
    if type(line) is RecordLine:
        kept = line.record
        return kept if "event" in kept else None
    try:
        rec = json.loads(line)
    except ValueError:
        log.warning("skipping an unreadable progress line in %s: %r", name, line[:200])
        return None
    return rec if isinstance(rec, dict) and "event" in rec else None


class _LogFold:
    """What a storage that folds its logs (``MemoryStorage.fold_lines``) keeps of one progress log: its
    records, each line parsed once, and the runs they make per epoch (:func:`runs_of`, record by record)."""

    __slots__ = ("name", "records", "runs")

    def __init__(self, name: str) -> None:
        self.name = name
        self.records: list[dict[str, Any]] = []
        self.runs: dict[int, dict[str, Run]] = {}

    def add(self, line: str) -> None:
        rec = _parse(line, self.name)
        if rec is None:
            return
        self.records.append(rec)
        _add_record(self.runs.setdefault(int(rec.get("epoch", -1)), {}), rec)


def _fold(storage: Storage, name: str) -> _LogFold | None:
    """The log's fold, brought up to date (None: the storage cannot fold its logs). Shared: never change it."""
    fold = getattr(storage, "fold_lines", None)
    if fold is None:
        return None
    state: _LogFold = fold(name, _LogFold, lambda: _LogFold(name), _LogFold.add)
    return state


def _log_records(storage: Storage, name: str) -> list[dict[str, Any]]:
    """The records of one log; a storage that can fold its logs parses each line once, ever (the records
    are then shared: read them, never change them)."""
    state = _fold(storage, name)
    if state is None:
        return [rec for rec in (_parse(line, name) for line in storage.read_lines(name)) if rec is not None]
    return state.records


def read_records(storage: Storage, epoch: int | None = None) -> list[dict[str, Any]]:
    """Progress records at a location (of one epoch, or of all), by epoch then in writing order."""
    wanted = None if epoch is None else progress_name(epoch)
    out: list[dict[str, Any]] = []
    for name in sorted(storage.list_logs(PROGRESS_DIR)):
        if wanted is not None and name != wanted:
            continue
        out.extend(_log_records(storage, name))
    return out


@dataclass(slots=True)
class Run:
    """What one process of a job did, from its progress records."""

    run_id: str
    epoch: int
    started_at: float | None = None
    restored_step: int = 0
    restored_epoch: int | None = None
    restored_run: str | None = None
    has_start: bool = False
    executed: list[tuple[int, int]] = field(default_factory=list)
    """Steps executed, as inclusive ranges ``(first, last)`` in logging order."""
    checkpoints: list[tuple[int, float]] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    notices: int = 0
    done_step: int | None = None
    done_at: float | None = None
    last_at: float = 0.0
    top: int | None = None
    """The highest step of :attr:`executed` (None: none), kept as :func:`runs_of` adds ranges."""

    @property
    def last_step(self) -> int:
        return self.restored_step if self.top is None else self.top

    @property
    def steps_executed(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.executed)


def runs_of(records: Iterable[dict[str, Any]]) -> dict[str, Run]:
    """Group progress records into runs (keyed by run id, in order of first appearance)."""
    runs: dict[str, Run] = {}
    for rec in records:
        _add_record(runs, rec)
    return runs


def _add_record(runs: dict[str, Run], rec: dict[str, Any]) -> None:
    """One record into its run (:func:`runs_of`, one record at a time)."""
    rid = str(rec.get("run", ""))
    run = runs.get(rid)
    if run is None:
        run = runs[rid] = Run(rid, int(rec.get("epoch", 0)))
    t = float(rec.get("t", 0.0))
    if run.started_at is None:
        run.started_at = t
    run.last_at = max(run.last_at, t)
    ev = rec.get("event")
    if ev == "start":
        run.has_start = True
        run.started_at = t
        run.restored_step = int(rec.get("restored_step") or 0)
        run.restored_epoch = rec.get("restored_epoch")
        run.restored_run = rec.get("restored_run")
    elif ev == "step":
        last = int(rec["step"])
        first = int(rec.get("first", last))
        if first <= last:
            run.executed.append((first, last))
            run.top = last if run.top is None else max(run.top, last)
    elif ev == "checkpoint":
        run.checkpoints.append((int(rec["step"]), t))
    elif ev == "stale":
        run.refused.append(int(rec.get("step", -1)))
    elif ev == "notice":
        run.notices += 1
    elif ev == "done":
        run.done_step = int(rec["step"])
        run.done_at = t


@dataclass(frozen=True, slots=True)
class ProgressAudit:
    """The verdict on a job's progress logs (see the module docstring for the definitions)."""

    steps_requested: int | None
    steps_done: int
    lost_steps: int
    repeated_steps: int
    wasted_steps: int
    finished: bool
    lineage_complete: bool
    checkpoints_monotonic: bool
    runs: int
    lineage: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return (
            self.finished
            and self.lineage_complete
            and self.lost_steps == 0
            and self.repeated_steps == 0
            and self.checkpoints_monotonic
            and (self.steps_requested is None or self.steps_done == self.steps_requested)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps_requested": self.steps_requested,
            "steps_done": self.steps_done,
            "lost_steps": self.lost_steps,
            "repeated_steps": self.repeated_steps,
            "wasted_steps": self.wasted_steps,
            "finished": self.finished,
            "lineage_complete": self.lineage_complete,
            "checkpoints_monotonic": self.checkpoints_monotonic,
            "runs": self.runs,
            "lineage": list(self.lineage),
            "problems": list(self.problems),
            "ok": self.ok,
        }


def _ended_writing_checkpoint(run: Run, step: int) -> bool:
    """True when ``run`` plausibly died between publishing its checkpoint of ``step`` and recording it (an agent
    publishes the file, then appends its ``checkpoint`` record): the checkpoint is newer than every one it
    recorded and it recorded nothing past ``step``. The restorer read the run's id and step from the file's
    own header, so the checkpoint was there; any step the run did not record still shows as a gap."""
    recorded = max((s for s, _ in run.checkpoints), default=run.restored_step)
    return step > recorded and run.last_step <= step


def audit(records: Iterable[dict[str, Any]], steps_requested: int | None = None) -> ProgressAudit:
    """Check from progress records that the job did exactly ``steps_requested`` steps (see module doc)."""
    runs = runs_of(records)
    problems: list[str] = []
    total_executed = sum(r.steps_executed for r in runs.values())
    if not runs:
        return ProgressAudit(steps_requested, 0, 0, 0, 0, False, False, True, 0, (), ("no progress records",))

    done_runs = [r for r in runs.values() if r.done_step is not None]
    if done_runs:
        final = max(done_runs, key=lambda r: (r.epoch, r.done_at or 0.0))
        end = final.done_step or 0
        finished = True
        if steps_requested is not None and end != steps_requested:
            problems.append(f"run {final.run_id} finished at step {end}, not {steps_requested}")
    else:
        final = max(runs.values(), key=lambda r: (r.last_step, r.epoch))
        end = final.last_step
        finished = False
        problems.append("no run reached the end (no 'done' record)")

    counted: list[tuple[int, int]] = []  # inclusive ranges of counted executions
    repeated = 0
    rerun = 0
    lost = 0
    lineage: list[str] = []
    lineage_complete = False
    cur: Run | None = final
    cur_end = end
    while cur is not None and cur.run_id not in lineage:
        lineage.append(cur.run_id)
        r = cur.restored_step
        for lo, hi in cur.executed:
            if lo <= r:
                n = min(hi, r) - lo + 1
                rerun += n
                what = f"step {lo}" if n == 1 else f"steps {lo}..{lo + n - 1}"
                problems.append(f"run {cur.run_id} ran {what} again after restoring step {r}")
            a, b = max(lo, r + 1), min(hi, cur_end)
            if a <= b:
                counted.append((a, b))
        lost += _discarded(cur, runs, problems)
        if cur.restored_run is None:
            if r == 0:
                lineage_complete = True
            else:
                problems.append(f"run {cur.run_id} restored step {r} from a run with no progress log")
            break
        prev = runs.get(cur.restored_run)
        if prev is None:
            problems.append(f"run {cur.run_id} restored step {r} from run {cur.restored_run}, which left no log")
            break
        if not any(step == r for step, _ in prev.checkpoints) and not _ended_writing_checkpoint(prev, r):
            problems.append(f"run {prev.run_id} has no checkpoint record of step {r}, restored by run {cur.run_id}")
        cur, cur_end = prev, r

    gaps: list[int] = []
    n_gaps = 0
    for lo, hi, c in _coverage(counted, 1, end):
        if c == 0:
            n_gaps += hi - lo + 1
            gaps.extend(range(lo, min(hi, lo + 4) + 1)[: 5 - len(gaps)])
        elif c > 1:
            repeated += (c - 1) * (hi - lo + 1)
            what = f"step {lo}" if lo == hi else f"steps {lo}..{hi}"
            problems.append(f"{what} counted {c} times")
    repeated += rerun
    if n_gaps:
        lost += n_gaps
        problems.append(f"{n_gaps} step(s) missing from the lineage, first {gaps[:5]}")
    steps_done = sum(b - a + 1 for a, b in counted) + rerun

    ckpts = sorted((t, run.epoch, step) for run in runs.values() for step, t in run.checkpoints)
    monotonic = all(a[2] <= b[2] for a, b in itertools.pairwise(ckpts))
    if not monotonic:
        problems.append("published checkpoints went back in steps")
    wasted = max(0, total_executed - steps_done)
    return ProgressAudit(
        steps_requested=steps_requested,
        steps_done=steps_done,
        lost_steps=lost,
        repeated_steps=repeated,
        wasted_steps=wasted,
        finished=finished,
        lineage_complete=lineage_complete,
        checkpoints_monotonic=monotonic,
        runs=len(runs),
        lineage=tuple(reversed(lineage)),
        problems=tuple(problems),
    )


def _coverage(ranges: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """How many of ``ranges`` (inclusive) cover each step of ``[lo, hi]``: ``(first, last, count)``
    segments in order, counts >= 0; ranges reaching outside ``[lo, hi]`` count only inside it (a step
    counted beyond ``hi`` is still reported as repeated when counted twice)."""
    bounds: Counter[int] = Counter()
    for a, b in ranges:
        bounds[a] += 1
        bounds[b + 1] -= 1
    points = sorted(set(bounds) | {lo, hi + 1})
    out: list[tuple[int, int, int]] = []
    c = 0
    for x, nxt in itertools.pairwise(points):
        c += bounds[x]
        if x > hi or nxt - 1 < lo:
            if c > 1:
                out.append((x, nxt - 1, c))
            continue
        a, b = max(x, lo), min(nxt - 1, hi)
        if a <= b:
            out.append((a, b, c))
    return out


def _discarded(cur: Run, runs: dict[str, Run], problems: list[str]) -> int:
    """Steps ``cur`` threw away: the newest checkpoint published before it started, minus what it restored."""
    if cur.started_at is None:
        return 0
    best: tuple[int, int] | None = None
    for other in runs.values():
        if other is cur or other.epoch > cur.epoch:
            continue
        for step, t in other.checkpoints:
            if t < cur.started_at and (best is None or (other.epoch, step) > best):
                best = (other.epoch, step)
    if best is None or best[1] <= cur.restored_step:
        return 0
    problems.append(f"run {cur.run_id} resumed from step {cur.restored_step} although step {best[1]} was checkpointed")
    return best[1] - cur.restored_step


@dataclass(frozen=True, slots=True)
class EpochProgress:
    """How the copy (copies) of one epoch are doing: for the migrator's "verifying" step."""

    epoch: int
    started: bool
    restored_step: int
    last_step: int
    last_report_at: float | None
    checkpoints: tuple[int, ...]
    done: bool

    @property
    def progressing(self) -> bool:
        """The copy restored and has completed at least one step past what it restored."""
        return self.started and self.last_step > self.restored_step


def epoch_progress(records: Iterable[dict[str, Any]], epoch: int) -> EpochProgress:
    return _epoch_progress(runs_of(rec for rec in records if int(rec.get("epoch", -1)) == epoch).values(), epoch)


def storage_epoch_progress(storage: Storage, epoch: int) -> EpochProgress:
    """:func:`epoch_progress` of the epoch's log at ``storage``. A storage that folds its logs
    (``MemoryStorage.fold_lines``) folds only the records appended since the last look into the epoch's
    runs, so a poll costs what was logged since the previous one, not the whole log."""
    state = _fold(storage, progress_name(epoch))
    if state is None:
        return epoch_progress(read_records(storage, epoch), epoch)
    return _epoch_progress(state.runs.get(epoch, {}).values(), epoch)


def _epoch_progress(of: Iterable[Run], epoch: int) -> EpochProgress:
    runs = list(of)
    if not runs:
        return EpochProgress(epoch, False, 0, 0, None, (), False)
    run = max(runs, key=lambda r: r.started_at or 0.0)
    return EpochProgress(
        epoch=epoch,
        started=run.has_start,
        restored_step=run.restored_step,
        last_step=run.last_step,
        last_report_at=run.last_at,
        checkpoints=tuple(step for step, _ in run.checkpoints),
        done=run.done_step is not None,
    )

"""Learning windows from the copy's progress log: the same measurements whether the service was restarted
mid-window or looked at other moments, and each window recorded once by replicas sharing a database."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from sqlalchemy import Engine

from costopt.throughput.learning import CopyLook, ThroughputLearner, log_windows, run_steps
from costopt.throughput.model import JobType
from costopt.throughput.registry import Measurement, MeasurementRegistry, job_source

JT = JobType("ResNet-50", 128)
WINDOW_S = 900.0


def _log(epoch: int = 1) -> list[dict[str, Any]]:
    """A copy's log: started at 1000 s, restored step 5000 (a slow boot: first step report at 1400 s), then a
    report every 37 s whose step count varies (2.4-2.6 steps/s), a checkpoint every 20 reports."""
    recs: list[dict[str, Any]] = [
        {"event": "start", "epoch": epoch, "run": "r1", "t": 1000.0, "restored_step": 5000},
    ]
    step, t = 5000, 1400.0
    for i in range(400):
        step += 89 + (i * 7) % 11  # 89-99 steps per 37 s
        recs.append({"event": "step", "epoch": epoch, "run": "r1", "first": step - 5, "step": step, "t": t})
        if i % 20 == 19:
            recs.append({"event": "checkpoint", "epoch": epoch, "run": "r1", "step": step, "t": t + 0.5})
        t += 37.0
    return recs


def _look(job_id: str, recs: list[dict[str, Any]], now: float, epoch: int = 1) -> CopyLook | None:
    """What the engine sees at ``now``: the records written by then (None: nothing yet)."""
    seen = [r for r in recs if r["t"] <= now and r["epoch"] == epoch]
    if not seen:
        return None
    steps = [r["step"] for r in seen if r["event"] == "step"]
    last_step = steps[-1] if steps else int(seen[0].get("restored_step", 0))

    def reports() -> Sequence[Mapping[str, Any]]:
        return seen

    return CopyLook(job_id, JT, "v100", 1, "fp32", epoch, last_step, seen[-1]["t"], reports=reports)


def _run(learner: ThroughputLearner, job_id: str, recs: list[dict[str, Any]], times: Sequence[float]) -> None:
    for now in times:
        look = _look(job_id, recs, now)
        if look is not None:
            learner.observe(look)


def _mine(registry: MeasurementRegistry, job_id: str) -> list[tuple[float, Any, str]]:
    """A job's recorded measurements as (steps/s, measured at, window without the job's id), by time."""
    src = job_source(job_id, "fp32")
    out = [(m.steps_per_s, m.measured_at, str(m.window).removeprefix(src)) for m in registry.all() if m.source == src]
    return sorted(out, key=lambda x: x[1])


def test_windows_are_a_function_of_the_log_alone() -> None:
    recs = _log()
    ran = run_steps(recs, 1)
    assert ran is not None
    run, reports = ran
    assert run == "r1" and reports[0] == (5000 + 89, 1400.0)  # the baseline: the first step report, after the boot
    windows = log_windows(reports, WINDOW_S)
    assert len(windows) == 15  # 399 x 37 s = 4.1 h after the baseline; each window 925 s (25 reports)
    for (s0, t0, s1, t1), nxt in itertools.pairwise(windows):
        assert t1 - t0 >= WINDOW_S and t1 - t0 < WINDOW_S + 37.0 and s1 > s0
        assert nxt[:2] == (s1, t1)  # contiguous: a window starts where the last one ended
    # a newer run of the epoch is the copy (its own baseline); another epoch's records are not read
    later = [{"event": "start", "epoch": 1, "run": "r2", "t": 99999.0}, *_log(epoch=2)]
    assert run_steps(recs + later, 1) == ("r2", [])
    assert run_steps(recs, 3) is None


def test_a_learner_restarted_mid_window_records_what_one_never_restarted_records(engine: Engine) -> None:
    registry = MeasurementRegistry(engine)
    recs = _log()
    ticks = [1000.0 + 120.0 * i for i in range(130)]  # the engine's looks, every 120 s
    _run(ThroughputLearner(registry, window_s=WINDOW_S), "job-a", recs, ticks)
    straight = _mine(registry, "job-a")
    assert len(straight) == 15

    # the same copy, looked at by a service killed 6 times mid-window, restarted each time as a new learner
    # over the same database, which looks again at the tick the kill interrupted
    announced: list[Measurement] = []
    kills = [3, 11, 19, 26, 40, 77]  # indexes of the ticks the kills interrupted
    bounds = [0, *kills, len(ticks)]
    for lo, hi in itertools.pairwise(bounds):
        learner = ThroughputLearner(registry, window_s=WINDOW_S, on_measurement=announced.append)
        # the look at the tick a kill interrupted was made, and is made again after the restart
        _run(learner, "job-b", recs, ticks[lo : hi + 1])
    assert _mine(registry, "job-b") == straight
    assert len(announced) == 15  # each announced once (the planner's cache folds each once)

    # looked at other moments (a service down for 7 minutes several times, the looks later): the same windows
    odd = [1000.0 + 173.0 * i for i in range(90) if i % 9 not in (3, 4)]
    _run(ThroughputLearner(registry, window_s=WINDOW_S), "job-c", recs, odd)
    assert _mine(registry, "job-c") == straight


def test_two_replicas_record_each_window_once(engine: Engine) -> None:
    registry = MeasurementRegistry(engine)
    recs = _log()
    announced: list[Measurement] = []
    lock = threading.Lock()

    def note(m: Measurement) -> None:
        with lock:
            announced.append(m)

    replicas = [ThroughputLearner(MeasurementRegistry(engine), window_s=WINDOW_S, on_measurement=note) for _ in "ab"]
    ticks = [1000.0 + 120.0 * i for i in range(130)]

    def replica(learner: ThroughputLearner, offset: float) -> Callable[[], None]:
        return lambda: _run(learner, "job-r", recs, [t + offset for t in ticks])

    threads = [threading.Thread(target=replica(r, off)) for r, off in zip(replicas, (0.0, 60.0), strict=True)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    recorded = _mine(registry, "job-r")
    assert len(recorded) == 15 and len({w for _, _, w in recorded}) == 15
    assert sorted(m.window or "" for m in announced) == sorted(job_source("job-r", "fp32") + w for _, _, w in recorded)
    # and a measurement of a window already recorded is refused by the registry, not written again
    (first,) = [m for m in registry.all() if m.window == announced[0].window]
    assert registry.add(first) is False
    assert len(_mine(registry, "job-r")) == 15
    # a registration (no window) is never deduplicated
    reg = Measurement(JT, "v100", 1, 2.0, source="user")
    assert registry.add(reg) and registry.add(reg)


def test_the_learners_memory_of_logged_copies_is_bounded(engine: Engine) -> None:
    learner = ThroughputLearner(MeasurementRegistry(engine), window_s=WINDOW_S, max_windows=2)
    recs = _log()
    for i in range(4):
        _run(learner, f"job-{i}", recs, [2000.0 + i])
    assert sorted(learner._logged) == ["job-2", "job-3"]
    learner.forget("job-3")
    assert sorted(learner._logged) == ["job-2"]


@pytest.mark.parametrize("window_s", [100.0, 900.0, 3600.0])
def test_a_window_never_spans_the_boot(window_s: float) -> None:
    ran = run_steps(_log(), 1)
    assert ran is not None
    windows = log_windows(ran[1], window_s)
    assert windows and windows[0][1] == 1400.0  # from the first step report, not from the start at 1000 s

"""The progress audit: exactly the steps asked for, none lost beyond the last checkpoint, none twice.

Runs are written through real agents (with a hand-moved clock), including the classic mistakes a
drill must catch: re-running the restored step, ignoring the checkpoint, skipping a step.
"""

from __future__ import annotations

import pytest

from costopt.agent import CheckpointError, control


def _run(agent, start: int, stop: int, *, every: int | None = None, final: int | None = None, clock=None):
    """Execute steps start..stop (inclusive) with an agent, checkpointing every ``every`` steps."""
    for step in range(start, stop + 1):
        if clock is not None:
            clock.advance(0.01)
        agent.report(step)
        if every and step % every == 0:
            agent.checkpoint(step, {"s": step})
    if final is not None:
        agent.checkpoint(final, {"s": final})
        agent.finish(final)


def test_an_uninterrupted_run_is_exact(make_agent, uri, clock):
    a = make_agent(1)
    a.restore()
    _run(a, 1, 50, every=10, final=50, clock=clock)
    result = control.audit_job(uri, 50)
    assert result.ok and result.steps_done == 50 and result.wasted_steps == 0


def test_a_preempted_job_resumed_from_its_last_checkpoint_is_exact_and_wastes_the_tail(make_agent, uri, clock):
    a = make_agent(1)
    a.restore()
    _run(a, 1, 37, every=10, clock=clock)  # killed after step 37: last checkpoint at 30
    control.claim_epoch(uri, 2)
    b = make_agent(2)
    ckpt = b.restore()
    assert ckpt is not None and ckpt.step == 30
    _run(b, 31, 60, every=10, final=60, clock=clock)
    result = control.audit_job(uri, 60)
    assert result.ok, result.problems
    assert (result.steps_done, result.lost_steps, result.repeated_steps, result.wasted_steps) == (60, 0, 0, 7)
    assert len(result.lineage) == 2


def test_re_running_the_restored_step_counts_it_twice(make_agent, uri, clock):
    a = make_agent(1)
    a.restore()
    _run(a, 1, 20, every=10, clock=clock)
    b = make_agent(2)
    b.restore()
    _run(b, 20, 40, every=10, final=40, clock=clock)  # off by one: step 20 again
    result = control.audit_job(uri, 40)
    assert not result.ok
    assert result.repeated_steps == 1 and result.steps_done == 41


def test_ignoring_the_checkpoint_loses_the_checkpointed_steps(make_agent, uri, clock):
    a = make_agent(1)
    a.restore()
    _run(a, 1, 25, every=10, clock=clock)
    b = make_agent(2)  # never calls restore(): starts from scratch although step 20 was saved
    _run(b, 1, 30, every=10, final=30, clock=clock)
    result = control.audit_job(uri, 30)
    assert not result.ok
    assert result.lost_steps == 20 and result.repeated_steps == 0


def test_skipping_a_step_after_restore_is_a_lost_step(make_agent, uri, clock):
    a = make_agent(1)
    a.restore()
    _run(a, 1, 10, every=10, clock=clock)
    b = make_agent(2)
    b.restore()
    _run(b, 12, 20, every=10, final=20, clock=clock)
    result = control.audit_job(uri, 20)
    assert result.lost_steps == 1 and result.steps_done == 19 and not result.ok


def test_a_job_that_never_finished_is_not_ok(make_agent, uri, clock):
    a = make_agent(1)
    a.restore()
    _run(a, 1, 15, every=10, clock=clock)
    result = control.audit_job(uri, 20)
    assert not result.finished and not result.ok


def test_epoch_progress_tells_the_migrator_the_new_copy_is_progressing(make_agent, uri, clock):
    a = make_agent(1)
    a.restore()
    _run(a, 1, 10, every=10, clock=clock)
    b = make_agent(2)
    b.restore()
    assert not control.progress(uri, 2).progressing
    _run(b, 11, 12, clock=clock)
    p = control.progress(uri, 2)
    assert p.progressing and (p.restored_step, p.last_step) == (10, 12)
    assert not control.progress(uri, 3).started


def test_audit_without_records():
    from costopt.agent import audit

    result = audit([], 10)
    assert not result.ok and result.to_dict()["steps_done"] == 0


# -- coarse logs: one record for a range of steps (Agent.report_steps, the simulated cloud's agents) ------


def test_ranged_records_audit_as_their_steps(make_agent, uri, clock):
    a = make_agent(1)
    a.restore()
    a.report_steps(1, 25)
    clock.advance(1)
    a.report_steps(26, 30)
    a.checkpoint(30, {"s": 30})
    a.report_steps(31, 37)  # wasted: preempted before the next checkpoint
    control.claim_epoch(uri, 2)
    b = make_agent(2)
    assert b.restore().step == 30
    clock.advance(1)
    b.report_steps(31, 60)
    b.checkpoint(60, {"s": 60})
    b.finish(60)
    result = control.audit_job(uri, 60)
    assert result.ok, result.problems
    assert (result.steps_done, result.lost_steps, result.repeated_steps, result.wasted_steps) == (60, 0, 0, 7)
    assert control.progress(uri, 2).last_step == 60


def test_a_range_that_reruns_the_restored_steps_or_leaves_a_gap_is_caught(make_agent, uri, clock):
    a = make_agent(1)
    a.restore()
    a.report_steps(1, 20)
    a.checkpoint(20, {"s": 20})
    control.claim_epoch(uri, 2)
    b = make_agent(2)
    b.restore()
    clock.advance(1)
    b.report_steps(18, 30)  # steps 18..20 again
    b.report_steps(33, 40)  # 31, 32 skipped
    b.checkpoint(40, {"s": 40})
    b.finish(40)
    result = control.audit_job(uri, 40)
    assert not result.ok
    assert result.repeated_steps == 3 and result.lost_steps == 2 and result.steps_done == 41
    assert any("steps 18..20 again" in p for p in result.problems)
    assert any("first [31, 32]" in p for p in result.problems)


@pytest.mark.parametrize(("first", "last"), [(0, 5), (6, 5)])
def test_a_bad_range_is_refused(make_agent, uri, first, last):
    a = make_agent(1)
    a.restore()
    with pytest.raises(CheckpointError, match="first <= last"):
        a.report_steps(first, last)
    assert control.progress(uri, 1).last_step == 0


class _Killed(BaseException):
    """A SIGKILL landing in the agent (not an Exception: nothing in the agent may catch it)."""


def _killed_while_recording_its_checkpoint(a, step: int, monkeypatch) -> None:
    """``a`` publishes its checkpoint of ``step`` and dies before appending the record of it (the agent writes
    the checkpoint first, then the record; a SIGKILL can land between the two)."""
    real = a._record

    def killed(event, **fields):
        if event == "checkpoint":
            raise _Killed
        return real(event, **fields)

    monkeypatch.setattr(a, "_record", killed)
    with pytest.raises(_Killed):
        a.checkpoint(step, {"s": step})
    monkeypatch.setattr(a, "_record", real)


def test_a_run_killed_between_publishing_its_checkpoint_and_recording_it_audits_exact(
    make_agent, uri, clock, monkeypatch
):
    """Seen in a drill on the simulated market under load: the next run restores a checkpoint whose record
    never made it to the log. Nothing was lost or repeated: the audit stays exact."""
    a = make_agent(1)
    a.restore()
    _run(a, 1, 7, every=5, clock=clock)
    a._flush(force=True)
    _killed_while_recording_its_checkpoint(a, 7, monkeypatch)
    control.claim_epoch(uri, 2)
    b = make_agent(2)
    ckpt = b.restore()
    assert ckpt is not None and ckpt.step == 7
    _run(b, 8, 20, every=5, final=20, clock=clock)
    result = control.audit_job(uri, 20)
    assert result.ok and result.problems == (), result.problems
    assert (result.steps_done, result.lost_steps, result.repeated_steps) == (20, 0, 0)


def test_a_checkpoint_without_its_record_is_a_problem_when_the_run_recorded_steps_after_it(
    make_agent, uri, clock, monkeypatch
):
    a = make_agent(1)
    a.restore()
    _run(a, 1, 7, every=5, clock=clock)
    _killed_while_recording_its_checkpoint(a, 7, monkeypatch)
    _run(a, 8, 9, clock=clock)  # then went on as if nothing happened: not a death mid-checkpoint
    a._flush(force=True)
    control.claim_epoch(uri, 2)
    b = make_agent(2)
    b.restore()
    _run(b, 8, 20, every=5, final=20, clock=clock)
    result = control.audit_job(uri, 20)
    assert any("has no checkpoint record of step 7" in p for p in result.problems), result.problems

"""The rebalancer with the real job engine over the simulated cloud (both backends): a running job is moved
to the cheaper offer through ``JobEngine.move`` with the rule's reason and expected saving, and the move
the engine records keeps it in place for the dwell time."""

from __future__ import annotations

from datetime import timedelta

from costopt.jobs.model import JobState
from costopt.jobs.rebalance import Outcome, Rebalancer
from costopt.migration.decision import MigrationRule, Reason
from tests.jobs import test_engine_sim as sim_module
from tests.jobs.test_engine_sim import OD_A, OD_B, Sim


def test_the_rebalancer_moves_a_running_job_through_the_engine_then_dwells(engine, tmp_path) -> None:
    sim = Sim(engine, tmp_path, [OD_A, OD_B])  # OD_A ranked first: the job starts there ($3.06/h)
    job = sim.submit(200_000)
    running = sim.run(job.id, lambda j: j.state is JobState.RUNNING and j.steps_done >= 2_000)
    assert running.offer == OD_A
    rebalancer = Rebalancer(sim.repo, sim.placements, sim.engine.move, MigrationRule(), sim.cloud.now)

    [proposed] = rebalancer.run_once(dry_run=True).items
    assert proposed.outcome is Outcome.PROPOSED and proposed.to_offer == OD_B
    assert sim.repo.get(job.id).offer == OD_A

    [moved] = rebalancer.run_once(dry_run=False).items
    assert moved.outcome is Outcome.MOVED, moved.reason
    assert (moved.from_offer, moved.to_offer) == (OD_A, OD_B)
    assert moved.net_saving_usd is not None and moved.margin_usd is not None
    assert moved.net_saving_usd > moved.margin_usd > 0
    after = sim.repo.get(job.id)
    assert after.state is JobState.RUNNING and after.offer == OD_B
    migrating = [e for e in sim.repo.events(job.id) if e.to_state == JobState.MIGRATING.value]
    assert len(migrating) == 1 and migrating[0].reason == f"moving: {moved.reason}"
    assert migrating[0].detail is not None
    assert migrating[0].detail["expected_saving_usd"] == str(moved.net_saving_usd)
    assert [e.kind for e in sim.repo.events(job.id)].count("move") == 1

    # Moving back does not pay (OD_A is dearer); and when it would, the move just made holds the job there
    # for the dwell time (24 h of the service clock, from the engine's own move event).
    [stays] = rebalancer.run_once(dry_run=False).items
    assert stays.outcome is Outcome.STAYED and Reason.NO_SAVING.text in stays.reason
    old = dict(sim_module.PRICE)
    try:
        sim_module.PRICE[OD_B] = 5.0  # the job's offer now costs more than OD_A
        [held] = rebalancer.run_once(dry_run=False).items
        assert held.outcome is Outcome.STAYED and Reason.DWELL.text in held.reason
        sim.cloud.clock.advance(timedelta(hours=25))
        [back] = rebalancer.run_once(dry_run=True).items
        assert back.outcome is Outcome.PROPOSED and back.to_offer == OD_A
    finally:
        sim_module.PRICE.clear()
        sim_module.PRICE.update(old)

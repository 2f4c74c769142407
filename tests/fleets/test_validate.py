"""The physical-vs-simulated check, small (``costopt gavel validate`` in a few tens of seconds): a real
service on a loopback port, a fleet of three local worker processes labelled K80, P100 and V100, four jobs
of ``examples/train.py`` arriving over time, 3-second rounds; then the same trace through the simulator.

Every job finishes, no step is lost or repeated (the agents' own logs), the rounds really restarted jobs
(moves measured), the live JCT and makespan are those of the simulator charged with the measured restart
overhead (loosely: this is one small run on a shared machine; docs/gavel.md has the full figures), and the
ledger billed every round to the fleet's jobs and its idle GPUs (exactness: tests/fleets/test_executor.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.fleet_validate import ValidationSetup, build_jobs, validate
from costopt.gavel.workload import load_workload
from costopt.settings import Settings

SMALL = ValidationSetup(
    jobs=4,
    policies=("max_min_fairness_perf",),
    seed=3,
    round_s=3.0,
    per_label=1,
    min_s=4.0,
    max_s=9.0,
    mean_gap_s=1.5,
    timeout_s=120.0,
)


def test_the_trace_keeps_the_catalogs_speed_ratios_and_lasts_tens_of_seconds(shared_data: Path) -> None:
    path = Settings().resolved_throughput_file()
    assert path is not None
    jobs = build_jobs(ValidationSetup(jobs=30, seed=1), path)
    assert len(jobs) == 30 and [j.arrival_s for j in jobs] == sorted(j.arrival_s for j in jobs)
    workload = load_workload(path, ("k80", "p100", "v100"))
    for j in jobs:  # 20 steps/s on a V100; the other labels at the catalog's ratios for the job's type
        (entry,) = [e for e in range(workload.n_entries) if workload.names[e] == f"{j.job_type} x1"]
        cons = workload.consolidated[entry]
        assert j.rates["v100"] == 20.0
        assert j.rates["k80"] == pytest.approx(20.0 * cons[0] / cons[2]) and j.rates["p100"] == pytest.approx(
            20.0 * cons[1] / cons[2]
        )
    seconds = [j.steps / j.rates["v100"] for j in jobs]
    assert min(seconds) >= 12.0 - 0.05 and max(seconds) <= 60.0 + 0.05 and len({j.job_type for j in jobs}) > 5


@pytest.mark.slow
def test_a_live_fleet_matches_the_simulator_and_loses_no_step(shared_data: Path, tmp_path: Path) -> None:
    (result,) = validate(SMALL, workdir=tmp_path)
    assert result.jobs_done == result.jobs == 4
    assert result.lost_steps == 0 and result.repeated_steps == 0
    assert result.rounds >= 3 and result.new_copies >= 1 and 0 < result.round_overhead_s < SMALL.round_s
    assert result.sim_restart_overhead_s == pytest.approx(result.round_overhead_s, abs=1e-3)
    # Live times follow the wall clock: the 24-job `costopt gavel validate` runs measured +4.0% to +7.0% (docs/gavel.md,
    # "Physical against simulated"); this 4-job run's bound only catches a live fleet that no longer tracks the
    # simulation (under other runs' load its error reached 0.50-0.77 with nothing wrong).
    assert abs(result.jct_error) < 1.0 and abs(result.makespan_error) < 1.0
    assert result.live_avg_jct_s >= result.sim0_avg_jct_s * 0.9  # live never beats an overhead-free simulation much
    _ledger_is_exact(tmp_path / "max_min_fairness_perf")


def _ledger_is_exact(folder: Path) -> None:
    """Every round billed; the fleet's ledger lines are its jobs' and its idle GPUs' (the fleet's id)."""
    from costopt.db.engine import make_engine
    from costopt.fleets.store import FleetRepository
    from costopt.ledger.prices import StorePriceView
    from costopt.ledger.sql import SqlLedger
    from pricing.store import PriceStore

    engine = make_engine(f"sqlite:///{folder / 'costopt.db'}")
    try:
        repo = FleetRepository(engine)
        (fleet,) = repo.page().items
        rounds = repo.rounds(fleet.id)
        assert rounds and all(r.billed for r in rounds)
        report = SqlLedger(engine, StorePriceView(PriceStore(engine))).costs(team=fleet.team_id)
        by_job = report.by("job_id")
        jobs = {j.job_id for j in repo.jobs(fleet.id)}
        assert jobs <= set(by_job) and set(by_job) <= jobs | {fleet.id}
        assert all(v > 0 for v in by_job.values()) and report.total_usd > 0
    finally:
        engine.dispose()

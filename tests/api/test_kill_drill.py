"""kill -9 mid-run, small (issue 14; the full drill is ``bench/kill_drill.py``): ``costopt serve`` on the
simulated cloud with its state file, SIGKILLed while 2 jobs run and restarted: every job succeeds
with exactly its steps (the agent's audit) and no instance is left alive in the simulated cloud; two runs
without kills on the stepped clock (lockstep with the service's work) are the same run: the same ledger
total, preemptions and recoveries included. The drill's price steps (no service; not marked ``drill``):
drawn from the seed, applied from each step on outside its spared zone."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kill_drill import RunResult, run


@pytest.mark.drill  # two starts of `costopt serve` (~4 s of CPU each: its imports); 190 s at load 15 with 2 kills
def test_the_service_killed_mid_run_restarts_and_every_job_ends_exactly(tmp_path: Path, shared_data: Path) -> None:
    res = run(
        jobs=2,
        kills=1,
        seed=3,
        time_scale=3600.0,
        up=(0.5, 1.5),
        steps=(30_000, 40_000),
        folder=tmp_path,
        data_dir=shared_data,
        timeout_s=300.0,
        say=lambda *a: None,
    )
    assert res.kills == 1  # each job needs > 3 simulated hours: more than the up-times at 3600x
    assert res.problems == [] and res.succeeded == res.exact == 2
    assert res.orphans == [] and res.instances >= 2
    assert res.total_usd > 0 and res.state_saves > 0


@pytest.mark.drill  # four starts of `costopt serve` (~4 s of CPU each); ~40 s on a quiet machine
def test_two_runs_without_kills_on_the_stepped_clock_have_the_same_ledger(tmp_path: Path, shared_data: Path) -> None:
    def once(folder: Path) -> RunResult:
        return run(
            jobs=2,
            kills=0,
            seed=3,
            time_scale=3600.0,  # unused: the stepped clock moves with the service's work, not the wall
            up=(0.5, 1.5),
            steps=(3000, 4000),
            folder=folder,
            data_dir=shared_data,
            timeout_s=300.0,
            spot_hazard=3.0,  # reclaims: the watcher's recoveries are part of what must be the same
            clock="stepped",
            step_s=30.0,
            say=lambda *a: None,
        )

    first, second = once(tmp_path / "a"), once(tmp_path / "b")
    assert first.succeeded == first.exact == second.succeeded == second.exact == 2
    assert first.preemptions > 0 and first.recoveries > 0
    assert (second.preemptions, second.recoveries) == (first.preemptions, first.recoveries)
    assert first.total_usd > 0 and second.total_usd == first.total_usd  # to the micro-dollar


def test_the_price_steps_are_drawn_from_the_seed_and_step_every_price_but_the_spared_zones(
    tmp_path: Path, shared_data: Path
) -> None:
    from datetime import timedelta

    from bench.kill_drill import AWS_SPOT_FILE, START, STEP_TYPE, _at, _read_prices, price_schedule, write_prices

    rows = _read_prices(shared_data / "prices" / AWS_SPOT_FILE)
    schedule = price_schedule(rows, seed=2, steps=2, every_h=3.0, factor=3.0)
    assert schedule == price_schedule(rows, seed=2, steps=2, every_h=3.0, factor=3.0)  # the seed's, every run
    assert schedule != price_schedule(rows, seed=3, steps=2, every_h=3.0, factor=3.0)
    first, second = schedule
    assert START + timedelta(hours=3) <= first.at < START + timedelta(hours=4) <= second.at < START + timedelta(hours=7)
    assert first.spared != second.spared
    n = write_prices(rows, schedule, tmp_path / "stepped.csv")
    stepped = _read_prices(tmp_path / "stepped.csv")
    assert n == len(stepped) > len(rows)

    def price(table: list[dict[str, str]], zone: str, at: object) -> float:
        found = [r for r in table if r["availability_zone"] == zone and r["instance_type"] == STEP_TYPE]
        found = [r for r in found if r["product_description"] == "Linux/UNIX" and _at(r) <= at]  # type: ignore[operator]
        return float(max(found, key=_at)["spot_usd_per_hour"])

    other = "eu-west-1a" if "eu-west-1a" not in (first.spared, second.spared) else "us-east-1d"
    before = first.at - timedelta(seconds=1)
    assert price(stepped, other, before) == price(rows, other, before)  # nothing changes before the first step
    assert price(stepped, other, first.at) == round(3 * price(rows, other, first.at), 6)  # at the step, not later
    assert price(stepped, first.spared, first.at) == price(rows, first.spared, first.at)
    assert price(stepped, first.spared, second.at) == round(3 * price(rows, first.spared, second.at), 6)
    assert price(stepped, second.spared, second.at) == price(rows, second.spared, second.at)

"""kill -9 mid-run, small (issue 14; the full drill is ``bench/kill_drill.py``): ``costopt serve`` on the
simulated cloud with its state file, SIGKILLed while 2 jobs run and restarted: every job succeeds
with exactly its steps (the agent's audit) and no instance is left alive in the simulated cloud."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kill_drill import run


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

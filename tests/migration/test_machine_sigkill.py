"""Fault injection for real: the migrator runs in its own process and is SIGKILLed at a state
transition (``COSTOPT_MIGRATOR_KILL_AT``), then restarted with ``resume``. One move per transition
(9 in a row on the same job; the runs in parallel were slower on a 2-CPU machine): every time exactly
one copy of the job runs afterwards, no orphan is left, the token launched nothing twice, and the
checkpoints never go back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from costopt.agent import control
from costopt.db.engine import make_engine, migrate
from costopt.migration.machine import ENV_KILL_AT, State, reconcile
from costopt.settings import PROJECT_ROOT
from providers.local import LocalProvider
from tests.migration.test_machine import CRASH_POINTS, alive, assert_one_copy, started_job

RUNNER = r"""
import sys
from costopt.db.engine import make_engine
from costopt.domain import Cloud, Market, OfferKey
from costopt.migration.machine import Migrator
from providers.local import LocalProvider
url, state_dir, cwd, mode = sys.argv[1:5]
offers = [OfferKey(Cloud.LOCAL, "local", z, "cpu-1", Market.SPOT) for z in ("local-a", "local-b")]
m = Migrator(make_engine(url), LocalProvider(state_dir, cwd=cwd, grace_seconds=3.0),
             checkpoint_timeout=20.0, verify_timeout=20.0, backoff_base=0.01)
recs = [m.move("job-1", offers)] if mode == "move" else m.resume("job-1")
print(",".join(r.state.value for r in recs))
"""


def run_migrator(url: str, state_dir: Path, mode: str, kill_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_KILL_AT}
    if kill_at:
        env[ENV_KILL_AT] = kill_at
    return subprocess.run(
        [sys.executable, "-c", RUNNER, url, str(state_dir), str(PROJECT_ROOT), mode],
        env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.slow
def test_sigkill_at_each_of_the_9_state_transitions_then_restart_leaves_exactly_one_copy_and_no_orphan(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'costopt.db'}"
    engine = make_engine(url)
    migrate(engine)
    local = LocalProvider(tmp_path / "cloud", cwd=PROJECT_ROOT, grace_seconds=3.0)
    try:
        mig = started_job(engine, local, tmp_path)
        uri = mig.job("job-1").checkpoint_uri
        killed = 0
        for n, point in enumerate(CRASH_POINTS, start=2):
            crashed = run_migrator(url, tmp_path / "cloud", "move", point)
            assert crashed.returncode == -signal.SIGKILL, (point, crashed.stderr[-2000:])
            killed += 1
            restarted = run_migrator(url, tmp_path / "cloud", "resume", None)
            assert restarted.returncode == 0, (point, restarted.stderr[-2000:])
            assert restarted.stdout.strip() == ("" if point == "enter:done" else State.DONE.value), point
            assert mig.job("job-1").epoch == n, point
            assert len(local.list({"costopt-job": "job-1", "costopt-epoch": str(n)})) == 1, point  # one launch
            assert len(alive(local)) == 1, point
            assert reconcile(engine, local).orphans_terminated == (), point
            assert_one_copy(mig, local)
            assert control.progress(uri, n).progressing, point
            audit = control.audit_job(uri)
            assert audit.checkpoints_monotonic and audit.repeated_steps == 0, (point, audit.problems)
        assert killed == len(CRASH_POINTS) == 9
    finally:
        for inst in alive(local):
            local.terminate(inst.instance_id)
        local.close()
        engine.dispose()

"""Fault injection for real, on SQLite and PostgreSQL: the migrator runs in its own process, billing
into the ledger, and is SIGKILLed (``COSTOPT_MIGRATOR_KILL_AT``) at one of the 9 state transitions or
right after one of its 2 ledger writes, then restarted in a new process with ``resume`` (each process
forked from a warm parent that only imported the modules, see ``SERVER``). One move per
kill point (11 in a row on the same job; runs in parallel were slower on a 2-CPU machine): every time
exactly one copy of the job runs afterwards, no orphan is left, the token launched nothing twice, the
checkpoints never go back, and the ledger holds one interval per epoch whose bounds are the copies'
launch and end times (no interval counted twice, nothing changed by a second restart)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from costopt.agent import control
from costopt.db.engine import make_engine, migrate
from costopt.ledger.sql import SqlLedger
from costopt.migration.machine import ENV_KILL_AT
from costopt.migration.records import State
from costopt.settings import PROJECT_ROOT
from providers.local import LocalProvider
from tests.conftest import PG_ADMIN_URL, pg_schema
from tests.migration.test_machine import (
    AFTER_LAST_COMMIT,
    CRASH_POINTS,
    ENDLESS,
    LEDGER_POINTS,
    OFFERS,
    alive,
    assert_ledger_consistent,
    assert_one_copy,
    billed_migrator,
    ledger_snapshot,
    step_prices,
)

KILL_POINTS = CRASH_POINTS + LEDGER_POINTS

# A warm parent: it imports what the migrator needs, then forks one fresh process per run (so a run
# starts in milliseconds, not in the second or two the imports take on a loaded 2-CPU machine). The
# parent never creates an engine, a provider or a migrator: each child builds its own, like a new
# process would, and the parent only reports how the child ended. The prices are those of
# step_prices() in tests/migration/test_machine.py (0.9 and 1.2 USD/h since 2020).
SERVER = r"""
import json, os, sys, traceback
import numpy as np
from costopt.db.engine import make_engine
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger.prices import StepPrices
from costopt.ledger.sql import SqlLedger
from costopt.migration.machine import ENV_KILL_AT, Migrator
from providers.local import LocalProvider

url, state_dir, cwd = sys.argv[1:4]


def child(mode, kill_at, out, err):
    fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.pop(ENV_KILL_AT, None)
    if kill_at:
        os.environ[ENV_KILL_AT] = kill_at
    try:
        offers = [OfferKey(Cloud.LOCAL, "local", z, "cpu-1", Market.SPOT) for z in ("local-a", "local-b")]
        since = np.array([1577836800 * 10**9], dtype=np.int64)
        prices = StepPrices(offers, [since, since], [np.array([0.9]), np.array([1.2])], {})
        engine = make_engine(url)
        m = Migrator(engine, LocalProvider(state_dir, cwd=cwd, grace_seconds=3.0), checkpoint_timeout=20.0,
                     verify_timeout=20.0, backoff_base=0.01, poll_seconds=0.05,
                     ledger=SqlLedger(engine, prices))
        recs = [m.move("job-1", offers)] if mode == "move" else m.resume("job-1")
        with open(out, "w") as f:
            f.write(",".join(r.state.value for r in recs))
        code = 0
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        child(**json.loads(line))
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    print(json.dumps({"code": code}), flush=True)
"""


@dataclass(frozen=True)
class Run:
    """How one migrator process ended: its exit code (``-9``: SIGKILLed), what it printed (the states
    of the migrations it ran, comma-separated) and its stderr."""

    code: int
    stdout: str
    stderr: str


class MigratorProcesses:
    """Runs the migrator in a new process per call (see ``SERVER``), killed where ``kill_at`` says."""

    def __init__(self, url: str, state_dir: Path, work: Path) -> None:
        self.work = work
        self.runs = 0
        env = {k: v for k, v in os.environ.items() if k != ENV_KILL_AT}
        env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = "1"  # no BLAS threads in a forking parent
        self.server_err = work / "server.err"
        with open(self.server_err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", SERVER, url, str(state_dir), str(PROJECT_ROOT)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=PROJECT_ROOT, env=env,
            )  # fmt: skip

    def run(self, mode: str, kill_at: str | None = None, timeout: float = 120.0) -> Run:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.runs += 1
        out, err = self.work / f"run{self.runs}.out", self.work / f"run{self.runs}.err"
        cmd = {"mode": mode, "kill_at": kill_at, "out": str(out), "err": str(err)}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise AssertionError(f"no answer from the migrator's parent: {self.server_err.read_text()[-2000:]}")
        code = int(json.loads(line)["code"])
        return Run(code, out.read_text() if out.exists() else "", err.read_text() if err.exists() else "")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database the migrator's subprocesses reach by URL: a SQLite file, or a
    PostgreSQL schema of its own (``search_path`` in the URL)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'costopt.db'}"
        return
    with pg_schema() as schema:
        yield f"{PG_ADMIN_URL}?options=-csearch_path%3D{schema}"


@pytest.mark.slow
def test_sigkill_at_each_transition_and_ledger_write_then_restart_leaves_one_copy_no_orphan_and_no_double_billing(
    database_url: str, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    engine = make_engine(database_url)
    migrate(engine)
    backend = engine.dialect.name
    assert backend in ("sqlite", "postgresql")
    ledger = SqlLedger(engine, step_prices())
    local = LocalProvider(tmp_path / "cloud", cwd=PROJECT_ROOT, grace_seconds=3.0)
    migrators = MigratorProcesses(database_url, tmp_path / "cloud", tmp_path)
    try:
        mig = billed_migrator(engine, local, ledger)
        mig.register_job("job-1", ENDLESS, str(tmp_path / "ckpt" / "job-1"))
        assert mig.start("job-1", OFFERS).state is State.DONE
        uri = mig.job("job-1").checkpoint_uri
        killed = 0
        for n, point in enumerate(KILL_POINTS, start=2):
            crashed = migrators.run("move", kill_at=point)
            assert crashed.code == -signal.SIGKILL, (point, crashed.stderr[-2000:])
            killed += 1
            restarted = migrators.run("resume")
            assert restarted.code == 0, (point, restarted.stderr[-2000:])
            assert restarted.stdout.strip() == ("" if point in AFTER_LAST_COMMIT else State.DONE.value), point
            assert mig.job("job-1").epoch == n, point
            assert len(local.list({"costopt-job": "job-1", "costopt-epoch": str(n)})) == 1, point  # one launch
            assert len(alive(local)) == 1, point
            assert_one_copy(mig, local)  # exactly one copy, the job's, and the reconciler finds no orphan
            assert control.progress(uri, n).progressing, point
            audit = control.audit_job(uri)
            assert audit.checkpoints_monotonic and audit.repeated_steps == 0, (point, audit.problems)
            # The ledger: every copy billed once, bounds = the copies' lifetimes, all synced.
            assert_ledger_consistent(engine, ledger, local, "job-1")
            assert len(ledger.intervals(job_id="job-1")) == n, point
            copies = mig.copies("job-1")
            assert copies and all(c.synced for c in copies), point
            before = ledger_snapshot(ledger, "job-1")
            assert billed_migrator(engine, local, ledger).resume() == [], point
            assert ledger_snapshot(ledger, "job-1") == before, point  # resuming again bills nothing
        assert killed == len(KILL_POINTS) == 11
        record_property(f"faults_injected_{backend}", killed)
        print(f"\n{killed} SIGKILL faults injected on {backend}, all recovered")  # noqa: T201
    finally:
        migrators.close()
        for inst in alive(local):
            local.terminate(inst.instance_id)
        local.close()
        engine.dispose()

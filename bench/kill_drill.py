"""kill -9 mid-run (issue 14): the service, run as ``costopt serve`` on the simulated cloud, is killed with
SIGKILL at random moments while it runs a batch of jobs, and restarted each time.

The simulated cloud keeps its state in a file of its own (``COSTOPT_SIM_STATE_FILE``: clock, instances,
their agents, drawn preemptions, written at every change, read back at start), as a real cloud outlives
its client: a restarted service finds its instances where they were. The jobs' checkpoints are files
under the run's folder. While the service is down nothing moves the simulated clock (it is the service's
clock driver that moves it), so a kill costs simulated time only through what the restart does.

**The clock** (``--clock``, default ``stepped``): the service runs with ``COSTOPT_SIM_CLOCK=stepped``: its
simulated clock moves by ``--step`` simulated seconds (default 30) only once every scheduled job due at the
current simulated time (job engine tick, interruption watcher, reconciler, rebalancer, fleet rounds) and the
work it started have run or wait on the clock (``api.sim_clock.SteppedClockDriver``), whatever the machine's
load. Runs of one seed without kills are then the same run (same ledger total): the comparison measures what
the kills cost, not the load. The kills still land at random wall moments, i.e. at whatever simulated time the
service has reached then, mid-step included (a step is many database writes and cloud calls). ``--clock
wall`` follows wall time x ``--time-scale`` (``make run``'s clock), as the drill did before: there two runs of
one seed differ by tens of USD (which copies a reclaim or a price step hits depends on the load).

One run:

1. a fresh SQLite database (or ``--database-url``, e.g. a PostgreSQL database you created) migrated, with
   the instance catalog and the replayed 2020 AWS spot prices, with the drill's **price steps** (below)
   written into them; a team and a member key;
2. ``costopt serve`` in a subprocess: first with the simulated clock all but stopped for the submissions
   (step 3: a wall clock at 1e-12x, which does not move a microsecond, so every run submits at ``START``
   exactly, however long the posts take, and the service orders the jobs by their ids (seeded: the same in
   every run, ``COSTOPT_JOB_ID_SEED``, which also seeds the fleet's and its instances' ids); the
   stepped clock then starts at the first point of its grid after them, ``START`` + ``--step``; ``--clock
   wall``: at 1x, ``START`` + that phase's wall seconds), then stopped with SIGTERM, not a kill, and started
   again with the run's clock (above;
   ``--clock wall``: at ``--time-scale``, 3600x a simulated hour per wall second), the service's own job
   engine, interruption watcher, reconciler, rebalancer (every 15 simulated minutes, so jobs move when
   another zone is cheaper) and fleet rounds;
3. ``--jobs`` ResNet-50 jobs on AWS spot (steps drawn from ``--seed``); spot preemptions are drawn by the
   simulated cloud (**reclaims**, below); with ``--fleet-jobs N``, a fleet of three sim spot instances
   (2 V100, 1 K80) is leased first and the first N jobs (an eighth of their drawn steps) go into it (its
   simulated workers run them; it is released at the end);
4. ``--kills`` times: wait a random up-time (uniform in ``--up``), SIGKILL the server, restart it (the
   up-times are drawn from ``--seed`` too); the kills stop when every job has ended;
5. wait until every job has ended, stop the server, then check: every job ``succeeded`` with exactly its
   steps (``costopt.agent.control.audit_job`` over its checkpoint location: no step lost or run twice
   across copies), zero instances left alive in the simulated cloud's saved state (orphans), and the
   ledger's total (the jobs' ``cost_so_far_usd``) against the run without kills (``--baseline``, default
   on: the same jobs, no kill) within one boot interval (``timing.boot``, 3 min) of the dearest
   instance's price per kill.

Moves and preemptions, the same in every run of one seed (drawn in simulated time, never wall time):

- **Price steps** (``--price-steps``, default 2; 0: the replayed prices as they are): the 2020 prices give
  the rebalancer nothing worth a move in these hours, so the drill imports a copy of them (written in the
  run's folder) where, from step i on (at ``START + i x --price-step-every`` simulated hours, default 3,
  plus 0-1 h drawn from ``--seed``), every AWS spot price is ``--price-factor`` (default 3) times the
  replayed one except in one *spared* zone (drawn from ``--seed`` among the zones selling p3.2xlarge then,
  neither the previous step's spared zone nor the zone where p3.2xlarge is cheapest then); each step also
  adds, per offer, the record in effect then, so prices change at the step. The service's rebalancer
  (every 15 simulated minutes) then moves the jobs outside the spared zone through the Migrator.
- **Reclaims** (``--spot-hazard``, default 0.15 per simulated hour; 0: none; negative: the hazard model's
  rates from the availability logs, which drew none in these runs): ``COSTOPT_SIM_SPOT_HAZARD_PER_HOUR``,
  each spot offer's Poisson process of reclaims (every instance alive on the offer at a reclaim is
  preempted after the cloud's notice), seeded by ``COSTOPT_SIM_SEED`` = ``--seed``; the service's
  interruption watcher and Migrator recover the jobs. The planner's hazards are unchanged.

With both on, a check requires the killed run to show at least one move and one preemption.

    .venv/bin/python bench/kill_drill.py --jobs 50 --kills 20 --seed 1
    .venv/bin/python bench/kill_drill.py --jobs 5 --kills 3 --no-baseline     # a small version

Where two runs part (``--folder F`` keeps them: ``F/killed``, ``F/baseline``...): ``bench/kill_drill_diff.py
F/killed F/baseline`` compares them job by job (ledger costs, then copies, migrations and events).

Exit 0 when every check passes, 1 otherwise. The comparison's tolerance is the issue's (a boot interval of
the dearest instance per kill); ``--baselines N`` runs N runs without kills (same jobs, same seed), whose
spread is the comparison's own noise (none with the stepped clock: a check requires their totals equal;
with ``--clock wall`` they differ); with N > 1 the killed run's ledger must lie within the baselines' range
widened by the tolerance (with one, within the tolerance of that one).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
START = datetime(2020, 2, 29, tzinfo=UTC)
AWS_SPOT_FILE = "aws_spot_price_history_2019-12_2020-03_p2_p3.csv"
BODY: dict[str, Any] = {
    "job_type": "ResNet-50 (batch size 128)",
    "command": ["python", "train.py"],
    "constraints": {"clouds": ["aws"], "markets": ["spot"]},
}
TERMINAL = ("succeeded", "failed", "cancelled")
_V100 = {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1b", "instance_type": "p3.2xlarge", "market": "spot"}
_K80 = {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1b", "instance_type": "p2.xlarge", "market": "spot"}
FLEET: dict[str, Any] = {
    "name": "kill-drill",
    "policy": "max_min_fairness_perf",
    "instances": [{"offer": _V100, "count": 2}, {"offer": _K80}],
}
FLEET_JOB: dict[str, Any] = {"job_type": BODY["job_type"], "command": BODY["command"]}
BOOT = timedelta(minutes=3)  # providers.sim's default WorkloadTiming.boot
STEP_TYPE = "p3.2xlarge"  # the type the jobs run on (V100: the cheapest per step); its zones are the spared ones


@dataclass(frozen=True)
class PriceStep:
    """From ``at`` (simulated time) on, every AWS spot price is ``factor`` times the replayed one, except in
    ``spared`` (the replayed price), until the next step."""

    at: datetime
    spared: str
    factor: float


def _read_prices(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _at(row: dict[str, str]) -> datetime:
    return datetime.fromisoformat(row["timestamp_utc"].replace("Z", "+00:00"))


def _in_effect(rows: list[dict[str, str]], at: datetime) -> dict[tuple[str, str, str], dict[str, str]]:
    """The replayed record in effect at ``at`` per (zone, instance type, product)."""
    last: dict[tuple[str, str, str], tuple[datetime, dict[str, str]]] = {}
    for r in rows:
        t = _at(r)
        key = (r["availability_zone"], r["instance_type"], r["product_description"])
        if t <= at and (key not in last or last[key][0] <= t):
            last[key] = (t, r)
    return {k: v[1] for k, v in last.items()}


def price_schedule(
    rows: list[dict[str, str]], *, seed: int, steps: int, every_h: float, factor: float
) -> list[PriceStep]:
    """``steps`` price steps drawn from ``seed``: step i (1..steps) at ``START + i * every_h`` hours plus a
    jitter uniform in [0, 1) h (whole seconds); its spared zone is drawn among the zones selling
    :data:`STEP_TYPE` (Linux spot) at that time, neither the previous step's spared zone nor the zone where
    it is cheapest then (where the jobs are likely to be: so each step makes a move pay)."""
    rng = random.Random(f"kill-drill-prices-{seed}")
    out: list[PriceStep] = []
    spared = None
    for i in range(1, steps + 1):
        at = START + timedelta(seconds=round((i * every_h + rng.random()) * 3600))
        offered = {
            z: float(r["spot_usd_per_hour"])
            for (z, it, prod), r in _in_effect(rows, at).items()
            if it == STEP_TYPE and prod == "Linux/UNIX"
        }
        if not offered:
            raise RuntimeError(f"no {STEP_TYPE} spot price at {at}: the price steps need the replayed AWS prices")
        cheapest = min(sorted(offered), key=lambda z: offered[z])
        candidates = sorted(set(offered) - {cheapest, spared}) or sorted(offered)
        spared = rng.choice(candidates)
        out.append(PriceStep(at, spared, factor))
    return out


def write_prices(rows: list[dict[str, str]], schedule: list[PriceStep], path: Path) -> int:
    """The replayed prices with ``schedule`` applied, as a CSV of the same kind at ``path``: every record
    from a step on is multiplied by its factor unless in the spared zone, and each step adds, per offer, the
    record in effect then (so the price changes at the step, not at the offer's next replayed change).
    Returns the records written."""
    from decimal import ROUND_HALF_EVEN

    def factor(zone: str, at: datetime) -> float:
        current = [s for s in schedule if s.at <= at]
        if not current or current[-1].spared == zone:
            return 1.0
        return current[-1].factor

    def priced(r: dict[str, str], at: datetime) -> dict[str, str]:
        usd = Decimal(r["spot_usd_per_hour"]) * Decimal(str(factor(r["availability_zone"], at)))
        return {
            **r,
            "timestamp_utc": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "spot_usd_per_hour": str(usd.quantize(Decimal("0.000001"), ROUND_HALF_EVEN)),
        }

    out = [priced(r, _at(r)) for r in rows]
    for step in schedule:
        seen = {
            (r["availability_zone"], r["instance_type"], r["product_description"]) for r in rows if _at(r) == step.at
        }
        out += [priced(r, step.at) for key, r in sorted(_in_effect(rows, step.at).items()) if key not in seen]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(out)
    return len(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunResult:
    """One run's figures."""

    kills: int = 0
    kills_at: list[datetime] = field(default_factory=list)  # the simulated clock each kill left in the state file
    restarts_s: list[float] = field(default_factory=list)  # kill to /readyz 200 after the restart
    wall_s: float = 0.0
    jobs: int = 0
    succeeded: int = 0
    exact: int = 0  # audit ok with exactly the steps asked for
    problems: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    instances: int = 0
    preemptions: int = 0
    moves: int = 0
    recoveries: int = 0
    total_usd: Decimal = Decimal(0)  # the jobs' ledger costs (the fleet's jobs' too)
    fleet_jobs_usd: Decimal = Decimal(0)  # the part of total_usd of the jobs run in the fleet (its rounds)
    fleet_usd: Decimal = Decimal(0)  # the fleet's cost (its jobs' and its idle time)
    fleet_idle_usd: Decimal = Decimal(0)  # not compared: it lasts until the drill sees the jobs end (wall time)
    max_usd_per_hour: float = 0.0
    sim_hours: float = 0.0
    state_saves: int = 0


class Service:
    """``costopt serve`` in a subprocess over the run's folder; :meth:`start`, :meth:`kill`, :meth:`stop`."""

    def __init__(self, folder: Path, env: dict[str, str], port: int) -> None:
        self.folder = folder
        self.env = env
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout_s: float = 600.0) -> float:
        """Start the server and wait for ``/readyz`` 200 (at most ``timeout_s``: a hang's bound; a start took over 120 s
        at load 15-19); returns the seconds that took."""
        import httpx

        self.starts += 1
        log = open(self.folder / f"serve-{self.starts:03d}.log", "wb")  # noqa: SIM115 - the child's
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "costopt"), "serve", "--no-collect", "--port", str(self.port)],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.folder,
        )
        log.close()
        url = f"http://127.0.0.1:{self.port}/readyz"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with {self.proc.returncode}: see {log.name}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"the service was not ready within {timeout_s:.0f} s: see {log.name}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown, nothing flushed."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def _prepare(
    folder: Path,
    database_url: str | None,
    data_dir: Path | None,
    schedule: list[PriceStep] | None = None,
) -> tuple[dict[str, str], str]:
    """The run's database (with the replayed prices, ``schedule`` applied) and the server's environment;
    returns (env, a member key)."""
    from api.wiring import build_store, seed_catalog
    from costopt.jobs.teams import Role, TeamRepository
    from costopt.settings import Settings
    from pricing.importer import import_paths

    url = database_url or f"sqlite:///{folder / 'costopt.db'}"
    base = Settings() if data_dir is None else Settings(data_dir=data_dir)
    if base.data_dir is None:
        raise RuntimeError("the drill replays the 2020 AWS spot prices: set COSTOPT_DATA_DIR to the shared data")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("COSTOPT_")},
        "COSTOPT_DATABASE_URL": url,
        "COSTOPT_DATA_DIR": str(base.data_dir),
        "COSTOPT_SEED_ON_START": "false",
        "COSTOPT_COLLECTORS_ENABLED": "false",
        "COSTOPT_PROVIDER": "sim",
        "COSTOPT_SIM_START": START.isoformat(),
        "COSTOPT_SIM_STATE_FILE": str(folder / "sim-cloud.state"),
        "COSTOPT_REBALANCE_CRON": "*/15 * * * *",
        "COSTOPT_CHECKPOINT_ROOT": f"file://{folder / 'checkpoints'}",
        "COSTOPT_RATE_LIMIT_PER_S": "0",
    }
    settings = Settings(database_url=url, data_dir=base.data_dir)
    store = build_store(settings)
    try:
        seed_catalog(store, settings)
        prices = base.data_dir / "prices" / AWS_SPOT_FILE
        if schedule:  # a copy of the replayed prices with the drill's price steps
            stepped = folder / f"stepped-{AWS_SPOT_FILE}"
            write_prices(_read_prices(prices), schedule, stepped)
            prices = stepped
        reports = import_paths(store, [prices])
        bad = [r for r in reports if r.status in ("failed", "refused")]
        if bad:
            raise RuntimeError(f"the replayed AWS spot prices did not import: {bad}")
        teams = TeamRepository(store.engine)
        team = teams.create_team("kill-drill")
        key = teams.create_key(team.id, Role.MEMBER).secret
    finally:
        store.engine.dispose()
    return env, key


_PREPARE_LOCK = threading.Lock()


def _saved_cloud(path: Path) -> Any:
    """The simulated cloud as its state file holds it (read only: nothing is written back)."""
    with open(path, "rb") as f:
        return pickle.load(f)  # the run's own state file


def run(
    *,
    jobs: int,
    kills: int,
    seed: int,
    time_scale: float,
    up: tuple[float, float],
    steps: tuple[int, int],
    folder: Path,
    database_url: str | None = None,
    data_dir: Path | None = None,
    timeout_s: float = 2400.0,
    fleet_jobs: int = 0,
    schedule: list[PriceStep] | None = None,
    spot_hazard: float | None = None,
    clock: str = "stepped",
    step_s: float = 30.0,
    say: Any = print,
) -> RunResult:
    """One run (module docstring) in ``folder``; ``kills`` 0: the baseline. ``schedule``: the price steps
    written into the replayed prices; ``spot_hazard``: reclaims per hour of every spot offer of the simulated
    cloud (None: the hazard model's from the availability logs). The simulated cloud is seeded with ``seed``.
    ``clock``: ``stepped`` (lockstep, ``step_s`` simulated seconds a step) or ``wall`` (``time_scale``)."""
    import httpx

    from costopt.agent import control
    from costopt.cloud import InstanceState

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    sizes = [rng.randrange(steps[0], steps[1] + 1, 1000) for _ in range(jobs)]
    ups = [rng.uniform(*up) for _ in range(kills)]
    with _PREPARE_LOCK:  # alembic's migration context is global: one run's database at a time (--parallel)
        env, key = _prepare(folder, database_url, data_dir, schedule)
    env["COSTOPT_SIM_SEED"] = str(seed)
    if spot_hazard is not None:
        env["COSTOPT_SIM_SPOT_HAZARD_PER_HOUR"] = str(spot_hazard)
    env["COSTOPT_SIM_TIME_SCALE"] = str(time_scale)
    env["COSTOPT_SIM_TICK"] = "PT0.25S"
    env["COSTOPT_SIM_CLOCK"] = clock
    env["COSTOPT_SIM_STEP"] = f"PT{step_s:g}S"
    env["PYTHONHASHSEED"] = "0"  # the same iteration order of sets of strings in every run's service
    # the same job ids in every run (the service orders work by them): derived from the seed, team and key
    env["COSTOPT_JOB_ID_SEED"] = f"kill-drill-{seed}"
    port = _free_port()
    service = Service(folder, env, port)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"}, timeout=60)
    res = RunResult(jobs=jobs)
    t0 = time.monotonic()
    try:
        # The submissions on a clock stopped (stepped: 1e-12x, it does not move a microsecond) or at 1x (wall),
        # then a clean restart with the run's clock: every run submits at START exactly however long the posts
        # take, and the service orders the jobs (created at the same time) by their seeded ids, the same in
        # every run. (At 0.001x, as before, the clock moved 250 us at each of its ticks: which posts shared a
        # tick, and so the engine's order, followed the wall time the posts took.)
        submit_scale = "1e-12" if clock == "stepped" else "1"
        # No background work while the posts arrive (the engine's tick, the fleet's rounds): what it would start
        # then, and in what order, would depend on the wall time the posts take; it all starts on the run's clock.
        service.env = {
            **env,
            "COSTOPT_SIM_CLOCK": "wall",
            "COSTOPT_SIM_TIME_SCALE": submit_scale,
            "COSTOPT_MIGRATION_JOBS_ENABLED": "false",
            "COSTOPT_FLEET_EXECUTOR_ENABLED": "false",
        }
        service.start()
        fleet_id = None
        if fleet_jobs:
            r = client.post("/v1/fleets", json=FLEET, headers={"Idempotency-Key": "fleet"})
            if r.status_code not in (200, 201):
                raise RuntimeError(f"the fleet's lease answered {r.status_code}: {r.text}")
            fleet_id = str(r.json()["id"])
        ids = []
        for i, n in enumerate(sizes):
            body: dict[str, Any] = {**BODY, "name": f"k{i}", "steps": n}
            if i < fleet_jobs:  # a fleet job: no constraints (the fleet's instances), a fraction of the steps
                body = {**FLEET_JOB, "name": f"f{i}", "steps": max(1000, n // 8), "fleet_id": fleet_id}
            r = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": f"k{i}"})
            if r.status_code not in (200, 201):
                raise RuntimeError(f"submission {i} answered {r.status_code}: {r.text}")
            ids.append(r.json()["id"])
        service.stop()
        submitted = _saved_cloud(Path(env["COSTOPT_SIM_STATE_FILE"])).now()
        service.env = env
        service.start()
        pace = f"in lockstep, {step_s:g} s a step" if clock == "stepped" else f"at {time_scale:g}x"
        say(f"  submitted by {submitted:%H:%M:%S.%f} simulated; the clock now runs {pace}")

        def docs() -> list[dict[str, Any]]:
            for attempt in range(10):  # a loaded machine may answer slowly: retry rather than give up
                try:
                    listed = client.get("/v1/jobs", params={"limit": 500}).json()["items"]
                    return [d for d in listed if d["id"] in set(ids)]
                except httpx.TransportError:
                    if attempt == 9:
                        raise
                    time.sleep(1.0)
            raise AssertionError("unreachable")

        for k, wait in enumerate(ups):
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                time.sleep(0.05)
            if all(d["state"] in TERMINAL for d in docs()):
                say(f"  every job ended after {k} kills: no more kills")
                break
            t_kill = time.monotonic()
            service.kill()
            res.kills += 1
            t_read = time.monotonic()
            killed_at = _saved_cloud(Path(env["COSTOPT_SIM_STATE_FILE"])).now()  # the clock as the kill left it
            read_s = time.monotonic() - t_read  # the drill's own read: not part of the restart measured
            res.kills_at.append(killed_at)
            service.start()
            res.restarts_s.append(time.monotonic() - t_kill - read_s)
            say(
                f"  kill {res.kills}/{kills} after {wait:.2f} s up, at {killed_at:%H:%M:%S} simulated; ready again in "
                f"{res.restarts_s[-1]:.2f} s"
            )
        while True:
            current = docs()
            if len(current) == jobs and all(d["state"] in TERMINAL for d in current):
                break
            if time.monotonic() - t0 > timeout_s:
                left = [(d["name"], d["state"]) for d in current if d["state"] not in TERMINAL]
                raise RuntimeError(f"the jobs did not end within {timeout_s:.0f} s: {left}")
            time.sleep(0.2)
        final = [client.get(f"/v1/jobs/{i}").json() for i in ids]
        if fleet_id is not None:
            r = client.post(f"/v1/fleets/{fleet_id}/release")
            if r.status_code != 202:
                raise RuntimeError(f"the fleet's release answered {r.status_code}: {r.text}")
            while True:  # every instance ends, every round is billed
                fleet = client.get(f"/v1/fleets/{fleet_id}").json()
                if all(i["state"] in ("released", "lost") for i in fleet["instances"]):
                    break
                if time.monotonic() - t0 > timeout_s:
                    raise RuntimeError(f"the fleet's instances did not end: {fleet['instances']}")
                time.sleep(0.2)
            time.sleep(2.0)  # the executor's next pass bills what ended
            fleet = client.get(f"/v1/fleets/{fleet_id}").json()
            res.fleet_usd = Decimal(fleet["cost_so_far_usd"] or "0")
            res.fleet_idle_usd = Decimal(fleet["idle_cost_usd"] or "0")
        time.sleep(1.0)  # the engine's next tick: instances of finished copies terminated
    finally:
        client.close()
        service.stop()
    res.wall_s = time.monotonic() - t0
    for d in final:
        if d["state"] == "succeeded":
            res.succeeded += 1
        else:
            res.problems.append(f"{d['name']}: {d['state']} ({d['reason']})")
            continue
        audit = control.audit_job(d["checkpoint_uri"], d["steps_total"])
        if audit.ok and audit.steps_done == d["steps_total"] == d["steps_done"]:
            res.exact += 1
        else:
            res.problems.append(f"{d['name']}: audit {audit.steps_done}/{d['steps_total']} {audit.problems}")
        res.total_usd += Decimal(d["cost_so_far_usd"] or "0")
        if d.get("fleet_id"):
            res.fleet_jobs_usd += Decimal(d["cost_so_far_usd"] or "0")
        for m in d["moves"]:
            kind = m["kind"]
            res.moves += kind == "move"
            res.preemptions += kind == "preemption"
            res.recoveries += kind == "recovery"
        prices = [(d.get("quote") or {}).get("usd_per_hour"), (d.get("placement") or {}).get("usd_per_hour")]
        res.max_usd_per_hour = max([res.max_usd_per_hour, *(p for p in prices if p)])
    cloud = _saved_cloud(Path(env["COSTOPT_SIM_STATE_FILE"]))
    everything = cloud.list({})
    res.instances = len(cloud._instances)
    res.orphans = [i.instance_id for i in everything if i.state in (InstanceState.PENDING, InstanceState.RUNNING)]
    res.sim_hours = (cloud.now() - START).total_seconds() / 3600
    res.state_saves = cloud.saves
    return res


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def main(argv: list[str] | None = None) -> int:
    from costopt.settings import Settings

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=50)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--clock",
        choices=("stepped", "wall"),
        default="stepped",
        help="the service's simulated clock: stepped (lockstep with its work: runs of one seed are the same) or "
        "wall (wall time x --time-scale)",
    )
    p.add_argument("--step", type=float, default=30.0, help="--clock stepped: simulated s a step (default 30)")
    p.add_argument(
        "--time-scale", type=float, default=3600.0, help="--clock wall: simulated s per wall s (default 3600)"
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="wall s a run may take (default 3600)")
    p.add_argument("--up-min", type=float, default=1.0, help="shortest up-time between kills (wall s)")
    p.add_argument("--up-max", type=float, default=4.0, help="longest up-time between kills (wall s)")
    p.add_argument("--steps-min", type=int, default=100_000)
    p.add_argument("--steps-max", type=int, default=400_000)
    p.add_argument("--fleet-jobs", type=int, default=0, help="jobs (of --jobs) submitted into a leased sim fleet")
    p.add_argument(
        "--price-steps",
        type=int,
        default=2,
        help="price steps written into the replayed prices, so that moves pay (0: the replayed prices as they are)",
    )
    p.add_argument(
        "--price-step-every",
        type=float,
        default=3.0,
        help="step i comes at i x this many simulated hours after the start, plus 0-1 h drawn from --seed",
    )
    p.add_argument(
        "--price-factor", type=float, default=3.0, help="the stepped prices: this times the replayed (default 3)"
    )
    p.add_argument(
        "--spot-hazard",
        type=float,
        default=0.15,
        help="reclaims per simulated hour of each spot offer, drawn from --seed (0: none; negative: the hazard "
        "model's rates from the availability logs)",
    )
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True, help="also run without kills")
    p.add_argument(
        "--baselines",
        type=int,
        default=1,
        help="runs without kills (same jobs, same seed): their spread is the comparison's own noise (default 1)",
    )
    p.add_argument(
        "--parallel",
        action="store_true",
        help="run the killed run and the baselines at once (--clock stepped: a run does not depend on the load)",
    )
    p.add_argument("--database-url", default=None, help="default: a SQLite file in the run's folder")
    p.add_argument("--folder", type=Path, default=None, help="default: a temporary folder")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    folder = a.folder or Path(tempfile.mkdtemp(prefix="costopt-kill-drill-"))
    schedule = []
    if a.price_steps > 0:
        data = Settings().data_dir
        if data is None:
            p.error("the price steps rewrite the replayed AWS spot prices: set COSTOPT_DATA_DIR to the shared data")
        price_rows = _read_prices(data / "prices" / AWS_SPOT_FILE)
        schedule = price_schedule(
            price_rows, seed=a.seed, steps=a.price_steps, every_h=a.price_step_every, factor=a.price_factor
        )
    common = {
        "jobs": a.jobs,
        "seed": a.seed,
        "time_scale": a.time_scale,
        "up": (a.up_min, a.up_max),
        "steps": (a.steps_min, a.steps_max),
        "fleet_jobs": a.fleet_jobs,
        "schedule": schedule,
        "spot_hazard": None if a.spot_hazard < 0 else a.spot_hazard,
        "clock": a.clock,
        "step_s": a.step,
        "timeout_s": a.timeout,
    }
    load0 = os.getloadavg()
    cpu0 = os.times()
    pace = f"stepped clock, {a.step:g} s a step" if a.clock == "stepped" else f"wall clock, {a.time_scale:g}x"
    print(f"kill drill in {folder}: {a.jobs} jobs, {a.kills} kills, seed {a.seed}, {pace}")
    hazard = "the hazard model's" if a.spot_hazard < 0 else f"{a.spot_hazard:g} per offer-hour"
    print(f"  spot reclaims: {hazard}; price steps (x{a.price_factor:g} outside the spared zone):")
    for step in schedule:
        print(
            f"    {step.at:%Y-%m-%d %H:%M:%S} (+{(step.at - START).total_seconds() / 3600:.2f} h): {step.spared} spared"
        )
    n_bases = a.baselines if a.baseline else 0
    base_folders = [folder / ("baseline" if b == 0 else f"baseline-{b + 1}") for b in range(n_bases)]
    bases: list[RunResult] = []
    if a.parallel:  # each run in its own service process, at once (the stepped clock does not see the load)
        from concurrent.futures import ThreadPoolExecutor

        def tagged(tag: str) -> Any:
            return lambda *m: print(f"[{tag}]", *m, flush=True)

        with ThreadPoolExecutor(1 + n_bases) as pool:
            killed_f = pool.submit(
                run,
                kills=a.kills,
                folder=folder / "killed",
                database_url=a.database_url,
                say=tagged("killed"),
                **common,
            )
            base_fs = [
                pool.submit(run, kills=0, folder=f, say=tagged(f"baseline {b + 1}"), **common)
                for b, f in enumerate(base_folders)
            ]
            killed = killed_f.result()
            bases = [f.result() for f in base_fs]
    else:
        killed = run(kills=a.kills, folder=folder / "killed", database_url=a.database_url, **common)
        for b, f in enumerate(base_folders):
            print(f"baseline {b + 1}/{a.baselines} (no kill):")
            bases.append(run(kills=0, folder=f, **common))
    base = bases[0] if bases else None
    cpu1 = os.times()
    tolerance = Decimal(str(round(killed.kills * BOOT.total_seconds() / 3600 * killed.max_usd_per_hour, 6)))
    diff = None if base is None else killed.total_usd - base.total_usd
    # The baselines' own spread (same jobs, same seed, no kill): none with the stepped clock (checked); on the
    # wall clock two runs launch at different simulated times and pay different replayed prices. With several
    # baselines the killed run is compared with their range widened by the tolerance; with one, with that one.
    low = min((r.total_usd for r in bases), default=None)
    high = max((r.total_usd for r in bases), default=None)
    within = low is None or high is None or low - tolerance <= killed.total_usd <= high + tolerance
    checks = {
        "every job succeeded": killed.succeeded == a.jobs,
        "exactly its steps (audit)": killed.exact == a.jobs,
        "zero orphaned instances": not killed.orphans,
        "ledger within a boot interval per kill": within,
    }
    if a.clock == "stepped" and len(bases) > 1:  # lockstep: runs without kills are the same run
        checks["baselines equal (stepped clock)"] = low == high
    if schedule and a.spot_hazard != 0:  # the run has migrations and preemptions: shown, not assumed
        checks["moves and preemptions happened"] = killed.moves > 0 and killed.preemptions > 0
    rows = [("figure", "killed run", "baseline", "check")]

    def row(name: str, f: Any, check: str = "") -> None:
        rows.append((name, str(f(killed)), "-" if base is None else str(f(base)), check))

    row("kills (SIGKILL, restarted)", lambda r: r.kills)
    row(
        "restart to /readyz 200, mean s",
        lambda r: f"{sum(r.restarts_s) / len(r.restarts_s):.2f}" if r.restarts_s else "-",
    )
    row("jobs succeeded", lambda r: f"{r.succeeded}/{r.jobs}", "pass" if checks["every job succeeded"] else "FAIL")
    row(
        "exact steps (audit)",
        lambda r: f"{r.exact}/{r.jobs}",
        "pass" if checks["exactly its steps (audit)"] else "FAIL",
    )
    row("orphaned instances", lambda r: len(r.orphans), "pass" if checks["zero orphaned instances"] else "FAIL")
    row("instances launched", lambda r: r.instances)
    row(
        "moves / preemptions / recoveries",
        lambda r: f"{r.moves} / {r.preemptions} / {r.recoveries}",
        ("pass" if checks["moves and preemptions happened"] else "FAIL")
        if "moves and preemptions happened" in checks
        else "",
    )
    if a.fleet_jobs:
        row("fleet cost USD (its jobs + idle)", lambda r: f"{r.fleet_usd} (idle {r.fleet_idle_usd})")
    if a.fleet_jobs:
        row(
            "ledger USD: jobs on their own / fleet jobs",
            lambda r: f"{r.total_usd - r.fleet_jobs_usd} / {r.fleet_jobs_usd}",
        )
    row(
        "ledger total USD",
        lambda r: r.total_usd,
        "pass" if checks["ledger within a boot interval per kill"] else "FAIL",
    )
    if diff is not None:
        rows.append(("ledger difference USD (tolerance)", f"{diff:+} ({tolerance})", "", ""))
    if len(bases) > 1 and low is not None and high is not None:
        totals = ", ".join(str(r.total_usd) for r in bases)
        same = checks.get("baselines equal (stepped clock)")
        rows.append(
            (
                "baselines' ledger totals USD",
                "-",
                totals,
                f"spread {high - low}" + ("" if same is None else " pass" if same else " FAIL"),
            )
        )
    row("simulated hours", lambda r: f"{r.sim_hours:.1f}")
    row("sim state files written", lambda r: r.state_saves)
    row("wall s", lambda r: f"{r.wall_s:.0f}")
    print(_table(rows))
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system) + (cpu1.children_user - cpu0.children_user)
    cpu += cpu1.children_system - cpu0.children_system
    print(f"CPU s (drill + servers): {cpu:.0f}; load average at start {load0[0]:.1f}, at end {os.getloadavg()[0]:.1f}")
    for pr in killed.problems:
        print("  problem:", pr)
    if killed.orphans:
        print("  orphans:", killed.orphans)
    if a.json:
        print(
            json.dumps(
                {
                    "checks": checks,
                    "killed": killed.__dict__,
                    "baseline": base and base.__dict__,
                    "baselines": [r.__dict__ for r in bases],
                },
                default=str,
            )
        )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

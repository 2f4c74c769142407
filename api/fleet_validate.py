"""``costopt gavel validate``: Gavel's physical-versus-simulated check on this machine.

For each policy, a fleet of local instances labelled K80, P100 and V100 (the local provider runs each as a
worker process, :mod:`costopt.agent.worker`) is leased from a live service (this module starts the real
app, :func:`api.app.create_app`, with uvicorn on a loopback port, a SQLite database of its own and the
round executor on), and a trace of jobs is submitted to it over REST at their arrival times. Each job is
a real process of ``examples/train.py --pace``: its step time on each label follows Gavel's measured
throughputs for its job type, scaled per job so that it runs ``v100_steps_per_s`` steps/s on a V100 and
lasts tens of seconds there (the other labels keep the catalog's speed ratios). Then the same trace (the
arrivals as they were submitted, relative to the first round), cluster and round length go through
:func:`costopt.gavel.simulator.simulate_trace`.

Measured per policy (:class:`PolicyValidation`): average JCT and makespan, live and simulated; the steps
lost and repeated over every job (the agents' own progress logs, :func:`costopt.agent.control.audit_job`);
the round overhead (for every copy a round started, the time from the round's start until its first step
began; continuing leases have none). Durations of the trace: the generator's V100 durations (log-uniform
over Gavel's range) mapped log-linearly onto ``[min_s, max_s]``; arrivals Poisson with ``mean_gap_s``.

Prices of the labels (GCP's 2020 on-demand price of one GPU, the simulator's) are written into the
run's own store for the offers used; they matter to the cost policies and the ledger only.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from costopt.domain import Cloud, Market, OfferKey, PricePoint
from costopt.settings import PROJECT_ROOT, Settings

log = logging.getLogger("costopt.validate")

__all__ = [
    "DEFAULT_POLICIES",
    "LiveJob",
    "LiveService",
    "PolicyValidation",
    "ValidationSetup",
    "build_jobs",
    "validate",
]

DEFAULT_POLICIES = ("max_min_fairness", "max_min_fairness_perf", "finish_time_fairness_perf")
LABELS = ("k80", "p100", "v100")
OFFERS = {
    label: OfferKey(Cloud.GCP, "us-central1", "", f"n1-standard-8+{label}x1", Market.ON_DEMAND) for label in LABELS
}
TRAIN_SCRIPT = PROJECT_ROOT / "examples" / "train.py"


@dataclass(frozen=True, slots=True)
class ValidationSetup:
    """The experiment: ``jobs`` jobs of seed ``seed``, ``per_label`` one-GPU instances of each label,
    rounds of ``round_s`` seconds; live durations on a V100 within ``[min_s, max_s]``; mean gap between
    arrivals ``mean_gap_s``; the executor's tick and the workers' poll; ``timeout_s`` per policy."""

    jobs: int = 24
    policies: tuple[str, ...] = DEFAULT_POLICIES
    seed: int = 0
    round_s: float = 6.0
    per_label: int = 2
    v100_steps_per_s: float = 20.0
    min_s: float = 12.0
    max_s: float = 60.0
    mean_gap_s: float = 5.0
    tick_s: float = 0.25
    poll_s: float = 0.1
    checkpoints_per_job: int = 8
    timeout_s: float = 1800.0
    dead_after_s: float = 10.0

    def __post_init__(self) -> None:
        if self.jobs < 1 or self.per_label < 1 or not self.policies:
            raise ValueError("need at least one job, one instance per label and one policy")
        if not (0 < self.min_s <= self.max_s) or self.round_s <= 0 or self.mean_gap_s <= 0:
            raise ValueError("need 0 < min_s <= max_s, round_s > 0 and mean_gap_s > 0")


@dataclass(frozen=True, slots=True)
class LiveJob:
    """One job of the trace: its catalog type, arrival (seconds after the first), steps and steps/s on
    each label."""

    name: str
    job_type: str
    arrival_s: float
    steps: int
    rates: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class PolicyValidation:
    """One policy, live and simulated (seconds; steps counted over every job)."""

    policy: str
    live_avg_jct_s: float
    sim_avg_jct_s: float
    live_makespan_s: float
    sim_makespan_s: float
    lost_steps: int
    repeated_steps: int
    round_overhead_s: float
    jct_error: float
    makespan_error: float
    sim_restart_overhead_s: float
    sim_start_overhead_s: float
    sim0_avg_jct_s: float
    sim0_makespan_s: float
    first_start_s: float
    jobs: int
    jobs_done: int
    rounds: int
    new_copies: int
    round_overhead_p95_s: float
    wasted_steps: int
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_jobs(setup: ValidationSetup, throughput_file: Path) -> list[LiveJob]:
    """The trace (see the module docstring): job types and arrivals from Gavel's generator."""
    import numpy as np

    from costopt.gavel.trace import LONG_LOG10_MINUTES, SHORT_LOG10_MINUTES, generate_trace
    from costopt.gavel.workload import load_workload

    workload = load_workload(throughput_file, LABELS)
    trace = generate_trace(workload, setup.jobs, rate_per_hour=3600.0 / setup.mean_gap_s, seed=setup.seed)
    lo = math.log10(60.0) + SHORT_LOG10_MINUTES[0]
    hi = math.log10(60.0) + LONG_LOG10_MINUTES[1]
    frac = np.clip((np.log10(trace.duration_s) - lo) / (hi - lo), 0.0, 1.0)
    live_s = setup.min_s * (setup.max_s / setup.min_s) ** frac
    v100 = LABELS.index("v100")
    out = []
    for i in range(trace.n_jobs):
        e = int(trace.entry[i])
        cons = workload.consolidated[e]
        rates = {t: setup.v100_steps_per_s * float(cons[k]) / float(cons[v100]) for k, t in enumerate(LABELS)}
        out.append(
            LiveJob(
                name=f"j{i:03d}",
                job_type=workload.job_type_name(e),
                arrival_s=float(trace.arrival_s[i]),
                steps=max(1, round(float(live_s[i]) * setup.v100_steps_per_s)),
                rates=rates,
            )
        )
    return out


# -- the live side ---------------------------------------------------------------------------------------


@dataclass
class _LiveRun:
    arrivals: list[float]  # seconds after the first round's start
    done_at: list[float | None]  # seconds after the first round's start
    lost: int
    repeated: int
    wasted: int
    rounds: int
    overheads: list[float] = field(default_factory=list)  # moves
    first_starts: list[float] = field(default_factory=list)
    wall_s: float = 0.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _settings(folder: Path, port: int, setup: ValidationSetup, base: Settings) -> Settings:
    return Settings(
        database_url=f"sqlite:///{folder / 'costopt.db'}",
        data_dir=base.data_dir,
        throughput_file=base.throughput_file,
        seed_on_start=False,
        collectors_enabled=False,
        migration_jobs_enabled=False,
        fleet_executor_enabled=True,
        fleet_tick=setup.tick_s,
        fleet_worker_poll=setup.poll_s,
        fleet_dead_after=setup.dead_after_s,
        fleet_restart_overhead=base.fleet_restart_overhead,
        provider="local",
        providers=[],
        local_provider_dir=folder / "local",
        checkpoint_root=f"file://{folder / 'checkpoints'}",
        service_url=f"http://127.0.0.1:{port}",
        clock="live",
    )


def _prepare_store(settings: Settings) -> str:
    """Migrate and seed the run's store (instance types, the labels' prices); returns an admin key, its team
    allowed the local provider."""
    from api.wiring import build_store, seed_catalog
    from costopt.gavel.simulator import DEFAULT_PRICES_USD_PER_H
    from costopt.jobs.teams import TeamRepository

    store = build_store(settings)
    try:
        seed_catalog(store, settings)
        since = datetime(2020, 1, 1, tzinfo=UTC)
        store.write(
            [
                PricePoint(OFFERS[t], since, DEFAULT_PRICES_USD_PER_H[t], "validate", observed_at=datetime.now(UTC))
                for t in LABELS
            ]
        )
        teams = TeamRepository(store.engine)
        issued = teams.bootstrap_admin()
        if issued is None:  # pragma: no cover - a fresh database has no admin key
            raise RuntimeError("the run's database already has an admin key")
        # the run's fleet is of local workers: the service's own host, enabled for the run's team (api/tenancy.py)
        teams.set_policy(issued.key.team_id, replace(teams.policy(issued.key.team_id), allow_local_provider=True))
        return issued.secret
    finally:
        store.engine.dispose()


class _Server:
    """The service (``create_app``) under uvicorn on a loopback port, in a thread."""

    def __init__(self, settings: Settings, port: int) -> None:
        import uvicorn

        from api.app import create_app

        self.app = create_app(settings)
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
        )
        self.thread = threading.Thread(target=self.server.run, name="costopt-validate-api", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the service did not start within 60 s")
            time.sleep(0.05)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


class LiveService:
    """The service running (:class:`_Server`), a REST client holding an admin key, and the run's settings
    (its database, local provider and checkpoints under ``folder``). Use it as a context manager: every
    local instance left is terminated when it ends."""

    def __init__(self, folder: Path, setup: ValidationSetup, base: Settings) -> None:
        from api.client import ApiClient

        folder.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.folder = folder
        self.setup = setup
        self.settings = _settings(folder, port, setup, base)
        key = _prepare_store(self.settings)
        self.server = _Server(self.settings, port)
        # the CLI's client: it sends a request again on a new connection when a pooled one was closed by
        # the server as it went out (submissions carry an Idempotency-Key, so none is made twice)
        self.client = ApiClient(f"http://127.0.0.1:{port}", key, timeout_s=60)

    def __enter__(self) -> LiveService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self.server.close()
        _kill_leftovers(self.settings)

    def lease(self, policy: str, counts: Mapping[str, int], *, timeout_s: float = 120.0) -> str:
        """A fleet of ``counts`` one-GPU instances per label under ``policy``; returns once every worker
        synced (its GPUs count)."""
        body = {
            "name": f"validate-{policy}",
            "policy": policy,
            "round_s": self.setup.round_s,
            "resolve_every_rounds": 100_000,
            "instances": [{"offer": OFFERS[t].to_doc(), "count": n} for t, n in counts.items() if n],
        }
        fleet_id = str(self.client.request("POST", "/v1/fleets", json=body)["id"])
        want = {t: n for t, n in counts.items() if n}
        deadline = time.monotonic() + timeout_s
        while self.fleet(fleet_id)["gpus"] != want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fleet's workers did not all start within {timeout_s:.0f} s")
            time.sleep(0.2)
        return fleet_id

    def fleet(self, fleet_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = self.client.request("GET", f"/v1/fleets/{fleet_id}")
        return doc

    def submit(self, job: LiveJob, fleet_id: str) -> str:
        """Submit ``job`` into the fleet: ``examples/train.py --pace``, a checkpoint every
        ``steps / checkpoints_per_job`` steps."""
        every = max(1, job.steps // self.setup.checkpoints_per_job)
        command = [
            sys.executable,
            str(TRAIN_SCRIPT),
            "--steps",
            str(job.steps),
            "--pace",
            "--checkpoint-every",
            str(every),
            "--log-level",
            "WARNING",
        ]
        doc = self.client.request(
            "POST",
            "/v1/jobs",
            json={
                "name": job.name,
                "throughput": dict(job.rates),
                "steps": job.steps,
                "command": command,
                "fleet_id": fleet_id,
            },
            headers={"Idempotency-Key": f"{fleet_id}-{job.name}"},
        )
        return str(doc["id"])

    def wait(self, fleet_id: str, n: int, timeout_s: float, progress: Callable[[str], None] = lambda _: None) -> int:
        """Wait until ``n`` jobs of the fleet finished (or ``timeout_s``); returns how many did."""
        deadline = time.monotonic() + timeout_s
        last = -1
        while True:
            doc = self.fleet(fleet_id)
            done = sum(1 for j in doc["jobs"] if j["status"] in ("done", "failed", "cancelled"))
            if done != last:
                progress(f"{done}/{n} jobs finished, round {doc['round']['number'] if doc['round'] else 0}")
                last = done
            if done >= n or time.monotonic() > deadline:
                return done
            time.sleep(0.5)

    def release(self, fleet_id: str, timeout_s: float = 60.0) -> bool:
        """Release the fleet and wait until every instance is released (terminated and billed to its end:
        the fleet's bill is final) or lost; False after ``timeout_s``."""
        self.client.request("POST", f"/v1/fleets/{fleet_id}/release")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if {i["state"] for i in self.fleet(fleet_id)["instances"]} <= {"released", "lost"}:
                return True
            time.sleep(0.5)
        return False


def _run_live(
    policy: str,
    jobs: Sequence[LiveJob],
    setup: ValidationSetup,
    folder: Path,
    base: Settings,
    progress: Callable[[str], None],
) -> _LiveRun:
    from costopt.agent import control
    from costopt.db.engine import make_engine
    from costopt.fleets.store import FleetRepository
    from costopt.jobs.records import JobRepository

    wall0 = time.monotonic()
    with LiveService(folder, setup, base) as svc:
        fleet_id = svc.lease(policy, dict.fromkeys(LABELS, setup.per_label))
        progress(f"{policy}: fleet {fleet_id} up ({setup.per_label * len(LABELS)} GPUs); submitting {len(jobs)} jobs")
        t0 = time.time()
        ids: list[str] = []
        for job in jobs:
            time.sleep(max(0.0, t0 + job.arrival_s - time.time()))
            ids.append(svc.submit(job, fleet_id))
        done = svc.wait(fleet_id, len(jobs), setup.timeout_s, lambda m: progress(f"{policy}: {m}"))
        if done < len(jobs):
            progress(f"{policy}: timed out after {setup.timeout_s:.0f} s with {done}/{len(jobs)} jobs finished")
        if not svc.release(fleet_id):
            progress(f"{policy}: the fleet's instances were not all released (billed to their end) within 60 s")
        url = svc.settings.database_url
    engine = make_engine(url)
    try:
        repo = FleetRepository(engine)
        rounds = repo.rounds(fleet_id)
        records = JobRepository(engine)
        anchor = rounds[0].started_at if rounds else datetime.now(UTC)
        run = _LiveRun([], [], 0, 0, 0, len(rounds))
        by_id: dict[str, Any] = {}
        for job_id, job in zip(ids, jobs, strict=True):
            rec = records.get(job_id)
            uri = str(rec.spec["checkpoint_uri"])
            recs = control.records(uri)
            audit = control.audit_job(uri, job.steps)
            run.lost += audit.lost_steps
            run.repeated += audit.repeated_steps
            run.wasted += audit.wasted_steps
            run.arrivals.append(max(0.0, (rec.created_at - anchor).total_seconds()))
            done_t = [float(x["t"]) for x in recs if x.get("event") == "done"]
            run.done_at.append(min(done_t) - anchor.timestamp() if done_t and audit.finished else None)
            by_id[job_id] = (job, recs)
        run.overheads, run.first_starts = _overheads(rounds, by_id)
    finally:
        engine.dispose()
    run.wall_s = time.monotonic() - wall0
    return run


def _overheads(
    rounds: Sequence[Any], by_id: Mapping[str, tuple[LiveJob, list[dict[str, Any]]]]
) -> tuple[list[float], list[float]]:
    """For every copy a round started, the time from the round's start until its first step began (its
    first step's end less one step at its rate): ``(moves, first starts)``. A move is a new copy of a job
    that ran before (its epoch differs from its lease's in the previous round); continuing leases have none."""
    moves: list[float] = []
    firsts: list[float] = []
    before: dict[str, int] = {}
    ran: set[str] = set()
    for rnd in rounds:
        now: dict[str, int] = {}
        for lease in rnd.assignment:
            now[lease.job_id] = lease.epoch
            if before.get(lease.job_id) == lease.epoch or lease.job_id not in by_id:
                continue
            job, recs = by_id[lease.job_id]
            steps = [float(x["t"]) for x in recs if x.get("event") == "step" and int(x.get("epoch", -1)) == lease.epoch]
            if steps:
                delay = min(steps) - 1.0 / job.rates[lease.wtype] - rnd.started_at.timestamp()
                (moves if lease.job_id in ran else firsts).append(delay)
            ran.add(lease.job_id)
        before = now
    return moves, firsts


def _kill_leftovers(settings: Settings) -> None:
    """Terminate any local instance still running (a run cut short)."""
    from providers.local import LocalProvider

    provider = LocalProvider(settings.local_provider_dir, grace_seconds=5)
    for inst in provider.list({}):
        if inst.state.value in ("pending", "running", "stopping"):
            provider.terminate(inst.instance_id)


# -- the simulated side ----------------------------------------------------------------------------------


def _simulate(
    policy: str,
    jobs: Sequence[LiveJob],
    arrivals: Sequence[float],
    setup: ValidationSetup,
    restart_overhead_s: float,
    fleet_overhead_s: float,
    start_overhead_s: float = 0.0,
) -> Any:
    """The trace simulated with ``restart_overhead_s`` charged per move and ``start_overhead_s`` in each
    job's first round, under the live fleet's rule (``fleet_overhead_s``: the restart overhead its executor
    was configured with)."""
    import numpy as np

    from costopt.gavel.mechanism import mechanism_rule
    from costopt.gavel.policies import get_policy
    from costopt.gavel.simulator import DEFAULT_PRICES_USD_PER_H, simulate_trace
    from costopt.gavel.trace import Trace
    from costopt.gavel.workload import Workload

    n = len(jobs)
    rates = np.array([[j.rates[t] for t in LABELS] for j in jobs])
    workload = Workload(
        names=tuple(j.name for j in jobs),
        scale_factor=np.ones(n, dtype=np.int64),
        worker_types=LABELS,
        consolidated=rates,
        spread=rates.copy(),
        pair=np.zeros((n, n, len(LABELS))),
    )
    steps = np.array([float(j.steps) for j in jobs])
    order = np.argsort(np.asarray(arrivals), kind="stable")
    trace = Trace(
        entry=order.astype(np.int64),
        scale_factor=np.ones(n, dtype=np.int64),
        arrival_s=np.asarray(arrivals, dtype=np.float64)[order],
        duration_s=steps[order] / rates[order, LABELS.index("v100")],
        steps=steps[order],
        slo_s=np.full(n, np.inf),
        job_id=order.astype(np.int64),
    )
    policy_obj = get_policy(policy)
    return simulate_trace(
        policy_obj,
        trace,
        workload,
        tuple([setup.per_label] * len(LABELS)),
        round_s=setup.round_s,
        gpus_per_server=1,
        prices=tuple(DEFAULT_PRICES_USD_PER_H[t] for t in LABELS),
        restart_overhead_s=min(max(restart_overhead_s, 0.0), setup.round_s / 2),
        start_overhead_s=min(max(start_overhead_s, 0.0), setup.round_s / 2),
        # the fleets' rule: the allocation integral for aware policies (the default) and the hysteresis of the
        # live fleet's configured restart overhead (COSTOPT_FLEET_RESTART_OVERHEAD), whatever the charge above
        hysteresis=mechanism_rule(policy_obj.heterogeneity_aware, fleet_overhead_s, setup.round_s).hysteresis,
    )


# -- both ------------------------------------------------------------------------------------------------


def validate(
    setup: ValidationSetup,
    *,
    settings: Settings | None = None,
    workdir: Path | None = None,
    sim_overhead_s: float | None = None,
    sim_start_s: float | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[PolicyValidation]:
    """Run every policy of ``setup`` live, then simulated (see the module docstring). ``workdir``: where
    the runs keep their databases, checkpoints and instances (default: a temporary folder, removed).
    ``sim_overhead_s``: the restart overhead the simulator charges a moved job (None: the mean measured live
    for the policy; the results also hold the simulation without any, ``sim0_*``). ``sim_start_s``: the
    seconds the simulator charges a job's first round (None: the mean of the policy's live first starts,
    ``first_start_s``; 0 is Gavel's simulator, which charges none)."""
    import numpy as np

    from costopt.gavel.policies import POLICIES

    base = settings or Settings()
    path = base.resolved_throughput_file()
    if path is None or not path.is_file():
        raise FileNotFoundError("Gavel's measured throughputs are needed: set COSTOPT_DATA_DIR (../shared/data)")
    policies = [POLICIES.canonical(p) for p in setup.policies]
    jobs = build_jobs(setup, path)
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix="costopt-validate-")) if workdir is None else workdir
    out: list[PolicyValidation] = []
    try:
        for policy in policies:
            live = _run_live(policy, jobs, setup, root / policy, base, progress)
            moved = float(np.mean(live.overheads)) if live.overheads else 0.0
            charged = moved if sim_overhead_s is None else sim_overhead_s
            fleet_overhead = base.fleet_restart_overhead
            firsts = np.asarray(live.first_starts) if live.first_starts else np.zeros(1)
            start_charged = float(firsts.mean()) if sim_start_s is None else sim_start_s
            sim = _simulate(policy, jobs, live.arrivals, setup, charged, fleet_overhead, start_charged)
            sim0 = _simulate(policy, jobs, live.arrivals, setup, 0.0, fleet_overhead)
            finished = [(a, d) for a, d in zip(live.arrivals, live.done_at, strict=True) if d is not None]
            jct = [d - a for a, d in finished]
            live_jct = float(np.mean(jct)) if jct else math.nan
            live_makespan = max(d for _, d in finished) - min(live.arrivals) if finished else math.nan
            over = np.asarray(live.overheads) if live.overheads else np.zeros(1)
            result = PolicyValidation(
                policy=policy,
                live_avg_jct_s=round(live_jct, 3),
                sim_avg_jct_s=round(sim.avg_jct_s, 3),
                live_makespan_s=round(live_makespan, 3),
                sim_makespan_s=round(sim.makespan_s, 3),
                lost_steps=live.lost,
                repeated_steps=live.repeated,
                round_overhead_s=round(float(over.mean()), 3),
                jct_error=round(live_jct / sim.avg_jct_s - 1.0, 4),
                makespan_error=round(live_makespan / sim.makespan_s - 1.0, 4),
                sim_restart_overhead_s=round(charged, 3),
                sim_start_overhead_s=round(start_charged, 3),
                sim0_avg_jct_s=round(sim0.avg_jct_s, 3),
                sim0_makespan_s=round(sim0.makespan_s, 3),
                first_start_s=round(float(firsts.mean()), 3),
                jobs=len(jobs),
                jobs_done=len(finished),
                rounds=live.rounds,
                new_copies=len(live.overheads),
                round_overhead_p95_s=round(float(np.percentile(over, 95)), 3),
                wasted_steps=live.wasted,
                wall_s=round(live.wall_s, 1),
            )
            progress(json.dumps(result.as_dict()))
            out.append(result)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    return out

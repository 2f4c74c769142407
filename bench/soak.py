"""Soak test of the job service (issue 14): mixed traffic over loopback for ``--minutes`` while the service's
background work runs, sampling the server processes' memory.

The real service (uvicorn, :func:`api.app.create_app`, started by :func:`bench.api_load.server`) runs with
its migration jobs (the job engine's tick, the rebalancer, the reconciler, the interruption watcher), the
fleets' round executor, the simulated cloud's clock (600x) and a price collector: the Azure Retail Prices
collector, pointed at a loopback page served by this script every ``--collect-every`` seconds (no real
cloud is ever called; the other collectors need credentials and stay off). The per-key rate limit is off
(``COSTOPT_RATE_LIMIT_PER_S=0``) as in bench/api_load.py: one key sends all the traffic on purpose.

The traffic, at ``--rate`` requests/s in all (``--concurrency`` in flight; when the service falls behind
the loop runs closed, as fast as it answers), drawn by weight:

- ``submit``: ``POST /v1/jobs`` (each its own ``Idempotency-Key``; one in ten into a fleet), at
  ``--submit-weight`` (default :data:`DEFAULT_SUBMIT_WEIGHT`) of the requests, the others in :data:`WEIGHTS`'
  proportions;
- ``get``: ``GET /v1/jobs/{id}`` of a random submitted job; ``events``: ``GET /v1/jobs/{id}/events``;
- ``list``: ``GET /v1/jobs?limit=50``; ``report``: ``GET /v1/reports/savings``;
- ``fleet_get``: ``GET /v1/fleets/{id}``; ``fleet_change``: a fleet leased, scaled (an instance added,
  one drained) or released, in turn (one change at a time: a scale never races a release).

The processes (``--workers``, 2 on PostgreSQL): one runs the background work and the embedded simulated
cloud, which lives in one process; the others are serving replicas on the same port (no engine, reconciler,
watcher, rebalancer, fleets' rounds or collector; :func:`bench.api_load.serve_with_replicas`). Runs A-J ran
the workers alike (``--split-sim``): each ran its own simulated cloud over the one database, so each engine,
reconciler and watcher took the other cloud's copies for lost, which made most of those runs' failed jobs.

``--private-job-work`` puts the job-work process on a port of its own, so that all the traffic goes to the
serving replicas (a worker tier beside an API tier); ``--max-rss-mb`` runs the replicas under
``api.replicas``' supervisor, which replaces a replica whose resident memory passed the limit
(``COSTOPT_WORKER_MAX_RSS_MB``), its replacement serving first. A request that meets a kept-alive connection
closed by a replica on its way out is sent again on a new one when repeating it is safe (GET, or a POST
with an ``Idempotency-Key``), and counted (``retried``).

Every answer must have its route's success status (anything else, or a failed connection, is an error).
The server tree's RSS (``/proc/<pid>/status``) and the load average are sampled every ``--sample-s``;
the table gives per-route throughput and p50/p99 latency (from send to answer: an open-loop schedule's
waiting is not counted), errors, the RSS at the end of the warm-up and at the end (growth in MB and %,
and the post-warm-up slope in MB/min), the server log's error lines and what the background work did.

    .venv/bin/python bench/soak.py                      # 10 minutes, PostgreSQL, 2 processes
    .venv/bin/python bench/soak.py --minutes 2 --json

Targets (issue 14): zero errors; memory flat after warm-up (here: growth <= 10% and <= 50 MB from the end
of the warm-up to the end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT_DIR = Path(__file__).resolve().parents[1]
if str(ROOT_DIR) not in sys.path:
    sys.path.insert(0, str(ROOT_DIR))

from bench.api_load import (  # noqa: E402 (after the path set-up)
    BODY,
    ROOT,
    HttpError,
    RawConnection,
    Server,
    _tree,
    database,
    free_port,
    http_request,
    percentile,
    prepare,
    run_async,
    server,
)

DEFAULT_STEPS = (2_000, 5_000, 10_000)
"""A submitted job's steps (``--steps``): at the simulated cloud's 600x, ~1.3 s, ~3.3 s and ~6.5 s of wall time
of ResNet-50 once launched (plus a 3-minute simulated boot, 0.3 s). Runs G, J and L-P's mix, the default
since session 11 (with :data:`DEFAULT_SUBMIT_WEIGHT`): the soak is to be a steady state, with a backlog the
engine works off. The earlier default, 20,000/50,000/200,000 steps at a 0.25 share of submissions
(``--steps 20000,50000,200000 --submit-weight 0.25``), asks 5 submissions/s of ~60 s of wall time each at
20 requests/s: ~300 jobs running at once at 600x, which the 2-core machine's one simulated cloud never ran,
so its runs (A-F, H, I) measured a growing queue, not a leak (docs/reliability.md "Soak")."""
DEFAULT_SUBMIT_WEIGHT = 0.05
"""The submissions' share of the requests by default (``--submit-weight``): ~1 job/s at 20 requests/s."""
RUNTIME_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "65536",
    "MALLOC_TRIM_THRESHOLD_": "131072",
    "ARROW_DEFAULT_MEMORY_POOL": "system",
}
"""The allocators' settings of the image (``Dockerfile``; docs/reliability.md "Soak"), given to the server
unless this script's own environment sets them."""
RSS_GROWTH_MAX_PCT = 10.0
RSS_GROWTH_MAX_MB = 50.0
WEIGHTS: dict[str, float] = {
    "submit": 0.25,
    "get": 0.30,
    "events": 0.08,
    "list": 0.10,
    "report": 0.10,
    "fleet_get": 0.09,
    "fleet_change": 0.08,
}
# leased by the planner (the cheapest priced offers at the simulated clock's time)
OFFER_FIELDS = ("cloud", "region", "zone", "instance_type", "market")
PLAN: dict[str, Any] = {"accelerators": {"v100": 1, "k80": 1}}
AZURE_PAGE = ROOT / "tests" / "fixtures" / "azure" / "retail_prices_page1.json"
IDLE_REOPEN_S = 4.0
LOG_ERROR_MARKERS = ("Traceback", " ERROR ", "ERROR:", "CRITICAL")


# -- the loopback price page ------------------------------------------------------------------------------


class FakeRetailPrices:
    """An Azure Retail Prices endpoint on 127.0.0.1 answering every GET with one page (no next page)."""

    def __init__(self) -> None:
        page = json.loads(AZURE_PAGE.read_text())
        page["NextPageLink"] = ""
        body = json.dumps(page).encode()
        self.hits = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/api/retail/prices"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeRetailPrices:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# -- memory -----------------------------------------------------------------------------------------------


def rss_mb(pid: int) -> dict[int, float]:
    """Resident memory (MB) of ``pid`` and each live descendant, from /proc/<pid>/status."""
    out: dict[int, float] = {}
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out[p] = int(line.split()[1]) / 1024
                    break
        except OSError:
            continue
    return out


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    largest_mb: float
    processes: int
    load_1m: float
    by_pid: dict[int, float] = field(default_factory=dict)
    job_states: dict[str, int] = field(default_factory=dict)
    """The jobs by state at the sample (the engine's backlog over time; empty when the read failed)."""


def growth(samples: list[Sample], warmup_s: float) -> dict[str, Any]:
    """RSS at the first sample at or after ``warmup_s`` and at the last sample: growth in MB and %, the
    least-squares slope (MB/min) over the samples from the warm-up's end on, and whether it is flat
    (growth <= RSS_GROWTH_MAX_PCT % and <= RSS_GROWTH_MAX_MB MB). None values when no sample is after the
    warm-up. Samples taken while a serving replica was being replaced (``--max-rss-mb``: the old and the new
    process both alive for the seconds the new one takes to start, so the tree counts one process more than
    usual) are left out of the growth and the slope (counted in ``replacing_samples``; the peak keeps them)."""
    after = [s for s in samples if s.t_s >= warmup_s]
    usual = Counter(s.processes for s in after).most_common(1)[0][0] if after else 0
    replacing = [s for s in after if s.processes > usual]
    after = [s for s in after if s.processes <= usual]
    if len(after) < 2:
        return {"warmup_rss_mb": None, "end_rss_mb": None, "growth_mb": None, "growth_pct": None, "flat": None}
    first, last = after[0], after[-1]
    n = len(after)
    mean_t = sum(s.t_s for s in after) / n
    mean_r = sum(s.rss_mb for s in after) / n
    var = sum((s.t_s - mean_t) ** 2 for s in after)
    slope = sum((s.t_s - mean_t) * (s.rss_mb - mean_r) for s in after) / var * 60 if var else 0.0
    grew = last.rss_mb - first.rss_mb
    pct = 100 * grew / first.rss_mb if first.rss_mb else 0.0
    return {
        "warmup_rss_mb": round(first.rss_mb, 1),
        "end_rss_mb": round(last.rss_mb, 1),
        "peak_rss_mb": round(max(s.rss_mb for s in samples), 1),
        "growth_mb": round(grew, 1),
        "growth_pct": round(pct, 2),
        "slope_mb_per_min": round(slope, 2),
        "replacing_samples": len(replacing),
        "flat": pct <= RSS_GROWTH_MAX_PCT and grew <= RSS_GROWTH_MAX_MB,
    }


# -- the traffic ------------------------------------------------------------------------------------------


@dataclass
class Route:
    name: str
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0
    problems: list[str] = field(default_factory=list)

    def pct(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    def row(self, wall_s: float) -> dict[str, Any]:
        n = len(self.latencies_ms)
        return {
            "requests": n,
            "errors": self.errors,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "req_per_s": round(n / wall_s, 2) if wall_s else 0.0,
            "p50_ms": round(self.pct(50), 2),
            "p99_ms": round(self.pct(99), 2),
            "problems": self.problems[:5],
        }


@dataclass
class Traffic:
    """What the soak's client knows: the jobs it submitted, its fleets (one kept for jobs, others churned)."""

    host: str
    secret: str
    rng: random.Random
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    jobs: list[str] = field(default_factory=list)
    main_fleet: str | None = None
    churn: dict[str, list[str]] = field(default_factory=dict)  # fleet id -> its live instance ids
    offers: list[dict[str, Any]] = field(default_factory=list)  # the offers the planner leased (scale adds them)
    fleet_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    counter: int = 0
    changes: dict[str, int] = field(default_factory=dict)
    steps: tuple[int, ...] = DEFAULT_STEPS  # a submitted job's steps, drawn from these

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}

    def post(self, path: str, doc: dict[str, Any] | None, key: str | None = None) -> bytes:
        headers = {**self.auth, **({"Idempotency-Key": key} if key else {})}
        return http_request("POST", path, self.host, headers, json.dumps(doc).encode() if doc is not None else b"")

    def get(self, path: str) -> bytes:
        return http_request("GET", path, self.host, self.auth)


def _instances(body: bytes) -> list[str]:
    return [i["id"] for i in json.loads(body)["instances"] if i["state"] not in ("draining", "released", "lost")]


async def one(conn: RawConnection, tr: Traffic, op: str, routes: dict[str, Route]) -> None:
    """Send one request of kind ``op`` (falling back to a submission while there is no job or fleet yet)."""
    if op in ("get", "events") and not tr.jobs:
        op = "submit"
    if op == "fleet_get" and tr.main_fleet is None:
        op = "list"
    expect: tuple[int, ...] = (200,)
    after = None
    tr.counter += 1
    i = tr.counter
    if op == "submit":
        doc = dict(BODY, steps=tr.rng.choice(tr.steps))
        if tr.main_fleet is not None and i % 10 == 0:
            doc["fleet_id"] = tr.main_fleet
        raw, expect = tr.post("/v1/jobs", doc, key=f"soak-{tr.run}-{i}"), (201,)

        def after(status: int, body: bytes) -> None:
            tr.jobs.append(json.loads(body)["id"])
    elif op == "get":
        raw = tr.get(f"/v1/jobs/{tr.rng.choice(tr.jobs)}")
    elif op == "events":
        raw = tr.get(f"/v1/jobs/{tr.rng.choice(tr.jobs)}/events")
    elif op == "list":
        raw = tr.get("/v1/jobs?limit=50")
    elif op == "report":
        raw = tr.get("/v1/reports/savings")
    elif op == "fleet_get":
        raw = tr.get(f"/v1/fleets/{tr.main_fleet}")
    else:
        await fleet_change(conn, tr, routes)
        return
    await send(conn, op, raw, expect, routes, after)


async def fleet_change(conn: RawConnection, tr: Traffic, routes: dict[str, Route]) -> None:
    """Lease a fleet (while fewer than two churn), else scale or release one of them, one change at a time."""
    async with tr.fleet_lock:
        tr.counter += 1
        if len(tr.churn) < 2:
            doc = {"name": f"churn-{tr.counter}", "policy": "max_min_fairness_perf", "plan": PLAN}

            def leased(status: int, body: bytes) -> None:
                tr.churn[json.loads(body)["id"]] = _instances(body)
                for inst in json.loads(body)["instances"]:
                    offer = {k: inst["offer"][k] for k in OFFER_FIELDS}
                    if offer not in tr.offers:
                        tr.offers.append(offer)

            raw = tr.post("/v1/fleets", doc, key=f"soak-fleet-{tr.run}-{tr.counter}")
            await send(conn, "fleet_change", raw, (201,), routes, leased, kind="lease", tr=tr)
            return
        fleet = tr.rng.choice(sorted(tr.churn))
        if tr.rng.random() < 0.6:
            live = tr.churn[fleet]
            change: dict[str, Any] = {"add": [{"offer": tr.rng.choice(tr.offers)}]}
            if len(live) > 1:
                change["remove"] = [tr.rng.choice(live)]

            def scaled(status: int, body: bytes) -> None:
                tr.churn[fleet] = _instances(body)

            raw = tr.post(f"/v1/fleets/{fleet}/scale", change)
            await send(conn, "fleet_change", raw, (200,), routes, scaled, kind="scale", tr=tr)
        else:
            del tr.churn[fleet]
            await send(
                conn,
                "fleet_change",
                tr.post(f"/v1/fleets/{fleet}/release", None),
                (202,),
                routes,
                kind="release",
                tr=tr,
            )


async def send(
    conn: RawConnection,
    name: str,
    raw: bytes,
    expect: tuple[int, ...],
    routes: dict[str, Route],
    after: Any = None,
    *,
    kind: str | None = None,
    tr: Traffic | None = None,
) -> None:
    route = routes.setdefault(name, Route(name))
    if time.perf_counter() - getattr(conn, "last_used", 0.0) > IDLE_REOPEN_S:
        conn.close()  # uvicorn closes a keep-alive connection idle for 5 s: open a fresh one, as a client would
    t0 = time.perf_counter()
    try:
        status, body = await conn.request(raw)
    except HttpError as exc:
        route.latencies_ms.append((time.perf_counter() - t0) * 1000)
        route.errors += 1
        route.problems.append(str(exc))
        return
    route.latencies_ms.append((time.perf_counter() - t0) * 1000)
    conn.last_used = time.perf_counter()  # type: ignore[attr-defined]
    route.statuses[status] = route.statuses.get(status, 0) + 1
    if status not in expect:
        route.errors += 1
        route.problems.append(f"{kind or name}: {status} {body[:200]!r}")
        return
    if kind is not None and tr is not None:
        tr.changes[kind] = tr.changes.get(kind, 0) + 1
    if after is not None:
        after(status, body)


def job_states(db: Any) -> dict[str, int]:
    """The jobs by state now (``db``: a SQLAlchemy engine on the service's database), a fleet's jobs (run by its
    rounds, not the engine) as ``fleet:<state>``; empty on a failed read."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    from costopt.db.jobs_schema import jobs
    from costopt.fleets.model import FLEET_PROVIDER

    query = select(jobs.c.provider, jobs.c.state, func.count()).group_by(jobs.c.provider, jobs.c.state)
    try:
        with db.connect() as conn:
            rows = conn.execute(query).all()
    except SQLAlchemyError:
        return {}
    out: dict[str, int] = {}
    for provider, state, n in rows:
        key = f"fleet:{state}" if provider == FLEET_PROVIDER else str(state)
        out[key] = out.get(key, 0) + int(n)
    return dict(sorted(out.items()))


async def soak(srv: Server, secret: str, args: argparse.Namespace, url: str) -> dict[str, Any]:
    from costopt.db.engine import make_engine

    host, port = srv.base.removeprefix("http://").split(":")
    db = make_engine(url)
    tr = Traffic(f"{host}:{port}", secret, random.Random(args.seed), steps=tuple(args.steps))
    routes: dict[str, Route] = {}
    setup = RawConnection(host, int(port))
    main_doc = {"name": "soak-main", "policy": "max_min_fairness_perf", "plan": PLAN}
    status, body = await setup.request(tr.post("/v1/fleets", main_doc, key=f"soak-main-{tr.run}"))
    if status != 201:
        raise RuntimeError(f"could not lease the soak's fleet: {status} {body[:300]!r}")
    tr.main_fleet = json.loads(body)["id"]
    setup.close()

    duration = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else min(60.0, duration * 0.2)
    names, weights = list(WEIGHTS), weights_with(args.submit_weight, args.route_weight)
    samples: list[Sample] = []
    start = time.perf_counter()
    slot = iter(range(10**12))

    async def sampler() -> None:
        while time.perf_counter() - start < duration:
            rss = rss_mb(srv.proc.pid)
            states = await asyncio.to_thread(job_states, db)
            samples.append(
                Sample(
                    time.perf_counter() - start,
                    sum(rss.values()),
                    max(rss.values(), default=0.0),
                    len(rss),
                    os.getloadavg()[0],
                    {p: round(v, 1) for p, v in rss.items()},
                    states,
                )
            )
            await asyncio.sleep(args.sample_s)

    async def worker(conn: RawConnection) -> None:
        for k in slot:
            due = start + k / args.rate
            now = time.perf_counter()
            if due - start >= duration or now - start >= duration:
                return
            if due > now:
                await asyncio.sleep(due - now)
            await one(conn, tr, tr.rng.choices(names, weights)[0], routes)

    conns = [RawConnection(host, int(port)) for _ in range(args.concurrency)]
    try:
        await asyncio.gather(sampler(), *(worker(c) for c in conns))
    finally:
        for c in conns:
            c.close()
    retried = sum(c.retried for c in conns)
    wall = time.perf_counter() - start
    rss = rss_mb(srv.proc.pid)
    samples.append(
        Sample(
            wall,
            sum(rss.values()),
            max(rss.values(), default=0.0),
            len(rss),
            os.getloadavg()[0],
            {p: round(v, 1) for p, v in rss.items()},
            job_states(db),
        )
    )
    db.dispose()
    # what the background work did: the collector's runs as the service shows them, the jobs' states
    sources = RawConnection(host, int(port))
    _, src_body = await sources.request(tr.get("/v1/prices/sources"))
    sources.close()
    total = sum(len(r.latencies_ms) for r in routes.values())
    return {
        "wall_s": round(wall, 1),
        "warmup_s": warmup,
        "rate_target": args.rate,
        "concurrency": args.concurrency,
        "requests": total,
        "req_per_s": round(total / wall, 1),
        "errors": sum(r.errors for r in routes.values()),
        "retried": retried,
        "routes": {name: routes[name].row(wall) for name in sorted(routes)},
        "fleet_changes": tr.changes,
        "jobs_submitted": len(tr.jobs),
        "job_steps": list(tr.steps),
        "submit_weight": args.submit_weight,
        "memory": growth(samples, warmup),
        "samples": [vars(s) | {"t_s": round(s.t_s, 1), "rss_mb": round(s.rss_mb, 1)} for s in samples],
        "price_sources": _sources_summary(src_body),
    }


def weights_with(submit: float, overrides: dict[str, float] | None = None) -> list[float]:
    """The routes' weights (in :data:`WEIGHTS`' order) with submissions at ``submit`` and the others scaled
    to share the rest in their proportions; ``overrides`` (route -> weight, e.g. ``report=0`` to leave a route
    out when attributing memory) then replace those routes' weights (``random.choices`` normalizes)."""
    if not 0 < submit < 1:
        raise ValueError(f"the submissions' weight is a share in (0, 1), got {submit}")
    unknown = sorted(set(overrides or {}) - set(WEIGHTS))
    if unknown:
        raise ValueError(f"unknown route(s) {unknown}: choose from {sorted(WEIGHTS)}")
    if any(w < 0 for w in (overrides or {}).values()):
        raise ValueError("a route's weight is >= 0")
    rest = 1 - WEIGHTS["submit"]
    out = [submit if name == "submit" else w * (1 - submit) / rest for name, w in WEIGHTS.items()]
    return [(overrides or {}).get(name, w) for name, w in zip(WEIGHTS, out, strict=True)]


def probe_summary(folder: Path, warmup_s: float, trace: bool) -> dict[str, Any]:
    """What the workers' memory probes wrote (``bench/api_load.py`` ``make_app``, ``BENCH_MEMORY_DIR``):
    per worker pid its samples (seconds since its start, RSS, malloc's memory, the engine's held jobs, the
    planner's caches, the simulated cloud's instances, each as the probe wrote it), and with ``trace`` the
    top growth sites of the Python heap from its first snapshot at or after the warm-up to its last
    (:func:`bench.snapshot_diff.growth_sites`)."""
    from bench.snapshot_diff import growth_sites

    out: dict[str, Any] = {}
    for rss in sorted(folder.glob("*.rss")):
        pid = rss.stem
        samples = [
            dict(kv.split("=", 1) for kv in line.split()[1:]) | {"t_s": line.split()[0]}
            for line in rss.read_text().splitlines()
            if line.strip()
        ]
        worker: dict[str, Any] = {"samples": samples}
        if trace:
            snaps = sorted(folder.glob(f"{pid}-*.snap"))
            later = [p for p in snaps if int(p.stem.split("-")[1]) >= warmup_s]
            if len(later) >= 2:
                worker["heap_growth"] = growth_sites(later[0], later[-1], top=15)
        out[pid] = worker
    return out


def _sources_summary(body: bytes) -> Any:
    """Each price source's runs as ``GET /v1/prices/sources`` shows them (the loopback collector's and the seed's)."""
    try:
        items = json.loads(body)["items"]
    except (ValueError, KeyError, TypeError):
        return body[:300].decode(errors="replace")
    keep = ("name", "last_success_at", "consecutive_failures", "total_points", "total_refused_pages", "last_error")
    return [{k: s.get(k) for k in keep} for s in items if isinstance(s, dict)]


def background(url: str) -> dict[str, Any]:
    """What the background work did, from the database at the end: jobs per state (the engine's tick moved
    them), the runs of each scheduled job (engine tick, rebalancer, reconciler, collectors, fleets'
    executor: ``scheduler_leases.runs``), the fleets' rounds started, the job events by kind, the engine's
    errors recorded on jobs (by reason), and each failed job's reason and event trail (kind, transition,
    reason)."""
    from sqlalchemy import func, select

    from costopt.db.engine import make_engine
    from costopt.db.fleets_schema import fleet_rounds
    from costopt.db.jobs_schema import job_events, jobs, scheduler_leases

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            states = conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state))
            runs = conn.execute(select(scheduler_leases.c.name, scheduler_leases.c.runs))
            kinds = conn.execute(select(job_events.c.kind, func.count()).group_by(job_events.c.kind))
            failed = conn.execute(select(jobs.c.id, jobs.c.reason).where(jobs.c.state == "failed")).all()
            engine_errors = conn.execute(select(job_events.c.reason).where(job_events.c.kind == "engine_error")).all()
            trails: dict[str, list[str]] = {}
            for job_id, _ in failed:
                rows = conn.execute(
                    select(job_events.c.kind, job_events.c.from_state, job_events.c.to_state, job_events.c.reason)
                    .where(job_events.c.job_id == job_id)
                    .order_by(job_events.c.id)
                )
                trails[job_id] = [f"{k} {a or ''}->{b or ''} {r}"[:200] for k, a, b, r in rows]
            return {
                "job_states": {str(s): int(n) for s, n in states},
                "scheduled_runs": {str(name): int(n) for name, n in runs},
                "fleet_rounds": int(conn.execute(select(func.count()).select_from(fleet_rounds)).scalar_one()),
                "job_events": {str(k): int(n) for k, n in kinds},
                "engine_errors": dict(Counter(str(r)[:160] for (r,) in engine_errors).most_common(10)),
                "failed_reasons": dict(Counter(str(reason)[:160] for _, reason in failed).most_common()),
                "failed_jobs": trails,
            }
    finally:
        engine.dispose()


def log_errors(log: Path) -> list[str]:
    """The server log's errors: each traceback as its exception line (the first unindented line after it,
    with the last frame's location), and each ERROR or CRITICAL record not inside a traceback."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("Traceback"):
            j, where = i + 1, ""
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                if lines[j].strip().startswith("File "):
                    where = lines[j].strip()
                j += 1
            out.append(f"{lines[j] if j < len(lines) else '(cut)'} [{where}]")
            i = j + 1
            continue
        if any(m in line for m in LOG_ERROR_MARKERS):
            out.append(line)
        i += 1
    return out


def replaced_in_log(path: Path) -> int:
    """How many serving replicas the supervisor replaced for their memory (its log lines)."""
    lines = Path(path).read_text(errors="replace").splitlines()
    return sum(1 for line in lines if "over the" in line and "replaced by" in line)


def run(args: argparse.Namespace) -> dict[str, Any]:
    backend = args.backend
    workers = args.workers if args.workers is not None else (2 if backend == "postgres" else 1)
    with (
        FakeRetailPrices() as prices,
        database(backend) as url,
        tempfile.TemporaryDirectory(prefix="costopt-soak-") as logs,
    ):
        secret = prepare(url)
        env = {
            "COSTOPT_COLLECTORS_ENABLED": "true",
            "COSTOPT_MIGRATION_JOBS_ENABLED": "true",
            "COSTOPT_FLEET_EXECUTOR_ENABLED": "true",
            "COSTOPT_AZURE_RETAIL_PRICES_URL": prices.url,
            "COSTOPT_AZURE_INTERVAL": f"PT{int(args.collect_every)}S",
            # never a real cloud: the other collectors' endpoints on a closed loopback port
            "COSTOPT_AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            "COSTOPT_GCP_BILLING_ENDPOINT": "http://127.0.0.1:9",
            "COSTOPT_GCP_COMPUTE_ENDPOINT": "http://127.0.0.1:9",
            # as the image runs it (Dockerfile): glibc's malloc with 2 arenas, not 8 per core, so memory
            # freed by one thread is reused by the others instead of held per arena (docs/reliability.md)
            "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2"),
            **{name: os.environ.get(name, value) for name, value in RUNTIME_ENV.items()},
        }
        memory_dir = Path(args.memory_dir) if args.memory_dir else None
        if memory_dir is not None:
            memory_dir.mkdir(parents=True, exist_ok=True)
            env["BENCH_MEMORY_DIR"] = str(memory_dir)
            env["BENCH_MEMORY_EVERY_S"] = str(args.memory_every_s)
            if args.trace_memory:
                env["BENCH_TRACEMALLOC"] = "1"
            if args.gc_types:
                env["BENCH_GC_TYPES"] = "1"
        load_before = os.getloadavg()
        with server(
            url,
            workers=workers,
            job_work=True,
            log_dir=Path(logs),
            extra_env=env,
            serving_replicas=not args.split_sim,
            private_job_work=args.private_job_work,
            max_rss_mb=args.max_rss_mb,
        ) as srv:
            result = run_async(soak(srv, secret, args, url))
            errors_in_log = log_errors(srv.log)
            if args.keep_log:
                Path(args.keep_log).write_bytes(Path(srv.log).read_bytes())
        load_after = os.getloadavg()
        result.update(
            backend=backend,
            workers=workers,
            private_job_work=args.private_job_work,
            max_rss_mb=args.max_rss_mb,
            replicas_replaced=replaced_in_log(srv.log),
            load_avg_before=[round(x, 2) for x in load_before],
            load_avg_after=[round(x, 2) for x in load_after],
            collector_page_fetches=prices.hits,
            **background(url),
            server_log_errors=len(errors_in_log),
            server_log_error_lines=[f"{n} x {line}" for line, n in Counter(errors_in_log).most_common(10)],
        )
    if memory_dir is not None:
        result["probe"] = probe_summary(memory_dir, result["warmup_s"], args.trace_memory)
    mem = result["memory"]
    result["ok"] = result["errors"] == 0 and result["server_log_errors"] == 0 and bool(mem["flat"])
    return result


def render(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"soak: {r['wall_s'] / 60:.1f} min on {r['backend']}, {r['workers']} worker(s), loopback")
    for col in ("route", "requests", "errors", "req/s", "p50 ms", "p99 ms", "statuses"):
        table.add_column(col, justify="left" if col in ("route", "statuses") else "right")
    for name, p in r["routes"].items():
        table.add_row(
            name,
            str(p["requests"]),
            str(p["errors"]),
            f"{p['req_per_s']:.1f}",
            f"{p['p50_ms']:.1f}",
            f"{p['p99_ms']:.1f}",
            json.dumps(p["statuses"]),
        )
    table.add_row("all", str(r["requests"]), str(r["errors"]), f"{r['req_per_s']:.1f}", "", "", "")
    console = Console(width=200)
    console.print(table)
    m = r["memory"]
    console.print(
        f"server RSS (all processes): {m['warmup_rss_mb']} MB at the warm-up's end ({r['warmup_s']:.0f} s), "
        f"{m['end_rss_mb']} MB at the end: {m['growth_mb']:+} MB ({m['growth_pct']:+}%), slope "
        f"{m.get('slope_mb_per_min')} MB/min, peak {m.get('peak_rss_mb')} MB: {'flat' if m['flat'] else 'GROWING'}"
    )
    console.print(
        f"replicas replaced for their memory {r.get('replicas_replaced', 0)} (limit {r.get('max_rss_mb')} MB); "
        f"requests sent again on a new connection after the server closed a kept-alive one {r.get('retried', 0)}"
    )
    console.print(
        f"fleet changes {r['fleet_changes']}; jobs submitted {r['jobs_submitted']}, by state at the end "
        f"{r['job_states']}; scheduled runs {r['scheduled_runs']}; fleet rounds {r['fleet_rounds']}; "
        f"collector page fetches {r['collector_page_fetches']}; server log error lines "
        f"{r['server_log_errors']}; load average {r['load_avg_before']} before, {r['load_avg_after']} after"
    )
    for src in r["price_sources"] if isinstance(r["price_sources"], list) else []:
        if not str(src.get("name", "")).startswith("import:"):
            console.print(f"  price source {src}")
    for p in (p for route in r["routes"].values() for p in route["problems"]):
        console.print(f"  problem: {p}")
    for line in r["server_log_error_lines"]:
        console.print(f"  log: {line[:180]}")
    console.print("OK" if r["ok"] else "FAILED (errors, log errors or memory growth)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--backend", choices=["sqlite", "postgres"], default="postgres")
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="service processes (default 2 on PostgreSQL, 1 on SQLite): one runs the background work (engine, "
        "reconciler, watcher, rebalancer, fleets' rounds, collector) and the embedded simulated cloud, the others "
        "are serving replicas on the same port (bench/api_load.py serve_with_replicas)",
    )
    ap.add_argument(
        "--split-sim",
        action="store_true",
        help="run --workers alike instead (api.replicas, as runs A-J did): each then runs the background work over a "
        "simulated cloud of its own and the one database, so each worker's engine, reconciler and watcher take the "
        "others' copies for lost (copy_lost events, recoveries ping-ponging between the clouds, failed jobs, engine "
        'races in the log); `costopt serve --workers N` refuses it (docs/reliability.md "Soak")',
    )
    ap.add_argument(
        "--private-job-work",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the job-work process listens on a port of its own, so the traffic goes to the serving replicas only "
        "(a worker tier beside the API tier; needs --workers 2 or more)",
    )
    ap.add_argument(
        "--max-rss-mb",
        type=float,
        default=None,
        help="the serving replicas run under api.replicas' supervisor, which replaces one whose resident memory "
        "passed this many MB, its replacement serving first (COSTOPT_WORKER_MAX_RSS_MB); default: never",
    )
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second, all routes together")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight at most")
    ap.add_argument("--warmup", type=float, default=None, help="seconds of warm-up (default 20%% of the run, <= 60)")
    ap.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--collect-every", type=float, default=20.0, help="seconds between the collector's runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--steps",
        type=lambda v: [int(x) for x in v.split(",")],
        default=list(DEFAULT_STEPS),
        help="a submitted job's steps, drawn from this comma-separated list (default 2000,5000,10000 since session "
        "11; the earlier default 20000,50000,200000 with --submit-weight 0.25 submits more than the simulated cloud "
        "ever runs: a queue, not a soak)",
    )
    ap.add_argument(
        "--submit-weight",
        type=float,
        default=DEFAULT_SUBMIT_WEIGHT,
        help=f"the submissions' share of the requests (default {DEFAULT_SUBMIT_WEIGHT}; the other routes share the "
        "rest in WEIGHTS' proportions)",
    )
    ap.add_argument(
        "--route-weight",
        action="append",
        default=[],
        metavar="ROUTE=W",
        help="set one route's weight after --submit-weight (repeatable; e.g. report=0 leaves the savings report "
        "out, to attribute memory to a route)",
    )
    ap.add_argument(
        "--memory-dir",
        default=None,
        help="turn on the workers' memory probes, writing to this folder (bench/api_load.py make_app); their "
        "samples go into the JSON's 'probe'",
    )
    ap.add_argument("--memory-every-s", type=float, default=30.0, help="seconds between the probes' samples")
    ap.add_argument(
        "--trace-memory",
        action="store_true",
        help="with --memory-dir: trace the workers' Python heap (tracemalloc, slows them) and report its top "
        "growth sites from the warm-up's end to the end",
    )
    ap.add_argument(
        "--gc-types",
        action="store_true",
        help="with --memory-dir: each worker also writes its live objects' counts by type (the collector's oldest "
        "generation) at each sample, <pid>-<seconds>.types",
    )
    ap.add_argument("--keep-log", default=None, metavar="PATH", help="copy the service's log to PATH at the end")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = ap.parse_args(argv)
    if (args.trace_memory or args.gc_types) and not args.memory_dir:
        ap.error("--trace-memory and --gc-types need --memory-dir")
    if not args.steps or min(args.steps) < 1:
        ap.error("--steps: give positive step counts, e.g. 2000,5000")
    try:
        args.route_weight = {k: float(v) for k, _, v in (x.partition("=") for x in args.route_weight)}
        weights_with(args.submit_weight, args.route_weight)
    except ValueError as exc:
        ap.error(f"--submit-weight / --route-weight: {exc}")
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        render(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

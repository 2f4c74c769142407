"""Load benchmark of the job service's REST API (issue 10), over loopback only.

Starts the real service (uvicorn on uvloop/httptools, ``--workers`` processes, :func:`api.app.create_app`;
collectors off, the scheduler's job-side work off unless ``--job-work``) on a free 127.0.0.1 port against
SQLite (a temp file) and PostgreSQL (127.0.0.1:5432, database ``test``, a schema of its own dropped
afterwards), creates a team key, then drives it with a lean asyncio client (one keep-alive HTTP/1.1
connection per request in flight, pre-built request bytes: it shares the 2 cores with the server and
PostgreSQL), ``--concurrency`` requests in flight, each phase bounded by its request count and
``--max-seconds``:

- ``submit``: ``POST /v1/jobs``, each with its own ``Idempotency-Key``;
- ``retry``: ``--retry-fraction`` of those keys sent again, each twice at once (the answers must be the
  first job, 200);
- ``get``: ``GET /v1/jobs/{id}`` of random submitted jobs (every answer must be 200);
- ``livez``: ``GET /livez`` (``--floor`` requests): the stack's floor, an empty route with no key and
  no database, through the same server and client;
- ``list``: ``GET /v1/jobs?limit=50`` (a page).

Then checks the database: exactly one job per key sent, none missing, none extra ("no request lost or
duplicated"). Prints a table (``--json``: one JSON document) with requests, errors, req/s and
p50/p95/p99 latency per endpoint and backend, and the CPU each request cost: the server's processes,
the PostgreSQL backends serving its connections (found by their application_name), the load generator,
their total and the rate 2 idle cores could serve at that cost (the "2-core ceiling"), with the load
average before and after (the machine is shared: req/s and latencies swing with it, CPU per request
much less).

    .venv/bin/python bench/api_load.py --workers 2 --requests 1500 --reads 4000 --pages 200 --max-seconds 30
    .venv/bin/python bench/api_load.py --backend postgres --workers 1 --requests 3000 --json

Targets on a 2-core machine (PostgreSQL): >= 300 submissions/s, >= 1,000 reads/s, p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PG_ADMIN_URL = os.environ.get("COSTOPT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
JOB_TYPE = "ResNet-50 (batch size 128)"
BODY: dict[str, Any] = {"job_type": JOB_TYPE, "steps": 50_000, "command": ["python", "train.py"]}
TARGETS = {"submit": 300.0, "get": 1000.0, "list": None, "retry": None}
P99_TARGET_MS = 100.0
T = TypeVar("T")


def make_app() -> Any:
    """The uvicorn factory (``--factory bench.api_load:make_app``): the service on the COSTOPT_* env.

    Memory probes for soaks (environment read here only, never by the service; ``bench/snapshot_diff.py``
    reads what they write): ``BENCH_MEMORY_DIR`` set, each worker appends its RSS to ``<pid>.rss`` there
    every ``BENCH_MEMORY_EVERY_S`` seconds (default 30); with ``BENCH_TRACEMALLOC=1`` it also traces its
    allocations (10 frames) from ``BENCH_MEMORY_EVERY_S`` after its start on (what is allocated after
    that: a snapshot's traces are what is still alive of it) and writes a snapshot ``<pid>-<seconds since
    start>.snap`` at each sample; with
    ``BENCH_MALLOC_TRIM=1`` it calls glibc's ``malloc_trim(0)`` after each sample and appends the RSS
    after it (what the allocator held of freed memory); with ``BENCH_GC_TYPES=1`` it writes the live objects
    by type at each sample (:func:`_gc_types`). Each sample also has the resident memory by kind of mapping,
    the threads and descriptors (:func:`_mappings`) and pymalloc's arenas (:func:`_pymalloc`)."""
    from api.app import create_app
    from api.cli.common import configure_logging

    # the service's own log lines as `costopt serve` writes them (time, level, logger: message); without it
    # uvicorn configures only its loggers, and the service's warnings and errors reach stderr as bare
    # messages (logging's last-resort handler), with no level for bench/soak.py's error count to see
    configure_logging(False)
    out = os.environ.get("BENCH_MEMORY_DIR")
    if out:
        app = create_app()
        _start_memory_probe(Path(out), float(os.environ.get("BENCH_MEMORY_EVERY_S", "30")), app)
        return app
    return create_app()


def _start_memory_probe(out: Path, every_s: float, app: Any) -> None:
    """Sample this process's memory every ``every_s`` seconds in a daemon thread (:func:`make_app`)."""
    import threading
    import tracemalloc

    trace = os.environ.get("BENCH_TRACEMALLOC") == "1"
    trim = os.environ.get("BENCH_MALLOC_TRIM") == "1"
    gc_types = os.environ.get("BENCH_GC_TYPES") == "1"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def loop() -> None:
        if trace:  # from the first sample on: tracing the start-up too made it miss the soak's 120 s (load 15)
            time.sleep(every_s)
            tracemalloc.start(10)
        while True:
            time.sleep(every_s)
            t = int(time.monotonic() - started)
            line = f"{t} rss_mb={_rss_kib() / 1024:.1f}"
            if trace:
                name = out / f"{os.getpid()}-{t:05d}.snap"
                tracemalloc.take_snapshot().dump(str(name) + ".tmp")
                os.replace(str(name) + ".tmp", name)
                line += f" traced_mb={tracemalloc.get_traced_memory()[0] / 2**20:.1f}"
            line += _native_pools() + _held(app) + _mappings() + _pymalloc()
            if gc_types:
                _gc_types(out / f"{os.getpid()}-{t:05d}.types")
            if trim:
                line += f" after_trim_mb={_malloc_trim() / 1024:.1f}"
            with (out / f"{os.getpid()}.rss").open("a") as f:
                f.write(line + "\n")

    threading.Thread(target=loop, name="bench-memory-probe", daemon=True).start()


def _native_pools() -> str:
    """Memory tracemalloc does not see: pyarrow's pool (pandas' ``str`` columns) and glibc's arenas."""
    import sys

    pa = sys.modules.get("pyarrow")
    return (f" arrow_mb={pa.total_allocated_bytes() / 2**20:.1f}" if pa is not None else "") + _malloc_info()


def _mappings() -> str:
    """Where the resident memory is (``/proc/self/smaps``): anonymous (malloc's ``[heap]``, the other anonymous
    mappings: glibc's second arena, pymalloc's arenas, large blocks, thread stacks) and file-backed pages
    (libraries' code and data as first touched), and the live threads and open file descriptors."""
    rss: dict[str, int] = {"heap": 0, "anon": 0, "file": 0, "other": 0}
    kind = "other"
    anon_maps = 0
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                first = line.split(None, 1)[0]
                if first.endswith(":"):
                    if first == "Rss:":
                        rss[kind] += int(line.split()[1])
                    continue
                parts = line.split()
                path = parts[5] if len(parts) > 5 else ""
                kind = (
                    "heap" if path == "[heap]" else "file" if path.startswith("/") else "anon" if not path else "other"
                )
                anon_maps += kind == "anon"
        threads = next(
            int(x.split()[1]) for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("Threads:")
        )
        fds = len(os.listdir("/proc/self/fd"))
    except (OSError, StopIteration, ValueError):
        return ""
    return (
        "".join(f" {k}_rss_mb={v / 1024:.1f}" for k, v in rss.items())
        + f" anon_maps={anon_maps} threads={threads} fds={fds}"
    )


def _pymalloc() -> str:
    """pymalloc's arenas (1 MiB mappings of their own, which neither ``mallinfo2`` nor, when the objects in
    them are freed, ``tracemalloc`` sees): arenas held now, and the bytes in used and free blocks in them
    (``_PyObject_DebugMallocStats`` written to a temporary file)."""
    import ctypes
    import tempfile

    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    dump = ctypes.pythonapi._PyObject_DebugMallocStats
    dump.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile("r", suffix=".mallocstats") as tmp:
        fp = libc.fopen(tmp.name.encode(), b"w")
        if not fp:
            return ""
        dump(fp)
        libc.fclose(fp)
        text = tmp.read()
    found = {}
    for key, pattern in (
        ("arenas", r"# arenas allocated current\s*=\s*([\d,]+)"),
        ("arenas_peak", r"# arenas highwater mark\s*=\s*([\d,]+)"),
        ("used_mb", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
        ("free_mb", r"# bytes in available blocks\s*=\s*([\d,]+)"),
    ):
        m = re.search(pattern, text)
        if m:
            n = int(m.group(1).replace(",", ""))
            found[key] = str(n) if key.startswith("arenas") else f"{n / 2**20:.1f}"
    return "".join(f" pymalloc_{k}={v}" for k, v in found.items())


def _gc_types(path: Path, top: int = 40) -> None:
    """The ``top`` types by live objects (``gc.collect()``, then ``gc.get_objects(2)``: after a full
    collection every object alive is in the oldest generation, those frozen at start-up aside), written to
    ``path`` as ``count type`` lines (``BENCH_GC_TYPES=1``; a soak's attribution only). The list holds a
    reference to every object, also to a tuple another thread is still building (``_PyTuple_Resize`` needs
    it unshared; see :func:`_held`): thread switches are held off while it lives (a long switch interval),
    so no other thread runs Python code meanwhile; one that was already waiting for the interpreter may
    still get it, rarely (none of the soaks that used it logged the ``SystemError``)."""
    import gc
    import sys
    from collections import Counter

    gc.collect()  # the garbage waiting for a full pass out first: what is counted is alive
    before = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        counts = Counter(type(o).__qualname__ for o in gc.get_objects(generation=2))
    finally:
        sys.setswitchinterval(before)
    path.write_text("".join(f"{n} {name}\n" for name, n in counts.most_common(top)) + f"{sum(counts.values())} ALL\n")


def _held(app: Any) -> str:
    """The sizes of the service's in-process state that grows with jobs: the job planner's caches (tables,
    one-offer tables, quotes), the engine's per-job state, the simulated cloud's instances and tokens.
    (Read through ``app.state``, never ``gc.get_objects()``: that hands out tuples still being built to
    this thread, and the service's ``_PyTuple_Resize`` then fails with ``SystemError``.)"""
    state = app.state
    out = ""
    planner = getattr(state, "job_planner", None)
    if planner is not None:
        sizes = {k: len(getattr(planner, k, ())) for k in ("_tables", "_one_tables", "_plans")}
        out += " planner=" + ",".join(f"{k.strip('_')}:{n}" for k, n in sizes.items())
    service = getattr(state, "job_service", None)
    if service is not None:
        out += f" engine_held={len(service.engine.held_jobs())}"
    executor = getattr(state, "fleet_executor", None)
    if executor is not None:
        sizes = {k: len(getattr(executor, k, ())) for k in ("_policies", "_folded", "_retry_at")}
        out += " fleets=" + ",".join(f"{k.strip('_')}:{n}" for k, n in sizes.items())
    sim = (getattr(state, "providers", None) or {}).get("sim")
    if sim is not None:
        sizes = {k: len(getattr(sim, k, ())) for k in ("_instances", "_tokens", "_live", "_scheduled")}
        out += " sim=" + ",".join(f"{k.strip('_')}:{n}" for k, n in sizes.items())
    return out


def _malloc_info() -> str:
    """glibc's ``mallinfo2``: memory in use in malloc's arenas and mmaps, and free in its arenas (held,
    not returned), plus SQLite's own allocations (``sqlite3_memory_used``)."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (n, ctypes.c_size_t)
            for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
        ] + [("keepcost", ctypes.c_size_t)]

    out = ""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
        fn.restype = MallInfo2
        m = fn()
        out += f" malloc_used_mb={(m.uordblks + m.hblkhd) / 2**20:.1f} malloc_free_mb={m.fordblks / 2**20:.1f}"
    except (OSError, AttributeError):
        pass
    try:
        lib = ctypes.CDLL("libsqlite3.so.0")
        lib.sqlite3_memory_used.restype = ctypes.c_int64
        out += f" sqlite_mb={lib.sqlite3_memory_used() / 2**20:.1f}"
    except (OSError, AttributeError):
        pass
    return out


def _rss_kib() -> int:
    """This process's resident set (KiB, ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _malloc_trim() -> int:
    """glibc's ``malloc_trim(0)`` (free memory of every arena back to the system); the RSS after (KiB)."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return _rss_kib()


# -- databases ------------------------------------------------------------------------------------------


@contextmanager
def database(backend: str) -> Iterator[str]:
    """A fresh database URL for ``backend`` (sqlite: a temp file; postgres: its own schema, dropped after)."""
    from sqlalchemy import text

    from costopt.db.engine import make_engine

    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="costopt-bench-") as tmp:
            yield f"sqlite:///{tmp}/bench.db"
        return
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = make_engine(PG_ADMIN_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    keep = os.environ.get("BENCH_KEEP_DB") == "1"  # to study the data a run left (drop the schema yourself)
    try:
        # the schema's name as the connections' application_name: the bench finds its server's backends by it
        yield f"{PG_ADMIN_URL}?options=-csearch_path%3D{schema}&application_name={schema}"
    finally:
        if keep:
            sys.stderr.write(f"BENCH_KEEP_DB: kept schema {schema}\n")
        else:
            with admin.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def prepare(url: str) -> str:
    """Migrate and seed the database (once, before any worker starts), bootstrap the admin key and make
    the ``bench`` team's member key; returns its secret."""
    from api.wiring import build_store, seed_if_empty
    from costopt.jobs.teams import Role, TeamRepository
    from costopt.settings import Settings

    settings = Settings(database_url=url, collectors_enabled=False)
    store = build_store(settings)
    try:
        seed_if_empty(store, settings)
        teams = TeamRepository(store.engine)
        teams.bootstrap_admin()  # so no worker prints (or races to make) one
        team = teams.create_team("bench")
        return teams.create_key(team.id, Role.MEMBER, "bench").secret
    finally:
        store.engine.dispose()


def commit_latency_ms(url: str, n: int = 100) -> dict[str, float] | None:
    """PostgreSQL's latency of one small committed write, alone (``n`` in a row, before the load): the WAL
    flush every submission waits for, a floor under its latency on this machine's disk. None on SQLite
    (WAL with synchronous=NORMAL: a commit does not wait for the disk)."""
    if not url.startswith("postgresql"):
        return None
    from sqlalchemy import text

    from costopt.db.engine import make_engine

    engine = make_engine(url)
    took: list[float] = []
    try:
        with engine.connect() as conn:
            conn.execute(text("CREATE TABLE bench_commit_probe (n integer)"))
            conn.commit()
            for i in range(n):
                t0 = time.perf_counter()
                conn.execute(text("INSERT INTO bench_commit_probe VALUES (:n)"), {"n": i})
                conn.commit()
                took.append((time.perf_counter() - t0) * 1000)
            conn.execute(text("DROP TABLE bench_commit_probe"))
            conn.commit()
    finally:
        engine.dispose()
    took.sort()
    return {"p50": round(took[len(took) // 2], 2), "p99": round(took[min(len(took) - 1, int(0.99 * len(took)))], 2)}


def count_jobs(url: str, keys: list[str]) -> dict[str, int]:
    """Jobs per idempotency key of ``keys`` in the database (the ground truth)."""
    from sqlalchemy import func, select

    from costopt.db.engine import make_engine
    from costopt.db.jobs_schema import jobs

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(jobs.c.idempotency_key, func.count()).group_by(jobs.c.idempotency_key)).all()
    finally:
        engine.dispose()
    found = {str(k): int(n) for k, n in rows if k is not None}
    return {k: found.get(k, 0) for k in keys} | {k: n for k, n in found.items() if k not in set(keys)}


# -- the server -----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children() -> dict[int, list[int]]:
    """Each live process's children (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def _resource_tracker(pid: int) -> bool:
    """Whether ``pid`` is multiprocessing's resource tracker (a child of uvicorn's supervisor, not a worker)."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc)."""
    children = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def db_cpu_meter(url: str) -> Iterator[Callable[[], dict[int, float]]]:
    """A function giving the CPU seconds so far of each PostgreSQL backend serving ``url``'s connections
    (found by their application_name; PostgreSQL runs one process per connection on this machine);
    SQLite runs inside the server: always {}."""
    from urllib.parse import parse_qs, urlsplit

    from sqlalchemy import text

    from costopt.db.engine import make_engine

    name = (parse_qs(urlsplit(url).query).get("application_name") or [""])[0]
    if not url.startswith("postgresql") or not name:
        yield dict
        return
    admin = make_engine(PG_ADMIN_URL)
    query = text("SELECT pid FROM pg_stat_activity WHERE application_name = :name")

    def backends() -> dict[int, float]:
        with admin.connect() as conn:
            pids = [int(p) for (p,) in conn.execute(query, {"name": name})]
        return {p: process_cpu(p) for p in pids}

    try:
        yield backends
    finally:
        admin.dispose()


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    base: str
    workers: int
    log: Path
    db_cpu: Callable[[], dict[int, float]] = dict

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def worker_cpu(self) -> dict[int, float]:
        """CPU seconds so far of each of the server's direct children (uvicorn's workers; with one worker
        the server's own process), to see how evenly the connections spread over them."""
        if self.workers == 1:
            return {self.proc.pid: self.cpu()}
        return {p: process_cpu(p) for p in _children().get(self.proc.pid, []) if not _resource_tracker(p)}


SERVING_REPLICA_ENV = {
    "COSTOPT_MIGRATION_JOBS_ENABLED": "false",
    "COSTOPT_FLEET_EXECUTOR_ENABLED": "false",
    "COSTOPT_COLLECTORS_ENABLED": "false",
}
"""A serving replica's settings (:func:`serve_with_replicas`): the API only; no job engine, reconciler,
watcher, rebalancer, fleets' rounds or collectors (docs/jobs.md: a replica that serves, the work left to
another process). The API's routes only write rows: launches are the engine's and the fleets' executor's."""


def serve_one(host: str, port: int, log_level: str) -> None:
    """One uvicorn process of :func:`make_app` on ``host:port`` accepting on its own ``SO_REUSEPORT`` socket
    (``api.replicas.ReusePortLoop``), so that several such processes share the port."""
    from uvicorn import Config
    from uvicorn import Server as Uvicorn

    from api.replicas import LOOP

    config = Config(
        "bench.api_load:make_app", factory=True, host=host, port=port, loop=LOOP, log_level=log_level, access_log=False
    )
    Uvicorn(config).run()


def serve_with_replicas(
    workers: int, host: str, port: int, log_level: str, job_port: int | None = None, max_rss_mb: float | None = None
) -> None:
    """``workers`` processes (:func:`serve_one`): the first with the service's background work as its
    environment sets it, the others serving replicas (:data:`SERVING_REPLICA_ENV`) on ``port``. Over the
    embedded simulated cloud this is how more than one process can serve: the cloud lives in the one process
    that runs the job work, where ``api.replicas`` (every worker alike) would give each worker a simulated
    cloud of its own over the one database (``costopt serve --workers N`` refuses that). ``job_port``: the
    job-work process listens there instead, taking none of ``port``'s traffic (a worker tier beside the API
    tier). ``max_rss_mb``: the serving replicas run under ``api.replicas``' supervisor, which replaces one
    whose resident memory passed it (``COSTOPT_WORKER_MAX_RSS_MB``), its replacement serving first. Stops
    them all on SIGTERM or SIGINT; returns when they have exited."""
    import signal

    def one(at: int) -> list[str]:
        code = "import sys; from bench.api_load import serve_one; serve_one(sys.argv[1], int(sys.argv[2]), sys.argv[3])"
        return [sys.executable, "-c", code, host, str(at), log_level]

    replica_env = {**os.environ, **SERVING_REPLICA_ENV}
    procs = [subprocess.Popen(one(job_port or port))]
    if max_rss_mb is not None:
        cmd = [sys.executable, "-m", "api.replicas", "bench.api_load:make_app", "--workers", str(workers - 1)]
        cmd += ["--host", host, "--port", str(port), "--log-level", log_level, "--no-access-log"]
        procs.append(subprocess.Popen([*cmd, "--max-rss-mb", str(max_rss_mb)], env=replica_env))
    else:
        procs += [subprocess.Popen(one(port), env=replica_env) for _ in range(workers - 1)]

    def stop(signum: int, frame: object) -> None:
        for p in procs:
            p.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for p in procs:
        p.wait()


@contextmanager
def server(
    url: str,
    *,
    workers: int,
    job_work: bool,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
    serving_replicas: bool = False,
    private_job_work: bool = False,
    max_rss_mb: float | None = None,
) -> Iterator[Server]:
    """The service on a free 127.0.0.1 port, ready on every worker; ``extra_env`` overrides the COSTOPT_*
    settings set here (bench/soak.py turns the collectors and the fleets' executor on). ``serving_replicas``
    (with ``workers`` > 1): one process with the background work and ``workers - 1`` serving replicas
    (:func:`serve_with_replicas`) instead of ``workers`` alike (``api.replicas``); then ``private_job_work``
    puts the job-work process on a port of its own (no traffic from the port served) and ``max_rss_mb``
    recycles the replicas over that many MB."""
    import httpx

    port = free_port()
    env = dict(os.environ)
    env.update(
        COSTOPT_DATABASE_URL=url,
        COSTOPT_COLLECTORS_ENABLED="false",
        COSTOPT_MIGRATION_JOBS_ENABLED="true" if job_work else "false",
        COSTOPT_SEED_ON_START="false",
        # the bench's one key sends 300-1,400 requests/s on purpose: the per-key rate limit (100/s by
        # default, docs/api.md) is off for its server, which measures the service, not the limiter
        COSTOPT_RATE_LIMIT_PER_S="0",
        PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}",
    )
    env.update(extra_env or {})
    log = log_dir / f"server-{port}.log"
    job_port = free_port() if workers > 1 and serving_replicas and private_job_work else None
    if workers > 1 and serving_replicas:
        cmd = [
            sys.executable,
            "-c",
            "import sys, json; from bench.api_load import serve_with_replicas; "
            "serve_with_replicas(int(sys.argv[1]), '127.0.0.1', int(sys.argv[2]), 'warning', *json.loads(sys.argv[3]))",
            str(workers),
            str(port),
            json.dumps([job_port, max_rss_mb]),
        ]
    elif workers > 1:  # as `costopt serve --workers N`: a listening socket per worker (api/replicas.py)
        cmd = [sys.executable, "-m", "api.replicas", "bench.api_load:make_app", "--host", "127.0.0.1"]
    else:
        cmd = [sys.executable, "-m", "uvicorn", "--factory", "bench.api_load:make_app", "--host", "127.0.0.1"]
    if not (workers > 1 and serving_replicas):
        cmd += ["--port", str(port), "--workers", str(workers), "--log-level", "warning", "--no-access-log"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        ready = 0
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")
            try:
                # every worker answering: a few consecutive OKs
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200 and (
                    job_port is None or httpx.get(f"http://127.0.0.1:{job_port}/readyz", timeout=2).status_code == 200
                ):
                    ready += 1
                    if ready >= 3 * workers:
                        break
            except httpx.HTTPError:
                ready = 0
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the server did not become ready in 120 s; see {log}")
        with db_cpu_meter(url) as meter:
            yield Server(proc, base, workers, log, meter)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the load -------------------------------------------------------------------------------------------


class HttpError(Exception):
    """The connection failed or the answer was not HTTP/1.1 as expected."""


class RawConnection:
    """One keep-alive HTTP/1.1 connection over asyncio streams: the load generator shares the 2 cores with
    the server and PostgreSQL, so it sends pre-built request bytes and reads the answer by its
    Content-Length (chunked bodies too), with no per-request client machinery (httpx costs ~1 ms a
    request here, as much as the server's own work). Reconnects after an error or ``Connection: close``."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.served = 0  # answers read on the connection open now
        self.retried = 0  # requests sent again after the server closed a kept-alive connection (see request)

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None
        self.served = 0

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        """Send ``raw`` (a whole request) and return (status, body). A kept-alive connection the server has
        closed (a replica stopping: it closes its idle connections) is opened again before sending; when the
        server closes it as the request goes out (no byte of an answer read), the request is sent once more on
        a new connection if it is safe to repeat (GET or HEAD, or a POST with an ``Idempotency-Key``: RFC 9110
        9.2.2), counted in ``retried``; anything else is an error."""
        if self.reader is not None and self.reader.at_eof():
            self.close()
        reused = self.served > 0
        try:
            return await self._exchange(raw)
        except HttpError as exc:
            eof = isinstance(exc.__cause__, (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError))
            partial = getattr(exc.__cause__, "partial", b"")
            if not (reused and eof and not partial and _repeatable(raw)):
                raise
        self.retried += 1
        return await self._exchange(raw)

    async def _exchange(self, raw: bytes) -> tuple[int, bytes]:
        try:
            reader, writer = await self._open()
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 "):
                raise HttpError(f"not an HTTP/1.1 answer: {head[:40]!r}")
            status = int(head[9:12])
            lower = head.lower()
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                body = await reader.readexactly(int(lower[at + 17 : lower.index(b"\r\n", at + 2)]))
            elif b"\r\ntransfer-encoding: chunked" in lower:
                parts = []
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    parts.append(await reader.readexactly(size + 2))
                    if size == 0:
                        break
                body = b"".join(p[:-2] for p in parts)
            else:
                body = b""
            self.served += 1
            if b"\r\nconnection: close" in lower:
                self.close()
            return status, body
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.close()
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc


def _repeatable(raw: bytes) -> bool:
    """Whether the request ``raw`` may be sent again without doing its work twice: GET, HEAD, or a request
    with an ``Idempotency-Key`` (the service answers a repeat with the first result)."""
    head = raw.split(b"\r\n\r\n", 1)[0]
    return head.startswith((b"GET ", b"HEAD ")) or b"\r\nidempotency-key:" in head.lower()


def http_request(
    method: str, path: str, host: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> bytes:
    """The bytes of one HTTP/1.1 request (keep-alive; a JSON body when given)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, nearest rank; NaN when there are none."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


@dataclass
class Phase:
    name: str
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    db_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    worker_cpu_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.latencies_ms)

    def pct(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    def row(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "wall_s": round(self.wall_s, 3),
            "req_per_s": round(self.requests / self.wall_s, 1) if self.wall_s else 0.0,
            "p50_ms": round(self.pct(50), 2),
            "p95_ms": round(self.pct(95), 2),
            "p99_ms": round(self.pct(99), 2),
            "server_cpu_s": round(self.cpu_s, 2),
            "server_cpu_pct": round(100 * self.cpu_s / self.wall_s, 1) if self.wall_s else 0.0,
            "server_cpu_ms_per_req": round(1000 * self.cpu_s / self.requests, 2) if self.requests else 0.0,
            "db_cpu_pct": round(100 * self.db_cpu_s / self.wall_s, 1) if self.wall_s else 0.0,
            "db_cpu_ms_per_req": round(1000 * self.db_cpu_s / self.requests, 2) if self.requests else 0.0,
            "client_cpu_pct": round(100 * self.client_cpu_s / self.wall_s, 1) if self.wall_s else 0.0,
            "client_cpu_ms_per_req": round(1000 * self.client_cpu_s / self.requests, 2) if self.requests else 0.0,
            # the whole machine's CPU per request (server, its database backends, the load generator), and
            # the rate 2 cores could serve at that cost with nothing else running
            "total_cpu_ms_per_req": round(1000 * (self.cpu_s + self.db_cpu_s + self.client_cpu_s) / self.requests, 2)
            if self.requests
            else 0.0,
            "ceiling_req_per_s_2_cores": round(2 * self.requests / (self.cpu_s + self.db_cpu_s + self.client_cpu_s))
            if self.requests and (self.cpu_s + self.db_cpu_s + self.client_cpu_s) > 0
            else 0,
            # each worker process's share of the cores, busiest first (one GIL each: a worker near 100% while
            # another idles means the connections did not spread over them)
            "worker_cpu_pct": [round(100 * c / self.wall_s, 1) for c in sorted(self.worker_cpu_s, reverse=True)]
            if self.wall_s
            else [],
            "problems": self.problems[:5],
        }


Request = Callable[[int], bytes]


async def drive(
    srv: Server,
    name: str,
    n: int,
    concurrency: int,
    max_s: float,
    make: Request,
    ok: Callable[[int, bytes, int], bool],
) -> Phase:
    """``n`` requests (at most ``max_s`` seconds), ``concurrency`` in flight, each on its own keep-alive
    connection; ``make(i)`` is the i-th request's bytes and ``ok(status, body, i)`` judges its answer."""
    phase = Phase(name)
    counter = iter(range(n))
    host, port = srv.base.removeprefix("http://").split(":")
    conns = [RawConnection(host, int(port)) for _ in range(concurrency)]
    start, cpu0, db0, client0 = time.perf_counter(), srv.cpu(), srv.db_cpu(), time.process_time()
    workers0 = srv.worker_cpu()
    deadline = start + max_s

    async def worker(conn: RawConnection) -> None:
        for i in counter:
            if time.perf_counter() > deadline:
                return
            raw = make(i)
            t0 = time.perf_counter()
            try:
                status, body = await conn.request(raw)
            except HttpError as exc:
                phase.latencies_ms.append((time.perf_counter() - t0) * 1000)
                phase.errors += 1
                phase.problems.append(f"#{i}: {exc}")
                continue
            phase.latencies_ms.append((time.perf_counter() - t0) * 1000)
            phase.statuses[status] = phase.statuses.get(status, 0) + 1
            if not ok(status, body, i):
                phase.errors += 1
                phase.problems.append(f"#{i}: {status} {body[:200]!r}")

    try:
        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        for c in conns:
            c.close()
    phase.wall_s = time.perf_counter() - start
    phase.cpu_s = srv.cpu() - cpu0
    phase.client_cpu_s = time.process_time() - client0
    phase.db_cpu_s = sum(cpu - db0.get(pid, 0.0) for pid, cpu in srv.db_cpu().items())
    phase.worker_cpu_s = [cpu - workers0.get(pid, 0.0) for pid, cpu in srv.worker_cpu().items()]
    return phase


async def run_load(srv: Server, secret: str, args: argparse.Namespace) -> tuple[list[Phase], list[str], dict[str, str]]:
    """The four phases; returns them, every idempotency key sent and the job id answered per key."""
    host = srv.base.removeprefix("http://")
    auth = {"Authorization": f"Bearer {secret}"}
    body = json.dumps(BODY).encode()
    run = uuid.uuid4().hex[:8]
    keys = [f"bench-{run}-{i}" for i in range(args.requests)]
    job_of: dict[str, str] = {}

    def post(key: str) -> bytes:
        return http_request("POST", "/v1/jobs", host, {**auth, "Idempotency-Key": key}, body)

    def submitted(status: int, answer: bytes, i: int) -> bool:
        if status != 201:
            return False
        job_of[keys[i]] = json.loads(answer)["id"]
        return True

    # warm-up (connections, caches, first-call imports): not counted, keys not part of the check
    warm = [f"warm-{run}-{i}" for i in range(min(50, args.requests))]
    await drive(
        srv, "warm", len(warm), args.concurrency, args.max_seconds, lambda i: post(warm[i]), lambda s, b, i: True
    )

    phases = [
        await drive(srv, "submit", len(keys), args.concurrency, args.max_seconds, lambda i: post(keys[i]), submitted)
    ]
    sent = [k for k in keys[: phases[0].requests]]

    rng = random.Random(7)
    retried = rng.sample(sent, int(len(sent) * args.retry_fraction)) if sent else []
    # each retried key twice, the two copies next to each other so that they race
    retry_keys = [k for k in retried for _ in range(2)]

    def first_job(status: int, answer: bytes, i: int) -> bool:
        key = retry_keys[i]
        return status == 200 and (key not in job_of or json.loads(answer)["id"] == job_of[key])

    phases.append(
        await drive(
            srv, "retry", len(retry_keys), args.concurrency, args.max_seconds, lambda i: post(retry_keys[i]), first_job
        )
    )

    ids = list(job_of.values())
    if ids:
        gets = [http_request("GET", f"/v1/jobs/{j}", host, auth) for j in ids]
        phases.append(
            await drive(
                srv,
                "get",
                args.reads,
                args.concurrency,
                args.max_seconds,
                lambda i: gets[(i * 7919) % len(gets)],
                lambda s, b, i: s == 200,
            )
        )

    if args.floor:  # the stack's floor: an empty route (no key, no database) through the same server and client
        livez = http_request("GET", "/livez", host)
        phases.append(
            await drive(
                srv, "livez", args.floor, args.concurrency, args.max_seconds, lambda i: livez, lambda s, b, i: s == 200
            )
        )

    page = http_request("GET", "/v1/jobs?limit=50", host, auth)
    phases.append(
        await drive(
            srv, "list", args.pages, args.concurrency, args.max_seconds, lambda i: page, lambda s, b, i: s == 200
        )
    )
    return phases, sent, job_of


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run the load on uvloop when it is installed (a cheaper event loop for the client too)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def check(url: str, sent: list[str], job_of: dict[str, str]) -> dict[str, Any]:
    """Exactly one job per key sent; no job for a key not sent (warm-up keys aside)."""
    per_key = count_jobs(url, sent)
    missing = [k for k in sent if per_key.get(k, 0) == 0]
    duplicated = [k for k, n in per_key.items() if n > 1]
    unexpected = [k for k in per_key if k not in set(sent) and not k.startswith("warm-")]
    unanswered = [k for k in sent if k not in job_of]
    return {
        "keys_sent": len(sent),
        "jobs_found": sum(per_key.get(k, 0) for k in sent),
        "missing": len(missing),
        "duplicated": len(duplicated),
        "unexpected": len(unexpected),
        "answered_without_201": len(unanswered),
        "ok": not missing and not duplicated and not unexpected,
    }


def bench_backend(backend: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    with database(backend) as url:
        t0 = time.perf_counter()
        secret = prepare(url)
        prep_s = time.perf_counter() - t0
        commit_ms = commit_latency_ms(url)
        with server(url, workers=args.workers, job_work=args.job_work, log_dir=log_dir) as srv:
            load_before = os.getloadavg()[0]
            phases, sent, job_of = run_async(run_load(srv, secret, args))
            load_after = os.getloadavg()[0]
        verdict = check(url, sent, job_of)
    return {
        "backend": backend,
        "workers": args.workers,
        "load_avg_1m": [round(load_before, 2), round(load_after, 2)],
        "job_work": args.job_work,
        "concurrency": args.concurrency,
        "prepare_s": round(prep_s, 2),
        "commit_latency_ms": commit_ms,
        "phases": {p.name: p.row() for p in phases},
        "integrity": verdict,
    }


def render(results: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="REST API load (loopback)")
    cols = ("backend", "workers", "endpoint", "requests", "errors", "req/s", "p50 ms", "p95 ms", "p99 ms")
    for col in (*cols, "server CPU", "server ms/req", "db ms/req", "client ms/req", "total ms/req", "2-core ceiling"):
        table.add_column(col, justify="right" if col not in ("backend", "endpoint") else "left")
    labels = {
        "submit": "POST /v1/jobs",
        "retry": "POST /v1/jobs (retry)",
        "get": "GET /v1/jobs/{id}",
        "list": "GET /v1/jobs?limit=50",
        "livez": "GET /livez (floor)",
    }
    for r in results:
        for name, p in r["phases"].items():
            table.add_row(
                r["backend"],
                str(r["workers"]),
                labels.get(name, name),
                str(p["requests"]),
                str(p["errors"]),
                f"{p['req_per_s']:.0f}",
                f"{p['p50_ms']:.1f}",
                f"{p['p95_ms']:.1f}",
                f"{p['p99_ms']:.1f}",
                f"{p['server_cpu_pct']:.0f}%",
                f"{p['server_cpu_ms_per_req']:.2f}",
                f"{p['db_cpu_ms_per_req']:.2f}",
                f"{p['client_cpu_ms_per_req']:.2f}",
                f"{p['total_cpu_ms_per_req']:.2f}",
                f"{p['ceiling_req_per_s_2_cores']}/s",
            )
    console = Console(width=220)
    console.print(table)
    for r in results:
        v = r["integrity"]
        console.print(
            f"{r['backend']}: {v['keys_sent']} keys sent, {v['jobs_found']} jobs, missing {v['missing']}, "
            f"duplicated {v['duplicated']}, unexpected {v['unexpected']}: {'OK' if v['ok'] else 'FAILED'}; "
            f"load average (1 min) {r['load_avg_1m'][0]} before, {r['load_avg_1m'][1]} after"
            + (
                f"; a commit alone (WAL flush) p50 {r['commit_latency_ms']['p50']} ms, "
                f"p99 {r['commit_latency_ms']['p99']} ms"
                if r["commit_latency_ms"]
                else ""
            )
        )
    console.print(
        f"targets (PostgreSQL): submit >= {TARGETS['submit']:.0f}/s, get >= {TARGETS['get']:.0f}/s, "
        f"p99 <= {P99_TARGET_MS:.0f} ms. server CPU = its processes' user+system time / wall (2 cores = 200%); "
        "ms/req = CPU ms per request of the server, its PostgreSQL backends, the load generator and their total; "
        "2-core ceiling = 2 cores / total (the rate with nothing else running on the machine)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="requests in flight (a closed loop: at a rate R the mean latency is concurrency / R, so 8 at 300/s "
        "is 27 ms; 16 doubles it)",
    )
    ap.add_argument("--requests", type=int, default=2000, help="submissions (each its own key)")
    ap.add_argument("--reads", type=int, default=5000, help="GET /v1/jobs/{id} requests")
    ap.add_argument("--pages", type=int, default=300, help="GET /v1/jobs?limit=50 requests")
    ap.add_argument("--floor", type=int, default=2000, help="GET /livez requests (the stack's floor; 0: none)")
    ap.add_argument("--retry-fraction", type=float, default=0.1, help="share of keys sent again (twice each)")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="wall-time cap per phase")
    ap.add_argument("--job-work", action="store_true", help="run the scheduler's job-side work (engine tick...)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = ap.parse_args(argv)

    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    results = []
    with tempfile.TemporaryDirectory(prefix="costopt-bench-logs-") as logs:
        for backend in backends:
            results.append(bench_backend(backend, args, Path(logs)))
    if args.json:
        print(json.dumps({"results": results}, indent=2))
    else:
        render(results)
    return 0 if all(r["integrity"]["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

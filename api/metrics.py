"""The service's Prometheus metrics: where they are declared, registered and rendered.

- :data:`REGISTRY` holds every metric of the process: the client library's process, platform and GC
  collectors, and the project's own metrics, declared below at module level on ``registry=REGISTRY``
  (add new ones here, e.g. job counters, so every exporter sees them and a name is declared once).
- :func:`render` is what ``GET /metrics`` answers: :data:`REGISTRY`, then the price sources' health
  read from the store at scrape time (``costopt_price_source_*``, one series per source that ever ran)
  and ``costopt_store_up`` (1 when the store answered; 0, and no source series, when it did not: the
  scrape itself still succeeds, like other exporters' ``*_up``); and the managed jobs
  (:class:`JobCollector`: ``costopt_jobs{state}``, ``costopt_job_events_total{kind}``,
  ``costopt_jobs_spend_usd_total``); and the leased fleets (:class:`FleetCollector`:
  ``costopt_fleets{state}``, ``costopt_fleet_instances{state}``, ``costopt_fleet_gpus{worker_type,state}``
  busy or idle, ``costopt_fleet_rounds_total``).
- The simulated clock, when the service runs one (:class:`SimClockCollector`, in :data:`REGISTRY`):
  ``costopt_sim_clock_lag_seconds`` (simulated seconds the clock is behind its time scale x wall time,
  from ticks capped at ``COSTOPT_SIM_MAX_TICK``) and ``costopt_sim_clock_capped_ticks_total``; absent on
  a real cloud.

Units follow Prometheus conventions: seconds, Unix timestamps in seconds (UTC), counts.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Gauge,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from pricing.store import PriceStore

log = logging.getLogger("costopt.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The Prometheus text exposition format (version 0.0.4)."""

REGISTRY = CollectorRegistry()
"""Every metric of the service process (not the client library's global default registry)."""

for _default in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    # The same collectors prometheus_client puts on its default registry (process_*, python_info, python_gc_*).
    REGISTRY.register(_default)

PRICE_COLLECTORS_ENABLED = Gauge(
    "costopt_price_collectors_enabled",
    "1 when price collectors of a cloud are scheduled in this process, 0 when none is (no credentials "
    "found at start: see the log); absent when COSTOPT_COLLECTORS_ENABLED=false.",
    ["cloud"],
    registry=REGISTRY,
)


class SimClockCollector(Collector):
    """How far behind the running simulated clock is (see the module doc); nothing when no driver runs.
    Reads :func:`api.sim_clock.running_drivers` only when that module is loaded (a real cloud never
    loads it)."""

    def collect(self) -> Iterator[Metric]:
        module = sys.modules.get("api.sim_clock")
        drivers = module.running_drivers() if module is not None else []
        if not drivers:
            return
        lag = GaugeMetricFamily(
            "costopt_sim_clock_lag_seconds",
            "Simulated seconds the simulated clock is behind COSTOPT_SIM_TIME_SCALE x the wall time since it "
            "started, because late ticks were capped at COSTOPT_SIM_MAX_TICK (0: never behind).",
        )
        lag.add_metric([], sum(d.lag.total_seconds() for d in drivers))
        yield lag
        yield CounterMetricFamily(
            "costopt_sim_clock_capped_ticks",
            "Ticks of the simulated clock cut to COSTOPT_SIM_MAX_TICK (each came late: a loaded machine).",
            value=float(sum(d.capped_ticks for d in drivers)),
        )


REGISTRY.register(SimClockCollector())


class PriceSourceCollector(Collector):
    """The health of every price source recorded in ``store`` (``source_status``), read at each scrape."""

    def __init__(self, store: PriceStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("costopt_store_up", "1 when the price store's database answered this scrape, else 0.")
        try:
            statuses = self.store.sources()
        except Exception as exc:  # any driver error: the scrape reports it instead of failing
            log.warning("metrics: the price store could not be read: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        success = GaugeMetricFamily(
            "costopt_price_source_last_success_timestamp_seconds",
            "When the source last fetched successfully (Unix time, UTC); absent if it never did.",
            labels=["source"],
        )
        attempt = GaugeMetricFamily(
            "costopt_price_source_last_attempt_timestamp_seconds",
            "When the source was last run (Unix time, UTC).",
            labels=["source"],
        )
        failures = GaugeMetricFamily(
            "costopt_price_source_consecutive_failures", "Failed runs in a row (0 after a success).", labels=["source"]
        )
        stale = GaugeMetricFamily(
            "costopt_price_source_stale",
            "1 when the source's last success is older than COSTOPT_STALE_AFTER (its prices leave live plans).",
            labels=["source"],
        )
        for s in statuses:
            if s.last_success_at is not None:
                success.add_metric([s.name], s.last_success_at.timestamp())
            if s.last_attempt_at is not None:
                attempt.add_metric([s.name], s.last_attempt_at.timestamp())
            failures.add_metric([s.name], float(s.consecutive_failures))
            stale.add_metric([s.name], 1.0 if s.stale else 0.0)
        yield from (success, attempt, failures, stale)


class JobCollector(Collector):
    """The managed jobs in ``store``'s database, read at each scrape: jobs by state
    (``costopt_jobs``), moves, preemptions and recoveries so far (``costopt_job_events_total{kind}``) and
    what every job has cost so far (``costopt_jobs_spend_usd_total``, from the ledger: closed intervals,
    open ones priced up to now, egress). Nothing is yielded when the database cannot be read."""

    def __init__(self, store: PriceStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        from datetime import UTC, datetime

        from prometheus_client.core import CounterMetricFamily
        from sqlalchemy import func, select

        from costopt.db.jobs_schema import job_events
        from costopt.jobs.records import JobRepository
        from costopt.jobs.view import MOVE_KINDS

        try:
            by_state = JobRepository(self.store.engine).count_by_state()
            with self.store.engine.connect() as conn:
                kinds: dict[str, int] = dict(
                    conn.execute(
                        select(job_events.c.kind, func.count())
                        .where(job_events.c.kind.in_(MOVE_KINDS))
                        .group_by(job_events.c.kind)
                    ).all()
                )
        except Exception as exc:  # any driver error: the scrape reports the rest
            log.warning("metrics: the jobs could not be read: %s", exc)
            return
        jobs = GaugeMetricFamily("costopt_jobs", "Managed jobs in each state.", labels=["state"])
        for state, n in by_state.items():
            jobs.add_metric([state.value], float(n))
        yield jobs
        events = CounterMetricFamily(
            "costopt_job_events", "Moves, preemptions and recoveries of managed jobs so far.", labels=["kind"]
        )
        for kind in MOVE_KINDS:
            events.add_metric([kind], float(kinds.get(kind, 0)))
        yield events
        try:
            from costopt.ledger.prices import StorePriceView
            from costopt.ledger.sql import SqlLedger

            spent = SqlLedger(self.store.engine, StorePriceView(self.store)).costs(as_of=datetime.now(UTC))
        except Exception as exc:  # an open interval without a price, or the ledger unreadable
            log.warning("metrics: the jobs' spend could not be priced: %s", exc)
            return
        yield CounterMetricFamily(
            "costopt_jobs_spend_usd",
            "USD every job has cost so far (the ledger's total).",
            value=float(spent.total_usd),
        )


class FleetCollector(Collector):
    """The leased fleets in ``store``'s database, read at each scrape: fleets by state
    (``costopt_fleets``), their instances by state (``costopt_fleet_instances``), the GPUs of the active
    fleets' running instances per worker type, ``busy`` (leased to a job by the round in force) or
    ``idle`` (``costopt_fleet_gpus``), and the rounds run so far (``costopt_fleet_rounds_total``). Nothing
    is yielded when the database cannot be read."""

    def __init__(self, store: PriceStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        import json

        from prometheus_client.core import CounterMetricFamily
        from sqlalchemy import and_, func, select

        from costopt.db.fleets_schema import fleet_instances, fleet_rounds, fleets
        from costopt.fleets.model import FleetState, InstanceState

        active = FleetState.ACTIVE.value
        try:
            with self.store.engine.connect() as conn:
                by_state: dict[str, int] = dict(
                    conn.execute(select(fleets.c.state, func.count()).group_by(fleets.c.state)).all()
                )
                inst_states: dict[str, int] = dict(
                    conn.execute(select(fleet_instances.c.state, func.count()).group_by(fleet_instances.c.state)).all()
                )
                live: dict[str, int] = dict(
                    conn.execute(
                        select(fleet_instances.c.accelerator, func.sum(fleet_instances.c.gpus))
                        .join(fleets, fleets.c.id == fleet_instances.c.fleet_id)
                        .where(fleets.c.state == active, fleet_instances.c.state == InstanceState.RUNNING.value)
                        .group_by(fleet_instances.c.accelerator)
                    ).all()
                )
                open_rounds = conn.execute(
                    select(fleet_rounds.c.assignment)
                    .join(fleets, and_(fleets.c.id == fleet_rounds.c.fleet_id, fleets.c.round == fleet_rounds.c.round))
                    .where(fleets.c.state == active, fleet_rounds.c.ended_at.is_(None))
                ).all()
                rounds = conn.execute(select(func.count()).select_from(fleet_rounds)).scalar_one()
        except Exception as exc:  # any driver error: the scrape reports the rest
            log.warning("metrics: the fleets could not be read: %s", exc)
            return
        busy: dict[str, int] = {}
        for (doc,) in open_rounds:
            for lease in json.loads(doc or "[]"):
                wtype = str(lease.get("type"))
                busy[wtype] = busy.get(wtype, 0) + len(lease.get("gpus") or ())
        family = GaugeMetricFamily("costopt_fleets", "Leased fleets in each state.", labels=["state"])
        for state in FleetState:
            family.add_metric([state.value], float(by_state.get(state.value, 0)))
        yield family
        family = GaugeMetricFamily("costopt_fleet_instances", "Fleet instances in each state.", labels=["state"])
        for inst_state in InstanceState:
            family.add_metric([inst_state.value], float(inst_states.get(inst_state.value, 0)))
        yield family
        gpus = GaugeMetricFamily(
            "costopt_fleet_gpus",
            "GPUs of the active fleets' running instances per worker type: busy (leased to a job by the round "
            "in force) or idle.",
            labels=["worker_type", "state"],
        )
        for wtype in sorted(set(live) | set(busy)):
            total = int(live.get(wtype) or 0)
            held = min(busy.get(wtype, 0), total)
            gpus.add_metric([wtype, "busy"], float(held))
            gpus.add_metric([wtype, "idle"], float(total - held))
        yield gpus
        yield CounterMetricFamily("costopt_fleet_rounds", "Fleet rounds started so far.", value=float(rounds))


def render(store: PriceStore | None = None) -> bytes:
    """The body of ``GET /metrics`` (text format, :data:`CONTENT_TYPE`): :data:`REGISTRY` and, when
    ``store`` is given, ``costopt_store_up`` and its sources' health. Never raises for a store error."""
    body = generate_latest(REGISTRY)
    if store is not None:
        per_scrape = CollectorRegistry(auto_describe=False)
        per_scrape.register(PriceSourceCollector(store))
        per_scrape.register(JobCollector(store))
        per_scrape.register(FleetCollector(store))
        body += generate_latest(per_scrape)
    return body

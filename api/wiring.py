"""The composition root: builds the store, the price sources, the seed and the cloud providers from the
settings.

Nothing below api/ reads settings; this module hands each component plain values. It imports nothing
else from api/ (the rest of api/ builds on it): what composes api/'s own services lives beside them
(the migration jobs: :func:`api.scheduler.build_migration_jobs`).
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from costopt.cloud import CloudProvider
from costopt.db.engine import make_engine, migrate
from costopt.domain import Cloud, OfferKey
from costopt.settings import Settings
from pricing.base import PriceSource
from pricing.store import PriceStore

if TYPE_CHECKING:
    from costopt.ledger.prices import PriceView
    from costopt.migration.unavailable import UnavailableOffers
    from costopt.planning.model import Assumptions
    from costopt.risk.hazard import HazardModel
    from costopt.throughput.catalog import ThroughputCatalog
    from costopt.throughput.model import Precision
    from costopt.throughput.registry import Measurement
    from providers.sim_agent import ThroughputFn

log = logging.getLogger("costopt.wiring")


def build_engine(settings: Settings, **kwargs: object) -> Engine:
    """An engine on ``settings.database_url`` with the settings' database bounds: every statement bounded
    by ``db_statement_timeout_s``, every wait for a PostgreSQL server's answer by ``db_answer_timeout_s``
    (:func:`costopt.db.engine.make_engine`). The service's store and the CLI's one-shot commands (``costopt
    db``, ``costopt admin --local``) use it; ``kwargs`` go to SQLAlchemy (e.g. the pool's size)."""
    return make_engine(
        settings.database_url,
        statement_timeout_s=settings.db_statement_timeout_s,
        answer_timeout_s=settings.db_answer_timeout_s,
        **kwargs,
    )


def build_store(settings: Settings, *, migrate_schema: bool = True) -> PriceStore:
    """The price store on ``settings.database_url``, migrated to the newest schema by default; its pool
    keeps ``db_pool_size`` connections (a connection opened and closed per request would cost PostgreSQL
    a new backend process each time); each statement is bounded by ``db_statement_timeout_s``
    (:func:`costopt.db.engine.make_engine`)."""
    url = settings.database_url
    in_memory = url.startswith("sqlite") and (url.rstrip("/") == "sqlite:" or ":memory:" in url)
    pool = {} if in_memory else {"pool_size": settings.db_pool_size, "max_overflow": settings.db_max_overflow}
    # an in-memory SQLite database is one connection: no pool to size
    engine = build_engine(settings, **pool)
    if migrate_schema:
        migrate(engine)
    from pricing.screen import ScreenRules

    return PriceStore(engine, stale_after=settings.stale_after, screen_rules=ScreenRules.from_settings(settings))


def build_sources(settings: Settings, names: Sequence[str] | None = None) -> list[PriceSource]:
    """The live collectors ``names`` (None: every configured one), from the registry
    :data:`pricing.sources.SOURCES`; see :func:`pricing.sources.build_sources` for the errors."""
    from pricing.sources import build_sources as build_registered

    return build_registered(settings, names)


def source_intervals(settings: Settings) -> dict[str, float]:
    """Collection interval of each registered source, in seconds (:func:`pricing.sources.source_intervals`)."""
    from pricing.sources import source_intervals as registered_intervals

    return registered_intervals(settings)


def seed_paths(settings: Settings) -> list[Path]:
    """What an empty store is seeded from: the curated list prices, and the real data when present."""
    from pricing.importer import seed_paths as import_seed_paths

    if settings.data_dir is None:
        return [settings.catalog_dir / "list_prices.csv"]
    return import_seed_paths(settings.data_dir, settings.catalog_dir)


def seed_catalog(store: PriceStore, settings: Settings) -> int:
    """Load the curated instance catalog (the collectors' API answers take precedence later)."""
    from pricing.catalog import INSTANCE_TYPES_FILE, load_instance_catalog

    known = {(t.cloud, t.name) for t in store.instance_types()}
    types = [
        t for t in load_instance_catalog(settings.catalog_dir / INSTANCE_TYPES_FILE) if (t.cloud, t.name) not in known
    ]
    return store.upsert_instance_types(types)


def seed_if_empty(store: PriceStore, settings: Settings) -> int:
    """Seed the catalog always (missing types only) and prices when the store holds none.
    Returns the number of change points inserted."""
    from pricing.importer import import_paths

    seed_catalog(store, settings)
    if store.count_points() > 0:
        return 0
    reports = import_paths(store, seed_paths(settings))
    inserted = sum(r.inserted for r in reports)
    failed = [r for r in reports if r.status in ("failed", "refused")]
    for r in failed:
        log.error("seeding from %s failed: %s", r.path, r.error)
    log.info("seeded the store with %d change points from %d files", inserted, len(reports))
    return inserted


def build_catalog(
    settings: Settings, engine: Engine | None = None, *, precision: Precision = "fp32", learnt: bool = True
) -> ThroughputCatalog:
    """The throughput catalog: the measurement file, users' and jobs' measurements from the
    database (when ``engine`` is given), and estimates for unmeasured GPUs (marked estimated), for
    jobs at ``precision`` (the file is at fp32; that precision's measurements are folded in, and the
    estimator keeps the file's cells only where they hold at it; see docs/throughput.md). ``learnt`` False:
    without what running jobs measured (``job:`` sources; users' registrations stay)."""
    from costopt.throughput.registry import JOB_SOURCE_PREFIX, MeasurementRegistry

    measurements = None
    if engine is not None:
        measurements = tuple(
            m for m in MeasurementRegistry(engine).all() if learnt or not m.source.startswith(JOB_SOURCE_PREFIX)
        )
    path = settings.resolved_throughput_file()
    stamp = None if path is None else _stamp(path)
    return _catalog_of(stamp, measurements, precision, settings.estimate_new_accelerators)


def _stamp(path: Path) -> tuple[str, int, int]:
    """(path, size, mtime in ns) of a file: what the per-process caches below are keyed on (a changed file is
    a new stamp)."""
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _catalog_of(
    stamp: tuple[str, int, int] | None,
    measurements: tuple[Measurement, ...] | None,
    precision: Precision,
    estimate: bool,
) -> ThroughputCatalog:
    """The catalog :func:`build_catalog` describes, built once per process for the same file (``stamp``),
    registered ``measurements`` (None: no database), precision and estimation setting: a service, a test's
    app or a simulated cloud built again over an unchanged registry shares it (the estimator's fit is
    ~0.5 s of CPU). Catalogs are read-only, so sharing one is safe."""
    from costopt.throughput.catalog import ThroughputCatalog
    from costopt.throughput.estimate import estimate_catalog, load_accelerator_specs
    from costopt.throughput.loaders import load_throughput_file
    from costopt.throughput.registry import fold_measurements

    catalog = (
        ThroughputCatalog.from_measurements(load_throughput_file(Path(stamp[0])))
        if stamp is not None
        else ThroughputCatalog()
    )
    if measurements is not None:
        catalog = fold_measurements(catalog, measurements, precision)
    if estimate:
        catalog = estimate_catalog(catalog, load_accelerator_specs(), precision=precision)
    return catalog


def build_hazards(settings: Settings) -> HazardModel:
    """Preemption hazards estimated from the availability logs (documented defaults without them)."""
    from costopt.risk.hazard import HazardModel

    logs = settings.resolved_availability_logs()
    if logs is None or not logs.is_dir():
        return HazardModel()
    files = sorted(logs.glob("*/availability/*.out"))
    return _hazards_of(tuple(_stamp(p) for p in files))


@functools.lru_cache(maxsize=4)
def _hazards_of(stamp: tuple[tuple[str, int, int], ...]) -> HazardModel:
    """The hazards of the logs ``stamp`` names (path, size, mtime in ns): parsed once per process while the
    files are unchanged (a changed file is a new stamp). The model is frozen and shared by its callers."""
    from costopt.risk.availability import load_availability_logs
    from costopt.risk.hazard import HazardModel

    lifetimes, _ = load_availability_logs(Path(path) for path, _, _ in stamp)
    return HazardModel.from_lifetimes(lifetimes)


def build_sim_hazards(settings: Settings) -> HazardModel:
    """The simulated cloud's reclaim rates: ``COSTOPT_SIM_SPOT_HAZARD_PER_HOUR`` for every spot offer when set
    (the same rate per offer, whatever its zone or shape), else :func:`build_hazards`'s (the planner's)."""
    from costopt.domain import Cloud
    from costopt.risk.hazard import HazardModel

    rate = settings.sim_spot_hazard_per_hour
    if rate is None:
        return build_hazards(settings)
    return HazardModel(defaults=dict.fromkeys(Cloud, rate))


def build_assumptions(settings: Settings) -> Assumptions:
    from costopt.planning.model import Assumptions

    return Assumptions(
        checkpoint_interval_hours=settings.checkpoint_interval.total_seconds() / 3600,
        restart_hours=settings.restart_time.total_seconds() / 3600,
    )


def build_cloud_provider(
    settings: Settings, store: PriceStore | None = None, *, name: str | None = None
) -> CloudProvider:
    """The cloud provider ``name`` (None: ``settings.provider``; any case) from the settings; the simulated
    cloud runs over ``store``'s prices (None: :func:`build_store`) and the availability logs' hazards.
    An unknown name raises :class:`providers.factory.UnknownProvider` listing the known ones."""
    from providers.factory import PROVIDERS, build_provider

    chosen = PROVIDERS.canonical(name or settings.provider)
    if chosen != "sim":
        return build_provider(settings, name=chosen)
    from costopt.ledger.prices import StorePriceView

    if store is None:
        store = build_store(settings)
    with _SIM_LOCK:
        shared = _SIM_CLOUDS.get(store)
        if shared is None:
            prices = StorePriceView(store)
            shared = build_provider(
                settings,
                name="sim",
                prices=prices,
                hazards=build_sim_hazards(settings),
                overrides={"rate": build_sim_throughput(settings, prices, store.engine)},
            )
            _SIM_CLOUDS[store] = shared
        return shared


_SIM_CLOUDS: weakref.WeakKeyDictionary[PriceStore, CloudProvider] = weakref.WeakKeyDictionary()
"""The simulated cloud of each price store: one per store in a process (it is a world of its own: two
objects would be two clouds, and the job engine, the migrators and the job's output must see the same)."""
_SIM_LOCK = threading.Lock()


def build_sim_throughput(settings: Settings, prices: PriceView, engine: Engine | None = None) -> ThroughputFn:
    """The simulated agents' throughput (``rate(job_type, gpus, offer, precision)``, steps/s): the throughput
    catalog's cell at the job's precision for the job type on the offer's accelerator (from ``prices``'
    instance shapes) and GPU count; None when the catalog has no such cell (the launch is then refused,
    naming ``COSTOPT_STEPS_PER_SECOND``). Each precision's catalog (:func:`build_catalog`) is loaded at the
    first launch that needs it, without what the service learnt from running jobs (``learnt=False``): the
    simulated hardware's speed is not the service's belief about it. (With them, a restarted service loaded
    the measurements its jobs had taken on this very cloud, so its simulated GPUs ran at a speed that depended
    on when the process started: the kill drill's jobs trained 1.7% slower after the kills than in its runs
    without kills.)"""
    from costopt.throughput.model import PRECISIONS, check_precision

    catalogs: dict[Precision, ThroughputCatalog] = {}

    def rate(job_type: str, gpus: int, offer: OfferKey, precision: str = "fp32") -> float | None:
        shape = prices.shape(offer)
        if shape is None or precision not in PRECISIONS:
            return None
        at = check_precision(precision)
        if at not in catalogs:
            catalogs[at] = build_catalog(settings, engine, precision=at, learnt=False)
        try:
            cell = catalogs[at].get(job_type, shape[0], gpus)
        except ValueError:  # not a job type's name
            return None
        return None if cell is None or cell.steps_per_s <= 0 else cell.steps_per_s

    return rate


def build_cloud_providers(settings: Settings, store: PriceStore | None = None) -> dict[Cloud, CloudProvider]:
    """Every provider the service uses (``settings.provider``, then ``settings.providers``), by cloud: what
    the reconciler sweeps. The simulated cloud, when used, runs over ``store``'s prices."""
    return {Cloud(name): build_cloud_provider(settings, store, name=name) for name in settings.all_providers()}


def build_unavailable(settings: Settings, engine: Engine) -> UnavailableOffers:
    """The unavailable-offers cache on ``engine`` with the settings' times to live."""
    from costopt.migration.unavailable import REASON_CAPACITY, REASON_PREEMPTED, REASON_QUOTA, UnavailableOffers

    return UnavailableOffers(
        engine,
        ttl={
            REASON_PREEMPTED: settings.unavailable_ttl_preempted,
            REASON_CAPACITY: settings.unavailable_ttl_capacity,
            REASON_QUOTA: settings.unavailable_ttl_quota,
        },
    )

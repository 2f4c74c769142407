"""``costopt drill`` put together: the clouds, database and working directory of a drill, around the
engine of :mod:`costopt.migration.drill` (which works on protocols only).

- ``local``: the script's copies are processes of :class:`providers.local.LocalProvider`; preemptions
  are forced (a notice of ``notice_seconds``, then a kill).
- ``sim``: the same processes behind a :class:`~costopt.migration.drill.SimulatedMarket` over
  :class:`providers.sim.SimCloud` (:func:`build_market`): seeded Poisson reclaims per offer, each
  cloud's notice scaled down, launches refused for lack of capacity.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from costopt.domain import Cloud, OfferKey
from costopt.migration.drill import (
    DEFAULT_COMMAND,
    LOCAL_OFFERS,
    PROVIDERS,
    SIM_OFFERS,
    DrillError,
    DrillOptions,
    DrillReport,
    ProcessCloud,
    SimulatedMarket,
    check_market,
    parse_command,
    run_drill,
    steps_in,
)
from costopt.settings import PROJECT_ROOT

__all__ = ["build_market", "drill"]


def build_market(
    local: ProcessCloud,
    offers: Sequence[OfferKey] = SIM_OFFERS,
    *,
    seed: int = 0,
    time_scale: float = 60.0,
    preemption_every: float = 2.0,
    launch_failure: float = 0.2,
    max_preemptions: int | None = None,
    notice_lead: Mapping[Cloud, timedelta] | None = None,
    tick_seconds: float = 0.02,
    wall: Callable[[], float] = time.time,
) -> SimulatedMarket:
    """A simulated market over ``local``'s processes, started now (its thread runs until ``close()``).

    The simulated cloud prices every offer at 1 USD/h (prices play no part in a drill); each spot offer
    has a seeded Poisson process of reclaims with a mean of ``preemption_every`` wall seconds (the
    same rate for every cloud); its notices are each cloud's (``notice_lead``, default
    ``providers.sim.DEFAULT_NOTICE_LEAD``: AWS 2 min, GCP and Azure 30 s) in simulated time, so
    ``time_scale`` times shorter in wall time; a launch finds no capacity with probability
    ``launch_failure`` (seeded, per offer). :class:`~costopt.migration.drill.DrillError` for values
    out of range.
    """
    import numpy as np

    from costopt.ledger.prices import StepPrices
    from costopt.risk.hazard import HazardModel
    from providers.sim import DEFAULT_NOTICE_LEAD, SimClock, SimCloud, SimConfig

    check_market(time_scale, preemption_every, launch_failure)
    offers = list(offers)
    clock = SimClock(datetime.fromtimestamp(wall(), UTC))
    n = len(offers)
    prices = StepPrices(offers, [np.zeros(1, dtype=np.int64)] * n, [np.ones(1, dtype=np.float64)] * n, {})
    rate = 3600.0 / (preemption_every * time_scale)  # reclaims per simulated offer-hour
    config = SimConfig(
        notice_lead=dict(notice_lead if notice_lead is not None else DEFAULT_NOTICE_LEAD),
        default_launch_failure=launch_failure,
    )
    sim = SimCloud(prices, HazardModel(defaults=dict.fromkeys(Cloud, rate)), clock=clock, seed=seed, config=config)
    return SimulatedMarket(
        local, sim, clock, time_scale=time_scale, max_preemptions=max_preemptions, tick_seconds=tick_seconds, wall=wall
    )


def drill(
    command: str | Sequence[str] | None = None,
    moves: int = 5,
    preemptions: int = 5,
    provider: str = "local",
    *,
    steps: int | None = None,
    workdir: str | Path | None = None,
    cwd: str | Path | None = None,
    seed: int = 0,
    notice_seconds: float = 3.0,
    time_scale: float = 60.0,
    preemption_every: float = 2.0,
    launch_failure: float = 0.2,
    gap_steps: int = 5,
    timeout: float = 600.0,
    event_timeout: float = 60.0,
    unavailable_seconds: float = 2.0,
    max_failed_recoveries: int = 5,
) -> DrillReport:
    """Run ``command`` (default: the example script) through ``moves`` forced migrations and
    ``preemptions`` preemptions on ``provider`` (``local`` or ``sim``: the module docstring), then audit
    it (:func:`costopt.migration.drill.run_drill`).

    - ``steps``: the steps the script asks for (default: its ``--steps``);
    - ``workdir``: where the database, checkpoints and instances live (default: a temporary directory,
      removed afterwards);
    - ``cwd``: the script's working directory (default: the repository root);
    - ``seed``: the simulated market's seed (``sim``: preemption times, capacity failures);
    - ``notice_seconds``: ``local``: the notice given before a forced preemption;
    - ``time_scale``, ``preemption_every``, ``launch_failure``: ``sim``: simulated seconds per second,
      mean seconds between reclaims of one offer, probability that a launch finds no capacity;
    - the rest: :class:`~costopt.migration.drill.DrillOptions`.

    Raises :class:`~costopt.migration.drill.DrillError` for arguments it cannot run with, before
    anything starts.
    """
    from costopt.db.engine import make_engine, migrate
    from providers.local import LocalProvider

    if provider not in PROVIDERS:
        raise DrillError(f"unknown provider {provider!r}: choose one of {', '.join(PROVIDERS)}")
    check_market(time_scale, preemption_every, launch_failure)
    options = DrillOptions(
        moves=moves,
        preemptions=preemptions,
        notice_seconds=notice_seconds,
        gap_steps=gap_steps,
        timeout=timeout,
        event_timeout=event_timeout,
        unavailable_seconds=unavailable_seconds,
        max_failed_recoveries=max_failed_recoveries,
        seed=seed,
    )
    argv = parse_command(command or DEFAULT_COMMAND)
    options = replace(options, steps=steps if steps is not None else steps_in(argv))
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="costopt-drill-")
        workdir = tmp.name
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    engine = make_engine(f"sqlite:///{root / 'drill.db'}")
    local: LocalProvider | None = None
    market: SimulatedMarket | None = None
    try:
        migrate(engine)
        local = LocalProvider(root / "instances", cwd=cwd or PROJECT_ROOT, grace_seconds=5.0)
        offers: tuple[OfferKey, ...] = LOCAL_OFFERS
        if provider == "sim":
            market = build_market(
                local,
                SIM_OFFERS,
                seed=seed,
                time_scale=time_scale,
                preemption_every=preemption_every,
                launch_failure=launch_failure,
                max_preemptions=preemptions,
            )
            offers = SIM_OFFERS
        return run_drill(argv, local, engine, root / "checkpoints", options, market=market, offers=offers)
    finally:
        if market is not None:
            market.close()
        if local is not None:
            local.close()
        engine.dispose()
        if tmp is not None:
            tmp.cleanup()

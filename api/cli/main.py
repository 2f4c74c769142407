"""The ``costopt`` command line: one app, verbs grouped by resource."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from api.cli import admin as admin_cmd
from api.cli import backtest as backtest_cmd
from api.cli import catalog as catalog_cmd
from api.cli import demo as demo_cmd
from api.cli import drill as drill_cmd
from api.cli import fleets as fleets_cmd
from api.cli import gavel as gavel_cmd
from api.cli import jobs as jobs_cmd
from api.cli import plan as plan_cmd
from api.cli import plan_batch as plan_batch_cmd
from api.cli import prices as prices_cmd
from api.cli import rebalance as rebalance_cmd
from api.cli import report as report_cmd
from api.cli import throughput as throughput_cmd
from api.cli.common import Exit, configure_logging, failures, settings_with
from api.cli.output import OutputFormat, emit_object, note

if TYPE_CHECKING:
    from costopt.settings import Settings

app = typer.Typer(
    name="costopt",
    help="Cross-cloud spot-market cost optimizer for ML training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(prices_cmd.app, name="prices")
app.add_typer(catalog_cmd.app, name="catalog")
app.add_typer(throughput_cmd.app, name="throughput")
app.add_typer(backtest_cmd.app, name="backtest")
app.add_typer(gavel_cmd.app, name="gavel")
app.add_typer(jobs_cmd.app, name="jobs")
app.add_typer(fleets_cmd.app, name="fleets")
app.add_typer(admin_cmd.app, name="admin")
app.add_typer(report_cmd.app, name="report")
app.command("plan")(plan_cmd.plan)
app.command("plan-batch")(plan_batch_cmd.plan_batch)
app.command("drill")(drill_cmd.drill)
app.command("rebalance")(rebalance_cmd.rebalance)
app.command("demo")(demo_cmd.demo)
db_app = typer.Typer(help="The database: migrations and status.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug details to stderr.")] = False,
) -> None:
    configure_logging(verbose)


def _demo_if_empty(settings: Settings) -> None:
    """COSTOPT_DEMO_ON_EMPTY: fill a database without jobs with the demo month before serving."""
    from api.demo import DatabaseNotEmpty, fill_demo

    note("COSTOPT_DEMO_ON_EMPTY: a database without jobs is filled with the demo month first (about 2 minutes)")
    with failures():
        try:
            result = fill_demo(settings)
        except DatabaseNotEmpty:
            note("COSTOPT_DEMO_ON_EMPTY: the database has jobs already; no demo")
            return
    note(f"demo: {result.submitted} jobs of {len(result.teams)} teams in {result.wall_seconds:.0f} s")


@app.command("serve")
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default from COSTOPT_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default from COSTOPT_API_PORT).")] = None,
    collect: Annotated[bool, typer.Option(help="Run the price collectors on their schedule.")] = True,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Worker processes (PostgreSQL and real clouds only: each is a replica, every scheduled job "
            "runs once per tick across them; SQLite and the simulated cloud serve from one process).",
        ),
    ] = 1,
) -> None:
    """Run the REST service (migrates and seeds the store first)."""
    import uvicorn

    settings = settings_with()
    if not collect:
        settings = settings.model_copy(update={"collectors_enabled": False})
    if settings.demo_on_empty:
        _demo_if_empty(settings)
    if workers == 1:
        from api.app import create_app

        if settings.worker_max_rss_mb is not None:
            note(
                "warning: COSTOPT_WORKER_MAX_RSS_MB is ignored by one process (nothing would take its place): "
                "recycling needs --workers 2 or more"
            )
        with failures():
            application = create_app(settings)
        uvicorn.run(application, host=host or settings.api_host, port=port or settings.api_port, log_level="info")
        return
    if not settings.database_url.startswith("postgresql"):
        raise typer.BadParameter(
            "SQLite serves from one process (one writer): set COSTOPT_DATABASE_URL=postgresql+psycopg://... "
            "for more workers, or drop --workers",
            param_hint="--workers",
        )
    if "sim" in settings.all_providers():
        raise typer.BadParameter(
            "the simulated cloud lives inside one process (each worker would run its own): use --workers 1 "
            "with COSTOPT_PROVIDER=sim",
            param_hint="--workers",
        )
    with failures():
        _prepare_replicas(settings)
    if not collect:  # the workers read their settings from the environment
        os.environ["COSTOPT_COLLECTORS_ENABLED"] = "false"
    from api.replicas import serve as serve_replicas

    # a listening socket per worker (SO_REUSEPORT): connections opened together spread over the workers
    bind_host, bind_port = host or settings.api_host, port or settings.api_port
    serve_replicas(
        "api.app:create_app", workers=workers, host=bind_host, port=bind_port, max_rss_mb=settings.worker_max_rss_mb
    )


def _prepare_replicas(settings: Settings) -> None:
    """Before the workers start: migrate and seed the store and make the first admin key (shown once
    here), so that no two workers race to do it."""
    from api.wiring import build_store, seed_if_empty
    from costopt.jobs.teams import TeamRepository

    store = build_store(settings)
    try:
        if settings.seed_on_start:
            seed_if_empty(store, settings)
        issued = TeamRepository(store.engine).bootstrap_admin()
        if issued is not None:
            sys.stdout.write(f"costopt: admin key (shown once): {issued.secret}\n")
            sys.stdout.flush()
    finally:
        store.engine.dispose()


@db_app.command("migrate")
def db_migrate() -> None:
    """Bring the database schema to the newest migration (idempotent)."""
    from api.wiring import build_engine
    from costopt.db.engine import current_revision, migrate

    settings = settings_with()
    with failures():
        engine = build_engine(settings)
        migrate(engine)
        note(f"database at revision {current_revision(engine)} ({engine.url.render_as_string()})")


@db_app.command("status")
def db_status(fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table) -> None:
    """Where the database is, its schema revision, and what it holds."""
    from api.wiring import build_engine
    from costopt.db.engine import current_revision, head_revision

    settings = settings_with()
    with failures():
        engine = build_engine(settings)
        rev = current_revision(engine)
        info: dict[str, object] = {
            "database_url": engine.url.render_as_string(hide_password=True),
            "revision": rev,
            "head": head_revision(),
            "migrated": rev == head_revision(),
        }
        if rev == head_revision():
            from pricing.store import PriceStore

            store = PriceStore(engine)
            info["offers"] = store.count_offers()
            info["price_points"] = store.count_points()
    emit_object(info, fmt, title="Database")
    if rev != head_revision():
        raise typer.Exit(Exit.FAILED)


if __name__ == "__main__":
    app()

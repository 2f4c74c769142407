"""``costopt prices ...``: latest, history, sources, import, collect, seed."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import Exit, failures, parse_time, settings_with
from api.cli.output import OutputFormat, emit, note
from costopt.domain import Cloud, Market

app = typer.Typer(
    help="Cloud GPU prices: query the store, import recorded data, run the collectors.", no_args_is_help=True
)

FormatOpt = Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")]
DataDirOpt = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Real data folder (default: ../shared/data); seeds an empty store from it."),
]

OFFER_COLUMNS: list[tuple[str, str, str | None]] = [
    ("cloud", "cloud", None),
    ("region", "region", None),
    ("zone", "zone", None),
    ("instance_type", "instance type", None),
    ("market", "market", None),
    ("accelerator", "GPU", None),
    ("gpu_count", "GPUs", "count"),
    ("usd_per_hour", "price", "USD/h"),
    ("usd_per_gpu_hour", "per GPU", "USD/h"),
    ("valid_from", "since (UTC)", None),
]


@app.command("latest")
def latest(
    cloud: Annotated[Cloud | None, typer.Option(help="Only this cloud.")] = None,
    region: Annotated[str | None, typer.Option(help="Only this region, e.g. us-east-1.")] = None,
    gpu: Annotated[str | None, typer.Option(help="Only this accelerator, e.g. v100, a100, h100.")] = None,
    market: Annotated[Market | None, typer.Option(help="spot or on_demand.")] = None,
    at: Annotated[str | None, typer.Option(help="ISO 8601 time (UTC if no offset): prices in effect then.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many offers.")] = None,
    include_stale: Annotated[bool, typer.Option(help="Include offers not confirmed recently.")] = False,
    data_dir: DataDirOpt = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Offers in effect now (or at --at), cheapest first, in USD per instance-hour."""
    from api.queries import latest_prices, offer_record
    from api.wiring import build_store, seed_if_empty

    when = parse_time(at, "--at")
    settings = settings_with(data_dir)
    with failures():
        store = build_store(settings)
        if data_dir is not None:
            seed_if_empty(store, settings)
        result = latest_prices(
            store,
            settings,
            cloud=cloud,
            region=region,
            gpu=gpu,
            market=market,
            at=when,
            include_stale=include_stale,
            limit=limit,
        )
    rows = [offer_record(o) for o in result.offers]
    if fmt is OutputFormat.table:
        mode = "as asked" if result.explicit else result.now.mode
        note(f"prices in effect at {result.now.at:%Y-%m-%d %H:%M:%S} UTC ({mode}); {len(rows)} offers")
    emit(rows, OFFER_COLUMNS, fmt, title="Offers, cheapest first")
    if not rows:
        if fmt is OutputFormat.table:
            note("no offer matches (try --include-stale, another --at, or `costopt prices sources`)")
        raise typer.Exit(Exit.NOT_FOUND)


@app.command("history")
def history(
    cloud: Annotated[Cloud | None, typer.Option(help="Only this cloud.")] = None,
    region: Annotated[str | None, typer.Option(help="Only this region.")] = None,
    zone: Annotated[str | None, typer.Option(help="Only this zone ('' for regional prices).")] = None,
    instance_type: Annotated[str | None, typer.Option("--instance-type", help="Only this instance type.")] = None,
    market: Annotated[Market | None, typer.Option(help="spot or on_demand.")] = None,
    start: Annotated[str | None, typer.Option("--from", help="Start, ISO 8601 (default: 30 days before --to).")] = None,
    end: Annotated[str | None, typer.Option("--to", help="End, ISO 8601 (default: now).")] = None,
    data_dir: DataDirOpt = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Price changes over a time range (each price holds until the next row of the same offer)."""
    from api.wiring import build_store, seed_if_empty

    end_t = parse_time(end, "--to") or datetime.now(UTC)
    start_t = parse_time(start, "--from") or end_t - timedelta(days=30)
    if start_t > end_t:
        raise typer.BadParameter("--from is after --to", param_hint="--from")
    settings = settings_with(data_dir)
    with failures():
        store = build_store(settings)
        if data_dir is not None:
            seed_if_empty(store, settings)
        points = store.history_points(
            start_t, end_t, cloud=cloud, region=region, zone=zone, instance_type=instance_type, market=market
        )
    rows = [
        {
            "cloud": p.key.cloud.value,
            "region": p.key.region,
            "zone": p.key.zone,
            "instance_type": p.key.instance_type,
            "market": p.key.market.value,
            "valid_from": p.valid_from.isoformat().replace("+00:00", "Z"),
            "usd_per_hour": p.usd_per_hour,
            "source": p.source,
        }
        for p in points
    ]
    emit(
        rows,
        [
            ("cloud", "cloud", None),
            ("region", "region", None),
            ("zone", "zone", None),
            ("instance_type", "instance type", None),
            ("market", "market", None),
            ("valid_from", "from (UTC)", None),
            ("usd_per_hour", "price", "USD/h"),
            ("source", "source", None),
        ],
        fmt,
        title=f"Price changes {start_t:%Y-%m-%d %H:%M} .. {end_t:%Y-%m-%d %H:%M} UTC",
    )
    if not rows:
        raise typer.Exit(Exit.NOT_FOUND)


@app.command("sources")
def sources(fmt: FormatOpt = OutputFormat.table) -> None:
    """Health of each price source: last success, staleness, errors, and rejections (bad records and pages
    refused, ever; the newest reason). Imported files count under ``import:<kind>``."""
    from api.wiring import build_store

    settings = settings_with()
    with failures():
        store = build_store(settings)
        statuses = store.sources()
    rows = [
        {
            "name": s.name,
            "last_success_at": s.last_success_at.isoformat().replace("+00:00", "Z") if s.last_success_at else None,
            "last_attempt_at": s.last_attempt_at.isoformat().replace("+00:00", "Z") if s.last_attempt_at else None,
            "stale": s.stale,
            "consecutive_failures": s.consecutive_failures,
            "last_points": s.last_points,
            "last_bad_records": s.last_bad_records,
            "total_bad_records": s.total_bad_records,
            "last_refused_pages": s.last_refused_pages,
            "total_refused_pages": s.total_refused_pages,
            "last_partial": s.last_partial,
            "last_error": s.last_error,
            "last_rejection": s.last_rejection,
            "last_rejection_at": s.last_rejection_at.isoformat().replace("+00:00", "Z")
            if s.last_rejection_at
            else None,
        }
        for s in statuses
    ]
    emit(
        rows,
        [
            ("name", "source", None),
            ("last_success_at", "last success (UTC)", None),
            ("stale", "stale", None),
            ("consecutive_failures", "failures in a row", None),
            ("last_points", "points", None),
            ("last_bad_records", "bad records", None),
            ("total_bad_records", "bad ever", None),
            ("total_refused_pages", "pages refused ever", None),
            ("last_partial", "partial", None),
            ("last_error", "last error", None),
            ("last_rejection", "last rejection", None),
        ],
        fmt,
        title="Price sources",
    )


@app.command("import")
def import_(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders of recorded prices.", exists=True)],
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Load recorded prices (AWS spot pages, Azure sheets, normalized CSVs, list prices).

    All-or-nothing per file: a malformed file or one with a bad record stores nothing and makes the
    command exit 1 (3 when other files were imported)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from api.wiring import build_store
    from pricing.importer import ImportReport, import_paths

    settings = settings_with()
    reports: list[ImportReport] = []
    with failures():
        store = build_store(settings)
        started = time.perf_counter()
        with Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=True,
            disable=fmt is not OutputFormat.table,
        ) as progress:
            task = progress.add_task("importing", total=None)

            def tick(report: ImportReport) -> None:
                reports.append(report)
                progress.update(task, advance=1, description=f"importing {report.path.name}")

            import_paths(store, paths, progress=tick)
        elapsed = time.perf_counter() - started
    rows = [
        {
            "path": str(r.path),
            "kind": r.kind,
            "status": r.status,
            "points_read": r.points_read,
            "inserted": r.inserted,
            "unchanged": r.unchanged,
            "skipped_records": r.skipped_records,
            "error": r.error,
        }
        for r in reports
    ]
    emit(
        rows,
        [
            ("path", "file", None),
            ("kind", "kind", None),
            ("status", "status", None),
            ("points_read", "points", None),
            ("inserted", "new", None),
            ("unchanged", "unchanged", None),
            ("skipped_records", "skipped", None),
            ("error", "error", None),
        ],
        fmt,
        title="Import",
    )
    failed = [r for r in reports if r.status in ("failed", "refused")]
    ok = [r for r in reports if r.status in ("imported", "partial")]
    if fmt is OutputFormat.table:
        note(
            f"{len(ok)} file(s) imported, {len(failed)} failed, {sum(r.inserted for r in reports):,} new change "
            f"points in {elapsed:.1f} s"
        )
    for r in failed:
        note(f"[red]error:[/red] {r.path}: {r.error}")
    if failed:
        raise typer.Exit(Exit.PARTIAL if ok else Exit.FAILED)


@app.command("seed")
def seed(data_dir: DataDirOpt = None) -> None:
    """Seed the instance catalog, and an empty store from the real data and the curated list prices."""
    from api.wiring import build_store, seed_if_empty

    settings = settings_with(data_dir)
    with failures():
        store = build_store(settings)
        inserted = seed_if_empty(store, settings)
    note(f"seeded: {inserted:,} new change points; store holds {store.count_points():,}")


@app.command("collect")
def collect(
    source: Annotated[
        list[str] | None,
        typer.Option(
            "--source",
            help="Only these sources (repeatable). Default: every configured source whose cloud has credentials.",
        ),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Run each source once and exit.")] = False,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Run the live collectors (once, or on their schedule until interrupted)."""
    from api.credentials import collector_names
    from api.wiring import build_sources, build_store
    from pricing.collect import collect_once

    settings = settings_with()
    with failures():
        store = build_store(settings)
        try:
            # without --source, a cloud without credentials is skipped and said once (as by the service)
            sources_ = build_sources(settings, source if source is not None else collector_names(settings))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--source") from exc
        if not once:
            from api.scheduler import run_forever

            run_forever(store, sources_, settings)
            return
        outcomes = collect_once(store, sources_)
    rows = [
        {
            "source": o.source,
            "ok": o.ok,
            "points": o.points,
            "inserted": o.inserted,
            "bad_records": o.bad_records,
            "skipped": o.skipped,
            "partial": o.partial,
            "seconds": round(o.seconds, 2),
            "error": o.error,
        }
        for o in outcomes
    ]
    emit(
        rows,
        [
            ("source", "source", None),
            ("ok", "ok", None),
            ("points", "points", None),
            ("inserted", "new", None),
            ("bad_records", "bad", None),
            ("skipped", "skipped", None),
            ("partial", "partial", None),
            ("seconds", "time", "s"),
            ("error", "error", None),
        ],
        fmt,
        title="Collection",
    )
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise typer.Exit(Exit.PARTIAL if len(failed) < len(outcomes) else Exit.FAILED)

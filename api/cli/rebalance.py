"""``costopt rebalance --once [--dry-run]``: one rebalancer pass in this process.

The pass runs against the configured database and providers (the job service as the service builds it:
:func:`api.service.build_job_service`), under the same ``rebalance`` lease as the service's scheduled
passes: when the service is running its pass right now, this command says so and exits 0 with nothing
done (run it again a moment later). It prints every running job's verdict: the move made (or proposed,
with ``--dry-run``) with the saving it expects, or why the job stays. Exit codes: 0 done (also nothing
to do), 1 the pass could not run (database or providers unreachable, bad settings), 2 bad arguments,
3 at least one job failed (its move failed, or deciding it did).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from api.cli.common import Exit
from api.cli.output import OutputFormat, emit, note

COLUMNS: list[tuple[str, str, str | None]] = [
    ("job_id", "job", None),
    ("team_id", "team", None),
    ("outcome", "outcome", None),
    ("from_offer", "from", None),
    ("from_usd_per_hour", "from price", "USD/h"),
    ("to_offer", "to", None),
    ("to_usd_per_hour", "to price", "USD/h"),
    ("net_saving_usd", "expected saving", "USD"),
    ("move_cost_usd", "move cost", "USD"),
    ("margin_usd", "margin", "USD"),
    ("reason", "why", None),
]


def _money(value: Any) -> float | str | None:
    return None if value is None else float(value)


def report_rows(report: Any, fmt: OutputFormat) -> list[dict[str, Any]]:
    """One row per job of a :class:`costopt.jobs.rebalance.RebalanceReport` (money as decimal strings in
    JSON and CSV, numbers in the table)."""
    rows = []
    for item in report.items:
        money = {
            "net_saving_usd": item.net_saving_usd,
            "saving_usd": item.saving_usd,
            "move_cost_usd": item.move_cost_usd,
            "margin_usd": item.margin_usd,
        }
        rows.append(
            {
                "job_id": item.job_id,
                "team_id": item.team_id,
                "outcome": item.outcome.value,
                "from_offer": str(item.from_offer) if item.from_offer else None,
                "from_usd_per_hour": item.from_usd_per_hour,
                "to_offer": str(item.to_offer) if item.to_offer else None,
                "to_usd_per_hour": item.to_usd_per_hour,
                **{
                    k: (_money(v) if fmt is OutputFormat.table else (None if v is None else str(v)))
                    for k, v in money.items()
                },
                "reason": item.reason,
                "at": report.at.isoformat(),
            }
        )
    return rows


def rebalance(
    once: Annotated[
        bool, typer.Option("--once", help="Run one pass now (the service runs them on COSTOPT_REBALANCE_CRON).")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would move; change nothing.")] = False,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")] = OutputFormat.table,
) -> None:
    """Move running jobs where the decision rule says it pays (one pass), or say why they stay."""
    if not once:
        raise typer.BadParameter(
            "only one pass at a time is run from the command line: add --once (the service schedules the "
            "passes on COSTOPT_REBALANCE_CRON)",
            param_hint="--once",
        )
    from api.cli.common import settings_with
    from costopt.errors import CostoptError

    settings = settings_with()
    try:
        outcome = _run(settings, dry_run=dry_run)
    except (CostoptError, OSError, ValueError) as exc:
        note(f"[red]error:[/red] the rebalancer pass could not run: {exc}")
        raise typer.Exit(Exit.FAILED) from exc
    if outcome.report is None:
        busy = outcome.busy
        who = (
            f" (held by {busy.owner} until {busy.expires_at:%Y-%m-%d %H:%M:%S} UTC)" if busy and busy.expires_at else ""
        )
        note(f"the service is running a rebalance pass right now{who}: nothing done; run this again in a moment")
        raise typer.Exit(Exit.OK)
    report = outcome.report
    if not report.items:
        note(f"no running job at {report.at:%Y-%m-%d %H:%M:%S} UTC: nothing to rebalance")
        raise typer.Exit(Exit.OK)
    emit(report_rows(report, fmt), COLUMNS, fmt, title="rebalancer pass" + (" (dry run)" if dry_run else ""))
    from costopt.jobs.rebalance import Outcome

    made = report.with_outcome(Outcome.PROPOSED if dry_run else Outcome.MOVED)
    verb = "would move" if dry_run else "moved"
    note(
        f"{verb} {len(made)} of {len(report.items)} running jobs at {report.at:%Y-%m-%d %H:%M:%S} UTC, expected "
        f"net saving ${report.expected_saving_usd:,.2f}; {len(report.failed)} failed"
    )
    if report.failed:
        raise typer.Exit(Exit.PARTIAL)


def _run(settings: Any, *, dry_run: bool) -> Any:
    from api.rebalancing import build_rebalancer, run_pass_by_hand
    from api.service import build_job_service
    from api.wiring import build_store
    from costopt.jobs.leases import LeaseStore

    store = build_store(settings)
    service = build_job_service(settings, store, workers=0)
    try:
        rebalancer = build_rebalancer(service, settings, in_service=False)
        return run_pass_by_hand(rebalancer, LeaseStore(store.engine), settings, dry_run=dry_run)
    finally:
        service.close()
        store.engine.dispose()

"""``costopt jobs submit|list|show|cancel|events|logs``: thin clients of the service's REST API.

The service's URL and key come from the settings (``COSTOPT_API_URL``, ``COSTOPT_API_KEY``). A job can be
given as a YAML file (the body of ``POST /v1/jobs``; ``command`` may be a list or one shell-quoted
string), and flags override the file's fields. Exit codes: 0 done, 1 the service failed or cannot be
reached or refused the key, 2 bad arguments (also input the service rejected: 400, 409, 413, 422),
4 no such job.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from api.cli.common import Exit
from api.cli.output import OutputFormat, emit, emit_object, note

app = typer.Typer(help="Managed jobs on the service: submit, follow, cancel.", no_args_is_help=True)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(min|m|h|d|w)\s*$", re.IGNORECASE)
_HOURS_PER = {"min": 1 / 60, "m": 1 / 60, "h": 1.0, "d": 24.0, "w": 168.0}
_JOB_COLUMNS: list[tuple[str, str, str | None]] = [
    ("id", "id", None),
    ("name", "name", None),
    ("state", "state", None),
    ("steps", "steps done/total", None),
    ("placement", "placement", None),
    ("usd_per_hour", "price", "USD/h"),
    ("cost_so_far_usd", "cost so far", "USD"),
    ("eta", "ETA (UTC)", None),
]


def _client() -> Any:
    from api.cli.common import settings_with
    from api.client import ApiClient

    settings = settings_with()
    return ApiClient(settings.api_url, settings.api_key, timeout_s=settings.http_timeout_s)


@contextmanager
def _api() -> Iterator[Any]:
    """The client, with the service's errors turned into a message on stderr and an exit code."""
    from api.client import ApiError, ApiUnreachable

    client = _client()
    try:
        yield client
    except ApiUnreachable as exc:
        note(f"[red]error:[/red] {exc}")
        raise typer.Exit(Exit.FAILED) from exc
    except ApiError as exc:
        note(f"[red]error:[/red] {exc.message}")
        if isinstance(exc.details, list):
            for d in exc.details[:20]:
                note(f"  - {d}")
        if exc.status == 404:
            raise typer.Exit(Exit.NOT_FOUND) from exc
        if exc.status in (400, 409, 413, 422):
            raise typer.Exit(Exit.USAGE) from exc
        raise typer.Exit(Exit.FAILED) from exc
    finally:
        client.close()


def parse_hours(text: str, option: str) -> float:
    """'48h', '2d', '90min', '1w' or a number of hours -> hours (> 0)."""
    match = _DURATION.match(text)
    try:
        hours = float(match.group(1)) * _HOURS_PER[match.group(2).lower()] if match else float(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r} is not a duration (e.g. 48h, 2d, 90min)", param_hint=option) from exc
    if not hours > 0:
        raise typer.BadParameter("must be positive", param_hint=option)
    return hours


def _csv(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _load_file(path: Path) -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint="JOB_FILE") from exc
    except yaml.YAMLError as exc:
        raise typer.BadParameter(f"{path} is not valid YAML: {exc}", param_hint="JOB_FILE") from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise typer.BadParameter(f"{path} must hold a mapping of job fields", param_hint="JOB_FILE")
    return doc


def build_body(file_doc: Mapping[str, Any], **flags: Any) -> dict[str, Any]:
    """The ``POST /v1/jobs`` body: the file's fields, then the flags given (not None) over them."""
    body: dict[str, Any] = dict(file_doc)
    if isinstance(body.get("command"), str):
        body["command"] = shlex.split(body["command"])
    objective: dict[str, Any] = dict(body.get("objective") or {})
    if isinstance(body.get("objective"), str):
        objective = {"name": body["objective"]}
    constraints: dict[str, Any] = dict(body.get("constraints") or {})
    simple = {k: flags[k] for k in ("name", "job_type", "steps", "gpus", "image", "checkpoint_uri", "checkpoint_gb")}
    body.update({k: v for k, v in simple.items() if v is not None})
    fleet = {"fleet_id": flags.get("fleet"), "weight": flags.get("weight"), "slo_s": flags.get("slo_s")}
    body.update({k: v for k, v in fleet.items() if v is not None})
    if flags.get("command") is not None:
        body["command"] = shlex.split(flags["command"])
    if flags.get("objective") is not None:
        objective["name"] = flags["objective"]
    if flags.get("deadline") is not None:
        objective["deadline_hours"] = parse_hours(flags["deadline"], "--deadline")
    if flags.get("budget") is not None:
        objective["budget_usd"] = str(flags["budget"]).replace("$", "").replace(",", "")
    if flags.get("cost_weight") is not None:
        objective["cost_weight"] = flags["cost_weight"]
    for key in ("clouds", "regions", "markets", "accelerators"):
        items = _csv(flags.get(key))
        if items is not None:
            constraints[key] = items
    if flags.get("max_price") is not None:
        constraints["max_usd_per_hour"] = flags["max_price"]
    if objective:
        body["objective"] = objective
    if constraints:
        body["constraints"] = constraints
    if not body.get("command"):
        raise typer.BadParameter(
            "a job needs a command: --command '...' or `command:` in the file", param_hint="--command"
        )
    if not body.get("steps"):
        raise typer.BadParameter("a job needs its number of steps: --steps N or `steps:` in the file")
    return body


def _placement(job: Mapping[str, Any]) -> str | None:
    p = job.get("placement")
    if not p:
        return None
    zone = p.get("zone") or p.get("region")
    return f"{p['cloud']}/{zone}/{p['instance_type']}/{p['market']}"


def _cents(value: Any) -> str | None:
    """A sum of money (decimal string or number) rounded to the cent, for tables only (JSON and CSV keep
    the exact value)."""
    if value is None:
        return None
    from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

    try:
        return str(Decimal(str(value)).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))
    except InvalidOperation:
        return str(value)


def _row(job: Mapping[str, Any]) -> dict[str, Any]:
    placement = job.get("placement") or {}
    return {
        "id": job["id"],
        "name": job.get("name") or "",
        "state": job["state"],
        "steps": f"{job.get('steps_done', 0)}/{job.get('steps_total', '?')}",
        "placement": _placement(job),
        "usd_per_hour": placement.get("usd_per_hour"),
        "cost_so_far_usd": job.get("cost_so_far_usd"),
        "eta": job.get("eta"),
    }


def _show(job: Mapping[str, Any], fmt: OutputFormat) -> None:
    if fmt is OutputFormat.json:
        emit_object(job, fmt)
        return
    quote = job.get("quote") or {}
    table = fmt is OutputFormat.table
    row = _row(job)
    hours = quote.get("expected_hours")
    record = {
        **row,
        "cost_so_far_usd": f"{_cents(row['cost_so_far_usd'])} USD"
        if table and row["cost_so_far_usd"]
        else row["cost_so_far_usd"],
        "reason": job.get("reason"),
        "job_type": job.get("job_type"),
        "gpus": job.get("gpus"),
        "quote (USD)": _cents(quote.get("expected_cost_usd")) if table else quote.get("expected_cost_usd"),
        "quote (h)": f"{float(hours):.2f}" if table and hours is not None else hours,
        "exit_code": job.get("exit_code"),
        "created_at": job.get("created_at"),
        "finished_at": job.get("finished_at"),
        "moves": len(job.get("moves") or []),
    }
    emit_object(record, fmt, title=f"Job {job['id']}")
    moves = job.get("moves") or []
    if moves and fmt is OutputFormat.table:
        emit(
            [
                {"at": m.get("at"), "kind": m.get("kind"), "reason": m.get("reason"), "cost_usd": m.get("cost_usd")}
                for m in moves
            ],
            [("at", "at (UTC)", None), ("kind", "kind", None), ("reason", "reason", None), ("cost_usd", "cost", "USD")],
            fmt,
            title="Moves and preemptions",
        )


@app.command("submit")
def submit(
    job_file: Annotated[Path | None, typer.Argument(help="YAML file with the job (flags override it).")] = None,
    name: Annotated[str | None, typer.Option(help="A name for people.")] = None,
    job_type: Annotated[
        str | None, typer.Option("--job-type", help="Catalog job type, e.g. 'ResNet-50 (batch size 128)'.")
    ] = None,
    steps: Annotated[int | None, typer.Option(help="Training steps to run.")] = None,
    gpus: Annotated[int | None, typer.Option(help="GPUs on one instance: 1, 2, 4 or 8.")] = None,
    command: Annotated[str | None, typer.Option(help="The job's command (shell-quoted argv).")] = None,
    image: Annotated[str | None, typer.Option(help="Container or machine image.")] = None,
    checkpoint_uri: Annotated[str | None, typer.Option("--checkpoint-uri", help="Where checkpoints go.")] = None,
    checkpoint_gb: Annotated[float | None, typer.Option("--checkpoint-gb", help="Checkpoint size (GB).")] = None,
    objective: Annotated[
        str | None, typer.Option(help="min-cost, min-time, min-cost-deadline, min-time-budget or weighted.")
    ] = None,
    deadline: Annotated[str | None, typer.Option(help="Finish within, e.g. 48h, 3d.")] = None,
    budget: Annotated[str | None, typer.Option(help="Spend at most this many USD.")] = None,
    cost_weight: Annotated[float | None, typer.Option("--cost-weight", help="Weighted objective: 0..1.")] = None,
    clouds: Annotated[str | None, typer.Option(help="Only these clouds (comma-separated).")] = None,
    regions: Annotated[str | None, typer.Option(help="Only these regions (comma-separated).")] = None,
    markets: Annotated[str | None, typer.Option(help="spot, on_demand or both (comma-separated).")] = None,
    accelerators: Annotated[str | None, typer.Option(help="Only these GPUs (comma-separated).")] = None,
    max_price: Annotated[float | None, typer.Option("--max-price", help="At most this many USD per hour.")] = None,
    fleet: Annotated[
        str | None, typer.Option("--fleet", help="Run in this leased fleet (its policy shares the GPUs).")
    ] = None,
    weight: Annotated[float | None, typer.Option(help="In a fleet: the job's priority weight.")] = None,
    slo_s: Annotated[float | None, typer.Option("--slo-s", help="In a fleet: finish within (seconds).")] = None,
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Retries with the same key return the first job.")
    ] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Submit a job; the service plans it, launches it and moves it when prices change (or, with --fleet,
    queues it in the fleet)."""
    body = build_body(
        _load_file(job_file) if job_file is not None else {},
        name=name,
        job_type=job_type,
        steps=steps,
        gpus=gpus,
        command=command,
        image=image,
        checkpoint_uri=checkpoint_uri,
        checkpoint_gb=checkpoint_gb,
        objective=objective,
        deadline=deadline,
        budget=budget,
        cost_weight=cost_weight,
        clouds=clouds,
        regions=regions,
        markets=markets,
        accelerators=accelerators,
        max_price=max_price,
        fleet=fleet,
        weight=weight,
        slo_s=slo_s,
    )
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    with _api() as api:
        job = api.request("POST", "/v1/jobs", json=body, headers=headers)
    _show(job, fmt)


@app.command("list")
def list_(
    state: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    team: Annotated[str | None, typer.Option(help="Only this team's jobs (admin keys).")] = None,
    batch: Annotated[str | None, typer.Option(help="Only this batch's jobs.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many jobs (pages are followed).")] = 100,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Jobs, oldest first."""
    if limit < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--limit")
    with _api() as api:
        params = {"state": state, "team": team, "batch": batch}
        items, total = api.pages("/v1/jobs", params=params, limit=limit, page_size=500)
    if fmt is OutputFormat.json:
        emit(items, _JOB_COLUMNS, fmt)
    else:
        rows = [_row(j) for j in items]
        if fmt is OutputFormat.table:
            rows = [{**r, "cost_so_far_usd": _cents(r["cost_so_far_usd"])} for r in rows]
        emit(rows, _JOB_COLUMNS, fmt, title="Jobs")
    note(f"{len(items)} of {total} job(s)")


@app.command("show")
def show(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """One job: state, placement and price, steps done, ETA, cost so far, moves and preemptions."""
    with _api() as api:
        job = api.request("GET", f"/v1/jobs/{job_id}")
    _show(job, fmt)


@app.command("cancel")
def cancel(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Cancel a job: it checkpoints, its instance is terminated, the record stays."""
    with _api() as api:
        job = api.request("POST", f"/v1/jobs/{job_id}/cancel")
    _show(job, fmt)


@app.command("events")
def events(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Every state change, move, preemption and recovery of a job, with its reason and cost."""
    with _api() as api:
        doc = api.request("GET", f"/v1/jobs/{job_id}/events")
    emit(
        doc["items"],
        [
            ("at", "at (UTC)", None),
            ("kind", "kind", None),
            ("from_state", "from", None),
            ("to_state", "to", None),
            ("reason", "reason", None),
            ("cost_usd", "cost", "USD"),
        ],
        fmt,
        title=f"Events of {job_id}",
    )


@app.command("logs")
def logs(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    tail: Annotated[int, typer.Option(help="Lines per copy from the end.")] = 200,
    follow: Annotated[bool, typer.Option("--follow", help="Keep printing new output until the job ends.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between looks with --follow.")] = 2.0,
) -> None:
    """The job's own output across all its copies (oldest copy first)."""
    shown: dict[str, list[str]] = {}  # per copy: the lines printed so far (the newest ANCHOR of them)
    with _api() as api:
        while True:
            # The service answers each copy's last lines; following asks for as many as it gives.
            window = FOLLOW_WINDOW if follow else tail
            doc = api.request("GET", f"/v1/jobs/{job_id}/logs", params={"tail": window})
            for copy in doc.get("copies", []):
                key = f"{copy.get('epoch')}:{copy.get('instance_id')}"
                lines = (copy.get("output") or "").splitlines()
                if key not in shown:
                    sys.stdout.write(f"==> epoch {copy.get('epoch')} on {copy.get('instance_id')} <==\n")
                    new = lines[-tail:]
                else:
                    new = new_lines(shown[key], lines)
                for line in new:
                    sys.stdout.write(line + "\n")
                shown[key] = (shown.get(key, []) + new)[-ANCHOR:]
            sys.stdout.flush()
            if not follow:
                return
            job = api.request("GET", f"/v1/jobs/{job_id}")
            if job["state"] in ("succeeded", "failed", "cancelled"):
                note(f"job {job_id} {job['state']}: {job.get('reason', '')}")
                return
            time.sleep(interval)


FOLLOW_WINDOW = 10_000
"""Lines per copy asked for while following (the service's largest ``tail``)."""
ANCHOR = 20
"""How many of the last printed lines locate them in the next window."""


def new_lines(printed: list[str], window: list[str]) -> list[str]:
    """The lines of ``window`` (a copy's last lines now) after those already printed: found by the last
    printed lines (``printed``, up to :data:`ANCHOR`), matched at their latest place in the window. When
    they are no longer in it (more new output than a window holds), the whole window is new."""
    if not printed:
        return window
    for k in range(min(len(printed), len(window)), 0, -1):
        anchor = printed[-k:]
        for end in range(len(window), k - 1, -1):
            if window[end - k : end] == anchor:
                return window[end:]
    return window

"""``costopt fleets create|list|show|scale|release``: thin clients of the service's fleet routes
(docs/fleets.md), like ``costopt jobs``: same client, same settings (``COSTOPT_API_URL``, ``COSTOPT_API_KEY``),
same ``--format table|json|csv``, same exit codes: 0 done, 1 the service failed or cannot be reached or
refused the key, 2 bad arguments (also input the service rejected: 400, 409, 413, 422), 4 no such fleet.

An offer is written ``cloud/region/zone/instance_type/market`` (an empty zone for a regional price, e.g.
``azure/eastus//Standard_NC6s_v3/spot``), optionally followed by ``*COUNT``; GPUs per accelerator for the
planner are ``v100=4,k80=8``. A fleet can also be given as a YAML file holding the body of
``POST /v1/fleets``; flags override its fields. Jobs go into a fleet with ``costopt jobs submit --fleet ID``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from api.cli.jobs import _api, _cents, _csv, _load_file
from api.cli.output import OutputFormat, emit, emit_object, note

app = typer.Typer(
    help="Leased fleets shared round by round by a Gavel policy: lease, follow, scale, release.",
    no_args_is_help=True,
)

MARKETS = ("spot", "on_demand")
_FLEET_COLUMNS: list[tuple[str, str, str | None]] = [
    ("id", "id", None),
    ("name", "name", None),
    ("state", "state", None),
    ("policy", "policy", None),
    ("gpus", "GPUs live", None),
    ("instances", "instances", None),
    ("jobs", "jobs done/all", None),
    ("round", "round", None),
    ("cost_so_far_usd", "cost so far", "USD"),
]
_INSTANCE_COLUMNS: list[tuple[str, str, str | None]] = [
    ("id", "id", None),
    ("state", "state", None),
    ("offer", "offer", None),
    ("accelerator", "GPU", None),
    ("gpus", "GPUs", None),
    ("usd_per_hour", "price", "USD/h"),
    ("provider", "provider", None),
    ("end_reason", "reason", None),
]
_JOB_COLUMNS: list[tuple[str, str, str | None]] = [
    ("job_id", "job", None),
    ("status", "status", None),
    ("steps", "steps done/total", None),
    ("holder", "on", None),
    ("weight", "weight", None),
    ("expected_steps_per_s", "expected", "steps/s"),
    ("observed_steps_per_s", "observed", "steps/s"),
    ("cost_so_far_usd", "cost so far", "USD"),
]


def parse_offer(text: str, option: str) -> dict[str, Any]:
    """``cloud/region/zone/instance_type/market[*count]`` -> ``{"offer": {...}, "count": n}``."""
    spec, _, count_text = text.partition("*")
    parts = [p.strip() for p in spec.split("/")]
    if len(parts) != 5 or not all(parts[i] for i in (0, 1, 3, 4)):
        raise typer.BadParameter(
            f"{text!r} is not an offer: write cloud/region/zone/instance_type/market[*count], e.g. "
            "aws/us-east-1/us-east-1a/p3.2xlarge/spot*2 (an empty zone for a regional price: "
            "azure/eastus//Standard_NC6s_v3/spot)",
            param_hint=option,
        )
    cloud, region, zone, instance_type, market = parts
    market = market.lower().replace("-", "_")
    if market == "ondemand":
        market = "on_demand"
    if market not in MARKETS:
        raise typer.BadParameter(f"the market of {text!r} must be spot or on_demand", param_hint=option)
    count = 1
    if count_text:
        try:
            count = int(count_text)
        except ValueError:
            count = 0
        if count < 1:
            raise typer.BadParameter(f"the count of {text!r} must be a whole number >= 1", param_hint=option)
    offer = {"cloud": cloud.lower(), "region": region, "zone": zone, "instance_type": instance_type, "market": market}
    return {"offer": offer, "count": count}


def parse_gpus(text: str, option: str) -> dict[str, int]:
    """``v100=4,k80=8`` -> ``{"v100": 4, "k80": 8}`` (GPUs per accelerator, each >= 1)."""
    out: dict[str, int] = {}
    for item in _csv(text) or []:
        name, sep, value = item.partition("=")
        try:
            n = int(value)
        except ValueError:
            n = 0
        if not sep or not name.strip() or n < 1:
            raise typer.BadParameter(
                f"{item!r} is not accelerator=GPUs (e.g. v100=4,k80=8; each at least 1)", param_hint=option
            )
        out[name.strip().lower()] = n
    if not out:
        raise typer.BadParameter("give at least one accelerator=GPUs, e.g. v100=4", param_hint=option)
    return out


def _plan(
    gpus: str | None,
    clouds: str | None,
    regions: str | None,
    markets: str | None,
    max_price: float | None,
    option: str,
) -> dict[str, Any] | None:
    """A plan's body (None: no ``gpus`` given; its constraints alone are a usage error)."""
    if gpus is None:
        if any(v is not None for v in (clouds, regions, markets, max_price)):
            raise typer.BadParameter(
                "--clouds, --regions, --markets and --max-price shape a plan: give its GPUs too", param_hint=option
            )
        return None
    plan: dict[str, Any] = {"accelerators": parse_gpus(gpus, option)}
    for key, value in (("clouds", clouds), ("regions", regions), ("markets", markets)):
        items = _csv(value)
        if items is not None:
            plan[key] = items
    if max_price is not None:
        plan["max_usd_per_hour"] = max_price
    return plan


def build_create_body(file_doc: Mapping[str, Any], **flags: Any) -> dict[str, Any]:
    """The ``POST /v1/fleets`` body: the file's fields, then the flags given (not None / not empty) over
    them. Exactly one of instances (``--instance``) or a plan (``--gpus``) must remain."""
    body: dict[str, Any] = dict(file_doc)
    for key, flag in (("name", "name"), ("policy", "policy"), ("round_s", "round_s")):
        if flags.get(flag) is not None:
            body[key] = flags[flag]
    if flags.get("resolve_every") is not None:
        body["resolve_every_rounds"] = flags["resolve_every"]
    instances = [parse_offer(t, "--instance") for t in flags.get("instances") or ()]
    plan = _plan(
        flags.get("gpus"),
        flags.get("clouds"),
        flags.get("regions"),
        flags.get("markets"),
        flags.get("max_price"),
        "--gpus",
    )
    if instances and plan is not None:
        raise typer.BadParameter("give instances (--instance) or a plan (--gpus), not both", param_hint="--gpus")
    if instances:
        body["instances"] = instances
        body.pop("plan", None)
    elif plan is not None:
        body["plan"] = plan
        body.pop("instances", None)
    if not body.get("policy"):
        raise typer.BadParameter(
            "a fleet needs a policy: --policy NAME (`costopt gavel policies` lists them)", param_hint="--policy"
        )
    if not body.get("instances") and not body.get("plan"):
        raise typer.BadParameter(
            "a fleet needs instances: --instance cloud/region/zone/type/market[*count] (repeatable) or "
            "--gpus v100=4,k80=8 (the planner's cheapest)",
            param_hint="--instance",
        )
    return body


def build_scale_body(
    add: Sequence[str], add_gpus: str | None, remove: Sequence[str], **plan_flags: Any
) -> dict[str, Any]:
    """The ``POST /v1/fleets/{id}/scale`` body (something to add or to remove is required)."""
    body: dict[str, Any] = {}
    if add:
        body["add"] = [parse_offer(t, "--add") for t in add]
    plan = _plan(
        add_gpus,
        plan_flags.get("clouds"),
        plan_flags.get("regions"),
        plan_flags.get("markets"),
        plan_flags.get("max_price"),
        "--add-gpus",
    )
    if plan is not None:
        body["add_plan"] = plan
    if remove:
        body["remove"] = [r.strip() for r in remove if r.strip()]
    if not body:
        raise typer.BadParameter("give instances to add (--add, --add-gpus) or to remove (--remove)")
    return body


def _offer_text(offer: Mapping[str, Any]) -> str:
    return f"{offer['cloud']}/{offer.get('zone') or offer['region']}/{offer['instance_type']}/{offer['market']}"


def _gpus_text(gpus: Mapping[str, int] | None) -> str:
    return ", ".join(f"{n} {acc}" for acc, n in sorted((gpus or {}).items())) or "-"


def _row(fleet: Mapping[str, Any], fmt: OutputFormat) -> dict[str, Any]:
    jobs = fleet.get("jobs") or []
    live = [i for i in fleet.get("instances") or [] if i["state"] not in ("released", "lost")]
    rnd = fleet.get("round") or {}
    cost = fleet.get("cost_so_far_usd")
    return {
        "id": fleet["id"],
        "name": fleet.get("name") or "",
        "state": fleet["state"],
        "policy": fleet["policy"],
        "gpus": _gpus_text(fleet.get("gpus")),
        "instances": len(live),
        "jobs": f"{sum(1 for j in jobs if j['status'] == 'done')}/{len(jobs)}",
        "round": rnd.get("number"),
        "cost_so_far_usd": _cents(cost) if fmt is OutputFormat.table else cost,
    }


def _show(fleet: Mapping[str, Any], fmt: OutputFormat) -> None:
    if fmt is OutputFormat.json:
        emit_object(fleet, fmt)
        return
    table = fmt is OutputFormat.table
    rnd = fleet.get("round") or {}
    record = {
        **_row(fleet, fmt),
        "GPUs planned": _gpus_text(fleet.get("gpus_planned")),
        "round length (s)": fleet.get("round_s"),
        "re-solve every (rounds)": fleet.get("resolve_every_rounds"),
        "round ends at": rnd.get("ends_at"),
        "idle cost": _cents(fleet.get("idle_cost_usd")) if table else fleet.get("idle_cost_usd"),
        "created_at": fleet.get("created_at"),
        "released_at": fleet.get("released_at"),
    }
    emit_object(record, fmt, title=f"Fleet {fleet['id']}")
    if not table:
        return
    instances = [
        {
            "id": i["id"],
            "state": i["state"],
            "offer": _offer_text(i["offer"]),
            "accelerator": i["accelerator"],
            "gpus": i["gpus"],
            "usd_per_hour": i.get("usd_per_hour"),
            "provider": i["provider"],
            "end_reason": i.get("end_reason"),
        }
        for i in fleet.get("instances") or []
    ]
    emit(instances, _INSTANCE_COLUMNS, fmt, title="Instances")
    jobs = [
        {
            "job_id": j["job_id"],
            "status": j["status"],
            "steps": f"{j['steps_done']}/{j['steps_total']}",
            "holder": j.get("holder"),
            "weight": j.get("weight"),
            "expected_steps_per_s": _round(j.get("expected_steps_per_s")),
            "observed_steps_per_s": _round(j.get("observed_steps_per_s")),
            "cost_so_far_usd": _cents(j.get("cost_so_far_usd")),
        }
        for j in fleet.get("jobs") or []
    ]
    if jobs:
        emit(jobs, _JOB_COLUMNS, fmt, title="Jobs")


def _round(value: Any) -> Any:
    return None if value is None else round(float(value), 3)


@app.command("create")
def create(
    fleet_file: Annotated[Path | None, typer.Argument(help="YAML file with the fleet (flags override it).")] = None,
    policy: Annotated[str | None, typer.Option(help="A Gavel policy (`costopt gavel policies`).")] = None,
    instance: Annotated[
        list[str] | None,
        typer.Option("--instance", help="cloud/region/zone/instance_type/market[*count]; repeatable."),
    ] = None,
    gpus: Annotated[
        str | None, typer.Option(help="Or GPUs per accelerator for the planner, e.g. v100=4,k80=8.")
    ] = None,
    clouds: Annotated[str | None, typer.Option(help="Plan: only these clouds (comma-separated).")] = None,
    regions: Annotated[str | None, typer.Option(help="Plan: only these regions (comma-separated).")] = None,
    markets: Annotated[str | None, typer.Option(help="Plan: spot, on_demand or both (comma-separated).")] = None,
    max_price: Annotated[
        float | None, typer.Option("--max-price", help="Plan: the whole fleet's USD per hour at most.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="A name for people.")] = None,
    round_s: Annotated[float | None, typer.Option("--round-s", help="Round length in seconds (360).")] = None,
    resolve_every: Annotated[
        int | None, typer.Option("--resolve-every", help="Re-solve the policy at least every N rounds (10).")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Retries with the same key return the first fleet.")
    ] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Lease a fleet: instances by offer (--instance) or the planner's cheapest (--gpus), and its policy."""
    body = build_create_body(
        _load_file(fleet_file) if fleet_file is not None else {},
        policy=policy,
        instances=instance,
        gpus=gpus,
        clouds=clouds,
        regions=regions,
        markets=markets,
        max_price=max_price,
        name=name,
        round_s=round_s,
        resolve_every=resolve_every,
    )
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    with _api() as api:
        fleet = api.request("POST", "/v1/fleets", json=body, headers=headers)
    _show(fleet, fmt)


@app.command("list")
def list_(
    team: Annotated[str | None, typer.Option(help="Only this team's fleets (admin keys).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many fleets (pages are followed).")] = 100,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Fleets, oldest first."""
    if limit < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--limit")
    with _api() as api:
        items, total = api.pages("/v1/fleets", params={"team": team}, limit=limit, page_size=100)
    if fmt is OutputFormat.json:
        emit(items, _FLEET_COLUMNS, fmt)
    else:
        emit([_row(f, fmt) for f in items], _FLEET_COLUMNS, fmt, title="Fleets")
    note(f"{len(items)} of {total} fleet(s)")


@app.command("show")
def show(
    fleet_id: Annotated[str, typer.Argument(help="The fleet's id.")],
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """One fleet: instances and GPUs, the round in force, each job's progress and cost, the fleet's cost."""
    with _api() as api:
        fleet = api.request("GET", f"/v1/fleets/{fleet_id}")
    _show(fleet, fmt)


@app.command("scale")
def scale(
    fleet_id: Annotated[str, typer.Argument(help="The fleet's id.")],
    add: Annotated[
        list[str] | None, typer.Option("--add", help="Add cloud/region/zone/instance_type/market[*count]; repeatable.")
    ] = None,
    add_gpus: Annotated[
        str | None, typer.Option("--add-gpus", help="Add the planner's cheapest for these GPUs, e.g. v100=2.")
    ] = None,
    clouds: Annotated[str | None, typer.Option(help="--add-gpus: only these clouds.")] = None,
    regions: Annotated[str | None, typer.Option(help="--add-gpus: only these regions.")] = None,
    markets: Annotated[str | None, typer.Option(help="--add-gpus: spot, on_demand or both.")] = None,
    max_price: Annotated[float | None, typer.Option("--max-price", help="--add-gpus: USD per hour at most.")] = None,
    remove: Annotated[
        list[str] | None, typer.Option("--remove", help="Drain this instance (fi-...); repeatable.")
    ] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Add instances, or drain some (their jobs checkpoint and move at the next round)."""
    body = build_scale_body(
        add or [], add_gpus, remove or [], clouds=clouds, regions=regions, markets=markets, max_price=max_price
    )
    with _api() as api:
        fleet = api.request("POST", f"/v1/fleets/{fleet_id}/scale", json=body)
    _show(fleet, fmt)


@app.command("release")
def release(
    fleet_id: Annotated[str, typer.Argument(help="The fleet's id.")],
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Release a fleet: its unfinished jobs checkpoint and stop (cancelled), its instances end. Idempotent."""
    with _api() as api:
        fleet = api.request("POST", f"/v1/fleets/{fleet_id}/release")
    _show(fleet, fmt)

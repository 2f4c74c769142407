"""``costopt admin create-team|teams|create-key|revoke-key|team-policy``: teams, API keys, team policies.

Thin clients of ``/v1/admin`` (an admin key in ``COSTOPT_API_KEY``). ``--local`` works on the configured
database directly instead (``COSTOPT_DATABASE_URL``: for the operator on the service's host, e.g. when no
admin key is at hand). A key is printed once, when it is made; only its hash is stored.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from api.cli.common import Exit, failures, settings_with
from api.cli.jobs import _api
from api.cli.output import OutputFormat, emit, emit_object, note

app = typer.Typer(help="Teams and API keys (admin).", no_args_is_help=True)

_LOCAL = typer.Option("--local", help="Write the configured database directly instead of calling the service.")


def _local_teams() -> Any:
    from api.wiring import build_engine
    from costopt.db.engine import migrate
    from costopt.jobs.teams import TeamRepository

    engine = build_engine(settings_with())
    migrate(engine)
    return TeamRepository(engine)


def _print_key(key: str, what: str) -> None:
    note(f"{what}: the key is shown once; keep it (COSTOPT_API_KEY=...)")
    typer.echo(key)


@app.command("create-team")
def create_team(
    name: Annotated[str, typer.Argument(help="The team's name (unique).")],
    local: Annotated[bool, _LOCAL] = False,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Create a team and print its first (member) key once."""
    if local:
        from costopt.jobs.teams import Role

        with failures():
            teams = _local_teams()
            team = teams.create_team(name)
            issued = teams.create_key(team.id, Role.MEMBER, "first key")
        doc: dict[str, Any] = {"team": {"id": team.id, "name": team.name}, "key": issued.secret}
    else:
        with _api() as api:
            doc = api.request("POST", "/v1/admin/teams", json={"name": name})
    if fmt is OutputFormat.json:
        emit_object(doc, fmt)
        return
    note(f"team {doc['team']['name']} ({doc['team']['id']}) created")
    _print_key(doc["key"], f"key of team {doc['team']['name']}")


@app.command("teams")
def teams_(
    local: Annotated[bool, _LOCAL] = False,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Every team."""
    if local:
        with failures():
            rows: list[dict[str, Any]] = [
                {"id": t.id, "name": t.name, "created_at": t.created_at.isoformat()} for t in _local_teams().teams()
            ]
    else:
        with _api() as api:
            rows = api.request("GET", "/v1/admin/teams")["items"]
    emit(rows, [("id", "id", None), ("name", "name", None), ("created_at", "created (UTC)", None)], fmt, title="Teams")


@app.command("create-key")
def create_key(
    team_id: Annotated[str, typer.Argument(help="The team's id (costopt admin teams).")],
    role: Annotated[str, typer.Option(help="member or admin.")] = "member",
    name: Annotated[str, typer.Option(help="What the key is for.")] = "",
    local: Annotated[bool, _LOCAL] = False,
) -> None:
    """Make another key for a team and print it once."""
    if role not in ("member", "admin"):
        raise typer.BadParameter("choose member or admin", param_hint="--role")
    if local:
        from costopt.jobs.teams import Role

        with failures():
            secret = _local_teams().create_key(team_id, Role(role), name).secret
    else:
        with _api() as api:
            secret = api.request("POST", f"/v1/admin/teams/{team_id}/keys", json={"role": role, "name": name})["key"]
    _print_key(secret, f"{role} key of {team_id}")


@app.command("revoke-key")
def revoke_key(
    key_id: Annotated[str, typer.Argument(help="The key's id (the 12 hex digits after co_).")],
    local: Annotated[bool, _LOCAL] = False,
) -> None:
    """Revoke a key: it is refused from now on."""
    if local:
        with failures():
            found = _local_teams().revoke(key_id)
        if not found:
            note(f"[red]error:[/red] no key {key_id}")
            raise typer.Exit(Exit.NOT_FOUND)
    else:
        with _api() as api:
            api.request("DELETE", f"/v1/admin/keys/{key_id}")
    note(f"key {key_id} revoked")


@app.command("team-policy")
def team_policy(
    team_id: Annotated[str, typer.Argument(help="The team's id (costopt admin teams).")],
    allow_local: Annotated[
        bool | None,
        typer.Option(
            "--allow-local/--no-allow-local",
            help="May the team's jobs run on the service's own host (provider local)? Left out: unchanged.",
        ),
    ] = None,
    checkpoint_prefix: Annotated[
        list[str] | None,
        typer.Option("--checkpoint-prefix", help="A URI prefix its checkpoint_uri may start with (repeat)."),
    ] = None,
    image_prefix: Annotated[
        list[str] | None, typer.Option("--image-prefix", help="A prefix its image may start with (repeat).")
    ] = None,
    defaults: Annotated[
        bool, typer.Option("--defaults", help="Return both prefix lists to the service's defaults.")
    ] = False,
    local: Annotated[bool, _LOCAL] = False,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Show or set a team's policy: the local provider, checkpoint and image prefixes (docs/api.md)."""
    body: dict[str, Any] = {}
    if allow_local is not None:
        body["allow_local_provider"] = allow_local
    if defaults:
        body["checkpoint_prefixes"] = body["image_prefixes"] = None
    if checkpoint_prefix:
        body["checkpoint_prefixes"] = list(checkpoint_prefix)
    if image_prefix:
        body["image_prefixes"] = list(image_prefix)
    if local:
        doc = _local_policy(team_id, body)
    else:
        with _api() as api:
            doc = api.request("PATCH", f"/v1/admin/teams/{team_id}", json=body)
    if fmt is OutputFormat.json:
        emit_object(doc, fmt)
        return

    def show(prefixes: list[str] | None) -> str:
        return "the service's defaults" if prefixes is None else (", ".join(prefixes) or "none")

    note(
        f"team {doc['name']} ({doc['id']}): local provider {'allowed' if doc['allow_local_provider'] else 'refused'}; "
        f"checkpoints under: {show(doc['checkpoint_prefixes'])}; images: {show(doc['image_prefixes'])}"
    )


def _local_policy(team_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """``PATCH /v1/admin/teams/{id}`` on the configured database directly (the same checks)."""
    from api.tenancy import patched_policy, refused_prefixes

    refused = refused_prefixes(body)
    if refused:
        kind, _, prefix, why = refused[0]
        raise typer.BadParameter(f"{prefix!r}: {why}", param_hint=f"--{kind}-prefix")
    with failures():
        teams = _local_teams()
        team = teams.team(team_id)
        if team is None:
            note(f"[red]error:[/red] no team {team_id}: costopt admin teams --local lists them")
            raise typer.Exit(Exit.NOT_FOUND)
        team = teams.set_policy(team_id, patched_policy(team.policy, body))
    p = team.policy
    return {
        "id": team.id,
        "name": team.name,
        "allow_local_provider": p.allow_local_provider,
        "checkpoint_prefixes": None if p.checkpoint_prefixes is None else list(p.checkpoint_prefixes),
        "image_prefixes": None if p.image_prefixes is None else list(p.image_prefixes),
    }

"""``costopt admin create-team|teams|create-key|revoke-key``: teams and API keys.

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
    from costopt.db.engine import make_engine, migrate
    from costopt.jobs.teams import TeamRepository

    engine = make_engine(settings_with().database_url)
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

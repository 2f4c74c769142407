"""``/v1/admin``: teams and API keys (admin keys only; a member key gets 403).

A key is shown once, in the answer that makes it; only its SHA-256 is stored.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from api.auth import AdminDep, TeamsDep, forget_keys
from api.errors import ApiError
from api.job_schemas import (
    KeyCreate,
    KeyCreated,
    KeyPublic,
    TeamCreate,
    TeamCreated,
    TeamPolicyUpdate,
    TeamPublic,
    TeamsListPublic,
)
from api.tenancy import patched_policy, refused_prefixes
from costopt.jobs.teams import ApiKey, Role, Team, TeamError

log = logging.getLogger("costopt.api")

router = APIRouter(prefix="/v1/admin", tags=["admin"])

TeamId = Annotated[str, Path(min_length=1, max_length=64, description="The team's id (team-...).")]
KeyId = Annotated[str, Path(min_length=1, max_length=32, description="The key's public id (co_<id>_...).")]


def _team(t: Team) -> TeamPublic:
    p = t.policy
    return TeamPublic(
        id=t.id,
        name=t.name,
        created_at=t.created_at,
        allow_local_provider=p.allow_local_provider,
        checkpoint_prefixes=list(p.checkpoint_prefixes) if p.checkpoint_prefixes is not None else None,
        image_prefixes=list(p.image_prefixes) if p.image_prefixes is not None else None,
    )


def _key(k: ApiKey) -> KeyPublic:
    return KeyPublic(
        id=k.id, team_id=k.team_id, role=k.role.value, name=k.name, created_at=k.created_at, revoked_at=k.revoked_at
    )


@router.post("/teams", status_code=201, response_model=TeamCreated)
def create_team(body: TeamCreate, caller: AdminDep, teams: TeamsDep) -> TeamCreated:
    """A new team and its first member key (the key is in this answer only)."""
    if teams.team_by_name(body.name) is not None:
        raise ApiError(409, "conflict", f"a team named {body.name!r} exists already: choose another name")
    try:
        team = teams.create_team(body.name)
    except TeamError as exc:
        status, code = (409, "conflict") if teams.team_by_name(body.name) is not None else (422, "invalid_request")
        raise ApiError(status, code, str(exc), [{"field": "name", "problem": str(exc)}]) from exc
    issued = teams.create_key(team.id, Role.MEMBER, "first key")
    log.info("admin key %s created team %s and key %s", caller.key_id, team.id, issued.key.id)
    return TeamCreated(team=_team(team), key=issued.secret, key_info=_key(issued.key))


@router.get("/teams", response_model=TeamsListPublic)
def list_teams(caller: AdminDep, teams: TeamsDep) -> TeamsListPublic:
    """Every team, oldest first."""
    items = [_team(t) for t in teams.teams()]
    return TeamsListPublic(count=len(items), items=items)


@router.patch("/teams/{team_id}", response_model=TeamPublic)
def set_team_policy(team_id: TeamId, body: TeamPolicyUpdate, caller: AdminDep, teams: TeamsDep) -> TeamPublic:
    """Set the team's policy (api/tenancy.py): whether its jobs may run on the service's own host (the
    local provider), and the prefixes its jobs' checkpoint URIs and images may start with. Each prefix
    must stop at a boundary ('/'; for an image also ':' or '@') and hold no '..', '%' or backslash."""
    team = teams.team(team_id)
    if team is None:
        raise ApiError(404, "not_found", f"no team {team_id!r}: GET /v1/admin/teams lists them")
    changes = body.model_dump(exclude_unset=True)
    problems = [{"field": f"{kind}_prefixes[{i}]", "problem": why} for kind, i, _, why in refused_prefixes(changes)]
    if problems:
        first = problems[0]
        raise ApiError(422, "invalid_request", f"{first['field']}: {first['problem']}", problems)
    policy = patched_policy(team.policy, changes)
    updated = teams.set_policy(team_id, policy)
    log.info("admin key %s set the policy of team %s: %s", caller.key_id, team_id, policy)
    return _team(updated)


@router.post("/teams/{team_id}/keys", status_code=201, response_model=KeyCreated)
def create_key(team_id: TeamId, body: KeyCreate, caller: AdminDep, teams: TeamsDep) -> KeyCreated:
    """A new key of the team (``role`` member or admin), shown in this answer only."""
    if teams.team(team_id) is None:
        raise ApiError(404, "not_found", f"no team {team_id!r}: GET /v1/admin/teams lists them")
    issued = teams.create_key(team_id, Role(body.role), body.name)
    log.info("admin key %s created %s key %s for team %s", caller.key_id, body.role, issued.key.id, team_id)
    return KeyCreated(key=issued.secret, key_info=_key(issued.key))


@router.delete("/keys/{key_id}", status_code=204, response_class=Response)
def revoke_key(key_id: KeyId, request: Request, caller: AdminDep, teams: TeamsDep) -> Response:
    """Revoke a key (idempotent): it authenticates as nothing from now on in this process, and within
    :data:`api.auth.KEY_CACHE_TTL_S` seconds in the service's other worker processes."""
    if not teams.revoke(key_id):
        raise ApiError(404, "not_found", f"no key {key_id!r}")
    forget_keys(request.app)
    log.info("admin key %s revoked key %s", caller.key_id, key_id)
    return Response(status_code=204)

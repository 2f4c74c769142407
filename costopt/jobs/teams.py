"""Teams and API keys.

A key is shown once, when it is made: ``co_<key_id>_<secret>`` (``key_id``: 12 hex digits, public, the
row's primary key; ``secret``: 32 random bytes, URL-safe base64). Only the SHA-256 of the whole key is
stored; :meth:`TeamRepository.authenticate` looks the row up by ``key_id`` and compares hashes in
constant time (:func:`hmac.compare_digest`), so neither a wrong secret nor an unknown id is faster to
find out. A revoked key authenticates as nothing.

Roles: ``admin`` sees and manages every team's jobs and the teams themselves; ``member`` only its own
team's jobs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from costopt.db.jobs_schema import api_keys, teams
from costopt.errors import CostoptError

__all__ = [
    "ADMIN_TEAM",
    "ApiKey",
    "IssuedKey",
    "Role",
    "Team",
    "TeamError",
    "TeamPolicy",
    "TeamRepository",
]

ADMIN_TEAM = "admin"
"""The name of the team the first admin key belongs to."""

_KEY_RE = re.compile(r"^co_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,99}$")


class Role(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"


class TeamError(CostoptError, ValueError):
    """A team or key request that cannot be done as asked (the message says why)."""


@dataclass(frozen=True, slots=True)
class TeamPolicy:
    """What a team's jobs may do, set by an admin. ``allow_local_provider``: its jobs may run on the
    service's own host (provider ``local``; off by default). ``checkpoint_prefixes`` / ``image_prefixes``:
    the URI prefixes its jobs' ``checkpoint_uri`` and the prefixes their ``image`` may start with (None:
    the service's defaults, ``COSTOPT_ALLOWED_CHECKPOINT_PREFIXES`` / ``COSTOPT_ALLOWED_IMAGE_PREFIXES``)."""

    allow_local_provider: bool = False
    checkpoint_prefixes: tuple[str, ...] | None = None
    image_prefixes: tuple[str, ...] | None = None

    @classmethod
    def of(cls, row: Any) -> TeamPolicy:
        def prefixes(raw: str | None) -> tuple[str, ...] | None:
            return None if raw is None else tuple(str(p) for p in json.loads(raw))

        return cls(bool(row.allow_local_provider), prefixes(row.checkpoint_prefixes), prefixes(row.image_prefixes))


@dataclass(frozen=True, slots=True)
class Team:
    id: str
    name: str
    created_at: datetime
    policy: TeamPolicy = TeamPolicy()

    @classmethod
    def of(cls, row: Any) -> Team:
        return cls(row.id, row.name, row.created_at, TeamPolicy.of(row))


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key (never its secret). ``revoked_at`` None: valid."""

    id: str
    team_id: str
    role: Role
    name: str
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: Any) -> ApiKey:
        return cls(row.id, row.team_id, Role(row.role), row.name or "", row.created_at, row.revoked_at)


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A key just made: ``secret`` is the whole key, shown once and stored nowhere."""

    key: ApiKey
    secret: str


def hash_key(secret: str) -> str:
    """The stored form of a key: SHA-256 hex of the whole key (keys carry 256 random bits)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class TeamRepository:
    """Teams and keys in ``engine``."""

    engine: Engine
    now: Callable[[], datetime] = _utcnow

    def create_team(self, name: str) -> Team:
        """A new team; raises :class:`TeamError` when the name is invalid or taken."""
        name = name.strip()
        if not _NAME_RE.match(name):
            raise TeamError(
                f"invalid team name {name!r}: 1-100 letters, digits, spaces, '.', '_' or '-', starting with a "
                "letter or digit"
            )
        team = Team(f"team-{secrets.token_hex(6)}", name, self.now())
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(teams).values(id=team.id, name=team.name, created_at=team.created_at))
        except IntegrityError as exc:
            raise TeamError(f"a team named {name!r} exists already: choose another name") from exc
        return team

    def team(self, team_id: str) -> Team | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(teams).where(teams.c.id == team_id)).first()
        return Team.of(row) if row is not None else None

    def team_by_name(self, name: str) -> Team | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(teams).where(teams.c.name == name)).first()
        return Team.of(row) if row is not None else None

    def policy(self, team_id: str) -> TeamPolicy:
        """The team's policy (the default policy for an unknown team: nothing beyond the defaults)."""
        team = self.team(team_id)
        return team.policy if team is not None else TeamPolicy()

    def set_policy(self, team_id: str, policy: TeamPolicy) -> Team:
        """Store the team's policy; raises :class:`TeamError` when there is no such team."""

        def dump(prefixes: tuple[str, ...] | None) -> str | None:
            return None if prefixes is None else json.dumps(list(prefixes))

        with self.engine.begin() as conn:
            done = conn.execute(
                update(teams)
                .where(teams.c.id == team_id)
                .values(
                    allow_local_provider=policy.allow_local_provider,
                    checkpoint_prefixes=dump(policy.checkpoint_prefixes),
                    image_prefixes=dump(policy.image_prefixes),
                )
            )
        if done.rowcount == 0:
            raise TeamError(f"no team {team_id!r}: GET /v1/admin/teams lists them")
        team = self.team(team_id)
        assert team is not None
        return team

    def teams(self) -> list[Team]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(teams).order_by(teams.c.created_at, teams.c.id)).all()
        return [Team.of(r) for r in rows]

    def create_key(self, team_id: str, role: Role = Role.MEMBER, name: str = "") -> IssuedKey:
        """A new key of ``team_id``; its secret is in the result only."""
        if self.team(team_id) is None:
            raise TeamError(f"no team {team_id!r}: create it first (costopt admin create-team NAME)")
        key_id = secrets.token_hex(6)
        secret = f"co_{key_id}_{secrets.token_urlsafe(32)}"
        now = self.now()
        with self.engine.begin() as conn:
            conn.execute(
                insert(api_keys).values(
                    id=key_id,
                    team_id=team_id,
                    key_hash=hash_key(secret),
                    role=Role(role).value,
                    name=name,
                    created_at=now,
                )
            )
        return IssuedKey(ApiKey(key_id, team_id, Role(role), name, now, None), secret)

    def keys(self, team_id: str | None = None) -> list[ApiKey]:
        query = select(api_keys).order_by(api_keys.c.created_at, api_keys.c.id)
        if team_id is not None:
            query = query.where(api_keys.c.team_id == team_id)
        with self.engine.connect() as conn:
            return [ApiKey.of(r) for r in conn.execute(query).all()]

    def revoke(self, key_id: str) -> bool:
        """Revoke a key (idempotent); False when there is no such key."""
        with self.engine.begin() as conn:
            row = conn.execute(select(api_keys.c.id).where(api_keys.c.id == key_id)).first()
            if row is None:
                return False
            conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=self.now())
            )
        return True

    def authenticate(self, secret: str) -> ApiKey | None:
        """The valid key whose secret this is, or None (malformed, unknown, wrong or revoked)."""
        match = _KEY_RE.match(secret.strip())
        given = hash_key(secret.strip())
        with self.engine.connect() as conn:
            row = (
                conn.execute(select(api_keys).where(api_keys.c.id == match.group(1))).first()
                if match is not None
                else None
            )
        stored = row.key_hash if row is not None else "0" * 64
        ok = hmac.compare_digest(given, stored)
        if row is None or not ok or row.revoked_at is not None:
            return None
        return ApiKey.of(row)

    def has_admin(self) -> bool:
        """True when any valid admin key exists (a fresh database has none)."""
        with self.engine.connect() as conn:
            n = conn.execute(
                select(func.count())
                .select_from(api_keys)
                .where(api_keys.c.role == Role.ADMIN.value, api_keys.c.revoked_at.is_(None))
            ).scalar_one()
        return int(n) > 0

    def bootstrap_admin(self) -> IssuedKey | None:
        """On a database with no admin key: the ``admin`` team (made if missing) and a new admin key
        (shown once by the caller). None when an admin key exists already."""
        if self.has_admin():
            return None
        team = self.team_by_name(ADMIN_TEAM)
        if team is None:
            try:
                team = self.create_team(ADMIN_TEAM)
            except TeamError:
                team = self.team_by_name(ADMIN_TEAM)
                if team is None:
                    raise
        return self.create_key(team.id, Role.ADMIN, "bootstrap admin key")

"""Who is calling: ``Authorization: Bearer <key>`` checked against the stored key hashes.

:data:`CallerDep` gives a route the caller (key id, team id, role); a missing, malformed, unknown or
revoked key gets 401 ``unauthorized`` with the header's expected form. :data:`AdminDep` also refuses a
member key with 403 ``forbidden``. Keys are never logged: only the key id (public) is kept on the
request for the access log. Each valid key is rate-limited per process (:class:`api.tenancy.RateLimiter`:
429 ``too_many_requests`` with ``Retry-After``).

Scope rule (every route that takes a job id): a member sees its own team only, and another team's job
is "not found" (404), exactly as a job that does not exist; an admin sees every team (:meth:`Caller.scope`
is None).

Verified keys are cached per process for :data:`KEY_CACHE_TTL_S` seconds, keyed by the key's SHA-256
(never the secret): a revoked key stops working within that TTL in every worker process, and at once in
the process that served ``DELETE /v1/admin/keys/{id}`` (which empties its cache). Unknown or bad keys
are never cached. A cache hit costs a hash and a dict look-up on the event loop (the dependencies are
``async def``: no thread hop); only a miss reads the database, in the thread pool.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from api.errors import ApiError
from api.tenancy import RateLimiter
from costopt.jobs.teams import ApiKey, Role, TeamRepository, hash_key

__all__ = ["KEY_CACHE_TTL_S", "AdminDep", "Caller", "CallerDep", "TeamsDep", "forget_keys", "get_teams"]

KEY_CACHE_TTL_S = 5.0
"""How long (seconds, monotonic clock) a verified key is trusted without a database read."""

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer co_...`")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated caller: its key's id, its team and role."""

    key_id: str
    team_id: str
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def scope(self) -> str | None:
        """The team the caller may see (None: every team, an admin)."""
        return None if self.is_admin else self.team_id


async def get_teams(request: Request) -> TeamRepository:
    teams: TeamRepository | None = getattr(request.app.state, "teams", None)
    if teams is None:
        raise ApiError(503, "unavailable", "the service is starting: retry shortly")
    return teams


TeamsDep = Annotated[TeamRepository, Depends(get_teams)]


def _key_cache(app: Any) -> dict[str, tuple[float, ApiKey]]:
    cache: dict[str, tuple[float, ApiKey]] | None = getattr(app.state, "key_cache", None)
    if cache is None:
        cache = {}
        app.state.key_cache = cache
    return cache


def forget_keys(app: Any) -> None:
    """Empty this process's cache of verified keys (after a revocation)."""
    _key_cache(app).clear()


def _cached(request: Request, digest: str) -> ApiKey | None:
    """The verified key of hash ``digest`` when this process verified it within the TTL."""
    hit = _key_cache(request.app).get(digest)
    return hit[1] if hit is not None and hit[0] > time.monotonic() else None


def _authenticate(request: Request, teams: TeamRepository, secret: str, digest: str) -> ApiKey | None:
    """``teams.authenticate`` (a database read), remembered in the per-process TTL cache by the hash."""
    cache = _key_cache(request.app)
    key = teams.authenticate(secret)
    now = time.monotonic()
    if key is None:
        cache.pop(digest, None)
        return None
    if len(cache) > 10_000:  # many keys: drop the expired ones (bounded memory)
        for d in [d for d, (exp, _) in cache.items() if exp <= now]:
            cache.pop(d, None)
    cache[digest] = (now + KEY_CACHE_TTL_S, key)
    return key


async def current_caller(
    request: Request,
    teams: TeamsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    """The caller of this request (401 without a valid key)."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise ApiError(
            401,
            "unauthorized",
            "this route needs an API key: send `Authorization: Bearer co_...` (an admin makes keys with "
            "`costopt admin create-team NAME`)",
            headers=_CHALLENGE,
        )
    secret = credentials.credentials
    digest = hash_key(secret.strip())
    key = _cached(request, digest)
    if key is None:
        key = await run_in_threadpool(_authenticate, request, teams, secret, digest)
    if key is None:
        raise ApiError(
            401,
            "unauthorized",
            "the API key is not valid (unknown, mistyped or revoked): ask an admin for a new one",
            headers=_CHALLENGE,
        )
    request.state.key_id = key.id
    _rate_limiter(request.app).check(key.id)  # 429 with Retry-After over the key's rate (api/tenancy.py)
    return Caller(key.id, key.team_id, key.role)


def _rate_limiter(app: Any) -> RateLimiter:
    limiter: RateLimiter | None = getattr(app.state, "rate_limiter", None)
    if limiter is None:
        settings = getattr(app.state, "settings", None)
        rate = float(getattr(settings, "rate_limit_per_s", 0.0))
        limiter = RateLimiter(rate, int(getattr(settings, "rate_limit_burst", 1)))
        app.state.rate_limiter = limiter
    return limiter


CallerDep = Annotated[Caller, Depends(current_caller)]


async def require_admin(caller: CallerDep) -> Caller:
    """The caller, when it holds an admin key (403 otherwise)."""
    if not caller.is_admin:
        raise ApiError(403, "forbidden", "this route needs an admin key; your key is a team member's")
    return caller


AdminDep = Annotated[Caller, Depends(require_admin)]

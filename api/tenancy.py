"""What one team may do to the service and to the others: its jobs' provider, checkpoint URI and image
checked against its policy (:class:`costopt.jobs.teams.TeamPolicy`, set by an admin), and a rate limit
per API key.

- **The service's own host.** Provider ``local`` runs a job's command as a process of the service's
  machine: a job (or a fleet) that would run on it is refused (403 ``local_provider_not_allowed``) unless
  an admin set ``allow_local_provider`` for the team (``PATCH /v1/admin/teams/{id}``).
- **Checkpoints and images.** A ``checkpoint_uri`` or ``image`` the submission names must start with one
  of the team's prefixes (or else the service's ``COSTOPT_ALLOWED_CHECKPOINT_PREFIXES`` /
  ``COSTOPT_ALLOWED_IMAGE_PREFIXES``); otherwise 422 ``checkpoint_not_allowed`` / ``image_not_allowed``
  listing what is allowed. A URI with a ``..`` segment, a backslash, a control character or a
  percent-escape is refused whatever the prefixes (it could step out of one). Without a
  ``checkpoint_uri`` the job checkpoints where the service puts it (``<checkpoint_root>/<job id>``).
- **Rate limit.** A token bucket per key and process (``COSTOPT_RATE_LIMIT_PER_S`` sustained,
  ``COSTOPT_RATE_LIMIT_BURST`` at once; 0: off): over it, 429 ``too_many_requests`` with
  ``Retry-After`` (whole seconds until a token is back).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from api.errors import ApiError
from costopt.jobs.teams import TeamPolicy
from costopt.settings import Settings

if TYPE_CHECKING:
    from api.job_schemas import JobCreate
    from costopt.jobs.teams import TeamRepository

__all__ = [
    "LOCAL_PROVIDER",
    "RateLimiter",
    "check_checkpoint",
    "check_image",
    "check_local",
    "check_team",
    "patched_policy",
    "refused_prefixes",
    "valid_prefix",
]

LOCAL_PROVIDER = "local"
"""The provider that runs a job's command on the service's own host."""

_HOW = "an admin sets the team's policy with `PATCH /v1/admin/teams/{team_id}`"


def check_local(policy: TeamPolicy, providers: Sequence[str], team_id: str) -> None:
    """403 when any of ``providers`` is the local one and the team may not use it."""
    if LOCAL_PROVIDER in providers and not policy.allow_local_provider:
        raise ApiError(
            403,
            "local_provider_not_allowed",
            f"this would run on the service's own host (provider {LOCAL_PROVIDER!r}), which team {team_id!r} "
            f'may not use: {_HOW.replace("{team_id}", team_id)} {{"allow_local_provider": true}}, or the '
            "service runs jobs on another provider (COSTOPT_PROVIDER)",
            [{"field": "provider", "problem": "the local provider is not enabled for this team"}],
        )


def _unsafe(uri: str) -> str | None:
    """Why ``uri`` may step out of any prefix (None: it cannot)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in uri):
        return "it holds a control character"
    if "\\" in uri:
        return "it holds a backslash"
    if "%" in uri:
        return "it holds a percent-escape"
    after_scheme = uri.split("://", 1)[-1]
    if any(part in (".", "..") for part in after_scheme.split("/")):
        return "it holds a '.' or '..' path segment"
    return None


def _check_prefixed(value: str, prefixes: Sequence[str], field: str, what: str, may: str, otherwise: str) -> None:
    """422 ``<what>_not_allowed`` unless ``value`` (the body's ``field``) is safe (:func:`_unsafe`) and starts
    with one of ``prefixes``; the message says what the team ``may`` do, or ``otherwise`` when no prefix is
    allowed."""
    why = _unsafe(value)
    if why is None and any(value.startswith(p) for p in prefixes):
        return
    allowed = ", ".join(prefixes) if prefixes else otherwise
    problem = why or "not under an allowed prefix"
    raise ApiError(
        422,
        f"{what}_not_allowed",
        f"{field} {value[:200]!r} is refused ({problem}); {may}: {allowed}. To allow another prefix, {_HOW}",
        [{"field": field, "problem": problem, "allowed": list(prefixes)}],
    )


def check_checkpoint(uri: str | None, policy: TeamPolicy, settings: Settings) -> None:
    """422 when the submission's ``checkpoint_uri`` is not under one of the team's prefixes (None: the
    service's default location, always allowed)."""
    if uri is None:
        return
    prefixes = (
        policy.checkpoint_prefixes if policy.checkpoint_prefixes is not None else settings.allowed_checkpoint_prefixes
    )
    _check_prefixed(
        uri,
        prefixes,
        "checkpoint_uri",
        "checkpoint",
        "this team may checkpoint under",
        "none (omit checkpoint_uri: the service chooses where)",
    )


def check_image(image: str | None, policy: TeamPolicy, settings: Settings) -> None:
    """422 when the submission's ``image`` does not start with one of the team's prefixes (None: the
    provider's image, always allowed)."""
    if image is None:
        return
    prefixes = policy.image_prefixes if policy.image_prefixes is not None else settings.allowed_image_prefixes
    _check_prefixed(
        image,
        prefixes,
        "image",
        "image",
        "this team's images may start with",
        "none (omit image: the provider's image runs the command)",
    )


def check_team(
    teams: TeamRepository,
    team_id: str,
    settings: Settings,
    *,
    bodies: Sequence[JobCreate] = (),
    providers: Sequence[str] = (),
) -> None:
    """The team's policy on a submission: each of ``bodies``' ``checkpoint_uri`` and ``image`` under its
    allowed prefixes (422), none of ``providers`` the local one unless enabled for the team (403). The
    team's row is read only when there is something to check."""
    given = [b for b in bodies if b.checkpoint_uri is not None or b.image is not None]
    if not given and LOCAL_PROVIDER not in providers:
        return
    policy = teams.policy(team_id)
    check_local(policy, providers, team_id)
    for b in given:
        check_checkpoint(b.checkpoint_uri, policy, settings)
        check_image(b.image, policy, settings)


def valid_prefix(prefix: str, kind: str) -> str | None:
    """Why an admin's ``prefix`` for ``kind`` (checkpoint or image) is refused (None: valid). A prefix
    ends at a boundary ('/', or ':' or '@' for an image), so ``s3://alpha/`` does not admit
    ``s3://alpha-other/``."""
    if not prefix or len(prefix) > 500:
        return "give 1-500 characters"
    unsafe = _unsafe(prefix)
    if unsafe:
        return f"it is unsafe: {unsafe}"
    ends = ("/",) if kind == "checkpoint" else ("/", ":", "@")
    if not prefix.endswith(ends):
        return f"end it with {' or '.join(repr(e) for e in ends)} (a prefix must stop at a boundary)"
    if kind == "checkpoint" and "://" not in prefix:
        return "give a URI with its scheme (s3://bucket/team/, gs://..., file:///...)"
    return None


def refused_prefixes(changes: Mapping[str, Any]) -> list[tuple[str, int, str, str]]:
    """The prefixes of a team policy's ``changes`` (the fields given to ``PATCH /v1/admin/teams/{id}``)
    that :func:`valid_prefix` refuses: ``(kind, index, prefix, why)`` each, kind ``checkpoint`` or ``image``."""
    return [
        (kind, i, prefix, why)
        for kind in ("checkpoint", "image")
        for i, prefix in enumerate(changes.get(f"{kind}_prefixes") or ())
        if (why := valid_prefix(prefix, kind)) is not None
    ]


def patched_policy(old: TeamPolicy, changes: Mapping[str, Any]) -> TeamPolicy:
    """``old`` with the fields given in ``changes`` (a field left out keeps its value):
    ``allow_local_provider`` (None: unchanged), ``checkpoint_prefixes`` / ``image_prefixes`` (None: back
    to the service's defaults). The prefixes are not checked here (:func:`refused_prefixes`)."""

    def prefixes(name: str, was: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if name not in changes:
            return was
        return None if changes[name] is None else tuple(changes[name])

    allow = changes.get("allow_local_provider")
    return TeamPolicy(
        old.allow_local_provider if allow is None else bool(allow),
        prefixes("checkpoint_prefixes", old.checkpoint_prefixes),
        prefixes("image_prefixes", old.image_prefixes),
    )


@dataclass
class RateLimiter:
    """Token buckets by API key id (one process): ``rate`` tokens per second up to ``burst``."""

    rate: float
    burst: int
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def take(self, key_id: str, now: float | None = None) -> float:
        """Spend a token of ``key_id``: 0.0 when it had one, else the seconds until it will."""
        if self.rate <= 0:
            return 0.0
        at = time.monotonic() if now is None else now
        tokens, last = self._buckets.get(key_id, (float(self.burst), at))
        tokens = min(float(self.burst), tokens + (at - last) * self.rate)
        if tokens >= 1.0:
            self._buckets[key_id] = (tokens - 1.0, at)
            if len(self._buckets) > 10_000:  # many keys: forget the full buckets (bounded memory)
                full = [k for k, (t, seen) in self._buckets.items() if t + (at - seen) * self.rate >= self.burst]
                for k in full:
                    self._buckets.pop(k, None)
            return 0.0
        self._buckets[key_id] = (tokens, at)
        return (1.0 - tokens) / self.rate

    def check(self, key_id: str) -> None:
        """429 with ``Retry-After`` when ``key_id`` is over its rate."""
        wait = self.take(key_id)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise ApiError(
                429,
                "too_many_requests",
                f"this API key sent more than {self.rate:g} requests/s (bursts of {self.burst}): retry in "
                f"{seconds} s (an admin raises COSTOPT_RATE_LIMIT_PER_S)",
                headers={"Retry-After": str(seconds)},
            )

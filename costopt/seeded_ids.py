"""Ids a drill can reproduce (``Settings.job_id_seed``): the same thing gets the same id in every run."""

from __future__ import annotations

import hashlib

__all__ = ["seeded_id"]


def seeded_id(prefix: str, seed: str, *parts: str) -> str:
    """Drills only: ``prefix`` and the first 16 hex digits of a SHA-256 of ``seed`` and ``parts``, so every
    run of a seed gives the same thing the same id (the service orders work by job id, a fleet's instances
    and the simulated cloud's instances by id). The parts must name one thing: a job by its team and
    idempotency key, a fleet instance by its fleet and its index among the fleet's first ones, a
    replacement by the instance it replaces."""
    digest = hashlib.sha256("\0".join((seed, *parts)).encode()).hexdigest()
    return f"{prefix}{digest[:16]}"

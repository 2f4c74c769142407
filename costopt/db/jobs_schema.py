"""The service's tables (migration ``0006``): teams, API keys, jobs, their events, batches, and the
leases that make each scheduled job run once per tick across service replicas.

Declared on the one ``metadata`` of :mod:`costopt.db.metadata`; :mod:`costopt.db.schema` imports this
module.

- ``teams``: who owns jobs. ``id`` is a short slug-like id (``team-<hex>``), ``name`` unique; its policy
  (:class:`costopt.jobs.teams.TeamPolicy`, migration ``0012``).
- ``api_keys``: one row per key. The key shown once to its owner is ``co_<key_id>_<secret>``; only
  ``key_hash`` (SHA-256 hex of the whole key) is stored; ``role`` is ``admin`` (sees and manages every
  team) or ``member`` (its team only). ``revoked_at`` not NULL: refused.
- ``jobs``: one row per submitted job; its ``id`` is also the migrator's job id (``migration_jobs``,
  ``migrations``, ``migration_copies``, the ledger's ``job_id``). ``state`` is
  :class:`costopt.jobs.model.JobState`; ``spec`` is the normalized submission (JSON: job type or
  throughputs, steps, GPUs, objective, constraints, command, image, checkpoint URI); ``quote`` is the
  planner's expectation at submission (JSON, money as decimal strings); ``offer`` the current
  placement (JSON :class:`~costopt.domain.OfferKey`) with ``usd_per_hour`` in effect when it was
  placed; ``steps_done`` the last progress the agent reported. ``(team_id, idempotency_key)`` is
  unique: a retried POST finds the first job. ``cancel_requested_at``: a cancel the engine
  has not finished yet (checkpoint, terminate, then ``cancelled``). ``version`` grows with every state change
  (compare-and-set writers).
- ``job_events``: every state change, move, preemption, recovery and failure of a job, in order
  (``id``), with its reason, and the cost it caused when known (``cost_usd``, Decimal USD).
- ``batches``: a collection of jobs planned together (``POST /v1/batches``); its jobs carry
  ``batch_id``.
- ``scheduler_leases``: one row per scheduled job name (``rebalance``, ``watch``, ``reconcile``,
  ``collect:<source>``, ...): which replica holds it until when, and the last tick it ran
  (``last_tick``: the tick's scheduled time, so a tick runs at most once across replicas).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Index, Integer, String, Table, Text, UniqueConstraint, false

from costopt.db.metadata import metadata
from costopt.db.types import ExactDecimal, UtcDateTime

teams = Table(
    "teams",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    # the team's policy (migration 0012): may its jobs run on the service's own host (provider local);
    # where may they checkpoint, which images may they name (JSON lists; NULL: the service's defaults)
    Column("allow_local_provider", Boolean(create_constraint=False), nullable=False, server_default=false()),
    Column("checkpoint_prefixes", Text(), nullable=True),
    Column("image_prefixes", Text(), nullable=True),
    UniqueConstraint("name"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(32), primary_key=True),  # the key's public id (``co_<id>_<secret>``)
    Column("team_id", String(64), nullable=False),
    Column("key_hash", String(64), nullable=False),  # sha256 hex of the whole key
    Column("role", String(16), nullable=False),  # admin | member
    Column("name", String(200), nullable=False, server_default=""),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("revoked_at", UtcDateTime(), nullable=True),
    Index("ix_api_keys_team", "team_id"),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("team_id", String(64), nullable=False),
    Column("batch_id", String(64), nullable=True),
    Column("name", String(200), nullable=False, server_default=""),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False, server_default=""),
    Column("spec", Text, nullable=False),  # JSON: the normalized submission
    Column("quote", Text, nullable=True),  # JSON: the plan at submission (money as decimal strings)
    Column("provider", String(32), nullable=False),
    Column("offer", Text, nullable=True),  # JSON OfferKey of the current placement
    Column("usd_per_hour", ExactDecimal(), nullable=True),  # price of ``offer`` when placed
    Column("steps_total", BigInteger, nullable=False),
    Column("steps_done", BigInteger, nullable=False, server_default="0"),
    Column("exit_code", Integer, nullable=True),
    Column("idempotency_key", String(200), nullable=True),
    Column("version", Integer, nullable=False, server_default="0"),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    Column("started_at", UtcDateTime(), nullable=True),  # first copy launched
    Column("finished_at", UtcDateTime(), nullable=True),  # succeeded, failed or cancelled
    Column("cancel_requested_at", UtcDateTime(), nullable=True),  # the engine checkpoints and terminates
    UniqueConstraint("team_id", "idempotency_key", name="uq_jobs_team_idempotency"),
    Index("ix_jobs_team_created", "team_id", "created_at", "id"),
    Index("ix_jobs_state", "state"),
    Index("ix_jobs_batch", "batch_id"),
)

job_events = Table(
    "job_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), nullable=False),
    Column("at", UtcDateTime(), nullable=False),
    Column("kind", String(32), nullable=False),  # state | move | preemption | recovery | checkpoint | error | ...
    Column("from_state", String(16), nullable=True),
    Column("to_state", String(16), nullable=True),
    Column("reason", Text, nullable=False, server_default=""),
    Column("cost_usd", ExactDecimal(), nullable=True),
    Column("detail", Text, nullable=True),  # JSON
    Index("ix_job_events_job", "job_id", "id"),
)

batches = Table(
    "batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("team_id", String(64), nullable=False),
    Column("objective", Text, nullable=False),  # JSON
    Column("plan", Text, nullable=True),  # JSON: the collection plan's summary
    Column("idempotency_key", String(200), nullable=True),
    Column("created_at", UtcDateTime(), nullable=False),
    UniqueConstraint("team_id", "idempotency_key", name="uq_batches_team_idempotency"),
    Index("ix_batches_team", "team_id", "created_at"),
)

scheduler_leases = Table(
    "scheduler_leases",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("owner", String(128), nullable=True),
    Column("expires_at", UtcDateTime(), nullable=True),
    Column("last_tick", UtcDateTime(), nullable=True),
    Column("runs", BigInteger, nullable=False, server_default="0"),
    Column("updated_at", UtcDateTime(), nullable=False),
)

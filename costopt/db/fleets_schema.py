"""Leased fleets (migration ``0009``), on the one ``metadata`` of :mod:`costopt.db.metadata`.

``costopt/db/schema.py`` imports this module, so Alembic and ``compare_metadata`` see these tables.

- ``fleets``: a team's fleet: the Gavel policy that shares it (a name of
  :data:`costopt.gavel.policies.POLICIES`), the round length, how often the policy is re-solved without
  an arrival or a departure (``resolve_rounds``), its state (``active``, ``released``), the current round
  (``round``; 0: none yet) and when it ends, the allocation in force (JSON: job ids, worker types, time
  fractions, the round it was solved at) and ``dirty`` (jobs or GPUs changed since that solve).
- ``fleet_instances``: one row per instance of a fleet (its id, ``fi-...``, is also its worker's id): the
  offer, its accelerator and GPUs, the provider and the cloud's instance id once launched, a state
  (``pending``, ``launching``, ``running``, ``draining``, ``lost``, ``released``), the SHA-256 of its
  worker's token (never the token), when the worker was last heard from, and the instance it replaces;
  ``billed_to`` (migration ``0013``): set to ``ended_at`` once the ledger has the instance's life to its end
  (every round it took part in, and its time after the last one); NULL while not (or not ended).
- ``fleet_jobs``: one row per job submitted into a fleet (``job_id`` is the ``jobs`` row's): weight, SLO,
  GPUs, throughput on each of the fleet's worker types (steps/s; resolved at submission), progress
  reported by its copies, the seconds of leases it received on each type (the round mechanism's
  history), the seconds of allocation it had in force on each type over the same rounds (``owed``,
  migration ``0015``; decayed to ``owed_at`` when the policy's mechanism rule forgets: the allocation
  integral the mechanism resumes from), the fencing epoch of its latest copy, where it runs
  (``holder``: the instance a copy may run on now) and where the current round puts it (``target``).
- ``fleet_rounds``: one row per round of a fleet: when it started and ended, the worker types' GPUs,
  and its assignment (JSON: job, instance, GPU indices, worker type, epoch): what the ledger bills from.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from costopt.db.metadata import metadata
from costopt.db.types import ExactDecimal, UtcDateTime

fleets = Table(
    "fleets",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("team_id", String(64), nullable=False),
    Column("name", String(200), nullable=False, server_default=""),
    Column("policy", String(100), nullable=False),
    Column("round_s", Float, nullable=False),
    Column("resolve_rounds", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("spec", Text, nullable=False),  # JSON: the normalized request
    Column("round", Integer, nullable=False, server_default="0"),
    Column("round_started_at", UtcDateTime(), nullable=True),
    Column("round_ends_at", UtcDateTime(), nullable=True),
    Column("allocation", Text, nullable=True),  # JSON: the allocation in force
    Column("solved_round", Integer, nullable=True),
    Column("dirty", Boolean, nullable=False, server_default="1"),
    Column("idempotency_key", String(200), nullable=True),
    Column("version", Integer, nullable=False, server_default="0"),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    Column("released_at", UtcDateTime(), nullable=True),
    UniqueConstraint("team_id", "idempotency_key", name="uq_fleets_team_idempotency"),
    Index("ix_fleets_team_created", "team_id", "created_at", "id"),
    Index("ix_fleets_state", "state"),
)

fleet_instances = Table(
    "fleet_instances",
    metadata,
    Column("id", String(64), primary_key=True),  # fi-<hex>: also the worker's id
    Column("fleet_id", String(64), nullable=False),
    Column("provider", String(32), nullable=False),
    Column("offer", Text, nullable=False),  # JSON OfferKey
    Column("accelerator", String(64), nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("usd_per_hour", ExactDecimal(), nullable=True),  # the offer's price when it was chosen
    Column("state", String(16), nullable=False),
    Column("instance_id", String(200), nullable=True),  # the cloud's, once launched
    Column("launch_token", String(200), nullable=True),
    Column("token_hash", String(64), nullable=True),  # sha256 hex of the worker's token
    Column("replaces", String(64), nullable=True),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("launched_at", UtcDateTime(), nullable=True),
    Column("first_seen_at", UtcDateTime(), nullable=True),
    Column("last_seen_at", UtcDateTime(), nullable=True),
    Column("ended_at", UtcDateTime(), nullable=True),
    Column("end_reason", Text, nullable=True),
    Column("billed_to", UtcDateTime(), nullable=True),  # migration 0013: in the ledger up to here (its end)
    Index("ix_fleet_instances_fleet", "fleet_id", "created_at"),
)

fleet_jobs = Table(
    "fleet_jobs",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("fleet_id", String(64), nullable=False),
    Column("team_id", String(64), nullable=False),
    Column("weight", Float, nullable=False),
    Column("slo_s", Float, nullable=True),
    Column("gpus", Integer, nullable=False),
    Column("throughput", Text, nullable=False),  # JSON {worker type: steps/s}
    Column("steps_total", BigInteger, nullable=False),
    Column("steps_done", BigInteger, nullable=False, server_default="0"),
    Column("checkpoint_step", BigInteger, nullable=False, server_default="0"),
    Column("arrived_at", UtcDateTime(), nullable=False),
    Column("status", String(16), nullable=False),
    Column("epoch", Integer, nullable=False, server_default="0"),
    Column("holder", String(64), nullable=True),
    Column("holder_epoch", Integer, nullable=True),
    Column("target", String(64), nullable=True),
    Column("target_gpus", Text, nullable=True),  # JSON [gpu index, ...]
    Column("target_round", Integer, nullable=True),
    Column("received", Text, nullable=False, server_default="{}"),  # JSON {worker type: seconds}
    Column("owed", Text, nullable=False, server_default="{}"),  # JSON {worker type: seconds} (migration 0015)
    Column("owed_at", UtcDateTime(), nullable=True),  # the time ``owed`` is decayed to
    Column("ever_ran", Boolean, nullable=False, server_default="0"),
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("reason", Text, nullable=False, server_default=""),
    Column("started_at", UtcDateTime(), nullable=True),
    Column("finished_at", UtcDateTime(), nullable=True),
    Column("updated_at", UtcDateTime(), nullable=False),
    Index("ix_fleet_jobs_fleet", "fleet_id", "arrived_at"),
)

fleet_rounds = Table(
    "fleet_rounds",
    metadata,
    Column("fleet_id", String(64), nullable=False),
    Column("round", Integer, nullable=False),
    Column("started_at", UtcDateTime(), nullable=False),
    Column("ends_at", UtcDateTime(), nullable=False),
    Column("ended_at", UtcDateTime(), nullable=True),
    Column("capacity", Text, nullable=False),  # JSON {worker type: GPUs}
    Column("assignment", Text, nullable=False),  # JSON [{job_id, instance, gpus, type, epoch}]
    Column("solved", Boolean, nullable=False, server_default="0"),
    Column("billed", Boolean, nullable=False, server_default="0"),
    PrimaryKeyConstraint("fleet_id", "round", name="pk_fleet_rounds"),
)

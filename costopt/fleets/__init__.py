"""Leased fleets: a team's instances shared among its jobs by a Gavel policy, round by round.

- :mod:`costopt.fleets.model`: records, states, admission (can the fleet run a job?);
- :mod:`costopt.fleets.store`: :class:`~costopt.fleets.store.FleetRepository`, the one writer of the
  fleet tables (:mod:`costopt.db.fleets_schema`).
"""

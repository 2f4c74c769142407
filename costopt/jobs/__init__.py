"""Managed jobs: the service's side of a job from submission to finish (states, records, engine)."""

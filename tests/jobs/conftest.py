"""Fixtures of the job tests: the shared local provider (jobs as subprocesses of this machine)."""

from tests.migration.conftest import local  # noqa: F401

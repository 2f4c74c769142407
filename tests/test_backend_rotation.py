"""The suite's own rule for modules marked ``one_backend_each`` (tests/conftest.py): each case runs on one
backend, SQLite and PostgreSQL in turn, and on both with ``COSTOPT_TEST_ALL_BACKENDS=1``."""

from __future__ import annotations

import pytest

from tests.conftest import ALL_BACKENDS_ENV

pytest_plugins = ["pytester"]

_CONFTEST = """
import pytest
from tests.conftest import pytest_collection_modifyitems  # the rule under test

@pytest.fixture(params=["sqlite", "postgres"])
def engine(request):
    return request.param
"""

_TESTS = """
import pytest

pytestmark = pytest.mark.one_backend_each

@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a(engine, cloud):
    pass

def test_b(engine):
    pass

def test_c():
    pass
"""


def _collected(pytester: pytest.Pytester) -> list[str]:
    pytester.makeconftest(_CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    one_backend_each: x\n    slow: x\n")
    pytester.makepyfile(test_rotation=_TESTS)
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:randomly", "-p", "no:xdist")
    return sorted(line.split("::")[1] for line in result.outlines if "::" in line)


def test_each_marked_case_runs_on_one_backend_the_two_in_turn(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ALL_BACKENDS_ENV, raising=False)
    assert _collected(pytester) == [
        "test_a[postgres-gcp]",
        "test_a[sqlite-aws]",
        "test_a[sqlite-azure]",
        "test_b[postgres]",
        "test_c",
    ]


def test_every_case_runs_on_both_backends_when_asked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ALL_BACKENDS_ENV, "1")
    got = _collected(pytester)
    assert len(got) == 9 and "test_b[sqlite]" in got and "test_a[postgres-azure]" in got

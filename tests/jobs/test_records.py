"""The job repository and the team keys on both backends: idempotent submission, compare-and-set
transitions with their events, stable paging, team scoping, key hashing and revocation."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select

from costopt.db.jobs_schema import api_keys
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.model import TERMINAL_STATES, TRANSITIONS, JobState, can_transition
from costopt.jobs.records import ConcurrentUpdate, IllegalTransition, JobNotFound, JobRepository, NewJob
from costopt.jobs.teams import Role, TeamError, TeamRepository


class Clock:
    def __init__(self) -> None:
        self.t = datetime(2020, 3, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.t += timedelta(seconds=1)
        return self.t


@pytest.fixture
def repo(engine):
    return JobRepository(engine, now=Clock())


def _new(team: str = "team-a", key: str | None = None, **kw) -> NewJob:
    return NewJob(
        team_id=team,
        spec={"job_type": "ResNet-50 (batch size 128)"},
        steps_total=100,
        provider="sim",
        idempotency_key=key,
        **kw,
    )


def test_terminal_states_have_no_way_out_and_every_active_state_can_fail_or_be_cancelled():
    for state in JobState:
        if state in TERMINAL_STATES:
            assert TRANSITIONS[state] == frozenset()
        else:
            assert can_transition(state, JobState.CANCELLED)
            assert can_transition(state, JobState.FAILED)
        assert not can_transition(state, state)


def test_a_retried_submission_returns_the_first_job(repo):
    first, created = repo.create(_new(key="k1"))
    again, created_again = repo.create(_new(key="k1"))
    assert created and not created_again
    assert again.id == first.id
    assert repo.page(team_id="team-a").total == 1
    other, created_other = repo.create(_new(team="team-b", key="k1"))
    assert created_other and other.id != first.id


def test_racing_submissions_with_one_key_make_one_job(repo):
    ids: list[str] = []
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            ids.append(repo.create(_new(key="race"))[0].id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(ids)) == 1
    assert repo.page(team_id="team-a").total == 1


def test_transitions_are_compare_and_set_and_leave_events(repo):
    job, _ = repo.create(_new())
    offer = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
    job = repo.transition(job.id, JobState.LAUNCHING, "planned")
    job = repo.transition(job.id, JobState.RUNNING, "launched", offer=offer, usd_per_hour=Decimal("0.918"))
    assert job.offer == offer and job.usd_per_hour == Decimal("0.918")
    assert job.started_at is not None and job.finished_at is None
    with pytest.raises(ConcurrentUpdate):
        repo.transition(job.id, JobState.SUCCEEDED, "done", expect=JobState.MIGRATING)
    job = repo.transition(job.id, JobState.SUCCEEDED, "all 100 steps done", expect=JobState.RUNNING)
    assert job.finished_at is not None and job.state is JobState.SUCCEEDED
    with pytest.raises(IllegalTransition):
        repo.transition(job.id, JobState.RUNNING, "again")
    events = repo.events(job.id)
    assert [(e.from_state, e.to_state) for e in events] == [
        (None, "queued"),
        ("queued", "launching"),
        ("launching", "running"),
        ("running", "succeeded"),
    ]
    assert [e.reason for e in events][-1] == "all 100 steps done"


def test_the_work_lists_read_jobs_without_their_quote_unless_asked(repo):
    quote = {"usd_per_hour": 1.0, "candidates": [{"offer": {"cloud": "aws"}}]}
    with_quote, _ = repo.create(_new(quote=quote))
    bare, _ = repo.create(_new())
    listed = repo.in_states([JobState.QUEUED])
    assert [j.id for j in listed] == [with_quote.id, bare.id] and [j.quote for j in listed] == [None, None]
    assert listed[0] == replace(repo.get(with_quote.id), quote=None)  # nothing else left out
    full = repo.in_states([JobState.QUEUED], with_quote=True)
    assert [j.quote for j in full] == [quote, None] and full[0] == repo.get(with_quote.id)
    assert repo.in_states([JobState.RUNNING]) == []


def test_many_reads_the_jobs_that_exist_by_id_in_one_query_without_quotes(repo):
    quote = {"usd_per_hour": 1.0}
    made = [repo.create(_new(quote=quote))[0] for _ in range(20)]
    assert repo.many([]) == {}
    two = repo.many([made[3].id, "job-missing", made[0].id, made[3].id])  # a missing id is left out
    assert set(two) == {made[0].id, made[3].id}
    assert two[made[3].id] == replace(repo.get(made[3].id), quote=None)  # everything but the quote
    every = repo.many([j.id for j in made])  # past the 16 prebuilt lengths: the expanding form
    assert set(every) == {j.id for j in made} and all(r.quote is None for r in every.values())


def test_progress_never_goes_back(repo):
    job, _ = repo.create(_new())
    repo.set_progress(job.id, 40)
    repo.set_progress(job.id, 30)
    assert repo.get(job.id).steps_done == 40


def test_paging_is_stable_and_scoped(repo):
    made = [repo.create(_new(team="team-a" if i % 3 else "team-b"))[0].id for i in range(10)]
    seen: list[str] = []
    cursor = None
    while True:
        page = repo.page(team_id="team-a", limit=3, cursor=cursor)
        seen += [j.id for j in page.items]
        assert page.total == 6
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [m for i, m in enumerate(made) if i % 3]
    assert repo.page(limit=500).total == 10
    with pytest.raises(JobNotFound):
        repo.get(made[0], team_id="team-a")  # team-b's job
    with pytest.raises(ValueError, match="cursor"):
        repo.page(cursor="garbage")


def test_cancel_of_a_queued_job_is_immediate_and_of_a_running_one_is_requested(repo):
    queued, _ = repo.create(_new())
    assert repo.request_cancel(queued.id).state is JobState.CANCELLED
    running, _ = repo.create(_new())
    repo.transition(running.id, JobState.LAUNCHING, "planned")
    repo.transition(running.id, JobState.RUNNING, "launched")
    job = repo.request_cancel(running.id)
    assert job.state is JobState.RUNNING and job.cancel_requested_at is not None
    assert repo.request_cancel(running.id).cancel_requested_at == job.cancel_requested_at
    with pytest.raises(JobNotFound):
        repo.request_cancel(running.id, team_id="team-b")
    assert repo.count_by_state()[JobState.CANCELLED] == 1


def test_keys_are_stored_as_hashes_and_checked(engine):
    teams = TeamRepository(engine)
    team = teams.create_team("vision")
    with pytest.raises(TeamError, match="exists already"):
        teams.create_team("vision")
    issued = teams.create_key(team.id, Role.MEMBER, "ci")
    with engine.connect() as conn:
        stored = conn.execute(select(api_keys.c.key_hash)).scalars().all()
    assert issued.secret not in stored and all(len(h) == 64 for h in stored)
    key = teams.authenticate(issued.secret)
    assert key is not None and key.team_id == team.id and key.role is Role.MEMBER
    assert teams.authenticate(issued.secret[:-1] + ("A" if issued.secret[-1] != "A" else "B")) is None
    assert teams.authenticate("not-a-key") is None
    assert teams.revoke(key.id)
    assert teams.authenticate(issued.secret) is None


def test_bootstrap_makes_one_admin_key(engine):
    teams = TeamRepository(engine)
    first = teams.bootstrap_admin()
    assert first is not None and first.key.role is Role.ADMIN
    assert teams.bootstrap_admin() is None
    assert teams.authenticate(first.secret) is not None

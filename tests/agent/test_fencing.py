"""Fencing: two copies of a job never both write; a stale epoch writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from costopt.agent import Agent, StaleEpoch, control
from costopt.agent.layout import CHECKPOINT_DIR, list_checkpoints, write_epoch_marker
from costopt.agent.storage import LocalStorage, open_storage


def _files(uri: str) -> list[str]:
    d = Path(uri) / CHECKPOINT_DIR
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_epoch_2_claims_so_epoch_1s_checkpoint_raises_stale_epoch_and_writes_nothing(make_agent, uri):
    old = make_agent(epoch=1)
    old.restore()
    old.checkpoint(10, {"s": 10})
    control.claim_epoch(uri, 2)  # the migrator, before launching epoch 2
    before = _files(uri)
    with pytest.raises(StaleEpoch) as err:
        old.checkpoint(20, {"s": 20})
    assert (err.value.epoch, err.value.current) == (1, 2)
    assert _files(uri) == before
    assert old.stale and old.should_stop() and not old.should_checkpoint()


def test_a_newer_copys_restore_fences_out_the_older_copy(make_agent, uri):
    old = make_agent(epoch=1)
    old.restore()
    new = make_agent(epoch=2)
    new.restore()  # the agent claims its own epoch even if the migrator did not
    with pytest.raises(StaleEpoch):
        old.checkpoint(5, {})
    assert _files(uri) == []


def test_a_checkpoint_of_a_newer_epoch_fences_even_without_the_marker(make_agent, uri):
    old = make_agent(epoch=1)
    old.restore()
    new = make_agent(epoch=2)
    new.restore()
    new.checkpoint(3, {})
    (Path(uri) / "epoch.json").unlink()  # the marker lost (or a store without it)
    with pytest.raises(StaleEpoch, match="latest checkpoint"):
        old.checkpoint(7, {})
    assert [r.epoch for r in list_checkpoints(open_storage(uri))] == [2]


def test_a_copy_launched_after_a_newer_epoch_claimed_refuses_to_start(make_agent, uri):
    control.claim_epoch(uri, 5)
    with pytest.raises(StaleEpoch):
        make_agent(epoch=4).restore()


def test_a_write_that_loses_the_race_to_a_newer_claim_is_withdrawn(uri, clock):
    class ClaimDuringWrite(LocalStorage):
        """The migrator claims epoch 2 while epoch 1 is publishing (between check and rename)."""

        def write_atomic(self, name: str, data: bytes, *, temp_tag: str = "") -> None:
            super().write_atomic(name, data, temp_tag=temp_tag)
            if name.startswith(CHECKPOINT_DIR) and temp_tag == "e1":
                control.claim_epoch(uri, 2)

    old = Agent("job-1", uri, 1, storage=ClaimDuringWrite(uri), clock=clock)
    old.restore()
    with pytest.raises(StaleEpoch):
        old.checkpoint(10, {"s": 10})
    assert _files(uri) == []  # withdrawn: nobody can restore it


def test_claim_epoch_is_idempotent_and_never_goes_back(uri):
    assert control.claim_epoch(uri, 2) == 2
    assert control.claim_epoch(uri, 2) == 2
    assert control.current_epoch(uri) == 2
    with pytest.raises(StaleEpoch):
        control.claim_epoch(uri, 1)
    assert control.current_epoch(uri) == 2


def test_the_stale_copy_notices_the_newer_epoch_while_polling(make_agent, uri, clock):
    old = make_agent(epoch=1, stale_check_interval=5.0)
    old.restore()
    assert not old.should_stop()
    control.claim_epoch(uri, 2)
    clock.advance(1.0)
    assert not old.should_stop()  # not polled yet (throttled by the clock)
    clock.advance(5.0)
    assert old.should_stop() and old.stale
    records = control.records(uri)
    assert any(r["event"] == "stale" and r["epoch"] == 1 for r in records)


def test_a_marker_lowered_by_a_concurrent_older_claim_is_raised_back_before_writing(make_agent, uri):
    new = make_agent(epoch=3)
    new.restore()
    write_epoch_marker(open_storage(uri), 2, at=0.0, by="agent")  # epoch 2's concurrent claim lands last
    new.checkpoint(1, {})
    assert control.current_epoch(uri) == 3

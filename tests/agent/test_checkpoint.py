"""Restore/checkpoint round trips, atomic publication, and the job contract from the environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from costopt.agent import Agent, AgentConfigError, CheckpointError, ForeignCheckpoint, contract_env, control
from costopt.agent.layout import CHECKPOINT_DIR, checkpoint_name, list_checkpoints
from costopt.agent.storage import TEMP_PREFIX, LocalStorage, open_storage
from costopt.settings import PROJECT_ROOT


def test_a_new_job_restores_nothing_and_claims_its_epoch(make_agent, uri):
    agent = make_agent(epoch=3)
    assert agent.restore() is None
    assert control.current_epoch(uri) == 3
    assert control.progress(uri, 3).started


def test_restore_returns_the_step_and_state_last_checkpointed(make_agent):
    first = make_agent()
    first.restore()
    first.checkpoint(10, {"w": [0.1, 0.2], "note": "x"})
    first.checkpoint(20, {"w": [0.3, 1e-300], "note": "y"})
    ckpt = make_agent().restore()
    assert ckpt is not None
    assert (ckpt.step, ckpt.epoch, ckpt.state) == (20, 1, {"w": [0.3, 1e-300], "note": "y"})
    assert ckpt.run_id == first.run_id


def test_bytes_state_round_trips_bit_for_bit(make_agent):
    payload = bytes(range(256)) * 100
    a = make_agent()
    a.restore()
    a.checkpoint(5, payload, meta={"format": "raw"})
    ckpt = make_agent(epoch=2).restore()
    assert ckpt is not None and ckpt.state == payload and ckpt.meta == {"format": "raw"}


def test_a_newer_epoch_restores_the_older_epochs_checkpoint_and_supersedes_it(
    make_agent: Callable[..., Agent], uri: str
) -> None:
    a = make_agent(epoch=1)
    a.restore()
    a.checkpoint(100, {"s": 100})
    b = make_agent(epoch=2)
    restored = b.restore()
    assert restored is not None and restored.step == 100
    b.checkpoint(100, {"s": "b100"})
    latest = control.latest(uri)
    assert latest is not None and (latest.epoch, latest.step) == (2, 100)


def test_only_the_last_checkpoints_are_kept(make_agent, uri):
    a = make_agent(keep=2)
    a.restore()
    for step in (1, 2, 3, 4):
        a.checkpoint(step, {"s": step})
    assert [r.step for r in list_checkpoints(open_storage(uri))] == [3, 4]


def test_a_checkpoint_older_than_the_restored_step_is_refused(make_agent):
    a = make_agent()
    a.restore()
    a.checkpoint(50, {})
    b = make_agent(epoch=2)
    b.restore()
    with pytest.raises(CheckpointError, match="go back"):
        b.checkpoint(49, {})


def test_a_state_that_is_neither_bytes_nor_json_is_refused_before_anything_is_written(make_agent, uri):
    a = make_agent()
    a.restore()
    with pytest.raises(CheckpointError, match="bytes or JSON"):
        a.checkpoint(1, {"w": object()})
    assert list_checkpoints(open_storage(uri)) == []


def test_a_location_holding_another_jobs_checkpoints_is_refused(uri, clock):
    other = Agent("job-other", uri, 1, clock=clock)
    other.restore()
    other.checkpoint(1, {})
    with pytest.raises(ForeignCheckpoint, match="job-other"):
        Agent("job-1", uri, 2, clock=clock).restore()


def test_a_torn_checkpoint_file_is_skipped_and_the_previous_one_restored(make_agent, uri):
    a = make_agent()
    a.restore()
    a.checkpoint(10, {"s": 10})
    # A non-atomic store (or a disk error) leaves a truncated file under a final name.
    good = (Path(uri) / checkpoint_name(1, 10)).read_bytes()
    (Path(uri) / checkpoint_name(1, 20)).write_bytes(good[: len(good) - 3])
    ckpt = make_agent().restore()
    assert ckpt is not None and ckpt.step == 10


def test_a_crash_between_the_temporary_write_and_the_rename_keeps_the_previous_latest(make_agent, uri, monkeypatch):
    a = make_agent()
    a.restore()
    a.checkpoint(10, {"s": 10})

    def crash(src, dst):  # the process "dies" right after writing the temporary file
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        a.checkpoint(20, {"s": 20})
    monkeypatch.undo()
    temps = [p.name for p in (Path(uri) / CHECKPOINT_DIR).iterdir() if p.name.startswith(TEMP_PREFIX)]
    assert len(temps) == 1  # the full temporary file is there, never under the final name
    ckpt = make_agent(epoch=2).restore()
    assert ckpt is not None and (ckpt.step, ckpt.state) == (10, {"s": 10})
    # The new epoch removed the older epoch's leftover temporary file.
    assert not [p for p in (Path(uri) / CHECKPOINT_DIR).iterdir() if p.name.startswith(TEMP_PREFIX)]


CRASHING_WRITER = """
import os, signal, sys
from costopt.agent import Agent
a = Agent("job-1", sys.argv[1], 1)
a.restore()
a.checkpoint(10, {"s": 10})
real_replace = os.replace
def die(src, dst):
    if "ckpt-" in str(dst):
        os.kill(os.getpid(), signal.SIGKILL)   # a real crash: no exception handler runs
    real_replace(src, dst)
os.replace = die
a.checkpoint(20, {"s": 20, "big": "x" * 100000})
"""


def test_a_writer_killed_by_sigkill_mid_checkpoint_never_leaves_a_torn_latest(uri):
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, uri], cwd=PROJECT_ROOT, capture_output=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL
    info = control.latest(uri)
    assert info is not None and info.step == 10
    assert (Path(uri) / CHECKPOINT_DIR).joinpath(Path(checkpoint_name(1, 20)).name).exists() is False


def test_local_storage_accepts_paths_and_file_uris(tmp_path):
    for uri in (str(tmp_path / "a"), f"file://{tmp_path / 'b'}", f"file://localhost{tmp_path / 'c'}"):
        st = open_storage(uri)
        assert isinstance(st, LocalStorage)
        st.write_atomic("x/y.json", b"{}")
        assert st.read_bytes("x/y.json") == b"{}"
    with pytest.raises(ValueError, match="remote host"):
        open_storage("file://elsewhere/tmp/x")


def test_from_env_reads_the_contract(uri, clock):
    env = contract_env("job-7", uri, 4)
    agent = Agent.from_env(env, install_signals=False, clock=clock)
    assert (agent.job_id, agent.uri, agent.epoch) == ("job-7", uri, 4)
    assert agent.notice_sources == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "COSTOPT_JOB_ID, COSTOPT_CHECKPOINT_URI, COSTOPT_EPOCH"),
        ({"COSTOPT_JOB_ID": "j", "COSTOPT_CHECKPOINT_URI": "/tmp/x", "COSTOPT_EPOCH": "two"}, "not an integer"),
        ({"COSTOPT_JOB_ID": "j", "COSTOPT_CHECKPOINT_URI": "/tmp/x", "COSTOPT_EPOCH": "0"}, ">= 1"),
    ],
)
def test_from_env_refuses_an_incomplete_contract(env, message):
    with pytest.raises(AgentConfigError, match=message):
        Agent.from_env(env, install_signals=False)


def test_contract_env_builds_the_three_variables():
    assert contract_env("j", "s3://b/j", 2) == {
        "COSTOPT_JOB_ID": "j",
        "COSTOPT_CHECKPOINT_URI": "s3://b/j",
        "COSTOPT_EPOCH": "2",
    }
    with pytest.raises(ValueError, match="start at 1"):
        contract_env("j", "/x", 0)

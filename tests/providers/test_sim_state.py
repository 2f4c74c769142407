"""The simulated cloud's durable state (``SimCloud.persist_to`` / ``restore``): a service killed with
kill -9 restarts and finds its cloud as a real cloud would keep it: same clock, instances, agents (their
progress), idempotency tokens and drawn preemptions; the restored cloud ends exactly where one that never
stopped ends."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from costopt.agent import control
from costopt.cloud import InstanceState
from providers.sim import SimCloud, SimError
from tests.providers.test_sim_agent import SPOT, START, make_cloud, spec


def _run(cloud: SimCloud, until_h: float) -> None:
    cloud.run_to(START + timedelta(hours=until_h))


def _states(cloud: SimCloud) -> list[tuple[str, InstanceState, int | None, object]]:
    return [(i.instance_id, i.state, i.exit_code, i.terminated_at) for i in cloud.list({})]


def test_a_restored_cloud_continues_exactly_where_the_saved_one_was(tmp_path: Path) -> None:
    state = tmp_path / "sim.state"
    # the reference: never stopped (its own checkpoint folders)
    ref = make_cloud(spot_hazard=0.5, seed=7)
    ref_uris = [str(tmp_path / f"ref{k}") for k in range(3)]
    for k, uri in enumerate(ref_uris):
        ref.launch(spec(uri, steps=12_000, offer=SPOT), f"tok-{k}")
    _run(ref, 1.5)
    ref_mid = _states(ref)
    _run(ref, 12)

    cloud = make_cloud(spot_hazard=0.5, seed=7)
    cloud.persist_to(state)
    uris = [str(tmp_path / f"ref{k}x") for k in range(3)]
    for k, uri in enumerate(uris):
        cloud.launch(spec(uri, steps=12_000, offer=SPOT), f"tok-{k}")
    _run(cloud, 1.5)
    saves = cloud.saves
    assert saves >= 4  # the first write, three launches, the run
    del cloud  # the process dies: nothing but the file and the checkpoint folders is left

    back = SimCloud.restore(state, make_cloud().prices, make_cloud(spot_hazard=0.5).hazards, config=make_cloud().config)
    assert back.now() == START + timedelta(hours=1.5)
    assert _states(back) == ref_mid
    # the same token finds the same instance (no second launch after a restart)
    assert back.launch(spec(uris[0], steps=12_000, offer=SPOT), "tok-0").instance_id == ref_mid[0][0]
    _run(back, 12)
    assert _states(back) == _states(ref)
    kept = back.interruptions(START)
    assert kept == ref.interruptions(START) and any(i.kind == "preempted" for i in kept)  # the draws were kept
    for mine, theirs in zip(uris, ref_uris, strict=True):
        assert control.progress(mine, 1).checkpoints == control.progress(theirs, 1).checkpoints
    assert back.saves > saves  # it keeps saving to the same file
    again = SimCloud.restore(state, make_cloud().prices)
    assert again.now() == back.now() and _states(again) == _states(back)


def test_an_unreadable_state_file_says_what_to_do(tmp_path: Path) -> None:
    bad = tmp_path / "sim.state"
    bad.write_bytes(b"not a pickle")
    with pytest.raises(SimError, match="delete the file"):
        SimCloud.restore(bad, make_cloud().prices)


def test_a_kill_inside_a_tick_undoes_the_agents_writes_the_saved_state_does_not_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies after the agents wrote records and checkpoints in a tick but before the state file
    was saved: the restored cloud puts their files back (the undo journal), so no step is counted twice."""
    state = tmp_path / "sim.state"
    ref = make_cloud()
    ref_uri = str(tmp_path / "ref")
    ref.launch(spec(ref_uri, steps=12_000), "tok")
    _run(ref, 4)

    cloud = make_cloud()
    cloud.persist_to(state)
    uri = str(tmp_path / "mine")
    cloud.launch(spec(uri, steps=12_000), "tok")
    _run(cloud, 0.5)
    before = control.progress(uri, 1)

    def die() -> None:
        raise RuntimeError("killed before the save")

    monkeypatch.setattr(cloud, "_save", die)
    with pytest.raises(RuntimeError):
        _run(cloud, 1.2)  # the agent wrote a checkpoint and step records: the state file does not hold them
    assert control.progress(uri, 1).checkpoints != before.checkpoints
    del cloud

    back = SimCloud.restore(state, make_cloud().prices, config=make_cloud().config)
    assert back.now() == START + timedelta(hours=0.5)
    assert control.progress(uri, 1).checkpoints == before.checkpoints  # the files are where the state is
    _run(back, 4)
    audit = control.audit_job(uri, 12_000)
    assert audit.ok and audit.steps_done == 12_000 and audit.repeated_steps == 0, audit.problems
    assert control.progress(uri, 1).checkpoints == control.progress(ref_uri, 1).checkpoints

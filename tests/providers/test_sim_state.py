"""The simulated cloud's durable state (``SimCloud.persist_to`` / ``restore``): a service killed with
kill -9 restarts and finds its cloud as a real cloud would keep it: same clock, instances, agents (their
progress), idempotency tokens and drawn preemptions; the restored cloud ends exactly where one that never
stopped ends."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from costopt.agent import control
from costopt.agent.worker import WorkerConfig
from costopt.cloud import InstanceState, LaunchSpec
from costopt.risk.hazard import HazardModel
from providers.sim import SimCloud, SimConfig, SimError
from providers.sim_agent import CONSOLE_LINES
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


def test_a_kill_after_a_fleet_workers_sync_does_not_undo_what_the_service_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet worker's copy finishes inside a tick and the worker's sync reports it (the service records the
    job done); the process dies before the tick's end. The restored cloud's checkpoint location must agree
    with what the service recorded: the state was saved before the sync left the cloud, so the copy's final
    checkpoint and ``done`` are not undone (without that save they were, and the job, done for the service,
    had no ``done`` record)."""
    from tests.providers.test_sim_worker import OFFER, POLL, TIMING, Service, _lease, _prices
    from tests.providers.test_sim_worker import START as W_START

    class DoneService(Service):
        """The scripted service, which leases a job no more once a copy reported it finished."""

        def transport(self, config: WorkerConfig) -> Any:
            post = super().transport(config)

            def sync(path: str, doc: Mapping[str, Any]) -> Mapping[str, Any]:
                if any(c["state"] == "exited" and c["exit_code"] == 0 for c in doc["copies"]):
                    self.run = []
                answer: Mapping[str, Any] = post(path, doc)
                return answer

            return sync

    state = tmp_path / "sim.state"
    config = SimConfig(timing=TIMING, worker_poll=POLL)
    cloud = SimCloud(_prices(), HazardModel(), start=W_START, config=config)
    cloud.persist_to(state)
    service = DoneService()
    service.clock = cloud
    cloud.attach_fleet(service.transport)
    env = {
        "COSTOPT_SERVICE_URL": "http://svc",
        "COSTOPT_FLEET_ID": "fleet-1",
        "COSTOPT_WORKER_ID": "fi-1",
        "COSTOPT_WORKER_TOKEN": "secret",
        "COSTOPT_WORKER_GPUS": "1",
    }
    cloud.launch(LaunchSpec(offer=OFFER, command=["python3", "-m", "costopt.agent.worker"], env=env), "t-1")
    uri = str(tmp_path / "job-1")
    service.run = [_lease(uri, steps=3000)]  # 25 min at 2 steps/s, from its start at the first sync (3 min)
    cloud.run_to(W_START + timedelta(minutes=10))
    assert service.copies("job-1") and not control.progress(uri, 1).done

    real_save = cloud._save

    def save_unless_done_was_reported() -> None:
        if any(c["state"] == "exited" and c["exit_code"] == 0 for c in service.copies("job-1")):
            raise RuntimeError("killed after the sync, before the tick's save")
        real_save()

    monkeypatch.setattr(cloud, "_save", save_unless_done_was_reported)
    with pytest.raises(RuntimeError, match="killed after the sync"):
        cloud.run_to(W_START + timedelta(minutes=40))  # one tick: the copy finishes, the worker reports it
    (done,) = [c for c in service.copies("job-1") if c["state"] == "exited"]  # one copy, finished
    assert done["exit_code"] == 0 and done["step"] == 3000
    del cloud

    back = SimCloud.restore(state, _prices(), HazardModel(), config=config)
    seen = control.progress(uri, 1)
    assert seen.done and seen.last_step == done["step"]  # the location holds what the service recorded
    assert seen.checkpoints and seen.checkpoints[-1] == done["checkpoint_step"]
    assert service.run == []  # the service knows the job is done: it leases it no more
    back.attach_fleet(service.transport)
    back.run_to(W_START + timedelta(minutes=60))
    audit = control.audit_job(uri, 3000)
    assert audit.ok and audit.steps_done == 3000 and audit.repeated_steps == 0, audit.problems


def test_the_saved_state_does_not_grow_with_an_agents_console(tmp_path: Path) -> None:
    """An agent's console keeps its latest ``CONSOLE_LINES`` lines (as a cloud keeps a console's tail), so a
    save of a long-running cloud costs the same at 20 and 40 simulated hours (it grew by every record before)."""
    state = tmp_path / "sim.state"
    cloud = make_cloud()
    cloud.persist_to(state)
    inst = cloud.launch(spec(str(tmp_path / "job"), steps=10_000_000), "tok")
    _run(cloud, 20)
    lines_20 = cloud.output(inst.instance_id).splitlines()
    size_20 = state.stat().st_size
    _run(cloud, 40)
    lines_40 = cloud.output(inst.instance_id).splitlines()
    assert len(lines_20) == len(lines_40) == CONSOLE_LINES  # full: the oldest lines went
    assert lines_40[-1] != lines_20[-1] and "boot:" not in lines_40[0]  # the latest are kept
    assert control.progress(str(tmp_path / "job"), 1).last_step > 0
    assert abs(state.stat().st_size - size_20) < 1_000  # 40 h of records more would be ~20 KB more

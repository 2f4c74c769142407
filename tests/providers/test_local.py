"""The local provider: processes on this machine behind the CloudProvider protocol, and the example
training script run through it end to end (preempted, relaunched with a new epoch, migrated)."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from costopt.agent import contract_env, control
from costopt.cloud import ENDED_RETENTION, CloudProvider, InstanceState, LaunchSpec, NotFoundError
from costopt.domain import Cloud, Market, OfferKey
from costopt.settings import PROJECT_ROOT
from providers.local import InvalidSpec, LocalProvider

OFFER = OfferKey(Cloud.LOCAL, "local", "", "cpu-1", Market.SPOT)
EXAMPLE = PROJECT_ROOT / "examples" / "train.py"
EPOCH0 = datetime.fromtimestamp(0, UTC)


@pytest.fixture
def provider(tmp_path: Path):
    p = LocalProvider(tmp_path / "state", cwd=tmp_path, grace_seconds=5.0)
    yield p
    for inst in p.list({}):
        p.terminate(inst.instance_id)
    p.close()


def py(code: str, **env: str) -> LaunchSpec:
    """A spec running a Python snippet."""
    return LaunchSpec(OFFER, (sys.executable, "-c", textwrap.dedent(code)), env=env, tags={"suite": "local"})


SLEEPER = """
import time
while True:
    time.sleep(0.05)
"""


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def test_it_satisfies_the_cloud_provider_protocol(provider):
    p: CloudProvider = provider
    assert p.name == "local"


def test_a_second_launch_with_the_same_token_returns_the_same_instance(provider, tmp_path):
    marker = tmp_path / "runs.txt"
    spec = py(
        f"""
        import time
        with open({str(marker)!r}, "a") as f:
            f.write("ran\\n")
        while True:
            time.sleep(0.05)
        """
    )
    first = provider.launch(spec, "tok-1")
    again = provider.launch(spec, "tok-1")
    restarted = LocalProvider(provider.state_dir, cwd=tmp_path).launch(spec, "tok-1")
    assert first.instance_id == again.instance_id == restarted.instance_id
    assert first.state is InstanceState.RUNNING
    wait_for(marker.exists)
    time.sleep(0.2)
    assert marker.read_text() == "ran\n"  # one process, not three
    assert len(provider.list({"suite": "local"})) == 1
    other = provider.launch(spec, "tok-2")
    assert other.instance_id != first.instance_id


def test_concurrent_launches_with_one_token_start_one_process(provider, tmp_path):
    marker = tmp_path / "runs.txt"
    spec = py(f"open({str(marker)!r}, 'a').write('ran\\n')\nimport time\ntime.sleep(30)")
    ids: list[str] = []

    def go() -> None:
        ids.append(LocalProvider(provider.state_dir, cwd=tmp_path).launch(spec, "same").instance_id)

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1
    wait_for(marker.exists)
    time.sleep(0.2)
    assert marker.read_text() == "ran\n"


def test_a_launch_interrupted_before_the_process_started_is_completed_by_the_same_token(tmp_path, monkeypatch):
    state = tmp_path / "state"
    crashed = LocalProvider(state, cwd=tmp_path)
    monkeypatch.setattr(crashed, "_spawn", lambda instance_id, rec: None)  # "dies" before spawning
    pending = crashed.launch(py(SLEEPER), "tok")
    assert pending.state is InstanceState.PENDING
    resumed = LocalProvider(state, cwd=tmp_path)
    inst = resumed.launch(py(SLEEPER), "tok")
    assert inst.instance_id == pending.instance_id and inst.state is InstanceState.RUNNING
    resumed.terminate(inst.instance_id)


def test_terminating_a_pending_instance_means_it_never_runs(tmp_path, monkeypatch):
    crashed = LocalProvider(tmp_path / "state", cwd=tmp_path)
    monkeypatch.setattr(crashed, "_spawn", lambda instance_id, rec: None)
    pending = crashed.launch(py(SLEEPER), "tok")
    crashed.terminate(pending.instance_id)
    again = LocalProvider(tmp_path / "state", cwd=tmp_path).launch(py(SLEEPER), "tok")
    assert again.state is InstanceState.TERMINATED


def test_describe_reports_the_exit_code_and_the_output(provider):
    inst = provider.launch(py("import sys\nprint('hello')\nsys.exit(3)"), "t")
    done = provider.wait(inst.instance_id, 20)
    assert done.state is InstanceState.TERMINATED and done.terminated_at is not None
    status = provider.status(inst.instance_id)
    assert status.exit_code == 3 and not status.alive
    assert status.stdout.read_text() == "hello\n"


def test_terminate_twice_and_terminate_unknown_are_not_errors(provider):
    inst = provider.launch(py(SLEEPER), "t")
    provider.terminate(inst.instance_id)
    assert provider.describe(inst.instance_id).state is InstanceState.TERMINATED
    assert provider.exit_code(inst.instance_id) == -signal.SIGTERM
    provider.terminate(inst.instance_id)
    provider.terminate("local-000000000000")
    with pytest.raises(NotFoundError):
        provider.describe("local-000000000000")


def test_terminate_escalates_to_sigkill_after_the_grace_period(tmp_path):
    p = LocalProvider(tmp_path / "state", cwd=tmp_path, grace_seconds=0.3)
    inst = p.launch(py("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"), "t")
    wait_for(lambda: p.status(inst.instance_id).pid is not None)
    time.sleep(0.3)  # let the job install its handler
    started = time.monotonic()
    p.terminate(inst.instance_id)
    assert time.monotonic() - started < 5
    assert p.describe(inst.instance_id).state is InstanceState.TERMINATED
    assert p.exit_code(inst.instance_id) is None  # the whole group was SIGKILLed


def test_the_job_gets_the_spec_env_and_its_notice_file_but_not_the_services_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("COSTOPT_DATABASE_URL", "postgresql://secret")
    monkeypatch.setenv("COSTOPT_EPOCH", "999")
    work = tmp_path / "work"
    work.mkdir()
    p = LocalProvider(tmp_path / "state", cwd=work)
    code = "import json, os\njson.dump({'env': dict(os.environ), 'cwd': os.getcwd()}, open('env.json', 'w'))"
    spec = LaunchSpec(OFFER, (sys.executable, "-c", code), env=contract_env("j", "/tmp/ck", 3))
    inst = p.launch(spec, "t")
    p.wait(inst.instance_id, 20)
    seen = json.loads((work / "env.json").read_text())
    env = seen["env"]
    assert (env["COSTOPT_JOB_ID"], env["COSTOPT_CHECKPOINT_URI"], env["COSTOPT_EPOCH"]) == ("j", "/tmp/ck", "3")
    assert env["COSTOPT_NOTICE_FILE"] == str(p.status(inst.instance_id).notice_file)
    assert env["COSTOPT_INSTANCE_ID"] == inst.instance_id and env["COSTOPT_PROVIDER"] == "local"
    assert "COSTOPT_DATABASE_URL" not in env
    assert Path(seen["cwd"]) == work


def test_an_empty_command_or_missing_directory_is_refused(tmp_path):
    with pytest.raises(InvalidSpec):
        LocalProvider(tmp_path / "s").launch(LaunchSpec(OFFER, ()), "t")
    with pytest.raises(InvalidSpec):
        LocalProvider(tmp_path / "s", cwd=tmp_path / "nope").launch(py("pass"), "t")


LAUNCH_AND_EXIT = """
import sys
from providers.local import LocalProvider
from costopt.cloud import LaunchSpec
from costopt.domain import Cloud, Market, OfferKey
offer = OfferKey(Cloud.LOCAL, "local", "", "cpu-1", Market.SPOT)
cmd = (sys.executable, "-c", "import time\\nwhile True: time.sleep(0.05)")
inst = LocalProvider(sys.argv[1]).launch(LaunchSpec(offer, cmd, tags={"job": "j9", "epoch": "1"}), "tok-j9")
print(inst.instance_id)
"""


def test_a_restarted_provider_finds_the_instances_of_a_provider_that_died(tmp_path):
    state = tmp_path / "state"
    out = subprocess.run(
        [sys.executable, "-c", LAUNCH_AND_EXIT, str(state)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    instance_id = out.stdout.strip()
    fresh = LocalProvider(state)
    listed = fresh.list({"job": "j9"})
    assert [i.instance_id for i in listed] == [instance_id]
    assert listed[0].state is InstanceState.RUNNING  # the job outlived its launcher
    assert fresh.launch(LaunchSpec(OFFER, ("true",)), "tok-j9").instance_id == instance_id
    fresh.terminate(instance_id)
    assert fresh.describe(instance_id).state is InstanceState.TERMINATED
    assert fresh.exit_code(instance_id) == -signal.SIGTERM


def test_a_preemption_posts_a_notice_then_takes_the_instance_after_the_notice_period(tmp_path):
    provider = LocalProvider(tmp_path / "state", cwd=tmp_path, notice_signal=signal.SIGUSR1)
    log = tmp_path / "notices.txt"
    spec = py(
        f"""
        import signal, time
        def on_usr1(signum, frame):
            open({str(log)!r}, "a").write("notice\\n")
        signal.signal(signal.SIGUSR1, on_usr1)
        open({str(log)!r}, "a").write("ready\\n")
        while True:
            time.sleep(0.02)
        """
    )
    inst = provider.launch(spec, "t")
    wait_for(lambda: log.exists() and "ready" in log.read_text())
    since = datetime.now(UTC)
    notice = provider.preempt(inst.instance_id, notice_seconds=0.5)
    assert notice is not None and notice.deadline is not None
    assert (notice.deadline - notice.noticed_at).total_seconds() == pytest.approx(0.5)
    doc = json.loads(provider.status(inst.instance_id).notice_file.read_text())
    assert doc["deadline"] == pytest.approx(notice.deadline.timestamp())
    wait_for(lambda: "notice" in log.read_text(), timeout=5)
    assert provider.describe(inst.instance_id).state is InstanceState.RUNNING  # still inside the notice
    taken = provider.wait(inst.instance_id, 10)
    assert taken.state is InstanceState.PREEMPTED
    kinds = [(i.instance_id, i.kind) for i in provider.interruptions(since)]
    assert kinds == [(inst.instance_id, "notice"), (inst.instance_id, "preempted")]
    assert provider.preempt(inst.instance_id, 1.0) == notice  # the same notice, no second one


def test_an_overdue_preemption_is_enforced_by_a_restarted_provider(tmp_path):
    p = LocalProvider(tmp_path / "state", cwd=tmp_path, notice_signal=None)
    inst = p.launch(py(SLEEPER), "t")
    p.preempt(inst.instance_id, notice_seconds=0.3)
    p.close()  # the migrator dies: its timer is gone
    time.sleep(0.4)
    fresh = LocalProvider(tmp_path / "state", cwd=tmp_path)
    assert fresh.describe(inst.instance_id).state is InstanceState.PREEMPTED
    assert [i.kind for i in fresh.interruptions(EPOCH0)] == ["notice", "preempted"]


# -- the example training script, end to end ---------------------------------------------------------


def _example_reference(steps: int) -> list[float]:
    spec = importlib.util.spec_from_file_location("example_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [float(v) for v in module.train(steps)]


def _train_spec(job: str, uri: str, epoch: int, steps: int, step_seconds: float = 0.01) -> LaunchSpec:
    cmd = (
        sys.executable,
        str(EXAMPLE),
        "--steps",
        str(steps),
        "--checkpoint-every",
        "20",
        "--step-seconds",
        str(step_seconds),
    )
    return LaunchSpec(OFFER, cmd, env=contract_env(job, uri, epoch), tags={"job": job, "epoch": str(epoch)})


def _launch_epoch(p: LocalProvider, job: str, uri: str, epoch: int, steps: int, **kw: Any):
    control.claim_epoch(uri, epoch)  # the migrator fences before launching
    return p.launch(_train_spec(job, uri, epoch, steps, **kw), f"{job}-e{epoch}")


def test_the_example_preempted_mid_run_resumes_and_does_exactly_200_steps(provider, tmp_path):
    uri = str(tmp_path / "ckpt")
    first = _launch_epoch(provider, "job-a", uri, 1, 200)
    wait_for(lambda: control.progress(uri, 1).last_step >= 70)
    provider.preempt(first.instance_id, notice_seconds=2.0)
    gone = provider.wait(first.instance_id, 20)
    assert gone.state is InstanceState.PREEMPTED
    assert provider.exit_code(first.instance_id) == 75  # checkpointed on the notice, then stopped
    at_preemption = control.latest(uri)
    assert at_preemption is not None and at_preemption.step >= 70 and at_preemption.step % 20 != 0

    second = _launch_epoch(provider, "job-a", uri, 2, 200)
    done = provider.wait(second.instance_id, 60)
    assert (done.state, provider.exit_code(second.instance_id)) == (InstanceState.TERMINATED, 0)

    result = control.audit_job(uri, 200)
    assert result.ok, result.problems
    assert (result.steps_done, result.lost_steps, result.repeated_steps) == (200, 0, 0)
    assert result.wasted_steps == 0  # the notice checkpoint saved every step done
    assert control.progress(uri, 2).restored_step == at_preemption.step
    final = control.restore_latest(uri)
    assert final is not None and final.step == 200
    assert final.state["w"] == _example_reference(200)  # the same bits as an uninterrupted run


def test_the_example_killed_without_notice_loses_only_steps_after_its_last_checkpoint(provider, tmp_path):
    uri = str(tmp_path / "ckpt")
    first = _launch_epoch(provider, "job-b", uri, 1, 120)
    wait_for(lambda: control.progress(uri, 1).last_step >= 45)
    provider.preempt(first.instance_id, notice_seconds=0)  # taken at once
    assert provider.describe(first.instance_id).state is InstanceState.PREEMPTED
    last = control.latest(uri)
    executed = control.progress(uri, 1).last_step
    assert last is not None and last.step % 20 == 0 and executed - last.step < 20
    second = _launch_epoch(provider, "job-b", uri, 2, 120)
    provider.wait(second.instance_id, 60)
    result = control.audit_job(uri, 120)
    assert result.ok, result.problems
    assert result.wasted_steps == executed - last.step  # redone, never counted twice
    assert control.restore_latest(uri).state["w"] == _example_reference(120)  # type: ignore[union-attr]


def test_a_migration_fences_the_old_copy_so_two_copies_never_both_write(provider, tmp_path):
    uri = str(tmp_path / "ckpt")
    old = _launch_epoch(provider, "job-c", uri, 1, 200, step_seconds=0.02)
    wait_for(lambda: control.progress(uri, 1).last_step >= 25)
    rid = control.request_checkpoint(uri, epoch=1, reason="move")
    wait_for(lambda: control.request_served(uri, rid))
    new = _launch_epoch(provider, "job-c", uri, 2, 200, step_seconds=0.005)
    wait_for(lambda: control.progress(uri, 2).progressing)
    provider.terminate(old.instance_id)
    # Fenced out (3), or killed by the SIGTERM while already exiting on its own (its handlers restored):
    # either way it wrote nothing after the claim, which the checkpoint checks below verify.
    assert provider.exit_code(old.instance_id) in (3, -signal.SIGTERM)
    assert provider.wait(new.instance_id, 60).state is InstanceState.TERMINATED
    assert provider.exit_code(new.instance_id) == 0
    result = control.audit_job(uri, 200)
    assert result.ok, result.problems
    # Epoch 1 published nothing after epoch 2 restored: its last checkpoint is the one epoch 2 resumed from,
    # or one it withdrew on seeing the claim right after writing it (a file store has no compare-and-swap:
    # under load the new copy can read that file in the instant before it is withdrawn).
    records = control.records(uri)
    old_checkpoints = [r["step"] for r in records if r["event"] == "checkpoint" and r["epoch"] == 1]
    withdrawn = [r["step"] for r in records if r["event"] == "stale" and r["epoch"] == 1 and r.get("step") is not None]
    assert control.progress(uri, 2).restored_step in {max(old_checkpoints), *withdrawn}
    assert control.restore_latest(uri).state["w"] == _example_reference(200)  # type: ignore[union-attr]


def test_list_drops_instances_ended_over_an_hour_ago_but_history_keeps_them(tmp_path):
    offset = [0.0]
    p = LocalProvider(tmp_path / "state", cwd=tmp_path, grace_seconds=5.0, clock=lambda: time.time() + offset[0])
    try:
        done = p.launch(py("pass"), "tok-done")
        live = p.launch(py(SLEEPER), "tok-live")
        p.wait(done.instance_id, 20.0)
        assert [i.instance_id for i in p.list({"suite": "local"})] == [done.instance_id, live.instance_id]
        offset[0] += ENDED_RETENTION.total_seconds() + 60
        assert [i.instance_id for i in p.list({"suite": "local"})] == [live.instance_id]
        assert [i.instance_id for i in p.history({"suite": "local"})] == [done.instance_id, live.instance_id]
        assert p.describe(done.instance_id).state is InstanceState.TERMINATED
    finally:
        p.terminate(live.instance_id)
        p.close()

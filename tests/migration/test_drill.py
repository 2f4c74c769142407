"""``costopt drill``: the example script through moves and preemptions on the local provider and on the
simulated market (recoveries through the interruption watcher), broken scripts caught with a reason,
the simulated market itself, and the command line's exit codes."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from api.drill import build_market, drill
from costopt.cloud import CapacityError, InstanceState, LaunchSpec
from costopt.migration.drill import (
    SIM_OFFERS,
    DrillError,
    DrillReport,
    SimulatedMarket,
    parse_command,
    steps_in,
)
from costopt.settings import PROJECT_ROOT
from providers.local import LocalProvider

EXAMPLE = PROJECT_ROOT / "examples" / "train.py"
FIXTURES = Path(__file__).parent / "fixtures"
KEYS = ("steps_requested", "steps_done", "lost_steps", "repeated_steps", "moves", "preemptions", "orphans", "ok")


def verdict(report: DrillReport) -> dict[str, object]:
    doc = report.to_dict()
    return {k: doc[k] for k in KEYS}


def sound(steps: int, moves: int, preemptions: int) -> dict[str, object]:
    return dict(zip(KEYS, (steps, steps, 0, 0, moves, preemptions, 0, True), strict=True))


@pytest.mark.drill  # make drills (~25 s each); make test runs the 1-move, 1-preemption drills below
def test_the_example_migrated_5_times_and_preempted_5_times_finishes_with_exactly_its_steps(tmp_path: Path) -> None:
    report = drill(
        f"python {EXAMPLE} --steps 1500 --checkpoint-every 50 --step-seconds 0.01",
        moves=5,
        preemptions=5,
        workdir=tmp_path,
        notice_seconds=3.0,
    )
    assert verdict(report) == sound(1500, 5, 5), report.problems
    assert report.finished and report.problems == ()
    assert report.recoveries == 5 and report.notices == 5  # every preemption recovered by the watcher


@pytest.mark.drill  # make drills (~25 s each); make test runs the 1-move, 1-preemption drills below
def test_the_example_on_the_simulated_market_5_moves_5_preemptions(tmp_path: Path) -> None:
    report = drill(
        f"python {EXAMPLE} --steps 2000 --checkpoint-every 50 --step-seconds 0.01",
        moves=5,
        preemptions=5,
        provider="sim",
        seed=1,
        workdir=tmp_path,
    )
    assert verdict(report) == sound(2000, 5, 5), report.problems
    assert report.finished and report.problems == ()


def test_the_example_survives_a_move_and_a_preemption_on_the_local_provider(tmp_path: Path) -> None:
    report = drill(
        f"python {EXAMPLE} --steps 300 --checkpoint-every 25 --step-seconds 0.01",
        moves=1,
        preemptions=1,
        workdir=tmp_path,
        notice_seconds=2.0,
    )
    assert verdict(report) == sound(300, 1, 1), report.problems
    assert report.provider == "local" and report.recoveries == 1 and report.notices == 1


def test_the_example_survives_the_simulated_market(tmp_path: Path) -> None:
    report = drill(
        f"python {EXAMPLE} --steps 500 --checkpoint-every 25 --step-seconds 0.01",
        moves=1,
        preemptions=2,
        provider="sim",
        seed=7,
        preemption_every=1.0,
        launch_failure=0.3,
        workdir=tmp_path,
    )
    assert verdict(report) == sound(500, 1, 2), (report.problems, report.notes)
    assert report.provider == "sim" and report.seed == 7
    assert report.recoveries >= 1  # at least one preemption was recovered by the watcher (others mid-move)


def test_a_script_that_ignores_preemption_notices_fails_the_drill(tmp_path: Path) -> None:
    report = drill(
        f"python {FIXTURES / 'ignores_notices.py'} --steps 300 --checkpoint-every 1000 --step-seconds 0.01",
        moves=0,
        preemptions=1,
        workdir=tmp_path,
        notice_seconds=1.0,
        event_timeout=10.0,
    )
    assert not report.ok
    assert report.preemptions == 1 and report.steps_done == 300  # it finished, but lost work to the preemption
    assert any("after its agent saw the preemption notice" in p and "not checkpointed" in p for p in report.problems), (
        report
    )


def test_a_script_that_ignores_preemption_notices_fails_the_drill_on_the_simulated_market(tmp_path: Path) -> None:
    report = drill(
        f"python {FIXTURES / 'ignores_notices.py'} --steps 400 --checkpoint-every 1000 --step-seconds 0.01",
        moves=0,
        preemptions=2,
        provider="sim",
        launch_failure=0.0,
        preemption_every=2.0,
        time_scale=30.0,  # notices of 4 s (AWS) and 1 s (GCP, Azure) of wall time: a copy that started late
        workdir=tmp_path,  # on a loaded machine still steps through one before its reclaim
        event_timeout=10.0,
    )
    assert not report.ok
    assert any("preemption notice" in p and "not checkpointed" in p for p in report.problems), report


def test_a_script_that_ignores_its_epoch_fails_the_drill_with_the_reason(tmp_path: Path) -> None:
    report = drill(
        f"python {FIXTURES / 'ignores_epoch.py'} --steps 300 --step-seconds 0.01",
        moves=1,
        preemptions=0,
        workdir=tmp_path,
        event_timeout=5.0,
        timeout=30.0,
        max_failed_recoveries=2,
    )
    assert not report.ok and report.moves == 0
    assert any("launched as epoch 2 (COSTOPT_EPOCH) but its agent ran as epoch 1" in p for p in report.problems), report


def test_a_script_that_never_checkpoints_fails_the_drill(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text(
        "import os, time\n"
        "from costopt.agent import Agent\n"
        "a = Agent.from_env(dict(os.environ)); a.restore()\n"
        "for s in range(1, 301):\n"
        "    a.report(s); time.sleep(0.01)\n"
        "a.finish(300)\n"
    )
    report = drill(f"python {script} --steps 300", moves=1, preemptions=0, workdir=tmp_path / "w", event_timeout=4.0)
    assert not report.ok
    assert report.moves == 0


def test_the_command_runs_with_this_interpreter_and_its_steps_are_read_from_it() -> None:
    argv = parse_command("python train.py --steps 40")
    assert argv[0] == sys.executable and steps_in(argv) == 40
    assert steps_in(["x", "--steps=7"]) == 7


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"provider": "aws"}, "choose one of local, sim"),
        ({"command": "  "}, "the command is empty"),
        ({"moves": -1}, "moves must be >= 0"),
        ({"provider": "sim", "launch_failure": 1.0}, r"probability in \[0, 1\)"),
        ({"provider": "sim", "time_scale": 0.0}, "must be > 0"),
    ],
)
def test_a_drill_asked_for_the_impossible_says_what_to_fix(kwargs: dict[str, object], match: str) -> None:
    kwargs.setdefault("command", "python x.py")
    with pytest.raises(DrillError, match=match):
        drill(**kwargs)  # type: ignore[arg-type]


# -- the simulated market ---------------------------------------------------------------------------

SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalProvider]:
    prov = LocalProvider(tmp_path / "cloud", grace_seconds=1.0)
    yield prov
    for inst in prov.list({}):
        if inst.state in (InstanceState.PENDING, InstanceState.RUNNING, InstanceState.STOPPING):
            prov.terminate(inst.instance_id)
    prov.close()


def _outcomes(market: SimulatedMarket, n: int, tag: str) -> list[bool]:
    out = []
    for i in range(n):
        try:
            market.launch(LaunchSpec(SIM_OFFERS[0], [sys.executable, "-c", "pass"], tags={"t": tag}), f"{tag}-{i}")
            out.append(True)
        except CapacityError:
            out.append(False)
    return out


def test_the_market_refuses_launches_for_capacity_as_its_seed_decides(local: LocalProvider) -> None:
    markets = [build_market(local, seed=seed, launch_failure=0.5, preemption_every=1e6) for seed in (3, 3, 4)]
    try:
        a, b, c = (_outcomes(m, 12, f"s{i}") for i, m in enumerate(markets))
    finally:
        for m in markets:
            m.close()
    assert a == b != c  # the same seed refuses the same launches
    assert 0 < a.count(False) < 12 and markets[0].launch_failures == a.count(False)


def test_the_market_preempts_a_copy_after_its_clouds_notice_scaled_and_spares_copies_past_its_budget(
    local: LocalProvider,
) -> None:
    since = datetime.now(UTC)
    market = build_market(local, seed=0, time_scale=60.0, preemption_every=0.3, launch_failure=0.0, max_preemptions=1)
    try:
        first = market.launch(LaunchSpec(SIM_OFFERS[0], SLEEPER, tags={"n": "1"}), "t-1")  # AWS: 2 min -> 2 s
        end = time.monotonic() + 10
        while market.describe(first.instance_id).state is not InstanceState.PREEMPTED and time.monotonic() < end:
            time.sleep(0.02)
        assert market.describe(first.instance_id).state is InstanceState.PREEMPTED
        second = market.launch(LaunchSpec(SIM_OFFERS[1], SLEEPER, tags={"n": "2"}), "t-2")
        end = time.monotonic() + 3
        while market.spared == 0 and time.monotonic() < end:
            time.sleep(0.02)
    finally:
        market.close()
    assert market.preemptions == 1 and market.spared >= 1
    assert market.describe(second.instance_id).state is InstanceState.RUNNING  # past the budget: spared
    events = market.interruptions(since)
    assert [e.kind for e in events] in (["notice", "preempted"], ["preempted"])
    lead = market.applied[0].lead
    assert 0.0 <= lead <= 2.0 + 1e-6  # AWS's two minutes at 60x, shorter if the reclaim came sooner
    if events[0].kind == "notice":
        assert events[0].deadline is not None
        assert abs((events[0].deadline - events[0].noticed_at).total_seconds() - lead) < 0.05


# -- the command line -------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_drill_on_the_simulated_market_prints_the_verdict_as_json(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["drill", "--provider", "sim", "--seed", "3", "--moves", "1", "--preemptions", "1", "--format", "json",
         "--command", f"python {EXAMPLE} --steps 300 --checkpoint-every 25 --step-seconds 0.01",
         "--preemption-every", "1", "--workdir", str(tmp_path)],
    )  # fmt: skip
    doc = json.loads(result.stdout)
    assert result.exit_code == 0, doc
    assert {k: doc[k] for k in KEYS} == sound(300, 1, 1)
    assert doc["provider"] == "sim" and doc["seed"] == 3


def test_cli_drill_exits_1_for_an_unsound_script_and_2_for_bad_arguments(tmp_path: Path) -> None:
    bad = runner.invoke(
        app,
        ["drill", "--moves", "0", "--preemptions", "1", "--notice-seconds", "1", "--format", "json",
         "--command", f"python {FIXTURES / 'ignores_notices.py'} --steps 200 --step-seconds 0.01",
         "--workdir", str(tmp_path)],
    )  # fmt: skip
    assert bad.exit_code == 1 and json.loads(bad.stdout)["ok"] is False
    assert runner.invoke(app, ["drill", "--provider", "aws"]).exit_code == 2
    assert runner.invoke(app, ["drill", "--launch-failure", "1.5"]).exit_code == 2
    empty = runner.invoke(app, ["drill", "--command", " "])
    assert empty.exit_code == 2 and "the command is empty" in empty.stderr

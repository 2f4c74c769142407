"""``costopt drill``'s engine: the example script through 5 forced migrations and 5 preemptions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from costopt.migration.drill import DrillError, drill, parse_command, steps_in
from costopt.settings import PROJECT_ROOT


@pytest.mark.slow
def test_the_example_migrated_5_times_and_preempted_5_times_finishes_with_exactly_its_steps(tmp_path: Path) -> None:
    report = drill(
        f"python {PROJECT_ROOT / 'examples' / 'train.py'} --steps 1500 --checkpoint-every 50 --step-seconds 0.01",
        moves=5,
        preemptions=5,
        workdir=tmp_path,
        notice_seconds=3.0,
    )
    doc = report.to_dict()
    assert {k: doc[k] for k in ("steps_requested", "steps_done", "lost_steps", "repeated_steps", "moves",
                                "preemptions", "orphans", "ok")} == {
        "steps_requested": 1500, "steps_done": 1500, "lost_steps": 0, "repeated_steps": 0,
        "moves": 5, "preemptions": 5, "orphans": 0, "ok": True,
    }, report.problems  # fmt: skip
    assert report.finished and report.problems == ()


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
    with pytest.raises(DrillError):
        drill("python x.py", provider="sim")

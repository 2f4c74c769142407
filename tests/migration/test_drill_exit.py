"""``costopt drill`` with a command that exits at once (a usage error) says so, with the exit code and
the tail of its stderr, instead of blaming the script's checkpoints; a script that does start and then
dies keeps the restart diagnosis."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from typer.testing import CliRunner

from api.cli.main import app
from api.drill import drill
from costopt.migration.drill import COMMAND_EXITS_AT_ONCE

FIXTURES = Path(__file__).parent / "fixtures"
USAGE_ERROR = f"{shlex.quote(sys.executable)} -c " + shlex.quote(
    "import sys; sys.stderr.write('usage: train.py [-h] --steps N\\n"
    "train.py: error: the following arguments are required: --steps\\n'); sys.exit(2)"
)


def test_a_command_that_exits_at_once_is_reported_with_its_exit_code_and_stderr(tmp_path: Path) -> None:
    report = drill(USAGE_ERROR, moves=1, preemptions=1, workdir=tmp_path, timeout=60.0)
    assert not report.ok and report.steps_done == 0
    first = report.problems[0]
    assert first.startswith(COMMAND_EXITS_AT_ONCE), report.problems
    assert "exited with code 2 before its agent reported a start" in first
    assert "train.py: error: the following arguments are required: --steps" in first
    assert "usage: train.py [-h] --steps N" in first
    assert not any("restart from its checkpoints" in p for p in report.problems)


def test_a_script_that_starts_then_dies_keeps_the_restart_diagnosis(tmp_path: Path) -> None:
    report = drill(
        f"{shlex.quote(sys.executable)} {FIXTURES / 'crashes_after_restore.py'}",
        moves=1,
        preemptions=0,
        workdir=tmp_path,
        timeout=60.0,
    )
    assert not report.ok
    assert not any(p.startswith(COMMAND_EXITS_AT_ONCE) for p in report.problems), report.problems
    assert any("the job cannot restart from its checkpoints" in p for p in report.problems), report.problems


def test_cli_drill_says_the_command_does_not_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["drill", "--command", USAGE_ERROR, "--moves", "1", "--preemptions", "0", "--workdir", str(tmp_path)],
    )
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert "the command does not run: the command exits at once" in said
    assert "exited with code 2" in said and "the following arguments are required: --steps" in said
    assert "checkpointing is not sound" not in said

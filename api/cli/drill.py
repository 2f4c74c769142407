"""``costopt drill``: run a training script through forced moves and preemptions, check it loses nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import Exit, failures
from api.cli.output import OutputFormat, emit_object, note


def drill(
    command: Annotated[
        str | None,
        typer.Option(help='The training command, e.g. "python train.py --steps 2000" (default: the example).'),
    ] = None,
    moves: Annotated[int, typer.Option(min=0, help="Forced migrations.")] = 5,
    preemptions: Annotated[int, typer.Option(min=0, help="Forced preemptions.")] = 5,
    provider: Annotated[str, typer.Option(help="local (subprocesses on this machine).")] = "local",
    workdir: Annotated[Path | None, typer.Option(help="Where checkpoints and state go (default: a temp dir).")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Exit 0 when the script's checkpointing is sound: exactly the steps asked for, none lost beyond
    the last checkpoint, none counted twice, no orphaned copy. Exit 1 otherwise."""
    from costopt.migration.drill import drill as run_drill

    with failures():
        report = run_drill(command, moves=moves, preemptions=preemptions, provider=provider, workdir=workdir)
    record = report.to_dict()
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(record, indent=2, default=str) + "\n")
    else:
        emit_object(record, fmt, title="Drill")
    if not record.get("ok"):
        if fmt is OutputFormat.table:
            note(
                "[red]the script's checkpointing is not sound:[/red] " + "; ".join(map(str, record.get("problems", [])))
            )
        raise typer.Exit(Exit.FAILED)

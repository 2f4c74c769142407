"""``costopt drill``: run a training script through moves and preemptions, check it loses nothing."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import Exit, failures
from api.cli.output import OutputFormat, emit_object, note


class DrillProvider(StrEnum):
    local = "local"
    sim = "sim"


QUIET_LOGGERS = ("costopt.migration", "costopt.agent", "providers")


@contextmanager
def _quiet() -> Iterator[None]:
    """Without ``--verbose``, the drill's own warnings (each preemption, each refused launch) stay out
    of the way: the report says what happened. ``-v`` shows them."""
    if logging.getLogger().getEffectiveLevel() <= logging.INFO:
        yield
        return
    saved = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def drill(
    command: Annotated[
        str | None,
        typer.Option(help='The training command, e.g. "python train.py --steps 2000" (default: the example).'),
    ] = None,
    moves: Annotated[int, typer.Option(min=0, help="Forced migrations.")] = 5,
    preemptions: Annotated[int, typer.Option(min=0, help="Preemptions (forced with local, drawn with sim).")] = 5,
    provider: Annotated[
        DrillProvider,
        typer.Option(
            help="local: preemptions forced once the copy progresses. sim: the simulated cloud's market "
            "(seeded preemptions at any moment, notices scaled from AWS 2 min / GCP, Azure 30 s, capacity "
            "failures). The script runs on this machine either way."
        ),
    ] = DrillProvider.local,
    seed: Annotated[int, typer.Option(help="Seed of the simulated market (sim).")] = 0,
    time_scale: Annotated[
        float, typer.Option(min=0.001, help="Simulated seconds per real second (sim): notices shrink by it.")
    ] = 60.0,
    preemption_every: Annotated[
        float, typer.Option(min=0.001, help="Mean seconds between preemptions of one offer (sim).")
    ] = 2.0,
    launch_failure: Annotated[
        float, typer.Option(min=0.0, max=0.99, help="Probability that a launch finds no capacity (sim).")
    ] = 0.2,
    notice_seconds: Annotated[float, typer.Option(min=0.0, help="Notice before a forced preemption (local).")] = 3.0,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds for the whole drill.")] = 600.0,
    workdir: Annotated[Path | None, typer.Option(help="Where checkpoints and state go (default: a temp dir).")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Exit 0 when the script's checkpointing is sound: exactly the steps asked for, none lost beyond
    the last checkpoint, none counted twice, every notice honoured, no orphaned copy. Exit 1 otherwise,
    2 on bad arguments."""
    from api.drill import drill as run_drill
    from costopt.migration.drill import DrillError

    with failures(), _quiet():
        try:
            report = run_drill(
                command,
                moves=moves,
                preemptions=preemptions,
                provider=provider.value,
                workdir=workdir,
                seed=seed,
                time_scale=time_scale,
                preemption_every=preemption_every,
                launch_failure=launch_failure,
                notice_seconds=notice_seconds,
                timeout=timeout,
            )
        except DrillError as exc:
            raise typer.BadParameter(str(exc)) from exc
    record = report.to_dict()
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(record, indent=2, default=str) + "\n")
    else:
        emit_object(record, fmt, title="Drill")
    if not record.get("ok"):
        if fmt is OutputFormat.table:
            from rich.markup import escape

            from costopt.migration.drill import COMMAND_EXITS_AT_ONCE

            problems = [str(p) for p in record.get("problems", [])]
            runs = not (problems and problems[0].startswith(COMMAND_EXITS_AT_ONCE))
            headline = "the script's checkpointing is not sound" if runs else "the command does not run"
            note(f"[red]{headline}:[/red] " + escape("; ".join(problems)))
        raise typer.Exit(Exit.FAILED)

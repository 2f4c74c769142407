"""``costopt catalog ...``: the instance catalog (GPU instance types of every cloud)."""

from __future__ import annotations

from typing import Annotated

import typer

from api.cli.common import Exit, failures, settings_with
from api.cli.output import OutputFormat, emit
from costopt.domain import Cloud, normalize_accelerator

app = typer.Typer(help="GPU instance types: accelerator, GPU count, vCPUs, memory.", no_args_is_help=True)


@app.command("list")
def list_(
    cloud: Annotated[Cloud | None, typer.Option(help="Only this cloud.")] = None,
    gpu: Annotated[str | None, typer.Option(help="Only this accelerator, e.g. v100.")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Instance types the project knows (curated seed, refreshed by the clouds' APIs)."""
    from api.wiring import build_store, seed_catalog

    settings = settings_with()
    with failures():
        store = build_store(settings)
        seed_catalog(store, settings)
        types = store.instance_types(cloud)
    acc = normalize_accelerator(gpu) if gpu else None
    rows = [
        {
            "cloud": t.cloud.value,
            "instance_type": t.name,
            "accelerator": t.accelerator,
            "gpu_count": t.gpu_count,
            "vcpus": t.vcpus,
            "memory_gib": t.memory_gib,
            "source": t.source,
        }
        for t in types
        if acc is None or t.accelerator == acc
    ]
    emit(
        rows,
        [
            ("cloud", "cloud", None),
            ("instance_type", "instance type", None),
            ("accelerator", "GPU", None),
            ("gpu_count", "GPUs", "count"),
            ("vcpus", "vCPUs", "count"),
            ("memory_gib", "memory", "GiB"),
            ("source", "source", None),
        ],
        fmt,
        title="Instance catalog",
    )
    if not rows:
        raise typer.Exit(Exit.NOT_FOUND)

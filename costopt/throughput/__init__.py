"""The throughput catalog of the core: measured, user-registered and estimated training speeds
(steps/s) of job types on accelerators, alone and co-located. Nothing is loaded at import time."""

from __future__ import annotations

from costopt.throughput.catalog import ThroughputCatalog, accelerator_order
from costopt.throughput.errors import (
    InvalidThroughput,
    MalformedAcceleratorSpecs,
    MalformedThroughputFile,
    ThroughputError,
)
from costopt.throughput.estimate import (
    DEFAULT_ACCELERATOR_SPECS,
    ESTIMATOR_HARDWARE,
    ESTIMATOR_LOWRANK,
    ESTIMATOR_SCALING,
    AcceleratorSpec,
    EstimatorConfig,
    complete_low_rank,
    estimate_catalog,
    load_accelerator_specs,
)
from costopt.throughput.loaders import (
    GAVEL_ORACLE_FILE,
    GAVEL_PHYSICAL_FILE,
    GAVEL_SIMULATION_FILE,
    ThroughputMeasurements,
    load_gavel_throughputs,
    load_oracle_throughputs,
    load_throughput_file,
)
from costopt.throughput.model import (
    JobType,
    PairKey,
    PairThroughput,
    Placement,
    Provenance,
    Throughput,
    ThroughputKey,
)

__all__ = [
    "DEFAULT_ACCELERATOR_SPECS",
    "ESTIMATOR_HARDWARE",
    "ESTIMATOR_LOWRANK",
    "ESTIMATOR_SCALING",
    "GAVEL_ORACLE_FILE",
    "GAVEL_PHYSICAL_FILE",
    "GAVEL_SIMULATION_FILE",
    "AcceleratorSpec",
    "EstimatorConfig",
    "InvalidThroughput",
    "JobType",
    "MalformedAcceleratorSpecs",
    "MalformedThroughputFile",
    "PairKey",
    "PairThroughput",
    "Placement",
    "Provenance",
    "Throughput",
    "ThroughputCatalog",
    "ThroughputError",
    "ThroughputKey",
    "ThroughputMeasurements",
    "accelerator_order",
    "complete_low_rank",
    "estimate_catalog",
    "load_accelerator_specs",
    "load_gavel_throughputs",
    "load_oracle_throughputs",
    "load_throughput_file",
]

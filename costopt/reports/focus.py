"""A savings report's rows as a FinOps FOCUS cost-and-usage export (CSV, Parquet).

One record per report :class:`~costopt.reports.model.Row` (an instance interval's price segment within
one UTC day, or an egress charge), with the FOCUS 1.x columns that apply (names as in the FOCUS 1.2/1.3
column library: ``BilledCost``, ``EffectiveCost``, ``ListCost``, ``ContractedCost``, ``BillingCurrency``,
``BillingPeriodStart/End``, ``ChargePeriodStart/End``, ``ChargeCategory``, ``ChargeFrequency``,
``PricingCategory``, ``PricingQuantity``/``PricingUnit``, ``ListUnitPrice``, ``ServiceProviderName``,
``HostProviderName``, ``InvoiceIssuerName``, ``ServiceCategory``, ``ServiceName``, ``RegionId``,
``AvailabilityZone``, ``ResourceId``, ``ResourceType``, ``SkuId``, ``SkuPriceId``, ``SubAccountId``...)
and ``x_`` columns for what FOCUS has none (FOCUS reserves the ``x_`` prefix for extensions):
``x_Team``, ``x_JobId``, ``x_BaselineOnDemandCost``, ``x_BaselineStaticSpotCost``, ``x_Savings``...

Mapping choices (docs/ledger.md, "Reports"): every cost is billed at the public price in effect (no
negotiated or commitment discounts), so ``BilledCost`` = ``EffectiveCost`` = ``ListCost`` =
``ContractedCost``; spot is ``PricingCategory`` ``Dynamic``, on-demand ``Standard``; an instance row's
``PricingQuantity`` is instance-hours times the job's share (``ListUnitPrice`` x quantity = cost, up to the
ledger's one rounding per segment); an egress charge is dated in the UTC hour it was recorded in. Money is
exact: CSV cells are decimal strings, Parquet columns ``decimal128(18, 6)``, so ``BilledCost`` sums to the
report's ``actual_cost`` exactly.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from costopt.domain import Cloud, Market
from costopt.reports.model import Row, SavingsReport, usd

__all__ = ["FOCUS_COLUMNS", "X_COLUMNS", "focus_records", "to_csv", "to_parquet"]

FOCUS_COLUMNS: tuple[str, ...] = (
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "BillingCurrency",
    "BillingAccountId",
    "BillingAccountName",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ListUnitPrice",
    "ContractedUnitPrice",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ServiceProviderName",
    "HostProviderName",
    "InvoiceIssuerName",
    "ServiceCategory",
    "ServiceName",
    "RegionId",
    "RegionName",
    "AvailabilityZone",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
)
X_COLUMNS: tuple[str, ...] = (
    "x_Team",
    "x_TeamName",
    "x_JobId",
    "x_JobName",
    "x_LedgerKey",
    "x_ChargeKind",
    "x_Market",
    "x_Accelerator",
    "x_Share",
    "x_Open",
    "x_BaselineOnDemandCost",
    "x_BaselineStaticSpotCost",
    "x_Savings",
    "x_SavingsVsStaticSpot",
)
MONEY_COLUMNS = (
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "x_BaselineOnDemandCost",
    "x_BaselineStaticSpotCost",
    "x_Savings",
    "x_SavingsVsStaticSpot",
)
TIME_COLUMNS = ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd")
_PROVIDERS = {
    Cloud.AWS: ("Amazon Web Services", "Amazon EC2"),
    Cloud.GCP: ("Google Cloud", "Compute Engine"),
    Cloud.AZURE: ("Microsoft Azure", "Virtual Machines"),
    Cloud.SIM: ("costopt simulated cloud", "Simulated instances"),
    Cloud.LOCAL: ("costopt local provider", "Local processes"),
}
_HOURS = Decimal(3_600_000_000)
_QUANTITY = Decimal("0.000000001")


def _month(at: datetime) -> tuple[datetime, datetime]:
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    end = datetime(at.year + (at.month == 12), at.month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def _record(r: Row, team_names: Mapping[str, str], job_names: Mapping[str, str]) -> dict[str, Any]:
    cost = usd(r.amount_micro)
    offer = r.offer
    provider, service = _PROVIDERS.get(offer.cloud, (offer.cloud.value, "")) if offer else ("", "")
    instance = r.kind == "instance"
    quantity: Decimal | None
    unit: str | None
    price: Decimal | None
    if instance:
        hours = (Decimal((r.ends_at - r.starts_at) // timedelta(microseconds=1)) / _HOURS * r.share).quantize(_QUANTITY)
        quantity, unit, price = hours, "Hours", r.usd_per_hour
        start, end = r.starts_at, r.ends_at
        what = f"{offer.instance_type} {offer.market.value}" if offer else "instance"
        where = f"{offer.cloud.value} {offer.region}/{offer.zone or '-'}" if offer else ""
        share = "" if r.share == 1 else f", {r.share} of the instance"
        description = f"{what} in {where} for job {r.job_id} ({r.instance_id}{share})"
    else:
        quantity, unit, price = r.quantity, r.unit, r.rate_usd
        start = r.starts_at.replace(minute=0, second=0, microsecond=0)
        end = start + timedelta(hours=1)
        description = f"{r.kind} for job {r.job_id}: {r.note or ''}".rstrip(": ")
    billing_start, billing_end = _month(r.starts_at)
    od, st = r.baseline_on_demand_micro, r.baseline_static_spot_micro
    dynamic = instance and offer is not None and offer.market is Market.SPOT
    return {
        "BilledCost": cost,
        "EffectiveCost": cost,
        "ListCost": cost,
        "ContractedCost": cost,
        "BillingCurrency": "USD",
        "BillingAccountId": "costopt",
        "BillingAccountName": "costopt",
        "BillingPeriodStart": billing_start,
        "BillingPeriodEnd": billing_end,
        "ChargePeriodStart": start,
        "ChargePeriodEnd": end,
        "ChargeCategory": "Usage",
        "ChargeClass": None,
        "ChargeDescription": description,
        "ChargeFrequency": "Usage-Based",
        "PricingCategory": "Dynamic" if dynamic else "Standard",
        "PricingQuantity": quantity,
        "PricingUnit": unit,
        "ListUnitPrice": price,
        "ContractedUnitPrice": price,
        "ConsumedQuantity": quantity,
        "ConsumedUnit": unit,
        "ServiceProviderName": provider,
        "HostProviderName": provider,
        "InvoiceIssuerName": provider,
        "ServiceCategory": "Compute" if instance else "Networking",
        "ServiceName": service if instance else "Data Transfer",
        "RegionId": offer.region if offer else None,
        "RegionName": offer.region if offer else None,
        "AvailabilityZone": (offer.zone or None) if offer else None,
        "ResourceId": r.instance_id,
        "ResourceName": r.instance_id,
        "ResourceType": "Virtual Machine" if instance else None,
        "SkuId": f"{offer.cloud.value}/{offer.instance_type}/{offer.market.value}" if offer and instance else None,
        "SkuPriceId": f"{offer}@{r.usd_per_hour}" if offer and instance else None,
        "SubAccountId": r.team,
        "SubAccountName": team_names.get(r.team, r.team),
        "Tags": json.dumps({"costopt-job": r.job_id, "costopt-team": r.team}, sort_keys=True),
        "x_Team": r.team,
        "x_TeamName": team_names.get(r.team, r.team),
        "x_JobId": r.job_id,
        "x_JobName": job_names.get(r.job_id, ""),
        "x_LedgerKey": r.ref,
        "x_ChargeKind": r.kind,
        "x_Market": offer.market.value if offer and instance else None,
        "x_Accelerator": r.accelerator,
        "x_Share": r.share if instance else None,
        "x_Open": r.open,
        "x_BaselineOnDemandCost": None if od is None else usd(od),
        "x_BaselineStaticSpotCost": None if st is None else usd(st),
        "x_Savings": None if od is None else usd(od - r.amount_micro),
        "x_SavingsVsStaticSpot": None if st is None else usd(st - r.amount_micro),
    }


def focus_records(report: SavingsReport, team_names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One FOCUS record per report row (columns :data:`FOCUS_COLUMNS` then :data:`X_COLUMNS`)."""
    if report.rows is None:
        raise ValueError("the report was folded without its rows: build it with keep_rows=True for an export")
    names = dict(team_names or {})
    jobs = {j.job_id: j.name for j in report.jobs}
    return [_record(r, names, jobs) for r in report.rows]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def to_csv(records: Sequence[Mapping[str, Any]]) -> str:
    """The records as CSV (header row; money as exact decimal strings; times ISO 8601 with Z)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = [*FOCUS_COLUMNS, *X_COLUMNS]
    writer.writerow(columns)
    for rec in records:
        writer.writerow([_cell(rec[c]) for c in columns])
    return out.getvalue()


def to_parquet(records: Sequence[Mapping[str, Any]]) -> bytes:
    """The records as Parquet (money ``decimal128(18, 6)``, times ``timestamp[us, UTC]``)."""
    import pyarrow as pa  # heavy: imported when a Parquet export is asked for
    import pyarrow.parquet as pq

    money = pa.decimal128(18, 6)
    fields = []
    for c in (*FOCUS_COLUMNS, *X_COLUMNS):
        if c in MONEY_COLUMNS:
            fields.append(pa.field(c, money, nullable=c.startswith("x_")))
        elif c in TIME_COLUMNS:
            fields.append(pa.field(c, pa.timestamp("us", tz="UTC"), nullable=False))
        elif c in ("PricingQuantity", "ConsumedQuantity"):
            fields.append(pa.field(c, pa.decimal128(24, 9)))
        elif c in ("ListUnitPrice", "ContractedUnitPrice", "x_Share"):
            fields.append(pa.field(c, pa.string()))  # exact price text (prices carry up to 17 digits)
        elif c == "x_Open":
            fields.append(pa.field(c, pa.bool_()))
        else:
            fields.append(pa.field(c, pa.string()))
    schema = pa.schema(fields)
    columns: dict[str, list[Any]] = {f.name: [] for f in fields}
    for rec in records:
        for f in fields:
            value = rec[f.name]
            if f.name in ("ListUnitPrice", "ContractedUnitPrice", "x_Share"):
                value = None if value is None else str(value)
            elif f.name in ("PricingQuantity", "ConsumedQuantity") and value is not None:
                value = Decimal(value).quantize(_QUANTITY)
            columns[f.name].append(value)
    table = pa.Table.from_pydict(columns, schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()

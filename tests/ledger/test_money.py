"""The ledger's money arithmetic on its own: exact micro-dollars, one half-even rounding, against an
exact rational reference (written for mutation testing: each assertion pins a rounding or a unit)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from costopt.ledger.model import micro_to_usd, segment_micro_usd, usd_to_micro

T0 = datetime(2020, 3, 1, tzinfo=UTC)


def _half_even(x: Fraction) -> int:
    """The integer nearest ``x``, ties to the even one (the reference, from Fractions)."""
    lo = x.numerator // x.denominator
    rest = x - lo
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and lo % 2 == 1):
        return lo + 1
    return lo


def test_micro_dollars_convert_exactly_both_ways() -> None:
    assert micro_to_usd(1) == Decimal("0.000001")
    assert micro_to_usd(1_234_567) == Decimal("1.234567")
    assert micro_to_usd(-5) == Decimal("-0.000005")
    assert micro_to_usd(0) == 0
    assert usd_to_micro(Decimal("1.234567")) == 1_234_567
    assert usd_to_micro(Decimal("12345678901234.5")) == 12_345_678_901_234_500_000  # no precision lost


def test_usd_to_micro_rounds_half_to_even() -> None:
    assert usd_to_micro(Decimal("0.0000005")) == 0
    assert usd_to_micro(Decimal("0.0000015")) == 2
    assert usd_to_micro(Decimal("0.0000025")) == 2
    assert usd_to_micro(Decimal("0.00000051")) == 1
    assert usd_to_micro(Decimal("0.00000049")) == 0
    assert usd_to_micro(Decimal("-0.0000015")) == -2
    assert usd_to_micro(Decimal("-0.0000005")) == 0


@settings(max_examples=100, deadline=None)
@given(usd=st.decimals(min_value=-(10**6), max_value=10**6, places=9, allow_nan=False, allow_infinity=False))
def test_usd_to_micro_matches_the_exact_reference(usd: Decimal) -> None:
    assert usd_to_micro(usd) == _half_even(Fraction(usd) * 10**6)


def test_an_hour_at_a_price_costs_the_price() -> None:
    assert segment_micro_usd(T0, T0 + timedelta(hours=1), Decimal("3.06"), Decimal(1)) == 3_060_000
    assert segment_micro_usd(T0, T0 + timedelta(hours=2), Decimal("3.06"), Decimal("0.25")) == 1_530_000
    assert segment_micro_usd(T0, T0, Decimal("3.06"), Decimal(1)) == 0
    # 1 s at $1.8/h = 500 µ$ exactly; 1 s at $0.0018/h = 0.5 µ$ -> 0 (half-even); 3 s -> 1.5 µ$ -> 2
    assert segment_micro_usd(T0, T0 + timedelta(seconds=1), Decimal("1.8"), Decimal(1)) == 500
    assert segment_micro_usd(T0, T0 + timedelta(seconds=1), Decimal("0.0018"), Decimal(1)) == 0
    assert segment_micro_usd(T0, T0 + timedelta(seconds=3), Decimal("0.0018"), Decimal(1)) == 2
    assert segment_micro_usd(T0, T0 + timedelta(microseconds=1), Decimal(3600), Decimal(1)) == 1


@settings(max_examples=100, deadline=None)
@given(
    micros=st.integers(0, 40 * 24 * 3600 * 10**6),
    price=st.decimals(min_value=0, max_value=100, places=6, allow_nan=False, allow_infinity=False),
    share=st.sampled_from([Decimal(1), Decimal("0.5"), Decimal("0.125"), Decimal(1) / Decimal(3)]),
)
def test_a_segment_is_rounded_once_from_the_exact_product(micros: int, price: Decimal, share: Decimal) -> None:
    got = segment_micro_usd(T0, T0 + timedelta(microseconds=micros), price, share)
    # µs x USD/h x share / 3600 s/h = µ$ (the µs of time and the µ of µ$ cancel)
    exact = Fraction(micros) * Fraction(price) * Fraction(share) / 3600
    assert abs(Fraction(got) - exact) <= Fraction(1, 2)
    assert got == _half_even(exact)

"""costopt.registry: names, aliases, case, and the unknown-name error of every plug-in family."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from costopt.errors import CostoptError
from costopt.gavel.errors import UnknownPolicy
from costopt.gavel.policies import POLICIES, POLICY_NAMES, get_policy
from costopt.registry import Registry, UnknownName


def colours() -> Registry[int]:
    reg: Registry[int] = Registry("colour", hint="set COSTOPT_COLOUR")
    reg.register("red", 1, aliases=("crimson",))
    reg.register("Green", 2)
    reg.register("blue", 3)
    reg.register("yellow", 4)
    return reg


def test_names_keep_their_spelling_and_order_and_look_ups_ignore_case() -> None:
    reg = colours()
    assert reg.names() == ("red", "Green", "blue", "yellow")
    assert reg.get("RED") == 1 and reg.get("green") == 2 and reg.get(" Yellow ") == 4
    assert reg.canonical("CRIMSON") == "red" and reg.get("crimson") == 1
    assert reg.aliases() == {"crimson": "red"}
    assert "GREEN" in reg and "purple" not in reg and 3 not in reg
    assert list(reg) == list(reg.names()) and len(reg) == 4
    assert dict(reg.items())["Green"] == 2


def test_an_unknown_name_lists_the_known_ones_with_close_matches_and_the_hint() -> None:
    reg = colours()
    with pytest.raises(UnknownName) as info:
        reg.get("gren")
    err = info.value
    assert isinstance(err, CostoptError) and isinstance(err, ValueError)
    assert err.kind == "colour" and err.name == "gren"
    assert err.known == ("red", "Green", "blue", "yellow")
    assert err.close == ("Green",)
    assert str(err) == (
        "unknown colour 'gren' (did you mean 'Green'?); known: red, Green, blue, yellow; set COSTOPT_COLOUR"
    )
    with pytest.raises(UnknownName, match="did you mean 'crimson'"):
        reg.get("crimsen")
    with pytest.raises(UnknownName) as far:
        reg.get("zzzz")
    assert far.value.close == () and "did you mean" not in str(far.value)


def test_register_as_a_decorator() -> None:
    reg: Registry[Callable[[], int]] = Registry("maker")

    @reg.register("three", aliases=("3",))
    def three() -> int:
        return 3

    assert reg.get("3") is three and three() == 3


def test_a_name_or_alias_cannot_be_registered_twice() -> None:
    reg = colours()
    with pytest.raises(ValueError, match="already registered"):
        reg.register("RED", 9)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("pink", 9, aliases=("Crimson",))
    with pytest.raises(ValueError, match="non-empty"):
        reg.register(" pink", 9)
    assert "pink" not in reg


def test_a_family_raises_its_own_error_class() -> None:
    class UnknownColour(UnknownName):
        pass

    reg: Registry[int] = Registry("colour", error=UnknownColour)
    with pytest.raises(UnknownColour, match="known: \\(none\\)"):
        reg.get("red")


def test_gavel_policies_keep_their_public_functions_on_the_registry() -> None:
    assert POLICIES.names() == POLICY_NAMES
    assert get_policy("FIFO_PERF").name == "fifo_perf"
    assert get_policy("max_sum_throughput_normalized_by_cost_perf_slos").name.endswith("_SLOs")
    with pytest.raises(UnknownPolicy) as info:
        get_policy("fifo_pref")
    assert "'fifo_perf'" in str(info.value).split("known:")[0]
    assert all(name in str(info.value) for name in POLICY_NAMES)

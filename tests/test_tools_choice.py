"""--tool-choice and --chain-limit as pure plans per round."""

from __future__ import annotations

import pytest

from llmchat.errors import UsageError
from llmchat.tools.choice import ChainGuard, RoundPlan, parse_tool_choice, plan_round

NAMES = ("get_weather", "add")


def test_auto_offers_every_tool_lazily_in_every_round():
    choice = parse_tool_choice("auto", NAMES)
    assert plan_round(choice, 0, NAMES) == RoundPlan(NAMES, NAMES, False)
    assert plan_round(choice, 3, NAMES) == RoundPlan(NAMES, NAMES, False)


def test_required_forces_the_first_round_only():
    choice = parse_tool_choice("required", NAMES)
    assert plan_round(choice, 0, NAMES) == RoundPlan(NAMES, NAMES, True)
    assert plan_round(choice, 1, NAMES) == RoundPlan(NAMES, NAMES, False)


def test_a_tool_name_forces_that_tool_in_the_first_round():
    choice = parse_tool_choice("add", NAMES)
    assert plan_round(choice, 0, NAMES) == RoundPlan(NAMES, ("add",), True)
    assert plan_round(choice, 1, NAMES) == RoundPlan(NAMES, NAMES, False)


def test_none_offers_nothing():
    assert plan_round(parse_tool_choice("none", NAMES), 0, NAMES) == RoundPlan((), (), False)
    assert plan_round(parse_tool_choice("auto", ()), 0, ()) == RoundPlan((), (), False)


def test_an_unknown_choice_is_a_usage_error_listing_the_choices():
    with pytest.raises(UsageError, match="use one of auto, required, none, get_weather, add"):
        parse_tool_choice("delete_all", NAMES)


def test_the_chain_limit_stops_with_one_notice():
    guard = ChainGuard(limit=2)
    guard.record_round()
    assert not guard.exhausted and guard.notice() is None
    guard.record_round()
    assert guard.exhausted
    first = guard.notice()
    assert first is not None and "--chain-limit 2" in first
    assert guard.notice() is None  # once
    assert ChainGuard().limit == 5
    with pytest.raises(UsageError, match="--chain-limit must be 1 or more"):
        ChainGuard(limit=0)

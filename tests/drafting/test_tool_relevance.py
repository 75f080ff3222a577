import pytest
from test_value_candidates import drafts_from

from toolspec.calls.formats import get_format
from toolspec.calls.tools import ToolSet
from toolspec.drafting.call_grammar import CallGrammar
from toolspec.drafting.tool_relevance import tool_name_shares

TOOLS = ToolSet.from_functions([
    {"name": "property_valuation.get",
     "description": "Get estimated value of a property based on location and age"},
    {"name": "realestate.find_properties",
     "description": "Find properties based on location, budget, and specifications"},
    {"name": "weather.get_forecast", "description": "Get the weather forecast for a city"},
])


def test_the_tool_whose_words_the_user_uses_gets_the_largest_share() -> None:
    shares = tool_name_shares(TOOLS, "Find a 3 bedroom villa within my budget in San Diego.")
    assert sum(shares.values()) == pytest.approx(1.0)
    assert max(shares, key=shares.get) == "realestate.find_properties"
    shares = tool_name_shares(TOOLS, "Will it rain in Paris? Show me the forecast.")
    assert max(shares, key=shares.get) == "weather.get_forecast"


def test_shared_words_weigh_less_and_no_words_mean_even_shares() -> None:
    by_location = tool_name_shares(TOOLS, "Something about this location.")
    by_budget = tool_name_shares(TOOLS, "Something about this budget.")
    # "location" is in two tools' descriptions, "budget" in one: it says more.
    assert by_location["property_valuation.get"] == pytest.approx(
        by_location["realestate.find_properties"])
    assert by_budget["realestate.find_properties"] > by_location["realestate.find_properties"]
    for conversation in ("", "Please get me something."):
        assert list(tool_name_shares(TOOLS, conversation).values()) == pytest.approx([1 / 3] * 3)


def test_the_grammar_drafts_the_likeliest_tool_name_first() -> None:
    calls = CallGrammar(TOOLS, get_format("json"),
                        conversation="What is the weather forecast for Oslo tomorrow?")
    assert drafts_from(calls, '{"name": "')[0].startswith('weather.get_forecast"')


def test_a_tool_called_before_gives_way_and_every_tool_keeps_half_an_even_share() -> None:
    asked = "Show me the weather forecast for Oslo."
    before = tool_name_shares(TOOLS, asked)
    after = tool_name_shares(TOOLS, 'weather.get_forecast("Oslo") said rain. ' + asked)
    assert after["weather.get_forecast"] < before["weather.get_forecast"]
    assert min(before.values()) >= 0.5 / 3

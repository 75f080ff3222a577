import pytest
from test_value_candidates import drafts_from, one_tool

from toolspec.drafting.number_values import StatedNumber, stated_numbers


def values(text: str) -> list[str]:
    return [number.value for number in stated_numbers(text)]


@pytest.mark.parametrize("text, expected", [
    ("a height of 5.", ["5"]),
    ("coefficients 5, 20, and -25", ["5", "20", "-25"]),
    ("within $300,000 to $1,250,000.50", ["300000", "1250000.50"]),
    ("a list 1,2,3 and 1,2345", ["1", "2", "3", "2345"]),  # not grouped by threes
    ("on 2023-03-22 at 10:00", ["2023", "03", "22", "10", "00"]),
    ("a 5km run in 10 m", ["10"]),  # units are not scales
])
def test_numbers_as_json_writes_them(text: str, expected: list[str]) -> None:
    assert values(text) == expected


def test_a_scale_is_multiplied_out_and_the_number_as_written_kept_after_it() -> None:
    text = "revenues of $1M in 2019, $1.2M in 2020; 3 million users, 2.5bn, 5k and 7B"
    assert values(text) == ["1000000", "1", "2019", "1200000", "1.2", "2020", "3000000", "3",
                            "2500000000", "2.5", "5000", "5", "7000000000", "7"]
    assert stated_numbers("$1.2M")[0] == StatedNumber("1200000", "1.2M")
    assert stated_numbers("0.5 Million")[0].value == "500000"


def test_each_number_once_with_its_first_spelling() -> None:
    assert stated_numbers("300,000 or 300000") == [StatedNumber("300000", "300,000")]


def test_the_grammar_drafts_a_grouped_number_whole_and_by_its_parameters_words() -> None:
    calls = one_tool({"min_price": {"type": "number"}, "max_price": {"type": "number"}},
                     "Find a villa for sale with a max price of $400,000 and a min price of "
                     "$300,000.")
    assert drafts_from(calls, '{"name": "Act", "arguments": {"min_price": ')[0] \
        .startswith('300000, "max_price": ')
    assert drafts_from(calls, '{"name": "Act", "arguments": {"min_price": 300000, '
                              '"max_price": ')[0].startswith("400000}")
    typed = '{"name": "Act", "arguments": {"min_price": 30'
    assert any(draft.startswith('0000, "max_price"') for draft in drafts_from(calls, typed))

"""ConversationValues: a conversation's argument values, ranked per parameter (pure text)."""

from toolspec.drafting.conversation_values import ConversationValues, is_written_number

CONVERSATION = ("<user>My username is Kim99. The appointment ID is 34567890. "
                "I need 2 rooms for 3.5 nights at the \"Grand Hotel\" on 2023-05-04.</user>")


def test_values_the_parameters_words_introduce_come_first_with_halving_priors() -> None:
    values = ConversationValues(CONVERSATION)
    strings = values.strings_for("appointment_id", 0.4)
    assert strings[0] == ("34567890", 0.4)
    assert [prior for _, prior in strings] == [0.4 * 0.5 ** rank for rank in range(len(strings))]
    assert values.strings_for("username", 0.4)[0][0] == "Kim99"
    assert values.numbers_for("rooms", integers_only=False, share=0.5)[0] == ("2", 0.5)
    assert "3.5" not in [n for n, _ in values.numbers_for("rooms", True, 0.5)]


def test_values_the_output_holds_are_not_offered_again() -> None:
    values = ConversationValues(CONVERSATION)
    values.note_written('{"name": "Book", "arguments": {"id": "34567890", "rooms": 2')
    assert "34567890" not in [s for s, _ in values.strings_for("appointment_id", 0.4)]
    assert "2" not in [n for n, _ in values.numbers_for("rooms", False, 0.5)]
    values.note_written("")  # a new output: everything is available again
    assert values.strings_for("appointment_id", 0.4)[0][0] == "34567890"


def test_values_going_on_from_what_is_typed_share_the_prior() -> None:
    values = ConversationValues(CONVERSATION + " Call 345 or 3456.")
    going_on = values.numbers_going_on("34", 0.3)
    assert {n for n, _ in going_on} == {"34567890", "345", "3456"}
    assert all(abs(prior - 0.3 / len(going_on)) < 1e-12 for _, prior in going_on)
    assert [s for s, _ in values.spans_going_on("Grand", 0.3)] == ["Grand Hotel"]
    snake = ConversationValues("List the social security numbers.")
    assert snake.spans_going_on("social_se", 0.3)[0][0].startswith("social_security")


def test_dates_are_written_in_the_pattern_until_the_output_holds_them() -> None:
    values = ConversationValues(CONVERSATION)
    assert [d.text for d in values.dates_written(["%Y-%m-%d"], None)] == ["2023-05-04"]
    values.note_written('{"date": "2023-05-04"')
    assert values.dates_written(["%Y-%m-%d"], None) == []


def test_written_numbers() -> None:
    assert is_written_number("-12") and is_written_number("3.5")
    assert not is_written_number("3.") and not is_written_number("12a")

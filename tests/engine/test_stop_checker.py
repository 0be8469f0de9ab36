"""Stop-string search windows, cut points and the streaming hold-back, on hand-made text."""

from __future__ import annotations

import pytest

from core.engine.stop_checker import StopChecker, find_stop_string


def test_search_sees_matches_ending_in_new_text_only():
    text = "abc stop xyz st"
    assert find_stop_string(text, 0, ["stop"]) == ("stop", 4)
    # "stop" ends at 8: a window starting at 8 cannot see it; at 7 it can (it spans).
    assert find_stop_string(text, 8, ["stop"]) is None
    assert find_stop_string(text, 7, ["stop"]) == ("stop", 4)


def test_the_stop_string_completing_first_wins_and_ties_go_to_the_longest():
    assert find_stop_string("one two three", 0, ["three", "two"]) == ("two", 4)
    assert find_stop_string("x two", 0, ["wo", "o", "two"]) == ("two", 2)


@pytest.mark.parametrize(("include", "expected"), [(False, "say "), (True, "say END")])
def test_stop_string_spanning_deltas_cuts_the_text(include, expected):
    checker = StopChecker(["END"], include_stop_str_in_output=include)
    assert checker.append("say E", 1) is None
    assert checker.append("ND more", 2) == "END"
    assert checker.text == expected


def test_stop_string_at_the_very_start_leaves_empty_text():
    checker = StopChecker(["Hi"])
    assert checker.append("Hi there", 1) == "Hi"
    assert checker.text == ""


def test_min_tokens_exempts_the_text_of_the_first_tokens():
    checker = StopChecker(["ab"], min_tokens=2)
    assert checker.append("ab ", 1) is None
    assert checker.append("a", 2) is None
    # A stop string may start in exempt text and complete after it.
    assert checker.append("b ab", 3) == "ab"
    assert checker.text == "ab "


def test_hold_back_is_longest_stop_minus_one_until_finished():
    checker = StopChecker(["<end>", "##"])
    checker.append("hello <en", 1)
    assert checker.releasable_length(finished=False) == len("hello <en") - 4
    assert checker.releasable_length(finished=True) == len("hello <en")
    assert StopChecker(["<end>"], include_stop_str_in_output=True).hold_back == 0
    assert StopChecker([]).hold_back == 0


def test_released_text_never_shrinks_across_a_cut():
    checker = StopChecker(["xyz"])
    checker.append("aaxy", 1)
    released = checker.releasable_length(finished=False)
    assert checker.append("z", 2) == "xyz"
    assert checker.releasable_length(finished=True) == len("aa") >= released


def test_empty_stop_string_is_rejected():
    with pytest.raises(ValueError, match="stop must not contain empty strings"):
        StopChecker(["a", ""])

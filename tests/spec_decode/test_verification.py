"""The verification rule: n drafts are verified at n + 1 positions and yield up to n + 1
tokens; read back, the drafts that fit a room and the drafts a verification accepted."""

from __future__ import annotations

import numpy as np
import pytest

from core.spec_decode.verification import num_accepted, num_drafts_within, num_verified


@pytest.mark.parametrize(("num_drafts", "verified"), [(0, 1), (1, 2), (4, 5)])
def test_n_drafts_are_verified_at_n_plus_one_positions(num_drafts, verified):
    assert num_verified(num_drafts) == verified


def test_the_rule_applies_to_each_request_of_an_array():
    assert num_verified(np.array([0, 3, 1])).tolist() == [1, 4, 2]


@pytest.mark.parametrize(("room", "drafts"), [(-1, 0), (0, 0), (1, 0), (2, 1), (5, 4)])
def test_drafts_within_a_room_leave_one_token_for_the_target(room, drafts):
    assert num_drafts_within(room) == drafts
    if drafts:
        assert num_verified(drafts) == room


@pytest.mark.parametrize(("emitted", "accepted"), [(1, 0), (2, 1), (5, 4)])
def test_every_emitted_token_but_the_targets_own_is_an_accepted_draft(emitted, accepted):
    assert num_accepted(emitted) == accepted

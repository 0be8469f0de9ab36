"""AcceptanceGate: requests whose drafts keep failing pause, for longer each time."""

from __future__ import annotations

import pytest

from core.spec_decode.gate import AcceptanceGate


def paused_steps(gate: AcceptanceGate, req_id: str) -> int:
    """How many consecutive steps the gate refuses the request from now on."""
    count = 0
    while not gate.allows(req_id):
        count += 1
    return count


def test_a_new_request_drafts_and_good_acceptance_keeps_it_drafting():
    gate = AcceptanceGate(0.5)
    assert gate.allows("a")
    for _ in range(10):
        gate.observe("a", 4, 3)
        assert gate.allows("a")


def test_rejections_pause_drafting_for_a_doubling_number_of_steps():
    gate = AcceptanceGate(0.5)
    gate.observe("a", 4, 0)  # rate 1 -> 0.5: not below yet
    assert paused_steps(gate, "a") == 0
    gate.observe("a", 4, 0)  # 0.25
    assert paused_steps(gate, "a") == 4
    gate.observe("a", 4, 0)  # one bad try after the pause
    assert paused_steps(gate, "a") == 8
    gate.observe("a", 4, 4)  # a good try (rate 0.75): back to drafting, backoff forgotten
    assert paused_steps(gate, "a") == 0
    gate.observe("a", 4, 0)  # 0.375
    assert paused_steps(gate, "a") == 4


def test_the_pause_stops_growing_at_its_maximum():
    gate = AcceptanceGate(0.5)
    pauses = []
    for _ in range(10):
        gate.observe("a", 2, 0)
        gate.observe("a", 2, 0)
        pauses.append(paused_steps(gate, "a"))
    assert max(pauses) == 64 and pauses[-1] == 64


def test_steps_without_drafts_change_nothing_and_requests_are_independent():
    gate = AcceptanceGate(0.5)
    gate.observe("a", 0, 0)
    gate.observe("a", 3, 0)
    gate.observe("a", 3, 0)
    assert gate.allows("b")
    assert not gate.allows("a")
    gate.forget(["a"])
    assert gate.allows("a")


def test_threshold_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="min_acceptance_rate"):
        AcceptanceGate(1.5)


def test_a_new_request_starts_paused_where_drafts_have_lately_failed():
    gate = AcceptanceGate(0.5)
    for i in range(4):
        gate.observe(f"old-{i}", 4, 0)  # engine-wide average: 1 -> 0.8 -> ... -> 0.41
    assert paused_steps(gate, "new") == 16
    gate.observe("new", 4, 4)  # its probe succeeds: it drafts, and so will the next ones
    assert gate.allows("new")
    for i in range(8):
        gate.observe(f"good-{i}", 4, 4)
    assert paused_steps(gate, "newer") == 0

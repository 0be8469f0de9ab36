"""The Responses API's store keeps at most its count of responses, none older than its age,
and lets the oldest go first."""

from __future__ import annotations

import pytest

from core.entrypoints.openai.response_store import ResponseStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_past_the_count_the_oldest_are_evicted_first():
    store: ResponseStore[str] = ResponseStore(max_count=3, max_age_s=60, clock=Clock())
    for i in range(5):
        store.add(f"resp_{i}", f"value {i}")
    assert [store.get(f"resp_{i}") for i in range(5)] == [
        None,
        None,
        "value 2",
        "value 3",
        "value 4",
    ]
    assert len(store) == 3


def test_a_response_older_than_the_age_is_gone():
    clock = Clock()
    store: ResponseStore[str] = ResponseStore(max_count=10, max_age_s=60, clock=clock)
    store.add("resp_old", "old")
    clock.now += 30
    store.add("resp_new", "new")
    clock.now += 30  # resp_old is 60 s old: expired; resp_new 30 s
    assert (store.get("resp_old"), store.get("resp_new")) == (None, "new")
    clock.now += 29.5
    assert store.get("resp_new") == "new"
    clock.now += 0.5
    assert store.get("resp_new") is None
    assert len(store) == 0


def test_adding_an_id_again_makes_it_the_newest():
    store: ResponseStore[str] = ResponseStore(max_count=2, max_age_s=60, clock=Clock())
    store.add("resp_a", "a1")
    store.add("resp_b", "b")
    store.add("resp_a", "a2")
    store.add("resp_c", "c")  # evicts the oldest: resp_b, not resp_a
    assert [store.get(i) for i in ("resp_a", "resp_b", "resp_c")] == ["a2", None, "c"]


@pytest.mark.parametrize("bounds", [(0, 60.0), (10, 0.0)])
def test_bounds_that_keep_nothing_are_refused(bounds):
    with pytest.raises(ValueError, match="at least one response"):
        ResponseStore(*bounds)

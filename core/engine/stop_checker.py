"""StopChecker: stop strings over a request's growing output text, and the streaming hold-back.

A stop string can span tokens, so each check looks at the new text plus the len(stop) - 1
characters before it, and no further back: anything older was checked when it arrived.
While streaming, the last len(longest stop) - 1 characters stay unreleased, because they
may be the start of a stop string that the next token completes; once the request finishes,
all that remains is released. Stop strings are matched on characters, never token ids.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopChecker", "find_stop_string"]


def find_stop_string(text: str, new_start: int, stop: Sequence[str]) -> tuple[str, int] | None:
    """The stop string that ends first after `text[:new_start]`, with its start offset.

    Only matches ending inside `text[new_start:]` count. When several end at the same
    character, the longest (earliest-starting) wins, so the output is cut at the first point
    where any stop string is complete. None when no stop string ends in the new text.
    """
    best: tuple[int, int, str] | None = None  # (end, start, stop string)
    for stop_str in stop:
        start = text.find(stop_str, max(0, new_start - len(stop_str) + 1))
        if start >= 0:
            candidate = (start + len(stop_str), start, stop_str)
            best = candidate if best is None else min(best, candidate)
    return None if best is None else (best[2], best[1])


class StopChecker:
    """One request's output text, cut at the first stop string that completes.

    `min_tokens`: a stop string counts only if it completes after the text of the first
    `min_tokens` output tokens (it may start inside it), as EOS is masked until then.
    `include_stop_str_in_output` keeps the stop string at the end of the text; then nothing
    is held back while streaming, since every prefix of it stays in the final text.
    """

    def __init__(
        self, stop: Sequence[str], include_stop_str_in_output: bool = False, min_tokens: int = 0
    ) -> None:
        if any(not s for s in stop):
            raise ValueError("stop must not contain empty strings")
        self._stop = list(stop)
        self._include_stop_str = include_stop_str_in_output
        self._min_tokens = min_tokens
        longest = max((len(s) for s in self._stop), default=0)
        self.hold_back = 0 if include_stop_str_in_output else max(0, longest - 1)
        self.text = ""
        self._checked_until = 0  # text before this offset has been searched (or is exempt)

    def append(self, delta: str, num_output_tokens: int) -> str | None:
        """Add the text of output token number `num_output_tokens` (1-based); return the stop
        string it completes, after cutting `text` at it, or None."""
        self.text += delta
        if num_output_tokens <= self._min_tokens or not self._stop:
            self._checked_until = len(self.text)
            return None
        match = find_stop_string(self.text, self._checked_until, self._stop)
        self._checked_until = len(self.text)
        if match is None:
            return None
        stop_str, start = match
        self.text = self.text[: start + len(stop_str) if self._include_stop_str else start]
        return stop_str

    def releasable_length(self, finished: bool) -> int:
        """How many leading characters of `text` may be shown: all once finished, else all but
        the hold-back. Never decreases, even across a stop-string cut: a cut starts at most
        hold_back characters before the text that completed it."""
        if finished:
            return len(self.text)
        return max(0, len(self.text) - self.hold_back)

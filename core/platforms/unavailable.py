"""`Unavailable`: what a platform probe raises when its platform cannot run here.

Its own module, free of torch, so that probes (which must stay cheap) can import it.
"""

from __future__ import annotations


class Unavailable(Exception):
    """Raised by a platform probe: this platform cannot run here, and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

"""A logits processor that breaks its contract, for the conformance kit's own tests (core's
reference, SoftcapLogitsProcessor, is the one that conforms): it forgets a request when the
batch moves it, and nudges every row, asked or not."""

from __future__ import annotations

from core.sample.logits_processor import LogitsProcessor


class ForgetfulProcessor(LogitsProcessor):
    """Requests with extra_args {"boost": x} get x added to token 0, kept by row but never
    moved; every other row gets a small nudge on token 1."""

    def __init__(self, config, device, is_pin_memory):
        self.boosts: dict[int, float] = {}

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        if batch_update is None:
            return
        for row in batch_update.removed:
            self.boosts.pop(row, None)
        for row, params, _, _ in batch_update.added:
            boost = (params.extra_args or {}).get("boost")
            if boost is not None:
                self.boosts[row] = boost

    def apply(self, logits):
        logits[:, 1] += 0.5
        for row, boost in self.boosts.items():
            if row < logits.shape[0]:
                logits[row, 0] += boost
        return logits

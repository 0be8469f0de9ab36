"""An IO processor that breaks its contract, for the conformance kit's own tests (core's
reference, `passthrough`, is the one that conforms): it trusts its data (a None is an
AttributeError, not a refusal) and answers with a set, which JSON cannot carry."""

from __future__ import annotations

from core.io_processors import IOProcessor


class SloppyProcessor(IOProcessor[list[str], set]):
    def parse_request(self, data):
        return list(data.get("words", []))

    def pre_process(self, data, request_id=None):
        return " ".join(data) or "w1"

    def post_process(self, outputs, request_id=None):
        return {output.request_id for output in outputs}

    def output_to_response(self, output):
        return output

"""StructuredOutputManager: per-request grammars in the engine-core process.

Compiling a grammar can take up to a second, so it never runs on the step loop: `submit`
hands it to a thread pool and returns. The scheduler keeps such a request waiting
(RequestStatus.WAITING_FOR_GRAMMAR) and schedules the others; once `is_ready` says the
compile finished, it either admits the request or, when `error` has the reason, finishes
it with an error. Each step it asks `build_bitmask` for the allowed tokens of the requests
that sample, and after the step feeds the sampled tokens to `accept_tokens`.

The xgrammar backend (which imports xgrammar and transformers, and reads the whole
vocabulary) is built on the first compile, in the pool, so an engine that never sees a
structured request never pays for it.

With a reasoning parser (`is_reasoning_end`), a grammar sees only the tokens after the
model's reasoning (core.structured_output.reasoning_gate): until then its rows allow every
token and it accepts nothing, and from the token after the end it applies as usual.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING

from core.sampling_params import StructuredOutputsParams
from core.spec_decode.verification import num_verified
from core.structured_output.bitmask import pack_grammar_bitmask
from core.structured_output.reasoning_gate import IsReasoningEnd, ReasoningGate
from core.tokenizer import Tokenizer
from core.worker.contract import GrammarBitmask

if TYPE_CHECKING:
    from core.structured_output.xgrammar_backend import Grammar, XgrammarBackend

__all__ = ["StructuredOutputManager"]

logger = logging.getLogger(__name__)


def _make_xgrammar_backend(
    tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Sequence[int] | None
) -> XgrammarBackend:
    # Imported here: importing xgrammar takes seconds; it happens on a compile thread.
    from core.structured_output.xgrammar_backend import XgrammarBackend

    return XgrammarBackend(tokenizer, vocab_size, stop_token_ids)


class StructuredOutputManager:
    """Grammars of the structured-output requests, keyed by request id.

    Every method is called from the engine core's step loop (one thread); the compile
    threads only build the backend and the grammars and hand them over through futures.
    `make_backend` builds the backend, once, on the first compile; `is_reasoning_end`,
    the reasoning parser's, holds each grammar back until the reasoning ends.
    """

    def __init__(
        self,
        make_backend: Callable[[], XgrammarBackend],
        max_workers: int | None = None,
        is_reasoning_end: IsReasoningEnd | None = None,
    ) -> None:
        self._make_backend = make_backend
        self._backend: XgrammarBackend | None = None
        self._backend_lock = threading.Lock()
        # At least two workers: one slow compile must not hold back a quick one.
        workers = max_workers or max(2, (os.cpu_count() or 2) // 2)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="core-grammar")
        self._grammars: dict[str, Future[Grammar]] = {}
        self._gate = None if is_reasoning_end is None else ReasoningGate(is_reasoning_end)

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Tokenizer,
        vocab_size: int,
        stop_token_ids: Sequence[int] | None = None,
        max_workers: int | None = None,
    ) -> StructuredOutputManager:
        """A manager over the xgrammar backend for `tokenizer` and a model with `vocab_size`
        logits; `stop_token_ids` defaults to the tokenizer's EOS."""
        factory = partial(_make_xgrammar_backend, tokenizer, vocab_size, stop_token_ids)
        return cls(factory, max_workers)

    # -- compile --------------------------------------------------------------------------

    def submit(
        self,
        request_id: str,
        params: StructuredOutputsParams,
        prompt_token_ids: Sequence[int] = (),
    ) -> None:
        """Start compiling the request's grammar on the pool; returns at once. The prompt
        says whether the reasoning, if any, is still open when the output starts."""
        if request_id in self._grammars:
            raise ValueError(f"request {request_id!r} already has a grammar")
        self._grammars[request_id] = self._pool.submit(self._compile, params)
        if self._gate is not None:
            self._gate.add(request_id, prompt_token_ids)

    def _compile(self, params: StructuredOutputsParams) -> Grammar:
        try:
            return self._get_backend().compile(params)
        except ValueError:
            raise  # the user's input: reported through error()
        except Exception:
            logger.exception("structured output: grammar compilation failed")
            raise

    def _get_backend(self) -> XgrammarBackend:
        with self._backend_lock:
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    def is_ready(self, request_id: str) -> bool:
        """True once the compile has finished, successfully or not (see `error`)."""
        return self._future(request_id).done()

    def error(self, request_id: str) -> str | None:
        """Why the request's grammar failed to compile; None if it compiled or is compiling."""
        future = self._future(request_id)
        if future.cancelled():  # by shutdown()
            return "grammar compilation was cancelled: the engine is shutting down"
        if not future.done() or future.exception() is None:
            return None
        exc = future.exception()
        if isinstance(exc, ValueError):
            return str(exc)
        return f"grammar compilation failed: {type(exc).__name__}: {exc}"

    def wait(self, timeout: float) -> bool:
        """Block until a compile in flight finishes, or `timeout` seconds pass. True if one
        finished. Lets an idle engine sleep instead of polling `is_ready`."""
        pending = [f for f in self._grammars.values() if not f.done()]
        if not pending:
            return False
        done, _ = concurrent.futures.wait(
            pending, timeout, return_when=concurrent.futures.FIRST_COMPLETED
        )
        return bool(done)

    # -- the step -------------------------------------------------------------------------

    def build_bitmask(
        self, request_ids: Sequence[str], drafts: Mapping[str, Sequence[int]] | None = None
    ) -> GrammarBitmask | None:
        """Allowed tokens of those of `request_ids` that have a grammar, in the given
        order; None when none has one. Their grammars must be ready.

        A request with n drafts gets n + 1 rows: the allowed tokens at each verified
        position, the grammar advanced over the drafts before it (and rolled back after,
        so the grammar stays where the accepted tokens left it). Drafts come from
        `validate_tokens`, so the grammar accepts all of them. Positions still in the
        reasoning allow every token; a request reasoning past all of them has no rows.
        """
        drafts = drafts or {}
        with_grammar = [r for r in request_ids if r in self._grammars]
        starts = {r: self._grammar_start(r, drafts.get(r, ())) for r in with_grammar}
        req_ids = [r for r in with_grammar if starts[r] is not None]
        if not req_ids:
            return None
        rows = [r for r in req_ids for _ in range(num_verified(len(drafts.get(r, ()))))]
        bitmask = self._get_backend().allocate_bitmask(len(rows))  # [rows, W]
        row = 0
        for req_id in req_ids:
            start, constrained = starts[req_id], drafts.get(req_id, ())[starts[req_id] :]
            bitmask[row : row + start] = -1  # every bit set: any token
            row = self._grammar(req_id).fill_bitmasks(bitmask, row + start, constrained)
        return pack_grammar_bitmask(rows, bitmask)

    def accept_tokens(self, request_id: str, token_ids: Sequence[int]) -> bool:
        """Advance the request's grammar over sampled tokens (those after its reasoning);
        False if one is not allowed."""
        start = 0 if self._gate is None else self._gate.advance(request_id, token_ids)
        if start is None:
            return True  # all reasoning: nothing for the grammar yet
        return self._grammar(request_id).accept_tokens(token_ids[start:])

    def validate_tokens(self, request_id: str, token_ids: Sequence[int]) -> list[int]:
        """The longest prefix of `token_ids` the request's grammar allows from where it is
        now (reasoning tokens are all allowed); the grammar itself does not move."""
        start = self._grammar_start(request_id, token_ids)
        if start is None:
            return list(token_ids)
        allowed = self._grammar(request_id).validate_tokens(token_ids[start:])
        return [*token_ids[:start], *allowed]

    def is_terminated(self, request_id: str) -> bool:
        """True once the request's grammar is complete and has accepted a stop token."""
        return self._grammar(request_id).is_terminated()

    def remove(self, request_id: str) -> None:
        """Forget the request (finished or aborted); a compile not yet started is cancelled.
        Unknown ids are ignored."""
        future = self._grammars.pop(request_id, None)
        if future is not None:
            future.cancel()
        if self._gate is not None:
            self._gate.remove(request_id)

    def shutdown(self) -> None:
        """Stop the compile threads; compiles not yet started are cancelled."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._grammars

    def _grammar_start(self, request_id: str, token_ids: Sequence[int]) -> int | None:
        """Where the grammar takes over in the request's next `token_ids` (see
        ReasoningGate.grammar_start); 0 without a reasoning parser."""
        return 0 if self._gate is None else self._gate.grammar_start(request_id, token_ids)

    def _future(self, request_id: str) -> Future[Grammar]:
        future = self._grammars.get(request_id)
        if future is None:
            raise ValueError(f"request {request_id!r} has no grammar")
        return future

    def _grammar(self, request_id: str) -> Grammar:
        future = self._future(request_id)
        if not future.done():
            raise ValueError(f"request {request_id!r}: its grammar is still compiling")
        if future.cancelled() or future.exception() is not None:
            raise ValueError(f"request {request_id!r}: {self.error(request_id)}")
        return future.result()

"""IncrementalDetokenizer: a request's output token ids -> text, one token at a time.

Decoding the whole output again at every step costs O(n^2) over a request; this decodes
each new token once, through `tokenizers.decoders.DecodeStream`, which holds a token back
while the bytes it ends with are not yet a whole UTF-8 character (byte-level BPE splits an
emoji or a CJK character over several tokens) and releases the character with the token that
completes it. The concatenated deltas, plus `flush()` at the end, equal
`tokenizer.decode(ids, skip_special_tokens=...)` of the same ids (see `decode_next` for the
two documented exceptions). The prompt is not used as context, so a SentencePiece decoder
drops the leading space of the first output token exactly as that decode does.
"""

from __future__ import annotations

import tokenizers
from tokenizers.decoders import DecodeStream

from core.tokenizer import Tokenizer

__all__ = ["IncrementalDetokenizer"]


class IncrementalDetokenizer:
    """Streams the text of one request's output token ids.

    `skip_special_tokens` drops special tokens from the text, as `Tokenizer.decode` does.
    `spaces_between_special_tokens=False` (effective only when special tokens are kept, as in
    vLLM) writes an added token that directly follows another added token as its bare
    content, so decoders that join tokens with spaces (WordPiece) do not put one between them;
    byte-level and SentencePiece decoders never do, so there it changes nothing. The
    tokenizers library's own decode has no such option: True is its behaviour.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._backend: tokenizers.Tokenizer = tokenizer.backend_tokenizer
        self._skip_special_tokens = skip_special_tokens
        # Added token id -> content, only when spaces between them must be suppressed.
        self._added_tokens: dict[int, str] = {}
        if not (skip_special_tokens or spaces_between_special_tokens):
            added = self._backend.get_added_tokens_decoder()
            self._added_tokens = {i: token.content for i, token in added.items()}
        self._last_was_added = False
        self._new_window()

    def _new_window(self) -> None:
        self._stream = DecodeStream(skip_special_tokens=self._skip_special_tokens)
        self._window_ids: list[int] = []  # ids fed to this stream
        self._window_text = ""  # what this stream has returned
        self._num_released = 0  # leading window ids whose text has been returned

    def decode_next(self, token_id: int) -> str:
        """Feed one output token; return the text it completes ("" while a character is cut).

        Exceptions to "deltas concatenate to decode(ids)": the spacing rule above, and byte
        sequences that are not valid UTF-8, whose replacement characters (U+FFFD) a decoder
        may count differently once more bytes arrive. When the stream cannot extend what it
        already returned ("Invalid prefix") it restarts at the held-back tokens: text
        already returned is never taken back.
        """
        piece = self._feed(token_id)
        content = self._added_tokens.get(token_id)
        if content is not None and self._last_was_added:
            piece = content  # the bare token, without the separator the decoder put before it
        self._last_was_added = content is not None
        return piece

    def _feed(self, token_id: int) -> str:
        try:
            piece = self._stream.step(self._backend, token_id)
            self._window_ids.append(token_id)
        except Exception:  # tokenizers raises a bare Exception for an invalid prefix
            held_ids = self._window_ids[self._num_released :]
            self._new_window()
            # A fresh stream has no prefix to contradict: a failure here is a real error.
            self._window_ids = [*held_ids, token_id]
            piece = self._stream.step(self._backend, self._window_ids)
        if piece is None:
            return ""
        self._window_text += piece
        self._num_released = len(self._window_ids)
        return piece

    def flush(self) -> str:
        """The text of the tokens still held back (an incomplete character at the end, as
        decode writes it: U+FFFD); call once, when the request finishes."""
        held_ids = self._window_ids[self._num_released :]
        if not held_ids:
            return ""
        self._num_released = len(self._window_ids)
        skip = self._skip_special_tokens
        full = self._backend.decode(self._window_ids, skip_special_tokens=skip)
        if full.startswith(self._window_text):
            return full[len(self._window_text) :]
        return self._backend.decode(held_ids, skip_special_tokens=skip)

"""Whether a constraint can be met at all: a grammar whose language is empty (a regex such as
`[^\\s\\S]`, an EBNF rule that only refers to itself) parses, yet no output satisfies it;
the request would be accepted and then end with an error. The frontend refuses it instead.

Emptiness is decided by a search over bytes: the grammar is compiled against a vocabulary of
the 256 single bytes and a stop token, and a depth-first walk looks for a path of bytes
after which the grammar may stop. The walk is bounded (depth and steps); only a walk that
ran out of paths without meeting a bound proves the language empty. Any other outcome
accepts the grammar, so a grammar whose shortest text is long is never refused.
"""

from __future__ import annotations

import functools

import xgrammar as xgr

from core.sampling_params import StructuredOutputsParams
from core.structured_output.xgrammar_backend import build_grammar, grammar_kind

__all__ = ["check_grammar"]

_STOP = 256  # the stop token of the byte vocabulary, after the 256 bytes
_MAX_DEPTH = 64  # bytes: past this the search gives up (the language may still be empty)
_MAX_STEPS = 4096  # bytes tried in all


def check_grammar(params: StructuredOutputsParams) -> None:
    """ValueError naming the field when `params`' constraint does not parse, or parses to a
    language with no text in it."""
    grammar = build_grammar(params)
    if _provably_empty(_byte_compiler().compile_grammar(grammar)):
        kind = grammar_kind(params)
        raise ValueError(
            f"invalid structured_outputs.{kind}: no text can satisfy it (its language is empty)"
        )


@functools.lru_cache(maxsize=1)
def _byte_compiler() -> xgr.GrammarCompiler:
    vocab: list[bytes | str] = [bytes([b]) for b in range(256)]
    info = xgr.TokenizerInfo([*vocab, "</s>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[_STOP])
    return xgr.GrammarCompiler(info, max_threads=1)


def _provably_empty(compiled: xgr.CompiledGrammar) -> bool:
    matcher = xgr.GrammarMatcher(compiled, max_rollback_tokens=_MAX_DEPTH)
    bitmask = xgr.allocate_token_bitmask(1, _STOP + 1)
    steps = _MAX_STEPS

    def search(depth: int) -> bool | None:
        """True: some text ends here or below; False: none does; None: a bound was met."""
        nonlocal steps
        matcher.fill_next_token_bitmask(bitmask)
        allowed = _allowed(bitmask)
        if _STOP in allowed:
            return True
        if depth == _MAX_DEPTH:
            return None
        outcome: bool | None = False
        for byte in allowed:
            if steps == 0:
                return None
            steps -= 1
            matcher.accept_token(byte)
            found = search(depth + 1)
            matcher.rollback(1)
            if found:
                return True
            if found is None:
                outcome = None
        return outcome

    return search(0) is False


def _allowed(bitmask) -> list[int]:
    """The token ids whose bit is set in row 0 (int32 words, bit i of word w is id 32w+i)."""
    return [
        32 * w + bit
        for w, word in enumerate(bitmask[0].tolist())
        for bit in range(32)
        if (word >> bit) & 1 and 32 * w + bit <= _STOP
    ]

"""Chained block hashes: the fingerprints the prefix cache is indexed by.

The hash of block i covers the hash of block i - 1, block i's token ids and its extra
keys, so one hash fingerprints the whole prefix up to the end of its block: two requests
share block i only when everything before it is equal too. Only full blocks are hashed;
a partial block's tokens may still change.

Two algorithms:
- "sha256" (default): sha256 over a msgpack encoding of (parent, tokens, extra keys).
  msgpack of ints, strings, bytes and tuples is byte-for-byte deterministic, and the
  seed of the chain (NONE_HASH) is fixed, so every process agrees on every hash.
- "fast": Python's builtin `hash()` of the same tuple, 64 bits. Its seed is random per
  process unless PYTHONHASHSEED is set: a predictable seed would let anyone who can send
  prompts precompute colliding blocks offline and read another request's KV cache. The
  price is that processes only share hashes when PYTHONHASHSEED is set (in all of them).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, NewType

import msgspec

if TYPE_CHECKING:
    from core.request import Request

__all__ = [
    "HASH_ALGOS",
    "BlockHash",
    "BlockHasher",
    "HashAlgo",
    "hash_block_tokens",
    "make_block_hasher",
    "none_hash",
]

# Bytes rather than int so both algorithms share one type (and a dict key cannot be
# confused with a block id).
BlockHash = NewType("BlockHash", bytes)
BlockHasher = Callable[["Request"], list[BlockHash]]
HashAlgo = Literal["sha256", "fast"]
HASH_ALGOS: tuple[HashAlgo, ...] = ("sha256", "fast")

_NONE_HASH_SEED = b"core-none-hash"
_NONE_HASHES: dict[str, BlockHash] = {}


def _check_algo(algo: str) -> None:
    if algo not in HASH_ALGOS:
        raise ValueError(f"hash algo must be one of {HASH_ALGOS}, got {algo!r}")


def _digest(payload: tuple, algo: HashAlgo) -> BlockHash:
    if algo == "sha256":
        return BlockHash(hashlib.sha256(msgspec.msgpack.encode(payload)).digest())
    return BlockHash(hash(payload).to_bytes(8, "little", signed=True))


def none_hash(algo: HashAlgo = "sha256") -> BlockHash:
    """The parent hash of every first block: fixed for sha256, per process for "fast".

    Computed once per process and algorithm, so every request of a process chains from
    the same seed. PYTHONHASHSEED, when set, makes the "fast" seed (and `hash()` itself)
    deterministic, so processes started with the same value agree.
    """
    _check_algo(algo)
    if algo not in _NONE_HASHES:
        _NONE_HASHES[algo] = _make_none_hash(algo)
    return _NONE_HASHES[algo]


def _make_none_hash(algo: HashAlgo) -> BlockHash:
    env_seed = os.environ.get("PYTHONHASHSEED")
    if algo == "sha256":
        seed = _NONE_HASH_SEED
    elif env_seed is not None:
        seed = _NONE_HASH_SEED + b":" + env_seed.encode()
    else:
        seed = os.urandom(32)
    return BlockHash(hashlib.sha256(seed).digest())


def hash_block_tokens(
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: tuple = (),
    algo: HashAlgo = "sha256",
) -> BlockHash:
    """The hash of one full block given its parent's hash (None for the first block).

    `extra_keys` holds only ints, strings, bytes and tuples of them: their `hash()` is
    fixed by PYTHONHASHSEED, whereas None's hash is its address before Python 3.12 and
    would make the "fast" hash differ between processes.
    """
    _check_algo(algo)
    parent = none_hash(algo) if parent_hash is None else parent_hash
    return _digest((parent, tuple(token_ids), extra_keys), algo)


def _extra_keys(request: Request, block_index: int, block_size: int) -> tuple:
    """Keys that separate equal tokens: LoRA adapter (name and id) and cache salt on block
    0, and on every block the identifiers of the multimodal items whose placeholders it
    overlaps.

    The chain carries block 0's hash into every later one, so one mention isolates the
    whole namespace. Tagged pairs keep a salt "x" apart from an adapter named "x". An
    item's placeholder positions hold the same token id whatever the image, so only its
    identifier tells two images apart.
    """
    keys = []
    if block_index == 0:
        if request.lora_request is not None:
            # The id too: a server that unloads an adapter and loads other weights under
            # its name gives them a new id, and their KV must not meet the old weights'.
            lora = request.lora_request
            keys.append(("lora", lora.lora_name, lora.lora_int_id))
        if request.cache_salt is not None:
            keys.append(("salt", request.cache_salt))
    start, end = block_index * block_size, (block_index + 1) * block_size
    for feature in request.mm_features:
        if feature.placeholder.offset >= end:
            break
        if feature.placeholder.end > start:
            keys.append(("mm", feature.identifier))
    return tuple(keys)


def make_block_hasher(block_size: int, algo: HashAlgo = "sha256") -> BlockHasher:
    """A function returning the hashes of a request's full blocks not yet hashed.

    It continues from `request.block_hashes` (the blocks hashed so far), so calling it
    after each new token costs one hash per newly completed block.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    _check_algo(algo)

    def hash_new_full_blocks(request: Request) -> list[BlockHash]:
        block_index = len(request.block_hashes)
        parent = request.block_hashes[-1] if block_index else None
        new_hashes: list[BlockHash] = []
        while (block_index + 1) * block_size <= request.num_tokens:
            start = block_index * block_size
            tokens = request.all_token_ids[start : start + block_size]
            extra = _extra_keys(request, block_index, block_size)
            parent = hash_block_tokens(parent, tokens, extra, algo)
            new_hashes.append(parent)
            block_index += 1
        return new_hashes

    return hash_new_full_blocks

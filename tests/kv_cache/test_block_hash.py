"""Chained block hashes: chain property, full blocks only, extra keys, cross-process seeds."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from core.kv_cache.block_hash import hash_block_tokens, make_block_hasher, none_hash
from core.lora.request import LoRARequest
from core.multimodal.inputs import MultiModalFeature, PlaceholderRange
from core.request import Request
from core.sampling_params import SamplingParams

REPO = Path(__file__).resolve().parents[2]
BLOCK_SIZE = 4


def request(tokens, algo="sha256", **kwargs) -> Request:
    hasher = make_block_hasher(BLOCK_SIZE, algo)
    return Request("r", tokens, SamplingParams(), None, 0.0, block_hasher=hasher, **kwargs)


def test_changing_block_0_changes_every_later_hash():
    base = request(list(range(12))).block_hashes
    changed = request([99] + list(range(1, 12))).block_hashes
    assert len(base) == len(changed) == 3
    assert all(a != b for a, b in zip(base, changed, strict=True))


def test_changing_a_later_block_keeps_the_hashes_before_it():
    base = request(list(range(12))).block_hashes
    changed = request(list(range(8)) + [99, 9, 10, 11]).block_hashes
    assert changed[:2] == base[:2]
    assert changed[2] != base[2]


def test_each_hash_chains_its_parent_and_the_block_tokens():
    hashes = request(list(range(8))).block_hashes
    assert hashes[0] == hash_block_tokens(None, [0, 1, 2, 3])
    assert hashes[1] == hash_block_tokens(hashes[0], [4, 5, 6, 7])


def test_sha256_block_hash_format_is_pinned():
    # sha256 over msgpack((parent, tokens, extra keys)), seeded by sha256(b"core-none-hash").
    # Changing this breaks prefix-cache sharing between processes of different versions.
    seed = hashlib.sha256(b"core-none-hash").digest()
    expected = hashlib.sha256(msgspec.msgpack.encode([seed, [5, 6, 7, 8], []])).digest()
    assert none_hash("sha256") == seed
    assert hash_block_tokens(None, [5, 6, 7, 8]) == expected


def test_only_full_blocks_are_hashed_as_tokens_arrive():
    req = request(list(range(7)))
    assert len(req.block_hashes) == 1
    req.append_output_token_ids(7)
    assert len(req.block_hashes) == 2
    req.append_output_token_ids([8, 9, 10])
    assert len(req.block_hashes) == 2
    req.append_output_token_ids(11)
    assert req.block_hashes == request(list(range(12))).block_hashes


def test_cache_salt_and_lora_name_separate_every_block():
    tokens = list(range(8))
    plain = request(tokens).block_hashes
    salted = request(tokens, cache_salt="x").block_hashes
    lora = request(tokens, lora_request=LoRARequest("x", 1, "/adapters/x")).block_hashes
    assert salted[0] != plain[0] and salted[1] != plain[1]
    assert lora[0] != plain[0] and lora[1] != plain[1]
    # Tagged keys: a salt and an adapter with the same name stay apart.
    assert lora[0] != salted[0]
    assert request(tokens, cache_salt="x").block_hashes == salted


def test_an_adapter_name_loaded_again_under_a_new_id_shares_no_block():
    """A server gives weights loaded again under an unloaded adapter's name a new id."""
    tokens = list(range(8))
    first = request(tokens, lora_request=LoRARequest("x", 1, "/adapters/x")).block_hashes
    again = request(tokens, lora_request=LoRARequest("x", 1, "/adapters/x")).block_hashes
    reloaded = request(tokens, lora_request=LoRARequest("x", 2, "/adapters/y")).block_hashes
    assert first == again
    assert reloaded[0] != first[0] and reloaded[1] != first[1]


def test_extra_keys_enter_the_first_block_only():
    salted = request(list(range(8)), cache_salt="x").block_hashes
    assert salted[0] == hash_block_tokens(None, [0, 1, 2, 3], (("salt", "x"),))
    assert salted[1] == hash_block_tokens(salted[0], [4, 5, 6, 7])


_PRINT_HASHES = """
from core.kv_cache.block_hash import hash_block_tokens
from core.lora.request import LoRARequest
from core.multimodal.inputs import MultiModalFeature, PlaceholderRange
h0 = hash_block_tokens(None, [1, 2, 3, 4], (("salt", "s"),), algo="{algo}")
print(hash_block_tokens(h0, [5, 6, 7, 8], algo="{algo}").hex())
"""


def hash_in_subprocess(algo: str, pythonhashseed: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env["PYTHONPATH"] = str(REPO)
    if pythonhashseed is not None:
        env["PYTHONHASHSEED"] = pythonhashseed
    result = subprocess.run(
        [sys.executable, "-c", _PRINT_HASHES.format(algo=algo)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def test_sha256_hashes_agree_across_processes_whatever_their_hash_seed():
    h0 = hash_block_tokens(None, [1, 2, 3, 4], (("salt", "s"),))
    here = hash_block_tokens(h0, [5, 6, 7, 8]).hex()
    assert hash_in_subprocess("sha256", "1") == here
    assert hash_in_subprocess("sha256", "2") == here
    assert hash_in_subprocess("sha256", None) == here


def test_fast_hash_is_seeded_per_process_unless_pythonhashseed_is_set():
    assert hash_in_subprocess("fast", None) != hash_in_subprocess("fast", None)
    assert hash_in_subprocess("fast", "7") == hash_in_subprocess("fast", "7")
    assert hash_in_subprocess("fast", "7") != hash_in_subprocess("fast", "8")


def test_fast_hash_is_stable_within_a_process():
    assert none_hash("fast") == none_hash("fast")
    assert (
        request(list(range(8)), "fast").block_hashes == request(list(range(8)), "fast").block_hashes
    )


def test_bad_hasher_arguments_are_value_errors():
    with pytest.raises(ValueError, match="block_size"):
        make_block_hasher(0)
    with pytest.raises(ValueError, match="hash algo"):
        make_block_hasher(4, "md5")
    with pytest.raises(ValueError, match="hash algo"):
        hash_block_tokens(None, [1], algo="md5")


def test_an_items_identifier_separates_the_blocks_its_placeholder_covers():
    def with_image(identifier: str) -> list:
        feature = MultiModalFeature("image", identifier, PlaceholderRange(5, 4), {})
        return request([1, 2, 3, 4, 5] + [9] * 4 + [6, 7, 8], mm_features=[feature]).block_hashes

    a, b, again = with_image("cat"), with_image("dog"), with_image("cat")
    assert a == again
    assert a[0] == b[0]  # positions 0-3 come before the image
    assert a[1] != b[1] and a[2] != b[2]  # the image starts in block 1; the chain carries it

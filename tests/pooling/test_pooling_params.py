"""PoolingParams: checked on construction and on decode; model facts checked by verify."""

from __future__ import annotations

import msgspec
import pytest

from core.pooling.params import PoolingParams


@pytest.mark.parametrize("dimensions", [0, -3, True])
def test_dimensions_below_one_or_not_an_integer_are_refused(dimensions):
    with pytest.raises(ValueError, match="dimensions must be an integer >= 1"):
        PoolingParams(dimensions=dimensions)


def test_a_decoded_message_is_checked_like_a_python_call():
    encoded = msgspec.msgpack.encode(PoolingParams(dimensions=4, normalize=False))
    assert msgspec.msgpack.decode(encoded, type=PoolingParams) == PoolingParams(
        dimensions=4, normalize=False
    )
    with pytest.raises(ValueError, match="dimensions must be"):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"dimensions": 0}), type=PoolingParams)


def test_dimensions_above_the_embedding_size_are_refused():
    PoolingParams(dimensions=32).verify(32, None)
    with pytest.raises(ValueError, match="dimensions must be <= the model's embedding size 32"):
        PoolingParams(dimensions=33).verify(32, None)


def test_a_checkpoint_listing_matryoshka_sizes_allows_only_those():
    PoolingParams(dimensions=16).verify(64, [16, 32, 64])
    with pytest.raises(ValueError, match=r"one of the model's matryoshka_dimensions \[16, 32"):
        PoolingParams(dimensions=20).verify(64, [16, 32, 64])

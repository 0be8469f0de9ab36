"""The p2p connector's wire: length-prefixed msgpack messages and raw tensor frames over
TCP, and the compatibility check of the handshake.

Every message is a 4-byte big-endian length and a msgpack map with a "type". A consumer
opens with HELLO (its compatibility facts); the producer answers OK, or REFUSED naming
the first fact that differs. Then READ (request id, block ids) is answered by DATA (the
byte count) and that many bytes, [num_layers, num_blocks, *page] of the producer's
dtype, or by ERROR; DONE (request id) releases the producer's blocks; HEARTBEAT (request
ids) extends their leases.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgspec

_LENGTH = struct.Struct(">I")
MAX_MESSAGE = 1 << 20  # a header, never a payload: bounds what a bad peer makes us allocate

# What must match for a producer's blocks to be a consumer's, in the order checked.
COMPAT_FIELDS = (
    "core", "model", "dtype", "block_size", "tensor_parallel_size", "num_layers", "page_shape",
)  # fmt: skip


class WireError(ConnectionError):
    """The peer broke the protocol, refused us, or went away."""


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    body = msgspec.msgpack.encode(message)
    sock.sendall(_LENGTH.pack(len(body)) + body)


def recv_message(sock: socket.socket) -> dict[str, Any]:
    (length,) = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))
    if length > MAX_MESSAGE:
        raise WireError(f"a {length}-byte message header (at most {MAX_MESSAGE})")
    message = msgspec.msgpack.decode(recv_exact(sock, length))
    if not isinstance(message, dict) or "type" not in message:
        raise WireError(f"not a message: {message!r:.80}")
    return message


def recv_exact(sock: socket.socket, num_bytes: int) -> bytes:
    """Exactly `num_bytes`, or WireError when the peer closes first."""
    buffer = bytearray(num_bytes)
    recv_into(sock, memoryview(buffer))
    return bytes(buffer)


def recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` (of bytes) from `sock`, or WireError when the peer closes first."""
    received = 0
    while received < view.nbytes:
        count = sock.recv_into(view[received:])
        if count == 0:
            raise WireError(f"the peer closed after {received} of {view.nbytes} bytes")
        received += count


def expect(message: dict[str, Any], kind: str) -> dict[str, Any]:
    """`message` if it is of `kind`; WireError with the peer's reason otherwise."""
    if message["type"] != kind:
        raise WireError(f"expected {kind}, got {message['type']}: {message.get('reason', '')}")
    return message


def incompatibility(here: dict[str, Any], there: dict[str, Any]) -> str | None:
    """The first compatibility fact that differs, in words; None when all match."""
    for name in COMPAT_FIELDS:
        if here.get(name) != there.get(name):
            return f"{name}: {there.get(name)!r} at the consumer, {here.get(name)!r} here"
    return None

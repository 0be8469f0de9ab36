"""PoolingParams: the per-request knobs of an embedding request (vLLM's PoolingParams).

A msgspec Struct because it crosses the frontend -> engine-core socket inside an
EngineCoreRequest, as SamplingParams does; ``__post_init__`` runs on decode too, so a
malformed message fails with the same ValueError as a bad Python call. Checks that need
model facts (the embedding size, the Matryoshka sizes) live in ``verify``.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

__all__ = ["PoolingParams"]


class PoolingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How one request's pooled vector is finished.

    dimensions: keep only the first `dimensions` values (a Matryoshka embedding); when the
        vector is normalized, it is normalized after the cut, so it stays a unit vector.
    normalize: L2-normalize the vector; None: as the model's pooler config says (the
        checkpoint's sentence-transformers Normalize module, or `--pooler-config`).
    """

    dimensions: int | None = None
    normalize: bool | None = None

    def __post_init__(self) -> None:
        dims = self.dimensions
        if dims is not None and (isinstance(dims, bool) or dims < 1):
            raise ValueError(f"dimensions must be an integer >= 1, got {dims!r}")

    def verify(self, hidden_size: int, matryoshka_dimensions: Sequence[int] | None) -> None:
        """ValueError naming `dimensions` when the model cannot give that many values: more
        than its `hidden_size`, or a size its checkpoint does not list among its
        `matryoshka_dimensions` (when it lists them)."""
        dims = self.dimensions
        if dims is None:
            return
        if dims > hidden_size:
            raise ValueError(
                f"dimensions must be <= the model's embedding size {hidden_size}, got {dims}"
            )
        if matryoshka_dimensions and dims not in matryoshka_dimensions:
            raise ValueError(
                f"dimensions must be one of the model's matryoshka_dimensions "
                f"{list(matryoshka_dimensions)}, got {dims}"
            )

"""Pooling: embedding models (`--runner pooling`) — the per-request PoolingParams, the
Pooler interface (`interface`) and its reference (`pooler`), and how a checkpoint picks its
runner and pooling (`runner`, `st_config`).

Only PoolingParams is imported here: it rides in the scheduler <-> worker contract, which
stays light."""

from core.pooling.params import PoolingParams

__all__ = ["PoolingParams"]

"""Building --kv-transfer-config's connector: the `kv_connector` entry of the
`core.kv_connectors` group, constructed for one role."""

from __future__ import annotations

from core.config import EngineConfig
from core.kv_transfer.interface import KVConnector, KVConnectorRole
from core.plugins.groups import KV_CONNECTORS
from core.plugins.registry import PluginRegistry, get_registry


def build_kv_connector(
    config: EngineConfig, role: KVConnectorRole, registry: PluginRegistry | None = None
) -> KVConnector | None:
    """The configured connector in `role`; None without --kv-transfer-config's connector.
    PluginLookupError naming what is installed when the name is unknown."""
    name = config.kv_transfer.kv_connector
    if name is None:
        return None
    cls = (registry or get_registry()).require(KV_CONNECTORS, name, KVConnector)
    return cls(config, role)

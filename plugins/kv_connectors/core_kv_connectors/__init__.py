"""KV connectors for core (the `core.kv_connectors` entry-point group): `offload`, a prefix
cache tiered into host memory and disk. Kept import-light: core reads CORE_PLUGIN_API here."""

CORE_PLUGIN_API = ">=1.0,<2"

"""C++ CPU kernels for core. Kept import-light: core reads CORE_PLUGIN_API here."""

CORE_PLUGIN_API = ">=1.0,<2"

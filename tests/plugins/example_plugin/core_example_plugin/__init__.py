"""An example third-party plugin for core: a paged attention backend and a platform.

It lives outside core (its own distribution, `core-example-plugin`), uses only core's
public interfaces, and passes core's conformance kit:

    pytest --core-conformance=attention:example_paged
    CORE_EXAMPLE_PLATFORM=1 pytest --core-conformance=platform:example

Kept import-light: core reads CORE_PLUGIN_API here before loading any entry point.
"""

CORE_PLUGIN_API = ">=1.0,<2"

"""The probe of the example platform: cheap, and imports nothing but the standard library
and `core.platforms.Unavailable`.

The example platform runs on the host CPU, so it could always be available; it claims
to be only when CORE_EXAMPLE_PLATFORM=1, so that installing the example never changes
which platform core selects.
"""

from __future__ import annotations

import os

from core.platforms import Unavailable

ENV_VAR = "CORE_EXAMPLE_PLATFORM"


def probe() -> str:
    if os.environ.get(ENV_VAR) != "1":
        raise Unavailable(f"set {ENV_VAR}=1 to use the example platform")
    return "core_example_plugin.platform.ExamplePlatform"

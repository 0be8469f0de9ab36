"""A platform fills its defaults in apply_config_defaults and refuses in check_config; the
method they replaced (check_and_update_config) is refused where a subclass defines it, so
a platform written for it never runs with its checks silently skipped."""

from __future__ import annotations

import pytest

from core.platforms.cpu import CpuPlatform


def test_a_platform_overriding_the_removed_method_is_refused_naming_the_new_ones():
    with pytest.raises(TypeError, match="apply_config_defaults.*check_config"):

        class OldStylePlatform(CpuPlatform):  # noqa: F841
            def check_and_update_config(self, config) -> None:
                pass


def test_a_platform_overriding_the_new_methods_is_accepted():
    class NewStylePlatform(CpuPlatform):
        def apply_config_defaults(self, config) -> None:
            super().apply_config_defaults(config)

    assert issubclass(NewStylePlatform, CpuPlatform)

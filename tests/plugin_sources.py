"""Sources of the throw-away plugin distributions the plugin tests install."""

API = 'CORE_PLUGIN_API = ">=1.0,<2"\n'


def platform_plugin(package: str, class_name: str, probe_body: str) -> dict[str, str]:
    """Modules of a platform plugin whose probe runs `probe_body`."""
    return {
        f"{package}/__init__.py": API,
        f"{package}/probe.py": (
            f"from core.platforms import Unavailable\n\ndef probe():\n    {probe_body}\n"
        ),
        f"{package}/platform.py": f"""
            import torch
            from core.platforms import MemoryInfo, Platform

            class {class_name}(Platform):
                name = "{package}"
                device_type = "cpu"
                device_name = "{class_name} device"
                dist_backend = "gloo"
                supported_dtypes = (torch.float32,)
                preferred_attention_backends = ("torch_ref",)

                def memory_info(self):
                    return MemoryInfo(8 << 30, 4 << 30)

                def set_device(self, device):
                    pass
        """,
    }


def available_platform(package: str, class_name: str) -> dict[str, str]:
    return platform_plugin(package, class_name, f'return "{package}.platform.{class_name}"')

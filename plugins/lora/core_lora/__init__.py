"""Multi-LoRA serving for core: many PEFT adapters on one base model.

Registers `default` in `core.lora` (core_lora.manager.LoRAModelManager): adapters read
from PEFT directories (core_lora.adapter), kept in host and slot LRU caches, and applied
per token row by a wrapper around each linear layer's method (core_lora.layer).
"""

CORE_PLUGIN_API = ">=1.0,<2"

"""VisionLanguageModel: a vision encoder whose outputs a core decoder reads as token
embeddings, the frame LLaVA and Qwen2-VL share.

The decoder is one of core's Llama-family classes, built from the checkpoint's text config
(`ArchConfig` reads it from `text_config`): the model classes add the vision modules, the
forward on merged embeddings, and the loading of checkpoints whose tensor names nest the
decoder's under a prefix that changed across transformers versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

import torch
from torch import nn

from core.models.arch_config import ArchConfig
from core.models.hf_weights import load_hf_weights
from core.models.llama import LlamaForCausalLM
from core.models.multimodal import SupportsMultiModal
from core.models.pipeline import IntermediateTensors

_DECODER = "language_model."


class VisionModules(nn.ModuleDict):
    """A vision-language model's vision modules by name, loaded together (the decoder
    loads its own tensors)."""


class VisionLanguageModel(SupportsMultiModal, nn.Module):
    """The decoder interface (LlamaForCausalLM's docstring) around `language_model`, plus
    SupportsMultiModal's `embed_input_ids`.

    A subclass builds its vision modules, lists their attribute names in `vision_modules`,
    and gives `weight_renames`: (checkpoint prefix, model prefix) pairs, the first match
    applied, that bring every spelling of its checkpoints' names to the model's own
    ("language_model.model.layers...", "language_model.lm_head.weight", the vision
    modules' names). It may skip checkpoint tensors it does not use
    (`_skips_vision_weight`).
    """

    vision_modules: ClassVar[tuple[str, ...]]
    weight_renames: ClassVar[tuple[tuple[str, str], ...]]

    def __init__(self, config: ArchConfig, language_model: LlamaForCausalLM) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.language_model = language_model

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        return self.language_model.model.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T], or [3, T] under M-RoPE
        num_layers: int | None = None,
        intermediate_tensors: IntermediateTensors | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,  # [T, hidden]
    ) -> torch.Tensor | IntermediateTensors:
        return self.language_model(
            input_ids, positions, num_layers, intermediate_tensors, inputs_embeds=inputs_embeds
        )

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return self.language_model.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load transformers-named tensors, any of the spellings `weight_renames` knows;
        ValueError naming missing or unexpected ones (decoder and vision separately).

        The decoder's tensors stream into it; the vision ones, a small share of a
        checkpoint, are kept until the stream ends and then loaded.
        """
        vision: list[tuple[str, torch.Tensor]] = []

        def decoder_weights() -> Iterator[tuple[str, torch.Tensor]]:
            for hf_name, tensor in weights:
                name = self._model_name(hf_name)
                if name.startswith(_DECODER):
                    yield name.removeprefix(_DECODER), tensor
                else:
                    vision.append((name, tensor))

        self.language_model.load_weights(decoder_weights())
        modules = VisionModules({name: getattr(self, name) for name in self.vision_modules})
        load_hf_weights(modules, vision, (), self._skips_vision_weight)

    def _model_name(self, hf_name: str) -> str:
        for checkpoint_prefix, model_prefix in self.weight_renames:
            if hf_name.startswith(checkpoint_prefix):
                return model_prefix + hf_name.removeprefix(checkpoint_prefix)
        return hf_name

    def _skips_vision_weight(self, name: str) -> bool:
        """Whether the checkpoint's vision tensor `name` (the model's spelling) is unused."""
        return False

    def _vision_input(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` (an item's pixels, as the processor made them) on the vision modules'
        device, in their dtype."""
        weight = next(getattr(self, self.vision_modules[0]).parameters())
        return tensor.to(device=weight.device, dtype=weight.dtype)

"""IO processors: a request's raw data turned into prompts, and outputs into an answer
(see `interface`). Plugins register theirs in the `core.io_processors` entry-point group,
as core registers its reference (`passthrough`); `selector` finds the one a model asks for.
"""

from core.io_processors.interface import (
    EngineOutput,
    IOProcessor,
    Params,
    ProcessorPrompt,
    PromptDict,
)
from core.io_processors.prompts import PromptParts, prompt_parts
from core.io_processors.selector import (
    io_processor_class,
    load_io_processor,
    require_io_processor,
)

__all__ = [
    "EngineOutput",
    "IOProcessor",
    "Params",
    "ProcessorPrompt",
    "PromptDict",
    "PromptParts",
    "io_processor_class",
    "load_io_processor",
    "prompt_parts",
    "require_io_processor",
]

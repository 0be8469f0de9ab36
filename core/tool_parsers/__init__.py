"""Tool parsers: reading OpenAI tool calls out of generated text (see `interface`).

Core's own parsers (`hermes`, `llama3_json`, `mistral`, `pythonic`) are entry points of the
`core` distribution in the `core.tool_parsers` group, like a plugin's would be.
"""

from core.tool_parsers.incremental import IncrementalToolParser, ParsedCall, ParsedOutput
from core.tool_parsers.interface import (
    ExtractedToolCalls,
    FunctionTool,
    StreamedDelta,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    ToolRequest,
    new_tool_call_id,
)
from core.tool_parsers.selector import tool_parser_class

__all__ = [
    "ExtractedToolCalls",
    "FunctionTool",
    "IncrementalToolParser",
    "ParsedCall",
    "ParsedOutput",
    "StreamedDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "ToolRequest",
    "new_tool_call_id",
    "tool_parser_class",
]

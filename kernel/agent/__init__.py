"""The durable agent loop on the kernel: submissions, model turns, tool calls.

Framework-free like the rest of the kernel. ``register_agent`` adds its task kinds
to a Registry; ``submit`` accepts input for a conversation.
"""

from .compaction import COMPACTION, Compaction
from .models import (
    MODEL_OPTIONS,
    ContextOverflowError,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    Pending,
    PermanentModelError,
    ScriptedProvider,
    ToolCall,
    TransientModelError,
    check_options,
)
from .submissions import MAX_TEXT, Submitted, WhenBusy, submit
from .tools import Gate, Replay, Tool, Toolbox, digest
from .turn import register_agent

__all__ = [
    "COMPACTION",
    "MAX_TEXT",
    "MODEL_OPTIONS",
    "Compaction",
    "ContextOverflowError",
    "Gate",
    "ModelProvider",
    "ModelRequest",
    "ModelResponse",
    "Pending",
    "PermanentModelError",
    "Replay",
    "ScriptedProvider",
    "Submitted",
    "Tool",
    "ToolCall",
    "Toolbox",
    "TransientModelError",
    "WhenBusy",
    "check_options",
    "digest",
    "register_agent",
    "submit",
]

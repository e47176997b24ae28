"""Pydantic AI agents, durable on the kernel, unchanged but for one capability.

```python
from kernel.hosts.pydantic_ai import SAFE, KernelDurability

agent = Agent(model, name="support", output_type=Ticket, capabilities=[KernelDurability()])

@agent.tool_plain(metadata=SAFE)  # may run again after a crash; unsafe is the default
def lookup(customer: str) -> str: ...

@agent.tool_plain(metadata=hands(SAFE))  # a task of its own on the hands queue
def fetch(url: str) -> str: ...
```

and register it (``KERNEL_AGENTS={"support": "myapp.agents.agent"}`` in the control
plane, or :func:`register_agent` on a Registry): a submission naming ``"agent":
"support"`` runs it as a task, every model request and tool call a durable unit.
This package is the only part of the kernel that imports Pydantic AI.
"""

from .capability import (
    HANDS,
    SAFE,
    UNSAFE,
    KernelDurability,
    hands,
    operation_id,
    save_partial,
)
from .definition import DECISIONS, HISTORY, HostedAgent, register_agent

__all__ = [
    "DECISIONS",
    "HANDS",
    "HISTORY",
    "SAFE",
    "UNSAFE",
    "HostedAgent",
    "KernelDurability",
    "hands",
    "operation_id",
    "register_agent",
    "save_partial",
]

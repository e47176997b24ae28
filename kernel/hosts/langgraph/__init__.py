"""Hosting LangGraph graphs on the kernel.

:class:`SessionStoreSaver` is a LangGraph checkpoint saver whose checkpoints are commits
in the thread's session. The saver, the host and the retention policies load LangGraph
when first used; :mod:`.layout` and :mod:`.interrupts` (what the dashboard and the API
read about a thread) do not, so a process that only reads threads never loads it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .layout import register_documents
    from .retention import KeepLatest, KeepSince, Policy
    from .saver import SessionStoreSaver

__all__ = ["KeepLatest", "KeepSince", "Policy", "SessionStoreSaver", "register_documents"]
_HOMES = {"KeepLatest": "retention", "KeepSince": "retention", "Policy": "retention",
          "SessionStoreSaver": "saver", "register_documents": "layout"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)

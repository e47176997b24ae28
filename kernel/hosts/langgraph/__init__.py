"""Hosting LangGraph graphs on the kernel.

:class:`SessionStoreSaver` is a LangGraph checkpoint saver whose checkpoints are commits
in the thread's session. Importing this package imports LangGraph.
"""

from .layout import register_documents
from .retention import KeepLatest, KeepSince, Policy
from .saver import SessionStoreSaver

__all__ = ["KeepLatest", "KeepSince", "Policy", "SessionStoreSaver", "register_documents"]

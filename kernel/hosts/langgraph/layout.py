"""Where a LangGraph thread lives in the Session Store: documents, by kind and key.

A thread is a session (its id is the thread id). In it:

- ``langgraph.checkpoint`` / ``<ns>/<checkpoint id>``: one checkpoint, self-contained:
  the checkpoint without its values, every channel value it holds (serialized by the
  saver's serde), its metadata, its parent's id, and the pending writes saved against
  it (``writes``, keyed ``<task id>/<idx>``, so that saving them twice changes nothing);
- ``langgraph.index`` / ``""``: every live checkpoint of the thread by namespace, with
  its parent, metadata and the channels it stores (what listing, filtering and pruning
  read without opening each checkpoint). The newest checkpoint of a namespace is the
  checkpoint document with the greatest key (``Kernel.newest_document``), else the
  index's greatest id: a ``put`` writes two documents, the checkpoint and the index.

The directory session (:data:`DIRECTORY`) knows the threads and which threads each run
wrote to (``langgraph.threads`` / ``all`` and ``langgraph.runs`` / ``<run id>``), for what
LangGraph asks across threads (``list(None)``, ``delete_for_runs``).

A removed checkpoint's document is emptied by a commit (``{}``), and the session's
history is then trimmed up to that commit (``Kernel.trim``): the emptied documents, the
commit rows and the superseded document versions before it go, so a live thread's
storage stays within what its kept checkpoints hold plus what came since.
"""

from __future__ import annotations

from kernel.registry import Registry

NODE = "node "
"""How a run's environment names a node of its graph (``node <name>``)."""
CHANNEL = "channel "
"""How a run's environment names a channel of its graph's state (``channel <name>``)."""
CHECKPOINT = "langgraph.checkpoint"
INDEX = "langgraph.index"
THREADS = "langgraph.threads"
RUNS = "langgraph.runs"
KINDS = (CHECKPOINT, INDEX, THREADS, RUNS)

HOST = "langgraph"
"""What the task definitions of graph runs name as their host
(:attr:`kernel.registry.TaskDefinition.host`)."""

FORKS = "forks"
STARTS = "starts"
"""Where the thread's index names the run an operator last forked, and the one last
started or retried: the control plane writes each at the version of the index the
operator saw, so that two runs never go on from the thread's newest checkpoint at once."""

DIRECTORY = "langgraph"
"""The session holding the directory of threads and runs."""
INDEX_KEY = ""
THREADS_KEY = "all"


def checkpoint_key(ns: str, checkpoint_id: str) -> str:
    return f"{ns}/{checkpoint_id}"


def register_documents(registry: Registry) -> None:
    """Register the document kinds the saver writes (idempotent)."""
    for kind in KINDS:
        registry.document(kind)

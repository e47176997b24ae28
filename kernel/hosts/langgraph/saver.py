"""A LangGraph checkpoint saver on the Session Store (``BaseCheckpointSaver``).

Every write is a kernel commit in the thread's session (:mod:`.layout` says which
documents), so a thread's checkpoints are commits in its session's log: the change feed,
the dashboard and retention see them like any other commit. While a hosted run is bound
(:meth:`SessionStoreSaver.committing_through`), a write for that run's thread is
committed through the run's lease instead: fenced by its epoch, with the task's own
progress in the same commit.

Storage work runs on one thread of the saver's own, for the sync and the async API
alike: LangGraph saves from short-lived threads of its own, and a storage connection
belongs to the thread that opened it.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from dataclasses import dataclass, field
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from kernel.commit import Draft
from kernel.errors import (
    CommitUncertain,
    DocumentConflict,
    SessionPoisoned,
    StorageUnavailable,
    UnknownRecord,
)
from kernel.run import Run
from kernel.session import Kernel, SessionHandle, check_session_id
from kernel.values import dumps

from .layout import (
    CHECKPOINT,
    DIRECTORY,
    INDEX,
    INDEX_KEY,
    RUNS,
    THREADS,
    THREADS_KEY,
    checkpoint_key,
    register_documents,
)
from .retention import KeepLatest, Policy, retained

JSON = Any
T = TypeVar("T")
ACTOR = "langgraph"
_json_text = dumps()  # json.dumps, without a JSONEncoder built per call
REMOVE_ATTEMPTS = 10
"""How often a removal is worked out again while other savers keep changing the thread."""


def _check_thread_id(thread_id: str) -> None:
    """A thread is a session of the Session Store, named by the thread's id: an empty id,
    or one holding ``/``, would make a session no page or API path can name, so it is
    refused before anything is written (LangGraph's own savers take them; an empty one is
    mostly an id left unset)."""
    if not thread_id:
        raise ValueError("thread_id: an empty thread id names no session here; give the "
                         "thread a name")
    check_session_id(thread_id, "thread_id")


def _check_checkpoint_id(checkpoint_id: str) -> None:
    """A checkpoint's document is keyed ``<ns>/<id>``: an id holding ``/`` could name
    another namespace's checkpoint (``a`` + ``b/c`` and ``a/b`` + ``c``), so it is refused
    before anything is written. LangGraph makes its ids without one."""
    if "/" in checkpoint_id:
        raise ValueError(f"checkpoint id {checkpoint_id!r}: holds '/', which this saver "
                         "keeps namespaces apart with")


@dataclass
class Binding:
    """A hosted run whose thread's writes commit through its lease."""

    run: Run
    thread_id: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    progress: Callable[[str, JSON], JSON] | None = None
    """``progress(checkpoint_id, metadata)``: the task checkpoint to commit with a
    root checkpoint (None: ``{"langgraph": {"checkpoint_id": ..., "step": ...}}``)."""


_BOUND: ContextVar[Binding | None] = ContextVar("langgraph_saver_binding", default=None)


class SessionStoreSaver(BaseCheckpointSaver[int]):
    """Checkpoints, pending writes and channel values as documents of the thread's session."""

    def __init__(self, kernel: Kernel, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self.kernel = kernel
        register_documents(kernel.registry)
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="langgraph-saver")
        self._io_thread: int | None = None
        self._handles: dict[str, SessionHandle] = {}
        self._known_threads: set[str] = set()
        self._known_runs: set[tuple[str, str]] = set()

    # -- plumbing ------------------------------------------------------------

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if threading.get_ident() == self._io_thread:
            return fn(*args)
        context = copy_context()  # the binding of a hosted run travels with the call
        return self._io.submit(context.run, self._on_io, fn, *args).result()

    async def _acall(self, fn: Callable[..., T], *args: Any) -> T:
        import asyncio

        context = copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, context.run, self._on_io, fn, *args)

    def _on_io(self, fn: Callable[..., T], *args: Any) -> T:
        self._io_thread = threading.get_ident()
        try:
            return fn(*args)
        except (StorageUnavailable, CommitUncertain, SessionPoisoned):
            # The thread's connection may be dead (a restarted Postgres, a dropped
            # socket), and nothing else on this thread ever replaces it: let it go, so
            # that the next call opens a new one instead of failing like this one.
            self.kernel.storage.thread_exit()
            raise

    def close(self) -> None:
        """Release the saver's thread and its storage connection."""

        def end() -> None:
            self.kernel.storage.thread_exit()

        self._io.submit(end).result()
        self._io.shutdown(wait=True)

    @contextmanager
    def committing_through(
        self, run: Run, thread_id: str | None = None,
        progress: Callable[[str, JSON], JSON] | None = None,
    ) -> Iterator[None]:
        """While inside, writes for ``thread_id`` (default: the run's session) commit
        through ``run``'s lease: each root checkpoint with the task's progress."""
        token = _BOUND.set(Binding(run, thread_id or run.session_id, progress=progress))
        try:
            yield
        finally:
            _BOUND.reset(token)

    def _blob(self, value: Any) -> list[str]:
        kind, data = self.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode("ascii")]

    def _unblob(self, blob: list[str]) -> Any:
        return self.serde.loads_typed((blob[0], base64.b64decode(blob[1])))

    def _handle(self, thread_id: str, create: bool) -> SessionHandle | None:
        handle = self._handles.get(thread_id)
        if handle is not None and not handle.poisoned:
            return handle
        try:
            handle = self.kernel.open(thread_id)
        except UnknownRecord:
            if not create:
                return None
            _check_thread_id(thread_id)
            try:
                handle = self.kernel.create_session(thread_id, {"langgraph_thread": thread_id})
            except Exception:  # another process created it meanwhile
                handle = self.kernel.open(thread_id)
        self._handles[thread_id] = handle
        return handle

    def _commit(self, thread_id: str, draft: Draft, progress: JSON = None) -> int:
        """Commit ``draft`` to the thread's session; its seq (or a later one)."""
        bound = _BOUND.get()
        if bound is not None and bound.thread_id == thread_id:
            with bound.lock:
                for (kind, key), ops in draft.document_ops.items():
                    bound.run.update(kind, key, *ops)
                bound.run.commit(checkpoint=progress)
            session = self.kernel.storage.session(thread_id)
            assert session is not None
            return session.head_seq
        handle = self._handle(thread_id, create=True)
        assert handle is not None
        return handle.commit(draft).commit.seq

    def _register_thread(self, thread_id: str, run_id: str | None) -> None:
        """Record the thread (and the run that writes it) in the directory, before the
        thread's own commit: a crash between the two leaves a directory entry pointing
        at nothing, which every reader of the directory tolerates."""
        _check_thread_id(thread_id)
        new_thread = thread_id not in self._known_threads
        new_run = run_id is not None and (run_id, thread_id) not in self._known_runs
        if not (new_thread or new_run):
            return  # every put after a thread's first: no draft to build
        draft = Draft(actor=ACTOR)
        if new_thread:
            draft.set(THREADS, THREADS_KEY, ["threads", thread_id], True)
        if new_run:
            draft.set(RUNS, str(run_id), ["threads", thread_id], True)
        handle = self._handle(DIRECTORY, create=True)
        assert handle is not None
        handle.commit(draft)
        self._known_threads.add(thread_id)
        if run_id is not None:
            self._known_runs.add((run_id, thread_id))

    def _document(self, session_id: str, kind: str, key: str) -> JSON:
        value = self.kernel.document(session_id, kind, key)
        return value if isinstance(value, dict) else {}

    # -- writes --------------------------------------------------------------

    def _put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        parent = conf.get("checkpoint_id")
        # As JSON reads it back (tuples become lists), whichever storage holds it.
        stored_metadata = json.loads(_json_text(
            get_serializable_checkpoint_metadata(config, metadata)))
        run_id = stored_metadata.get("run_id")
        _check_checkpoint_id(checkpoint["id"])
        self._register_thread(thread_id, str(run_id) if run_id is not None else None)
        document = self._checkpoint_document(checkpoint, stored_metadata, parent)
        draft = Draft(actor=ACTOR)
        key = checkpoint_key(ns, checkpoint["id"])
        # Field by field: LangGraph may save a step's writes against this checkpoint
        # before the checkpoint itself (its saves run in the background), and they stay.
        for name in ("checkpoint", "values", "metadata", "parent"):
            draft.set(CHECKPOINT, key, [name], document[name])
        draft.set(INDEX, INDEX_KEY, ["namespaces", ns, checkpoint["id"]],
                  self._index_entry(document))
        progress = None
        bound = _BOUND.get()
        if bound is not None and ns == "":
            progress = (
                bound.progress(checkpoint["id"], stored_metadata) if bound.progress
                else {"langgraph": {"checkpoint_id": checkpoint["id"],
                                    "step": stored_metadata.get("step")}}
            )
        self._commit(thread_id, draft, progress)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint["id"]}}

    def _checkpoint_document(
        self, checkpoint: Checkpoint, metadata: JSON, parent: str | None
    ) -> JSON:
        shape = {k: v for k, v in checkpoint.items() if k not in ("channel_values",
                                                                 "pending_sends")}
        if checkpoint.get("pending_sends"):
            shape["pending_sends"] = self._blob(checkpoint.get("pending_sends"))
        return {
            "checkpoint": shape,
            "values": {ch: self._blob(v) for ch, v in checkpoint["channel_values"].items()},
            "metadata": metadata,
            "parent": parent,
            "writes": {},
        }

    @staticmethod
    def _index_entry(document: JSON) -> JSON:
        return {"parent": document["parent"], "metadata": document["metadata"],
                "values": sorted(document["values"]), "ts": document["checkpoint"].get("ts")}

    def _put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
        task_path: str,
    ) -> None:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        key = checkpoint_key(conf.get("checkpoint_ns", ""), conf["checkpoint_id"])
        draft = Draft(actor=ACTOR)
        for idx, (channel, value) in enumerate(writes):
            position = WRITES_IDX_MAP.get(channel, idx)
            # A task's step retried after some of its writes were saved keeps the first
            # of a channel's writes, and the last of a special one (an error, an
            # interrupt), as LangGraph's own savers keep them.
            draft.update_document(CHECKPOINT, key, {
                "op": "setdefault" if position >= 0 else "set",
                "path": ["writes", f"{task_id}/{position}"],
                "value": [task_id, channel, *self._blob(value), task_path, position]})
        if draft.document_ops:
            self._commit(thread_id, draft)

    # -- reads ---------------------------------------------------------------

    def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        # An empty id addresses no checkpoint, as LangGraph (and its savers) read it: the
        # newest is wanted.
        checkpoint_id = get_checkpoint_id(config) or None
        if checkpoint_id is None:
            # The newest checkpoint is the one with the greatest id (LangGraph's ids grow
            # with time; LangGraph's own savers read it so), in one read. A newest document
            # with no checkpoint (writes saved against a checkpoint already removed) sends
            # the read to the index, which holds every live checkpoint.
            # Keys of a namespace named ``<ns>/...`` start with ``<ns>/`` too (for the
            # root namespace, any namespace named ``/...``): a newest document whose key
            # is not its checkpoint's key in ``ns`` is such a namespace's, and the read
            # goes to the index.
            newest = self.kernel.newest_document(thread_id, CHECKPOINT, checkpoint_key(ns, ""))
            if (newest is not None and "checkpoint" in newest[1]
                    and newest[0] == checkpoint_key(ns, newest[1]["checkpoint"]["id"])):
                return self._tuple(thread_id, ns, newest[1])
            live = self._document(thread_id, INDEX, INDEX_KEY).get("namespaces", {}).get(ns)
            if not live:
                return None
            checkpoint_id = max(live)
        return self._load(thread_id, ns, checkpoint_id)

    def _load(self, thread_id: str, ns: str, checkpoint_id: str) -> CheckpointTuple | None:
        document = self._document(
            thread_id, CHECKPOINT, checkpoint_key(ns, checkpoint_id)
        )
        # An id holding ``/`` addresses another namespace's key (``_check_checkpoint_id``).
        if document.get("checkpoint", {}).get("id") != checkpoint_id:
            return None
        return self._tuple(thread_id, ns, document)

    def _tuple(self, thread_id: str, ns: str, document: JSON) -> CheckpointTuple:
        shape = dict(document["checkpoint"])
        if "pending_sends" in shape:
            shape["pending_sends"] = self._unblob(shape["pending_sends"])
        shape["channel_values"] = {
            ch: self._unblob(blob) for ch, blob in document["values"].items()
        }
        writes = sorted(document.get("writes", {}).values(),
                        key=lambda w: writes_sort_key(w[4], w[0], w[5]))
        parent = document.get("parent")
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                     "checkpoint_id": shape["id"]}},
            checkpoint=shape,  # type: ignore[arg-type]
            metadata=document["metadata"],
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                  "checkpoint_id": parent}}
                if parent else None
            ),
            pending_writes=[(w[0], w[1], self._unblob([w[2], w[3]])) for w in writes],
        )

    def _threads(self) -> list[str]:
        found = self._document(DIRECTORY, THREADS, THREADS_KEY)
        return sorted(found.get("threads", {}))

    def _list(
        self, config: RunnableConfig | None, filter: dict[str, Any] | None,
        before: RunnableConfig | None, limit: int | None,
    ) -> list[CheckpointTuple]:
        conf = (config or {}).get("configurable", {})
        threads = [str(conf["thread_id"])] if conf.get("thread_id") is not None else (
            self._threads()
        )
        wanted_ns = conf.get("checkpoint_ns")
        wanted_id = conf.get("checkpoint_id") or None  # "": none, as in get_tuple
        before_id = get_checkpoint_id(before) if before else None
        found: list[tuple[str, str, str]] = []
        for thread_id in threads:
            index = self._document(thread_id, INDEX, INDEX_KEY)
            for ns, checkpoints in index.get("namespaces", {}).items():
                if wanted_ns is not None and ns != wanted_ns:
                    continue
                for checkpoint_id, entry in checkpoints.items():
                    if wanted_id is not None and checkpoint_id != wanted_id:
                        continue
                    if before_id is not None and checkpoint_id >= before_id:
                        continue
                    if filter and any(entry["metadata"].get(k) != v
                                      for k, v in filter.items()):
                        continue
                    found.append((checkpoint_id, thread_id, ns))
        found.sort(reverse=True)
        if limit is not None:
            found = found[:limit]
        tuples = []
        for checkpoint_id, thread_id, ns in found:
            loaded = self._load(thread_id, ns, checkpoint_id)
            if loaded is not None:
                tuples.append(loaded)
        return tuples

    # -- removal and copies ------------------------------------------------------

    def _remove(
        self, thread_id: str, keep: Callable[[JSON], dict[str, set[str]]] | None
    ) -> None:
        """Empty the documents of every checkpoint of ``thread_id`` not in ``keep`` (what
        to keep by namespace, from the index's namespaces; None: keep none), in one commit
        of the thread's session, then trim the session's history up to that commit: the
        emptied documents go whole, and so do the commit rows and superseded document
        versions before it.

        The commit expects the index at the version read: a checkpoint put meanwhile by
        another saver is not in what was read, so it would lose its index entry and keep
        its document, read as the thread's newest yet beyond any later removal. On a
        conflict the removal is worked out again from the index as it is then."""
        if self._handle(thread_id, create=False) is None:
            return
        for _ in range(REMOVE_ATTEMPTS):
            index, version = self.kernel.versioned_document(thread_id, INDEX, INDEX_KEY)
            namespaces = index.get("namespaces", {}) if isinstance(index, dict) else {}
            kept_by_ns = keep(namespaces) if keep is not None else {}
            draft = Draft(actor=ACTOR)
            for ns, checkpoints in namespaces.items():
                kept = kept_by_ns.get(ns, set())
                for checkpoint_id in checkpoints:
                    if checkpoint_id in kept:
                        continue
                    draft.set(CHECKPOINT, checkpoint_key(ns, checkpoint_id), [], {})
                    draft.update_document(
                        INDEX, INDEX_KEY,
                        {"op": "remove", "path": ["namespaces", ns, checkpoint_id]},
                        expected_version=version)
                if not kept:
                    draft.update_document(INDEX, INDEX_KEY,
                                          {"op": "remove", "path": ["namespaces", ns]},
                                          expected_version=version)
            if not draft.document_ops:
                return
            try:
                seq = self._commit(thread_id, draft)
            except DocumentConflict:
                continue
            # What the removed checkpoints were is history now: it goes at once, with the
            # commits that wrote it (those with an idempotency key stay: kernel.retention).
            self.kernel.trim(thread_id, seq, forget=(CHECKPOINT,))
            return
        raise DocumentConflict(
            f"thread {thread_id}: its checkpoints kept changing during "
            f"{REMOVE_ATTEMPTS} attempts to remove them")

    def _delete_thread(self, thread_id: str) -> None:
        self._remove(str(thread_id), None)

    def _delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = {str(r) for r in run_ids}
        threads: set[str] = set()
        for run_id in runs:
            found = self._document(DIRECTORY, RUNS, run_id)
            threads.update(found.get("threads", {}))

        def keep(namespaces: JSON) -> dict[str, set[str]]:
            return {
                ns: {cid for cid, entry in checkpoints.items()
                     if str(entry["metadata"].get("run_id")) not in runs}
                for ns, checkpoints in namespaces.items()
            }

        for thread_id in sorted(threads):
            self._remove(thread_id, keep)

    def _copy_thread(self, source: str, target: str) -> None:
        source, target = str(source), str(target)
        index = self._document(source, INDEX, INDEX_KEY)
        namespaces = index.get("namespaces", {})
        if not namespaces:
            return
        runs = {str(e["metadata"]["run_id"]) for cps in namespaces.values() for e in cps.values()
                if e["metadata"].get("run_id") is not None}
        self._register_thread(target, None)
        for run_id in sorted(runs):
            self._register_thread(target, run_id)
        draft = Draft(actor=ACTOR)
        for ns, checkpoints in namespaces.items():
            for checkpoint_id in sorted(checkpoints):
                key = checkpoint_key(ns, checkpoint_id)
                document = self._document(source, CHECKPOINT, key)
                if "checkpoint" not in document:
                    continue
                draft.set(CHECKPOINT, key, [], document)
                draft.set(INDEX, INDEX_KEY, ["namespaces", ns, checkpoint_id],
                          self._index_entry(document))
        self._commit(target, draft)

    def _prune(self, thread_ids: Sequence[str], policy: Policy) -> None:
        for thread_id in thread_ids:
            self._remove(str(thread_id), lambda namespaces: retained(namespaces, policy))

    # -- BaseCheckpointSaver: sync -------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._call(self._get_tuple, config)

    def list(
        self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None, limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        yield from self._call(self._list, config, filter, before, limit)

    def put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._call(self._put, config, checkpoint, metadata, new_versions)

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
        task_path: str = "",
    ) -> None:
        self._call(self._put_writes, config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        self._call(self._delete_thread, thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._call(self._delete_for_runs, run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._call(self._copy_thread, source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._call(self._prune, thread_ids, policy_for(strategy))

    def prune_by(self, thread_ids: Sequence[str], policy: Policy) -> None:
        """Prune by a :mod:`.retention` policy (keep the latest N, by age, ...)."""
        self._call(self._prune, thread_ids, policy)

    # -- BaseCheckpointSaver: async ------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._acall(self._get_tuple, config)

    async def alist(
        self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None, limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in await self._acall(self._list, config, filter, before, limit):
            yield found

    async def aput(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._acall(self._put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
        task_path: str = "",
    ) -> None:
        await self._acall(self._put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._acall(self._delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._acall(self._delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._acall(self._copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._acall(self._prune, thread_ids, policy_for(strategy))


def policy_for(strategy: str) -> Policy:
    """LangGraph's prune strategies as policies: ``keep_latest`` keeps the newest
    checkpoint of each namespace (and what it needs), ``delete`` keeps nothing."""
    if strategy == "keep_latest":
        return KeepLatest(1)
    if strategy == "delete":
        return KeepLatest(0)
    raise ValueError(f"prune strategy: 'keep_latest' or 'delete', not {strategy!r}")

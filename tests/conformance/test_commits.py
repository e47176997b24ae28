"""Commit protocol invariants (DESIGN §4: 1, 2, 4, 6), run against both storages."""

from __future__ import annotations

import threading

import pytest

from kernel import (
    CommitRejected,
    DocumentConflict,
    Draft,
    DuplicateCommit,
    Registry,
    ReservedConversation,
    Run,
    SessionPoisoned,
    Status,
    SubmissionStatus,
    Transition,
    UnknownRecord,
    UnstorableValue,
    Worker,
)
from kernel.commit import operations_log_id
from kernel.records import WriteSet
from kernel.values import NAME_BYTES
from tests.unit.crashes import Crash

from .definitions import Effects, make_registry
from .names import incompressible
from .world import World


def setup(world: World):
    registry = make_registry(Effects())
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    conversation = draft.create_conversation()
    handle.commit(draft)
    return kernel, handle, conversation


def full_draft(conversation: str) -> Draft:
    draft = Draft(actor="user:ann")
    draft.append(conversation, "user", {"text": "hello"})
    draft.set("plan", "p", ["status"], "drafted")
    draft.create_task("step", {"name": "s"})
    return draft


# -- invariant 1: atomic, one total order per session --------------------------------


def test_a_rejected_draft_writes_nothing(world: World) -> None:
    kernel, handle, conversation = setup(world)
    draft = full_draft(conversation)
    draft.update_document("plan", "p", {"op": "set", "path": ["x"], "value": 1}, expected_version=7)
    with pytest.raises(DocumentConflict):
        handle.commit(draft)
    assert world.storage.session(handle.id).head_seq == 1
    assert kernel.entries(conversation) == []
    assert world.storage.session_tasks(handle.id) == []
    assert kernel.document_version(handle.id, "plan", "p") == 0
    assert [c.seq for c in kernel.commits_after(handle.id, 0)] == [1]


def test_a_failure_before_the_commit_lands_rolls_back_and_the_handle_stays_usable(
    world: World,
) -> None:
    kernel, handle, conversation = setup(world)
    world.faults.armed["after_write"] = RuntimeError("disk full")
    with pytest.raises(RuntimeError, match="disk full"):
        handle.commit(full_draft(conversation))
    assert not handle.poisoned
    assert world.storage.session_tasks(handle.id) == []
    assert kernel.entries(conversation) == []
    written = handle.commit(full_draft(conversation))
    assert written.commit.seq == 2
    assert len(kernel.entries(conversation)) == 1


def test_a_commit_writes_every_record_together(world: World) -> None:
    kernel, handle, conversation = setup(world)
    written = handle.commit(full_draft(conversation))
    assert written.commit.seq == 2
    assert [e.payload for e in kernel.entries(conversation)] == [{"text": "hello"}]
    assert kernel.document(handle.id, "plan", "p") == {"status": "drafted"}
    [task] = world.storage.session_tasks(handle.id)
    assert (task.kind, task.status, task.phase, task.created_seq) == ("step", "pending", "start", 2)
    [feed_row] = kernel.commits_after(handle.id, 1)
    assert feed_row.actor == "user:ann"
    kinds = {item["type"] for item in feed_row.summary}
    assert kinds == {"entry", "document", "task"}


def test_concurrent_commits_get_one_gapless_order(world: World) -> None:
    kernel, handle, conversation = setup(world)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            mine = kernel.open(handle.id)
            for i in range(15):
                draft = Draft(actor=f"writer:{n}")
                draft.append(conversation, "note", {"writer": n, "i": i})
                mine.commit(draft)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            from django.db import connection

            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    seqs = [c.seq for c in kernel.commits_after(handle.id, 0, 1000)]
    assert seqs == list(range(1, 62))
    entries = kernel.entries(conversation)
    assert len(entries) == 60
    assert [e.seq for e in entries] == sorted(e.seq for e in entries)
    for n in range(4):
        mine = [e.payload["i"] for e in entries if e.payload["writer"] == n]
        assert mine == list(range(15))


# -- invariant 2: nothing is observable before its commit is durable -----------------


def test_listeners_hear_only_durable_commits(world: World) -> None:
    kernel, handle, conversation = setup(world)
    heard: list[tuple[int, int]] = []

    def listener(ws: WriteSet) -> None:
        stored = world.storage.session(ws.commit.session_id)
        heard.append((ws.commit.seq, stored.head_seq))

    kernel.after_commit(listener)
    handle.commit(full_draft(conversation))
    with pytest.raises(CommitRejected):
        bad = Draft()
        bad.append("conv_missing", "user", {})
        handle.commit(bad)
    world.faults.armed["before_write"] = RuntimeError("connection refused")
    with pytest.raises(RuntimeError):
        handle.commit(full_draft(conversation))
    assert heard == [(2, 2)]


# -- invariant 4: entries and ids are immutable and never reused --------------------


def test_entries_never_change_and_ids_are_unique(world: World) -> None:
    kernel, handle, conversation = setup(world)
    first = handle.commit(full_draft(conversation)).entries[0]
    for _ in range(3):
        handle.commit(full_draft(conversation))
    entries = kernel.entries(conversation)
    assert entries[0] == first
    ids = [e.id for e in entries] + [t.id for t in world.storage.session_tasks(handle.id)]
    assert len(ids) == len(set(ids)) == 8


def test_a_phase_changing_its_input_in_place_and_raising_leaves_the_task_as_committed(
    world: World,
) -> None:
    """A phase's input and checkpoint are its own copies: what it changes in place is
    written only by a commit, and a phase that raises writes nothing."""
    registry = Registry()

    @registry.task("meddler")
    class Meddler:
        initial = "start"

        def start(self, run: Run) -> Transition:
            run.input["items"].append("changed")
            run.checkpoint["dirty"] = True
            return run.next("work", {"step": 1})

        def work(self, run: Run) -> Transition:
            run.input["items"].append("changed again")
            run.checkpoint["steps"] = ["changed"]
            raise RuntimeError("boom")

    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task("meddler", {"items": ["a"]})
    handle.commit(draft)
    assert Worker(kernel, "w1").advance(task_id)
    stored = world.reopen().task(task_id)
    assert stored is not None and stored.status is Status.TERMINAL
    assert stored.outcome is not None and stored.outcome["kind"] == "failed"
    assert (stored.input, stored.checkpoint) == ({"items": ["a"]}, {"dirty": True, "step": 1})


def test_what_a_reader_changes_in_place_changes_nothing_stored(world: World) -> None:
    kernel, handle, conversation = setup(world)
    draft = Draft(actor="user:ann")
    draft.append(conversation, "user", {"parts": ["hello"]})
    draft.create_task("step", {"name": "s", "tags": ["a"]})
    handle.commit(draft)
    [entry] = kernel.entries(conversation)
    entry.payload["parts"].append("changed")
    [task] = world.storage.session_tasks(handle.id)
    task.input["tags"].append("changed")
    world.storage.task(task.id).input["tags"].append("changed again")
    commit = kernel.commits_after(handle.id, 0)[-1]
    commit.summary.append({"type": "changed"})
    assert [e.payload for e in kernel.entries(conversation)] == [{"parts": ["hello"]}]
    assert world.storage.task(task.id).input == {"name": "s", "tags": ["a"]}
    assert {"type": "changed"} not in kernel.commits_after(handle.id, 0)[-1].summary


def test_conversations_fork_at_an_entry(world: World) -> None:
    kernel, handle, conversation = setup(world)
    ids = []
    for text in ("a", "b", "c"):
        draft = Draft()
        ids.append(draft.append(conversation, "user", {"text": text}))
        handle.commit(draft)
    draft = Draft()
    fork = draft.create_conversation(fork_of=conversation, fork_entry_id=ids[1])
    draft.append(fork, "user", {"text": "b2"})
    handle.commit(draft)
    assert [e.payload["text"] for e in kernel.entries(fork)] == ["a", "b", "b2"]
    assert [e.payload["text"] for e in kernel.entries(conversation)] == ["a", "b", "c"]
    bad = Draft()
    bad.create_conversation(fork_of=conversation, fork_entry_id="entry_nope")
    with pytest.raises(UnknownRecord):
        handle.commit(bad)


# -- invariant 6: an uncertain commit poisons the handle --------------------------------


def test_uncertain_commit_poisons_the_handle_and_reopening_shows_what_landed(
    world: World,
) -> None:
    kernel, handle, conversation = setup(world)
    heard: list[int] = []
    kernel.after_commit(lambda ws: heard.append(ws.commit.seq))
    world.faults.armed["after_commit"] = ConnectionError("server closed the connection")
    with pytest.raises(SessionPoisoned):
        handle.commit(full_draft(conversation))
    assert handle.poisoned
    assert heard == []
    with pytest.raises(SessionPoisoned):
        handle.commit(full_draft(conversation))

    world.reopen()
    reopened = world.kernel(make_registry(Effects())).open(handle.id)
    assert reopened.head_seq == 2
    assert [e.payload for e in reopened.kernel.entries(conversation)] == [{"text": "hello"}]
    assert [t.kind for t in world.storage.session_tasks(handle.id)] == ["step"]
    assert reopened.commit(full_draft(conversation)).commit.seq == 3


def test_a_crash_mid_commit_leaves_the_previous_state(world: World) -> None:
    kernel, handle, conversation = setup(world)
    world.faults.armed["after_write"] = Crash()
    with pytest.raises(Crash):
        handle.commit(full_draft(conversation))
    world.reopen()
    assert world.storage.session(handle.id).head_seq == 1
    assert world.storage.session_tasks(handle.id) == []


# -- submissions: accepted once per request id ---------------------------------------


def test_a_request_id_is_accepted_once(world: World) -> None:
    kernel, handle, conversation = setup(world)
    first = handle.submit(conversation, "req-1", {"text": "send the notices"}, actor="user:ann")
    again = kernel.open(handle.id).submit(conversation, "req-1", {"text": "something else"})
    assert again == first
    assert world.storage.session(handle.id).head_seq == 2
    other = handle.submit(conversation, "req-2", {"text": "and again"})
    assert other.id != first.id and other.status is SubmissionStatus.QUEUED
    draft = Draft()
    answer = draft.append(conversation, "assistant", {"text": "done"})
    draft.update_submission(first.id, SubmissionStatus.ANSWERED, answer_entry_id=answer)
    handle.commit(draft)
    stored = world.storage.submission(first.id)
    assert (stored.status, stored.answer_entry_id) == (SubmissionStatus.ANSWERED, answer)
    late = Draft()
    late.update_submission(first.id, SubmissionStatus.UNANSWERED, reason="too late")
    with pytest.raises(CommitRejected):
        handle.commit(late)


# -- idempotent commits: an operator's action id lands once -------------------------


def test_a_commit_key_lands_once_per_session(world: World) -> None:
    kernel, handle, conversation = setup(world)
    first = full_draft(conversation)
    first.key = "action-1"
    written = handle.commit(first)
    again = full_draft(conversation)
    again.key = "action-1"
    with pytest.raises(DuplicateCommit) as caught:
        kernel.open(handle.id).commit(again)
    assert caught.value.existing.seq == written.commit.seq
    assert caught.value.existing.key == "action-1"
    assert len(kernel.entries(conversation)) == 1
    other = kernel.create_session()
    draft = Draft(key="action-1")
    draft.create_conversation()
    assert other.commit(draft).commit.key == "action-1"  # keys are per session


def test_operations_are_logged_in_a_conversation_of_their_own(world: World) -> None:
    kernel, handle, conversation = setup(world)
    for reason in ("first", "second"):
        draft = Draft(actor="user:olga")
        draft.record_operation("cancel", {"task": "t1", "reason": reason})
        handle.commit(draft)
    log = kernel.entries(operations_log_id(handle.id))
    assert [(e.kind, e.actor, e.payload["reason"]) for e in log] == [
        ("cancel", "user:olga", "first"),
        ("cancel", "user:olga", "second"),
    ]
    assert kernel.entries(conversation) == []


def test_the_operations_log_takes_no_submission_entry_or_fork(world: World) -> None:
    kernel, handle, _ = setup(world)
    draft = Draft(actor="user:olga")
    draft.record_operation("cancel", {"task": "t1", "reason": "first"})
    handle.commit(draft)
    log = operations_log_id(handle.id)
    [logged] = kernel.entries(log)
    attempts = {
        "submission": lambda d: d.submit(log, "req-1", {"text": "forged"}),
        "entry": lambda d: d.append(log, "cancel", {"reason": "forged"}),
        "fork": lambda d: d.create_conversation(fork_of=log, fork_entry_id=logged.id),
    }
    for use, build in attempts.items():
        draft = Draft(actor="user:mallory")
        build(draft)
        with pytest.raises(ReservedConversation, match="operations log"):
            kernel.open(handle.id).commit(draft)
        assert world.storage.session(handle.id).head_seq == 2, use
    assert kernel.entries(log) == [logged]
    assert world.storage.submission_by_request(handle.id, "req-1") is None


def test_a_commit_key_or_request_id_longer_than_a_name_may_be_is_refused_at_build(
    world: World,
) -> None:
    """Up to :data:`kernel.values.NAME_BYTES` UTF-8 bytes a commit key (or a
    submission's request id) is stored, and a repeat refused; beyond that, both storages
    refuse it alike before anything is written (Postgres indexes it with the session)."""
    kernel = world.kernel(make_registry(Effects()))
    handle = kernel.create_session()
    longest = "€" + incompressible(NAME_BYTES - 3)  # "€" is three bytes in UTF-8
    draft = Draft(key=longest)
    conversation = draft.create_conversation()
    draft.submit(conversation, longest, {"text": "hi"})
    handle.commit(draft)
    draft = Draft(key=longest)
    draft.set("plan", "p", ["n"], 1)
    with pytest.raises(DuplicateCommit):
        handle.commit(draft)
    head = world.storage.session(handle.id).head_seq

    for key in (longest + "x", incompressible(3000)):  # more than an index entry holds
        draft = Draft(key=key)
        draft.set("plan", "p", ["n"], 1)
        with pytest.raises(UnstorableValue, match=r"commit key .* longer than"):
            handle.commit(draft)
    draft = Draft()
    with pytest.raises(UnstorableValue, match=r"submission request id .* longer than"):
        draft.submit(conversation, longest + "x", {"text": "hi"})
    world.reopen()
    assert world.storage.session(handle.id).head_seq == head
    assert world.storage.document_head(handle.id, "plan", "p") is None

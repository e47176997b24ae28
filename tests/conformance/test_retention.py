"""Retention (kernel.retention), run against both storages: what a prune removes, what it
never touches, and what a reader of the commit log sees afterwards."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kernel import Draft, Kernel, Status, SubmissionStatus, UnknownRecord, Worker
from kernel.retention import RetentionPolicy

from .definitions import Effects, make_registry
from .world import World

POLICY = RetentionPolicy(days=30)
BIG = "x" * 3000  # a few of these and a document writes a new baseline


def finished_session(kernel: Kernel) -> tuple[str, str, str]:
    """A session whose task succeeded, with a transcript and a document that has
    versions before its newest baseline: (session, conversation, task)."""
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    conversation = draft.create_conversation()
    draft.append(conversation, "user", {"text": "hello"})
    task_id = draft.create_task("step", {"name": "done"})
    handle.commit(draft)
    for i in range(4):
        draft = Draft(actor="user:ann")
        draft.set("plan", "p", ["big"], f"{i}{BIG}")
        handle.commit(draft)
    return handle.id, conversation, task_id


def started(kernel: Kernel, kind: str, input: dict) -> tuple[str, str]:
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task(kind, input)
    handle.commit(draft)
    return handle.id, task_id


def unsettled_submission(kernel: Kernel) -> str:
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    conversation = draft.create_conversation()
    draft.submit(conversation, "req-1", {"text": "answer me"})
    handle.commit(draft)
    return handle.id


def test_prune_removes_finished_history_and_leaves_live_work_runnable(world: World) -> None:
    effects = Effects()
    registry = make_registry(effects)
    kernel = world.kernel(registry)
    done, conversation, done_task = finished_session(kernel)
    world.scheduler(registry).run_until_idle()
    assert world.storage.task(done_task).outcome["kind"] == "succeeded"
    live, live_task = started(kernel, "step", {"name": "live"})  # pending: never run
    waiting, waiting_task = started(kernel, "asker", {"name": "q"})
    Worker(kernel, "w1").advance(waiting_task)  # the asker now waits
    submitted = unsettled_submission(kernel)
    assert world.storage.task(waiting_task).status is Status.WAITING
    assert world.storage.task(live_task).status is Status.PENDING
    heads = {s: world.storage.session(s).head_seq for s in (done, live, waiting, submitted)}
    head = world.storage.document_head(done, "plan", "p")
    assert head.baseline_version > 1  # there are versions before the newest baseline
    value = kernel.document(done, "plan", "p")

    world.clock.advance(timedelta(days=31))
    report = world.storage.prune(POLICY, world.clock.now())

    assert (report.sessions, report.entries) == (1, 1)
    assert report.commits + report.partition_commits == heads[done]
    assert report.document_versions == head.baseline_version - 1
    pruned = world.storage.session(done)
    assert (pruned.head_seq, pruned.pruned_seq) == (heads[done], heads[done])
    assert world.storage.commits_after(done, 0, 100) == []
    assert world.storage.conversation_entries(conversation) == []
    assert kernel.document(done, "plan", "p") == value  # the current value stays
    with pytest.raises(UnknownRecord, match="pruned"):
        kernel.document(done, "plan", "p", version=1)
    assert world.storage.task(done_task).outcome["kind"] == "succeeded"
    for untouched in (live, waiting, submitted):
        assert world.storage.session(untouched).pruned_seq == 0
        assert [c.seq for c in world.storage.commits_after(untouched, 0, 100)] == list(
            range(1, heads[untouched] + 1)
        )

    # Every live task still runs to its end, on a storage that knows only what was kept.
    world.reopen()
    draft = Draft(actor="user:olga")
    draft.signal(waiting_task, "resolution", {"decision": "sent"})
    world.kernel(registry).open(waiting).commit(draft)
    world.scheduler(registry).run_until_idle()
    assert world.storage.task(live_task).outcome["kind"] == "succeeded"
    assert world.storage.task(waiting_task).outcome["kind"] == "succeeded"
    # A pruned session takes new commits after its head; the log restarts there.
    draft = Draft(actor="user:ann")
    draft.set("plan", "p", ["after"], 1)
    world.kernel(registry).open(done).commit(draft)
    assert [c.seq for c in world.storage.commits_after(done, 0, 100)] == [heads[done] + 1]
    assert [c.seq for c in world.storage.commits_after(done, heads[done] - 2, 100)] == [
        heads[done] + 1
    ]
    assert world.storage.commits_after(done, heads[done] + 1, 100) == []


def test_a_dry_run_counts_and_changes_nothing(world: World) -> None:
    registry = make_registry(Effects())
    kernel = world.kernel(registry)
    done, conversation, _ = finished_session(kernel)
    world.scheduler(registry).run_until_idle()
    head = world.storage.session(done).head_seq
    world.clock.advance(timedelta(days=31))
    report = world.storage.prune(POLICY, world.clock.now(), dry_run=True)
    assert report.dry_run and report.sessions == 1
    assert report.commits + report.partition_commits == head
    assert world.storage.session(done).pruned_seq == 0
    assert len(world.storage.commits_after(done, 0, 100)) == head
    assert len(world.storage.conversation_entries(conversation)) == 1


def test_only_what_the_policy_says_is_due_goes(world: World) -> None:
    registry = make_registry(Effects())
    kernel = world.kernel(registry)
    recent, _, _ = finished_session(kernel)
    kept_long = kernel.create_session(metadata={"retention_days": 365})
    draft = Draft(actor="user:ann")
    draft.set("plan", "p", ["n"], 1)
    kept_long.commit(draft)
    failed, failed_task = started(kernel, "step", {"name": "f", "fail": True})
    world.scheduler(registry).run_until_idle()
    assert world.storage.task(failed_task).outcome["kind"] == "failed"
    world.clock.advance(timedelta(days=10))
    policy = RetentionPolicy(days=30, by_status={"failed": 5})
    assert world.storage.prune(RetentionPolicy(), world.clock.now()).sessions == 0  # off
    report = world.storage.prune(policy, world.clock.now())
    assert report.sessions == 1
    assert world.storage.session(failed).pruned_seq > 0
    assert world.storage.session(recent).pruned_seq == 0
    assert world.storage.session(kept_long.id).pruned_seq == 0
    world.clock.advance(timedelta(days=30))
    assert world.storage.prune(policy, world.clock.now()).sessions == 1  # recent, now due
    assert world.storage.session(kept_long.id).pruned_seq == 0
    assert world.storage.prune(policy, world.clock.now()).sessions == 0  # nothing twice


def test_a_settled_submission_does_not_hold_a_session_back(world: World) -> None:
    registry = make_registry(Effects())
    kernel = world.kernel(registry)
    session = unsettled_submission(kernel)
    submission = next(
        s for s in [world.storage.submission_by_request(session, "req-1")] if s is not None
    )
    world.clock.advance(timedelta(days=31))
    assert world.storage.prune(POLICY, world.clock.now()).sessions == 0
    draft = Draft(actor="user:ann")
    draft.update_submission(submission.id, SubmissionStatus.CANCELLED, reason="gave up")
    kernel.open(session).commit(draft)
    world.clock.advance(timedelta(days=31))
    assert world.storage.prune(POLICY, world.clock.now()).sessions == 1
    assert world.storage.submission(submission.id).status is SubmissionStatus.CANCELLED


def test_a_fork_of_a_pruned_conversation_reads_as_what_is_left(world: World) -> None:
    registry = make_registry(Effects())
    kernel = world.kernel(registry)
    done, conversation, _ = finished_session(kernel)
    world.scheduler(registry).run_until_idle()
    (entry,) = world.storage.conversation_entries(conversation)
    draft = Draft(actor="user:ann")
    fork = draft.create_conversation(fork_of=conversation, fork_entry_id=entry.id)
    draft.append(fork, "user", {"text": "and then"})
    kernel.open(done).commit(draft)
    assert [e.payload["text"] for e in kernel.entries(fork)] == ["hello", "and then"]
    world.clock.advance(timedelta(days=31))
    assert world.storage.prune(POLICY, world.clock.now()).entries == 2
    draft = Draft(actor="user:ann")
    draft.append(conversation, "user", {"text": "later, in the origin"})
    draft.append(fork, "user", {"text": "later, in the fork"})
    kernel.open(done).commit(draft)
    assert [e.payload["text"] for e in kernel.entries(fork)] == ["later, in the fork"]

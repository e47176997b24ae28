"""Retention (kernel.retention), run against both storages: what a prune removes, what it
never touches, and what a reader of the commit log sees afterwards."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kernel import Draft, DuplicateCommit, Kernel, Status, SubmissionStatus, UnknownRecord, Worker
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


def live_session_with_history(kernel: Kernel) -> tuple[str, str]:
    """A session whose task is pending (never run), with a keyed commit, a document
    with versions before its newest baseline and a ``scratch`` document emptied by a
    commit: (session, task)."""
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task("step", {"name": "live"})
    handle.commit(draft)
    draft = Draft(actor="user:olga", key="op-1")
    draft.set("plan", "p", ["approved"], True)
    handle.commit(draft)
    for i in range(4):
        draft = Draft(actor="user:ann")
        draft.set("plan", "p", ["big"], f"{i}{BIG}")
        draft.set("scratch", "s", ["n"], i)
        handle.commit(draft)
    draft = Draft(actor="user:ann")
    draft.set("scratch", "s", [], {})
    draft.set("plan", "p", ["after"], 1)
    handle.commit(draft)
    return handle.id, task_id


def test_a_trim_keeps_what_reads_keyed_commits_and_live_work_need(world: World) -> None:
    registry = make_registry(Effects())
    registry.document("scratch")
    kernel = world.kernel(registry)
    session, task_id = live_session_with_history(kernel)
    head_seq = world.storage.session(session).head_seq
    head = world.storage.document_head(session, "plan", "p")
    assert 1 < head.baseline_version < head.version  # versions before and after it
    value = kernel.document(session, "plan", "p")

    report = kernel.trim(session, head_seq, forget=["scratch"])

    assert report.pruned_seq == head_seq
    assert report.commits == head_seq - 1  # all but the keyed one
    assert report.document_versions == head.baseline_version - 1
    assert report.documents == 1
    world.reopen()
    kernel = world.kernel(registry)
    assert world.storage.session(session).pruned_seq == head_seq
    assert world.storage.commits_after(session, 0, 100) == []
    assert kernel.document(session, "plan", "p") == value
    assert kernel.document(session, "plan", "p", version=head.baseline_version) != {}
    with pytest.raises(UnknownRecord, match="pruned"):
        kernel.document(session, "plan", "p", version=1)
    assert world.storage.document_head(session, "scratch", "s") is None
    assert kernel.document(session, "scratch", "s") == {}
    # The keyed commit's row stayed: its key is still refused, however late.
    draft = Draft(actor="user:olga", key="op-1")
    draft.set("plan", "p", ["approved"], False)
    with pytest.raises(DuplicateCommit):
        kernel.open(session).commit(draft)
    # The session goes on after its head, and its pending task runs to its end.
    world.scheduler(registry).run_until_idle()
    assert world.storage.task(task_id).outcome["kind"] == "succeeded"
    after = [c.seq for c in world.storage.commits_after(session, 0, 100)]
    assert after and after[0] == head_seq + 1
    assert after == list(range(head_seq + 1, world.storage.session(session).head_seq + 1))
    # A trim below the marker changes nothing.
    again = kernel.trim(session, 1)
    assert (again.pruned_seq, again.commits, again.document_versions) == (head_seq, 0, 0)


def test_a_trim_up_to_a_seq_leaves_every_later_version_readable(world: World) -> None:
    registry = make_registry(Effects())
    registry.document("scratch")
    kernel = world.kernel(registry)
    session, _ = live_session_with_history(kernel)
    head_seq = world.storage.session(session).head_seq
    head = world.storage.document_head(session, "plan", "p")
    versions = {v: kernel.document(session, "plan", "p", version=v)
                for v in range(1, head.version + 1)}
    at = {v.version: v.seq for v in world.storage.document_versions(head.id, head.version)}
    cutoff = at[head.baseline_version] - 1  # before the newest baseline

    report = kernel.trim(session, cutoff, forget=["scratch"])

    assert report.pruned_seq == cutoff
    assert report.documents == 0  # emptied after the cutoff: it stays
    assert kernel.document(session, "scratch", "s") == {}
    for version, value in versions.items():
        if at.get(version, 0) > cutoff:
            assert kernel.document(session, "plan", "p", version=version) == value
    assert [c.seq for c in world.storage.commits_after(session, 0, 100)] == list(
        range(cutoff + 1, head_seq + 1))


def test_a_trim_may_forget_only_kinds_that_read_as_empty_when_absent(world: World) -> None:
    registry = make_registry(Effects())
    registry.document("counted", initial={"n": 0})
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    with pytest.raises(ValueError, match="initial value"):
        kernel.trim(handle.id, 1, forget=["counted"])
    with pytest.raises(UnknownRecord):
        kernel.trim("no-such-session", 1)


def test_a_finished_session_trimmed_to_its_head_is_still_pruned_when_due(world: World) -> None:
    registry = make_registry(Effects())
    kernel = world.kernel(registry)
    done, conversation, _ = finished_session(kernel)
    draft = Draft(actor="user:olga", key="op-1")
    draft.set("plan", "p", ["approved"], True)
    kernel.open(done).commit(draft)
    world.scheduler(registry).run_until_idle()
    head_seq = world.storage.session(done).head_seq
    kernel.trim(done, head_seq)  # the head commit goes: only the keyed one and entries stay
    assert world.storage.session(done).pruned_seq == head_seq

    world.clock.advance(timedelta(days=29))
    assert world.storage.prune(POLICY, world.clock.now()).sessions == 0  # not due yet
    world.clock.advance(timedelta(days=2))
    dry = world.storage.prune(POLICY, world.clock.now(), dry_run=True)
    assert (dry.sessions, dry.entries, dry.commits + dry.partition_commits) == (1, 1, 1)
    report = world.storage.prune(POLICY, world.clock.now())

    assert (report.sessions, report.entries, report.commits + report.partition_commits) == (
        1, 1, 1)
    assert world.storage.conversation_entries(conversation) == []
    assert world.storage.prune(POLICY, world.clock.now()).sessions == 0  # nothing twice
    # The keyed commit went with the rest: its key is a new action now.
    draft = Draft(actor="user:olga", key="op-1")
    draft.set("plan", "p", ["approved"], False)
    kernel.open(done).commit(draft)
    assert world.storage.session(done).head_seq == head_seq + 1

"""Documents: a commit writes what it changed, and any version reads as its history replayed."""

from __future__ import annotations

import pytest

from kernel import (
    CommitRejected,
    DocumentConflict,
    Draft,
    NotRegistered,
    Registry,
    Run,
    Status,
    Transition,
    UnstorableValue,
    Worker,
)
from kernel.commit import CommitKind
from kernel.documents import apply_ops, encoded_size, weight
from kernel.storage import as_stored
from kernel.values import NAME_BYTES

from .definitions import Effects, make_registry
from .draft_shapes import SHAPES, shaped
from .names import incompressible
from .world import World


def written_bytes(write_set) -> int:
    """What a commit's document versions wrote, a value stored apart as an artifact
    (kernel.large_values) counted at its size."""
    return sum(
        weight(v.ops) + (weight(v.baseline) if v.has_baseline else 0)
        for v in write_set.document_versions
    )


def test_one_item_changed_per_commit_writes_bytes_of_the_item_not_the_document(
    world: World,
) -> None:
    registry = Registry()
    registry.document("plan")
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    items = {f"r{i:05d}": {"to": f"user{i}@example.com", "state": "pending"} for i in range(10_000)}
    draft = Draft()
    draft.set("plan", "big", ["recipients"], items)
    first = handle.commit(draft)
    document_bytes = written_bytes(first)
    assert document_bytes > 400_000

    per_commit = []
    for i in range(300):
        draft = Draft()
        item = {"to": f"user{i}@example.com", "state": "sent", "receipt": f"msg_{i}"}
        draft.set("plan", "big", ["recipients", f"r{i:05d}"], item)
        per_commit.append(written_bytes(handle.commit(draft)))
    item_bytes = encoded_size(
        {"op": "set", "path": ["recipients", "r00000"], "value": item}
    )
    assert max(per_commit) <= 2 * item_bytes  # no baseline yet: ops only
    assert sum(per_commit) < document_bytes / 10

    value = kernel.document(handle.id, "plan", "big")
    assert value["recipients"]["r00299"]["state"] == "sent"
    assert value["recipients"]["r00300"]["state"] == "pending"
    assert kernel.document(handle.id, "plan", "big", version=1)["recipients"]["r00000"] == {
        "to": "user0@example.com",
        "state": "pending",
    }


def test_every_version_reads_as_its_history_replayed(world: World) -> None:
    registry = Registry()
    registry.document("notes")
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    history = [{}]
    baselines = 0
    for i in range(240):
        op = (
            {"op": "set", "path": ["items", f"k{i % 40}"], "value": {"n": i, "pad": "x" * 30}}
            if i % 7
            else {"op": "remove", "path": ["items", f"k{(i * 3) % 40}"]}
        )
        draft = Draft()
        draft.update_document("notes", "n", op, expected_version=i)
        written = handle.commit(draft)
        baselines += sum(v.has_baseline for v in written.document_versions)
        history.append(apply_ops(history[-1], [op]))
        if i % 17 == 0:  # the current value's read in one go: the same records
            head = kernel.storage.document_head(handle.id, "notes", "n")
            assert head is not None and kernel.storage.document_now(
                handle.id, "notes", "n") == (head, kernel.storage.document_versions(
                    head.id, head.version))
    assert kernel.storage.document_now(handle.id, "notes", "missing") is None
    assert baselines >= 3  # the small document is re-baselined as ops accumulate
    for version in range(1, 241):
        assert kernel.document(handle.id, "notes", "n", version=version) == history[version]
    assert kernel.document(handle.id, "notes", "n") == history[-1]


def test_document_kinds_migrate_and_refuse_what_they_cannot_read(world: World) -> None:
    v1 = Registry()
    v1.document("plan")
    kernel = world.kernel(v1)
    handle = kernel.create_session()
    draft = Draft()
    draft.set("plan", "p", ["recipients"], ["a@example.com"])
    handle.commit(draft)

    v2 = Registry()
    v2.document(
        "plan",
        version=2,
        migrate=lambda version, value: {"to": [{"email": e} for e in value["recipients"]]},
    )
    kernel2 = world.kernel(v2)
    assert kernel2.document(handle.id, "plan", "p") == {"to": [{"email": "a@example.com"}]}
    draft = Draft()
    draft.update_document("plan", "p", {"op": "append", "path": ["to"], "value": {"email": "b"}})
    kernel2.open(handle.id).commit(draft)
    assert kernel2.document(handle.id, "plan", "p") == {
        "to": [{"email": "a@example.com"}, {"email": "b"}]
    }
    assert kernel2.document(handle.id, "plan", "p", version=1) == {"recipients": ["a@example.com"]}
    with pytest.raises(NotRegistered, match="newer than the registered version 1"):
        world.kernel(v1).document(handle.id, "plan", "p")
    with pytest.raises(NotRegistered):
        world.kernel(Registry()).document(handle.id, "plan", "p")


def test_a_commit_that_replaces_the_whole_value_stores_it_as_a_baseline(world: World) -> None:
    registry = Registry()
    registry.document("plan")
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    for value in ({"a": 1}, {"a": 2}):
        draft = Draft()
        draft.set("plan", "p", ["item"], value)
        handle.commit(draft)
    draft = Draft()
    draft.set("plan", "p", ["item"], 3)
    draft.set("plan", "p", [], {"b": 1})
    draft.set("plan", "p", ["c"], 2)
    (version,) = handle.commit(draft).document_versions
    assert version.has_baseline and version.baseline == {"b": 1, "c": 2}
    head = world.storage.document_head(handle.id, "plan", "p")
    assert head.baseline_version == head.version == 3
    assert kernel.document(handle.id, "plan", "p") == {"b": 1, "c": 2}
    assert kernel.document(handle.id, "plan", "p", version=2) == {"item": {"a": 2}}


def test_the_newest_document_of_a_prefix_passes_over_emptied_ones(world: World) -> None:
    registry = Registry()
    registry.document("plan")
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    other = kernel.create_session()
    draft = Draft()
    for key in ("a/1", "a/3", "a/2", "b/9", "a", "ab/7"):
        draft.set("plan", key, ["key"], key)
    handle.commit(draft)
    draft = Draft()
    draft.set("plan", "a/9", ["key"], "elsewhere")
    other.commit(draft)
    assert kernel.newest_document(handle.id, "plan", "a/") == ("a/3", {"key": "a/3"})
    assert kernel.newest_document(handle.id, "plan", "b/") == ("b/9", {"key": "b/9"})
    assert kernel.newest_document(handle.id, "plan", "c/") is None
    assert kernel.newest_document(handle.id, "log", "a/") is None
    draft = Draft()
    draft.set("plan", "a/4", ["key"], "a/4")
    draft.set("plan", "a/4", ["more"], "x" * 5000)  # read from its versions, not one row
    handle.commit(draft)
    draft = Draft()
    draft.set("plan", "a/4", ["later"], 1)
    handle.commit(draft)
    key, value = kernel.newest_document(handle.id, "plan", "a/")
    assert (key, value["key"], value["later"], len(value["more"])) == ("a/4", "a/4", 1, 5000)
    for emptied in ("a/4", "a/3"):
        draft = Draft()
        draft.set("plan", emptied, [], {})
        handle.commit(draft)
    assert kernel.newest_document(handle.id, "plan", "a/") == ("a/2", {"key": "a/2"})
    # A document emptied and then written again is not empty.
    draft = Draft()
    draft.set("plan", "a/4", ["again"], True)
    handle.commit(draft)
    assert kernel.newest_document(handle.id, "plan", "a/") == ("a/4", {"again": True})


def test_a_commit_of_documents_alone_numbers_each_as_the_general_commit_does(
    world: World,
) -> None:
    """A draft that only writes documents, no version expected, is the kind
    ``DOCUMENTS_ONLY`` and goes to ``Storage.commit_documents``: each document's next
    version follows its head (another commit may have moved the session meanwhile), a
    baseline where the value is new, replaced whole or due, ops otherwise, and the commit's
    summary names each version."""
    registry = Registry()
    registry.document("plan")
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    storage = kernel.storage
    taken: list[str] = []
    through = storage.commit_documents

    def commit_documents(*args: object) -> object:
        taken.append(args[0])
        return through(*args)

    storage.commit_documents = commit_documents
    values: dict[str, object] = {}
    steps = [
        ([("a", ["x"], 1), ("b", ["y"], 1)], [(1, True), (1, True)]),
        ([("a", ["x"], 2), ("c", [], {"c": 1})], [(2, False), (1, True)]),
        ([("a", [], {"whole": 1}), ("b", ["y"], 2)], [(3, True), (2, False)]),
        ([("a", ["big"], "x" * 3000)], [(4, False)]),
        ([("a", ["big2"], "x" * 3000)], [(5, True)]),  # the ops since outweigh the baseline
    ]
    for writes, numbered in steps:
        other = Draft()
        other.create_conversation()
        handle.commit(other)  # the head moves between them
        draft = Draft(actor="user:x")
        for key, path, value in writes:
            draft.set("plan", key, path, value)
            values[key] = apply_ops(values.get(key, {}), [
                {"op": "set", "path": path, "value": value}])
        assert draft.kind() is CommitKind.DOCUMENTS_ONLY
        written = handle.commit(draft)
        assert taken[-1] == handle.id
        assert [(v.version, v.has_baseline) for v in written.document_versions] == numbered
        assert [(i["key"], i["version"]) for i in written.commit.summary] == [
            (key, version) for (key, _, _), (version, _) in zip(writes, numbered, strict=True)]
        [stored] = kernel.commits_after(handle.id, written.commit.seq - 1)[:1]
        assert stored.summary == written.commit.summary
        assert stored.seq == written.commit.seq == handle.head_seq
        for head, version in zip(written.document_heads, written.document_versions,
                                 strict=True):
            assert world.storage.document_head(handle.id, "plan", head.key) == head
            assert head.updated_seq == version.seq == written.commit.seq
            assert world.storage.document_versions(head.id, head.version)[-1] == \
                as_stored(version)
        for key, value in values.items():
            assert kernel.document(handle.id, "plan", key) == value
    assert len(taken) == len(steps)


def test_which_drafts_are_documents_only() -> None:
    """Documents alone, no key, no version expected: anything else is another kind."""

    def draft(**extra: object) -> Draft:
        made = Draft(key=extra.get("key"))  # type: ignore[arg-type]
        made.set("plan", "p", ["a"], 1)
        if extra.get("expected"):
            made.update_document("plan", "q", expected_version=0)
        if extra.get("entry"):
            made.append(made.create_conversation(), "note", {})
        if extra.get("task"):
            made.create_task("steps", {})
        return made

    assert draft().kind() is CommitKind.DOCUMENTS_ONLY
    for extra in ({"key": "k"}, {"expected": True}, {"entry": True}):
        assert draft(**extra).kind() is CommitKind.GENERAL, extra
    assert draft(task=True).kind() is CommitKind.GENERAL  # a create that writes documents
    assert Draft().kind() is CommitKind.GENERAL


@pytest.mark.parametrize("shape", SHAPES)
def test_a_version_expected_of_a_document_it_does_not_write_is_checked_in_the_commit(
    world: World, shape: str,
) -> None:
    """``Draft.expect_document``: the commit is refused (DocumentConflict, nothing
    written) unless the document is at the version expected when it is built, and the
    document itself is not written. Each shape of draft beside it (one that would
    otherwise only create tasks, only write documents, or be one phase's commit that
    keeps or ends its lease) is committed the general way, so no storage's shorter way
    passes over the check."""
    registry = make_registry(Effects())
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    seen = Draft()
    seen.set("plan", "seen", ["v"], 1)
    handle.commit(seen)  # version 1
    moved = Draft()
    moved.set("plan", "seen", ["v"], 2)
    handle.commit(moved)  # version 2: the caller saw 1
    conversation = Draft()
    conv = conversation.create_conversation()
    handle.commit(conversation)

    def draft(expected: int) -> tuple[Draft, object]:
        made, known = shaped(world, handle, shape, conv, "n", expected, actor="user:x",
                             key=f"k{expected}")
        made.expect_document("plan", "seen", expected)
        assert made.kind() is CommitKind.GENERAL
        return made, known

    for before in (1, 0):  # a version before, or never written (the shorter ways' guess)
        stale, known = draft(before)
        head = world.storage.session(handle.id).head_seq
        with pytest.raises(DocumentConflict, match=f"at version 2, draft expected {before}"):
            kernel.open(handle.id).commit(stale, known=known)  # type: ignore[arg-type]
        assert world.storage.session(handle.id).head_seq == head
        assert world.storage.document_head(handle.id, "plan", "other") is None

    current, known = draft(2)
    written = kernel.open(handle.id).commit(current, known=known)  # type: ignore[arg-type]
    assert [h.key for h in written.document_heads] == (["other"] if shape == "documents"
                                                       else [])
    assert world.storage.document_head(handle.id, "plan", "seen").version == 2
    assert kernel.document(handle.id, "plan", "seen") == {"v": 2}


def test_a_version_expected_of_a_document_never_written_is_zero(world: World) -> None:
    registry = make_registry(Effects())
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    refused = Draft()
    refused.set("plan", "a", ["v"], 1)
    refused.expect_document("plan", "never", 1)
    with pytest.raises(DocumentConflict, match="at version 0, draft expected 1"):
        handle.commit(refused)
    done = Draft()
    done.set("plan", "a", ["v"], 1)
    done.expect_document("plan", "never", 0)
    handle.commit(done)
    assert world.storage.document_head(handle.id, "plan", "never") is None
    with pytest.raises(CommitRejected, match="a count"):
        Draft().expect_document("plan", "a", -1)


def test_a_new_documents_id_is_made_with_the_draft_and_kept_when_absorbed() -> None:
    first, second = Draft(), Draft()
    first.set("plan", "p", ["a"], 1)
    made = first.document_ids[("plan", "p")]
    first.set("plan", "p", ["b"], 2)
    second.set("plan", "p", ["c"], 3)
    second.set("plan", "q", ["c"], 3)
    first.absorb(second)
    assert first.document_ids[("plan", "p")] == made
    assert first.document_ids[("plan", "q")] == second.document_ids[("plan", "q")]


def test_a_document_key_no_storage_holds_is_refused_with_the_draft(world: World) -> None:
    registry = Registry()
    registry.document("plan")
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft()
    with pytest.raises(UnstorableValue, match="key"):
        draft.set("plan", "a\x00b", ["v"], 1)
    with pytest.raises(UnstorableValue, match="key"):
        draft.set("plan", "half \ud800", ["v"], 1)
    assert not draft.document_ops
    handle.commit(draft)
    assert kernel.storage.document_head(handle.id, "plan", "a") is None


def test_a_document_kind_or_key_longer_than_the_limit_is_refused_with_the_draft(
    world: World,
) -> None:
    """Up to :data:`kernel.values.NAME_BYTES` UTF-8 bytes a kind or key is
    stored and read back (on Postgres too, where an index holds it with the session);
    beyond that, both storages refuse it alike, as the draft is built."""
    longest_kind = incompressible(NAME_BYTES - 2) + "é"  # two bytes in UTF-8
    longest_key = "€" + incompressible(NAME_BYTES - 3)  # "€" is three
    registry = Registry()
    registry.document("plan")
    registry.document(longest_kind)
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft()
    draft.set("plan", longest_key, ["v"], 1)
    draft.set(longest_kind, "k", ["v"], 2)
    handle.commit(draft)
    assert kernel.storage.document_head(handle.id, "plan", longest_key) is not None
    assert kernel.storage.document_head(handle.id, longest_kind, "k") is not None

    draft = Draft()
    with pytest.raises(UnstorableValue, match=r"document plan key .* longer than"):
        draft.set("plan", longest_key + "x", ["v"], 1)
    with pytest.raises(UnstorableValue, match=r"document kind .* longer than"):
        draft.set(longest_kind + "x", "k", ["v"], 1)
    assert not draft.document_ops


def test_a_task_that_writes_a_document_key_too_long_to_store_fails_saying_so(
    world: World,
) -> None:
    registry = Registry()
    registry.document("plan")

    @registry.task("writer")
    class Writer:
        initial = "go"

        def go(self, run: Run) -> Transition:
            run.set("plan", incompressible(3000), ["v"], 1)
            return run.succeed("ok")

    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("writer", {})
    handle.commit(draft)
    worker = Worker(kernel, "w")
    assert worker.advance(task_id)
    task = world.storage.task(task_id)
    assert task.status is Status.TERMINAL and task.outcome["kind"] == "failed"
    assert "document plan key" in task.outcome["error"]
    assert "cannot be stored" in task.outcome["error"]
    assert worker.held == {}


@pytest.mark.parametrize("alone", [True, False], ids=["documents-only", "general"])
def test_a_documents_first_version_keeps_its_value_once(world: World, alone: bool) -> None:
    """The version that starts a document is stored as its baseline alone, not also as
    the ops that made it (which no replay reads); the versions after it keep their ops,
    and every version reads back as written."""
    registry = Registry()
    registry.document("plan")
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    recipients = {f"r{i}": {"to": f"user{i}@example.com"} for i in range(50)}
    draft = Draft()
    draft.set("plan", "p", ["recipients"], recipients)
    if not alone:
        draft.create_conversation()  # more than documents: the general commit
    assert (draft.kind() is CommitKind.DOCUMENTS_ONLY) is alone
    first = handle.commit(draft)
    [version] = first.document_versions
    assert version.has_baseline and version.ops  # what the commit wrote
    head = world.storage.document_head(handle.id, "plan", "p")
    assert head is not None
    [stored] = world.storage.document_versions(head.id, 1)
    assert stored.ops == [] and stored.baseline == {"recipients": recipients}
    draft = Draft()
    draft.set("plan", "p", ["recipients", "r0", "state"], "sent")
    handle.commit(draft)
    second = world.storage.document_versions(head.id, 2)
    assert [v.version for v in second] == [1, 2]
    assert second[1].ops == [{"op": "set", "path": ["recipients", "r0", "state"],
                              "value": "sent"}]
    recipients["r0"]["state"] = "sent"
    assert kernel.document(handle.id, "plan", "p") == {"recipients": recipients}
    assert kernel.document(handle.id, "plan", "p", version=1) == {
        "recipients": {**recipients, "r0": {"to": "user0@example.com"}}}

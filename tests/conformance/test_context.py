"""A model's context is the latest summary and what came after what it covers, on both
storages; a fork's inherited part the same way. The transcript keeps every entry."""

from __future__ import annotations

from typing import Any

import pytest

from kernel import Draft
from kernel.errors import UnknownRecord
from kernel.records import SUMMARY, Entry

from .definitions import Effects, make_registry
from .world import World


def setup(world: World) -> tuple[Any, Any, str]:
    kernel = world.kernel(make_registry(Effects()))
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    return kernel, handle, conversation


def say(handle: Any, conversation: str, *texts: str) -> list[Entry]:
    draft = Draft()
    for text in texts:
        draft.append(conversation, "user", {"text": text})
    return handle.commit(draft).entries


def summarize(handle: Any, conversation: str, first: Entry, last: Entry, text: str) -> Entry:
    draft = Draft()
    draft.append(conversation, SUMMARY, {
        "text": text,
        "covers": {
            "first": {"id": first.id, "seq": first.seq, "ordinal": first.ordinal},
            "last": {"id": last.id, "seq": last.seq, "ordinal": last.ordinal},
        },
    })
    return handle.commit(draft).entries[0]


def texts(entries: list[Entry]) -> list[str]:
    return [e.payload["text"] for e in entries]


def test_without_a_summary_the_context_is_every_entry(world: World) -> None:
    kernel, handle, conversation = setup(world)
    say(handle, conversation, "a", "b")
    say(handle, conversation, "c")
    assert texts(kernel.context(conversation)) == ["a", "b", "c"]
    assert kernel.context(conversation) == kernel.entries(conversation)


def test_the_latest_summary_stands_for_what_it_covers(world: World) -> None:
    kernel, handle, conversation = setup(world)
    a, b = say(handle, conversation, "a", "b")
    (c,) = say(handle, conversation, "c")
    summarize(handle, conversation, a, b, "S1: a b")
    say(handle, conversation, "d")
    assert texts(kernel.context(conversation)) == ["S1: a b", "c", "d"]
    # A later summary covers more; the earlier one is left out with what it covered.
    summarize(handle, conversation, a, c, "S2: a b c")
    (e,) = say(handle, conversation, "e")
    assert texts(kernel.context(conversation)) == ["S2: a b c", "d", "e"]
    # The transcript still holds every entry, summaries in their place.
    assert texts(kernel.entries(conversation)) == ["a", "b", "c", "S1: a b", "d", "S2: a b c", "e"]
    world.reopen()
    assert texts(world.kernel(make_registry(Effects())).context(conversation)) == [
        "S2: a b c", "d", "e"]


def test_entries_landed_between_the_cut_and_the_summary_stay_in_the_context(
    world: World,
) -> None:
    kernel, handle, conversation = setup(world)
    a, b, c = say(handle, conversation, "a", "b", "c")
    summarize(handle, conversation, a, a, "S: a")  # committed after b and c
    assert texts(kernel.context(conversation)) == ["S: a", "b", "c"]


def test_a_fork_inherits_its_origins_context_up_to_the_fork_point(world: World) -> None:
    kernel, handle, conversation = setup(world)
    a, b, c = say(handle, conversation, "a", "b", "c")
    summarize(handle, conversation, a, b, "S: a b")
    (d,) = say(handle, conversation, "d")
    draft = Draft()
    fork = draft.create_conversation(fork_of=conversation, fork_entry_id=d.id)
    draft.append(fork, "user", {"text": "d2"})
    handle.commit(draft)
    say(handle, conversation, "e")  # after the fork point: not the fork's
    assert texts(kernel.context(fork)) == ["S: a b", "c", "d", "d2"]
    assert texts(kernel.entries(fork)) == ["a", "b", "c", "S: a b", "d", "d2"]


def test_a_fork_at_an_entry_before_the_origins_summary_ignores_that_summary(
    world: World,
) -> None:
    kernel, handle, conversation = setup(world)
    a, b, c = say(handle, conversation, "a", "b", "c")
    draft = Draft()
    fork = draft.create_conversation(fork_of=conversation, fork_entry_id=b.id)
    draft.append(fork, "user", {"text": "b2"})
    handle.commit(draft)
    summarize(handle, conversation, a, c, "S: a b c")
    assert texts(kernel.context(fork)) == ["a", "b", "b2"]
    assert texts(kernel.context(conversation)) == ["S: a b c"]


def test_a_forks_own_summary_covers_inherited_and_own_entries(world: World) -> None:
    kernel, handle, conversation = setup(world)
    a, b, c = say(handle, conversation, "a", "b", "c")
    draft = Draft()
    fork = draft.create_conversation(fork_of=conversation, fork_entry_id=c.id)
    handle.commit(draft)
    (x, y) = say(handle, fork, "x", "y")
    # Covering part of the inherited entries: the rest of them still follow it.
    summarize(handle, fork, a, b, "F1: a b")
    assert texts(kernel.context(fork)) == ["F1: a b", "c", "x", "y"]
    # Covering past the fork point: nothing inherited is read.
    summarize(handle, fork, a, x, "F2: a b c x")
    assert texts(kernel.context(fork)) == ["F2: a b c x", "y"]
    assert texts(kernel.context(conversation)) == ["a", "b", "c"]


def test_a_fork_of_a_fork_reads_each_inherited_part_the_same_way(world: World) -> None:
    kernel, handle, conversation = setup(world)
    a, b = say(handle, conversation, "a", "b")
    draft = Draft()
    first = draft.create_conversation(fork_of=conversation, fork_entry_id=b.id)
    handle.commit(draft)
    (c, d) = say(handle, first, "c", "d")
    summarize(handle, first, a, c, "F: a b c")
    draft = Draft()
    second = draft.create_conversation(fork_of=first, fork_entry_id=d.id)
    handle.commit(draft)
    say(handle, second, "e")
    assert texts(kernel.context(second)) == ["F: a b c", "d", "e"]
    assert texts(kernel.entries(second)) == ["a", "b", "c", "d", "e"]


def test_a_fork_at_an_entry_outside_its_origins_transcript_is_refused(world: World) -> None:
    """The fork point is an entry of the origin's transcript (an inherited one too): an
    entry of another conversation, or of the origin's origin after where the origin
    forked, would make the fork's transcript and its model's context disagree."""
    kernel, handle, conversation = setup(world)
    (a,) = say(handle, conversation, "a")
    draft = Draft()
    first = draft.create_conversation(fork_of=conversation, fork_entry_id=a.id)
    other = draft.create_conversation()
    handle.commit(draft)
    (b,) = say(handle, conversation, "b")  # after the first fork's point: not its
    (x,) = say(handle, other, "x")
    for origin, point in [(conversation, x), (first, b), (other, a)]:
        draft = Draft()
        draft.create_conversation(fork_of=origin, fork_entry_id=point.id)
        with pytest.raises(UnknownRecord, match="to fork at"):
            handle.commit(draft)
    draft = Draft()  # an inherited entry is in the transcript
    second = draft.create_conversation(fork_of=first, fork_entry_id=a.id)
    handle.commit(draft)
    assert texts(kernel.entries(second)) == texts(kernel.context(second)) == ["a"]

"""An account's work takes turns in a process (controlplane.web.turns): a second piece of
one account's work waits for the first, another account's does not, a wait has an end,
and an account whose work is done leaves nothing behind."""

from __future__ import annotations

import threading
import time

from controlplane.web.turns import AccountTurns


def test_one_accounts_work_waits_for_its_turn_and_anothers_does_not() -> None:
    turns = AccountTurns()
    first = turns.take("vic", wait=5)
    assert first is not None
    assert turns.take("ann", wait=0.01) is not None  # another account: at once
    assert turns.take("vic", wait=0.05) is None  # vic's turn is held: the wait ends

    taken: list[float] = []

    def second() -> None:
        turn = turns.take("vic", wait=30)
        assert turn is not None
        taken.append(time.monotonic())
        turn.end()

    waiter = threading.Thread(target=second)
    waiter.start()
    time.sleep(0.2)
    assert taken == []  # still waiting while the first holds the turn
    assert turns.waiting("vic") == 2
    ended_at = time.monotonic()
    first.end()
    first.end()  # a second end gives nothing away twice
    waiter.join(30)
    assert taken and taken[0] >= ended_at
    assert turns.waiting("vic") == 0  # nobody in line: the account's line is forgotten
    assert turns._lines.keys() == {"ann"}


def test_with_no_wait_turns_are_off() -> None:
    turns = AccountTurns()
    held = [turns.take("vic", wait=0) for _ in range(3)]
    assert all(turn is not None for turn in held)
    assert turns.waiting("vic") == 0
    for turn in held:
        assert turn is not None
        turn.end()

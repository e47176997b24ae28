"""The order in which page renders get threads (controlplane.sockets.render_turns), by account."""

from __future__ import annotations

import asyncio

from controlplane.sockets.render_turns import RenderTurns


async def started_in_order(turns: RenderTurns, asks: list[str]) -> list[str]:
    """Each ask a render that holds its thread until released; the accounts in the order
    their renders started, ending the running renders one at a time, oldest first."""
    started: list[str] = []
    gates: list[asyncio.Event] = []

    async def render(account: str) -> None:
        gate = asyncio.Event()
        gates.append(gate)
        started.append(account)
        await gate.wait()

    tasks = []
    for account in asks:
        turn = turns.ask({account})
        tasks.append(asyncio.create_task(turns.run(turn, lambda a=account: render(a))))
    released = 0
    while True:
        for _ in range(5):  # let the granted renders start
            await asyncio.sleep(0)
        assert len(started) - released <= turns.threads
        if len(started) == len(asks):
            break
        gates[released].set()  # the oldest running render ends
        released += 1
    for gate in gates:
        gate.set()
    await asyncio.gather(*tasks)
    return started


def test_one_account_holds_at_most_its_share_and_others_go_first() -> None:
    async def scenario() -> list[str]:
        turns = RenderTurns(threads=4, per_account=2)
        # A heavy account asks for twenty renders, then two others ask for one each.
        return await started_in_order(turns, ["heavy"] * 20 + ["ann", "bob"])

    started = asyncio.run(scenario())
    # The heavy account starts two, the others start theirs at once (threads left for
    # them), and the heavy account's other renders follow.
    assert started[:4] == ["heavy", "heavy", "ann", "bob"]
    assert started.count("heavy") == 20


def test_accounts_waiting_take_turns() -> None:
    async def scenario() -> list[str]:
        turns = RenderTurns(threads=1, per_account=1)
        return await started_in_order(turns, ["heavy"] * 6 + ["ann"] * 2 + ["bob"] * 2)

    started = asyncio.run(scenario())
    # One thread: after the heavy account's first render, each waiting account gets a
    # turn before the heavy one gets another, whatever the order of asking.
    assert started[:5] == ["heavy", "ann", "bob", "heavy", "ann"]
    assert started[5] == "bob"


def test_a_render_shared_by_accounts_is_made_at_the_first_turn_of_any() -> None:
    async def scenario() -> list[str]:
        turns = RenderTurns(threads=1, per_account=1)
        order: list[str] = []
        gate = asyncio.Event()

        async def hold() -> None:
            order.append("heavy-1")
            await gate.wait()

        first = asyncio.create_task(turns.run(turns.ask({"heavy"}), hold))
        queued = [asyncio.create_task(turns.run(turns.ask({"heavy"}),
                                                lambda: asyncio.sleep(0, order.append("heavy"))))
                  for _ in range(3)]
        shared = turns.ask({"heavy"})
        turns.join(shared, "ann")  # ann wants the same page view
        joined = asyncio.create_task(
            turns.run(shared, lambda: asyncio.sleep(0, order.append("shared"))))
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(first, *queued, joined)
        return order

    order = asyncio.run(scenario())
    # ann's turn comes right after the render running: the shared render goes first,
    # ahead of the heavy account's own queue.
    assert order[:2] == ["heavy-1", "shared"]

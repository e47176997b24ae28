"""A burst of commits costs the notifier a send every ``gap``, not one per commit
(issue 12: a thread sending per commit cost the committing thread about a millisecond a
commit), and the last hint of the burst still goes out."""

from __future__ import annotations

import time

import pytest

from controlplane.sockets import notify
from controlplane.sockets.notify import Hint, Notifier
from tests.unit.recording_layer import Layer


def test_a_burst_of_hints_is_sent_a_few_times_and_ends_with_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = Layer()
    monkeypatch.setattr(notify, "get_channel_layer", lambda alias: layer)
    notifier = Notifier(gap=0.05)
    started = time.monotonic()
    for seq in range(1, 201):  # 200 commits over about 0.2 s
        notifier.hint(Hint("sess_a", seq, seq))
        time.sleep(0.001)
    took = time.monotonic() - started
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with layer.lock:
            if any(m.get("seq") == 200 for _, m in layer.sent):
                break
        time.sleep(0.01)
    session_sends = [m for g, m in layer.sent if g == "session.sess_a"]
    assert session_sends[-1]["seq"] == 200
    assert [m["id"] for g, m in layer.sent if g == notify.GLOBAL_GROUP][-1] == 200
    # The first goes out at once, then one per gap (a few more if the machine is slow).
    assert len(session_sends) <= took / 0.05 + 3, len(session_sends)
    assert session_sends[0]["seq"] < 20  # not held back until the burst ended

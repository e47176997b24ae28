"""A client that keeps asking for more than its account may hold, in a process of its own
(so that its work does not slow down the measuring test's threads): in turn on each
server, it opens a socket and sends a long-poll, until it is told to stop (a line on
stdin), then prints what each got as JSON: ``{"sockets": [close code, ...],
"long_polls": [[status, retry_after, detail], ...]}``.

``python -m tests.e2e.abuser TOKEN SESSION_ID SERVER_PORT [SERVER_PORT ...]``
"""

from __future__ import annotations

import json
import select
import sys
import urllib.error
import urllib.request
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect


def socket_closed_with(port: int, token: str, path: str) -> int | None:
    with connect(f"ws://127.0.0.1:{port}{path}", open_timeout=10, close_timeout=1,
                 additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        try:
            while True:
                ws.recv(timeout=5)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd is not None else None
        except TimeoutError:
            return None


def long_poll(port: int, token: str, session_id: str, wait: float) -> list[Any]:
    """A long-poll of a session that has no commits: it waits ``wait`` seconds."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/sessions/{session_id}/changes?after=0&wait={wait}",
        headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=wait + 10) as answer:
            return [answer.status, None, None]
    except urllib.error.HTTPError as refused:
        return [refused.code, refused.headers.get("Retry-After"),
                json.loads(refused.read()).get("detail")]


def main(token: str, session_id: str, quiet_id: str, *ports: str) -> None:
    """Open sockets on ``session_id``'s page and long-poll ``quiet_id`` (a session with
    no commits) until stdin has a line; print what each was answered."""
    found: dict[str, list[Any]] = {"sockets": [], "long_polls": []}
    page = f"/ws/ui/sessions/{session_id}/"
    turn = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        port = int(ports[turn % len(ports)])
        turn += 1
        found["sockets"].append(socket_closed_with(port, token, page))
        found["long_polls"].append(long_poll(port, token, quiet_id, 5))
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

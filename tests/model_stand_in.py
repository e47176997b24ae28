"""A stand-in for an OpenAI-compatible model server, on loopback, for tests.

It answers chat completions (streamed as server-sent events) and Responses-style
background requests (``POST /responses`` then ``GET /responses/{id}``) from a
script the test gives, and records every request it gets, so tests assert on what
the provider really sent. It can hold a request open - the model "thinking" -
until the test releases it, so a chaos test can kill a worker while its request is
in flight (the PyPI ``fakellm`` server cannot hold a request, nor answer Responses
background requests: ``tests/integration/test_openai_provider.py`` says which behaviour
each server is used for). It runs in the test process; workers in other processes reach
it by URL, configured as model ``remote`` (:func:`models_env`).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

JSON = Any
NAME = "remote"
SERVED = "stand-in-model"
"""The model name the stand-in is configured with: what the server is asked for."""
HOLD_LIMIT = 120.0  # a held request gives up on its own, so a failed test cannot hang


def models_env(url: str, timeout: float = 30, background: bool = False) -> dict[str, str]:
    """The ``MODELS`` setting of a process whose model ``remote`` is the stand-in at
    ``url``, asked for :data:`SERVED`."""
    return {"MODELS": json.dumps({NAME: {
        "provider": "openai", "base_url": url, "model": SERVED, "timeout": timeout,
        "background": background}})}


@dataclass(frozen=True)
class Completion:
    """What the model answers to one request, in either wire format."""

    text: str = ""
    tool_calls: tuple[JSON, ...] = ()  # {"id", "name", "arguments"}
    usage: tuple[int, int] = (10, 5)  # input, output tokens
    status: int = 200  # anything else: an HTTP error with ``text`` as its body
    headers: tuple[tuple[str, str], ...] = ()  # sent with an error (``Retry-After``)
    hold: bool = False  # chat: stream half the text, then hold until released;
    # background: hold the poll that would answer "completed" until released
    cut: bool = False  # chat: stream half the text, then close without [DONE]
    polls: int = 0  # background: answer "in_progress" to this many polls first
    ends: str = "completed"  # background: the final status (failed, cancelled, ...)


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    body: JSON
    auth: str | None


Script = Callable[[JSON], Completion]


def tool_outputs(body: JSON) -> list[JSON]:
    """The tool results a request carries (parsed), in either wire format."""
    chat = [json.loads(m["content"]) for m in body.get("messages", []) if m["role"] == "tool"]
    responses = [
        json.loads(i["output"])
        for i in body.get("input", [])
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]
    return chat + responses


def posts(model: ModelStandIn) -> list[JSON]:
    """The bodies of the POST requests ``model`` received, in order."""
    return [r.body for r in model.received if r.method == "POST"]


def by_round(*completions: Completion) -> Script:
    """Answer the n-th round of a turn (n = tool results already in the request) with the
    n-th completion; the last one answers every later round."""
    return lambda body: completions[min(len(tool_outputs(body)), len(completions) - 1)]


@dataclass
class ModelStandIn:
    script: Script | None = None
    completions: list[Completion] = field(default_factory=list)  # used when no script
    received: list[Received] = field(default_factory=list)
    held: int = 0  # how many requests have been held so far
    url: str = ""
    _background: dict[str, JSON] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _releases: int = 0  # how many times release() was called
    _released_all: bool = False
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, body: JSON) -> Completion:
        if self.script is not None:
            return self.script(body)
        return self.completions.pop(0)

    def release(self, later: bool = True) -> None:
        """Let every held request go on, and with ``later`` every later one too; without
        it a later request is held until the next release (a test that kills a worker
        in each of two held requests)."""
        with self._changed:
            self._releases += 1
            self._released_all = self._released_all or later
            self._changed.notify_all()

    def requests(self, method: str, path: str) -> list[Received]:
        """The requests received so far whose path starts with ``/v1`` + ``path``."""
        return [r for r in self.received if r.method == method and r.path.startswith(f"/v1{path}")]

    def hold(self) -> None:
        with self._lock:
            self.held += 1
        with self._changed:
            before = self._releases
            self._changed.wait_for(lambda: self._released_all or self._releases > before,
                                   HOLD_LIMIT)

    def record(self, method: str, path: str, body: JSON, auth: str | None) -> None:
        with self._lock:
            self.received.append(Received(method, path, body, auth))

    def start_background(self, completion: Completion) -> JSON:
        response_id = f"resp_{next(self._ids)}"
        with self._lock:
            self._background[response_id] = {"completion": completion, "polls": 0}
        return {"id": response_id, "object": "response", "status": "queued"}

    def poll(self, response_id: str) -> JSON | None:
        """The state of a background response, or None if there is no such id."""
        with self._lock:
            state = self._background.get(response_id)
            if state is None:
                return None
            completion: Completion = state["completion"]
            state["polls"] += 1
            unfinished = state["polls"] <= completion.polls
        if unfinished:
            return {"id": response_id, "object": "response", "status": "in_progress"}
        if completion.hold:
            self.hold()
        return response_object(response_id, completion)


def response_object(response_id: str, completion: Completion) -> JSON:
    """A finished Responses-style object."""
    output: list[JSON] = []
    if completion.text:
        output.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": completion.text}],
            }
        )
    output.extend(
        {
            "type": "function_call",
            "call_id": call["id"],
            "name": call["name"],
            "arguments": json.dumps(call["arguments"]),
        }
        for call in completion.tool_calls
    )
    answer: JSON = {"id": response_id, "object": "response", "status": completion.ends}
    if completion.ends == "completed":
        answer["output"] = output
        answer["usage"] = {
            "input_tokens": completion.usage[0],
            "output_tokens": completion.usage[1],
        }
    else:
        answer["error"] = {"message": completion.text or completion.ends}
    return answer


def delta(**fields: JSON) -> JSON:
    return {"choices": [{"index": 0, "delta": fields}]}


def chat_chunks(completion: Completion) -> tuple[list[JSON], list[JSON]]:
    """The SSE data of a streamed chat completion, split where a hold or cut happens:
    halfway through the text, before any tool call is sent."""
    pieces = [completion.text[i : i + 8] for i in range(0, len(completion.text), 8)]
    half = (len(pieces) + 1) // 2
    before = [delta(content=p) for p in pieces[:half]]
    after: list[JSON] = [delta(content=p) for p in pieces[half:]]
    for index, call in enumerate(completion.tool_calls):
        arguments = json.dumps(call["arguments"])
        middle = len(arguments) // 2  # arguments arrive in parts, as real servers send them
        after.append(
            delta(
                tool_calls=[
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": arguments[:middle]},
                    }
                ]
            )
        )
        after.append(
            delta(tool_calls=[{"index": index, "function": {"arguments": arguments[middle:]}}])
        )
    finished = "tool_calls" if completion.tool_calls else "stop"
    after.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finished}]})
    after.append(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": completion.usage[0],
                "completion_tokens": completion.usage[1],
            },
        }
    )
    after.append("[DONE]")
    return before, after


def handler(stand_in: ModelStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            stand_in.record("POST", self.path, body, self.headers.get("Authorization"))
            completion = stand_in.answer(body)
            try:
                if completion.status != 200:
                    self.reply(completion.status, completion.text.encode(), "text/plain",
                               completion.headers)
                elif self.path == "/v1/chat/completions":
                    self.stream(completion)
                elif self.path == "/v1/responses" and body.get("background"):
                    self.json(stand_in.start_background(completion))
                elif self.path == "/v1/responses":
                    self.json(response_object("resp_now", completion))
                else:
                    self.reply(404, b"no such endpoint", "text/plain")
            except OSError:
                pass  # the client went away (a killed worker): nothing to answer

        def do_GET(self) -> None:
            stand_in.record("GET", self.path, None, self.headers.get("Authorization"))
            prefix = "/v1/responses/"
            try:
                found = (
                    stand_in.poll(self.path[len(prefix) :])
                    if self.path.startswith(prefix)
                    else None
                )
                if found is None:
                    self.reply(404, b"no such response", "text/plain")
                else:
                    self.json(found)
            except OSError:
                pass

        def stream(self, completion: Completion) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            before, after = chat_chunks(completion)
            self.send_events(before)
            if completion.cut:
                return
            if completion.hold:
                stand_in.hold()
            self.send_events(after)

        def send_events(self, chunks: list[JSON]) -> None:
            for chunk in chunks:
                line = chunk if isinstance(chunk, str) else json.dumps(chunk)
                self.wfile.write(f"data: {line}\n\n".encode())
                self.wfile.flush()

        def json(self, data: JSON) -> None:
            self.reply(200, json.dumps(data).encode(), "application/json")

        def reply(self, status: int, body: bytes, content_type: str,
                  headers: tuple[tuple[str, str], ...] = ()) -> None:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def model_stand_in(script: Script | None = None) -> Iterator[ModelStandIn]:
    """Serve a stand-in on a free loopback port; ``.url`` is its ``/v1`` base URL."""
    stand_in = ModelStandIn(script)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler(stand_in))
    httpd.daemon_threads = True  # a held request must not keep the test process alive
    # shutdown() waits for the serving loop to look up: every 0.5 s by default.
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    stand_in.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        yield stand_in
    finally:
        stand_in.release()
        httpd.shutdown()
        httpd.server_close()

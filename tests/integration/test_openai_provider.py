"""The OpenAI-compatible provider over real HTTP, against a local stand-in server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kernel.agent import ModelRequest, PermanentModelError, TransientModelError
from kernel.agent.openai import OpenAICompatibleProvider


class StandIn:
    """Answers /v1/chat/completions with the next scripted list of SSE chunks."""

    def __init__(self) -> None:
        self.scripts: list[tuple[int, list[Any] | str]] = []
        self.requests: list[dict[str, Any]] = []


@pytest.fixture
def server() -> Iterator[tuple[StandIn, str]]:
    stand_in = StandIn()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            stand_in.requests.append(
                {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
            )
            status, script = stand_in.scripts.pop(0)
            if status != 200:
                self.send_response(status)
                self.end_headers()
                self.wfile.write(str(script).encode())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for chunk in script:
                line = chunk if isinstance(chunk, str) else json.dumps(chunk)
                self.wfile.write(f"data: {line}\n\n".encode())
                self.wfile.flush()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield stand_in, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def delta(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields}]}


REQUEST = ModelRequest(
    "local-model",
    [
        {"role": "user", "content": "send it"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c0", "name": "lookup", "arguments": {"q": 1}}],
        },
        {"role": "tool", "tool_call_id": "c0", "name": "lookup", "content": {"result": 2}},
    ],
    [{"type": "function", "function": {"name": "send", "parameters": {"type": "object"}}}],
)


def test_streams_text_and_assembles_tool_calls(server: tuple[StandIn, str]) -> None:
    stand_in, url = server
    stand_in.scripts.append(
        (
            200,
            [
                delta(content="Sending "),
                delta(content="now."),
                delta(
                    tool_calls=[
                        {
                            "index": 0,
                            "id": "call_1",
                            "function": {"name": "send", "arguments": '{"to": '},
                        }
                    ]
                ),
                delta(tool_calls=[{"index": 0, "function": {"arguments": '["a@x"]}'}}]),
                {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5}},
                "[DONE]",
            ],
        )
    )
    chunks: list[str] = []
    answer = OpenAICompatibleProvider(url, "secret").generate(REQUEST, chunks.append)
    assert chunks == ["Sending ", "now."]
    assert answer.text == "Sending now."
    assert [c.to_json() for c in answer.tool_calls] == [
        {"id": "call_1", "name": "send", "arguments": {"to": ["a@x"]}}
    ]
    assert answer.usage == {"input_tokens": 12, "output_tokens": 5}
    sent = stand_in.requests[0]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == "Bearer secret"
    assert sent["body"]["stream"] is True and sent["body"]["tools"] == REQUEST.tools
    assert sent["body"]["messages"][1]["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": '{"q": 1}',
    }
    assert sent["body"]["messages"][2] == {
        "role": "tool",
        "tool_call_id": "c0",
        "content": '{"result": 2}',
    }


def test_a_cut_stream_is_transient_and_never_a_response(server: tuple[StandIn, str]) -> None:
    stand_in, url = server
    stand_in.scripts.append((200, [delta(content="half an ans")]))
    with pytest.raises(TransientModelError, match="before \\[DONE\\]"):
        OpenAICompatibleProvider(url).generate(REQUEST, lambda text: None)


@pytest.mark.parametrize(
    "status, error",
    [(429, TransientModelError), (503, TransientModelError), (400, PermanentModelError)],
)
def test_errors_are_sorted_by_what_a_retry_can_do(
    server: tuple[StandIn, str], status: int, error: type[Exception]
) -> None:
    stand_in, url = server
    stand_in.scripts.append((status, "nope"))
    with pytest.raises(error, match=str(status)):
        OpenAICompatibleProvider(url).generate(REQUEST, lambda text: None)


def test_an_unreachable_server_is_transient() -> None:
    with pytest.raises(TransientModelError, match="unreachable"):
        OpenAICompatibleProvider("http://127.0.0.1:9/v1", timeout=2).generate(
            REQUEST, lambda text: None
        )

"""The OpenAI-compatible provider over real HTTP, against a local stand-in server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernel.agent import (
    ContextOverflowError,
    ModelRequest,
    ModelResponse,
    Pending,
    PermanentModelError,
    ToolCall,
    TransientModelError,
)
from kernel.agent.openai import OpenAICompatibleProvider
from tests.model_stand_in import Completion, ModelStandIn, model_stand_in


@pytest.fixture
def server() -> Iterator[ModelStandIn]:
    with model_stand_in() as stand_in:
        yield stand_in


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


def test_streams_text_and_assembles_tool_calls(server: ModelStandIn) -> None:
    call = {"id": "call_1", "name": "send", "arguments": {"to": ["a@x"]}}
    server.completions.append(Completion("Sending now.", (call,), usage=(12, 5)))
    chunks: list[str] = []
    answer = OpenAICompatibleProvider(server.url, "secret").generate(REQUEST, chunks.append)
    assert isinstance(answer, ModelResponse)
    assert chunks == ["Sending ", "now."]
    assert answer.text == "Sending now."
    assert [c.to_json() for c in answer.tool_calls] == [
        {"id": "call_1", "name": "send", "arguments": {"to": ["a@x"]}}
    ]
    assert answer.usage == {"input_tokens": 12, "output_tokens": 5}
    (sent,) = server.received
    assert sent.path == "/v1/chat/completions" and sent.auth == "Bearer secret"
    assert sent.body["stream"] is True and sent.body["tools"] == REQUEST.tools
    assert sent.body["messages"][1]["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": '{"q": 1}',
    }
    assert sent.body["messages"][2] == {
        "role": "tool",
        "tool_call_id": "c0",
        "content": '{"result": 2}',
    }


def test_a_cut_stream_is_transient_and_never_a_response(server: ModelStandIn) -> None:
    call = {"id": "call_1", "name": "send", "arguments": {}}
    server.completions.append(Completion("half an answer, then", (call,), cut=True))
    chunks: list[str] = []
    with pytest.raises(TransientModelError, match="before \\[DONE\\]"):
        OpenAICompatibleProvider(server.url).generate(REQUEST, chunks.append)
    assert "".join(chunks) == "half an answer, "


@pytest.mark.parametrize(
    "status, error",
    [(429, TransientModelError), (503, TransientModelError), (400, PermanentModelError)],
)
def test_errors_are_sorted_by_what_a_retry_can_do(
    server: ModelStandIn, status: int, error: type[Exception]
) -> None:
    server.completions.append(Completion("nope", status=status))
    with pytest.raises(error, match=str(status)):
        OpenAICompatibleProvider(server.url).generate(REQUEST, lambda text: None)


def test_an_unreachable_server_is_transient() -> None:
    with pytest.raises(TransientModelError, match="unreachable"):
        OpenAICompatibleProvider("http://127.0.0.1:9/v1", timeout=2).generate(
            REQUEST, lambda text: None
        )


def test_a_background_response_is_requested_once_then_polled_by_its_id(
    server: ModelStandIn,
) -> None:
    call = {"id": "call_9", "name": "send", "arguments": {"to": ["b@x"]}}
    server.completions.append(Completion("Done.", (call,), usage=(30, 7), polls=2))
    provider = OpenAICompatibleProvider(server.url, "secret", background=True)
    streamed: list[str] = []
    pending = provider.generate(REQUEST, streamed.append)
    assert pending == Pending("resp_1")
    assert [provider.poll("resp_1") for _ in range(2)] == [None, None]
    answer = provider.poll("resp_1")
    assert answer == ModelResponse(
        "Done.",
        (ToolCall("call_9", "send", {"to": ["b@x"]}),),
        {"input_tokens": 30, "output_tokens": 7},
    )
    assert streamed == []  # nothing streams in background mode
    (post,) = server.requests("POST", "")
    assert post.path == "/v1/responses" and post.auth == "Bearer secret"
    assert post.body["background"] is True and post.body["store"] is True
    assert post.body["input"] == [
        {"role": "user", "content": "send it"},
        {"type": "function_call", "call_id": "c0", "name": "lookup", "arguments": '{"q": 1}'},
        {"type": "function_call_output", "call_id": "c0", "output": '{"result": 2}'},
    ]
    assert post.body["tools"] == [
        {"type": "function", "name": "send", "parameters": {"type": "object"}}
    ]
    assert [g.path for g in server.requests("GET", "")] == ["/v1/responses/resp_1"] * 3


def test_background_mode_is_configured_by_environment(
    server: ModelStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_BASE_URL", server.url)
    monkeypatch.setenv("MODEL_BACKGROUND", "true")
    assert OpenAICompatibleProvider.from_env().background is True
    monkeypatch.setenv("MODEL_BACKGROUND", "0")
    assert OpenAICompatibleProvider.from_env().background is False


@pytest.mark.parametrize("ends", ["failed", "cancelled", "incomplete"])
def test_a_background_response_that_did_not_complete_is_permanent(
    server: ModelStandIn, ends: str
) -> None:
    server.completions.append(Completion("the model crashed", ends=ends))
    provider = OpenAICompatibleProvider(server.url, background=True)
    assert provider.generate(REQUEST, lambda text: None) == Pending("resp_1")
    with pytest.raises(PermanentModelError, match=f"resp_1 ended {ends}"):
        provider.poll("resp_1")
    with pytest.raises(PermanentModelError, match="404"):
        provider.poll("resp_unknown")


def test_options_never_override_what_the_turn_sets(server: ModelStandIn) -> None:
    """The allow-list keeps such options out of submissions; the provider holds the line
    too, for a request built some other way."""
    options = {"model": "expensive", "messages": [], "stream": False, "max_tokens": 9}
    request = ModelRequest(REQUEST.model, REQUEST.messages, REQUEST.tools, options)
    server.completions.append(Completion("ok"))
    OpenAICompatibleProvider(server.url).generate(request, lambda text: None)
    server.completions.append(Completion("ok"))
    OpenAICompatibleProvider(server.url, background=True).generate(request, lambda text: None)
    streamed, background = server.requests("POST", "")
    assert streamed.body["model"] == background.body["model"] == "local-model"
    assert streamed.body["stream"] is True and len(streamed.body["messages"]) == 3
    assert streamed.body["max_tokens"] == background.body["max_output_tokens"] == 9
    assert "max_tokens" not in background.body


def test_a_model_servers_error_text_stays_in_the_log_not_in_what_viewers_read(
    server: ModelStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """What a provider raises ends up in the turn's checkpoint, outcome and submission
    (every viewer reads them); the server's message may quote the prompt or a key."""
    body = ('{"error": {"message": "key sk-live-SECRET is invalid for host '
            'llm.internal:8443", "type": "invalid_request_error", "code": "invalid_api_key"}}')
    server.completions.append(Completion(body, status=401))
    with pytest.raises(PermanentModelError) as refused:
        OpenAICompatibleProvider(server.url).generate(REQUEST, lambda text: None)
    said = str(refused.value)
    assert said == ("model server answered 401 (invalid_request_error, invalid_api_key) "
                    "(its message is in the worker's log)")
    assert "SECRET" in caplog.text and "llm.internal" in caplog.text
    server.completions.append(Completion("plain text: user olga's prompt was ...",
                                         status=503))
    with pytest.raises(TransientModelError) as busy:
        OpenAICompatibleProvider(server.url).generate(REQUEST, lambda text: None)
    assert "olga" not in str(busy.value) and "503" in str(busy.value)


def test_a_context_too_long_for_the_model_is_said_so(server: ModelStandIn) -> None:
    """The turn compacts and asks once more on this error, not on any other 400."""
    body = ('{"error": {"message": "This model\'s maximum context length is 8192 tokens",'
            ' "type": "invalid_request_error", "code": "context_length_exceeded"}}')
    server.completions.append(Completion(body, status=400))
    with pytest.raises(ContextOverflowError, match="context_length_exceeded"):
        OpenAICompatibleProvider(server.url).generate(REQUEST, lambda text: None)
    server.completions.append(Completion('{"error": {"code": "invalid_value"}}', status=400))
    with pytest.raises(PermanentModelError) as other:
        OpenAICompatibleProvider(server.url).generate(REQUEST, lambda text: None)
    assert not isinstance(other.value, ContextOverflowError)

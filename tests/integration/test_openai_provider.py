"""The OpenAI-compatible provider (on the official ``openai`` client) over real HTTP.

Against ``fakellm`` from PyPI, started as a process (:mod:`tests.fakellm_server`):
streamed text, streamed tool calls, usage, a 429, a 500, a refusal, the client's own
retries, and the request asking for the configured model name. fakellm cannot do the
rest, so those run against the project's stand-in (:mod:`tests.model_stand_in`): it
streams no usage (``stream_options.include_usage``), answers errors only to requests
that are not streamed and never with a ``Retry-After`` header, never cuts a stream
short, and has no Responses API (background mode).
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterator

import pytest
from fakellm._util import approx_tokens

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
from tests.fakellm_server import FakeLLM, fakellm
from tests.model_stand_in import SERVED, Completion, ModelStandIn, model_stand_in

CONFIGURED = "configured-name"
"""What the turn calls the model (its configuration's name): never sent to the server."""
PROBE_ARGUMENTS = {"target": "db-1", "depth": 3, "tags": ["a", "b"]}
RULES = [
    {"name": "probe", "when": {"model_matches": SERVED, "messages_contain": "probe"},
     "respond": {"tool_calls": [{"name": "probe", "arguments": PROBE_ARGUMENTS}]}},
    {"name": "too-fast", "when": {"messages_contain": "too fast"},
     "respond": {"status": 429, "error": "rate limited: key sk-SECRET"}},
    {"name": "broken", "when": {"messages_contain": "break"},
     "respond": {"status": 500, "error": "internal"}},
    {"name": "refused", "when": {"messages_contain": "refuse"},
     "respond": {"status": 400, "error": "bad request"}},
    {"name": "hello", "when": {"model_matches": SERVED},
     "respond": {"content": "Hello from the configured model"}},
]


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeLLM]:
    with fakellm(tmp_path_factory.mktemp("fakellm"), RULES) as running:
        yield running


@pytest.fixture
def server() -> Iterator[ModelStandIn]:
    with model_stand_in() as stand_in:
        yield stand_in


def asking(text: str) -> ModelRequest:
    return ModelRequest(CONFIGURED, [{"role": "user", "content": text}])


def test_fakellm_streamed_text_arrives_in_pieces_from_the_configured_model(
    mock: FakeLLM,
) -> None:
    chunks: list[str] = []
    answer = OpenAICompatibleProvider(mock.url, SERVED).generate(asking("hi"), chunks.append)
    assert isinstance(answer, ModelResponse)
    assert answer.text == "Hello from the configured model" and answer.tool_calls == ()
    assert chunks == ["Hello", " from", " the", " configured", " model"]
    assert answer.model == SERVED
    last = mock.requests()[-1]
    assert (last["model"], last["stream"], last["matched_rule"]) == (SERVED, True, "hello")
    # Asked for anything else, the server does not answer as the configured model does:
    other = OpenAICompatibleProvider(mock.url, CONFIGURED).generate(asking("hi"), chunks.append)
    assert isinstance(other, ModelResponse) and other.text.startswith(
        f"[mock response for {CONFIGURED}")
    assert CONFIGURED not in {r["model"] for r in mock.requests()[:-1]}


def test_fakellm_streamed_tool_calls_are_assembled_from_their_parts(mock: FakeLLM) -> None:
    chunks: list[str] = []
    answer = OpenAICompatibleProvider(mock.url, SERVED).generate(asking("probe it"),
                                                                chunks.append)
    assert isinstance(answer, ModelResponse)
    (call,) = answer.tool_calls
    assert (call.name, call.arguments) == ("probe", PROBE_ARGUMENTS)
    assert call.id.startswith("call_") and answer.text == "" and chunks == []


def test_fakellm_usage_of_a_whole_completion(mock: FakeLLM) -> None:
    """fakellm counts usage only in answers that are not streamed (``stream = false``);
    streamed usage is checked against the stand-in below."""
    chunks: list[str] = []
    provider = OpenAICompatibleProvider(mock.url, SERVED, stream=False)
    answer = provider.generate(asking("how are you today?"), chunks.append)
    assert isinstance(answer, ModelResponse)
    assert answer.text == "Hello from the configured model" == "".join(chunks)
    assert answer.usage == {"input_tokens": approx_tokens("how are you today?"),
                            "output_tokens": approx_tokens(answer.text)}
    assert answer.usage["input_tokens"] > 0 and answer.usage["output_tokens"] > 0
    assert mock.requests()[-1]["stream"] is False
    probed = provider.generate(asking("probe"), chunks.append)
    assert isinstance(probed, ModelResponse)
    assert [(c.name, c.arguments) for c in probed.tool_calls] == [("probe", PROBE_ARGUMENTS)]


@pytest.mark.parametrize("text, status, error", [
    ("too fast", 429, TransientModelError),
    ("break", 500, TransientModelError),
    ("refuse", 400, PermanentModelError),
])
def test_fakellm_errors_are_sorted_by_what_a_retry_can_do(
    mock: FakeLLM, text: str, status: int, error: type[Exception],
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = len(mock.requests())
    with pytest.raises(error) as raised:
        OpenAICompatibleProvider(mock.url, SERVED, stream=False).generate(
            asking(text), lambda chunk: None)
    assert str(raised.value) == (f"model server answered {status} (mock_error) (its message "
                                 "is in the worker's log)")
    assert len(mock.requests()) == before + 1  # no retries of the client's own by default
    if status == 429:
        assert isinstance(raised.value, TransientModelError)
        assert raised.value.retry_after is None  # fakellm sends no Retry-After
        assert "sk-SECRET" in caplog.text and "sk-SECRET" not in str(raised.value)


def test_fakellm_the_clients_own_retries_when_configured(mock: FakeLLM) -> None:
    before = len(mock.requests())
    with pytest.raises(TransientModelError, match="500"):
        OpenAICompatibleProvider(mock.url, SERVED, stream=False, max_retries=1).generate(
            asking("break"), lambda chunk: None)
    assert [r["matched_rule"] for r in mock.requests()[before:]] == ["broken", "broken"]


REQUEST = ModelRequest(
    CONFIGURED,
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


@pytest.mark.parametrize("header", ["7", "date"])
def test_a_429_says_how_long_the_server_asked_to_wait(
    server: ModelStandIn, header: str
) -> None:
    """The stand-in: fakellm cannot send a Retry-After header."""
    value = header if header != "date" else email.utils.formatdate(time.time() + 60,
                                                                    usegmt=True)
    server.completions.append(Completion("slow down", status=429,
                                         headers=(("Retry-After", value),)))
    with pytest.raises(TransientModelError) as raised:
        OpenAICompatibleProvider(server.url, SERVED).generate(REQUEST, lambda text: None)
    assert raised.value.retry_after is not None
    if header == "7":
        assert raised.value.retry_after == 7
    else:
        assert 50 < raised.value.retry_after <= 60


def test_streams_text_and_assembles_tool_calls(server: ModelStandIn) -> None:
    call = {"id": "call_1", "name": "send", "arguments": {"to": ["a@x"]}}
    server.completions.append(Completion("Sending now.", (call,), usage=(12, 5)))
    chunks: list[str] = []
    answer = OpenAICompatibleProvider(server.url, SERVED, "secret").generate(REQUEST, chunks.append)
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


def test_calls_without_an_id_or_with_a_repeated_one_get_ids_of_their_own(
        server: ModelStandIn) -> None:
    """Some servers send no call ids (every call ``""``) or repeat one in a response: the
    turn pairs each call with its task and result by id, so each call of a response is
    given an id no other of its calls has, named by its place; an id the server gave
    once is kept."""
    calls = ({"id": "", "name": "lookup", "arguments": {"q": 1}},
             {"id": "", "name": "lookup", "arguments": {"q": 2}},
             {"id": "call_2", "name": "send", "arguments": {}},
             {"id": "call_2", "name": "send", "arguments": {"again": True}})
    server.completions.append(Completion("", calls))
    answer = OpenAICompatibleProvider(server.url, SERVED, "secret").generate(REQUEST, print)
    assert isinstance(answer, ModelResponse)
    assert [(c.id, c.arguments) for c in answer.tool_calls] == [
        ("call_0", {"q": 1}), ("call_1", {"q": 2}), ("call_2", {}),
        ("call_2_3", {"again": True})]


def test_a_cut_stream_is_transient_and_never_a_response(server: ModelStandIn) -> None:
    call = {"id": "call_1", "name": "send", "arguments": {}}
    server.completions.append(Completion("half an answer, then", (call,), cut=True))
    chunks: list[str] = []
    with pytest.raises(TransientModelError, match="ended before the model finished"):
        OpenAICompatibleProvider(server.url, SERVED).generate(REQUEST, chunks.append)
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
        OpenAICompatibleProvider(server.url, SERVED).generate(REQUEST, lambda text: None)


def test_an_unreachable_server_is_transient() -> None:
    with pytest.raises(TransientModelError, match="unreachable"):
        OpenAICompatibleProvider("http://127.0.0.1:9/v1", SERVED, timeout=2).generate(
            REQUEST, lambda text: None
        )


def test_a_background_response_is_requested_once_then_polled_by_its_id(
    server: ModelStandIn,
) -> None:
    call = {"id": "call_9", "name": "send", "arguments": {"to": ["b@x"]}}
    server.completions.append(Completion("Done.", (call,), usage=(30, 7), polls=2))
    provider = OpenAICompatibleProvider(server.url, SERVED, "secret", background=True)
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


@pytest.mark.parametrize("ends", ["failed", "cancelled", "incomplete"])
def test_a_background_response_that_did_not_complete_is_permanent(
    server: ModelStandIn, ends: str
) -> None:
    server.completions.append(Completion("the model crashed", ends=ends))
    provider = OpenAICompatibleProvider(server.url, SERVED, background=True)
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
    OpenAICompatibleProvider(server.url, SERVED).generate(request, lambda text: None)
    server.completions.append(Completion("ok"))
    OpenAICompatibleProvider(server.url, SERVED, background=True).generate(
        request, lambda text: None)
    streamed, background = server.requests("POST", "")
    assert streamed.body["model"] == background.body["model"] == SERVED
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
        OpenAICompatibleProvider(server.url, SERVED).generate(REQUEST, lambda text: None)
    said = str(refused.value)
    assert said == ("model server answered 401 (invalid_request_error, invalid_api_key) "
                    "(its message is in the worker's log)")
    assert "SECRET" in caplog.text and "llm.internal" in caplog.text
    server.completions.append(Completion("plain text: user olga's prompt was ...",
                                         status=503))
    with pytest.raises(TransientModelError) as busy:
        OpenAICompatibleProvider(server.url, SERVED).generate(REQUEST, lambda text: None)
    assert "olga" not in str(busy.value) and "503" in str(busy.value)


def test_a_context_too_long_for_the_model_is_said_so(server: ModelStandIn) -> None:
    """The turn compacts and asks once more on this error, not on any other 400."""
    body = ('{"error": {"message": "This model\'s maximum context length is 8192 tokens",'
            ' "type": "invalid_request_error", "code": "context_length_exceeded"}}')
    server.completions.append(Completion(body, status=400))
    with pytest.raises(ContextOverflowError, match="context_length_exceeded"):
        OpenAICompatibleProvider(server.url, SERVED).generate(REQUEST, lambda text: None)
    server.completions.append(Completion('{"error": {"code": "invalid_value"}}', status=400))
    with pytest.raises(PermanentModelError) as other:
        OpenAICompatibleProvider(server.url, SERVED).generate(REQUEST, lambda text: None)
    assert not isinstance(other.value, ContextOverflowError)

"""An OpenAI-compatible model provider on the official ``openai`` client.

Two ways to ask. By default, chat completions streamed: text and tool calls are
collected, the text handed to ``on_text`` as it arrives (for the progress document);
``stream=False`` asks for the whole completion at once (for servers that stream badly).
In *background* mode, a Responses request with ``background: true`` answers at once
with an id; the agent turn commits that id and polls ``responses.retrieve`` until it
is completed, so a worker that dies while waiting costs no second request - the next
worker polls the same id.

Errors are sorted by what retrying can do: 408/409/429/5xx, timeouts and dropped
connections are transient (carrying the server's ``Retry-After``, which the turn
honours); other 4xx, and a background response that ended failed, cancelled or
incomplete, are permanent. A stream that ends before the model said it finished (no
``finish_reason``) is a partial answer: transient, and it never drives a tool.

This module is the only one that imports ``openai``. It reads no environment of its
own: whoever builds the provider (the control plane's model configuration) gives it
the server, the key and the model name the server expects. A turn's request names the
model by its configured name; the server is asked for :attr:`model`.
"""

from __future__ import annotations

import email.utils
import json
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx2
import openai

from .models import (
    MODEL_OPTIONS,
    ContextOverflowError,
    ModelRequest,
    ModelResponse,
    OnText,
    Pending,
    PermanentModelError,
    ToolCall,
    TransientModelError,
)

JSON = Any
RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504})
log = logging.getLogger(__name__)
_CODE = re.compile(r"[\w.:-]{1,64}")
UNFINISHED = frozenset({"queued", "in_progress"})
OPTIONS = frozenset(option.name for option in MODEL_OPTIONS)
"""What a request's options may add to the body: nothing the turn sets itself."""
RESPONSES_NAMES = {"max_tokens": "max_output_tokens"}
"""Model options the Responses API names otherwise than chat completions."""


def error_codes(error: Any) -> str:
    """The machine-readable part of an OpenAI-style error (its ``type`` and ``code``),
    never its message. What a provider raises is kept in the turn's checkpoint, outcome
    and submission, which every viewer reads, and a server's error text can quote the
    request, name internal hosts or echo a key; that text goes to the worker's log."""
    if isinstance(error, str):
        try:
            error = json.loads(error)
        except ValueError:
            return ""
    if isinstance(error, dict) and isinstance(error.get("error"), dict):
        error = error["error"]
    if not isinstance(error, dict):
        return ""
    codes = [str(error[k]) for k in ("type", "code")
             if isinstance(error.get(k), str | int) and _CODE.fullmatch(str(error[k]))]
    return f" ({', '.join(codes)})" if codes else ""


def retry_after(headers: httpx2.Headers) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, or ``Retry-After`` as
    seconds or as an HTTP date; None when it said nothing usable."""
    try:
        if "retry-after-ms" in headers:
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            at = email.utils.parsedate_to_datetime(value)
            return max(0.0, at.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def to_openai(messages: list[JSON]) -> list[JSON]:
    """Our context messages in the chat-completions wire format."""
    out = []
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls"):
            out.append(
                {
                    "role": "assistant",
                    "content": message.get("content") or None,
                    "tool_calls": [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {
                                "name": c["name"],
                                "arguments": json.dumps(c["arguments"]),
                            },
                        }
                        for c in message["tool_calls"]
                    ],
                }
            )
        elif message["role"] == "tool":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": message["tool_call_id"],
                    "content": json.dumps(message["content"]),
                }
            )
        else:
            out.append({"role": message["role"], "content": message["content"]})
    return out


def to_responses(messages: list[JSON]) -> list[JSON]:
    """Our context messages as Responses input items: a tool call and its result are
    items of their own, linked by ``call_id``."""
    items: list[JSON] = []
    for message in messages:
        if message["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": json.dumps(message["content"]),
                }
            )
            continue
        if message.get("content"):
            items.append({"role": message["role"], "content": message["content"]})
        for call in message.get("tool_calls", []):
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": json.dumps(call["arguments"]),
                }
            )
    return items


def response_tools(tools: list[JSON]) -> list[JSON]:
    """Chat-style tool schemas (``{"type": "function", "function": {...}}``) flattened
    the way the Responses API takes them."""
    return [{"type": "function", **t["function"]} if "function" in t else t for t in tools]


def arguments_of(text: str | None, error: type[Exception]) -> JSON:
    try:
        return json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise error(f"tool call arguments are not JSON: {exc}") from exc


def distinct_ids(calls: list[ToolCall]) -> tuple[ToolCall, ...]:
    """``calls`` with an id each that no other of them has. Some servers send no call id
    (``""``) or repeat one within a response, and a turn pairs each call with its task
    and its result by id: a call without one is named by its place (``call_<n>``), a
    repeat by its id and place; an id the server gave once is kept, and is what the
    server is sent back."""
    seen: set[str] = set()
    kept = set()
    for place, call in enumerate(calls):
        if call.id and call.id not in seen:
            seen.add(call.id)
            kept.add(place)
    named = []
    for place, call in enumerate(calls):
        if place not in kept:
            new = f"{call.id or 'call'}_{place}"
            while new in seen:
                new += "_"
            seen.add(new)
            call = ToolCall(new, call.name, call.arguments)
        named.append(call)
    return tuple(named)


def from_response(response: Any) -> ModelResponse | None:
    """A Responses object as our response; None while it is still being generated."""
    status = getattr(response, "status", None)
    if status in UNFINISHED:
        return None
    identifier = str(getattr(response, "id", None))[:100]
    if status != "completed":
        reason = (getattr(response, "error", None) or getattr(response, "incomplete_details", None)
                  or "no reason given")
        if hasattr(reason, "model_dump"):
            reason = reason.model_dump()
        log.warning("background response %s ended %s: %s", identifier, status, str(reason)[:500])
        raise PermanentModelError(
            f"background response {identifier} ended {str(status)[:40]}"
            f"{error_codes(reason)} (the server's reason is in the worker's log)")
    text: list[str] = []
    calls: list[ToolCall] = []
    for item in getattr(response, "output", None) or []:
        kind = getattr(item, "type", None)
        if kind == "message":
            text.extend(getattr(part, "text", None) or ""
                        for part in getattr(item, "content", None) or [])
        elif kind == "function_call":
            calls.append(ToolCall(item.call_id or "", item.name,
                                  arguments_of(item.arguments, PermanentModelError)))
    usage = getattr(response, "usage", None)
    return ModelResponse(
        "".join(text),
        distinct_ids(calls),
        {
            "input_tokens": getattr(usage, "input_tokens", 0) or 0,
            "output_tokens": getattr(usage, "output_tokens", 0) or 0,
        },
        getattr(response, "model", None),
    )


def from_completion(completion: Any, on_text: OnText) -> ModelResponse:
    """A whole (not streamed) chat completion as our response; its text is handed to
    ``on_text`` at once."""
    choices = getattr(completion, "choices", None) or []
    if not choices or not getattr(choices[0], "finish_reason", None):
        raise TransientModelError("the completion came without a finished choice")
    message = choices[0].message
    if message.content:
        on_text(message.content)
    calls = distinct_ids([
        ToolCall(call.id or "", call.function.name,
                 arguments_of(call.function.arguments, TransientModelError))
        for call in message.tool_calls or [] if getattr(call, "function", None) is not None
    ])
    usage = getattr(completion, "usage", None)
    return ModelResponse(
        message.content or "",
        calls,
        {"input_tokens": getattr(usage, "prompt_tokens", 0) or 0,
         "output_tokens": getattr(usage, "completion_tokens", 0) or 0} if usage else {},
        getattr(completion, "model", None),
    )


class OpenAICompatibleProvider:
    """Asks the server at ``base_url`` for ``model``.

    ``max_retries`` is the client's own retries (with backoff and ``Retry-After``, in
    this process, holding the worker); 0 by default, since the turn retries durably,
    holding no worker while it waits."""

    system = "openai"
    """The GenAI semantic conventions' provider name, for the request's span."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        background: bool = False,
        max_retries: int = 0,
        stream: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.background = background
        self.stream = stream
        # Only what the configuration says is sent: never an organization or project the
        # client would read from OPENAI_* variables, and without a key no Authorization
        # header at all (the client insists on a key, so it gets a placeholder it never
        # sends).
        self.headers: dict[str, Any] = {"OpenAI-Organization": openai.Omit(),
                                        "OpenAI-Project": openai.Omit()}
        if not api_key:
            self.headers["Authorization"] = openai.Omit()
        self.client = openai.OpenAI(
            base_url=self.base_url,
            api_key=api_key or "no-key",
            timeout=timeout,
            max_retries=max_retries,
        )

    def generate(self, request: ModelRequest, on_text: OnText) -> ModelResponse | Pending:
        if self.background:
            return self._start_background(request)
        extra: JSON = {}
        if request.tools:
            extra["tools"] = request.tools
        if self.stream:
            extra["stream_options"] = {"include_usage": True}
        with sorted_errors("/chat/completions"):
            answer = self.client.chat.completions.create(
                model=self.model,
                messages=to_openai(request.messages),
                stream=self.stream,
                extra_body=self._options(request, {}),
                extra_headers=self.headers,
                **extra,
            )
            if isinstance(answer, openai.Stream):
                with answer:  # closes the connection, however the reading ends
                    return self._read_stream(answer, on_text)
            return from_completion(answer, on_text)

    def poll(self, handle: str) -> ModelResponse | None:
        """Ask for a background response by its id: None while it is not finished."""
        with sorted_errors(f"/responses/{handle}"):
            response = self.client.responses.retrieve(handle, extra_headers=self.headers)
        return from_response(response)

    def _start_background(self, request: ModelRequest) -> ModelResponse | Pending:
        extra: JSON = {}
        if request.tools:
            extra["tools"] = response_tools(request.tools)
        with sorted_errors("/responses"):
            response = self.client.responses.create(
                model=self.model,
                input=to_responses(request.messages),
                background=True,
                store=True,  # a background response must be stored to be fetched by id
                extra_body=self._options(request, RESPONSES_NAMES),
                extra_headers=self.headers,
                **extra,
            )
        if not getattr(response, "id", None):
            log.warning("background request answered without an id: %s", str(response)[:500])
            raise PermanentModelError("background request answered without an id (what it "
                                      "answered is in the worker's log)")
        return from_response(response) or Pending(response.id)

    @staticmethod
    def _options(request: ModelRequest, names: dict[str, str]) -> JSON:
        """The request's model options, by the API's names; nothing the turn sets (model,
        messages, stream...) passes, however the request was built."""
        return {names.get(k, k): v for k, v in request.options.items() if k in OPTIONS}

    def _read_stream(self, stream: Any, on_text: OnText) -> ModelResponse:
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage: JSON = {}
        finished = False
        model = None
        for chunk in stream:
            # Parsed without validation: a field a server left out is absent, not None.
            model = getattr(chunk, "model", None) or model
            if getattr(chunk, "usage", None):
                usage = {
                    "input_tokens": chunk.usage.prompt_tokens or 0,
                    "output_tokens": chunk.usage.completion_tokens or 0,
                }
            for choice in getattr(chunk, "choices", None) or []:
                delta = getattr(choice, "delta", None)
                if delta is not None and delta.content:
                    text.append(delta.content)
                    on_text(delta.content)
                for part in (delta.tool_calls if delta is not None else None) or []:
                    index = getattr(part, "index", 0)
                    call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                    call["id"] = part.id or call["id"]
                    if part.function is not None:
                        call["name"] += part.function.name or ""
                        call["arguments"] += part.function.arguments or ""
                if getattr(choice, "finish_reason", None):
                    finished = True
        if not finished:
            # A stream cut short is a partial answer: it must never drive a tool.
            raise TransientModelError("the response stream ended before the model finished")
        tool_calls = distinct_ids([
            ToolCall(c["id"], c["name"], arguments_of(c["arguments"], TransientModelError))
            for _, c in sorted(calls.items())
        ])
        return ModelResponse("".join(text), tool_calls, usage, model)


@contextmanager
def sorted_errors(path: str) -> Iterator[None]:
    """The client's exceptions as ours, sorted by what a retry can do; a server's own
    words go to the log, never into what viewers read."""
    try:
        yield
    except (TransientModelError, PermanentModelError):
        raise
    except openai.APIStatusError as exc:
        status = exc.status_code
        log.warning("model server answered %s to %s: %s", status, path, str(exc.body)[:500])
        codes = error_codes(exc.body)
        message = f"model server answered {status}{codes} (its message is in the worker's log)"
        if status in RETRYABLE:
            raise TransientModelError(message, retry_after(exc.response.headers)) from exc
        if "context_length_exceeded" in codes:
            raise ContextOverflowError(message) from exc
        raise PermanentModelError(message) from exc
    except openai.APITimeoutError as exc:
        raise TransientModelError(f"model server timed out: {exc}") from exc
    except (openai.APIConnectionError, httpx2.TransportError) as exc:
        raise TransientModelError(f"model server unreachable: {exc}") from exc
    except openai.APIError as exc:  # an error event inside the stream, a broken body
        log.warning("model server failed %s: %s", path, str(exc)[:500])
        raise TransientModelError("the model server's answer broke off (what it said is in "
                                  "the worker's log)") from exc
    except json.JSONDecodeError as exc:
        raise TransientModelError(f"model server answered with broken JSON: {exc}") from exc

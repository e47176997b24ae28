"""An OpenAI-compatible model provider over plain HTTP (standard library only).

Two ways to ask. By default, chat completions streamed as server-sent events:
text and tool calls are collected, the text handed to ``on_text`` as it arrives
(for the progress document). In *background* mode, a Responses-style request
(``POST /responses`` with ``background: true``) answers at once with an id; the
agent turn commits that id and polls ``GET /responses/{id}`` until it is
completed, so a worker that dies while waiting costs no second request - the next
worker polls the same id.

Errors are sorted by what retrying can do: 408/409/429/5xx, timeouts and dropped
connections are transient; other 4xx, and a background response that ended
failed, cancelled or incomplete, are permanent.

Configured by ``OpenAICompatibleProvider.from_env()``: ``MODEL_BASE_URL``,
``MODEL_API_KEY`` (optional for local servers), ``MODEL_TIMEOUT``, and
``MODEL_BACKGROUND`` (``1``/``true``: use background responses).
"""

from __future__ import annotations

import json
import logging
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from .models import (
    ContextOverflowError,
    ModelError,
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
UNFINISHED = frozenset({"queued", "in_progress"})
RESPONSES_NAMES = {"max_tokens": "max_output_tokens"}
"""Model options the Responses API names otherwise than chat completions."""
T = TypeVar("T")


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
    """Our context messages as Responses-style input items: a tool call and its result
    are items of their own, linked by ``call_id``."""
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


def from_responses(data: JSON) -> ModelResponse | None:
    """A Responses-style object as our response; None while it is still being generated."""
    status = data.get("status")
    if status in UNFINISHED:
        return None
    if status != "completed":
        reason = data.get("error") or data.get("incomplete_details") or "no reason given"
        log.warning("background response %s ended %s: %s", data.get("id"), status,
                    str(reason)[:500])
        raise PermanentModelError(
            f"background response {str(data.get('id'))[:100]} ended {str(status)[:40]}"
            f"{error_codes(reason)} (the server's reason is in the worker's log)")
    text: list[str] = []
    calls: list[ToolCall] = []
    for item in data.get("output", []):
        if item.get("type") == "message":
            text.extend(p.get("text", "") for p in item.get("content", []) if "text" in p)
        elif item.get("type") == "function_call":
            try:
                arguments = json.loads(item.get("arguments") or "{}")
            except json.JSONDecodeError as exc:
                raise PermanentModelError(f"tool call arguments are not JSON: {exc}") from exc
            calls.append(ToolCall(item["call_id"], item["name"], arguments))
    usage = data.get("usage") or {}
    return ModelResponse(
        "".join(text),
        tuple(calls),
        {
            "input_tokens": usage.get("input_tokens", 0),
            "output_tokens": usage.get("output_tokens", 0),
        },
    )


class OpenAICompatibleProvider:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        background: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.background = background

    @classmethod
    def from_env(cls) -> OpenAICompatibleProvider:
        base = os.environ.get("MODEL_BASE_URL")
        if not base:
            raise ValueError("MODEL_BASE_URL is not set (e.g. http://127.0.0.1:8080/v1)")
        return cls(
            base,
            os.environ.get("MODEL_API_KEY"),
            float(os.environ.get("MODEL_TIMEOUT", "60")),
            background=os.environ.get("MODEL_BACKGROUND", "").lower() in {"1", "true", "yes"},
        )

    def generate(self, request: ModelRequest, on_text: OnText) -> ModelResponse | Pending:
        if self.background:
            return self._start_background(request)
        body: JSON = {  # options first: what the turn sets is never overridden
            **request.options,
            "model": request.model,
            "messages": to_openai(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = request.tools
        return self._call(
            "/chat/completions", body, lambda answer: self._read_stream(answer, on_text)
        )

    def poll(self, handle: str) -> ModelResponse | None:
        """Ask for a background response by its id: None while it is not finished."""
        return from_responses(self._call(f"/responses/{handle}", None, json.load))

    def _start_background(self, request: ModelRequest) -> ModelResponse | Pending:
        body: JSON = {
            **{RESPONSES_NAMES.get(k, k): v for k, v in request.options.items()},
            "model": request.model,
            "input": to_responses(request.messages),
            "background": True,
            "store": True,  # a background response must be stored to be fetched by id
        }
        if request.tools:
            body["tools"] = response_tools(request.tools)
        data = self._call("/responses", body, json.load)
        if not data.get("id"):
            log.warning("background request answered without an id: %s", str(data)[:500])
            raise PermanentModelError("background request answered without an id (what it "
                                      "answered is in the worker's log)")
        return from_responses(data) or Pending(data["id"])

    def _call(self, path: str, body: JSON, read: Callable[[Any], T]) -> T:
        """POST ``body`` (GET when None) and ``read`` the answer; errors sorted by what a
        retry can do."""
        http = urllib.request.Request(
            f"{self.base_url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers=self._headers(streamed=path == "/chat/completions"),
            method="GET" if body is None else "POST",
        )
        try:
            with urllib.request.urlopen(http, timeout=self.timeout) as answer:
                return read(answer)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            codes = error_codes(detail)
            error: type[ModelError] = (
                TransientModelError if exc.code in RETRYABLE
                else ContextOverflowError if "context_length_exceeded" in codes
                else PermanentModelError
            )
            log.warning("model server answered %s to %s: %s", exc.code, path, detail)
            raise error(f"model server answered {exc.code}{codes} (its message "
                        "is in the worker's log)") from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise TransientModelError(f"model server unreachable: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise TransientModelError(f"model server answered with broken JSON: {exc}") from exc

    def _headers(self, streamed: bool) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if streamed else "application/json",
        }
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _read_stream(self, answer: Any, on_text: OnText) -> ModelResponse:
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage: JSON = {}
        finished = False
        for raw in answer:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                finished = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = {
                    "input_tokens": chunk["usage"].get("prompt_tokens", 0),
                    "output_tokens": chunk["usage"].get("completion_tokens", 0),
                }
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                if delta.get("content"):
                    text.append(delta["content"])
                    on_text(delta["content"])
                for part in delta.get("tool_calls", []) or []:
                    call = calls.setdefault(part["index"], {"id": "", "name": "", "arguments": ""})
                    call["id"] = part.get("id") or call["id"]
                    function = part.get("function", {})
                    call["name"] += function.get("name") or ""
                    call["arguments"] += function.get("arguments") or ""
        if not finished:
            # A stream cut short is a partial answer: it must never drive a tool.
            raise TransientModelError("the response stream ended before [DONE]")
        try:
            tool_calls = tuple(
                ToolCall(c["id"], c["name"], json.loads(c["arguments"] or "{}"))
                for _, c in sorted(calls.items())
            )
        except json.JSONDecodeError as exc:
            raise TransientModelError(f"tool call arguments are not JSON: {exc}") from exc
        return ModelResponse("".join(text), tool_calls, usage)

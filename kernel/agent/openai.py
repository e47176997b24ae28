"""An OpenAI-compatible chat-completions provider over plain HTTP (standard library only).

Streams the answer (server-sent events), collecting text and tool calls; the
text is handed to ``on_text`` as it arrives, for the progress document. Errors
are sorted by what retrying can do: 408/409/429/5xx, timeouts and dropped
connections are transient; other 4xx are permanent.

Configured by ``OpenAICompatibleProvider.from_env()``: ``MODEL_BASE_URL``,
``MODEL_API_KEY`` (optional for local servers), ``MODEL_TIMEOUT``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from .models import (
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


class OpenAICompatibleProvider:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    @classmethod
    def from_env(cls) -> OpenAICompatibleProvider:
        base = os.environ.get("MODEL_BASE_URL")
        if not base:
            raise ValueError("MODEL_BASE_URL is not set (e.g. http://127.0.0.1:8080/v1)")
        return cls(
            base, os.environ.get("MODEL_API_KEY"), float(os.environ.get("MODEL_TIMEOUT", "60"))
        )

    def generate(self, request: ModelRequest, on_text: OnText) -> ModelResponse | Pending:
        body: JSON = {
            "model": request.model,
            "messages": to_openai(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            **request.options,
        }
        if request.tools:
            body["tools"] = request.tools
        http = urllib.request.Request(
            f"{self.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers=self._headers(),
            method="POST",
        )
        try:
            with urllib.request.urlopen(http, timeout=self.timeout) as answer:
                return self._read_stream(answer, on_text)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            error = TransientModelError if exc.code in RETRYABLE else PermanentModelError
            raise error(f"model server answered {exc.code}: {detail}") from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise TransientModelError(f"model server unreachable: {exc}") from exc

    def poll(self, handle: str) -> ModelResponse | None:
        raise PermanentModelError("this provider answers in the request; it has no handles")

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
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

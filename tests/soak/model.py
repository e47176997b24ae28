"""The soak's remote model: a loopback stand-in (``tests.model_stand_in``) whose script
calls the soak tool that the turn's user text names, once, then answers.

A submission's text carries ``[soak-tool NAME MODE SECONDS]`` (see :func:`tool_text`);
its input names model ``remote``. The first round of the turn calls tool ``NAME`` with
``{"mode": MODE, "seconds": SECONDS}``; once a tool result is in the request, the model
answers with text. Text without the marker gets a plain answer.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from tests.model_stand_in import Completion

MARKER = re.compile(r"\[soak-tool (\w+) (\w+) ([\d.]+)\]")
_calls = itertools.count(1)


def tool_text(tag: str, tool: str, mode: str, seconds: float) -> str:
    return f"Run {tool} ({tag}) [soak-tool {tool} {mode} {seconds:.1f}]"


def last_user_text(body: Any) -> str:
    for message in reversed(body.get("messages", [])):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def answered(body: Any) -> bool:
    """Whether this turn has had its tool result: a tool message after the last user
    message (earlier turns of the conversation left theirs before it)."""
    messages = body.get("messages", [])
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    after = messages[users[-1] + 1:] if users else messages
    return any(m.get("role") == "tool" for m in after)


def script(body: Any) -> Completion:
    if answered(body):
        return Completion("Done: the tool answered.")
    found = MARKER.search(last_user_text(body))
    if found is None:
        return Completion("Nothing to run.")
    name, mode, seconds = found.group(1), found.group(2), float(found.group(3))
    call = {"id": f"call_soak_{next(_calls)}", "name": name,
            "arguments": {"mode": mode, "seconds": seconds}}
    return Completion("", tool_calls=(call,))

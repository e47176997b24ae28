"""The dashboard's template filters: model text as safe Markdown, times relative to now
(absolute on hover), durations for people.

Markdown goes through markdown-it-py with raw HTML off: any ``<`` in the text comes out
escaped, links keep markdown-it's own check (no ``javascript:``, ``vbscript:``,
``file:`` or ``data:`` URLs), and images are off (a model's text must not make the
browser fetch anything). So the one ``mark_safe`` here is on markup we built.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import lru_cache
from html import escape
from typing import Any

from django import template
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator
from markdown_it import MarkdownIt

register = template.Library()


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    parser = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    parser.disable(["image", "html_block", "html_inline"])
    return parser


@register.filter
def markdown(text: object) -> SafeString:
    """Markdown to HTML, with no HTML of the text's own (see the module's note)."""
    return mark_safe(_markdown().render(str(text or "")))  # noqa: S308 - escaped by markdown-it


def ago_text(then: datetime, now: datetime | None = None) -> str:
    seconds = ((now or datetime.now(UTC)) - then).total_seconds()
    later = seconds < 0
    seconds = abs(seconds)
    if seconds < 1:
        return "just now"
    for size, unit in ((86_400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if seconds >= size:
            amount = f"{int(seconds // size)} {unit}"
            return f"in {amount}" if later else f"{amount} ago"
    return "just now"


@register.filter
def ago(then: datetime | None) -> SafeString | str:
    """``<time>`` saying how long ago (kept current by ``static/time.js``), the absolute
    UTC time on hover."""
    if not isinstance(then, datetime):
        return "—"
    absolute = then.astimezone(UTC)
    # Every part is digits, letters, "-", ":", "+", "." and spaces: nothing to escape
    # (what format_html would check, once per entry of a long transcript).
    return mark_safe(  # noqa: S308 - built from a datetime's own fields only
        f'<time datetime="{absolute.isoformat()}" title="'
        f'{absolute.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]} UTC" data-ago>'
        f'{ago_text(absolute)}</time>')


@register.filter
def seen_note(seen: Any) -> str:
    """What an operator said they saw when they acted (an operations-log entry's
    ``seen``), for people: "saw expected_seq 12, expected_run 0"; empty when the entry
    holds none. Autoescaped where used."""
    if not isinstance(seen, dict) or not seen:
        return ""
    return "saw " + ", ".join(f"{key} {json.dumps(value) if not isinstance(value, str) else value}"
                              for key, value in seen.items())


@register.filter
def seconds(value: float | None) -> str:
    """A duration for people: "340 ms", "4.2 s", "3 min 5 s", "2 h 4 min"."""
    if value is None:
        return "—"
    value = max(0.0, float(value))
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{int(value // 60)} min {int(value % 60)} s"
    return f"{int(value // 3600)} h {int(value % 3600 // 60)} min"


BADGES = {
    "approval": "waits for approval",
    "uncertain": "uncertain: waits on an operator",
    "interrupted": "interrupted: may or may not have run",
    "lost": "no result recorded",
}
"""What a tool card's badge says of a state (the state's own name otherwise)."""
REPLAY_TITLE = "May it run again if we do not know whether it ran?"


# -- a tool card's fixed parts, built in Python: a transcript renders one card per call,
# hundreds a page, and each of these replaces a dozen tags and lookups. What they render
# is what those tags rendered, byte for byte (tests/unit/test_transcript_filters.py);
# every value is escaped with html.escape (quotes too), as autoescape would.
_CARD_INDENT = "\n          "


@register.filter
def tool_opening(card: Any) -> SafeString:
    """A tool card (``controlplane.reads.transcript.ToolCard``) up to its arguments: the
    ``<article>`` tag, the header (name, state's badge, replay policy, how long it took,
    its task's link) and the arguments."""
    state, name = escape(str(card.state)), escape(str(card.name))
    parts = [
        f'<article class="tool-card state-{state}" id="call-{escape(str(card.call_id))}" '
        f'data-state="{state}" aria-label="Tool call {name}">{_CARD_INDENT}'
        f'<header><span class="tool-name"><code>{name}</code></span>\n'
        f'            <span class="badge tool-{state}">'
        f'{escape(BADGES.get(card.state, str(card.state)))}</span>\n            ',
    ]
    if card.replay:
        parts.append(f'<span class="meta" title="{REPLAY_TITLE}">replay '
                     f'{escape(str(card.replay))}</span>')
    parts.append("\n            ")
    if card.seconds is not None:
        parts.append(f'<span class="meta duration">{escape(seconds(card.seconds))}</span>')
    parts.append("\n            ")
    if card.task_id:
        parts.append(f'<a class="meta" href="{escape(reverse("task", args=[card.task_id]))}">'
                     "its task</a>")
    parts.append(f"</header>{_CARD_INDENT}"
                 '<details class="json" open><summary>Arguments</summary>'
                 f'<pre tabindex="0" class="json arguments">{escape(str(card.arguments))}'
                 "</pre></details>")
    return mark_safe("".join(parts))  # noqa: S308 - every value in it escaped


@register.filter
def tool_outcome(card: Any, session_id: str) -> SafeString:
    """What became of a tool card's call: its error, its result's artifact (a link into
    session ``session_id``), its result, what it had done when cut off."""
    parts = []
    if card.error:
        parts.append(f'<p class="error tool-error">{escape(str(card.error))}</p>')
    parts.append(_CARD_INDENT)
    if card.artifact:
        digest = card.artifact.get("artifact")
        link = reverse("artifact", kwargs={"session_id": session_id, "digest": digest})
        parts.append(
            f'<p class="artifact">Result stored as artifact <a class="artifact-link" '
            f'href="{escape(link)}" download><code>{escape(Truncator(digest).chars(23))}'
            f"</code></a> ({escape(str(card.artifact.get('bytes')))} bytes); the model got "
            "this beginning of it:</p>")
    parts.append(_CARD_INDENT)
    if card.result is not None:
        parts.append('<details class="json" open><summary>Result</summary>'
                     f'<pre tabindex="0" class="json result">{escape(str(card.result))}'
                     "</pre></details>")
    parts.append(_CARD_INDENT)
    if card.partial:
        opened = " open" if card.state == "cancelled" else ""
        parts.append(f'<details class="json"{opened}><summary>Partial output</summary>'
                     f"<pre>{escape(str(card.partial))}</pre></details>")
    return mark_safe("".join(parts))  # noqa: S308 - every value in it escaped


@register.filter
def money(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


@register.filter
def usage_note(usage: Any) -> SafeString:
    """A model response's tokens (``controlplane.reads.transcript.Usage``), and its cost
    when priced, after its time; nothing without usage. One filter per response."""
    if not usage:
        return mark_safe("")
    cost = "" if usage.cost is None else f" · {money(usage.cost)}"
    return mark_safe(  # noqa: S308 - numbers only
        f' · <span class="usage">{int(usage.input_tokens)} in / {int(usage.output_tokens)} '
        f"out tokens{cost}</span>")


# -- a task's timeline, built in Python: a long task has thousands of rows and commits,
# which Django's template engine renders far slower than string joins.
# Every text is escaped with html.escape (quotes too); numbers are formatted here.
# Statuses, labels and lease holders repeat: each is escaped once per render.


def _escaper() -> Any:
    return lru_cache(maxsize=4096)(escape)


def _states_and_bar(row: Any, esc: Any) -> tuple[str, str]:
    """The row's states in words, and its bar on the task's time axis (one pass)."""
    words, rects = [], []
    for seg in row.segments:
        status, label = esc(seg.status), esc(seg.label)
        words.append(f'<span class="state status-{status}">{label} {seconds(seg.seconds)}'
                     "</span>")
        rects.append(f'<rect class="seg status-{status}" x="{seg.left:.3f}%" y="4" '
                     f'width="{seg.width:.3f}%" height="10"/>')
    bar = (f'<svg class="track" aria-hidden="true" focusable="false">'
           f'<rect class="span" x="{row.left:.3f}%" y="2" width="{row.width:.3f}%" '
           f'height="14"/>{"".join(rects)}</svg>')
    return "".join(words), bar


@register.filter
def waterfall_rows(rows: list[Any], restart_task: str = "") -> SafeString:
    """The ``<tr>`` of each phase of :class:`controlplane.reads.timeline.Timeline`; with
    ``restart_task`` (the task's id, for an operator), each phase that recorded where the
    task stood as it entered offers "start again from here" (a preview, then a form)."""
    out = []
    esc = _escaper()
    for row in rows:
        phase = esc(row.phase)
        again = ""
        if row.restart_of is not None:
            again = f' <span class="meta">started again from seq {row.restart_of:d}</span>'
        if restart_task and row.entered_seq is not None:
            url = esc(reverse("restart_preview", args=[restart_task])) + f"?seq={row.entered_seq:d}"
            again += (f' <a class="restart" href="{url}" hx-get="{url}" '
                      f'hx-target="#restart-preview" data-seq="{row.entered_seq:d}">'
                      "Start again from here…</a>")
        outcome = (f' <span class="badge status-{esc(row.outcome)}">{esc(row.outcome)}'
                   "</span>" if row.outcome else "")
        restarts = f' <span class="warn">restarts {row.restarts}</span>' if row.restarts else ""
        holders = ", ".join(f"<code>{esc(h)}</code>" for h in row.holders) or \
            '<span class="meta">—</span>'
        if len(row.epochs) > 1:
            epochs = ", ".join(str(e) for e in row.epochs)
            holders += (f' <span class="warn nowrap" title="epochs {epochs}">'
                        f"{len(row.epochs)} leases</span>")
        start = row.commits[0].offset if row.commits else 0.0
        states, bar = _states_and_bar(row, esc)
        out.append(
            f'<tr class="phase-row{" open" if row.open else ""}" data-phase="{phase}" '
            f'data-seconds="{row.seconds:.6f}"><th scope="row">{phase}{outcome}{again}</th>'
            f'<td class="num">+{seconds(start)}</td>'
            f'<td class="num">{seconds(row.seconds)}{" …" if row.open else ""}</td>'
            f'<td class="states">{states}{restarts}</td>'
            f'<td class="holders">{holders}</td><td class="bar-cell">{bar}</td></tr>')
    return mark_safe("".join(out))  # noqa: S308 - every text above is escaped


@register.filter
def commit_items(commits: list[Any]) -> SafeString:
    """An ``<li>`` per commit of the task: seq, time since its first, who, what."""
    out = []
    esc = _escaper()
    for c in commits:
        shown = esc(c.outcome or c.status)
        at = c.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        extra = f" · {esc(c.waits)}" if c.waits else ""
        if c.holder:
            extra += f" · lease <code>{esc(c.holder)}</code> (epoch {c.epoch})"
        if c.restarts:
            extra += f" · restarts {c.restarts}"
        out.append(
            f'<li><span class="meta">seq {c.seq} · <span title="{at} UTC">+{seconds(c.offset)}'
            f"</span> · {esc(c.actor)}</span> "
            f'<span class="badge status-{shown}">{shown}</span> phase {esc(c.phase)}{extra}'
            "</li>")
    return mark_safe("".join(out))  # noqa: S308 - every text above is escaped


@register.filter
def pretty(value: object) -> str:
    """JSON for people: indented, keys in their order, non-ASCII kept."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)

"""The dashboard's template filters: model text as safe Markdown, times relative to now
(absolute on hover), durations for people.

Markdown goes through markdown-it-py with raw HTML off: any ``<`` in the text comes out
escaped, links keep markdown-it's own check (no ``javascript:``, ``vbscript:``,
``file:`` or ``data:`` URLs), and images are off (a model's text must not make the
browser fetch anything). So the one ``mark_safe`` here is on markup we built.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
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
    return format_html(
        '<time datetime="{}" title="{}" data-ago>{}</time>',
        absolute.isoformat(), absolute.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC",
        ago_text(absolute),
    )


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


@register.filter
def money(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"

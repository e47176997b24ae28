"""The transcript's per-entry parts built in Python (``tool_header``, ``usage_note``)
render exactly what the template tags they replace rendered, for every state, with
untrusted text escaped: the markup the browser tests and the page's scripts rely on."""

from __future__ import annotations

from itertools import product

from django.template import Context, Template

from controlplane.reads.transcript import ToolCard, Usage

# The tags these filters replaced, as they were.
HEADER_TAGS = """{% load dashboard %}<header><span class="tool-name"><code>{{ t.name }}</code></span>
            <span class="badge tool-{{ t.state }}">{% if t.state == "approval" %}waits for approval{% elif t.state == "uncertain" %}uncertain: waits on an operator{% elif t.state == "interrupted" %}interrupted: may or may not have run{% elif t.state == "lost" %}no result recorded{% else %}{{ t.state }}{% endif %}</span>
            {% if t.replay %}<span class="meta" title="May it run again if we do not know whether it ran?">replay {{ t.replay }}</span>{% endif %}
            {% if t.seconds is not None %}<span class="meta duration">{{ t.seconds|seconds }}</span>{% endif %}
            {% if t.task_id %}<a class="meta" href="{% url 'task' t.task_id %}">its task</a>{% endif %}</header>"""  # noqa: E501
USAGE_TAGS = """{% load dashboard %}{% if item.usage %} · <span class="usage">{{ item.usage.input_tokens }} in / {{ item.usage.output_tokens }} out tokens{% if item.usage.cost is not None %} · {{ item.usage.cost|money }}{% endif %}</span>{% endif %}"""  # noqa: E501

STATES = ("running", "approval", "succeeded", "error", "interrupted", "cancelled",
          "uncertain", "lost")


def test_a_tool_cards_header_is_what_its_tags_rendered() -> None:
    tags = Template(HEADER_TAGS)
    built = Template("{% load dashboard %}{{ t|tool_header }}")
    for state, replay, seconds, task_id in product(
        STATES, (None, "safe", "<b>"), (None, 0.0, 0.34, 75.5), (None, "task_1")
    ):
        card = ToolCard("c1", "send_<notices>&'\"", "{}", state=state, replay=replay,
                        seconds=seconds, task_id=task_id)
        context = Context({"t": card})
        assert built.render(context) == tags.render(context)
    assert "&lt;notices&gt;" in built.render(Context({"t": card}))


def test_a_responses_usage_is_what_its_tags_rendered() -> None:
    tags = Template(USAGE_TAGS)
    built = Template("{% load dashboard %}{{ item.usage|usage_note }}")
    for usage in (None, Usage(0, 0), Usage(900, 40), Usage(1_234_567, 89, 0.0123),
                  Usage(3, 4, 0.0)):
        context = Context({"item": {"usage": usage}})
        assert built.render(context) == tags.render(context)

"""The transcript's per-call and per-response parts built in Python (``tool_opening``,
``tool_outcome``, ``usage_note``) render exactly what the template tags they replace
rendered, for every state, with untrusted text escaped: the markup the browser tests and
the page's scripts rely on."""

from __future__ import annotations

from itertools import product

from django.template import Context, Template

from controlplane.reads.transcript import ToolCard, Usage

# The tags these filters replaced, as they were.
OPENING_TAGS = """{% load dashboard %}<article class="tool-card state-{{ t.state }}" id="call-{{ t.call_id }}" data-state="{{ t.state }}" aria-label="Tool call {{ t.name }}">
          <header><span class="tool-name"><code>{{ t.name }}</code></span>
            <span class="badge tool-{{ t.state }}">{% if t.state == "approval" %}waits for approval{% elif t.state == "uncertain" %}uncertain: waits on an operator{% elif t.state == "interrupted" %}interrupted: may or may not have run{% elif t.state == "lost" %}no result recorded{% else %}{{ t.state }}{% endif %}</span>
            {% if t.replay %}<span class="meta" title="May it run again if we do not know whether it ran?">replay {{ t.replay }}</span>{% endif %}
            {% if t.seconds is not None %}<span class="meta duration">{{ t.seconds|seconds }}</span>{% endif %}
            {% if t.task_id %}<a class="meta" href="{% url 'task' t.task_id %}">its task</a>{% endif %}</header>
          <details class="json" open><summary>Arguments</summary><pre tabindex="0" class="json arguments">{{ t.arguments }}</pre></details>"""  # noqa: E501
OUTCOME_TAGS = """{% load dashboard %}{% if t.error %}<p class="error tool-error">{{ t.error }}</p>{% endif %}
          {% if t.artifact %}<p class="artifact">Result stored as artifact <a class="artifact-link" href="{% url 'artifact' session_id=session.id digest=t.artifact.artifact %}" download><code>{{ t.artifact.artifact|truncatechars:23 }}</code></a> ({{ t.artifact.bytes }} bytes); the model got this beginning of it:</p>{% endif %}
          {% if t.result is not None %}<details class="json" open><summary>Result</summary><pre tabindex="0" class="json result">{{ t.result }}</pre></details>{% endif %}
          {% if t.partial %}<details class="json"{% if t.state == "cancelled" %} open{% endif %}><summary>Partial output</summary><pre>{{ t.partial }}</pre></details>{% endif %}"""  # noqa: E501
USAGE_TAGS = """{% load dashboard %}{% if item.usage %} · <span class="usage">{{ item.usage.input_tokens }} in / {{ item.usage.output_tokens }} out tokens{% if item.usage.cost is not None %} · {{ item.usage.cost|money }}{% endif %}</span>{% endif %}"""  # noqa: E501

STATES = ("running", "approval", "succeeded", "error", "interrupted", "cancelled",
          "uncertain", "lost")
UNTRUSTED = "<script>&'\""
DIGEST = "sha256:" + "ab" * 32


def test_a_tool_cards_opening_is_what_its_tags_rendered() -> None:
    tags = Template(OPENING_TAGS)
    built = Template("{% load dashboard %}{{ t|tool_opening }}")
    for state, replay, seconds, task_id in product(
        STATES, (None, "safe", UNTRUSTED), (None, 0.0, 0.34, 75.5, 4000), (None, "task_1")
    ):
        card = ToolCard(f"c1{UNTRUSTED}", f"send{UNTRUSTED}", f'{{"a": "{UNTRUSTED}"}}',
                        state=state, replay=replay, seconds=seconds, task_id=task_id)
        context = Context({"t": card})
        assert built.render(context) == tags.render(context)
    assert "&lt;script&gt;" in built.render(Context({"t": card}))


def test_a_tool_cards_outcome_is_what_its_tags_rendered() -> None:
    tags = Template(OUTCOME_TAGS)
    built = Template("{% load dashboard %}{{ t|tool_outcome:session.id }}")
    for state, error, artifact, result, partial in product(
        ("succeeded", "cancelled", "error"), (None, "", UNTRUSTED),
        (None, {"artifact": DIGEST, "bytes": 123_456, "excerpt": "x"}),
        (None, "", UNTRUSTED), (None, "", UNTRUSTED),
    ):
        card = ToolCard("c1", "send", "{}", state=state, error=error, artifact=artifact,
                        result=result, partial=partial)
        context = Context({"t": card, "session": {"id": "sess_1"}})
        assert built.render(context) == tags.render(context)


def test_a_responses_usage_is_what_its_tags_rendered() -> None:
    tags = Template(USAGE_TAGS)
    built = Template("{% load dashboard %}{{ item.usage|usage_note }}")
    for usage in (None, Usage(0, 0), Usage(900, 40), Usage(1_234_567, 89, 0.0123),
                  Usage(3, 4, 0.0)):
        context = Context({"item": {"usage": usage}})
        assert built.render(context) == tags.render(context)

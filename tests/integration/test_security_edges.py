"""The review's low findings, each pinned: forms that carry their CSRF token without
script, a Content-Security-Policy on every page, the read-only admin, the schema built
once, a readiness probe that tells anonymous callers nothing about the database, action
ids of one operator's page never answered for another's, the credential each action came
through, who issued and revoked each token, model-server errors kept from viewers."""

from __future__ import annotations

import re

import pytest

from controlplane.runtime import runtime
from kernel import Draft, Scheduler

from .test_ui_pages import login

pytestmark = pytest.mark.django_db(transaction=True)


def failed_batches(count: int) -> list[str]:
    """Send-batch tasks that failed (an unknown channel fails the plan at once)."""
    kernel = runtime().kernel
    made = []
    for _ in range(count):
        handle = kernel.create_session()
        draft = Draft(actor="user:test")
        made.append(draft.create_task("send-batch", {
            "recipients": ["a@example.com"], "subject": "s", "body": "b", "channel": "pigeon"}))
        handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    return made


def form_fields(html: str, marker: str) -> dict[str, str]:
    start = html.index(marker)
    form = html[html.rindex("<form", 0, start):html.index("</form>", start)]
    return dict(re.findall(r'name="(\w+)" value="([^"]*)"', form))


def test_the_retry_all_and_bulk_confirm_forms_post_without_script() -> None:
    """A plain form post (no htmx, so no X-CSRFToken header) carries its own token."""
    failed_batches(2)
    operator = login("operator")
    page = operator.get("/attention/").content.decode()
    fields = form_fields(page, 'name="action_id" value=')
    assert fields.get("csrfmiddlewaretoken"), fields
    done = operator.post("/attention/retry-failed", {**fields, "reason": "fixed"})
    assert done.status_code in (200, 302), done.content
    preview = operator.get("/bulk/preview?action=cancel&kind=send-batch").content.decode()
    fields = form_fields(preview, 'name="expected_count"')
    assert fields.get("csrfmiddlewaretoken"), fields
    acted = operator.post("/bulk/act", {**fields, "reason": "tidy"})
    assert acted.status_code in (200, 302), acted.content

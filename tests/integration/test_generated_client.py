"""A Python client generated from the served ``/api/openapi.json`` works.

``openapi-python-client`` (pinned in requirements.txt: it installs beside our
dependencies without a conflict) generates a package from the schema a real server
serves, in a temporary directory, and must say nothing: any warning it prints means a
part of the schema it could not turn into code (a broken schema). The generated package
then drives a session over HTTP against that server (pytest-django's ``live_server``):
create a session and a conversation, submit, read the transcript, cancel a turn, and
resolve an uncertain step naming its step.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from controlplane.access import issue_token
from kernel import Kernel, Scheduler, Status

from .api_kinds import start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("kernel")]
GENERATOR = str(Path(sys.executable).parent / "openapi-python-client")
PACKAGE = "durable_client"
CONFIG = f"""\
project_name_override: durable-client
package_name_override: {PACKAGE}
post_hooks: []
"""


@pytest.fixture
def generated(live_server: Any, tmp_path: Path) -> Iterator[tuple[ModuleType, str]]:
    """The package generated from the live server's schema, importable; and what the
    generator printed."""
    with urllib.request.urlopen(f"{live_server.url}/api/openapi.json") as answer:
        (tmp_path / "openapi.json").write_bytes(answer.read())
    (tmp_path / "config.yaml").write_text(CONFIG)
    ran = subprocess.run(
        [GENERATOR, "generate", "--path", "openapi.json", "--config", "config.yaml",
         "--meta", "none", "--output-path", PACKAGE],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        package = importlib.import_module(PACKAGE)
        importlib.import_module(f"{PACKAGE}.models")
        yield package, ran.stdout + ran.stderr
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def operator_token() -> str:
    account = User.objects.create_user("gen")
    account.groups.add(Group.objects.get_or_create(name="operator")[0])
    return issue_token(account, "generated client")


def call(package: ModuleType, module: str, *args: Any, **kwargs: Any) -> Any:
    """``<package>.api.<module>.sync(...)``, which must answer its success type."""
    answer = importlib.import_module(f"{package.__name__}.api.{module}").sync(*args, **kwargs)
    assert not isinstance(answer, package.models.Error), answer.to_dict()
    assert answer is not None
    return answer


def test_a_generated_client_drives_a_session(
    generated: tuple[ModuleType, str], live_server: Any, kernel: Kernel,
) -> None:
    package, said = generated
    assert "warning" not in said.lower() and "error" not in said.lower(), said
    models = package.models
    client = package.AuthenticatedClient(base_url=live_server.url, token=operator_token(),
                                         raise_on_unexpected_status=True)

    session = call(package, "sessions.create_session", client=client,
                   body=models.SessionIn(metadata=models.SessionMetadata.from_dict(
                       {"title": "generated"})))
    conversation = call(package, "sessions.create_conversation", session.id, client=client,
                        body=models.ConversationIn())
    listed = call(package, "sessions.list_models", client=client)
    assert [m.name for m in listed] == ["scripted"] and listed[0].default

    # Submit, and the turn answers (the scripted model; this process is the worker).
    submitted = call(package, "sessions.submit", session.id, client=client,
                     body=models.SubmissionIn(
                         conversation_id=conversation.id, request_id="g1",
                         input_=models.SubmissionInput(text="Hello there", model="scripted")))
    assert submitted.status == "placed"
    Scheduler(kernel).run_until_idle()
    page = call(package, "sessions.list_entries", conversation.id, client=client)
    assert [e.kind for e in page.entries] == ["user", "model_response"]
    assert page.entries[0].payload["text"] == "Hello there"
    assert page.entries[1].payload["text"] == "Which customers? I found no email addresses."
    answered = call(package, "sessions.get_submission", submitted.id, client=client)
    assert answered.status == "answered"

    # A second submission's turn, cancelled before it runs.
    second = call(package, "sessions.submit", session.id, client=client,
                  body=models.SubmissionIn(conversation_id=conversation.id, request_id="g2",
                                           input_=models.SubmissionInput(text="again")))
    turn_id = kernel.document(session.id, "agent-conversation", conversation.id)["active"]
    seen = call(package, "tasks.get_task", turn_id, client=client)
    cancelled = call(package, "actions.cancel", turn_id, client=client,
                     body=models.CancelIn(action_id="c1", reason="not needed",
                                          expected_run=seen.run))
    assert (cancelled.action, cancelled.target, cancelled.replayed) == ("cancel", turn_id,
                                                                         False)
    Scheduler(kernel).run_until_idle()
    turn = call(package, "tasks.get_task", turn_id, client=client)
    assert turn.shown_status == "cancelled"
    assert call(package, "sessions.get_submission", second.id,
                client=client).status == "cancelled"

    # An uncertain step, resolved naming the step the task shows.
    _, asking = start(kernel, "api-step", {"ask": True})
    waiting = call(package, "tasks.get_task", asking, client=client)
    assert waiting.step is not None and waiting.step.signal == "resolution-1"
    assert "give_up" in [d.name for d in waiting.decisions]
    resolved = call(package, "actions.resolve", asking, client=client,
                    body=models.ResolveIn(action_id="r1", reason="checked by hand",
                                          decision="give_up", signal=waiting.step.signal,
                                          epoch=waiting.step.epoch))
    assert (resolved.action, resolved.target) == ("resolve:give_up", asking)
    Scheduler(kernel).run_until_idle()
    assert kernel.task(asking).status is Status.TERMINAL
    assert call(package, "tasks.get_task", asking, client=client).shown_status == "succeeded"

    # A refusal is the schema's error type, with its detail.
    again = importlib.import_module(f"{PACKAGE}.api.actions.resolve").sync(
        asking, client=client,
        body=models.ResolveIn(action_id="r2", reason="late", decision="give_up",
                              signal=waiting.step.signal, epoch=waiting.step.epoch))
    assert isinstance(again, models.Error) and again.detail

"""A worker killed after a notice committed its intent, while its call to the provider
had not completed: the provider holds the request (``stall``, ``before_store``) and has
stored nothing yet.

The next worker finds the notice ``running`` in ``confirm`` with an expired lease.
``confirm`` asks the provider by the operation id, hears "not found", and sends once
more with the same key. When the stalled original request finally reaches the store,
the provider recognises the key: it stores nothing new. One email per recipient.
"""

from __future__ import annotations

import pytest

from .harness import Stack
from .held_send import kill_while_the_provider_holds_the_send

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_worker_killed_while_the_provider_holds_the_send(stack: Stack) -> None:
    kill_while_the_provider_holds_the_send(stack)



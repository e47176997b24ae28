"""Test-facing access to the local email provider's admin endpoints.

Its requests go through the provider client's own endpoint (``controlplane.reference.notices.
provider``), so that what the tests see of a connection is what the product sees.
"""

from __future__ import annotations

from typing import Any

from controlplane.reference.notices.provider import ProviderRejected, _Endpoint, _error_of


class ProviderAdmin:
    """Test-facing access to the local provider's store, request log and fault knobs.

    Only the local provider (``provider_server``) implements these endpoints; a real
    provider is not expected to.
    """

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self._endpoint = _Endpoint(base_url, timeout)

    def messages(self) -> list[dict[str, Any]]:
        """Every accepted message with its receipt fields, in acceptance order."""
        return self._call("GET", "/messages")["messages"]

    def requests(self) -> list[dict[str, Any]]:
        """Every send and lookup the provider received, in arrival order, with outcomes."""
        return self._call("GET", "/requests")["requests"]

    def faults(self) -> dict[str, Any]:
        """The fault knobs in force, with counters (sends since set, firings)."""
        return self._call("GET", "/faults")

    def set_faults(self, **knobs: Any) -> dict[str, Any]:
        """Replace all fault knobs; knobs not given go back to "no fault"."""
        return self._call("PUT", "/faults", knobs)

    def end_stalls(self) -> int:
        """End the stalls under way now, as if their time were up; how many there were."""
        return self._call("DELETE", "/stalls")["ended"]

    def reset(self) -> None:
        """Forget all messages, the request log and the fault knobs."""
        self._call("DELETE", "/state")

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        answer = self._endpoint.request(method, path, payload)
        if answer.status != 200:
            raise ProviderRejected(answer.status, *_error_of(answer))
        return answer.payload

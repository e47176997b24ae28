"""Websocket origins are matched exactly: scheme, host and port (issue 15, point 4).

The browser test (tests/browser/test_security.py) shows it in Chromium; these cases
cover what a browser cannot easily be made to send."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.sockets.origins import origin_allowed


def scope(host: str, scheme: str = "ws", **headers: str) -> dict[str, Any]:
    raw = [(b"host", host.encode())] + [
        (name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()
    ]
    return {"type": "websocket", "scheme": scheme, "headers": raw}


@pytest.mark.parametrize(("origin", "allowed"), [
    ("http://127.0.0.1:8000", True),
    ("HTTP://127.0.0.1:8000", True),
    ("http://127.0.0.1:8001", False),   # another port of the same host
    ("http://127.0.0.1", False),        # port 80
    ("https://127.0.0.1:8000", False),  # another scheme
    ("http://localhost:8000", False),   # another host, though allowed in ALLOWED_HOSTS
    ("null", False),
    ("file://", False),
    ("http://127.0.0.1:99999", False),  # not a port
    ("", False),
])
def test_the_served_origin_only(origin: str, allowed: bool) -> None:
    assert origin_allowed(scope("127.0.0.1:8000"), origin) is allowed


def test_default_ports_and_tls(settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["dcp.example.com"]
    assert origin_allowed(scope("dcp.example.com", "wss"), "https://dcp.example.com")
    assert origin_allowed(scope("dcp.example.com", "wss"), "https://dcp.example.com:443")
    assert not origin_allowed(scope("dcp.example.com", "wss"), "http://dcp.example.com")
    assert not origin_allowed(scope("dcp.example.com", "ws"), "https://dcp.example.com")
    # Behind a TLS proxy that Django is told to trust.
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    behind = scope("dcp.example.com", "ws", x_forwarded_proto="https")
    assert origin_allowed(behind, "https://dcp.example.com")
    assert not origin_allowed(behind, "http://dcp.example.com")


def test_a_host_outside_allowed_hosts_serves_no_origin(settings: Any) -> None:
    settings.ALLOWED_HOSTS = [".example.com"]
    assert origin_allowed(scope("dcp.example.com"), "http://dcp.example.com")
    # A wildcard host does not let a sibling subdomain's page in.
    assert not origin_allowed(scope("dcp.example.com"), "http://evil.example.com")
    assert not origin_allowed(scope("dcp.evil.test"), "http://dcp.evil.test")


def test_configured_origins_are_exact(settings: Any) -> None:
    settings.CSRF_TRUSTED_ORIGINS = ["https://dcp.example.com", "http://10.0.0.5:8080"]
    served = scope("127.0.0.1:8000")
    assert origin_allowed(served, "https://dcp.example.com")
    assert origin_allowed(served, "http://10.0.0.5:8080")
    assert not origin_allowed(served, "https://dcp.example.com:8443")
    assert not origin_allowed(served, "http://10.0.0.5:8081")
    assert not origin_allowed(served, "https://sub.dcp.example.com")

"""Which browser pages may open a socket here: the dashboard's own origin, exactly."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin such as ``https://dcp.example.com:8443``; None if
    it is not an http(s) origin (``null``, a file, garbage)."""
    try:
        parts = urlsplit(url.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme]


def served_origin(scope: Any) -> tuple[str, str, int] | None:
    """The origin this handshake was served at: its scheme (``wss`` is https; behind a
    TLS proxy, Django's ``SECURE_PROXY_SSL_HEADER`` says) and its ``Host``, if that is
    one of ``ALLOWED_HOSTS``."""
    headers = {name.decode("latin-1"): value.decode("latin-1")
               for name, value in scope.get("headers", [])}
    host = headers.get("host", "")
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    secure = scope.get("scheme") == "wss"
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name, value = proxy
        header = name.removeprefix("HTTP_").replace("_", "-").lower()
        secure = headers.get(header, "").split(",")[0].strip() == value
    return _origin(f"{'https' if secure else 'http'}://{host}")


def origin_allowed(scope: Any, origin: str) -> bool:
    """Whether a browser page at ``origin`` may open a socket here: scheme, host and port
    all equal to the served origin's, or to one of ``CSRF_TRUSTED_ORIGINS`` (exact
    entries; the same list that lets such a page post forms)."""
    asked = _origin(origin)
    if asked is None:
        return False
    allowed = {_origin(trusted) for trusted in settings.CSRF_TRUSTED_ORIGINS}
    return asked == served_origin(scope) or asked in allowed


class BrowserOriginValidator:
    """Handshakes that carry an ``Origin`` header must come from the dashboard's own origin.

    Browsers always send ``Origin`` on a websocket handshake, and it is what protects a
    cookie-authenticated socket from a hostile page (cross-site websocket hijacking).
    The match is exact (:func:`origin_allowed`): a page on another port of the same host,
    or on a sibling subdomain, is refused with 403 before any consumer runs; Channels'
    ``AllowedHostsOriginValidator`` compared host names only. Programs usually send no
    ``Origin``; they are let through to authenticate with an API token like any API
    client (a cookie sent by a program is the program's own).
    """

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        origins = [v.decode("latin-1") for n, v in scope.get("headers", []) if n == b"origin"]
        if origins and not (len(origins) == 1 and origin_allowed(scope, origins[0])):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)

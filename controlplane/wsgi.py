"""WSGI entry point, for tools that speak WSGI (schemathesis in tests, a plain WSGI server).

The deployment serves controlplane.asgi (websockets need ASGI)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

application = get_wsgi_application()

from controlplane.web.request_connections import bound  # noqa: E402  (needs the apps loaded)

bound()  # a web process: every statement of a request bounded in time

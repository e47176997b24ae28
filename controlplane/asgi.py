"""ASGI entry point (Daphne): HTTP (static files included), and the websocket change feeds
and live pages (controlplane.sockets.routes).

Websockets pass the origin check (for browsers), then Django's session auth
(``AuthMiddlewareStack``); the consumers also accept an API token and check roles.
"""

import os

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

# Initialise Django (apps, settings) before anything that imports models is loaded.
django_asgi_app = get_asgi_application()

from controlplane.process.heap import settle  # noqa: E402
from controlplane.sockets.origins import BrowserOriginValidator  # noqa: E402
from controlplane.sockets.routes import websocket_urlpatterns  # noqa: E402  (needs the apps)
from controlplane.web.request_connections import bound, one_per_request  # noqa: E402

bound()  # a web process: every statement of a request bounded in time
one_per_request()  # and a request's connection closed with it

application = ProtocolTypeRouter(
    {
        # The dashboard's few static files (one stylesheet, one script, vendored htmx) are
        # served by the app itself: no separate web server or collectstatic step needed.
        "http": ASGIStaticFilesHandler(django_asgi_app),
        "websocket": BrowserOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Everything loaded so far lives as long as the process: out of the collector's walks.
settle()

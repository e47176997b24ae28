"""ASGI entry point (Daphne): HTTP now; websocket routes join with the live views."""

import os

from channels.routing import ProtocolTypeRouter
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

# Initialise Django (apps, settings) before anything that imports models is loaded.
django_asgi_app = get_asgi_application()

application = ProtocolTypeRouter({"http": django_asgi_app})

"""The websocket routes: the change feeds and the live pages' sockets."""

from __future__ import annotations

from django.urls import path, re_path

from controlplane.sockets.feed import GlobalFeedConsumer, SessionFeedConsumer
from controlplane.sockets.pages import GlobalPageConsumer, SessionPageConsumer
from controlplane.ui.live import GLOBAL_PAGES
from controlplane.web import paths  # noqa: F401 (registers <session:...>)

websocket_urlpatterns = [
    path("ws/sessions/<session:session_id>/feed/", SessionFeedConsumer.as_asgi()),
    path("ws/feed/", GlobalFeedConsumer.as_asgi()),
    path("ws/ui/sessions/<session:session_id>/", SessionPageConsumer.as_asgi()),
    re_path(rf"^ws/ui/(?P<page>{'|'.join(GLOBAL_PAGES)})/$", GlobalPageConsumer.as_asgi()),
]

"""URL routes: the API, the read-only admin, a health check; pages arrive with the UI."""

from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import path

from controlplane.api import api
from controlplane.metrics import metrics


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe: answers without touching the database or Redis."""
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("api/", api.urls),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
]

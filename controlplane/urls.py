"""URL routes. Admin and a health check for now; API and pages arrive with their issues."""

from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import path


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe: answers without touching the database or Redis."""
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
]

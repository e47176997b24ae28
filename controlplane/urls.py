"""URL routes: the dashboard (controlplane.ui) and its login pages, the API, the read-only
admin, the probes (alive, ready) and the metrics."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, JsonResponse
from django.urls import include, path

from controlplane.api import api
from controlplane.ui.login import DashboardLogin
from controlplane.web.health import readiness
from controlplane.web.metrics import metrics


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe: answers without touching the database or Redis."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness probe: 200 once the database and the broker answer and every migration is
    applied; 503 naming what is missing otherwise (controlplane.web.health)."""
    missing = readiness()
    if missing:
        return JsonResponse({"status": "unavailable", "missing": missing}, status=503)
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("api/", api.urls),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("accounts/login/", auth_views.LoginView.as_view(
        template_name="ui/login.html", authentication_form=DashboardLogin), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("controlplane.ui.urls")),
]

"""URL routes: the dashboard (controlplane.ui) and its login pages, the API, the read-only
admin, a health check and the metrics."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, JsonResponse
from django.urls import include, path

from controlplane.api import api
from controlplane.metrics import metrics
from controlplane.ui.login import DashboardLogin


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe: answers without touching the database or Redis."""
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("api/", api.urls),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("accounts/login/", auth_views.LoginView.as_view(
        template_name="ui/login.html", authentication_form=DashboardLogin), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("controlplane.ui.urls")),
]

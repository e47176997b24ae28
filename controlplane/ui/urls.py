"""The dashboard's routes (the login pages are Django's own, see controlplane.urls)."""

from django.urls import path, re_path

from . import attention, sessions, tasks, workers

urlpatterns = [
    path("", sessions.overview, name="overview"),
    path("sessions/<str:session_id>/", sessions.session, name="session"),
    path("sessions/<str:session_id>/tasks/<str:task_id>/children", sessions.children,
         name="children"),
    path("tasks/<str:task_id>/", tasks.task, name="task"),
    re_path(r"^tasks/(?P<target>[^/]+)/(?P<action>cancel|retry|resolve)$", attention.act,
            name="act"),
    re_path(r"^submissions/(?P<target>[^/]+)/(?P<action>resubmit)$", attention.act,
            name="act_on_submission"),
    path("attention/", attention.attention, name="attention"),
    path("attention/retry-failed", attention.retry_failed, name="retry_failed"),
    path("workers/", workers.workers, name="workers"),
]

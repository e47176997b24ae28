"""The dashboard's routes (the login pages are Django's own, see controlplane.urls)."""

from django.urls import path, re_path

from controlplane.ui import actions, sessions, tasks, workers
from controlplane.ui.live import GLOBAL_PAGES, activity, global_view
from controlplane.web import paths  # noqa: F401 (registers <session:...>)

urlpatterns = [
    *(path(page.path, global_view(page), name=name) for name, page in GLOBAL_PAGES.items()),
    path("sessions/<session:session_id>/", sessions.session, name="session"),
    path("sessions/<session:session_id>/history", sessions.history, name="session_history"),
    path("sessions/<session:session_id>/artifacts/<str:digest>", sessions.artifact,
         name="artifact"),
    path("sessions/<session:session_id>/conversations/<str:conversation_id>/entries",
         sessions.earlier_entries, name="earlier_entries"),
    path("sessions/<session:session_id>/tasks/<str:task_id>/children", sessions.children,
         name="children"),
    path("tasks/<str:task_id>/", tasks.task, name="task"),
    re_path(r"^tasks/(?P<target>[^/]+)/(?P<action>cancel|retry|resolve)$", actions.act,
            name="act"),
    re_path(r"^submissions/(?P<target>[^/]+)/(?P<action>resubmit)$", actions.act,
            name="act_on_submission"),
    path("tasks/<str:task_id>/restart", actions.restart, name="restart"),
    path("tasks/<str:task_id>/migrate", actions.migrate, name="migrate"),
    path("tasks/<str:task_id>/restart/preview", actions.restart_preview, name="restart_preview"),
    re_path(r"^conversations/(?P<target>[^/]+)/(?P<action>compact)$", actions.act,
            name="act_on_conversation"),
    path("sessions/<session:session_id>/calls/<str:call_id>/decide", actions.decide_call,
         name="decide_call"),
    path("tasks/<str:task_id>/resume", actions.resume_graph, name="resume_graph"),
    path("sessions/<session:session_id>/graph/runs", actions.start_graph, name="start_graph"),
    path("sessions/<session:session_id>/graph/fork", actions.fork_graph, name="fork_graph"),
    path("bulk/preview", actions.bulk_preview, name="bulk_preview"),
    path("bulk/act", actions.bulk_act, name="bulk_act"),
    path("attention/retry-failed", actions.retry_failed, name="retry_failed"),
    path("workers/", workers.workers, name="workers"),
    path("activity", activity, name="activity"),
]

"""``<session:session_id>``: the path converter naming a session in the dashboard's routes
and its sockets'."""

from django.urls import register_converter


class SessionId:
    """A session id in a path: any text, ``/`` too. New ids may not hold ``/``
    (kernel.session.check_session_id), but a session an older release stored under one is
    kept, and every page linking it must still render and reach it. Each route naming a
    session ends in fixed segments after it (``/``, ``/history``, ``/tasks/<id>/children``),
    so the id is what comes before them."""

    regex = r"[\s\S]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(SessionId, "session")

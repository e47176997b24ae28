"""What a Celery worker process runs: the process's kernel runtime (the Kernel, its
Dispatcher and its Worker), the Celery tasks that advance kernel tasks, the thread that
LISTENs for commits that made work due, and each worker's heartbeat row.

The web process uses :mod:`.runtime` too, to commit an operator's action and deliver
what it made due; it never imports :mod:`.execution`.
"""

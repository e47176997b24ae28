"""The control plane: the Django project and app that runs the kernel (see DESIGN.md §2).

Its packages are grouped by what runs them:

- ``web/``: around each HTTP request of a web process (middleware, probes, metrics);
  the requests' edges are ``api/`` (django-ninja) and ``ui/`` (the dashboard);
- ``sockets/``: a web process's websockets and long-polls (feeds, live pages, hints);
- ``worker/``: a Celery worker process (the kernel runtime, the Celery tasks, LISTEN);
- ``process/``: what every process does when it starts (entry point, logs, traces, its
  Kernel);
- ``commands/`` (state changes) and ``reads/`` (what is shown): the layers every edge
  calls; ``access.py`` and ``errors.py`` beside them; ``storage/``: Postgres;
- ``reference/``: the reference apps (email notices, the demo assistant);
- ``dev/``: development stand-ins and launchers the product never imports.

The modules left at this root are the ones Django and Celery find by name (settings,
urls, asgi, wsgi, celery, apps, models, admin; migrations/, management/,
templatetags/), the two layers and their errors and access rule, and the models'
catalogue (``model_catalog.py``), which the settings read.
"""

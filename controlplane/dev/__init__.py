"""Development tooling: stand-ins and launchers that the product never imports.

Everything here exists for the demo, the tests and the benchmarks, never for a
deployment (a boundary test, ``tests/unit/test_dev_boundary.py``, keeps it so):

- ``services``: find or start Postgres and Redis for a checkout (``make services``,
  ``python -m controlplane.dev.services ensure|status|stop|remove``);
- ``provider_server``: the local HTTP email provider, with fault knobs (stdlib only,
  run as a script by the demo's Procfile and by ``processes.start_provider``);
- ``provider_admin``: ``ProviderAdmin``, the tests' access to that provider's store,
  request log and fault knobs;
- ``smtp_server``: an SMTP stand-in in a thread (``start_smtp_server``);
- ``ports``: a free loopback port, a reserved Redis database number;
- ``processes``: one launcher for real processes (Celery worker and beat, Daphne,
  the local provider), with an environment, a log file, a readiness check, kill and
  stop;
- ``postgres`` and ``redis_server``: a throwaway Postgres cluster or ``redis-server`` of
  a test's own, to stop, restart or watch;
- ``fuzz``: the API fuzzer against a real server (``make fuzz``).

A deployment runs the provider *client* and the channels in ``controlplane.reference.notices``
against a real provider or SMTP server.
"""

"""What a web process runs around each HTTP request: the middleware (storable text,
request rates, server time, security headers), the client's address behind the proxy,
the per-request database connection settings, the probes and the Prometheus endpoint.

The views themselves are the edges in :mod:`controlplane.api` and :mod:`controlplane.ui`.
"""

"""Benchmarks: pytest tests marked ``bench``, run by ``make bench`` (not ``make test``)."""

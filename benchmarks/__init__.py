"""Benchmarks, run by ``make bench`` (``python -m benchmarks``), not by ``make test``.

Each public module measures one thing and writes its section of ``docs/benchmarks.md``;
see README.md here.
"""

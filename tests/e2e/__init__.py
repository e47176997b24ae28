"""End-to-end tests: real server processes (Daphne) and real network clients."""

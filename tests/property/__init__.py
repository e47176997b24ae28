"""The differential property test: the Postgres storage with its fast paths on, the
Postgres storage with them off, and the in-memory reference, driven in lockstep by one
random program each example (``test_storages_agree.py``), and the findings it made, as
deterministic regression tests (``test_findings.py``)."""

"""Names as long as a storage may find a record by (:data:`kernel.values.NAME_BYTES`)."""

from __future__ import annotations

from hashlib import sha256


def incompressible(length: int) -> str:
    """ASCII text that Postgres's compression of an index entry does not shrink."""
    blocks = (sha256(str(i).encode()).hexdigest() for i in range(length // 64 + 1))
    return "".join(blocks)[:length]

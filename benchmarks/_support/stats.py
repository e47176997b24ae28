"""Latency statistics as every report gives them: nearest-rank percentiles in milliseconds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Stats:
    """Latency summary in milliseconds."""

    count: int
    p50: float
    p90: float
    p99: float
    mean: float
    max: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Stats:
        if not seconds:
            raise ValueError("no samples")
        ordered = sorted(s * 1000.0 for s in seconds)
        return cls(
            count=len(ordered),
            p50=percentile(ordered, 50),
            p90=percentile(ordered, 90),
            p99=percentile(ordered, 99),
            mean=sum(ordered) / len(ordered),
            max=ordered[-1],
        )


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted samples: a value that was actually observed."""
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]

"""The abuse benchmark's operator-page part (``benchmarks/_abuse_pages.py``), run tiny
against the test database: its seeding, its real Daphne, the operator's socket, the
viewer's sockets and searches, and its report stay working (``make bench`` is not in
``make test``). Checks shapes, never speed."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from benchmarks import _abuse_pages, abuse
from controlplane.dev.ports import reserved_redis_url
from tests.databases import url_of_test_database


@pytest.fixture
def redis_url() -> Iterator[str]:
    with reserved_redis_url() as url:
        yield url


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.django_db(transaction=True)
def test_both_phases_see_every_commit_and_the_report_says_the_ratio(redis_url: str) -> None:
    quiet, abused = _abuse_pages.run(url_of_test_database(), redis_url, tasks=200, commits=2,
                                     interval=0.05, warmup=2, rounds=2)
    for phase in (quiet, abused):  # two rounds of 2, pooled
        assert phase.samples.count == 4 and phase.missing == 0, phase
        assert [r.count for r in phase.rounds] == [2, 2]
    assert quiet.requests == 0
    # The viewer's two threads asked (its 20 sockets are not counted here) and every
    # answer was counted, a refusal (429) included.
    assert abused.requests > 0 and 0 <= abused.refused <= abused.requests
    args = argparse.Namespace(tasks=200, commits=2, interval=0.05, viewer_does="requests",
                              server_share=0.5, server_burst=_abuse_pages.SERVER_BURST,
                              rounds=2)
    section, met = abuse.render_pages(args, quiet, abused, (1.0, 1.0, 1.0), (2.0, 2.0, 2.0))
    assert section.startswith(abuse.PAGES_HEADING + "\n")
    assert "200 tasks copied in" in section and "2 commits are made 50 ms apart" in section
    assert "2 rounds of both phases" in section and "Each round's p99" in section
    assert "in this run the searches only" in section
    assert "budget of server time (0.5 s a second, 5 s at once)" in section
    assert f"| quiet | 4 | 0 | {quiet.samples.p50:.0f} |" in section
    assert f"| {abused.name} | 4 | 0 |" in section and f"{abused.requests} (" in section
    ratio = abused.samples.p99 / quiet.samples.p99
    assert f"**{ratio:.2f}x**" in section and met == (ratio <= 2)

"""The commit benchmark's wait sampler (benchmarks._support.postgres), without a server:
what it averages, and over when."""

from __future__ import annotations

from benchmarks._support import WaitSampler


def test_waits_are_averaged_over_the_samples_of_the_timed_window_only() -> None:
    sampler = WaitSampler("postgresql://postgres@127.0.0.1:5432/durable_bench_x")
    assert sampler.database == "durable_bench_x"
    sampler.samples = [
        (1.0, ["idle, Client: ClientRead"]),  # set-up, before the window
        (2.0, ["active, Lock: object (COMMIT)", "idle, Client: ClientRead"]),
        (3.0, ["active, Lock: object (COMMIT)", "active, Lock: object (COMMIT)"]),
        (9.0, ["idle, Client: ClientRead"] * 8),  # after it
    ]
    assert sampler.averages(2.0, 3.0) == {
        "active, Lock: object (COMMIT)": 1.5,
        "idle, Client: ClientRead": 0.5,
    }
    assert list(sampler.averages()) == ["idle, Client: ClientRead",
                                         "active, Lock: object (COMMIT)"]
    assert sampler.averages(4.0, 5.0) == {}  # no sample in the window

"""What more than one benchmark uses, and the one place benchmarks import it from.

A benchmark module imports ``benchmarks._support`` and nothing else of this package (no
other benchmark, no submodule of this one): ``tests/unit/test_benchmark_layout.py``
holds every module to that. The parts, by what they hold:

- ``start``: the options every benchmark has, Django set up on its own fresh database;
- ``postgres``: that database on the configured server, the server's settings, and
  where its backends wait (:class:`WaitSampler`);
- ``stats``: latency statistics (:class:`Stats`, nearest-rank percentiles);
- ``report``: progress lines on stderr, and each benchmark's section of
  ``docs/benchmarks.md``;
- ``machine``: the machine, its load and the revision a run measured;
- ``delivery``: a kernel whose commits deliver to a run's own Redis database;
- ``workers``: real workers and beat (:class:`Cluster`) and what their logs say;
- ``noop``: the no-op task kind, its client (:class:`Driver`) and its workers;
- ``sessions``: sessions seeded in SQL, and small commits.
"""

from benchmarks._support.delivery import ThreadProducers, delivering_kernel
from benchmarks._support.machine import (
    code_revision,
    cpu_model,
    load_average,
    machine_facts,
    machine_state,
)
from benchmarks._support.noop import (
    KIND,
    TASK_MODULE,
    Driver,
    FailedDeliveries,
    Submitted,
    cluster,
    register,
)
from benchmarks._support.postgres import (
    BENCH_DATABASE,
    DEFAULT_DATABASE_URL,
    WaitSampler,
    database_url,
    recreate_database,
    server_facts,
)
from benchmarks._support.report import (
    EARLIER_RUNS,
    REPORT,
    ROOT,
    progress,
    publish,
    replace_section,
    write_section,
)
from benchmarks._support.sessions import commit_one, seed_session, seed_tasks
from benchmarks._support.start import fresh_database, parse_arguments, setup_django
from benchmarks._support.stats import Stats, percentile
from benchmarks._support.workers import Activity, Cluster

__all__ = [
    "BENCH_DATABASE",
    "DEFAULT_DATABASE_URL",
    "EARLIER_RUNS",
    "KIND",
    "REPORT",
    "ROOT",
    "TASK_MODULE",
    "Activity",
    "Cluster",
    "Driver",
    "FailedDeliveries",
    "Stats",
    "Submitted",
    "ThreadProducers",
    "WaitSampler",
    "cluster",
    "code_revision",
    "commit_one",
    "cpu_model",
    "database_url",
    "delivering_kernel",
    "fresh_database",
    "load_average",
    "machine_facts",
    "machine_state",
    "parse_arguments",
    "percentile",
    "progress",
    "publish",
    "recreate_database",
    "register",
    "replace_section",
    "seed_session",
    "seed_tasks",
    "server_facts",
    "setup_django",
    "write_section",
]

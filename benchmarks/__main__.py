"""Run the benchmark modules: ``python -m benchmarks`` (what ``make bench`` runs).

A benchmark module is any module of this package whose name does not start with
``_`` and that defines ``main(argv) -> int``; they run in name order, so adding a
benchmark needs no change here. Usage::

    python -m benchmarks                          # every module, default options
    python -m benchmarks commit                   # only benchmarks/commit.py
    python -m benchmarks commit -- --count 500    # options after -- go to each module

Options are not passed to every module by default because each module has its own.

Each module runs in a fresh interpreter (``python -m benchmarks.<name>``): a module
points Django at its own database, and Django's settings can be configured only once
per process; a fresh process also starts without the connections, threads and child
processes that the previous benchmark left behind.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import benchmarks
from benchmarks._support import progress


def modules() -> list[str]:
    """The benchmark modules' short names, in the order they run."""
    return sorted(
        info.name
        for info in pkgutil.iter_modules(benchmarks.__path__)
        if not info.name.startswith("_")
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    names, options = args, []
    if "--" in args:
        cut = args.index("--")
        names, options = args[:cut], args[cut + 1 :]
    known = modules()
    if any(name in ("-h", "--help") for name in names):
        print(__doc__.strip() + "\n\nBenchmarks: " + ", ".join(known)
              + "\n(each has its own --help: python -m benchmarks.<name> --help)")
        return 0
    unknown = [name for name in names if name not in known]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {known}", file=sys.stderr)
        return 2
    status = 0
    for name in names or known:
        module = importlib.import_module(f"benchmarks.{name}")
        entry = getattr(module, "main", None)
        if entry is None:
            continue
        progress(f"== benchmarks.{name}")
        command = [sys.executable, "-m", f"benchmarks.{name}", *options]
        # abs(): a module killed by a signal has a negative return code
        status = max(status, abs(subprocess.run(command, check=False).returncode))
    return status


if __name__ == "__main__":
    raise SystemExit(main())

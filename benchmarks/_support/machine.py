"""The machine and the code a run measured: the facts a reader needs to compare one run
with another, the load around it, and the revision under test.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess

import psycopg

from benchmarks._support.postgres import server_facts
from benchmarks._support.report import ROOT


def machine_state(load: str | float, cpus: int | None = None) -> str:
    """How busy the machine was, from a 1-minute load average read around the run: a
    report says it was loaded only when it was (more runnable work than cores), so an
    idle run's figures are not marked as noisy, nor a busy run's passed off as quiet."""
    cores = cpus or os.cpu_count() or 1
    try:
        busy = float(str(load).split()[0]) > cores
    except (ValueError, IndexError):
        return "The machine's load was not read"
    if busy:
        return "**The machine was loaded by other work during this run**"
    return "The machine was otherwise idle during this run"


def machine_facts(url: str) -> dict[str, str]:
    """The facts a reader needs to compare this run with another."""
    import django

    with psycopg.connect(url, autocommit=True) as conn:
        facts = server_facts(conn)
    facts["nproc"] = str(len(os.sched_getaffinity(0)))
    facts["cpu"] = cpu_model()
    facts["python"] = platform.python_version()
    facts["psycopg"] = psycopg.__version__
    facts["django"] = django.__version__
    facts["django_debug"] = os.environ.get("DJANGO_DEBUG", "")
    facts["load_start"] = f"{os.getloadavg()[0]:.2f}"
    return facts


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, as the reports print them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def code_revision() -> tuple[str, str]:
    """The code under test: a label (commit, and whether kernel/ or controlplane/ differ
    from it) and a fingerprint of the exact text, to notice a change during the run.

    Workers import the code when they start, and a run starts workers more than once.
    """

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    diff = git("diff", "HEAD", "--", "kernel", "controlplane")
    label = f"`{head}`" + (" with uncommitted changes in kernel/ or controlplane/" if diff else "")
    return label, head + hashlib.sha1(diff.encode()).hexdigest()

"""Hosts on this machine: network namespaces, each joined to it by a veth pair (``ip netns``).

A :class:`Host` is a network namespace with one link to this machine's own namespace:
a veth pair with ``A.B.C.1`` on this side (where a test's private Postgres, Redis and
provider listen) and ``A.B.C.2`` inside. A process started through :attr:`Host.via`
(``ip netns exec NS``, which execs the command and so keeps its pid) sees only that
link: it reaches the servers over it or not at all. :meth:`Host.cut` takes this side of
the link down, as a failed switch port would: packets are dropped, no connection is
reset, and a process inside keeps running and retrying; :meth:`Host.restore` brings it
back, and what it sent meanwhile is retransmitted.

Namespaces and links carry this process's pid in their names (``dh<pid><letter>``,
short enough for an interface name), so parallel runs never collide, and a later run
removes what a killed run left behind. Creating them needs root (CAP_NET_ADMIN):
without it, :func:`hosts` skips the test and says why.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import string
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import pytest

PREFIX = "dh"
OURS = re.compile(rf"^{PREFIX}(\d+)[a-z]$")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=10)


@dataclass(frozen=True)
class Host:
    namespace: str
    device: str  # this side of the veth pair
    address: str  # this side's address: what processes inside connect to
    inside: str  # the namespace's own address

    @property
    def via(self) -> list[str]:
        """The command prefix that runs a process on this host."""
        return ["ip", "netns", "exec", self.namespace]

    def cut(self) -> None:
        ip("link", "set", self.device, "down")

    def restore(self) -> None:
        ip("link", "set", self.device, "up")

    def reaches(self, port: int) -> bool:
        """Whether a TCP connection from inside reaches ``address:port`` within a second."""
        probe = ("import socket; socket.create_connection("
                 f"({self.address!r}, {port}), timeout=1).close()")
        done = subprocess.run([*self.via, "python3", "-c", probe], capture_output=True,
                              timeout=10)
        return done.returncode == 0


def _delete(namespace: str) -> None:
    # Deleting one end of a veth pair deletes both; the namespace goes once its last
    # process has ended (the test kills them first).
    ip("link", "del", namespace + "h", check=False)
    ip("netns", "del", namespace, check=False)


def _remove_leftovers() -> None:
    """Namespaces of runs whose process is gone (killed before their clean-up ran)."""
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        found = OURS.match(name)
        if found and not os.path.exists(f"/proc/{found.group(1)}"):
            _delete(name)


def _free_subnet() -> str:
    """``10.X.Y`` of a /30 that no address on this machine is in yet."""
    taken = ip("-4", "-o", "addr", "show", check=False).stdout
    while True:
        subnet = f"10.{random.randrange(200, 250)}.{random.randrange(256)}"
        if f" {subnet}." not in taken:
            return subnet


def _create(namespace: str) -> Host:
    subnet = _free_subnet()
    host = Host(namespace, namespace + "h", f"{subnet}.1", f"{subnet}.2")
    inner = namespace + "n"
    ip("netns", "add", namespace)
    try:
        ip("link", "add", host.device, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", namespace)
        ip("addr", "add", f"{host.address}/30", "dev", host.device)
        ip("link", "set", host.device, "up")
        ip("-n", namespace, "addr", "add", f"{host.inside}/30", "dev", inner)
        ip("-n", namespace, "link", "set", inner, "up")
        ip("-n", namespace, "link", "set", "lo", "up")
    except subprocess.CalledProcessError:
        _delete(namespace)
        raise
    return host


@contextmanager
def hosts(count: int) -> Iterator[list[Host]]:
    """``count`` hosts; their namespaces and links are removed when the block ends, however
    it ends. Skips the test, saying why, where namespaces cannot be made."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (Debian's iproute2) to make network namespaces with")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add, veth links): not root here")
    _remove_leftovers()
    made: list[Host] = []
    try:
        for letter in string.ascii_lowercase[:count]:
            namespace = f"{PREFIX}{os.getpid()}{letter}"
            _delete(namespace)  # an earlier test of this process that did not finish
            try:
                made.append(_create(namespace))
            except subprocess.CalledProcessError as exc:
                pytest.skip(f"cannot make a network namespace here: {exc.stderr.strip()}")
        yield made
    finally:
        for host in made:
            with suppress(subprocess.SubprocessError):
                _delete(host.namespace)

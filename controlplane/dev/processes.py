"""One launcher for the real processes of the tests and the benchmarks.

A :class:`Process` is a command, an environment and a log file: :meth:`~Process.spawn`
starts it (in a process group of its own by default, so that a kill hits nothing
else), :meth:`~Process.wait_ready` waits until it says it is up (a line in its log,
or a check such as an HTTP answer) or fails with its log if it exited, and
:meth:`~Process.kill` (SIGKILL: a crash), :meth:`~Process.stop` (SIGTERM, then
SIGKILL) end it; :meth:`~Process.run` runs a one-off command to its end. A stopped
or killed process can be spawned again, with the same command (a server keeps its
port).

The processes, by name:

- :func:`celery_worker`: a solo-pool worker of this project's Celery app
  (:class:`CeleryWorker`: what its log says each ``advance`` returned; its lease
  owner);
- :func:`celery_beat`: beat with a schedule file beside its log;
- :class:`Daphne`: ``daphne controlplane.asgi:application`` on a port of its own,
  ready once ``/healthz`` answers;
- :func:`start_provider`: the local email provider (``provider_server.py``) on a free
  port, ready once it printed where it listens (:class:`RunningProvider`).

:func:`process_env` builds their environment, :func:`running` starts several side by
side and kills them at the end, :func:`wait_for` is the poll every caller uses.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from controlplane.dev.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
# This project's Celery, as a command for real worker and beat processes.
CELERY = [sys.executable, "-m", "celery", "-A", "controlplane.celery"]
DAPHNE = str(Path(sys.executable).parent / "daphne")
QUEUES = "default,hands,brain"
WORKER_READY = " ready."  # what a worker's log says once it consumes its queues
ADVANCED = re.compile(r"controlplane\.advance\[[^]]+\] succeeded in \S+: (True|False)")
WOKEN = re.compile(r"controlplane\.wake\[[^]]+\] succeeded in \S+: (\d+)")
START_TIMEOUT = 60.0

T = TypeVar("T")


def wait_for(check: Callable[[], T], what: str, timeout: float = 30.0, every: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; raise naming ``what`` otherwise.

    The benchmarks and the tests watch real processes the same way."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def process_env(
    database_url: str | None = None, redis_url: str | None = None, **extra: str
) -> dict[str, str]:
    """This process's environment, pointed at ``database_url`` and ``redis_url`` (where
    given), unbuffered (a log shows what happened up to a kill), plus ``extra``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return {**env, **extra}


class ProcessExited(RuntimeError):
    """A process ended while we waited for it to be ready."""


class Process:
    """A command run as a real process, its output in ``log``.

    ``ready_line``: ready once the log written since the spawn holds it; ``ready_check``:
    ready once it returns true; neither: ready once spawned. ``append`` keeps what
    earlier runs wrote to the log. ``log=None`` pipes stdout to the caller
    (``popen.stdout``) and leaves stderr inherited.
    """

    def __init__(
        self,
        name: str,
        command: list[str],
        *,
        log: Path | None,
        env: dict[str, str] | None = None,
        cwd: Path | None = ROOT,
        ready_line: str | None = None,
        ready_check: Callable[[], bool] | None = None,
        new_session: bool = True,
        append: bool = False,
        user: str | None = None,
    ) -> None:
        self.name = name
        self.command = command
        self.log = log
        self.env = env
        self.cwd = cwd
        self.ready_line = ready_line
        self.ready_check = ready_check
        self.new_session = new_session
        self.append = append
        self.user = user
        self._popen: subprocess.Popen[bytes] | None = None
        self.started = 0.0  # wall clock at the last spawn, comparable with commit stamps
        self.ready_at: float | None = None
        self._seen = 0  # how far the log has been searched for ``ready_line``

    def spawn(self) -> Process:
        """Start the process and return at once (start several, then wait for each)."""
        assert not self.alive, f"{self.name} is already running"
        kwargs: dict[str, Any] = dict(
            cwd=self.cwd, env=self.env, start_new_session=self.new_session, user=self.user
        )
        if self.log is None:
            self._popen = subprocess.Popen(self.command, stdout=subprocess.PIPE, **kwargs)
        else:
            with self.log.open("ab" if self.append else "wb") as out:
                self._seen = out.tell()
                self._popen = subprocess.Popen(
                    self.command, stdout=out, stderr=subprocess.STDOUT, **kwargs
                )
        self.started, self.ready_at = time.time(), None
        return self

    def start(self, timeout: float = START_TIMEOUT) -> Process:
        """Spawn, and return once ready."""
        return self.spawn().wait_ready(timeout)

    def run(self, timeout: float = START_TIMEOUT) -> Process:
        """Spawn and wait until it exits (a one-off command: a migration, a management
        command); :class:`ProcessExited` with its log unless it exited 0."""
        self.spawn()
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"{self.name} ran past {timeout:g}s:\n{self.output()}") from None
        if code != 0:
            raise ProcessExited(f"{self.name} exited ({code}):\n{self.output()}")
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT, every: float = 0.05) -> Process:
        """Wait until ready; :class:`ProcessExited` with its log if it exits first."""
        wait_for(lambda: self.ready() or not self.alive, f"{self.name} to start", timeout, every)
        if not self.alive:
            raise ProcessExited(f"{self.name} exited ({self.popen.returncode}):\n{self.output()}")
        return self

    def ready(self) -> bool:
        """Whether it said (or answered) that it is up; remembers when (``ready_at``)."""
        if self.ready_at is None and self._popen is not None and self._says_ready():
            self.ready_at = time.time()
        return self.ready_at is not None

    def _says_ready(self) -> bool:
        if self.ready_line is not None:
            if self.log is None or not self.log.exists():
                return False
            with self.log.open("rb") as f:  # only what was written since the last look
                f.seek(self._seen)
                chunk = f.read()
            found = self.ready_line.encode() in chunk
            # keep a tail, in case the line is split across two reads
            self._seen += max(0, len(chunk) - len(self.ready_line))
            if not found:
                return False
        return self.ready_check is None or self.ready_check()

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        assert self._popen is not None, f"{self.name} was never started"
        return self._popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def kill(self, wait: bool = True) -> None:
        """SIGKILL: no cleanup, no acks, no goodbye - a crash."""
        if self.alive:
            self.popen.send_signal(signal.SIGKILL)
        if wait and self._popen is not None:
            self._popen.wait(timeout=10)

    def terminate(self) -> None:
        """SIGTERM, without waiting (stop several at once, then :meth:`stop` each)."""
        if self.alive:
            self.popen.terminate()

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """Ask it to end (``sig``); SIGKILL if it has not within ``timeout`` seconds."""
        if self.alive:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._popen is not None:
            self._popen.wait(timeout=10)

    def suspend(self) -> None:
        self.popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.popen.send_signal(signal.SIGCONT)

    def output(self) -> str:
        """Its log so far."""
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")

    def cpu_seconds(self) -> float:
        """User + system CPU the process has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def running(*processes: Process, timeout: float = START_TIMEOUT) -> Iterator[tuple[Process, ...]]:
    """Start ``processes`` side by side, wait for each; kill them all at the end."""
    try:
        for process in processes:
            process.spawn()
        for process in processes:
            process.wait_ready(timeout)
        yield processes
    finally:
        for process in processes:
            process.kill()


# -- Celery -------------------------------------------------------------------------------


class CeleryWorker(Process):
    """A worker process; its log (``-l info``) tells what each task message returned."""

    @property
    def lease_owner(self) -> str:
        """The owner the kernel writes into a lease (``controlplane.worker.execution.runtime``)."""
        return f"{socket.gethostname()}:{self.pid}"

    def advances(self) -> list[bool]:
        """What each "advance" message this worker handled returned, by its log: True
        where it claimed the task and ran it, False where the claim found nothing to do
        (a duplicate or late message)."""
        return [found == "True" for found in ADVANCED.findall(self.output())]

    def woken(self) -> int:
        """How many tasks this worker ran from queue messages (a burst's, or a backlog's
        that no listening worker claimed within the grace), by its log."""
        return sum(int(ran) for ran in WOKEN.findall(self.output()))

    def announced(self) -> int:
        """How many tasks this worker's announcement reader ran, by its log
        (:mod:`controlplane.worker.announcements`)."""
        from controlplane.worker.announcements import STARTED

        return len(re.findall(re.escape(STARTED).replace("%s", r"\S+"), self.output()))


def celery_worker(
    logs: Path, name: str, env: dict[str, str], *, queues: str = QUEUES, host: str = "dev",
    via: Sequence[str] = (),
) -> CeleryWorker:
    """A solo-pool worker ``name@host`` on ``queues``, logging to ``logs/name.log``; ready
    once it consumes its queues. Not started: :meth:`~Process.spawn` or ``start`` it.

    ``via``: a command that runs it elsewhere and then execs it, keeping its pid (``ip
    netns exec NS``: a host of its own on this machine)."""
    return CeleryWorker(
        name,
        [*via, *CELERY, "worker", "-P", "solo", "-Q", queues, "-n", f"{name}@{host}",
         "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "info"],
        log=logs / f"{name}.log", env=env, ready_line=WORKER_READY,
    )


def celery_beat(
    logs: Path, env: dict[str, str], *, name: str = "beat", ready_line: str | None = None,
    via: Sequence[str] = (),
) -> Process:
    """Beat, logging to ``logs/name.log`` with its schedule file beside it; ready once
    spawned, or once its log says ``ready_line``. Not started; ``via`` as for
    :func:`celery_worker`.

    At DEBUG: its line for each sweep it sends is routine (controlplane.process.logs), which the
    tests count."""
    return Process(
        name,
        [*via, *CELERY, "beat", "-s", str(logs / f"{name}-schedule"), "-l", "debug"],
        log=logs / f"{name}.log", env=env, ready_line=ready_line,
    )


# -- Daphne -------------------------------------------------------------------------------


class Daphne(Process):
    """``daphne controlplane.asgi:application`` on ``port`` (default: a free one), ready
    once ``/healthz`` answers; spawned again after a kill, it listens on the same port
    and appends to the same log."""

    def __init__(
        self,
        log: Path,
        env: dict[str, str],
        *,
        port: int | None = None,
        websocket_timeout: float | str | None = None,
        name: str = "daphne",
    ) -> None:
        self.port = port or free_port()
        timeout = [] if websocket_timeout is None else ["--websocket_timeout",
                                                         str(websocket_timeout)]
        super().__init__(
            name,
            [DAPHNE, "-b", "127.0.0.1", "-p", str(self.port), *timeout,
             "controlplane.asgi:application"],
            log=log, env=env, ready_check=self._answers, new_session=False, append=True,
        )

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http}/healthz", timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def login(self, username: str, password: str) -> urllib.request.OpenerDirector:
        """An HTTP client logged in through the login form, as a browser is (session
        cookie and CSRF token)."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        form = opener.open(f"{self.http}/accounts/login/", timeout=10).read().decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        if csrf is None:
            raise RuntimeError("the login form has no CSRF token")
        data = urllib.parse.urlencode({"username": username, "password": password,
                                       "csrfmiddlewaretoken": csrf.group(1)}).encode()
        opener.open(urllib.request.Request(f"{self.http}/accounts/login/", data=data),
                    timeout=10)
        if not any(cookie.name == "sessionid" for cookie in jar):
            raise RuntimeError(f"login as {username} failed")
        return opener


# -- the local email provider -------------------------------------------------------------

# The server is run as a script rather than with -m so that starting it never
# imports the controlplane package (and whatever Django or Celery setup that
# package's __init__ may do): it is a standalone, stdlib-only program.
PROVIDER_SCRIPT = Path(__file__).with_name("provider_server.py")
PROVIDER_STARTUP_TIMEOUT_S = 10.0
PROVIDER_STOP_TIMEOUT_S = 5.0
_LISTENING = re.compile(r"listening on (http://\S+)")


class RunningProvider:
    """A provider subprocess bound to one port, which stays the same across restarts.

    Keeping the port means a worker configured with the provider's URL reaches the
    restarted provider without being told anything. A real process (not a thread of
    the test) is what lets chaos tests SIGKILL a worker, or the provider itself, and
    still ask the provider what it received.
    """

    def __init__(
        self, state_file: Path | None, fault_flags: dict[str, Any], host: str = "127.0.0.1"
    ) -> None:
        self._state_file = state_file
        self._fault_flags = fault_flags
        self._host = host
        self._port = 0
        self._process: Process | None = None
        self.url = ""
        self._launch()

    def _command(self) -> list[str]:
        command = [sys.executable, str(PROVIDER_SCRIPT), "--host", self._host,
                   "--port", str(self._port)]
        if self._state_file is not None:
            command += ["--state-file", str(self._state_file)]
        for knob, value in self._fault_flags.items():
            command += [f"--{knob.replace('_', '-')}", json.dumps(value)]
        return command

    def _launch(self) -> None:
        # stderr is inherited, so server errors show up in the test output and an
        # unread pipe can never fill up and block the server.
        process = Process("provider", self._command(), log=None, cwd=None, new_session=False)
        stdout = process.spawn().popen.stdout
        assert stdout is not None
        # The first line is printed once the port is bound (or EOF if the server died).
        ready, _, _ = select.select([stdout], [], [], PROVIDER_STARTUP_TIMEOUT_S)
        line = stdout.readline().decode(errors="replace") if ready else ""
        match = _LISTENING.search(line)
        if match is None:
            process.kill()
            stdout.close()
            raise RuntimeError(
                f"email provider did not start (exit code {process.popen.returncode}, "
                f"said {line!r})"
            )
        self._process = process
        self._port = int(match.group(1).rsplit(":", 1)[1])
        # Bound to every address (0.0.0.0), it is still asked on loopback from here.
        self.url = f"http://127.0.0.1:{self._port}" if self._host == "0.0.0.0" else match.group(1)

    @property
    def port(self) -> int:
        return self._port

    def stop(self) -> None:
        """Stop the provider gracefully (SIGTERM), killing it if it does not exit."""
        if self._process is not None:
            self._process.stop(timeout=PROVIDER_STOP_TIMEOUT_S)
            self._forget_process()

    def kill(self) -> None:
        """SIGKILL the provider: nothing it has not yet written to its state file survives."""
        if self._process is not None:
            self._process.kill()
            self._forget_process()

    def restart(self) -> None:
        """Stop the provider if it runs, then start it again on the same port and flags."""
        self.stop()
        self._launch()

    def _forget_process(self) -> None:
        assert self._process is not None and self._process.popen.stdout is not None
        self._process.popen.stdout.close()
        self._process = None

    def __enter__(self) -> RunningProvider:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def start_provider(
    state_file: Path | None = None, *, host: str = "127.0.0.1", **fault_flags: Any
) -> RunningProvider:
    """Start a provider on a free port; use it as a context manager to stop it.

    ``fault_flags`` are start-up fault knobs named as in PUT /faults, e.g.
    ``start_provider(error_rate=0.5, drop_after_accept={"nth": 4})``. ``host``: the
    address it binds (``0.0.0.0`` for clients in other network namespaces too).
    """
    return RunningProvider(state_file, fault_flags, host)

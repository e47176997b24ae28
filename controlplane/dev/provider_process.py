"""Start the local email provider as a real subprocess, for tests and the demo.

A real process (not a thread of the test) is what lets chaos tests SIGKILL a
worker, or the provider itself, and still ask the provider what it received.
"""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

# The server is run as a script rather than with -m so that starting it never
# imports the controlplane package (and whatever Django or Celery setup that
# package's __init__ may do): it is a standalone, stdlib-only program.
SERVER_SCRIPT = Path(__file__).with_name("provider_server.py")
STARTUP_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
_LISTENING = re.compile(r"listening on (http://\S+)")


class RunningProvider:
    """A provider subprocess bound to one port, which stays the same across restarts.

    Keeping the port means a worker configured with the provider's URL reaches the
    restarted provider without being told anything.
    """

    def __init__(self, state_file: Path | None, fault_flags: dict[str, Any]) -> None:
        self._state_file = state_file
        self._fault_flags = fault_flags
        self._port = 0
        self._process: subprocess.Popen[str] | None = None
        self.url = ""
        self._launch()

    def _command(self) -> list[str]:
        command = [sys.executable, str(SERVER_SCRIPT), "--host", "127.0.0.1",
                   "--port", str(self._port)]
        if self._state_file is not None:
            command += ["--state-file", str(self._state_file)]
        for knob, value in self._fault_flags.items():
            command += [f"--{knob.replace('_', '-')}", json.dumps(value)]
        return command

    def _launch(self) -> None:
        # stderr is inherited, so server errors show up in the test output and an
        # unread pipe can never fill up and block the server.
        process = subprocess.Popen(self._command(), stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        # The first line is printed once the port is bound (or EOF if the server died).
        ready, _, _ = select.select([process.stdout], [], [], STARTUP_TIMEOUT_S)
        line = process.stdout.readline() if ready else ""
        match = _LISTENING.search(line)
        if match is None:
            process.kill()
            process.wait()
            raise RuntimeError(
                f"email provider did not start (exit code {process.returncode}, said {line!r})"
            )
        self._process = process
        self.url = match.group(1)
        self._port = int(self.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        """Stop the provider gracefully (SIGTERM), killing it if it does not exit."""
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._forget_process()

    def kill(self) -> None:
        """SIGKILL the provider: nothing it has not yet written to its state file survives."""
        if self._process is None:
            return
        self._process.send_signal(signal.SIGKILL)
        self._process.wait()
        self._forget_process()

    def restart(self) -> None:
        """Stop the provider if it runs, then start it again on the same port and flags."""
        self.stop()
        self._launch()

    def _forget_process(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        self._process.stdout.close()
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


def start_provider(state_file: Path | None = None, **fault_flags: Any) -> RunningProvider:
    """Start a provider on a free port; use it as a context manager to stop it.

    ``fault_flags`` are start-up fault knobs named as in PUT /faults, e.g.
    ``start_provider(error_rate=0.5, drop_after_accept={"nth": 4})``.
    """
    return RunningProvider(state_file, fault_flags)

"""Run the stub server as a local child process on 127.0.0.1 (tests, benchmarks, the host tier).

The child is started through ``vmtests.driver.procs`` (own session, PR_SET_PDEATHSIG, killed at
exit), its stdout is collected line by line by a reader thread, and every wait is bounded and
says what it waited for and what it saw last.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType

from vmtests.contracts.paths import PACKAGE_DIR
from vmtests.driver import procs
from vmtests.driver.errors import WaitTimeout

READY_LINE = "Application startup complete."
PACKAGE_PARENT = PACKAGE_DIR.parent
"""The directory holding the ``vmtests`` package: the local server's ``PYTHONPATH``."""
TAIL_LINES = 30


def with_endpoint(args: Sequence[str], host: str, port: int) -> list[str]:
    """``args`` with ``--host``/``--port`` replaced (or added), e.g. the core's production args."""
    result: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in {"--host", "--port"}:
            skip = True
            continue
        result.append(arg)
    return [*result, "--host", host, "--port", str(port)]


class LocalStubServer:
    """One ``python3 -m vmtests.stub.server`` child; use as a context manager."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.port = procs.free_port()
        self.host = "127.0.0.1"
        self.args = with_endpoint(args, self.host, self.port)
        self.env = dict(env or {})
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123``."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """The server's pid (raises when not started)."""
        if self._proc is None:
            raise RuntimeError("the stub server was not started")
        return self._proc.pid

    def start(self) -> LocalStubServer:
        """Spawn the server (stdout and stderr merged, collected by a reader thread)."""
        environment = {**os.environ, **self.env}
        environment["PYTHONPATH"] = os.pathsep.join(
            part for part in (str(PACKAGE_PARENT), environment.get("PYTHONPATH", "")) if part
        )
        environment["PYTHONUNBUFFERED"] = "1"
        self._proc = procs.spawn(
            [sys.executable, "-m", "vmtests.stub.server", *self.args],
            "stub server",
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=environment,
        )
        self._reader = threading.Thread(target=self._read, name="stub-reader", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        stream = None if self._proc is None else self._proc.stdout
        if stream is None:
            return
        for raw in stream:
            with self._lock:
                self.lines.append(raw.decode("utf-8", errors="replace").rstrip("\n"))

    def output(self) -> str:
        """Everything the server printed so far."""
        with self._lock:
            return "\n".join(self.lines)

    def tail(self) -> str:
        """The last lines printed (for failure messages)."""
        with self._lock:
            return "\n".join(self.lines[-TAIL_LINES:]) or "(no output)"

    def wait_for_line(self, text: str, timeout: float) -> str:
        """Wait until a printed line contains ``text``; raise ``WaitTimeout`` if it never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for line in self.lines:
                    if text in line:
                        return line
            if self._proc is not None and self._proc.poll() is not None and self._drained():
                break
            time.sleep(0.02)
        rc = None if self._proc is None else self._proc.poll()
        raise WaitTimeout(f"stub server line {text!r} (rc={rc})", timeout, self.tail())

    def _drained(self) -> bool:
        return self._reader is None or not self._reader.is_alive()

    def wait_ready(self, timeout: float = 30.0) -> LocalStubServer:
        """Wait for uvicorn's ``Application startup complete.`` line."""
        self.wait_for_line(READY_LINE, timeout)
        return self

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to exit; return its status (all output collected)."""
        assert self._proc is not None
        try:
            rc = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise WaitTimeout("the stub server to exit", timeout, self.tail()) from None
        if self._reader is not None:
            self._reader.join(timeout=5.0)
        procs.unregister(self._proc.pid)
        return rc

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the server process."""
        if self._proc is None:
            raise RuntimeError("the stub server was not started")
        self._proc.send_signal(signum)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM the server (a graceful stop, like ``docker stop``); return its exit status."""
        self.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> None:
        """Kill the server and its group if still running (finalizers call this)."""
        if self._proc is not None:
            procs.reap(self._proc, grace=2.0)
            if self._reader is not None:
                self._reader.join(timeout=5.0)

    def __enter__(self) -> LocalStubServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.kill()

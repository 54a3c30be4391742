"""Host-side plumbing of the QEMU backend: sockets, QMP, the backdoor transport, cleanup."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qemu.qmp.legacy import QEMUMonitorProtocol

from vmtests.driver import keep, procs
from vmtests.driver.errors import DriverError, MachineGone, WaitTimeout
from vmtests.driver.qemu_launch import LaunchSpec, Sockets

if TYPE_CHECKING:
    from vmtests.driver.qemu import QemuMachine


class SocketTransport:
    """``Transport`` over the accepted backdoor socket; notices when QEMU exits."""

    def __init__(self, machine: QemuMachine, connection: socket.socket) -> None:
        self._machine = machine
        self._connection = connection
        connection.settimeout(60.0)  # bounds sendall when the guest stops reading

    def send(self, data: bytes) -> None:
        """Write ``data`` to the backdoor."""
        try:
            self._connection.sendall(data)
        except OSError as error:
            raise MachineGone(f"{self._machine.name}: backdoor write failed: {error}") from error

    def recv(self, timeout: float) -> bytes:
        """Read what the backdoor sent within ``timeout``; ``MachineGone`` once QEMU is gone."""
        ready, _, _ = select.select([self._connection], [], [], max(0.0, timeout))
        if ready:
            data = self._connection.recv(1 << 20)
            if data:
                return data
            raise MachineGone(
                f"{self._machine.name}: the backdoor connection closed (QEMU exited)\n"
                + self.describe_failure()
            )
        if not self._machine.process_running:
            raise MachineGone(f"{self._machine.name}: QEMU exited\n" + self.describe_failure())
        return b""

    def describe_failure(self) -> str:
        """Console tail and QEMU's stderr, for error messages."""
        return self._machine.diagnostics()

    def close(self) -> None:
        """Close the socket."""
        self._connection.close()


def listen_for_qemu() -> tuple[Path, Sockets, dict[str, socket.socket]]:
    """A fresh runtime dir with the serial and backdoor sockets listening (QMP: QEMU's own).

    The path is short because UNIX socket paths are limited to 108 bytes. The PID in its name
    lets a later run remove the dirs of sessions that were SIGKILLed (no cleanup ran there).
    """
    remove_orphaned_runtime_dirs()
    runtime = Path(tempfile.mkdtemp(prefix=f"vmt-{os.getpid()}-", dir="/tmp"))
    sockets = Sockets(runtime / "s", runtime / "b", runtime / "q")
    listeners = {}
    for key, path in (("serial", sockets.serial), ("backdoor", sockets.backdoor)):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(1)
        listeners[key] = listener
    return runtime, sockets, listeners


def spawn_qemu(spec: LaunchSpec, name: str, stderr_log: Path) -> subprocess.Popen[bytes]:
    """Start QEMU (registered for cleanup), its stdout and stderr appended to ``stderr_log``;
    under a keeper while a run may keep its guest (``vmtests.driver.keep``)."""
    with stderr_log.open("ab") as stderr:
        if keep.requested():
            return keep.spawn_kept(
                spec.argv, f"keeper of qemu {name}", stdout=stderr, stderr=stderr,
                env={**os.environ, **spec.env},
            )  # fmt: skip
        return procs.spawn(
            spec.argv,
            f"qemu {name}",
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
            env={**os.environ, **spec.env},
        )


def remove_orphaned_runtime_dirs() -> None:
    """Delete ``/tmp/vmt-<pid>-*`` socket dirs whose creating process no longer exists."""
    for path in Path("/tmp").glob("vmt-*-*"):
        pid = path.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def close_qmp(qmp: Any) -> None:
    """Close a QMP connection, even one whose QEMU died.

    After QEMU exits, the first ``close()`` re-raises the reader's EOFError and leaves the
    session half-closed; its ``__del__`` would then raise again during garbage collection.
    A second ``close()`` completes it.
    """
    for _ in range(2):
        with contextlib.suppress(Exception):
            qmp.close()


CONNECT_TIMEOUT = 30.0
"""Seconds QEMU gets to connect a socket or to open QMP while it starts."""


def accept_connection(machine: QemuMachine, listener: socket.socket, what: str) -> socket.socket:
    """Accept QEMU's connection to ``listener``; fail fast if QEMU exits first."""
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([listener], [], [], 0.2)
        if ready:
            connection, _ = listener.accept()
            return connection
        if not machine.process_running:
            raise MachineGone(
                f"{machine.name}: QEMU exited before connecting its {what}\n"
                f"--- QEMU stderr ---\n{machine.stderr_tail()}"
            )
    raise WaitTimeout(f"QEMU to connect its {what}", CONNECT_TIMEOUT, machine.stderr_tail())


def connect_qmp(machine: QemuMachine, path: Path) -> Any:
    """Connect to QMP (QEMU creates its socket during startup)."""
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        qmp = QEMUMonitorProtocol(str(path))
        try:
            qmp.connect(negotiate=True)
            return qmp
        except Exception as error:  # qemu.qmp raises several unrelated types here
            close_qmp(qmp)
            if not machine.process_running:
                raise MachineGone(
                    f"{machine.name}: QEMU exited during startup\n--- QEMU stderr ---\n"
                    + machine.stderr_tail()
                ) from error
            if time.monotonic() > deadline:
                raise DriverError(f"{machine.name}: cannot connect to QMP: {error}") from error
            time.sleep(0.1)


def qmp_run_state(qmp: Any) -> str:
    """QEMU's run state from QMP (``running``, ``internal-error``, ...); "" if unknown."""
    if qmp is None:
        return ""
    try:
        return str(qmp.cmd("query-status").get("status", ""))
    except Exception:  # qemu.qmp raises several unrelated types here
        return ""

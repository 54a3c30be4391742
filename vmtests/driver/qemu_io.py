"""Host-side plumbing of the QEMU backend: the backdoor socket transport and cleanup helpers."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmtests.driver.errors import MachineGone

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


def kvm_usable() -> bool:
    """True when /dev/kvm can be opened read-write."""
    return os.access("/dev/kvm", os.R_OK | os.W_OK)

"""One QEMU process of a ``QemuMachine`` and its connections: serial console, backdoor, QMP.

A machine has one at a time; in ``restart`` reboot mode each boot gets a fresh one on the same
disk. ``launch`` spawns QEMU and connects everything, ``release`` kills it and drops the sockets.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmtests.driver import procs
from vmtests.driver.console import SerialConsole
from vmtests.driver.errors import DriverError, MachineGone
from vmtests.driver.qemu_io import (
    SocketTransport,
    accept_connection,
    close_qmp,
    connect_qmp,
    listen_for_qemu,
    qmp_run_state,
    spawn_qemu,
)
from vmtests.driver.qemu_launch import LaunchSpec, Sockets
from vmtests.driver.shell import ShellChannel

if TYPE_CHECKING:
    from vmtests.driver.qemu import QemuMachine

STDERR_TAIL_CHARS = 3000
QMP_TIMEOUT = 30.0
"""Seconds one QMP command may take (``qmp_call``); long jobs are polled, never awaited."""


class QemuProcess:
    """The QEMU process of ``machine`` (at most one at a time) and its three connections."""

    def __init__(self, machine: QemuMachine, stderr_log: Path) -> None:
        self._machine = machine
        self.stderr_log = stderr_log
        self.proc: subprocess.Popen[bytes] | None = None
        self.qmp: Any = None
        self.transport: SocketTransport | None = None
        self.channel: ShellChannel | None = None
        self._runtime_dir: Path | None = None

    @property
    def running(self) -> bool:
        """True while the QEMU process exists."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """PID of the QEMU process (or of the NixOS run script, which ``exec``s QEMU)."""
        return self.proc.pid if self.proc is not None else None

    def launch(self, spec_for: Callable[[Sockets], LaunchSpec], console: SerialConsole) -> bool:
        """Spawn QEMU from ``spec_for(sockets)`` and connect console, backdoor and QMP.

        Returns False when a forwarded host port was taken in the meantime (QEMU exited
        saying so); the caller then retries with other ports.
        """
        name = self._machine.name
        if self._runtime_dir is not None:  # left over from an abandoned launch
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
        self._runtime_dir, sockets, listeners = listen_for_qemu()
        self.proc = spawn_qemu(spec_for(sockets), name, self.stderr_log)
        try:
            serial = accept_connection(self._machine, listeners["serial"], "serial console")
            backdoor = accept_connection(self._machine, listeners["backdoor"], "backdoor console")
        except MachineGone:
            if "host forwarding rule" in self.stderr_tail():
                self.stop()
                return False
            raise
        finally:
            for listener in listeners.values():
                listener.close()
        console.attach(serial)
        self.transport = SocketTransport(self._machine, backdoor)
        self.channel = ShellChannel(self.transport, f"{name} backdoor")
        self.qmp = connect_qmp(self._machine, sockets.qmp)
        return True

    def release(self) -> None:
        """Kill QEMU if it still runs and drop its sockets; the console capture stays."""
        if self.qmp is not None:
            close_qmp(self.qmp)
            self.qmp = None
        self.stop()
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.channel = None
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
            self._runtime_dir = None

    def hand_over(self) -> tuple[subprocess.Popen[bytes], Path]:
        """Give up QEMU, which runs on under its keeper (``vmtests.driver.keep``): close QMP
        and the backdoor, and move the runtime dir (QMP's socket) out of the way of the
        orphan sweep (``remove_orphaned_runtime_dirs``). Returns the keeper and that dir."""
        proc, runtime = self.proc, self._runtime_dir
        if proc is None or runtime is None or proc.poll() is not None:
            raise MachineGone(f"{self._machine.name}: QEMU is not running; nothing to keep")
        if self.qmp is not None:
            close_qmp(self.qmp)
            self.qmp = None
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.channel = None
        kept = runtime.with_name(f"vmtkept-{proc.pid}")
        runtime.rename(kept)  # QEMU's listening socket stays bound: its new path reaches it
        self.proc, self._runtime_dir = None, None
        return proc, kept

    def stop(self) -> None:
        """Kill the QEMU process group (idempotent)."""
        if self.proc is not None:
            procs.reap(self.proc, grace=2.0)
            self.proc = None

    def wait_exit(self, deadline: float) -> bool:
        """Wait until QEMU exits or ``deadline`` passes; True if it exited."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True

    def qmp_command(self, command: str) -> None:
        """Send one QMP command; a QEMU that already exited is not an error."""
        if self.qmp is None or not self.running:
            return
        try:
            self.qmp.cmd(command)
        except Exception as error:  # qemu.qmp raises several unrelated types here
            if self.running and command != "quit":
                raise DriverError(f"{self._machine.name}: QMP {command} failed: {error}") from error

    def qmp_call(self, command: str, timeout: float = QMP_TIMEOUT, **arguments: object) -> Any:
        """Send one QMP command and return its result.

        Raises ``MachineGone`` when QEMU is not running and ``DriverError`` when QEMU refuses
        the command or gives no answer within ``timeout``.
        """
        name = self._machine.name
        if self.qmp is None or not self.running:
            raise MachineGone(f"{name}: QEMU is not running (QMP {command})")
        self.qmp.settimeout(timeout)
        try:
            return self.qmp.cmd(command, **arguments)
        except Exception as error:  # qemu.qmp raises several unrelated types here
            raise DriverError(
                f"{name}: QMP {command} {arguments or ''} failed: {error!r}\n"
                f"--- QEMU stderr ---\n{self.stderr_tail() or '(empty)'}"
            ) from error
        finally:
            if self.qmp is not None:
                self.qmp.settimeout(None)

    def run_state(self) -> str:
        """QEMU's run state from QMP (``running``, ``internal-error``, ...); "" if unknown."""
        return qmp_run_state(self.qmp) if self.running else ""

    def stderr_tail(self) -> str:
        """The last characters QEMU wrote to its stderr log."""
        if not self.stderr_log.exists():
            return ""
        return self.stderr_log.read_text(errors="replace")[-STDERR_TAIL_CHARS:]

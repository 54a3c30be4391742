"""Typed driver errors: every failure says what was awaited, for how long, and what was seen."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vmtests.driver.machine import CommandResult


class DriverError(Exception):
    """Base class of every error the driver raises."""


class MachineGone(DriverError):
    """The machine stopped answering: QEMU exited, the console closed, or ssh lost the host."""


class WaitTimeout(DriverError):
    """A bounded wait ran out.

    ``awaited`` names what was waited for, ``timeout`` how long, and ``last_seen`` carries the
    evidence (console tail, ``systemctl status``, journal lines) for the failure message.
    """

    def __init__(self, awaited: str, timeout: float, last_seen: str = "") -> None:
        self.awaited = awaited
        self.timeout = timeout
        self.last_seen = last_seen
        message = f"timed out after {timeout:.1f}s waiting for {awaited}"
        if last_seen:
            message += f"\n--- last seen ---\n{last_seen.rstrip()}"
        super().__init__(message)


class CommandFailed(DriverError):
    """A command did not end as required (``succeed`` got rc != 0, ``fail`` got rc == 0)."""

    def __init__(self, result: CommandResult, expectation: str = "exit status 0") -> None:
        self.result = result
        super().__init__(
            f"command {result.command!r} returned rc={result.rc}, expected {expectation}\n"
            f"--- stdout ---\n{result.stdout_text.rstrip()}\n"
            f"--- stderr ---\n{result.stderr_text.rstrip()}"
        )

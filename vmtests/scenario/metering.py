"""``MeteredMachine``: a ``Machine`` that forwards to another and measures the time spent there.

The scenario runs on a metered machine so that its report can say how much of the wall time
was spent inside the driver (booting, rebooting, command round trips including the command's
own run time on the guest) as opposed to host-side work (Nix evaluation, checks, reports).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from vmtests.driver.machine import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_REBOOT_TIMEOUT,
    CommandResult,
    Machine,
)

T = TypeVar("T")


@dataclass
class DriverMeter:
    """Accumulated time and call counts per driver primitive."""

    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    fastest_command: float | None = None

    @property
    def total_seconds(self) -> float:
        """Time spent inside the driver, all primitives together."""
        return sum(self.seconds.values())

    @property
    def commands(self) -> int:
        """How many commands ran on the machine."""
        return self.calls.get("execute", 0)

    def overhead_estimate(self) -> float:
        """Commands x the fastest observed round trip: the driver's fixed per-command cost."""
        return self.commands * (self.fastest_command or 0.0)

    def record(self, name: str, seconds: float) -> None:
        """Add one call of ``name`` that took ``seconds``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable summary."""
        return {
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "calls": dict(self.calls),
            "total_seconds": round(self.total_seconds, 3),
            "fastest_command_seconds": self.fastest_command,
            "overhead_estimate_seconds": round(self.overhead_estimate(), 3),
        }


class MeteredMachine(Machine):
    """Forwards every primitive (and ``reboot``) to ``inner``; times each call."""

    def __init__(self, inner: Machine, meter: DriverMeter | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.meter = meter or DriverMeter()

    def _timed(self, name: str, call: Callable[[], T]) -> T:
        start = time.monotonic()
        try:
            return call()
        finally:
            self.meter.record(name, time.monotonic() - start)

    def start(self) -> None:
        """Start the inner machine."""
        self._timed("start", self.inner.start)

    def shutdown(self, timeout: float = DEFAULT_REBOOT_TIMEOUT) -> None:
        """Shut the inner machine down."""
        self._timed("shutdown", lambda: self.inner.shutdown(timeout))

    def close(self) -> None:
        """Close the wrapped machine."""
        self._timed("close", self.inner.close)

    def crash(self) -> None:
        """Power the inner machine off hard."""
        self._timed("crash", self.inner.crash)

    def execute(self, command: str, timeout: float = DEFAULT_COMMAND_TIMEOUT) -> CommandResult:
        """Run ``command`` on the inner machine; remember the fastest round trip."""
        result = self._timed("execute", lambda: self.inner.execute(command, timeout))
        fastest = self.meter.fastest_command
        if result.duration > 0 and (fastest is None or result.duration < fastest):
            self.meter.fastest_command = result.duration
        return result

    def copy_to(self, source: Path, destination: str, timeout: float = 120.0) -> None:
        """Copy a host path to the inner machine."""
        self._timed("copy_to", lambda: self.inner.copy_to(source, destination, timeout))

    def copy_from(self, source: str, destination: Path, timeout: float = 120.0) -> None:
        """Copy a path from the inner machine to the host."""
        self._timed("copy_from", lambda: self.inner.copy_from(source, destination, timeout))

    def reboot(self, timeout: float = DEFAULT_REBOOT_TIMEOUT) -> str:
        """Reboot through the inner machine's own ``reboot`` (backends may refine it)."""
        return self._timed("reboot", lambda: self.inner.reboot(timeout))

    def _issue_reboot(self) -> None:
        """Unused: ``reboot`` forwards as a whole."""
        self.inner._issue_reboot()

    def _wait_until_answering(self, deadline: float) -> None:
        """Unused: ``reboot`` forwards as a whole."""
        self.inner._wait_until_answering(deadline)

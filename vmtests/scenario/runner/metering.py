"""``DriverMeter``: how much of a run's wall time was spent inside the driver.

The scenario registers a meter with ``Machine.observe`` so that its report can say how much of
the wall time went to booting, rebooting and command round trips (including the command's own
run time on the guest) as opposed to host-side work (Nix evaluation, checks, reports).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vmtests.driver.machine import CommandResult


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

    def record(self, name: str, seconds: float, result: CommandResult | None = None) -> None:
        """Add one call of ``name`` that took ``seconds`` (a ``Machine`` observer)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1
        if result is not None and result.duration > 0:
            fastest = self.fastest_command
            self.fastest_command = min(result.duration, fastest or result.duration)

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable summary."""
        return {
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "calls": dict(self.calls),
            "total_seconds": round(self.total_seconds, 3),
            "fastest_command_seconds": self.fastest_command,
            "overhead_estimate_seconds": round(self.overhead_estimate(), 3),
        }

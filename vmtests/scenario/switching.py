"""How a machine is taken from its base configuration to the profile's configuration.

The scenario and the certification run only know the ``Switcher`` protocol. Two switches
implement it: ``vmtests.scenario.reference_switch.ReferenceSwitch`` (the reference guest, which
installs the units the Nix core describes) and ``CommandSwitch`` (a NixOS VM or a real host,
where ``nixos-rebuild switch`` or ``switch-to-configuration`` does it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from vmtests.contracts.serving import READY_TIMEOUT, SERVING_UNIT
from vmtests.driver.machine import Machine

SWITCH_TIMEOUT = 900.0
"""Seconds a switch command may take: ``nixos-rebuild switch --flake`` evaluates the whole NixOS
configuration in the VM (once: ``--no-reexec`` skips nixpkgs nixos-rebuild-ng's
``services.reexec``, which would evaluate and build the target's ``system.build.nixos-rebuild``
first; ``--max-jobs 0`` builds nothing), then restarts the serving unit (stop up to its
``TimeoutStopSec``, image load, model load); 600 s left too little margin on a shared 2-core host
even under KVM."""


class Switcher(Protocol):
    """How a target is taken from its base configuration to the profile's configuration.

    ``expected_system`` is the NixOS system (toplevel store path) the switch must activate, when
    it is known: the scenario checks after the switch that it runs.
    """

    description: str
    expected_system: str | None

    def prepare_base(self, machine: Machine) -> None:
        """Bring ``machine`` to the base state S0 (may do nothing on a real host)."""

    def apply(self, machine: Machine) -> None:
        """Switch ``machine`` to the target configuration (the caller waits for /health)."""


def wait_healthy(machine: Machine, port: int, timeout: float = READY_TIMEOUT) -> None:
    """Wait until ``/health`` on ``port`` answers 200, whatever runs the server."""
    machine.wait_for_http_ok(port, "/health", timeout=timeout, unit=SERVING_UNIT)


def wait_ready(machine: Machine, port: int, timeout: float = READY_TIMEOUT) -> None:
    """Wait until the serving unit is active and ``/health`` answers 200."""
    machine.wait_for_unit(SERVING_UNIT, timeout)
    wait_healthy(machine, port, timeout)


@dataclass
class CommandSwitch:
    """A switch by command on the machine: ``nixos-rebuild switch ...`` or
    ``<toplevel>/bin/switch-to-configuration switch``; the base is the machine as found;
    ``expected_system``: the toplevel it must activate (the one pre-built into a VM's image)."""

    command: str
    timeout: float = SWITCH_TIMEOUT
    description: str = ""
    expected_system: str | None = None

    def __post_init__(self) -> None:
        self.description = self.description or f"switch command: {self.command}"

    def prepare_base(self, machine: Machine) -> None:
        """Nothing to do: the machine's current configuration is the base."""

    def apply(self, machine: Machine) -> None:
        """Run the switch command (the scenario then waits for the service)."""
        machine.succeed(self.command, timeout=self.timeout)
